"""Precision follows the hardware unless the user names one."""

import pytest
import torch
import yaml

from {{ cookiecutter.package_name }} import cli, hardware


@pytest.mark.parametrize(
    ("cuda", "bf16", "expected"),
    [(True, True, "bf16-mixed"), (True, False, "16-mixed"), (False, False, "32-true")],
)
def test_resolve_precision(cuda, bf16, expected):
    assert hardware.resolve_precision(cuda, bf16) == expected


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
        cli.main(["fit", *args, "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [((True, True), "bf16-mixed"), ((True, False), "16-mixed"), ((False, False), "32-true")],
)
def test_print_config_shows_the_resolved_precision(monkeypatch, capsys, capabilities, expected):
    monkeypatch.setattr(cli, "cuda_capabilities", lambda: capabilities)
    assert print_config(capsys)["trainer"]["precision"] == expected


def test_explicit_precision_wins(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cuda_capabilities", lambda: (True, True))
    config = print_config(capsys, "--trainer.precision=32-true")
    assert config["trainer"]["precision"] == "32-true"


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
