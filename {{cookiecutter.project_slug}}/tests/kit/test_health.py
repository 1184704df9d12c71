"""The training-health report: numbers that add up, and warnings when they should.

Kit test. Time is a fake clock that the data and the step advance by set amounts,
so a "slow dataset" is slow by construction and every number is exact. The ranks of
a DDP job are fitted one after another, each on its own clock, and a fake gather
hands the last one every rank's figures; one real two-process run slows one rank's
loader.
"""

import logging
import re
import warnings

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from support import DDP, INSTRUMENTS, FakeClock, batches_trained, main, quiet_trainer, run_cli
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.kit.callbacks import find_callback
from {{ cookiecutter.package_name }}.kit.console import TrainLoss
from {{ cookiecutter.package_name }}.kit.health import (
    TrainingHealth,
    batch_length,
    batchnorm_advice,
    slow_rank,
)

BATCH, BATCHES, STEP_SECONDS = 8, 12, 0.05


class Timed(Dataset):
    """Each item costs `seconds` of the clock of the process that reads it."""

    def __init__(self, clock: FakeClock, seconds: float):
        self.clock, self.seconds = clock, seconds

    def __len__(self):
        return BATCH * BATCHES

    def __getitem__(self, index):
        self.clock.advance(self.seconds)
        return torch.ones(4), index % 2


class TimedModel(LightningModule):
    """Each training step costs STEP_SECONDS of the clock."""

    def __init__(self, clock: FakeClock):
        super().__init__()
        self.clock = clock
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_SECONDS)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_on_the_clock(model, clock, callbacks, seconds_per_item=0.0, num_workers=0, **flags):
    """Fit `model` on BATCHES batches of items that each cost `seconds_per_item` of
    `clock`, with `callbacks` and nothing else (no logger, checkpoints, bar or summary)
    unless `flags` for the Trainer say so; the Trainer."""
    trainer = quiet_trainer(callbacks=callbacks, **({"max_epochs": 1} | flags))
    loader = DataLoader(Timed(clock, seconds_per_item), batch_size=BATCH, num_workers=num_workers)
    trainer.fit(model, loader)
    return trainer


def fit_with_health(
    seconds_per_item: float, data_wait_warn: float = 0.3, num_workers: int = 0
) -> tuple[TrainingHealth, list[str]]:
    """One epoch of BATCHES steps; every batch the loop fetches is one it trains on."""
    clock = FakeClock()
    health = TrainingHealth(data_wait_warn=data_wait_warn)
    health.clock = clock
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_on_the_clock(TimedModel(clock), clock, [health], seconds_per_item, num_workers)
    return health, [str(w.message) for w in caught]


def test_slow_data_triggers_the_data_wait_warning_with_exact_numbers():
    health, messages = fit_with_health(seconds_per_item=0.01)  # 8 x 10 ms a batch
    wait, compute = BATCHES * BATCH * 0.01, BATCHES * STEP_SECONDS
    summary = health.summary
    assert summary["batches"] == BATCHES
    assert summary["data_wait_share"] == pytest.approx(wait / (wait + compute), abs=1e-3)
    assert summary["samples_per_s"] == pytest.approx(BATCHES * BATCH / (wait + compute), rel=1e-3)
    (warning,) = [m for m in messages if "waited for data" in m]
    assert "waited for data 62% of the step time (threshold 30%)" in warning
    assert "1. more loader workers (--data.num_workers, now 0)" in warning
    assert warning.index("workers") < warning.index("__getitem__") < warning.index("pinned")
    assert "precompute" in warning


def test_fast_data_does_not_warn_and_the_numbers_add_up():
    health, messages = fit_with_health(seconds_per_item=0.0)
    summary = health.summary
    assert not any("waited for data" in m for m in messages)
    assert summary["data_wait_share"] == 0.0
    assert summary["samples_per_s"] == pytest.approx(BATCH / STEP_SECONDS)
    assert summary["effective_batch_size"] == BATCH
    assert summary["peak_memory_mib"] is None  # only measured on CUDA


