"""Faults a long run meets, each tried for real: SIGKILL, SIGTERM, a dying rank,
a damaged checkpoint; and runs that repeat exactly."""

import signal
import time

import pytest
import torch
from conftest import failure, load_checkpoint, run_cli, run_dirs, start_cli, wait_for
from instruments import optimizer_fingerprint, read_records

from {{ cookiecutter.package_name }}.checkpoints import CheckpointError, check_checkpoint
from {{ cookiecutter.package_name }}.cli import MONITOR, main

INSTRUMENTS = "--trainer.callbacks+=instruments.Instruments"
# A scheduler too, so its state is part of what a resume must restore.
SCHEDULER = ("--model.scheduler=torch.optim.lr_scheduler.StepLR", "--model.scheduler.step_size=5")


def instruments_env(workdir, name: str, **settings) -> dict:
    env = {"INSTRUMENTS_RECORD": str(workdir / name)}
    env.update({f"INSTRUMENTS_{key.upper()}": str(value) for key, value in settings.items()})
    return env


def reached_target(best: float) -> bool:
{%- if cookiecutter.example == "digits" %}
    return best >= 0.97  # val/acc
{%- else %}
    return best <= 0.05  # val/loss; the noise floor is 0.01
{%- endif %}


def best_score(checkpoint: dict) -> float:
    (state,) = [s for s in checkpoint["callbacks"].values() if "best_model_score" in s]
    return float(state["best_model_score"])


def resume_and_check(workdir, checkpoint, saved: dict, *flags: str) -> dict:
    """`fit --ckpt_path last`; checks it resumed from `checkpoint` exactly where
    `saved` (its contents) was, and returns what the resumed run started with."""
    resumed = run_cli(
        "fit",
        "--ckpt_path=last",
        INSTRUMENTS,
        *flags,
        cwd=workdir,
        env=instruments_env(workdir, "resumed"),
    )
    name = f"{checkpoint.parent.parent.name}/checkpoints/{checkpoint.name}"
    assert f"{name} (the newest of" in resumed.stderr
    (start,) = read_records(workdir / "resumed", "train_start")
    # The same step and the same optimizer moments (Adam's running averages).
    assert start["global_step"] == saved["global_step"]
    assert start["optimizer"] == pytest.approx(optimizer_fingerprint(saved["optimizer_states"][0]))
    assert start["optimizer"] != 0.0
    return start


@pytest.mark.slow
def test_resume_after_sigkill_continues_from_the_last_checkpoint(workdir):
    marker = workdir / "paused"
    first = start_cli(
        "fit",
        INSTRUMENTS,
        *SCHEDULER,
        cwd=workdir,
        env=instruments_env(workdir, "first", pause_epoch=3, pause_marker=marker),
    )
    wait_for(marker, first)  # epochs 0-2 done, last.ckpt written after each
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    (run,) = run_dirs(workdir)
    saved = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert saved["epoch"] == 2 and saved["global_step"] > 0

    start = resume_and_check(workdir, run / "checkpoints" / "last.ckpt", saved, *SCHEDULER)
    # The next epoch and the scheduler's position too: not a fresh start.
    assert start["epoch"] == 3
    assert start["scheduler_steps"] == saved["lr_schedulers"][0]["last_epoch"] == 3
    # Into the same run directory, to the end and to the usual quality.
    assert run_dirs(workdir) == [run]
    final = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert final["epoch"] == 19
    assert reached_target(best_score(final)), best_score(final)


