"""The environment report says what the run will really use; the progress bar is
redrawn a few times a second, whatever a step takes; the kit's callbacks cost
Lightning one callback a hook.

Kit test: the fit runs whatever model and data `project.py` names.
"""

import logging
import sys
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.profilers import SimpleProfiler
from support import PROJECT, FakeClock, configured, main, optimizes_by_hand
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.kit.callbacks import (
    EnvironmentReport,
    FailureContext,
    KitCallbacks,
    NoProfiler,
    collect_environment,
    find_callback,
    format_environment,
    torch_build,
)
from {{ cookiecutter.package_name }}.kit.checkpoints import BestAndLast
from {{ cookiecutter.package_name }}.kit.console import EpochLines, Summary, TQDMBar, TrainLoss
from {{ cookiecutter.package_name }}.kit.doctor import cuda_devices
from {{ cookiecutter.package_name }}.kit.health import TrainingHealth

GPU_FACTS = {
    "torch": "2.5.1+cu124",
    "torch_build": "CUDA 12.4",
    "lightning": "2.6.0",
    "cuda_available": True,
    "cudnn": 90100,
    "gpus": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "free_gib": 78.9, "total_gib": 79.1},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "free_gib": 12.5, "total_gib": 79.1},
        # Another rank's device: its free memory is not asked for.
        {"index": 2, "name": "NVIDIA H100 80GB HBM3", "free_gib": None, "total_gib": 79.1},
    ],
    "accelerator": "CUDAAccelerator",
    "strategy": "DDPStrategy",
    "devices": 2,
    "num_nodes": 2,
    "world_size": 4,
    "precision": "bf16-mixed",
    "matmul_precision": "high",
    "batch_size": 64,
    "accumulate_grad_batches": 4,
    "effective_batch_size": 1024,
    "num_workers": 7,
    "pin_memory": True,
    "persistent_workers": True,
}


def test_report_of_a_multi_gpu_run_shows_every_fact():
    report = format_environment(GPU_FACTS)
    for expected in [
        "torch 2.5.1+cu124 (CUDA 12.4)",
        "lightning 2.6.0",
        "cuDNN 90100",
        "CUDA available: True",
        "GPU 0: NVIDIA H100 80GB HBM3 | 78.9 GiB free of 79.1 GiB",
        "GPU 1: NVIDIA H100 80GB HBM3 | 12.5 GiB free of 79.1 GiB",
        "GPU 2: NVIDIA H100 80GB HBM3 | 79.1 GiB\n",
        "accelerator: CUDAAccelerator | strategy: DDPStrategy",
        "devices 2 x nodes 2 = world size 4",
        "precision: bf16-mixed | float32 matmul: high",
        "batch: 64 per device x 4 accumulated x 4 ranks = 1024 effective",
        "loader: num_workers 7 | pin_memory True | persistent_workers True",
    ]:
        assert expected in report


def test_report_on_this_machine_at_fit_start(workdir, caplog):
    # Lightning accumulates for automatic optimization only (a manual step does its own).
    accumulate = 1 if optimizes_by_hand() else 2
    flags = ["--trainer.fast_dev_run=true", f"--trainer.accumulate_grad_batches={accumulate}"]
    with caplog.at_level(logging.INFO):
        cli = main(["fit", *flags])
    report = find_callback(cli.trainer, EnvironmentReport)
    facts = report.facts
    assert facts["torch"] == torch.__version__
    assert facts["torch_build"] == torch_build()
    assert facts["cuda_available"] is torch.cuda.is_available()
    assert (facts["devices"], facts["num_nodes"], facts["world_size"]) == (1, 1, 1)
    if not torch.cuda.is_available():
        assert facts["accelerator"] == "CPUAccelerator"
        assert facts["strategy"] == "SingleDeviceStrategy"
        assert facts["precision"] == "32-true"
    # Read from the training DataLoader itself, whatever the DataModule.
    loader = cli.trainer.train_dataloader
    settings = (loader.num_workers, loader.pin_memory, loader.persistent_workers)
    assert (facts["num_workers"], facts["pin_memory"], facts["persistent_workers"]) == settings
    printed = caplog.text
    assert "Environment" in printed
    batch_size = loader.batch_size
    if batch_size is None:  # a batch sampler of the project's sizes each batch
        sampler = type(getattr(loader.batch_sampler, "batches", loader.batch_sampler)).__name__
        assert (facts["batch_size"], facts["batch_sampler"]) == (None, sampler)
        assert f"batch: as {sampler} makes each, per device x {accumulate} accumulated" in printed
    else:
        effective = accumulate * batch_size
        assert (facts["batch_size"], facts["effective_batch_size"]) == (batch_size, effective)
        assert (
            f"batch: {batch_size} per device x {accumulate} accumulated x 1 ranks = {effective}"
            " effective" in printed
        )
    assert f"loader: num_workers {settings[0]} | pin_memory {settings[1]}" in printed


