"""`doctor` names each broken environment, with its fix and the right exit code.

Kit test.
"""

import json
import os
import socket
import stat
import subprocess
import sys

import pytest
import torch
from support import SRC

from {{ cookiecutter.package_name }}.kit import collectives, doctor
from {{ cookiecutter.package_name }}.kit.resume import same_samples


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
# torch's CPU-only build, as on a laptop or a CI runner
CPU_BUILD = {"version": "2.5.1+cpu", "cuda_build": None, "cudnn_available": False, **NO_GPU}


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


@pytest.fixture(autouse=True)
def no_distributed_variables(monkeypatch):
    """A plain shell: no rendezvous, launcher or NCCL variables from the test's own."""
    for name in collectives.environment(os.environ):
        monkeypatch.delenv(name)


def run_doctor(monkeypatch, capsys, torch_facts: dict | None, *args: str) -> tuple[int, str]:
    if torch_facts is not None:
        monkeypatch.setattr(doctor, "probe_torch", lambda: torch_facts)
    code = doctor.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_cpu_build_on_a_machine_with_a_driver(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi()
    cpu_build = fake_torch(**CPU_BUILD)
    code, out = run_doctor(monkeypatch, capsys, cpu_build)
    assert code == 0
    assert "torch 2.5.1+cpu is a CPU-only build, but this machine has an NVIDIA driver" in out
    assert "(550.54.14)" in out and "Fix: Reinstall torch with the CUDA build" in out
    assert "no newer than 12.4" in out
    assert "Result: no usable GPU, so training would run on the CPU; see the problems above." in out
    code, out = run_doctor(monkeypatch, capsys, cpu_build, "--require_gpu")
    assert code == 1 and "no usable GPU" in out


def test_a_machine_without_a_gpu_is_a_fact_not_a_problem(monkeypatch, capsys, no_nvidia_smi):
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**CPU_BUILD))
    assert code == 0
    assert "No problems found." in out and "Problems:" not in out
    assert "Result: no GPU on this machine: training runs on the CPU." in out
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**CPU_BUILD), "--require_gpu")
    assert code == 1 and "doctor --require_gpu: no usable GPU" in out


def test_a_cuda_build_on_a_machine_without_a_driver(monkeypatch, capsys, no_nvidia_smi):
    """PyPI's Linux torch is a CUDA build: on a CPU machine it trains on the CPU and its
    CUDA libraries fill gigabytes for nothing. The fix names the CPU build's command."""
    cuda_build = fake_torch(version="2.14.1+cu130", cuda_build="13.0", cuda_libraries_bytes=4.33e9)
    code, out = run_doctor(monkeypatch, capsys, {**cuda_build, **NO_GPU})
    assert code == 0
    assert (
        "torch 2.14.1+cu130 is a CUDA 13.0 build, but this machine has no NVIDIA driver (no"
        " nvidia-smi): it trains on the CPU, and its CUDA libraries take 4.3 GB of disk." in out
    )
    fix = "pip install torch==2.14.1 --index-url https://download.pytorch.org/whl/cpu"
    assert fix in out and "No problems found." not in out


def test_a_release_the_kit_was_not_checked_on_is_a_line_not_a_problem(
    monkeypatch, capsys, no_nvidia_smi
):
    newer = {"torch": "2.15.0 (checked on 2.13.0)"}
    monkeypatch.setattr(doctor, "unchecked_releases", lambda: newer)
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**CPU_BUILD))
    assert code == 0 and "No problems found." in out
    assert (
        "Not yet checked by the kit: torch 2.15.0 (checked on 2.13.0); `pytest"
        " tests/kit/test_internals.py` says whether the private names it uses still work" in out
    )


