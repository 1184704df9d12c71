"""After a classic error the command prints what it means and what to do, and exits 1.

Kit test: the errors are raised inside whatever model `project.py` names.
"""

import re

import pytest
import torch
from support import PACKAGE, PROJECT, PROJECT_ROOT, SCRIPT, SRC, configured, first_batch
from test_model import made_on_the_cpu, training_step_on_meta

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit.hints import (
    HINTS,
    explain,
    find_hint,
    markdown_table,
    one_line,
)

Model = PROJECT.model

# Each classic error as torch, CUDA or Lightning words it, and the hint it must get.
REAL_MESSAGES = [
    ("CUDA out of memory. Tried to allocate 512.00 MiB", "CUDA out of memory"),
    (
        "Expected all tensors to be on the same device, but found at least two devices, "
        "cuda:0 and cpu!",
        "Expected all tensors to be on the same device",
    ),
    ("CUDA driver version is insufficient for CUDA runtime version", "CUDA driver version"),
    ("libcudnn.so.9: cannot open shared object file: No such file or directory", "libcudnn"),
    ("CUDA error: invalid device ordinal", "invalid device ordinal"),
    ("No supported gpu backend found!", "`CUDAAccelerator` can not run"),
    ("SyncBatchNorm layers only work with GPU modules", "SyncBatchNorm"),
    ("Timed out after 31 seconds waiting for clients. 1/2 clients joined.", None),
    (
        "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4995. This"
        " is typically caused by a remote worker crashing.",
        "NCCL/gloo timeout or connection error",
    ),
    ("No module named 'torch.distributed'", "No module named 'torch.distributed'"),
    (
        "It looks like your LightningModule has parameters that were not used in producing the"
        " loss returned by training_step. If this is intentional, you must enable the detection"
        " of unused parameters in DDP",
        "parameters that were not used in producing the loss",
    ),
    (
        "The server socket has failed to listen on any local network address. port: 29500,"
        " useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
        "the rendezvous port is already taken",
    ),
]


@pytest.mark.parametrize(("message", "symptom"), REAL_MESSAGES)
def test_each_error_finds_its_hint(message, symptom):
    hint = find_hint(RuntimeError(message))
    if symptom is None:  # a plain RuntimeError saying "timed out" is no init timeout
        assert hint is None
    else:
        assert hint is not None and hint.symptom.startswith(symptom)


def test_hint_is_found_through_the_chain_of_causes():
    try:
        try:
            raise RuntimeError("CUDA error: invalid device ordinal")
        except RuntimeError as inner:
            raise ValueError("setup failed") from inner
    except ValueError as outer:
        assert find_hint(outer).symptom == "invalid device ordinal"


def test_unknown_errors_get_no_hint():
    assert explain(KeyError("val/acc")) is None


