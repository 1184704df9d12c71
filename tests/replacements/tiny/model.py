"""A straight line through noisy points, fitted with Adam."""

import torch
from lightning.pytorch import LightningModule
from torch import nn


class Line(LightningModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.line = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.line(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