def test_driver_too_old_for_the_cuda_torch_was_built_with(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi(driver="525.60.13", cuda="12.0")
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--require_gpu")
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
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--require_gpu")
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
    code, out = run_doctor(monkeypatch, capsys, fake_torch(), "--require_gpu")
    assert code == 0
    assert "No problems found." in out
    assert "GPU 0: NVIDIA H100 80GB HBM3 | compute capability 9.0" in out
    assert "78.9 GiB free of 79.1 GiB | bf16: yes" in out
    assert "driver 550.54.14 | supports CUDA up to 12.4 | 1 GPU(s)" in out
    assert "Result: 1 usable GPU(s); training will use CUDA." in out


def test_json_has_the_same_facts(monkeypatch, capsys, fake_nvidia_smi):
    fake_nvidia_smi(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--json", "--require_gpu")
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
    state = saved["callbacks"]["KitCallbacks"]["ResumeState"]
    size = state["batch_size"]
    assert doctor.main(["--ckpt_path", str(trained_checkpoint)]) == 0
    out = capsys.readouterr().out
    assert f"global batch {size} = {size} per device x 1 x 1 accumulated" in out
    kept = all(state["loaders"])  # a loader that keeps its position: the same run
    assert f"    1: {size} x 1{' (as saved: the same run)' * kept}\n" in out
    other = same_samples(state)  # the steps' samples on another number of processes
    if other is None:
        assert "on another number, each step trains the same samples" in out
    else:
        assert f"the steps train other samples than it would have: {other}" in out
    for processes in (2, 4):  # the example's batch: a power of two
        if size % processes == 0:
            assert f"    {processes}: {size // processes} x 1\n" in out
    assert doctor.main(["--ckpt_path", "missing.ckpt"]) == 2
    assert "checkpoint 'missing.ckpt' does not exist" in capsys.readouterr().err


# doctor --distributed ------------------------------------------------------------


def test_stray_rendezvous_variables_outside_a_launcher(monkeypatch, capsys, no_nvidia_smi):
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU))  # the plain doctor
    assert code == 0
    assert (
        "NODE_RANK=1, MASTER_PORT=29500 are set in a shell that no launcher started (no SLURM"
        " job, torchrun or Kubernetes pod): Lightning takes them for a launcher's, and a"
        " multi-process fit then waits for ranks that never come." in out
    )
    assert "Fix: Unset them (`unset NODE_RANK MASTER_PORT`)" in out
    stray = {"RANK": "0"}
    assert "RANK=0 is set" in collectives.stray_variables(stray)[0]["problem"]
    for marker in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST"):
        assert collectives.stray_variables({**stray, marker: "7"}) == []
    assert collectives.stray_variables({"SLURM_JOB_ID": "7"}) == []


def test_nccl_variables_say_what_they_cost():
    p2p, ib = collectives.nccl_variables({"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"})
    assert "NCCL_P2P_DISABLE=1: NCCL routes GPU-to-GPU traffic through host" in p2p["problem"]
    assert "unless `doctor --distributed` hangs without it" in p2p["fix"]
    assert "NCCL_IB_DISABLE=1: NCCL routes traffic between nodes over TCP sockets" in ib["problem"]
    assert collectives.nccl_variables({"NCCL_P2P_DISABLE": "0", "NCCL_IB_DISABLE": ""}) == []


def test_more_ranks_than_visible_gpus_is_not_launched(monkeypatch, capsys, no_nvidia_smi):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    two_gpus = fake_torch(device_count=2, devices=fake_torch()["devices"] * 2)
    code, out = run_doctor(monkeypatch, capsys, two_gpus, "--distributed", "--world_size", "4")
    assert code == 1
    assert (
        "--world_size 4 asks for 4 GPUs, but 2 are visible (CUDA_VISIBLE_DEVICES='0,1'): NCCL"
        " needs a GPU of its own for each rank." in out
    )
    assert "Fix: Pass --world_size 2 or fewer, or list more GPUs in CUDA_VISIBLE_DEVICES" in out
    assert "Distributed: 4 rank(s), nccl on GPUs" in out and "Result: not run" in out
    assert collectives.hidden_devices(4, 0, {}) == []  # on the CPU: gloo, any number of ranks


def test_a_master_port_something_listens_on():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert collectives.port_in_use(port)
        (found,) = collectives.taken_port({"MASTER_PORT": str(port)})
    assert f"MASTER_PORT={port} is taken: something on this machine listens" in found["problem"]
    assert "Unset it (`unset MASTER_PORT`): the kit picks a free port" in found["fix"]
    assert collectives.taken_port({"MASTER_PORT": "29500"}, in_use=lambda port: False) == []
    (found,) = collectives.taken_port({"MASTER_PORT": "port"})
    assert found["problem"] == "MASTER_PORT='port' is not a port number."


def planted(backend: str = "nccl", **facts) -> dict:
    """The result of a check of 2 ranks that ran, with `facts` changed."""
    result = {
        "backend": backend,
        "timeout_s": 30.0,
        "port": 23456,
        "arrived": [0, 1],
        "missing": [],
        "finished": [0, 1],
        "errors": {},
        "wrong": [],
    }
    return {**result, **facts}