def test_cpu_build_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert torch_build() == "CPU-only"
    monkeypatch.setattr(torch.version, "cuda", "12.1")
    assert torch_build() == "CUDA 12.1"


def test_facts_without_a_training_loader_leave_batch_lines_out():
    trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    facts = collect_environment(trainer)
    assert facts["batch_size"] is None and facts["num_workers"] is None
    report = format_environment(facts)
    assert "batch:" not in report and "loader:" not in report


def test_free_memory_is_asked_of_the_own_device_only(monkeypatch):
    """mem_get_info opens a CUDA context on the device it asks: a rank asks its own."""
    asked = []
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=140 * 1024**3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda index: asked.append(index) or (70 * 1024**3, 0)
    )
    devices = cuda_devices(free_of={1})
    assert asked == [1]
    assert [d["free_gib"] for d in devices] == [None, 70.0, None]
    assert [d["total_gib"] for d in devices] == [140.0] * 3
    cuda_devices()  # doctor: every device
    assert asked == [1, 0, 1, 2]


class LogsEveryStep(LightningModule):
    """Logs the step number to the progress bar at every step; each step takes 0.2 s."""

    def __init__(self, clock: FakeClock):
        super().__init__()
        self.clock = clock
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        self.clock.advance(0.2)
        self.log("shown", float(self.global_step + 1), prog_bar=True)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def shows_progress(
    progress: Callback, folder, clock: FakeClock, samples: int, epochs: int
) -> Trainer:
    """A Trainer that shows `progress` as it fits LogsEveryStep on `samples` batches of
    one, for `epochs`; returned once fitted."""
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        callbacks=[progress],
        default_root_dir=folder,
        logger=CSVLogger(folder),
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(LogsEveryStep(clock), DataLoader(TensorDataset(torch.ones(samples, 2))))
    return trainer


def test_the_bar_redraws_every_interval_and_at_the_last_batch(tmp_path, monkeypatch):
    clock = FakeClock()
    bar = TQDMBar(interval=0.5)
    bar.clock = clock
    drawn = []
    read = TQDMProgressBar.on_train_batch_end

    def counted(self, trainer, pl_module, outputs, batch, batch_idx):
        drawn.append(batch_idx + 1)
        return read(self, trainer, pl_module, outputs, batch, batch_idx)

    monkeypatch.setattr(TQDMProgressBar, "on_train_batch_end", counted)
    trainer = shows_progress(bar, tmp_path, clock, samples=8, epochs=1)
    # Steps end at 0.2, 0.4, ... s: drawn at the first, then every 0.6 s, and at the last.
    assert drawn == [1, 4, 7, 8]
    assert bar.train_progress_bar.n == 8
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert shown["shown"] == 8.0 and "v_num" not in shown  # the logger's version is not shown


def test_the_cli_uses_the_bar_in_a_terminal_and_leaves_it_out_when_disabled(workdir, monkeypatch):
    cli = main(["--trainer.logger=false"], run=False)  # no terminal here: a line an epoch
    assert type(cli.trainer.progress_bar_callback) is EpochLines
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal
    cli = main(["--trainer.logger=false"], run=False)
    assert type(cli.trainer.progress_bar_callback) is TQDMBar
    cli = main(["--trainer.logger=false", "--trainer.enable_progress_bar=false"], run=False)
    assert cli.trainer.progress_bar_callback is None


