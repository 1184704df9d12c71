"""Lightning's own demo LightningModule, used as it is, with what this project adds:
a validation loss to monitor, predictions, and no WikiText2 download."""

import torch
from lightning.pytorch.demos.transformer import LightningTransformer

from my_lightning_project.data import VOCABULARY


class CountingTransformer(LightningTransformer):
    def __init__(self, vocab_size: int = VOCABULARY):
        super().__init__(vocab_size=vocab_size)
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        """The demo downloads WikiText2 here; the DataModule brings the data instead."""

    def network_inputs(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The demo network takes the target too (teacher forcing), for `export`."""
        inputs, target = batch
        return inputs, target

    def validation_step(self, batch, batch_idx: int) -> None:
        inputs, target = batch
        loss = torch.nn.functional.nll_loss(self(inputs, target), target.view(-1))
        self.log("val/loss", loss, sync_dist=True)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        inputs, target = batch
        log_probabilities = self(inputs, target).view(*target.shape, -1)
        return {"next": log_probabilities.argmax(dim=-1)}
