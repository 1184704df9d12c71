"""Precision and SyncBatchNorm follow the accelerator the run will use, unless the user names them.

Kit test.
"""

import pytest
import torch
import yaml
from support import main

from {{ cookiecutter.package_name }}.kit import cli, hardware


@pytest.mark.parametrize(
    ("accelerator", "bf16", "expected"),
    [("cuda", True, "bf16-mixed"), ("cuda", False, "16-mixed"), ("cpu", False, "32-true")],
)
def test_resolve_precision(accelerator, bf16, expected):
    assert hardware.resolve_precision(accelerator, bf16) == expected


@pytest.mark.parametrize(
    ("value", "cuda", "mps", "expected"),
    [
        ("auto", True, False, "cuda"),
        ("auto", False, False, "cpu"),
        ("auto", False, True, "mps"),
        ("gpu", True, False, "cuda"),
        ("cpu", True, False, "cpu"),  # a GPU machine, told to use its CPU
        ("cuda", True, False, "cuda"),
        ({"class_path": "lightning.pytorch.accelerators.CPUAccelerator"}, True, False, "cpu"),
    ],
)
def test_run_accelerator(value, cuda, mps, expected):
    assert hardware.run_accelerator(value, cuda, mps) == expected


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [
        ([], (False, False)),
        ([(9, 0)], (True, True)),  # H100
        ([(8, 0), (8, 6)], (True, True)),  # A100 + RTX 3090
        ([(8, 0), (7, 5)], (True, False)),  # one T4 among them: no bf16 for the run
    ],
)
def test_cuda_capabilities_from_faked_devices(monkeypatch, capabilities, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(capabilities))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capabilities[i])
    assert hardware.cuda_capabilities() == expected


def print_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit):
        main(["fit", *args, "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)["trainer"]


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [((True, True), "bf16-mixed"), ((True, False), "16-mixed"), ((False, False), "32-true")],
)
def test_print_config_shows_the_resolved_precision(monkeypatch, capsys, capabilities, expected):
    monkeypatch.setattr(cli, "cuda_capabilities", lambda: capabilities)
    assert print_config(capsys)["precision"] == expected


def test_the_cpu_of_a_gpu_machine_trains_in_float32(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cuda_capabilities", lambda: (True, True))
    assert print_config(capsys, "--trainer.accelerator=cpu")["precision"] == "32-true"
    assert print_config(capsys, "--trainer.accelerator=gpu")["precision"] == "bf16-mixed"


def test_explicit_precision_wins(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cuda_capabilities", lambda: (True, True))
    trainer = print_config(capsys, "--trainer.precision=32-true")
    assert trainer["precision"] == "32-true"


def test_sync_batchnorm_is_used_only_on_cuda(monkeypatch):
    said = []
    trainer = {"accelerator": "cpu", "sync_batchnorm": True, "precision": None}
    cli.resolve_hardware(trainer, say=said.append)
    assert trainer == {"accelerator": "cpu", "sync_batchnorm": False, "precision": "32-true"}
    assert said == [
        "sync_batchnorm off: SyncBatchNorm works on CUDA only and this run uses cpu;"
        " each rank normalises its own part of the batch"
    ]
    monkeypatch.setattr(cli, "cuda_capabilities", lambda: (True, True))
    trainer = {"accelerator": "auto", "sync_batchnorm": True, "precision": None}
    cli.resolve_hardware(trainer, say=said.append)
    assert trainer["sync_batchnorm"] is True and trainer["precision"] == "bf16-mixed"
    assert len(said) == 1


def test_tensor_cores_only_on_cuda(monkeypatch):
    before = torch.get_float32_matmul_precision()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        torch.set_float32_matmul_precision("highest")
        hardware.use_tensor_cores()
        assert torch.get_float32_matmul_precision() == "highest"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        hardware.use_tensor_cores()
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