def test_a_log_file_gets_a_line_an_epoch_instead_of_a_bar(tmp_path, capsys):
    """Where stdout is no terminal (a file, a pipe, a job's log), no bar redraws: one
    line an epoch, with the metrics a bar would show, and one as a long epoch goes."""
    clock = FakeClock()
    progress = EpochLines(interval=0.5)
    progress.clock = clock
    shows_progress(progress, tmp_path, clock, samples=3, epochs=2)
    lines = capsys.readouterr().err.splitlines()
    # Each step takes 0.2 s of the clock: a line within the epoch once 0.5 s passed.
    assert [line for line in lines if line.startswith("Epoch")] == [
        "Epoch 0, batch 3/3: shown 3",
        "Epoch 0: shown 3",
        "Epoch 1, batch 3/3: shown 6",
        "Epoch 1: shown 6",
    ]


class Counts(Callback):
    def __init__(self):
        self.calls = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.calls.append(("end", type(self).__name__))

    def state_dict(self):
        return {"calls": len(self.calls)}

    def load_state_dict(self, state_dict):
        self.calls = [None] * state_dict["calls"]


class AlsoStarts(Counts):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.calls.append(("start", type(self).__name__))


def test_the_kits_callbacks_cost_a_hook_only_where_a_part_defines_it():
    first, second, quiet = Counts(), AlsoStarts(), EnvironmentReport()
    kit = KitCallbacks([first, second, quiet])
    # One part: its own method; none: the base class's empty one; several: in order.
    assert kit.on_train_batch_start == second.on_train_batch_start
    assert type(kit).on_before_backward is Callback.on_before_backward
    assert "on_before_backward" not in vars(kit)
    kit.on_train_batch_end(None, None, None, None, 0)
    assert first.calls == [("end", "Counts")] and second.calls == [("end", "AlsoStarts")]
    # Each part's state under its own name, back to each part.
    state = kit.state_dict()
    assert state == {"Counts": dict(calls=1), "AlsoStarts": dict(calls=1)}
    again = [Counts(), AlsoStarts()]
    KitCallbacks(again).load_state_dict(state)
    assert [len(part.calls) for part in again] == [1, 1]
    assert find_callback(SimpleNamespace(callbacks=[kit]), AlsoStarts) is second


def listed(value) -> list:
    """One callback or several, as a list."""
    return [] if value is None else list(value) if isinstance(value, list | tuple) else [value]


def test_the_cli_trainer_calls_three_callbacks_a_step_and_profiles_nothing(workdir):
    """Lightning calls every hook of every callback, about six a step: the kit's own are one."""
    cli = main(["fit", "--trainer.logger=false", "--trainer.fast_dev_run=true"])
    names = [type(callback).__name__ for callback in cli.trainer.callbacks]
    kits = ("KitCallbacks", "EpochLines", "BestAndLast")  # no terminal here: no bar
    assert [name for name in names if name in kits] == list(kits)
    # Any other is the project's own: from its configs, or its module's configure_callbacks.
    theirs = [*configured().trainer.callbacks, *listed(cli.model.configure_callbacks())]
    kit = f"{PROJECT.package}.kit."
    assert Counter(n for n in names if n not in kits) == Counter(
        type(c).__name__ for c in theirs if not type(c).__module__.startswith(kit)
    )
    for kind in (EnvironmentReport, FailureContext, TrainLoss, TrainingHealth, Summary):
        assert find_callback(cli.trainer, kind) is not None, kind
    assert type(cli.trainer.profiler) is NoProfiler
    with cli.trainer.profiler.profile("a hook"):
        pass
    cli = main(["--trainer.logger=false", "--trainer.profiler=simple"], run=False)
    assert type(cli.trainer.profiler) is SimpleProfiler


def test_step_and_time_triggers_save_beside_the_epochs_saves():
    """Lightning's ModelCheckpoint stops saving at epochs' ends once a step or time
    trigger is set; the kit's saves `last` at those and still at every epoch's end."""
    assert BestAndLast().every_n_epochs == 1
    assert BestAndLast(every_n_train_steps=5).every_n_epochs == 1
    assert BestAndLast(train_time_interval=timedelta(minutes=9)).every_n_epochs == 1
    assert BestAndLast(every_n_train_steps=5, every_n_epochs=2).every_n_epochs == 2
    assert BestAndLast(every_n_epochs=0).every_n_epochs == 0  # as Lightning's, when asked
