"""A resumed run is the same run: stopped by SIGTERM, Ctrl-C or SIGKILL, mid-epoch or at
its end, with or without workers, on one process or two, then `fit --ckpt_path last`,
it ends with the weights, optimizer and scheduler states and logged scores of an
uninterrupted run, bit for bit (CPU, `seed_everything`). So does a model that draws
from every random state at every step, and one scheduled over the estimated steps.

Kit test: it runs whatever model and data `project.py` names, for two epochs; the
stop lands half-way through the second.
"""

import dataclasses
import functools
import random
import shutil
import signal
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from instruments import read_records
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import BaseFinetuning
from lightning.pytorch.utilities.exceptions import SIGTERMException
from support import (
    DDP,
    FLAGS,
    INSTRUMENTS,
    NO_DROPOUT,
    PROJECT,
    assert_float_close,
    assert_identical,
    batches_of,
    configured,
    fit_to_end,
    folder_of,
    fork_cli,
    load_checkpoint,
    loader_of,
    logged_scalars,
    optimizes_by_hand,
    reference,
    run_dirs,
    run_forked,
    schedule_ended,
    wait_for,
)
from support.processes import (
    children_until_it_ends,
    killed_together,
    still_alive,
)
from torch.utils.data import IterableDataset

from {{ cookiecutter.package_name }}.kit import cli
from {{ cookiecutter.package_name }}.kit.data import ResumableLoader, SplitDataModule
from {{ cookiecutter.package_name }}.kit.internals import request_stop
from {{ cookiecutter.package_name }}.kit.resume import (
    ResumeState,
    orders_of,
    per_process,
    same_samples,
    saved_state,
    set_frozen,
)

MONITOR = PROJECT.monitor


def final(folder):
    (run_dir,) = run_dirs(folder)
    return run_dir, load_checkpoint(run_dir / "checkpoints" / "last.ckpt")


def assert_same_run(folder, uninterrupted) -> None:
    """The run in `folder` ended where the uninterrupted one did, bit for bit."""
    (run_dir, ours), (their_dir, theirs) = final(folder), final(uninterrupted)
    assert (ours["epoch"], ours["global_step"]) == (theirs["epoch"], theirs["global_step"])
    largest = max(
        float((ours["state_dict"][k].double() - theirs["state_dict"][k].double()).abs().max())
        for k in theirs["state_dict"]
        if theirs["state_dict"][k].is_floating_point()
    )
    assert largest == 0.0, f"max |dw| = {largest}"
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_identical(ours[key], theirs[key], key)
    assert logged_scalars(run_dir)[MONITOR] == logged_scalars(their_dir)[MONITOR]


def steps_per_epoch(uninterrupted) -> int:
    """The training batches of an epoch (the instruments' steps)."""
    _, theirs = final(uninterrupted)
    return batches_of(theirs) // (theirs["epoch"] + 1)


def stop_mid_epoch(workdir, uninterrupted, sent: int, *flags: str) -> None:
    """Stop a fit half-way through its second epoch with signal `sent`."""
    step = steps_per_epoch(uninterrupted) * 3 // 2
    marker = workdir / "paused"
    env = {"INSTRUMENTS_PAUSE_STEP": str(step), "INSTRUMENTS_PAUSE_MARKER": str(marker)}
    stopped = fork_cli("fit", *FLAGS, *flags, INSTRUMENTS, cwd=workdir, env=env)
    wait_for(marker, stopped)
    stopped.send_signal(sent)
    assert stopped.wait() == (143 if sent == signal.SIGTERM else 1)
    (run_dir,) = run_dirs(workdir)
    saved = load_checkpoint(run_dir / "checkpoints" / "interrupted.ckpt")
    assert step <= batches_of(saved) <= step + 1  # between two steps, mid-epoch