def test_loader_workers_take_the_data_wait_off_the_training_process():
    # Workers read items in their own processes, on their own copies of the clock:
    # the training process no longer waits for them.
    health, messages = fit_with_health(seconds_per_item=0.01, num_workers=2)
    assert health.summary["data_wait_share"] == 0.0
    assert not any("waited for data" in m for m in messages)


def test_report_is_printed_at_fit_end(workdir, caplog):
    flags = ["--trainer.max_steps=3", "--trainer.enable_progress_bar=false"]
    with caplog.at_level(logging.INFO):
        cli = main(["fit", *flags, "--checkpoint.every_n_train_steps=1"])
    line = next(r.message for r in caplog.records if r.message.startswith("Training health"))
    assert "samples/s | data wait" in line and "| effective batch " in line
    # What saving (after every optimizer step, then at the end) cost the steps.
    saves = re.search(
        r"\| (\d+) checkpoints written in the background, the steps waiting \d+\.\d\d s to"
        r" copy them to host memory and \d+\.\d\d s for a write still in flight \|",
        line,
    )
    assert saves and int(saves.group(1)) > batches_trained(cli.trainer), line  # and at the end
    # Batches, and the optimizer steps they took where those differ (several optimizers).
    batches, steps = batches_trained(cli.trainer), cli.trainer.global_step
    counted = f"| {batches} batches" + (f", {steps} optimizer steps" if steps != batches else "")
    assert line.endswith(counted) and batches >= 2


def test_batch_length_of_common_batch_shapes():
    assert batch_length(torch.zeros(5, 3)) == 5
    assert batch_length((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_length({"x": torch.zeros(4, 1)}) == 4
    assert batch_length(None) == 0


def test_batchnorm_advice():
    with_bn = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    without = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert batchnorm_advice(without, world_size=8, accumulate=4, micro_batch=16) is None
    assert batchnorm_advice(with_bn, world_size=1, accumulate=1, micro_batch=16) is None
    assert "--trainer.sync_batchnorm true" in batchnorm_advice(with_bn, 4, 1, 16)
    # Off CUDA there is no SyncBatchNorm to offer.
    assert batchnorm_advice(with_bn, 4, 1, 16, on_cuda=False) is None
    assert "micro-batch of 16 samples" in batchnorm_advice(with_bn, 1, 4, 16)
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(with_bn)
    assert batchnorm_advice(synced, world_size=4, accumulate=1, micro_batch=16) is None
    # A frozen backbone's BatchNorm in eval mode normalises by its running statistics.
    with_bn[1].eval()
    assert batchnorm_advice(with_bn, world_size=1, accumulate=4, micro_batch=16) is None


def test_accumulating_a_batchnorm_model_warns_once():
    class WithBatchNorm(TimedModel):
        def __init__(self, clock):
            super().__init__(clock)
            self.layer = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))

    clock = FakeClock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_on_the_clock(
            WithBatchNorm(clock), clock, [TrainingHealth()], max_steps=2, accumulate_grad_batches=4
        )
    advice = [str(w.message) for w in caught if "BatchNorm with accumulate" in str(w.message)]
    assert len(advice) == 1 and f"micro-batch of {BATCH} samples" in advice[0]

    class FrozenBatchNorm(WithBatchNorm):  # a fine-tune keeps it in eval mode
        def on_train_epoch_start(self) -> None:
            for module in self.modules():
                if isinstance(module, torch.nn.BatchNorm1d):
                    module.eval()

    clock = FakeClock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frozen = FrozenBatchNorm(clock)
        fit_on_the_clock(frozen, clock, [TrainingHealth()], max_steps=2, accumulate_grad_batches=4)
    assert not [w for w in caught if "BatchNorm with accumulate" in str(w.message)]


