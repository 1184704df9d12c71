"""Weights unfrozen in the middle of a DDP fit train the same on every rank.

DDP averages, after each backward, the gradients of the parameters that required
a gradient when it wrapped the model. A fine-tune that unfreezes a block later
(in `on_train_epoch_start`, through Lightning's `BaseFinetuning`, or in a resume
that restored which weights train) leaves those out: each rank would step the
block by its own gradient, and the ranks' copies of it would drift apart unsaid.
`UnfrozenGradients` averages those gradients itself. Imports torch and Lightning.
"""

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.nn.parallel import DistributedDataParallel


class UnfrozenGradients(Callback):
    """After each backward of a DDP fit, averages over the ranks the gradients of the
    parameters that DDP left out because they were frozen when it wrapped the model, and
    that train now; one collective a backward, and only once one of them trains.

    A parameter that trains but has no gradient on a rank (it took no part in that
    rank's loss) counts as a zero gradient there, so that every rank joins the same
    collective. Frozen weights cost one check of their flags a backward.
    """

    def __init__(self) -> None:
        self._left_out: list[torch.Tensor] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._left_out = []
        if isinstance(trainer.strategy.model, DistributedDataParallel):
            # DDP wrapped the model before this hook: what is frozen now, it left out.
            self._left_out = [p for p in pl_module.parameters() if not p.requires_grad]

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        training = [p for p in self._left_out if p.requires_grad]
        if not training:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in training]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        torch.distributed.all_reduce(flat)
        flat /= trainer.world_size
        sizes = [grad.numel() for grad in grads]
        for parameter, averaged in zip(training, flat.split(sizes), strict=True):
            parameter.grad = averaged.view_as(parameter).to(parameter.dtype)