@pytest.fixture
def uninterrupted(request, tmp_path_factory):
    return reference(request, tmp_path_factory)


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_by_ctrl_c_resumes_exactly(workdir, uninterrupted):
    stop_mid_epoch(workdir, uninterrupted, signal.SIGINT)
    resumed = run_forked("fit", "--ckpt_path=last", *FLAGS, cwd=workdir)
    assert "resume:" not in resumed.stderr  # nothing to say: it is exact
    assert_same_run(workdir, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sent", "workers"),
    [(signal.SIGTERM, 0), (signal.SIGKILL, 2)],  # SIGKILL, no workers: the killed-run test
    ids=["SIGTERM-no workers", "SIGKILL-2 workers"],
)
def test_with_any_loader_workers_a_run_stopped_mid_epoch_resumes_exactly(
    workdir, uninterrupted, sent, workers
):
    """Random augmentation in a dataset's __getitem__ included (its draws are the sample's
    and the epoch's), however many workers read it; a SIGKILLed run's workers end with it.
    (A stream's order is its workers': it is read by as many as the uninterrupted run's.)"""
    flags = (f"--data.num_workers={workers}",)
    if isinstance(loader_of(configured(), "train").dataset, IterableDataset):
        flags = ()
    if not issubclass(PROJECT.datamodule, SplitDataModule):  # its own loaders, as they are
        if workers:
            pytest.skip("the DataModule is not a SplitDataModule: no --data.num_workers")
        flags = ()
    if sent == signal.SIGTERM:
        stop_mid_epoch(workdir, uninterrupted, sent, *flags)
    else:  # after a mid-epoch save, so that the resume starts mid-epoch too
        flags += ("--checkpoint.every_n_train_steps=2",)
        env = {"INSTRUMENTS_KILL_STEP": str(steps_per_epoch(uninterrupted) * 3 // 2 + 1)}
        killed = fork_cli("fit", *FLAGS, *flags, INSTRUMENTS, cwd=workdir, env=env)
        workers_seen = children_until_it_ends(killed)
        assert killed.wait() == -signal.SIGKILL
        assert not still_alive(workers_seen, within=10), "loader workers outlived their run"
    resumed = run_forked("fit", "--ckpt_path=last", *FLAGS, *flags, cwd=workdir)
    assert "resume:" not in resumed.stderr  # nothing to say: it is exact
    assert "not resumable" not in resumed.stderr  # nor Lightning's guess that it is not
    assert_same_run(workdir, uninterrupted)


@pytest.mark.slow
def test_a_killed_run_resumes_exactly_from_its_newest_checkpoint(workdir, uninterrupted):
    """SIGKILLed twice in a row: mid-way through the second epoch; then, resumed at its
    start, one step in. (A run that survives this survives one SIGKILL.)"""
    steps = steps_per_epoch(uninterrupted)
    for attempt, step in enumerate([steps * 3 // 2, steps + 1]):
        args = ["fit", *FLAGS, INSTRUMENTS] + (["--ckpt_path=last"] if attempt else [])
        killed = fork_cli(*args, cwd=workdir, env={"INSTRUMENTS_KILL_STEP": str(step)})
        assert killed.wait() == -signal.SIGKILL
    run_forked("fit", "--ckpt_path=last", *FLAGS, cwd=workdir)
    assert_same_run(workdir, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trigger", "every"),
    [("every_n_train_steps=3", 3), ("train_time_interval=0:00:00.000001", 1)],
    ids=["every 3 steps", "every microsecond"],
)
def test_mid_epoch_checkpoints_lose_at_most_their_interval_and_the_write_in_flight(
    workdir, uninterrupted, trigger, every
):
    steps = steps_per_epoch(uninterrupted)  # in the first epoch, before its validation
    kill = max(every, min(steps // 2 + every, steps - 1))
    env = {"INSTRUMENTS_KILL_STEP": str(kill)}
    if kill < 2 * every:  # an epoch too short for two saves: the one there is, written
        env["INSTRUMENTS_KILL_SETTLED"] = "1"
    flags = (*FLAGS, f"--checkpoint.{trigger}")
    killed = fork_cli("fit", *flags, INSTRUMENTS, cwd=workdir, env=env)
    assert killed.wait() == -signal.SIGKILL
    (run_dir,) = run_dirs(workdir)
    saved = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    # The interval, and the save still being written when it was killed.
    assert kill - 2 * every < batches_of(saved) <= kill
    assert not list((run_dir / "checkpoints").glob("best-*"))  # chosen by validation only
    run_forked("fit", "--ckpt_path=last", *flags, cwd=workdir)
    assert_same_run(workdir, uninterrupted)
    # Every epoch still ends with its best and last, as without mid-epoch saves.
    (best,) = (run_dir / "checkpoints").glob("best-*")
    assert batches_of(load_checkpoint(best)) % steps_per_epoch(uninterrupted) == 0


@pytest.mark.slow
def test_sigterm_during_an_epochs_validation_keeps_that_validation(workdir, uninterrupted):
    marker = workdir / "paused"
    env = {"INSTRUMENTS_PAUSE_VALIDATION": "0", "INSTRUMENTS_PAUSE_MARKER": str(marker)}
    stopped = fork_cli("fit", *FLAGS, INSTRUMENTS, cwd=workdir, env=env)
    wait_for(marker, stopped)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait() == 143
    (run_dir,) = run_dirs(workdir)
    # The epoch's validation ran to its end: its score was logged, best and last saved.
    assert len(logged_scalars(run_dir)[MONITOR]) == 1
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] == 0
    run_forked("fit", "--ckpt_path=last", *FLAGS, cwd=workdir)
    assert_same_run(workdir, uninterrupted)


@pytest.mark.slow
def test_sigterm_during_the_last_validation_ends_the_run_as_finished(workdir, uninterrupted):
    """A stop that comes after the run's last step (in its last validation) has nothing left
    to stop: the run ends as an uninterrupted one, exit 0, nothing saved to resume."""
    marker = workdir / "paused"
    env = {"INSTRUMENTS_PAUSE_VALIDATION": "1", "INSTRUMENTS_PAUSE_MARKER": str(marker)}
    stopped = fork_cli("fit", *FLAGS, INSTRUMENTS, cwd=workdir, env=env)
    wait_for(marker, stopped)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait() == 0
    (run_dir,) = run_dirs(workdir)
    err = stopped.output().stderr
    assert "Stopped:" not in err and "stopped by" not in err
    assert not (run_dir / "checkpoints" / "interrupted.ckpt").exists()
    assert_same_run(workdir, uninterrupted)


ONE_ACCUMULATING = ("--trainer.accumulate_grad_batches=2",)  # 64 x 1 x 2: DDP's 64 x 2 x 1


def samples_by_step(prefix: Path) -> dict[int, Counter]:
    """The samples each optimizer step trained, every rank's and micro-batch's together."""
    steps: dict[int, Counter] = {}
    for record in read_records(prefix, "batch"):
        steps.setdefault(record["step"], Counter()).update(record["samples"])
    return steps


@pytest.mark.slow
@pytest.mark.parametrize(("saved", "resumed"), [(2, 1), (1, 2)], ids=["2 to 1", "1 to 2"])
def test_a_run_resumed_on_another_number_of_processes_trains_the_same_samples(
    workdir, request, tmp_path_factory, saved, resumed
):
    """Stopped mid-epoch on `saved` processes, resumed on `resumed`: every step from the
    resume on trains the samples the uninterrupted run's did (none repeated, none
    skipped), with the global batch kept, and the weights end within float precision
    (on as many as it was saved by: bit for bit)."""
    uninterrupted = reference(request, tmp_path_factory, *(DDP if saved == 2 else ONE_ACCUMULATING))
    batches = steps_per_epoch(uninterrupted)  # each rank's, an epoch
    steps = batches // (3 - saved)  # optimizer steps
    flags = (*FLAGS, INSTRUMENTS, "--checkpoint.every_n_train_steps=1")
    kill = batches * 3 // 2  # mid-way through epoch 2, its newest checkpoint written
    env = {**NO_DROPOUT, "INSTRUMENTS_KILL_STEP": str(kill), "INSTRUMENTS_KILL_SETTLED": "1"}
    if saved == 2:
        killed_together("fit", *flags, *DDP, cwd=workdir, env=env)
{%- if not cookiecutter.cluster %}
        # On as many processes as it was saved by: each rank its own shard, position and
        # random states again, mid-epoch, and the same run bit for bit. (With the cluster
        # files, tests/kit/test_cluster.py holds a torchrun restart and a SLURM requeue to it.)
        same = shutil.copytree(workdir, workdir / "same")
        record = {**NO_DROPOUT, "INSTRUMENTS_RECORD": str(same / "seen")}
        fit_to_end(same, "--ckpt_path=last", *flags, *DDP, ddp=True, env=record)
        starts = {r["rank"]: r["batches"] for r in read_records(same / "seen", "train_start")}
        assert starts[0] == starts[1] and starts[0] % batches
        assert_same_run(same, uninterrupted)
{%- endif %}
    else:
        killed = fork_cli("fit", *flags, *ONE_ACCUMULATING, cwd=workdir, env=env)
        assert killed.wait() == -signal.SIGKILL
    (run_dir,) = run_dirs(workdir)
    kept = saved_state(load_checkpoint(run_dir / "checkpoints" / "last.ckpt"), "ResumeState")
    env = {**NO_DROPOUT, "INSTRUMENTS_SAMPLES": str(workdir / "samples")}
    resumed_flags = ("--ckpt_path=last", *flags, *(DDP if resumed == 2 else ()))
    result = fit_to_end(workdir, *resumed_flags, ddp=resumed == 2, env=env)
    (line, *others) = [line for line in result.stderr.splitlines() if "resume:" in line]
    assert f"saved by {saved} process{'es' * (saved > 1)}, resumed by {resumed}" in line
    assert kept is not None
    total = kept["batch_size"] * kept["world_size"] * kept["accumulate"]
    assert f"global batch was {total}" in line and f"is {total} " in line
    other = same_samples(kept)  # an order that is not the same on any number of processes
    if other is not None:  # says so, with the reason, and trains on
        assert f"train other samples than an uninterrupted run ({other})" in line
        assert final(workdir)[1]["epoch"] == final(uninterrupted)[1]["epoch"]
        return
    assert total == 128 and "same samples" in line
    mine, theirs = samples_by_step(workdir / "samples"), samples_by_step(uninterrupted / "samples")
    first = min(mine)
    assert first % steps, "the resume is mid-epoch"
    assert mine == {step: theirs[step] for step in theirs if step >= first}
    start = first - first % steps
    epoch = [sample for step in range(start, start + steps) for sample in theirs[step]]
    assert len(epoch) == steps * 128 and len(set(epoch)) == len(epoch)  # each sample once
    (_, ours), (_, theirs) = final(workdir), final(uninterrupted)
    assert (ours["epoch"], ours["global_step"]) == (theirs["epoch"], theirs["global_step"])
    assert_float_close(ours["state_dict"], theirs["state_dict"], "state_dict")
    assert_float_close(ours["optimizer_states"], theirs["optimizer_states"], "optimizer")


def test_a_resume_on_another_number_of_processes_keeps_the_global_batch_and_says_so(
    trained_checkpoint, workdir
):
    shutil.copytree(folder_of(trained_checkpoint), workdir, dirs_exist_ok=True)
    (run_dir,) = run_dirs(workdir)
    last = run_dir / "checkpoints" / "last.ckpt"
    state = load_checkpoint(last)
    saved = state["callbacks"]["KitCallbacks"]["ResumeState"]
    saved["world_size"] = 2  # as a DDP run of two processes saved it
    saved["precision"] = "bf16-mixed"  # on a GPU
    size, accumulate = saved["batch_size"], saved["accumulate"]
    torch.save(state, last)
    # The lines come as the resume starts: one batch of the next epoch is enough.
    flags = ("--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1")
    per_device, accumulated = size, 2 * accumulate  # what keeps the global batch on one
    if optimizes_by_hand():  # Lightning accumulates nothing for it: the batch must make it
        per_device, accumulated = 2 * size * accumulate, 1
        refused = run_forked(
            "fit", "--ckpt_path=last", *FLAGS[1:], *flags, cwd=workdir, check=False
        )
        assert refused.returncode == 2
        (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert f"--data.batch_size {per_device} (accumulating 1)" in line
        flags += (f"--data.batch_size={per_device}",)
    ended = schedule_ended(state)  # a schedule built for the run's steps: refused after
    resumed = run_forked(
        "fit",
        "--ckpt_path=last",
        "--trainer.max_epochs=3",
        *FLAGS[1:],
        *flags,
        cwd=workdir,
        check=not ended,
    )
    if ended:
        assert resumed.returncode == 2 and "cannot step past its last" in resumed.stderr
    first, *others, precision = [line for line in resumed.stderr.splitlines() if "resume:" in line]
    assert "saved with precision bf16-mixed, resumed with 32-true" in precision
    assert "saved by 2 processes, resumed by 1" in first
    assert f"is {2 * size * accumulate} ({per_device} x 1 x {accumulated})" in first
    # What draws or keeps numbers of each process's own says so, one line each: the model
    # as trained, with its defaults, which of its layers train as the checkpoint says.
    model = PROJECT.model()
    set_frozen(model, saved.get("frozen", []), saved.get("untracked", []))
    parts = per_process(model)
    assert len(others) == len(parts) and all(p in o for p, o in zip(parts, others, strict=True))
    # A global batch no whole accumulation makes is refused, naming the batches that do.
    # (A batch sampler's global batch counts its batches: one process makes any by itself.)
    if "batches" in orders_of(saved):
        return
    saved["world_size"], saved["batch_size"] = 3, 5
    torch.save(state, last)
    refused = run_forked("fit", "--ckpt_path=last", *FLAGS[1:], *flags, cwd=workdir, check=False)
    assert refused.returncode == 2
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert f"global batches of {15 * accumulate}" in line and "--data.batch_size" in line


def test_which_weights_train_and_which_norms_keep_statistics_come_back_as_saved():
    """A fine-tune unfroze a block (Lightning's BaseFinetuning freezes it again in setup):
    the checkpoint's flags put it back as it trained, the rest as it was."""
    from {{ cookiecutter.package_name }}.kit.resume import frozen, set_frozen, untracked

    def net():
        return torch.nn.Sequential(
            torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)
        )

    trained = net()
    trained[0].requires_grad_(False)
    trained[1].track_running_stats = False
    saved = frozen(trained), untracked(trained)
    assert saved == (["0.weight", "0.bias"], ["1"])
    resumed = net()
    resumed.requires_grad_(False)  # frozen whole again, as a fine-tune's setup does
    set_frozen(resumed, *saved)
    assert [p.requires_grad for p in resumed.parameters()] == [False, False, True, True, True, True]
    assert not resumed[1].track_running_stats


def test_a_resume_half_way_through_an_epoch_runs_your_epoch_start_again(caplog):
    """Lightning calls on_train_epoch_start only at an epoch's start: the module's and
    your callbacks' run again in an epoch resumed half-way (not Lightning's, nor the kit's)."""
    from {{ cookiecutter.package_name }}.kit.resume import replay_epoch_start

    calls = []

    class Module(PROJECT.model):
        def on_train_epoch_start(self):
            calls.append("module")

    class Yours(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            calls.append("callback")

    from lightning.pytorch.callbacks import LearningRateMonitor

    trainer = SimpleNamespace(callbacks=[Yours(), LearningRateMonitor()], current_epoch=3)
    with caplog.at_level("INFO"):
        replay_epoch_start(trainer, Module())
    assert calls == ["module", "callback"]
    assert "Resumed in the middle of epoch 3: ran Module.on_train_epoch_start" in caplog.text


def test_augmentation_left_to_each_process_is_a_resume_that_says_so():
    class Files(torch.utils.data.Dataset):  # read per sample: it may augment
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return torch.tensor([index])

    state = ResumeState()
    state.load_state_dict({"world_size": 1, "random_states": [{}]})
    trainer = SimpleNamespace(
        ckpt_path="last.ckpt",
        world_size=1,
        precision="32-true",
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )
    seeded = ResumableLoader(Files(), batch_size=4)
    assert state.inexact(trainer, [seeded]) == []
    (line,) = state.inexact(trainer, [ResumableLoader(Files(), batch_size=4, seed_samples=False)])
    assert "seed_samples off" in line and "augmentation" in line


class StopAt(Callback):
    """Asks the fit to stop once `step` batches are trained, as a SIGTERM would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.fit_loop.epoch_loop.total_batch_idx + 1 == self.step:
            request_stop(trainer)


class CountsItsSteps(PROJECT.model):
    """The project's model, its optimizer under OneCycleLR over the Trainer's
    `estimated_stepping_batches` (up to the optimizer's own rates): reading the estimate
    sets the training DataLoader up before a checkpoint is restored (Lightning #20550).
    A model with a schedule of its own, that steps its optimizers by hand, or whose
    fine-tuning adds parameter groups as it goes (which OneCycleLR cannot schedule),
    keeps its own, and reads the estimate all the same."""

    def configure_optimizers(self):
        total = self.trainer.estimated_stepping_batches
        configured = super().configure_optimizers()
        adds_groups = any(isinstance(c, BaseFinetuning) for c in self.trainer.callbacks)
        own = not isinstance(configured, torch.optim.Optimizer) or not self.automatic_optimization
        if own or adds_groups:
            return configured
        rates = [group["lr"] for group in configured.param_groups]
        scheduler = torch.optim.lr_scheduler.OneCycleLR(configured, max_lr=rates, total_steps=total)
        return {
            "optimizer": configured,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class DrawsEveryStep(PROJECT.model):
    """The project's model, whose weights are scaled at every step by draws from torch
    (dropout), Python and NumPy: the weights then depend on every random state."""

    def on_train_batch_start(self, batch, batch_idx):
        kept = torch.nn.functional.dropout(torch.ones(()), p=0.5, training=True)
        scale = 1 + 1e-3 * float(kept) * random.random() * float(np.random.rand())
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.mul_(scale)
        return super().on_train_batch_start(batch, batch_idx)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "where"),
    [(CountsItsSteps, "mid-epoch"), (CountsItsSteps, "epoch end"), (DrawsEveryStep, "mid-epoch")],
    ids=["OneCycleLR mid-epoch", "OneCycleLR epoch end", "dropout mid-epoch"],
)
def test_an_in_process_fit_stopped_and_resumed_is_exact(tmp_path, monkeypatch, model, where):
    project = dataclasses.replace(PROJECT, model=model)
    fit = functools.partial(cli.main, project=project)
    (tmp_path / "uninterrupted").mkdir()
    monkeypatch.chdir(tmp_path / "uninterrupted")
    fit(["fit", *FLAGS])
    steps = steps_per_epoch(Path.cwd())
    (tmp_path / "stopped").mkdir()
    monkeypatch.chdir(tmp_path / "stopped")
    stop = steps * 3 // 2 if where == "mid-epoch" else steps
    with pytest.raises(SIGTERMException):
        fit(["fit", *FLAGS], callbacks=[StopAt(stop)])
    fit(["fit", "--ckpt_path=last", *FLAGS])
    assert_same_run(Path.cwd(), tmp_path / "uninterrupted")