def test_flops_are_counted_on_the_first_step_and_give_flop_per_second(workdir, monkeypatch):
    cli = main(
        ["fit", "--trainer.max_steps=3", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    )
    health = find_callback(cli.trainer, TrainingHealth)
    summary = health.summary
    assert summary["flops_per_batch"] and summary["flops_per_batch"] > 0
    # Timed over every step (batch) but the first, which counted the FLOPs.
    timed = batches_trained(cli.trainer) - 1
    assert health.timed_steps == timed > 0
    assert summary["flops_per_s"] == pytest.approx(
        summary["flops_per_batch"] * timed / health.compute, rel=1e-6
    )
    assert summary["mfu"] is None or torch.cuda.is_available()  # a CPU has no known peak


def test_mfu_is_achieved_over_the_device_peak_for_the_precision(monkeypatch):
    from {{ cookiecutter.package_name }}.kit import health as module

    assert module.compute_dtype("bf16-mixed") is torch.bfloat16
    assert module.compute_dtype("16-mixed") is torch.float16
    assert module.compute_dtype("32-true") is torch.float32
    assert module.peak_flops(torch.device("cpu"), "32-true") is None
    monkeypatch.setattr(module, "peak_flops", lambda device, precision: 4e9)
    health = TrainingHealth()
    health.flops_per_batch, health.steps, health.timed_steps, health.compute = 10**9, 4, 4, 2.0
    health.samples, health.wait = 32, 0.5
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    facts = health.measure(trainer, LightningModule())
    assert facts["flops_per_s"] == 2e9 and facts["mfu"] == 0.5 and facts["peak_flops"] == 4e9


class FakeGPU:
    """A device that runs each step's work after the host has queued it, as CUDA does:
    the host only queues, and runs ahead until it reads something back."""

    def __init__(self, clock: FakeClock):
        self.clock, self.busy_until = clock, 0.0

    def run(self, seconds: float) -> None:
        self.busy_until = max(self.clock.now, self.busy_until) + seconds

    def event(self) -> "FakeEvent":
        return FakeEvent(self)


class FakeEvent:
    """torch.cuda.Event's timing calls, on the fake device's timeline."""

    def __init__(self, gpu: FakeGPU):
        self.gpu, self.at = gpu, None

    def record(self) -> None:
        self.at = max(self.gpu.clock.now, self.gpu.busy_until)  # when the device reaches it

    def query(self) -> bool:
        return self.gpu.clock.now >= self.at

    def synchronize(self) -> None:
        self.gpu.clock.now = max(self.gpu.clock.now, self.at)

    def elapsed_time(self, other: "FakeEvent") -> float:
        return 1000 * (other.at - self.at)


class QueuesWork(TimedModel):
    """Each training step queues `seconds` of work on the fake GPU and returns at once."""

    def __init__(self, clock: FakeClock, gpu: FakeGPU, seconds: float):
        super().__init__(clock)
        self.gpu, self.seconds = gpu, seconds

    def training_step(self, batch, batch_idx):
        self.gpu.run(self.seconds)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)


@pytest.mark.parametrize(
    ("step", "item", "share"),
    [
        # Compute-bound: the device is never idle, though the host spends all its time
        # between steps fetching data (its clock would say 100%).
        (0.05, 0.001, 0.0),
        # Data-bound: the device idles 40 ms of every 50 waiting for the next batch.
        (0.01, 0.05 / BATCH, 0.04 / 0.05),
    ],
)
def test_on_cuda_data_wait_is_the_devices_idle_time_read_off_events(step, item, share):
    clock = FakeClock()
    gpu = FakeGPU(clock)
    health = TrainingHealth()
    health.clock, health.events, health.event = clock, True, gpu.event
    fit_on_the_clock(QueuesWork(clock, gpu, step), clock, [health], item)
    summary = health.summary
    assert summary["clock"] == "device" and summary["batches"] == BATCHES
    # Every step but the first (which counts the FLOPs) is timed.
    assert health.timed_steps == BATCHES - 1
    assert health.compute == pytest.approx((BATCHES - 1) * step)
    assert summary["data_wait_share"] == pytest.approx(share, abs=1e-3)


