"""A pretrained backbone, frozen, and a new head; the backbone's last block is unfrozen later.

The backbone (three Linear-BatchNorm-ReLU blocks) is pretrained once on another task of
the same inputs (which of eight blobs) and saved to a file (`pretrain_backbone`); the
classifier loads it, freezes it, and keeps its BatchNorm layers in eval mode (their
pretrained statistics), so that only the head trains. `BackboneFinetuning` (Lightning's
`BaseFinetuning`), which the module names in `configure_callbacks`, unfreezes the last
block at epoch `unfreeze_at_epoch`, as a new parameter group of the optimizer with a
tenth of the learning rate. Logs `val/acc` (clean, the monitored metric),
`val_shifted/acc` (noisy inputs, the second validation loader) and `test/acc`.
"""

import os
import tempfile
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn
from torch.optim import Optimizer
from torchmetrics.classification import MulticlassAccuracy

from .data import BLOBS, CLASSES, DIM, draw_blobs

PRETRAIN_SEED = 99  # the pretraining samples: other draws of the same blobs


def block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, outputs, bias=False), nn.BatchNorm1d(outputs), nn.ReLU())


class Backbone(nn.Module):
    """Three Linear-BatchNorm-ReLU blocks: DIM inputs to `width` features."""

    def __init__(self, width: int = 64, depth: int = 3):
        super().__init__()
        self.blocks = nn.Sequential(
            *(block(DIM if index == 0 else width, width) for index in range(depth))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def pretrain_backbone(path: Path, width: int = 64, depth: int = 3, steps: int = 150) -> None:
    """Pretrain a backbone on telling the eight blobs apart and save its state_dict to
    `path`, once: a file already there is kept. Written to a temporary file and renamed into
    place, so that processes started together (DDP) never read half a file; the global
    random states are left as they were, so a run that pretrains is the same run as one
    that finds the file."""
    if path.is_file():
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PRETRAIN_SEED)
        backbone, head = Backbone(width, depth), nn.Linear(width, BLOBS)
        inputs, blobs = draw_blobs(4000, PRETRAIN_SEED)
        optimizer = torch.optim.Adam([*backbone.parameters(), *head.parameters()], lr=0.01)
        for _ in range(steps):
            batch = torch.randint(0, len(inputs), (128,))
            loss = nn.functional.cross_entropy(head(backbone(inputs[batch])), blobs[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(handle)
    torch.save(backbone.state_dict(), staging)
    os.replace(staging, path)


class BackboneFinetuning(BaseFinetuning):
    """Keeps the backbone frozen (its BatchNorm statistics too) until `unfreeze_at_epoch`,
    then trains its last block as a new parameter group at `lr_factor` x the head's rate."""

    def __init__(self, unfreeze_at_epoch: int = 1, lr_factor: float = 0.1):
        super().__init__()
        self.unfreeze_at_epoch, self.lr_factor = unfreeze_at_epoch, lr_factor

    def freeze_before_training(self, pl_module: LightningModule) -> None:
        self.freeze(pl_module.backbone, train_bn=False)

    def finetune_function(
        self, pl_module: LightningModule, current_epoch: int, optimizer: Optimizer
    ) -> None:
        if current_epoch == self.unfreeze_at_epoch:
            backbone = pl_module.backbone
            assert isinstance(backbone, Backbone)
            self.unfreeze_and_add_param_group(
                backbone.blocks[-1],
                optimizer,
                lr=optimizer.param_groups[0]["lr"] * self.lr_factor,
            )


class FinetunedClassifier(LightningModule):
    """A new head on a pretrained, frozen backbone; `unfreeze_at_epoch` None keeps the
    backbone frozen throughout."""

    def __init__(
        self,
        backbone_path: str | None = None,
        width: int = 64,
        depth: int = 3,
        lr: float = 0.01,
        unfreeze_at_epoch: int | None = 1,
    ):
        super().__init__()
        self.save_hyperparameters()
        # Pretrained weights live where torch keeps downloaded ones ($TORCH_HOME), not in
        # the run's folder.
        path = Path(backbone_path or Path(torch.hub.get_dir()) / "blob-backbone.pt")
        pretrain_backbone(path, width, depth)  # once: then read
        self.backbone = Backbone(width, depth)
        self.backbone.load_state_dict(torch.load(path, weights_only=True))
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(width, CLASSES)
        self.val_acc = MulticlassAccuracy(CLASSES, average="micro")
        self.val_shifted_acc = MulticlassAccuracy(CLASSES, average="micro")
        self.test_acc = MulticlassAccuracy(CLASSES, average="micro")

    def configure_callbacks(self) -> list[Callback]:
        if self.hparams.unfreeze_at_epoch is None:
            return []
        return [BackboneFinetuning(self.hparams.unfreeze_at_epoch)]

    def on_train_epoch_start(self) -> None:
        # Lightning leaves modules in the mode they are in: the frozen blocks' BatchNorm
        # layers keep their pretrained statistics (eval), an unfrozen block's learn (train).
        for backbone_block in self.backbone.blocks:
            frozen = not any(p.requires_grad for p in backbone_block.parameters())
            backbone_block.train(not frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)  # the kit logs train/loss from it

    def validation_step(
        self, batch: list[torch.Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        x, y = batch
        logits = self(x)
        if dataloader_idx == 0:  # clean
            self.val_acc(logits.argmax(dim=1), y)
            loss = nn.functional.cross_entropy(logits, y)
            self.log("val/loss", loss, sync_dist=True, add_dataloader_idx=False)
            self.log("val/acc", self.val_acc, prog_bar=True, add_dataloader_idx=False)
        else:  # shifted
            self.val_shifted_acc(logits.argmax(dim=1), y)
            self.log("val_shifted/acc", self.val_shifted_acc, add_dataloader_idx=False)

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.test_acc(self(x).argmax(dim=1), y)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        probability, predicted = self(batch[0]).softmax(dim=1).max(dim=1)
        return {"predicted": predicted, "probability": probability}

    def configure_optimizers(self) -> Optimizer:
        # Only what trains now; BackboneFinetuning adds the last block's group when it thaws.
        trainable = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.Adam(trainable, lr=self.hparams.lr)