def test_a_collective_that_hangs_names_nccl_p2p_disable():
    (found,) = collectives.outcome(planted(finished=[0]), command="my-project doctor")
    assert found["problem"] == (
        "Every rank arrived, but the all-reduce and broadcast did not finish within 30 s on"
        " rank 1: a collective that hangs."
    )
    assert "rerun as `NCCL_P2P_DISABLE=1 my-project doctor --distributed`" in found["fix"]
    (found,) = collectives.outcome(planted("gloo", finished=[]))
    assert "on ranks 0, 1" in found["problem"] and "GLOO_SOCKET_IFNAME=lo" in found["fix"]
    (found,) = collectives.outcome(planted(errors={"0": "E: x", "1": "E: x"}, finished=[]))
    assert found["problem"] == "Ranks 0, 1 failed: E: x" and "NCCL_DEBUG=INFO" in found["fix"]
    (found,) = collectives.outcome(planted(wrong=[1]))
    assert found["problem"] == "The all-reduce or broadcast gave wrong values on rank 1."
    assert collectives.outcome(planted()) == []


def test_doctor_distributed_on_two_cpu_processes(monkeypatch, capsys, no_nvidia_smi):
    """The one test that forms a real group: 2 gloo ranks, whatever the machine has."""
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), "--distributed", "--json")
    check = json.loads(out)["distributed"]
    assert code == 0 and check["ok"] is True, check
    assert (check["world_size"], check["backend"], check["launched"]) == (2, "gloo", True)
    assert check["arrived"] == check["finished"] == [0, 1] and check["missing"] == []
    assert check["allreduce_s"] > 0 and check["broadcast_s"] > 0 and check["formed_s"] > 0
    assert check["busbw_gbps"] is None and check["problems"] == []  # bus bandwidth: NCCL's
    text = collectives.format_check(check)
    assert f"rendezvous 127.0.0.1:{check['port']} | arrived: 0, 1 | group formed in" in text
    assert "all-reduce of 4 MiB: " in text and "(medians of 5)" in text
    assert text.endswith(
        "Result: 2 rank(s) formed a gloo group; the all-reduce and broadcast gave the right values."
    )


def test_a_rank_that_never_arrives_is_named_within_the_timeout(monkeypatch, capsys, no_nvidia_smi):
    """Rank 1 is never started: rank 0 waits at the rendezvous until the doctor ends both."""
    check = collectives.check
    monkeypatch.setattr(collectives, "check", lambda *args, **kw: check(*args, **kw, ranks=[0]))
    # A forked rank arrives at once; a spawned one (CUDA initialised here) imports torch first.
    timeout = "1" if sys.platform == "linux" and not torch.cuda.is_initialized() else "60"
    args = ("--distributed", "--world_size", "2", "--timeout", timeout)
    code, out = run_doctor(monkeypatch, capsys, fake_torch(**NO_GPU), *args)
    assert code == 1
    assert "| arrived: 0 | did not arrive: 1" in out
    assert "Rank 1 did not arrive at the rendezvous (127.0.0.1:" in out
    assert f"within {timeout} s; rank 0 waited for it." in out
    assert "Result: the process group is not usable here; see the problems above." in out


def test_distributed_flags_only_with_distributed(capsys):
    assert doctor.main(["--timeout", "5"]) == 2
    assert "--timeout: only with --distributed" in capsys.readouterr().err
    assert doctor.main(["--distributed", "--timeout", "0"]) == 2
    assert "error: --timeout 0: must be above 0" in capsys.readouterr().err
    assert doctor.main(["--distributed", "--world_size", "-1"]) == 2
    assert "error: --world_size -1: must be above 0" in capsys.readouterr().err


def test_the_dashed_spellings_are_aliases_of_the_underscored(capsys):
    """The tools spell their flags as the training commands do (`--world_size`, like
    `--data.batch_size`); the dashed forms still work."""
    for spelling in ("--world_size", "--world-size"):
        assert doctor.main([spelling, "2"]) == 2
        assert "error: --world_size: only with --memory or --distributed" in (
            capsys.readouterr().err
        )
    assert doctor.main(["--ckpt", "missing.ckpt"]) == doctor.main(["--ckpt_path", "missing.ckpt"])
    assert "--require_gpu, --require-gpu" in doctor.parser().format_help()