class DDPRank(TimedModel):
    """One rank of a DDP job: `forward` seconds to its loss, then, in the backward's
    gradient all-reduce, `waits` seconds for the last rank to arrive."""

    def __init__(self, clock: FakeClock, forward: float, waits: float):
        super().__init__(clock)
        self.forward_seconds, self.waits = forward, waits

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.forward_seconds)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def on_after_backward(self):
        self.clock.advance(self.waits)


class FakeGather:
    """all_gather over ranks fitted one after another: the last gets every rank's tensor."""

    def __init__(self, world: int):
        self.world, self.tensors = world, []

    def __call__(self, module, tensor):
        self.tensors.append(tensor)
        return torch.stack(self.tensors) if len(self.tensors) == self.world else tensor


def fit_ranks(caplog, *ranks: tuple[float, float]) -> tuple[TrainingHealth, list[str], str]:
    """A DDP job whose rank r waits ranks[r][0] seconds for each batch and computes its
    forward in ranks[r][1]: the last rank's health, its warnings and its per-rank lines."""
    last = max(wait + forward for wait, forward in ranks)  # all leave the sync together
    gather = FakeGather(len(ranks))
    for wait, forward in ranks:
        clock = FakeClock()
        health = TrainingHealth()
        health.clock, health.gather = clock, gather
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            model = DDPRank(clock, forward, last - wait - forward)
            fit_on_the_clock(model, clock, [health], wait / BATCH)
    lines = [r.message for r in caplog.records if r.message.startswith("Training health per")]
    return health, [str(w.message) for w in caught], "\n".join(lines)


def test_every_rank_is_a_line_and_a_slow_loader_is_named(caplog):
    health, messages, lines = fit_ranks(caplog, (0.0, 0.02), (0.05, 0.02))
    sync = "to reach the gradient sync (data wait + forward)"
    assert lines.splitlines() == [
        "Training health per rank, ms a step:",
        f"  rank 0: step 70.0, data wait 0.0, {sync} 20.0",
        f"  rank 1: step 20.0, data wait 50.0, {sync} 70.0",
    ]
    assert [r["sync_ms"] for r in health.summary["ranks"]] == [20.0, 70.0]
    assert health.summary["slow_rank"]["cause"] == "data"
    (named,) = [m for m in messages if m.startswith("rank ")]
    assert named == (
        "rank 1 is 3.5x slower than the median to reach each step's gradient sync: it waits "
        "50 ms a step for data (the median rank 0 ms): its loader (more --data.num_workers, "
        "data on a local disk)"
    )


def test_a_rank_slow_to_compute_is_named_and_one_within_20_percent_is_not(caplog):
    health, messages, _ = fit_ranks(caplog, (0.0, 0.02), (0.0, 0.03), (0.0, 0.02))
    assert health.summary["slow_rank"]["cause"] == "compute"
    (named,) = [m for m in messages if m.startswith("rank ")]
    assert named.startswith(
        "rank 1 is 1.5x slower than the median to reach each step's gradient sync: its "
        "forward takes 30 ms a step (the median rank 20 ms): its compute ("
    )
    # Rank 1 15% slower to reach the sync (23 ms against 20), 2 ms of it data wait: 9% of
    # a step. No rank is named.
    health, messages, lines = fit_ranks(caplog, (0.0, 0.02), (0.002, 0.021))
    assert len(lines.splitlines()) == 3 and health.summary["slow_rank"] is None
    assert not [m for m in messages if m.startswith("rank ")]


def test_one_process_has_its_figures_and_no_line_per_rank(caplog):
    with caplog.at_level(logging.INFO):
        health, _ = fit_with_health(seconds_per_item=0.01)
    assert health.summary["ranks"] == [
        {"rank": 0, "step_ms": 50.0, "data_wait_ms": 80.0, "forward_ms": 50.0, "sync_ms": 130.0}
    ]
    assert health.summary["slow_rank"] is None and "per rank" not in caplog.text


