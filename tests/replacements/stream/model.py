"""A small 1-D CNN that predicts a signal's next value from the `WINDOW` values before it.

Trained with AdamW in two parameter groups: weight decay on the weights of convolutions and
linear layers, none on biases and norms. Logs `val/mse` (the monitored metric) and
`test/mse`. The training data is a stream that shuffles itself by the epoch the kit tells it.
"""

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.regression import MeanSquaredError

from .data import WINDOW


class ConvForecaster(nn.Module):
    """Two convolutions (the second dilated) with group norms, and a linear head."""

    def __init__(self, channels: int = 16, window: int = WINDOW):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv1d(1, channels, 5, padding=2),
            nn.GroupNorm(4, channels),
            nn.GELU(),
            nn.Conv1d(channels, channels, 5, padding=4, dilation=2),
            nn.GroupNorm(4, channels),
            nn.GELU(),
            nn.Flatten(),
            nn.Linear(channels * window, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).squeeze(-1)


class NextValue(LightningModule):
    """Regresses the next value of a window with the mean squared error."""

    def __init__(self, channels: int = 16, lr: float = 3e-3, weight_decay: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = ConvForecaster(channels)
        self.val_mse = MeanSquaredError()
        self.test_mse = MeanSquaredError()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, target = batch
        return nn.functional.mse_loss(self(x), target)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, target = batch
        self.val_mse(self(x), target)
        self.log("val/mse", self.val_mse, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        x, target = batch
        self.test_mse(self(x), target)
        self.log("test/mse", self.test_mse)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"next_value": self(batch[0])}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Biases and norm weights (the 1-D parameters) are not decayed.
        decayed = [p for p in self.parameters() if p.requires_grad and p.ndim > 1]
        kept = [p for p in self.parameters() if p.requires_grad and p.ndim <= 1]
        return torch.optim.AdamW(
            [
                {"params": decayed, "weight_decay": self.hparams.weight_decay},
                {"params": kept, "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
        )
