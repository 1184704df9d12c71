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


class CriticFirst(LightningModule):
    """Another GAN's shape: the critic stepped first, on real samples and on generated ones
    (detached), then the generator through the critic, generated again after that
    backward; every network called again at the top level of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        self.critic = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        generator, critic = self.optimizers()  # ty: ignore[not-iterable]
        real = batch[0]
        noise = real.new_empty(real.shape[0], 4).normal_()
        fake = self.generator(noise).detach()
        critic_loss = self.critic(fake).mean() - self.critic(real).mean()
        critic.zero_grad()
        self.manual_backward(critic_loss)
        critic.step()
        generator.zero_grad()
        self.manual_backward(-self.critic(self.generator(noise)).mean())
        generator.step()

    def configure_optimizers(self):
        return [
            torch.optim.Adam(self.generator.parameters()),
            torch.optim.Adam(self.critic.parameters()),
        ]


class FrozenBackbone(nn.Module):
    """A fine-tune's shape: a frozen backbone (its BatchNorm too) under a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Linear(64, 4)
        self.backbone.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))