def test_the_troubleshooting_table_is_the_hint_table():
    readme = (PROJECT_ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    section = re.search(r"<!-- hints:start -->\n(.*?)\n<!-- hints:end -->", readme, re.DOTALL)
    assert section, "docs/troubleshooting.md lost its table markers"
    table = markdown_table(SCRIPT)  # the command as the docs name it
    assert section.group(1) == table, (
        "docs/troubleshooting.md's table differs from hints.HINTS; regenerate it with "
        f"`python -m {PROJECT.package}.kit.hints {SCRIPT}`"
    )
    assert len(table.splitlines()) == len(HINTS) + 2


def fail_in_training_step(monkeypatch, error_factory):
    def training_step(self, batch, batch_idx):
        raise error_factory(self, batch)

    monkeypatch.setattr(Model, "training_step", training_step)


def test_out_of_memory_in_a_step(workdir, monkeypatch, capfd):
    fail_in_training_step(
        monkeypatch,
        lambda self, batch: torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 512.00 MiB"
        ),
    )
    cli = configured()
    cli.datamodule.trainer = cli.trainer
    cli.datamodule.prepare_data()
    cli.datamodule.setup("fit")
    loader = cli.datamodule.train_dataloader()
    code = command(["fit", "--trainer.fast_dev_run=true"])
    err = capfd.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last)" in err  # nothing swallowed
    assert err.index("OutOfMemoryError") < err.index("Hint: CUDA out of memory")
    if loader.batch_size is None:  # a batch sampler of the project's sizes each batch
        sampler = type(getattr(loader.batch_sampler, "batches", loader.batch_sampler)).__name__
        assert f"In use: batches as {sampler} makes them" in err
        assert f"Try: batches half the size from {sampler}" in err
    else:
        assert f"In use: --data.batch_size {loader.batch_size} per device" in err
        half = max(1, loader.batch_size // 2)
        assert f"Try: --data.batch_size {half} --trainer.accumulate_grad_batches 2" in err
    if not torch.cuda.is_available():
        assert "--trainer.precision 32-true" in err and "--trainer.precision bf16-mixed" in err
    assert "empty_cache()` is no cure" in err
    # What the run knew went with its error, not into a store another error would read.
    later = explain(torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert "Hint: CUDA out of memory" in later and "In use:" not in later


def test_device_mismatch_in_a_step_shows_where_tensors_live(workdir, monkeypatch, capfd):
    def stray_buffer(self, batch):
        # The classic bug, staged on the CPU: a tensor on another device than the rest.
        self.register_buffer("stray", torch.zeros(1, device="meta"))
        return (next(self.parameters()).flatten()[:1] + self.stray).sum()

    fail_in_training_step(monkeypatch, stray_buffer)
    code = command(["fit", "--trainer.fast_dev_run=true"])
    err = capfd.readouterr().err
    assert code == 1
    assert "Hint: Expected all tensors to be on the same device" in err
    assert "Where the module's tensors were when it failed:" in err
    assert re.search(r"  meta: stray\n", err)
    assert re.search(r"  (cpu|cuda:0): \w", err)
    assert "register_buffer" in err and "x.new_zeros" in err


def test_a_step_that_breaks_the_meta_rule_gets_the_device_hint():
    cli = configured()
    with pytest.raises(RuntimeError) as error:
        training_step_on_meta(made_on_the_cpu(cli.model), first_batch(cli))
    assert "Hint: Expected all tensors to be on the same device" in explain(error.value, {})


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("CUDA error: invalid device ordinal", "Requested: --trainer.devices 1; visible: 0"),
        ("CUDA driver version is insufficient for CUDA runtime version", "doctor` shows both"),
        ("libcudnn_cnn.so.9: cannot open shared object file", "do not mix conda and pip"),
    ],
)
def test_cuda_errors_raised_in_a_step(workdir, monkeypatch, capfd, message, expected):
    if torch.cuda.is_available() and "ordinal" in message:
        pytest.skip("the visible-device count differs on a GPU machine")
    fail_in_training_step(monkeypatch, lambda self, batch: RuntimeError(message))
    code = command(["fit", "--trainer.fast_dev_run=true"])
    err = capfd.readouterr().err
    assert code == 1 and "Hint: " in err and expected in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU to run on")
def test_asking_for_a_gpu_that_is_not_there(workdir, capfd):
    assert command(["fit", "--trainer.accelerator=gpu"]) == 1
    err = capfd.readouterr().err
    assert "No supported gpu backend found" in err
    assert "Hint: `CUDAAccelerator` can not run on your system" in err
    assert f"{PROJECT.command} doctor` says which" in err


def test_a_missing_file_is_one_line_naming_the_projects_line_it_came_from():
    path = SRC / PACKAGE / "data.py"  # as if it were in the project's own data.py
    code = compile("def make_splits():\n    open('data/absent.csv')\n", str(path), "exec")
    scope: dict = {}
    exec(code, scope)
    with pytest.raises(FileNotFoundError) as caught:
        scope["make_splits"]()
    line, exit_code = one_line(caught.value, PACKAGE) or ("", 0)
    assert line.endswith("'data/absent.csv' (raised in data.py:2, in make_splits)")
    assert exit_code == 2


def test_an_error_is_looked_through_only_where_lightning_raised_it():
    """A download that failed after a cache file was not found is that failure, with its
    traceback: only an error Lightning raises over another hides the one that stopped it."""
    try:
        try:
            open("absent-cache")  # noqa: SIM115  (it fails)
        except FileNotFoundError as missing:
            raise RuntimeError("the download failed") from missing
    except RuntimeError as error:
        assert one_line(error, PACKAGE) is None
