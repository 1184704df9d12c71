{%- if cookiecutter.example == "digits" -%}
"""The model: the network, the steps and the optimizer, nothing else. Yours to replace.

Hardware, precision and parallelism live in the Trainer and the configs, so the
same module runs on a CPU, one GPU or many nodes unchanged. Tensors made inside
`forward` are derived from the input or registered as buffers, so they follow
the module to whatever device the Trainer picks.
"""

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

# Pixel statistics of scikit-learn's digits (values 0..16), used to normalise.
PIXEL_MEAN = 4.884
PIXEL_STD = 6.017


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 images: two conv blocks and a linear head."""

    def __init__(self, channels: int = 32, num_classes: int = 10, dropout: float = 0.1):
        super().__init__()
        # Buffers move with .to(device) and are saved in the state_dict.
        self.register_buffer("mean", torch.tensor(PIXEL_MEAN))
        self.register_buffer("std", torch.tensor(PIXEL_STD))
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(2 * channels * 2 * 2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features((x - self.mean) / self.std))


class DigitsClassifier(LightningModule):
    """Classifies handwritten digits; logs `train/loss`, `val/loss`, `val/acc`, `test/acc`."""

    def __init__(
        self,
        channels: int = 32,
        dropout: float = 0.1,
        num_classes: int = 10,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = None,
    ):
        super().__init__()
        # The optimizer and scheduler are classes, chosen on the command line
        # (`--model.optimizer SGD`); they are not weights, so not hparams.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.net = DigitsCNN(channels, num_classes, dropout)
        self.loss = nn.CrossEntropyLoss()
        # One metric object per split: each keeps its own running state. None
        # for training: every self.log call in a step costs Lightning bookkeeping
        # that is a noticeable share of a step of this small network.
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def model_step(self, batch: tuple[torch.Tensor, torch.Tensor]):
        x, y = batch
        logits = self(x)
        return self.loss(logits, y), logits.argmax(dim=1), y

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        # The kit logs train/loss from what this returns: a mean over each logging
        # window, kept on the device, for a fraction of the cost of self.log per step.
        loss, _, _ = self.model_step(batch)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        loss, preds, y = self.model_step(batch)
        self.val_acc(preds, y)
        # sync_dist averages the loss over ranks; torchmetrics syncs the metric.
        self.log("val/loss", loss, sync_dist=True, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        loss, preds, y = self.model_step(batch)
        self.test_acc(preds, y)
        self.log("test/loss", loss, sync_dist=True)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        # Each key becomes a column of predictions.csv.
        probability, predicted = self(batch[0]).softmax(dim=1).max(dim=1)
        return {"predicted": predicted, "probability": probability}

    def configure_optimizers(self):
        # Called by Lightning after the model is on its device, so the
        # optimizer's state is created where the parameters are.
        optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.scheduler(optimizer)}
{%- else -%}
"""The model: the network, the steps and the optimizer, nothing else. Yours to replace.

Hardware, precision and parallelism live in the Trainer and the configs, so the
same module runs on a CPU, one GPU or many nodes unchanged. Tensors made inside
`forward` are derived from the input (`x.new_*`), so they follow it to whatever
device the Trainer picks.
"""

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn


class MLP(nn.Module):
    """A toy network: Linear, ReLU, Linear."""

    def __init__(self, in_features: int = 16, hidden: int = 32, out_features: int = 1):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Regressor(LightningModule):
    """Regresses a target from features; logs `train/loss`, `val/loss`, `test/loss`."""

    def __init__(
        self,
        in_features: int = 16,
        hidden: int = 32,
        input_noise: float = 0.0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        scheduler: LRSchedulerCallable | None = None,
    ):
        super().__init__()
        # The optimizer and scheduler are classes, chosen on the command line
        # (`--model.optimizer SGD`); they are not weights, so not hparams.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.input_noise = input_noise
        self.net = MLP(in_features, hidden)
        self.loss = nn.MSELoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.input_noise > 0:
            # Made from x, so on x's device and in x's dtype: never torch.randn(...).
            x = x + self.input_noise * x.new_empty(x.shape).normal_()
        # The kit logs train/loss from what this returns: a mean over each logging
        # window, kept on the device, for a fraction of the cost of self.log per step.
        return self.loss(self(x), y)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", self.loss(self(x), y), sync_dist=True, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", self.loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        # Each key becomes a column of predictions.csv.
        return {"prediction": self(batch[0])[:, 0]}

    def configure_optimizers(self):
        # Called by Lightning after the model is on its device, so the
        # optimizer's state is created where the parameters are.
        optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.scheduler(optimizer)}
{%- endif %}
