"""DeepSets: a network of each point, a masked mean over the set, a head on the mean.

Each set is centred and scaled to unit spread first, so that only its shape tells the
class. Logs `val/acc` (the monitored metric) and `test/acc`; `predict_step` gives each
set's class and its probability.
"""

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from .data import CLASSES, PointBatch


class DeepSets(nn.Module):
    """phi on every point, the mean over the set's points (not its padding), rho on that."""

    def __init__(self, hidden: int = 64, num_classes: int = len(CLASSES)):
        super().__init__()
        self.phi = nn.Sequential(
            nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.rho = nn.Sequential(
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, points: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).to(points.dtype)  # (sets, longest, 1)
        count = weights.sum(1, keepdim=True).clamp(min=1)  # (sets, 1, 1)
        centre = (points * weights).sum(1, keepdim=True) / count
        spread = ((points - centre).square().sum(-1, keepdim=True) * weights).sum(1, keepdim=True)
        normalised = (points - centre) / (spread / count).sqrt().clamp(min=1e-6)
        features = self.phi(normalised) * weights
        return self.rho(features.sum(1) / count.squeeze(1))


def network_inputs(batch: PointBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """What the network takes from a batch, for `export`: the points and their mask."""
    return batch.points, batch.mask


class SetClassifier(LightningModule):
    """Tells sets of points on a circle from sets along a segment."""

    def __init__(self, hidden: int = 64, lr: float = 0.003):
        super().__init__()
        self.save_hyperparameters()
        self.net = DeepSets(hidden)
        self.val_acc = MulticlassAccuracy(len(CLASSES), average="micro")
        self.test_acc = MulticlassAccuracy(len(CLASSES), average="micro")

    def forward(self, points: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net(points, mask)

    def step(self, batch: PointBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch.points, batch.mask)
        return nn.functional.cross_entropy(logits, batch.label), logits

    def training_step(self, batch: PointBatch, batch_idx: int) -> torch.Tensor:
        loss, _ = self.step(batch)
        return loss  # the kit logs train/loss from it

    def validation_step(self, batch: PointBatch, batch_idx: int) -> None:
        loss, logits = self.step(batch)
        self.val_acc(logits.argmax(dim=1), batch.label)
        self.log("val/loss", loss, sync_dist=True, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: PointBatch, batch_idx: int) -> None:
        loss, logits = self.step(batch)
        self.test_acc(logits.argmax(dim=1), batch.label)
        self.log("test/loss", loss, sync_dist=True)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch: PointBatch, batch_idx: int) -> dict[str, torch.Tensor]:
        probability, predicted = self(batch.points, batch.mask).softmax(dim=1).max(dim=1)
        return {"shape": predicted, "probability": probability}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
