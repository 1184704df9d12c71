"""Checkpoints are written whole or not at all, a damaged one is skipped on resume,
and a full disk is one clear error that loses nothing.

Kit test: it runs whatever model and data `project.py` names.
"""

import copy
import errno
import os
import re
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from support import (
    FakeClock,
    assert_identical,
    fork_cli,
    load_checkpoint,
    main,
    run_dirs,
    run_forked,
)

from {{ cookiecutter.package_name }}.kit import checkpoints
from {{ cookiecutter.package_name }}.kit.checkpoints import (
    BackgroundWriter,
    CheckpointSaveError,
    atomic_save,
    check_checkpoint,
    resume_candidates,
)

INSTRUMENTS = "--trainer.callbacks+=instruments.Instruments"


def partial_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob(f"*{checkpoints.PARTIAL}"))


def test_an_improving_epochs_last_is_a_copy_of_its_best_when_written_in_the_step(
    workdir, monkeypatch
):
    copies = []

    def spy(source, path):
        # The third epoch's copy is refused, as for a best that cannot be read.
        copies.append(Path(path).name)
        return copy(source, path) if len(copies) == 1 else False

    copy = checkpoints.atomic_copy
    monkeypatch.setattr(checkpoints, "atomic_copy", spy)
    # Every epoch is the best (the monitor is the step).
    cli = main(
        [
            "fit",
            "--trainer.max_epochs=3",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false",
            "--checkpoint.monitor=step",
            "--checkpoint.mode=max",
            "--checkpoint.async=false",
        ]
    )
    # The first save of last is its own; the next two try to copy their epoch's best.
    assert copies == ["last.ckpt", "last.ckpt"]
    callback = cli.trainer.checkpoint_callback
    best, last = Path(callback.best_model_path), Path(callback.last_model_path)
    assert best.is_file() and last.name == "last.ckpt"
    assert not os.path.samefile(best, last)  # two files: damage to one spares the other
    checkpoint = load_checkpoint(last)  # the refused copy: saved as usual
    assert checkpoint["global_step"] == cli.trainer.global_step
    # The state it holds is last's own: a resume keeps writing last.ckpt, not last-v1.ckpt.
    (state,) = [s for s in checkpoint["callbacks"].values() if "last_model_path" in s]
    assert Path(state["last_model_path"]).name == "last.ckpt"
    assert not partial_files(last.parent)


def test_a_background_save_waits_only_for_a_copy_and_one_write_at_a_time(tmp_path, monkeypatch):
    released, written = threading.Event(), []

    class Clock(FakeClock):
        armed = False

        def __call__(self) -> float:
            if self.armed:
                released.set()  # the second save has started to wait
            return self.now

    def held_back(state, path, save=None):
        assert released.wait(60)
        clock.advance(5.0)  # the write takes 5 s, whatever the machine's speed
        written.append((Path(path).name, state["weights"].clone()))
        return Path(path)

    monkeypatch.setattr(checkpoints, "atomic_save", held_back)
    writer = BackgroundWriter()
    writer.clock = clock = Clock()
    weights = torch.zeros(4)
    writer.save({"weights": weights, "step": 1}, tmp_path / "a.ckpt")  # returns: held back
    writer.check()  # never waits
    weights += 1  # the next steps train on
    assert written == []
    clock.armed = True
    writer.save({"weights": weights, "step": 2}, tmp_path / "b.ckpt")  # waits for a.ckpt
    assert [name for name, _ in written] == ["a.ckpt"]
    assert torch.equal(written[0][1], torch.zeros(4))  # the state of its own step
    assert writer.wait_seconds == 5.0  # counted for the health report
    writer.close()
    assert [name for name, _ in written] == ["a.ckpt", "b.ckpt"]
    assert torch.equal(written[1][1], torch.ones(4))
    assert writer.saves == 2

    def full_disk(state, path, save=None):
        raise CheckpointSaveError(f"cannot write {Path(path).name}: No space left on device")

    monkeypatch.setattr(checkpoints, "atomic_save", full_disk)
    writer.save({"weights": weights}, tmp_path / "c.ckpt")
    with pytest.raises(CheckpointSaveError, match="cannot write c.ckpt"):
        writer.wait()
    writer.wait()  # raised once


