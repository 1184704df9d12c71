"""The model is device-agnostic: no tensor in its steps is made on a fixed device.

Kit test: it runs whatever model and data `project.py` names.
"""

import re
import traceback
import warnings

import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from support import SRC, configured, first_batch
from torch import nn


def loss_of(output) -> torch.Tensor:
    """The loss a training_step returned: a tensor, or the "loss" of a dict."""
    return output["loss"] if isinstance(output, dict) else output


# Operations that need the values of tensors, which the meta device does not have.
NEEDS_VALUES = re.compile(
    r"cannot be called on meta tensors|Cannot copy out of meta tensor|data-dependent"
    r"|with arguments from the 'Meta' backend"
)


def training_step_on_meta(module: nn.Module, batch) -> None:
    """training_step + backward with every parameter and every tensor of the batch on `meta`.

    A tensor the step creates without a device (`torch.zeros(n)`) lands on the
    CPU, and mixing it with meta tensors raises, exactly as it would with CUDA
    tensors on a GPU, but without needing one. A step that reads tensor values
    (`.item()`, or `torch.equal` as `nn.Transformer` does on its masks) cannot
    run on meta at all: the check is then skipped, saying where.
    """
    module = module.to("meta")
    batch = move_data_to_device(batch, torch.device("meta"))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*self.log.*")  # no Trainer attached
        try:
            loss = loss_of(module.training_step(batch, 0))
        except (RuntimeError, NotImplementedError) as error:
            if not NEEDS_VALUES.search(str(error)):
                raise
            frames = traceback.extract_tb(error.__traceback__)
            where = [f for f in frames if "/torch/_" not in f.filename.replace("\\", "/")][-1]
            pytest.skip(
                f"the step reads tensor values, which the meta device has not ({error};"
                f" {where.filename}:{where.lineno}): no device check for this model"
            )
    assert loss.device.type == "meta"
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device.type == "meta" for g in grads)


@pytest.fixture(scope="module")
def model_and_batch():
    cli = configured()
    return cli.model, first_batch(cli)


def test_training_step_runs_on_the_meta_device(model_and_batch):
    model, batch = model_and_batch
    training_step_on_meta(model, batch)


def test_meta_check_catches_a_tensor_made_on_the_cpu(model_and_batch):
    model, batch = model_and_batch

    class Buggy(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def training_step(self, batch, batch_idx):
            loss = loss_of(self.inner.training_step(batch, batch_idx))
            return loss + torch.zeros(1)  # the classic bug: no device=

    with pytest.raises(RuntimeError, match="device"):
        training_step_on_meta(Buggy(), batch)


def test_no_hard_coded_devices_in_the_source():
    banned = re.compile(r"\.cuda\(|device\s*=\s*[\"']cuda|torch\.device\(|DataParallel\(")
    offenders = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in SRC.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if banned.search(line)
    ]
    assert not offenders, "device code belongs in the Trainer config:\n" + "\n".join(offenders)
