"""Models of shapes the example lacks, for the kit's own tests of them."""

import torch
from lightning.pytorch import LightningModule
from torch import nn


class TwoNetworks(LightningModule):
    """A GAN's shape: two networks, two optimizers, stepped by hand, each backward
    leaving the other network's parameters out, and the critic called twice a step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
        self.critic = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        generator, critic = self.optimizers()  # ty: ignore[not-iterable]
        fake = self.generator(batch[0])
        self.toggle_optimizer(generator)
        self.manual_backward(-self.critic(fake).mean())
        generator.step()
        generator.zero_grad()
        self.untoggle_optimizer(generator)
        self.toggle_optimizer(critic)
        self.manual_backward(self.critic(fake.detach()).mean() - self.critic(batch[0]).mean())
        critic.step()
        critic.zero_grad()
        self.untoggle_optimizer(critic)

    def configure_optimizers(self):
        return [
            torch.optim.SGD(self.generator.parameters(), lr=0.1),
            torch.optim.SGD(self.critic.parameters(), lr=0.1),
        ]