def test_a_copy_reuses_its_host_buffers_and_is_the_states_own():
    """Each save copies into the buffers of the one before (no allocation a save), never
    into the live tensors: a later change to the weights leaves the copy as it was."""
    writer, weights, moments = BackgroundWriter(), torch.randn(3, 4), torch.ones(5)
    state = {"state_dict": {"w": weights}, "optimizer_states": [{"m": moments}], "step": 1}
    first = writer.stage(state)
    assert first["state_dict"]["w"].data_ptr() != weights.data_ptr()
    kept = first["state_dict"]["w"].clone()
    weights.add_(1.0)
    assert torch.equal(first["state_dict"]["w"], kept)
    second = writer.stage({**state, "step": 2})
    assert second["state_dict"]["w"].data_ptr() == first["state_dict"]["w"].data_ptr()
    assert torch.equal(second["state_dict"]["w"], weights) and second["step"] == 2
    assert second["optimizer_states"][0]["m"] is first["optimizer_states"][0]["m"]
    state["state_dict"]["w"] = torch.randn(6)  # another shape: a buffer of its own
    third = writer.stage(state)
    assert third["state_dict"]["w"].shape == (6,)


def test_a_background_save_holds_its_steps_state_while_training_goes_on(workdir, monkeypatch):
    """The first save's write is held back until a later batch has trained, and still
    holds its own step's weights and optimizer state, bit for bit; so does every file,
    written in the order asked for. An epoch's best and last share one copy."""
    holding, trained_on = threading.Event(), threading.Event()
    seen, written, later, staged = {}, [], {}, []
    write, stage = checkpoints.atomic_save, BackgroundWriter.stage

    def held_back(state, path, save=None):
        if not written and not holding.is_set():
            holding.set()
            assert trained_on.wait(120)
        path = write(state, path, save)
        written.append((state["global_step"], path.name.split("-")[0], load_checkpoint(path)))
        return path

    def counted(writer, state):
        staged.append(state["global_step"])
        return stage(writer, state)

    class Record(Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            kept = {key: checkpoint[key] for key in ("state_dict", "optimizer_states")}
            seen.setdefault(trainer.global_step, copy.deepcopy(kept))
            if holding.is_set():
                trained_on.set()  # this save waits for the held one: let it go

        def on_train_batch_end(self, trainer, pl_module, *args):
            if holding.is_set() and not trained_on.is_set():
                later.update(copy.deepcopy(pl_module.state_dict()))
                trained_on.set()

    monkeypatch.setattr(checkpoints, "atomic_save", held_back)
    monkeypatch.setattr(BackgroundWriter, "stage", counted)
    main(
        [
            "fit",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=7",
            "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false",
            "--checkpoint.every_n_train_steps=3",
        ],
        callbacks=[Record()],
    )
    steps = [step for step, _, _ in written]
    assert steps == sorted(steps) and set(steps) == set(seen) == set(staged)
    assert [name for _, name, _ in written][-2:] == ["best", "last.ckpt"]  # the epoch's end
    assert len(staged) < len(written)  # last written from the best's copy
    for step, name, checkpoint in written:
        assert_identical(checkpoint["state_dict"], seen[step]["state_dict"], f"{name} {step}")
        assert_identical(checkpoint["optimizer_states"], seen[step]["optimizer_states"])
    # Training did go on while the first save was held back.
    first = written[0][2]["state_dict"]
    assert later and any(not torch.equal(later[key], first[key]) for key in later)


def test_a_failed_background_write_stops_the_run_and_keeps_the_previous(workdir, monkeypatch):
    write, calls = checkpoints.atomic_save, []

    def fills_up(state, path, save=None):
        calls.append(state["global_step"])
        if len(calls) == 2:
            raise CheckpointSaveError(f"cannot write {Path(path).name}: No space left on device")
        return write(state, path, save)

    monkeypatch.setattr(checkpoints, "atomic_save", fills_up)
    with pytest.raises(CheckpointSaveError, match="cannot write last.ckpt: No space left"):
        main(
            [
                "fit",
                "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=12",
                "--trainer.enable_progress_bar=false",
                "--checkpoint.every_n_train_steps=2",
            ]
        )
    # Stopped at the step after, or at the save after it at the latest.
    assert calls == [2, 4]
    (run,) = run_dirs(workdir)
    last = run / "checkpoints" / "last.ckpt"
    assert load_checkpoint(check_checkpoint(last))["global_step"] == 2


def test_a_logger_that_uploads_each_checkpoint_as_saved_has_them_written_in_the_step():
    from jsonargparse import Namespace

    from {{ cookiecutter.package_name }}.kit.runs import uploads_each_checkpoint

    def logger(**init_args):
        return Namespace(class_path="lightning.pytorch.loggers.WandbLogger", init_args=init_args)

    assert uploads_each_checkpoint(logger(log_model="all"))
    assert uploads_each_checkpoint([logger(project="p"), logger(log_model="all")])
    assert not uploads_each_checkpoint(logger(log_model=True))  # at the end: all written
    assert not uploads_each_checkpoint(True) and not uploads_each_checkpoint(None)


def test_a_copy_is_whole_or_nothing(tmp_path, monkeypatch):
    source, target = tmp_path / "best.ckpt", tmp_path / "last.ckpt"
    source.write_bytes(os.urandom(3 << 20))  # several reads
    assert checkpoints.atomic_copy(source, target)
    assert target.read_bytes() == source.read_bytes()
    assert not os.path.samefile(source, target)
    target.write_bytes(b"before")

    class FailsHalfway:
        def __init__(self, *args):
            self.reads = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, size):
            self.reads += 1
            if self.reads > 1:
                raise OSError(errno.EIO, "Input/output error")
            return b"x" * size

    monkeypatch.setattr(checkpoints, "open", FailsHalfway, raising=False)
    assert not checkpoints.atomic_copy(source, target)  # the caller saves instead
    assert target.read_bytes() == b"before" and not partial_files(tmp_path)
    assert not checkpoints.atomic_copy(tmp_path / "missing.ckpt", target)


