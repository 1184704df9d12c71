"""A tiny CNN that tells circles, squares and triangles apart in 1x16x16 images.

Logs `val/acc` (the monitored metric) and `test/acc`; `predict_step` gives each image's
class and its probability.
"""

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from .data import CLASSES


class TinyCNN(nn.Module):
    def __init__(self, channels: int = 8, num_classes: int = len(CLASSES)):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 8x8
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 4x4
            nn.Flatten(),
            nn.Linear(2 * channels * 4 * 4, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ShapeClassifier(LightningModule):
    def __init__(self, channels: int = 8, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = TinyCNN(channels)
        self.val_acc = MulticlassAccuracy(len(CLASSES), average="micro")
        self.test_acc = MulticlassAccuracy(len(CLASSES), average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc(logits.argmax(dim=1), y)
        self.log("val/loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val/acc", self.val_acc, sync_dist=True, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.test_acc(self(x).argmax(dim=1), y)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        probability, predicted = self(batch[0]).softmax(dim=1).max(dim=1)
        return {"shape": predicted, "probability": probability}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