def test_where_the_forward_has_collectives_only_the_data_wait_names_a_rank(caplog, monkeypatch):
    # A slow loader on rank 1 of two under DDP with BatchNorm: the forward broadcasts the
    # buffers from rank 0, which waits there for rank 1. Both arrive together.
    ddp = [
        {"rank": 0, "step_ms": 59.4, "data_wait_ms": 0.8, "forward_ms": 54.0, "sync_ms": 54.8},
        {"rank": 1, "step_ms": 8.9, "data_wait_ms": 51.4, "forward_ms": 3.8, "sync_ms": 55.2},
    ]
    for sharded in (False, True):  # FSDP: its forward all-gathers, whatever the data
        found = slow_rank(ddp, sharded)
        assert found is not None and found["message"] == (
            "rank 1 holds up each step's gradient sync by 84% of a step: it waits 51 ms a step "
            "for data (the median rank 1 ms): its loader (more --data.num_workers, data on a "
            "local disk)"
        )
    # A rank slow to compute under FSDP: the others wait in their forward. Nothing tells.
    fsdp = [
        {"rank": 0, "step_ms": 50.0, "data_wait_ms": 1.0, "forward_ms": 40.0, "sync_ms": 41.0},
        {"rank": 1, "step_ms": 50.0, "data_wait_ms": 1.0, "forward_ms": 40.0, "sync_ms": 41.0},
    ]
    assert slow_rank(fsdp, sharded=True) is None

    from {{ cookiecutter.package_name }}.kit import health as module

    monkeypatch.setattr(module, "SHARDED", object)  # every strategy shards, as FSDP does
    _, messages, lines = fit_ranks(caplog, (0.0, 0.02), (0.05, 0.02))
    assert lines.splitlines()[1:] == [
        "  rank 0: step 70.0, data wait 0.0",
        "  rank 1: step 20.0, data wait 50.0",
    ]
    (named,) = [m for m in messages if m.startswith("rank ")]
    assert named.startswith("rank 1 holds up each step's gradient sync by 71% of a step: it ")


@pytest.mark.slow
def test_ddp_names_the_rank_whose_loader_is_slow(workdir):
    slow = {"INSTRUMENTS_SLOW_LOADER_RANK": "1", "INSTRUMENTS_SLOW_LOADER_SECONDS": "0.05"}
    flags = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=24", "--data.batch_size=4"]
    flags += ["--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false"]
    ran = run_cli("fit", *DDP, INSTRUMENTS, *flags, "--trainer.logger=false", cwd=workdir, env=slow)
    each = r"^  rank (\d): step [\d.]+, data wait [\d.]+, to reach the gradient sync .* [\d.]+$"
    assert re.findall(each, ran.stderr, re.MULTILINE) == ["0", "1"], ran.stderr
    # Rank 1's batches come late inside its loader: data wait, not step time.
    (named,) = [line for line in ran.stderr.splitlines() if "its loader (" in line]
    assert re.search(r"rank 1 .*: it waits \d+ ms a step for data \(the median rank", named)


def test_the_model_summary_shows_no_flops_column_of_zeros(workdir, caplog):
    with caplog.at_level(logging.INFO):
        main(["fit", "--trainer.fast_dev_run=true", "--trainer.logger=false"])
    (table,) = [r.message for r in caplog.records if "Trainable params" in r.message]
    assert "Params" in table and "FLOPs" not in table and "Flops" not in table
    assert "FLOP per training step" in caplog.text  # counted by the health report
    assert "Skipping setting a default" not in caplog.text  # Lightning adds no summary of its own


class FixedLosses(TimedModel):
    """Training losses 1, 2, 3, ... (plus 0 times the real loss, for the gradient)."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * 0 + float(self.global_step + 1)


class LogsItsOwn(FixedLosses):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss * 100)
        return loss


def fit_logging_train_loss(tmp_path, model, **trainer_flags) -> tuple[TrainLoss, list[dict]]:
    """A fit with the kit's train loss and Lightning's CSV logger; the logged rows."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    train_loss, clock = TrainLoss(), FakeClock()
    logger = CSVLogger(tmp_path, name="", version="")
    fit_on_the_clock(model(clock), clock, [train_loss], logger=logger, **trainer_flags)
    if not (tmp_path / "metrics.csv").exists():
        return train_loss, []
    with open(tmp_path / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("train/loss")]
    return train_loss, rows


