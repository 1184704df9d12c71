"""A small GAN on 2-D points, trained with manual optimization as Lightning's docs show.

A generator (noise of LATENT_DIM numbers to a point) and a discriminator (a point to a
logit), one Adam each; every training step updates the generator, then the discriminator.
Validation and test score generated points by their distance from the data's ring.
"""

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits as bce
from torchmetrics import MeanMetric

from .data import RADIUS

LATENT_DIM = 8


def mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, outputs),
    )


def noise(like: torch.Tensor) -> torch.Tensor:
    """Generator inputs for a batch of points like `like`: one row of noise a point."""
    return torch.randn(len(like), LATENT_DIM, device=like.device, dtype=like.dtype)


def network_inputs(batch) -> tuple[torch.Tensor]:
    """What the generator takes (`Project.network_inputs`): noise, one row a point."""
    return (noise(batch[0]),)


def probe(real: torch.Tensor) -> torch.Tensor:
    """Generator inputs that are a fixed function of each real point (a probe of the
    generator, the same every epoch): a metric over them does not depend on how the
    points are batched or shared out among DDP's ranks."""
    return torch.cat([torch.sin(k * real) for k in range(1, LATENT_DIM // 2 + 1)], dim=1)


def ring_error(points: torch.Tensor) -> torch.Tensor:
    """Each point's distance from the data's ring."""
    return (points.float().norm(dim=1) - RADIUS).abs()


class PointGAN(LightningModule):
    """Learns to draw points like the data's; logs `train/g_loss`, `train/d_loss`,
    `val/ring_error` and `test/ring_error` (torchmetrics: the same on any number of
    ranks)."""

    def __init__(self, hidden: int = 64, lr: float = 2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = mlp(LATENT_DIM, hidden, 2)
        self.discriminator = mlp(2, hidden, 1)
        self.val_error, self.test_error = MeanMetric(), MeanMetric()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def training_step(self, batch, batch_idx: int) -> None:
        (real,) = batch
        # Two optimizers: a list (Lightning's type says one or a list).
        optimizer_g, optimizer_d = self.optimizers()  # ty: ignore[not-iterable]
        z = noise(real)
        ones = real.new_ones(len(real), 1)
        zeros = real.new_zeros(len(real), 1)

        # The generator: make the discriminator call its points real.
        self.toggle_optimizer(optimizer_g)
        fake = self(z)
        g_loss = bce(self.discriminator(fake), ones)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        # The discriminator: tell the data's points from the generator's.
        self.toggle_optimizer(optimizer_d)
        real_loss = bce(self.discriminator(real), ones)
        fake_loss = bce(self.discriminator(fake.detach()), zeros)
        d_loss = (real_loss + fake_loss) / 2
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

        # To the loggers only: a value on the progress bar is read from the device every
        # step (tests/kit/test_syncs.py would name this line).
        self.log_dict({"train/g_loss": g_loss, "train/d_loss": d_loss})

    def validation_step(self, batch, batch_idx: int) -> None:
        (real,) = batch
        self.val_error(ring_error(self(probe(real))))
        self.log("val/ring_error", self.val_error, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        (real,) = batch
        self.test_error(ring_error(self(probe(real))))
        self.log("test/ring_error", self.test_error)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        # New points, one per row of the batch (fresh noise: seed the run to repeat them).
        points = self(noise(batch[0]))
        return {"x": points[:, 0], "y": points[:, 1]}

    def configure_optimizers(self):
        lr, betas = self.hparams.lr, (0.5, 0.999)  # the usual GAN momentum
        optimizer_g = torch.optim.Adam(self.generator.parameters(), lr, betas=betas)
        optimizer_d = torch.optim.Adam(self.discriminator.parameters(), lr, betas=betas)
        return optimizer_g, optimizer_d
