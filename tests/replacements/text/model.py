"""A bag-of-embeddings topic classifier over a dict batch."""

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from my_lightning_project.data import VOCABULARY


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocabulary: int, dim: int, classes: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, dim, padding_idx=0)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).to(self.embedding.weight.dtype)
        mean = (self.embedding(tokens) * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.head(mean)


def network_inputs(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """What the classifier takes from a batch, for `export` to .pt2 and .onnx."""
    return batch["tokens"], batch["mask"]


class TopicClassifier(LightningModule):
    def __init__(self, dim: int = 32, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.classifier = BagOfEmbeddings(len(VOCABULARY), dim, 2)
        self.val_acc = MulticlassAccuracy(2, average="micro")

    def step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.classifier(batch["tokens"], batch["mask"])
        return nn.functional.cross_entropy(logits, batch["label"]), logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self.step(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, logits = self.step(batch)
        self.val_acc(logits.argmax(dim=1), batch["label"])
        self.log("val/loss", loss, sync_dist=True)
        self.log("val/acc", self.val_acc)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        loss, _ = self.step(batch)
        self.log("test/loss", loss, sync_dist=True)

    def predict_step(self, batch: dict, batch_idx: int) -> dict[str, torch.Tensor]:
        probability, topic = self.classifier(batch["tokens"], batch["mask"]).softmax(1).max(1)
        return {"topic": topic, "probability": probability}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
