"""The model is device-agnostic: no tensor in its steps is made on a fixed device.

Kit test: it runs whatever model and data `project.py` names.
"""

import copy
import re
import traceback
import warnings
from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from support import PACKAGE, SRC, configured, first_batch
from support.models import TwoNetworks
from torch import nn

from {{ cookiecutter.package_name }}.kit.memory import training_step

KIT = (SRC / PACKAGE / "kit").resolve()
# Operations that need the values of tensors, which the meta device does not have.
NEEDS_VALUES = re.compile(
    r"cannot be called on meta tensors|Cannot copy out of meta tensor|data-dependent"
    r"|with arguments from the 'Meta' backend"
)


def training_step_on_meta(module: nn.Module, batch) -> None:
    """A training step (its backward passes too) with every parameter and every tensor of
    the batch on `meta`, run as Lightning runs it (kit.memory.training_step: a manual
    one with the module's own optimizers).

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
            backwards = training_step(module, batch)
        except (RuntimeError, NotImplementedError) as error:
            if not NEEDS_VALUES.search(str(error)):
                raise
            frames = traceback.extract_tb(error.__traceback__)
            where = [f for f in frames if "/torch/_" not in f.filename.replace("\\", "/")][-1]
            # The project's own code may read values; the kit's must not.
            assert not Path(where.filename).resolve().is_relative_to(KIT), (
                f"the kit reads values: {where}"
            )
            pytest.skip(
                f"the step reads tensor values, which the meta device has not ({error};"
                f" {where.filename}:{where.lineno}): no device check for this model"
            )
    assert backwards and all(b.loss.device.type == "meta" for b in backwards)
    grads = [grad for b in backwards for grad in b.grads]
    assert grads and all(grad.device.type == "meta" for grad in grads)


def made_on_the_cpu(module: nn.Module) -> nn.Module:
    """The classic bug, planted: a copy of `module` whose layers with weights add a tensor
    made without a device (`torch.zeros(1)`, on the CPU) to what they return."""
    module = copy.deepcopy(module)

    def plant(layer, inputs, output):
        return output + torch.zeros(1) if isinstance(output, torch.Tensor) else None

    for layer in module.modules():
        if any(True for _ in layer.parameters(recurse=False)):
            layer.register_forward_hook(plant)
    return module


@pytest.fixture(scope="module")
def model_and_batch():
    cli = configured()
    return cli.model, first_batch(cli)


def test_training_step_runs_on_the_meta_device(model_and_batch):
    model, batch = model_and_batch
    training_step_on_meta(model, batch)


def test_meta_check_catches_a_tensor_made_on_the_cpu(model_and_batch):
    model, batch = model_and_batch
    with pytest.raises(RuntimeError, match="device"):
        training_step_on_meta(made_on_the_cpu(model), batch)


def test_a_step_that_optimizes_by_hand_runs_on_meta_with_its_own_optimizers():
    """Manual optimization (a GAN): the step calls self.optimizers(), toggles them and
    calls manual_backward, with no Trainer; both backward passes stay on meta."""
    batch = (torch.randn(4, 2),)
    training_step_on_meta(TwoNetworks(), batch)
    with pytest.raises(RuntimeError, match="device"):
        training_step_on_meta(made_on_the_cpu(TwoNetworks()), batch)
    # Toggled as Lightning does it: each backward reaches its own network's 4 tensors only.
    model = TwoNetworks()
    assert [len(b.grads) for b in training_step(model, batch)] == [4, 4]
    assert all(p.requires_grad for p in model.parameters())  # and toggled back


def test_no_hard_coded_devices_in_the_source():
    banned = re.compile(r"\.cuda\(|device\s*=\s*[\"']cuda|torch\.device\(|DataParallel\(")
    offenders = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in SRC.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if banned.search(line)
    ]
    assert not offenders, "device code belongs in the Trainer config:\n" + "\n".join(offenders)
