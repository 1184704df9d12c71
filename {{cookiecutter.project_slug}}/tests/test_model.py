"""The module is device-agnostic: no tensor in forward is made on a fixed device."""

import re

import pytest
import torch
from conftest import SRC
from torch import nn

from {{ cookiecutter.package_name }}.cli import Model, main

{% if cookiecutter.example == "digits" -%}
INPUT_SHAPE = (4, 1, 8, 8)
{%- else -%}
INPUT_SHAPE = (4, 16)
{%- endif %}


def forward_backward_on_meta(module: nn.Module) -> None:
    """Forward + backward with every parameter and input on the `meta` device.

    A tensor that forward creates without a device (`torch.zeros(n)`) lands on
    the CPU, and mixing it with meta tensors raises, exactly as it would with
    CUDA tensors on a GPU, but without needing one.
    """
    module = module.to("meta")
    x = torch.empty(INPUT_SHAPE, device="meta")
    out = module(x)
    assert out.device.type == "meta"
    out.float().sum().backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device.type == "meta" for g in grads)


def test_module_runs_forward_and_backward_on_meta_device():
    forward_backward_on_meta(Model())


def test_meta_check_catches_a_tensor_made_on_the_cpu():
    class Buggy(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Model()

        def forward(self, x):
            out = self.inner(x)
            return out + torch.zeros(out.shape[-1])  # the classic bug: no device=

    with pytest.raises((RuntimeError, NotImplementedError)):
        forward_backward_on_meta(Buggy())


def test_no_hard_coded_devices_in_the_source():
    banned = re.compile(r"\.cuda\(|device\s*=\s*[\"']cuda|torch\.device\(|DataParallel\(")
    offenders = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in SRC.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if banned.search(line)
    ]
    assert not offenders, "device code belongs in the Trainer config:\n" + "\n".join(offenders)


def test_optimizer_and_scheduler_are_chosen_from_the_command_line(workdir):
    cli = main(
        [
            "--model.optimizer=torch.optim.SGD",
            "--model.optimizer.lr=0.05",
            "--model.optimizer.momentum=0.9",
            "--model.scheduler=torch.optim.lr_scheduler.StepLR",
            "--model.scheduler.step_size=3",
        ],
        run=False,
    )
    config = cli.model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["lr"] == 0.05 and optimizer.defaults["momentum"] == 0.9
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR) and scheduler.step_size == 3
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in cli.model.parameters()
    }
