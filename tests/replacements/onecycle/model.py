"""An MLP that tells malignant from benign tumours, on a one-cycle learning-rate schedule.

SGD with Nesterov momentum; torch's `OneCycleLR` over every optimizer step of the fit,
which the Trainer estimates (`estimated_stepping_batches`), stepped after each one. Logs
`val/auroc` (the monitored metric, higher is better), `val/loss` and `test/auroc`.
"""

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.classification import BinaryAUROC

from .data import NUM_FEATURES


class TumourMLP(nn.Module):
    """Two hidden layers, each normalised (LayerNorm) and dropped out; one logit out."""

    def __init__(self, hidden: int = 64, dropout: float = 0.2, features: int = NUM_FEATURES):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(features, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).squeeze(-1)


class TumourClassifier(LightningModule):
    """Binary classification with the logistic loss; its score is the ROC AUC."""

    def __init__(
        self,
        hidden: int = 64,
        dropout: float = 0.2,
        max_lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = TumourMLP(hidden, dropout)
        self.val_auroc = BinaryAUROC()
        self.test_auroc = BinaryAUROC()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, label = batch
        return nn.functional.binary_cross_entropy_with_logits(self(x), label)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, label = batch
        logits = self(x)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, label)
        self.val_auroc(logits, label.long())
        self.log("val/loss", loss, sync_dist=True)
        self.log("val/auroc", self.val_auroc, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        x, label = batch
        self.test_auroc(self(x), label.long())
        self.log("test/auroc", self.test_auroc)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        probability = torch.sigmoid(self(batch[0]))
        return {"benign": (probability > 0.5).long(), "probability": probability}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(
            self.parameters(),
            lr=self.hparams.max_lr,
            momentum=self.hparams.momentum,
            nesterov=True,
            weight_decay=self.hparams.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=self.hparams.max_lr,
            total_steps=int(self.trainer.estimated_stepping_batches),
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