@pytest.mark.parametrize(
    ("model", "expected"), [(FixedLosses, [2.0, 5.0]), (LogsItsOwn, [300.0, 600.0])]
)
def test_train_loss_is_the_mean_of_each_logging_window(tmp_path, model, expected):
    _, rows = fit_logging_train_loss(tmp_path, model, max_steps=6, log_every_n_steps=3)
    # Windows of 3 steps: losses 1, 2, 3 then 4, 5, 6 (a module's own value wins).
    assert [float(row["train/loss"]) for row in rows] == expected
    assert [row["epoch"] for row in rows] == ["0", "0"]


def test_train_loss_under_accumulation_is_the_loss_not_a_share_of_it(tmp_path):
    # Two micro-batches a step, each with the step's loss (1, 1, 2, 2, ...); Lightning
    # hands over each divided by 2. Windows of two optimizer steps: four micro-batches.
    _, rows = fit_logging_train_loss(
        tmp_path, FixedLosses, max_steps=4, accumulate_grad_batches=2, log_every_n_steps=2
    )
    assert [(row["step"], float(row["train/loss"])) for row in rows] == [("1", 1.5), ("3", 3.5)]


class Kept(Callback):
    """After each step, how many tensors the train loss keeps."""

    def __init__(self, train_loss: TrainLoss):
        self.train_loss, self.kept = train_loss, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.kept.append(len(self.train_loss._losses))


def test_a_long_window_keeps_few_tensors_and_no_logging_keeps_none(tmp_path, monkeypatch):
    monkeypatch.setattr(TrainLoss, "FOLD", 4)  # summed into one every 4 losses
    for every, expected in ((10, [5.5]), (0, [])):  # the mean of 1..10; no logging at all
        train_loss = TrainLoss()
        kept = Kept(train_loss)
        clock = FakeClock()
        trainer = fit_on_the_clock(
            FixedLosses(clock), clock, [train_loss, kept], max_steps=10, log_every_n_steps=every
        )
        logged = trainer.callback_metrics.get("train/loss")
        assert ([] if logged is None else [float(logged)]) == expected
        assert max(kept.kept) <= (4 if every else 0)


class Recorder(Logger):
    """A logger that notes each metric it receives, with the clock's time then."""

    def __init__(self, clock: FakeClock):
        super().__init__()
        self.clock, self.received = clock, []

    @property
    def name(self):
        return "recorder"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.received += [(self.clock.now, name, step) for name in metrics]


class SecondSteps(FixedLosses):
    def training_step(self, batch, batch_idx):
        self.clock.advance(1.0 - STEP_SECONDS)  # with the parent's: one second a step
        return super().training_step(batch, batch_idx)


def test_train_loss_reaches_the_loggers_in_groups_at_its_own_steps(tmp_path):
    from {{ cookiecutter.package_name }}.kit.console import TrainLoss

    clock = FakeClock()
    train_loss = TrainLoss(write_every=10.0)
    train_loss.clock = clock
    recorder = Recorder(clock)
    trainer = fit_on_the_clock(
        SecondSteps(clock),
        clock,
        [train_loss],
        logger=recorder,
        log_every_n_steps=2,
        default_root_dir=tmp_path,
    )
    written = [(at, step) for at, name, step in recorder.received if name == "train/loss"]
    # Windows end after steps 2, 4, ..., 12 (at 2 s, 4 s, ...): the first is written at
    # once, the next five together 10 s later, each at its own step (Lightning's x-axis).
    assert written == [(2.0, 1)] + [(12.0, step) for step in (3, 5, 7, 9, 11)]
    assert float(trainer.callback_metrics["train/loss"]) == 11.5  # the last window's mean