def test_an_interrupted_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    atomic_save({"step": 1, "weights": torch.ones(3)}, target)
    save = torch.save

    def half_then_fail(obj, file, *args, **kwargs):
        file.write(b"PK\\x03\\x04 half a checkpoint")
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(RuntimeError, match="the machine went away"):
        atomic_save({"step": 2, "weights": torch.zeros(3)}, target)
    monkeypatch.setattr(torch, "save", save)
    assert check_checkpoint(target) == target
    assert load_checkpoint(target)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # nothing partial


def test_a_write_never_goes_through_another_filesystem(tmp_path, monkeypatch):
    """The temporary file is made beside the target, whatever $TMPDIR says."""
    made = []
    mkstemp = checkpoints.tempfile.mkstemp

    def recording(*args, **kwargs):
        made.append(Path(kwargs["dir"]))
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(checkpoints.tempfile, "mkstemp", recording)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    atomic_save({"x": 1}, tmp_path / "runs" / "last.ckpt")
    assert made == [tmp_path / "runs"]


def test_a_full_disk_is_one_error_naming_the_folder_and_its_free_space(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    atomic_save({"step": 1}, target)

    def no_space(obj, file, *args, **kwargs):
        file.write(b"PK some bytes")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(CheckpointSaveError) as error:
        atomic_save({"step": 2}, target)
    message = str(error.value)
    assert f"cannot write last.ckpt in {tmp_path}/: No space left on device (" in message
    assert " free); what was there before is intact" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_disk_that_fills_inside_torchs_zip_writer_is_the_same_one_error(tmp_path, monkeypatch):
    """torch.save reports a failed write as "RuntimeError: ... unexpected pos"; the
    kit still names the disk's own error, whatever the checkpoint's size."""
    target = tmp_path / "last.ckpt"
    real_fdopen = os.fdopen

    class FillsUp:
        def __init__(self, file):
            self.file, self.room = file, 100_000  # less than the checkpoint below

        def write(self, data):
            if len(data) > self.room:
                raise OSError(28, "No space left on device")
            self.room -= len(data)
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

    monkeypatch.setattr(
        "{{ cookiecutter.package_name }}.kit.checkpoints.os.fdopen",
        lambda *a, **k: FillsUp(real_fdopen(*a, **k)),
    )
    with pytest.raises(CheckpointSaveError) as error:
        atomic_save({"weights": torch.zeros(1_000_000)}, target)
    assert isinstance(error.value.__cause__, OSError)
    assert f"cannot write last.ckpt in {tmp_path}/: No space left on device (" in str(error.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_save_loses_nothing(workdir):
    # Epoch 0 saves best and last; the third save (epoch 1's first: a best that
    # is not linked to yet, or last) is cut in half.
    killed = fork_cli(
        "fit",
        "--trainer.max_epochs=3",
        INSTRUMENTS,
        cwd=workdir,
        env={"INSTRUMENTS_KILL_SAVE": "3"},
    )
    assert killed.wait() == -9
    (run,) = run_dirs(workdir)
    last = run / "checkpoints" / "last.ckpt"
    assert load_checkpoint(check_checkpoint(last))["epoch"] == 0  # the previous one, whole
    assert partial_files(workdir)  # what the killed write left: never a resume candidate
    assert all(c.suffix == ".ckpt" for c in resume_candidates([run]))
    resumed = run_forked("fit", "--ckpt_path=last", "--trainer.max_epochs=3", cwd=workdir)
    assert "left by a write that was cut off" in resumed.stderr
    assert not partial_files(workdir)
    assert load_checkpoint(last)["epoch"] == 2 and run_dirs(workdir) == [run]


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[: len(data) // 2]))


@pytest.mark.slow
def test_resume_skips_a_damaged_newest_checkpoint_and_says_why(trained_checkpoint, workdir):
    from support import folder_of

    shutil.copytree(folder_of(trained_checkpoint), workdir, dirs_exist_ok=True)
    (run,) = run_dirs(workdir)
    last = run / "checkpoints" / "last.ckpt"
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    damage(last)
    os.utime(best, (1, 1))  # older than the damaged last.ckpt
    resumed = run_forked("fit", "--ckpt_path=last", "--trainer.max_epochs=3", cwd=workdir)
    inside = f"{run.name}/checkpoints/"
    assert re.search(
        rf"Skipping \S*{inside}last.ckpt: checkpoint '\S*{inside}last.ckpt'", resumed.stderr
    )
    assert "is truncated or not a PyTorch checkpoint" in resumed.stderr
    assert re.search(rf"Resuming from \S*{inside}{best.name}", resumed.stderr)
    assert load_checkpoint(last)["epoch"] == 2 and run_dirs(workdir) == [run]


def test_with_every_checkpoint_damaged_the_run_starts_afresh_saying_so(
    trained_checkpoint, workdir, caplog
):
    import logging

    from support import batches_trained, folder_of, main

    shutil.copytree(folder_of(trained_checkpoint), workdir, dirs_exist_ok=True)
    (run,) = run_dirs(workdir)
    for file in (run / "checkpoints").glob("*.ckpt"):
        damage(file)
    with caplog.at_level(logging.INFO):
        cli = main(["fit", "--ckpt_path=last", "--trainer.fast_dev_run=true"])
    assert "No checkpoint to resume (2 damaged, named above): starting a new run" in caplog.text
    assert batches_trained(cli.trainer) == 1  # from the start


def mounted_tmpfs(folder: Path, megabytes: int) -> bool:
    folder.mkdir(parents=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)]
    return subprocess.run(command, capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_genuinely_full_disk_stops_the_run_with_one_message(workdir):
    small = Path("/tmp") / f"small-disk-{uuid.uuid4().hex}"
    if not mounted_tmpfs(small, 8):
        shutil.rmtree(small, ignore_errors=True)
        pytest.skip("cannot mount a small tmpfs here (needs root); the injected OSError covers it")
    try:
        env = {"INSTRUMENTS_FILL": str(small / "filler"), "INSTRUMENTS_FILL_EPOCH": "1"}
        result = run_forked(
            "fit",
            "--trainer.max_epochs=3",
            f"--checkpoint.dirpath={small / 'checkpoints'}",
            INSTRUMENTS,
            cwd=workdir,
            env=env,
            check=False,
        )
        assert result.returncode == 2, result.stderr[-3000:]
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert f"in {small / 'checkpoints'}/: No space left on device (" in line
        assert "MiB free); what was there before is intact" in line
        assert "Traceback" not in result.stderr
        last = small / "checkpoints" / "last.ckpt"
        assert load_checkpoint(check_checkpoint(last))["epoch"] == 0
        assert not partial_files(small)
    finally:
        subprocess.run(["umount", str(small)], check=False)
        shutil.rmtree(small, ignore_errors=True)
