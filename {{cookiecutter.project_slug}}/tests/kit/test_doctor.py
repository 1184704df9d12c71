"""`doctor` names each broken environment, with its fix and the right exit code.

Kit test.
"""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch
from support import SRC

from {{ cookiecutter.package_name }}.kit import doctor


def fake_torch(**overrides) -> dict:
    """What probe_torch reports on a healthy one-GPU machine, with `overrides`."""
    facts = {
        "importable": True,
        "version": "2.5.1+cu124",
        "cuda_build": "12.4",
        "hip_build": None,
        "cudnn_available": True,
        "cudnn_version": 90100,
        "cuda_available": True,
        "device_count": 1,
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "capability": "9.0",
                "free_gib": 78.9,
                "total_gib": 79.1,
                "bf16": True,
            }
        ],
        "distributed": {"available": True, "nccl": True, "gloo": True},
    }
    return {**facts, **overrides}


NO_GPU = {"cuda_available": False, "device_count": 0, "devices": []}


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """Put an `nvidia-smi` on the PATH that reports a driver and GPUs."""

    def install(driver: str = "550.54.14", cuda: str = "12.4", gpus: int = 2):
        script = tmp_path / "bin" / "nvidia-smi"
        script.parent.mkdir(exist_ok=True)
        listing = "\\n".join(f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: GPU-{i})" for i in range(gpus))
        script.write_text(
            "#!/bin/sh\n"
            f'if [ "$1" = "-L" ]; then printf "{listing}\\n"; exit 0; fi\n'
            f'echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}  |"\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")

    return install


@pytest.fixture
def no_nvidia_smi(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)


@pytest.fixture(autouse=True)
def no_visible_devices_variable(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def run_doctor(monkeypatch, capsys, torch_facts: dict | None, *args: str) -> tuple[int, str]:
    if torch_facts is not None:
        monkeypatch.setattr(doctor, "probe_torch", lambda: torch_facts)
    code = doctor.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_cpu_build_on_a_machine_with_a_driver(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi()
    cpu_build = fake_torch(version="2.5.1+cpu", cuda_build=None, cudnn_available=False, **NO_GPU)
    code, out = run_doctor(monkeypatch, capsys, cpu_build)
    assert code == 0
    assert "torch 2.5.1+cpu is a CPU-only build, but this machine has an NVIDIA driver" in out
    assert "(550.54.14)" in out and "Fix: Reinstall torch with the CUDA build" in out
    assert "no newer than 12.4" in out
    assert "Result: no usable GPU, so training would run on the CPU; see the problems above." in out
    code, out = run_doctor(monkeypatch, capsys, cpu_build, "--require-gpu")
    assert code == 1 and "no usable GPU" in out


def test_a_machine_without_a_gpu_is_a_fact_not_a_problem(monkeypatch, capsys, no_nvidia_smi):
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU))
    assert code == 0
    assert "No problems found." in out and "Problems:" not in out
    assert "Result: no GPU on this machine: training runs on the CPU." in out
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--require-gpu")
    assert code == 1 and "doctor --require-gpu: no usable GPU" in out


def test_driver_too_old_for_the_cuda_torch_was_built_with(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi(driver="525.60.13", cuda="12.0")
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--require-gpu")
    assert code == 1
    assert (
        "The NVIDIA driver 525.60.13 supports CUDA up to 12.0, but torch 2.5.1+cu124 was built "
        "with CUDA 12.4: the driver is too old." in out
    )
    assert "Fix: Upgrade the driver, or install a torch built for CUDA 12.0 or older." in out


@pytest.mark.parametrize("value", ["", "-1"])
def test_cuda_visible_devices_hiding_every_gpu(monkeypatch, capsys, fake_nvidia_smi, value):
    fake_nvidia_smi(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--require-gpu")
    assert code == 1
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU (nvidia-smi lists 2)." in out
    assert "unset CUDA_VISIBLE_DEVICES" in out


def test_cuda_visible_devices_naming_missing_gpus(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    code, out = run_doctor(monkeypatch, capsys, fake_torch())
    assert code == 0
    assert "CUDA_VISIBLE_DEVICES='0,3' names GPU 3, but this machine has 2 (0-1)" in out
    assert "Fix: Name only GPUs 0-1" in out


def test_cudnn_missing(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi()
    code, out = run_doctor(monkeypatch, capsys, fake_torch(cudnn_available=False))
    assert code == 0
    assert "cuDNN is not available to this CUDA build of torch." in out
    assert "do not mix conda and pip" in out


def test_torch_distributed_missing(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi()
    broken = fake_torch(distributed={"available": False, "nccl": False, "gloo": False})
    code, out = run_doctor(monkeypatch, capsys, broken)
    assert "torch.distributed is missing from this torch build: DDP cannot run." in out
    assert "torch.distributed: no | NCCL: no | gloo: no" in out


def test_torch_that_does_not_import(monkeypatch, capsys, no_nvidia_smi):
    broken = {"importable": False, "error": "ImportError: libtorch_cpu.so: cannot open"}
    code, out = run_doctor(monkeypatch, capsys, broken)
    assert code == 1
    assert "torch cannot be imported (ImportError: libtorch_cpu.so: cannot open)." in out


def test_healthy_gpu_machine(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi(gpus=1)
    code, out = run_doctor(monkeypatch, capsys, fake_torch(), "--require-gpu")
    assert code == 0
    assert "No problems found." in out
    assert "GPU 0: NVIDIA H100 80GB HBM3 | compute capability 9.0" in out
    assert "78.9 GiB free of 79.1 GiB | bf16: yes" in out
    assert "driver 550.54.14 | supports CUDA up to 12.4 | 1 GPU(s)" in out
    assert "Result: 1 usable GPU(s); training will use CUDA." in out


def test_json_has_the_same_facts(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--json", "--require-gpu")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert report["torch"]["cuda_build"] == "12.4"
    assert report["nvidia_smi"]["driver_version"] == "550.54.14"
    assert report["nvidia_smi"]["gpus"] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert report["cuda_visible_devices"] == ""
    assert any("hides every GPU" in p["problem"] for p in report["problems"])
    assert set(report["packages"]) == {"lightning", "torchmetrics"}


def test_real_doctor_on_this_machine_without_importing_lightning():
    code = (
        "import sys\n"
        "from {{ cookiecutter.package_name }}.__main__ import main\n"
        "code = main(['doctor'])\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "assert not loaded & {'lightning', 'pytorch_lightning'}, 'doctor imported Lightning'\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert f"torch {torch.__version__}" in result.stdout
    assert "Result: " in result.stdout
    if not torch.cuda.is_available():
        assert "training runs on the CPU." in result.stdout


def test_doctor_says_on_which_processes_and_batches_a_checkpoint_resumes(
    trained_checkpoint, capsys
):
    saved = torch.load(trained_checkpoint, weights_only=True)
    size = saved["callbacks"]["KitCallbacks"]["ResumeState"]["batch_size"]
    assert doctor.main(["--ckpt", str(trained_checkpoint)]) == 0
    out = capsys.readouterr().out
    assert f"global batch {size} = {size} per device x 1 x 1 accumulated" in out
    assert f"    1: {size} x 1 (as saved: bit for bit)" in out
    for processes in (2, 4):  # the example's batch: a power of two
        if size % processes == 0:
            assert f"    {processes}: {size // processes} x 1\n" in out
    assert doctor.main(["--ckpt", "missing.ckpt"]) == 2
    assert "checkpoint 'missing.ckpt' does not exist" in capsys.readouterr().err
