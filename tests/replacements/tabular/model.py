"""An MLP price predictor, trained with plain SGD (no optimizer state), judged by MAE."""

import torch
from lightning.pytorch import LightningModule
from torch import nn


class PricePredictor(LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.mlp = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(-1)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, price = batch
        loss = nn.functional.mse_loss(self(x), price)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        x, price = batch
        self.log("val/mae", (self(x) - price).abs().mean(), sync_dist=True)

    def test_step(self, batch, batch_idx: int) -> None:
        x, price = batch
        self.log("test/mae", (self(x) - price).abs().mean(), sync_dist=True)

    def predict_step(self, batch, batch_idx: int) -> tuple[torch.Tensor, ...]:
        prediction = self(batch[0])
        return prediction, prediction - 0.2, prediction + 0.2  # a rough interval

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
