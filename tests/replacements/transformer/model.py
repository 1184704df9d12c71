"""Lightning's own demo LightningModule, with what this project adds: a validation
loss to monitor, predictions, no WikiText2 download, and a step that does not wait
for the device."""

import math

import torch
from lightning.pytorch.demos.transformer import LightningTransformer
from torch import nn

from my_lightning_project.data import VOCABULARY


def network_inputs(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The demo network takes the target too (teacher forcing), for `export`."""
    inputs, target = batch
    return inputs, target


class CountingTransformer(LightningTransformer):
    def __init__(self, vocab_size: int = VOCABULARY):
        super().__init__(vocab_size=vocab_size)
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        """The demo downloads WikiText2 here; the DataModule brings the data instead."""

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The demo network's forward, telling nn.Transformer that its mask is causal:
        given the mask alone, it compares it with a causal one on every call, a read
        of the device that stalls a GPU every step (tests/kit/test_syncs.py names it)."""
        net = self.model
        mask = nn.Transformer.generate_square_subsequent_mask(inputs.shape[1], device=inputs.device)
        source = net.pos_encoder(net.embedding(inputs) * math.sqrt(net.ninp))
        target = net.pos_encoder(net.embedding(target) * math.sqrt(net.ninp))
        output = net.transformer(source, target, tgt_mask=mask, tgt_is_causal=True)
        return nn.functional.log_softmax(net.decoder(output), dim=-1).view(-1, net.vocab_size)

    def validation_step(self, batch, batch_idx: int) -> None:
        inputs, target = batch
        loss = torch.nn.functional.nll_loss(self(inputs, target), target.view(-1))
        self.log("val/loss", loss, sync_dist=True)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        inputs, target = batch
        log_probabilities = self(inputs, target).view(*target.shape, -1)
        return {"next": log_probabilities.argmax(dim=-1)}