# What a scheduler sends before it kills a job, and Ctrl-C.
STOPS = {
    "SIGTERM": (signal.SIGTERM, 143, "stopped by SIGTERM; resume with `fit --ckpt_path last`"),
    "SIGINT": (signal.SIGINT, 1, "Detected KeyboardInterrupt, attempting graceful shutdown"),
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_a_stop_signal_saves_a_checkpoint_exits_nonzero_and_resumes(workdir, stop):
    sent, exit_code, message = stop
    marker = workdir / "paused"
    first = start_cli(
        "fit",
        "--trainer.max_epochs=4",
        INSTRUMENTS,
        cwd=workdir,
        env=instruments_env(workdir, "first", pause_epoch=1, pause_marker=marker),
    )
    wait_for(marker, first)
    first.send_signal(sent)
    assert first.wait(timeout=120) == exit_code
    assert message in (workdir / "stderr.txt").read_text()
    (run,) = run_dirs(workdir)
    interrupted = run / "checkpoints" / "interrupted.ckpt"
    saved = load_checkpoint(interrupted)
    assert saved["global_step"] > 0

    resume_and_check(workdir, interrupted, saved, "--trainer.max_epochs=4")
    assert run_dirs(workdir) == [run]
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"] == 3
    assert not interrupted.exists()  # a finished run leaves no stale interruption behind


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_whole_job_quickly(workdir):
    started = time.monotonic()
    result = run_cli(
        "fit",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        INSTRUMENTS,
        cwd=workdir,
        check=False,
        timeout=300,
        env={"INSTRUMENTS_FAIL_RANK": "1", "INSTRUMENTS_FAIL_STEP": "1"},
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0, failure("fit", result)
    assert elapsed < 120, f"the job took {elapsed:.0f} s to end after a rank died"
    assert "RuntimeError: injected fault on rank 1 at step 1" in result.stderr
    assert "[rank 1/2] failed: RuntimeError: injected fault on rank 1 at step 1" in result.stderr
    assert not list(workdir.rglob("interrupted.ckpt"))  # a crash is not an interruption


def fit_twice_deterministically(tmp_path, monkeypatch):
    outcomes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        cli = main(
            [
                "fit",
                "--trainer.deterministic=true",
                "--trainer.max_epochs=2",
                "--trainer.enable_progress_bar=false",
                # Absolute: one process, two working directories.
                f"--trainer.logger.init_args.save_dir={tmp_path / name / 'logs'}",
            ]
        )
        outcomes.append((float(cli.trainer.callback_metrics[MONITOR]), cli.model.state_dict()))
    return outcomes


def test_two_seeded_deterministic_runs_are_identical(tmp_path, monkeypatch):
    (metric_a, weights_a), (metric_b, weights_b) = fit_twice_deterministically(
        tmp_path, monkeypatch
    )
    assert metric_a == metric_b
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        assert torch.equal(weights_a[key], weights_b[key]), key


def test_a_complete_checkpoint_passes_the_check(trained_checkpoint):
    assert check_checkpoint(trained_checkpoint) == trained_checkpoint


def test_a_truncated_checkpoint_is_refused_by_name(trained_checkpoint, tmp_path):
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(trained_checkpoint.read_bytes()[: trained_checkpoint.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"'{truncated}'.*truncated"):
        check_checkpoint(truncated)


def test_a_damaged_byte_is_caught_by_the_crc(trained_checkpoint, tmp_path):
    data = bytearray(trained_checkpoint.read_bytes())
    data[len(data) // 3] ^= 0xFF
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"'{damaged}'.*(corrupted|truncated)"):
        check_checkpoint(damaged)


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="'.*nowhere.ckpt' does not exist"):
        check_checkpoint(tmp_path / "nowhere.ckpt")


def test_the_cli_refuses_a_truncated_checkpoint_without_a_traceback(trained_checkpoint, workdir):
    truncated = workdir / "cut.ckpt"
    truncated.write_bytes(trained_checkpoint.read_bytes()[:1000])
    result = run_cli("validate", f"--ckpt_path={truncated}", cwd=workdir, check=False)
    assert result.returncode == 2, failure("validate", result)
    assert f"error: checkpoint '{truncated}' (1000 bytes) is truncated" in result.stderr
    assert "Traceback" not in result.stderr


class NotAWeight:
    """Any class: unpickling it would run code, so a safe load refuses it."""


def test_checkpoints_load_weights_only(trained_checkpoint, workdir):
    state = torch.load(trained_checkpoint, map_location="cpu", weights_only=True)
    state["hyper_parameters"]["smuggled"] = NotAWeight()
    unsafe = workdir / "unsafe.ckpt"
    torch.save(state, unsafe)
    result = run_cli("validate", f"--ckpt_path={unsafe}", cwd=workdir, check=False)
    assert result.returncode == 1
    assert "Weights only load failed" in result.stderr
    assert "could run any code, so it was refused" in result.stderr  # the hint
