"""Faults a long run meets, each tried for real: SIGKILL, SIGTERM, Ctrl-C, a dying
rank, a damaged checkpoint; and runs that repeat exactly.

Kit test: it runs whatever model and data `project.py` names. A resume is proven
exact by what the resumed run starts from: the same step and epoch, the same
parameters, the same optimizer and scheduler states (for an optimizer that keeps
no state, that state is empty on both sides).
"""

import json
import random
import signal

import pytest
import torch
from instruments import optimizer_fingerprint, parameter_fingerprint, read_records
from support import (
    PROJECT,
    assert_identical,
    batches_of,
    best_score,
    fork_cli,
    load_checkpoint,
    main,
    reached,
    run_dirs,
    run_forked,
    wait_for,
)

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit.checkpoints import (
    CheckpointError,
    check_checkpoint,
    resume_candidates,
)
from {{ cookiecutter.package_name }}.project import TARGET

MODE = PROJECT.mode
MONITOR = PROJECT.monitor

INSTRUMENTS = "--trainer.callbacks+=instruments.Instruments"


def instruments_env(workdir, name: str, **settings) -> dict:
    env = {"INSTRUMENTS_RECORD": str(workdir / name)}
    env.update({f"INSTRUMENTS_{key.upper()}": str(value) for key, value in settings.items()})
    return env


def resume_and_check(workdir, checkpoint, *flags: str) -> dict:
    """`fit --ckpt_path last`; checks it resumed from `checkpoint` exactly where it
    was saved, and returns what the resumed run started with."""
    saved = load_checkpoint(checkpoint)
    resumed = run_forked(
        "fit",
        "--ckpt_path=last",
        INSTRUMENTS,
        *flags,
        cwd=workdir,
        env=instruments_env(workdir, "resumed"),
    )
    name = checkpoint.relative_to(checkpoint.parents[2])  # <run>/checkpoints/<file>
    assert f"{name} (the newest intact of" in resumed.stderr
    (start,) = read_records(workdir / "resumed", "train_start")
    assert start["global_step"] == saved["global_step"] > 0
    # (Where weights are averaged, the checkpoint's state_dict holds the average and
    # current_model_state the weights that train: Lightning's EMAWeightAveraging.)
    weights = saved.get("current_model_state", saved["state_dict"])
    assert start["parameters"] == pytest.approx(parameter_fingerprint(weights))
    assert start["optimizers"] == pytest.approx(
        [optimizer_fingerprint(state) for state in saved["optimizer_states"]]
    )
    assert start["schedulers"] == json.loads(json.dumps(saved["lr_schedulers"], default=repr))
    return start


@pytest.mark.slow
def test_resume_after_sigkill_continues_from_the_last_checkpoint(workdir):
    marker = workdir / "paused"
    first = fork_cli(
        "fit",
        "--trainer.max_epochs=4",
        INSTRUMENTS,
        cwd=workdir,
        env=instruments_env(workdir, "first", pause_epoch=2, pause_marker=marker),
    )
    wait_for(marker, first)  # epochs 0-1 done, last.ckpt written after each
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    (run,) = run_dirs(workdir)
    last = run / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["epoch"] == 1

    start = resume_and_check(workdir, last, "--trainer.max_epochs=4")
    assert start["epoch"] == 2  # the next epoch: not a fresh start
    # Into the same run directory, to the end.
    assert run_dirs(workdir) == [run]
    assert load_checkpoint(last)["epoch"] == 3


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
    first = fork_cli(
        "fit",
        "--trainer.max_epochs=3",
        INSTRUMENTS,
        cwd=workdir,
        env=instruments_env(workdir, "first", pause_epoch=1, pause_marker=marker),
    )
    wait_for(marker, first)
    first.send_signal(sent)
    assert first.wait(timeout=300) == exit_code
    stderr = (workdir / "stderr.txt").read_text()
    assert message in stderr
    assert "`weights_only` was not set" not in stderr
    (run,) = run_dirs(workdir)
    interrupted = run / "checkpoints" / "interrupted.ckpt"
    assert load_checkpoint(interrupted)["global_step"] > 0

    resume_and_check(workdir, interrupted, "--trainer.max_epochs=3")
    assert run_dirs(workdir) == [run]
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"] == 2
    assert not interrupted.exists()  # a finished run leaves no stale interruption behind


def test_two_seeded_deterministic_runs_are_identical(tmp_path, monkeypatch):
    outcomes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        cli = main(
            [
                "fit",
                "--trainer.deterministic=true",
                "--trainer.max_epochs=2",
                "--trainer.limit_train_batches=4",  # two epochs of a few steps each
                "--trainer.limit_val_batches=2",
                "--trainer.enable_progress_bar=false",
                "--trainer.logger=false",
            ]
        )
        outcomes.append((float(cli.trainer.callback_metrics[MONITOR]), cli.model.state_dict()))
    (metric_a, weights_a), (metric_b, weights_b) = outcomes
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


def test_the_cli_refuses_a_truncated_checkpoint_without_a_traceback(
    trained_checkpoint, workdir, capfd
):
    truncated = workdir / "cut.ckpt"
    truncated.write_bytes(trained_checkpoint.read_bytes()[:1000])
    assert command(["validate", f"--ckpt_path={truncated}"]) == 2
    err = capfd.readouterr().err
    assert f"error: checkpoint '{truncated}' (1000 bytes) is truncated" in err
    assert "Traceback" not in err


class NotAWeight:
    """Any class: unpickling it would run code, so a safe load refuses it."""


def test_checkpoints_load_weights_only(trained_checkpoint, workdir, capfd):
    state = torch.load(trained_checkpoint, map_location="cpu", weights_only=True)
    state["hyper_parameters"]["smuggled"] = NotAWeight()
    unsafe = workdir / "unsafe.ckpt"
    torch.save(state, unsafe)
    assert command(["validate", f"--ckpt_path={unsafe}"]) == 1
    err = capfd.readouterr().err
    assert "Weights only load failed" in err
    assert "could run any code, so it was refused" in err  # the hint


def resume_point(run) -> int:
    """The batches trained that `--ckpt_path last` would resume this run after (0: none)."""
    for candidate in resume_candidates([run]):
        try:
            return batches_of(load_checkpoint(check_checkpoint(candidate)))
        except CheckpointError:
            continue
    return 0


@pytest.mark.slow
@pytest.mark.target  # it compares with the full default fit
def test_chaos_ten_sigkills_at_random_moments_then_the_run_is_the_uninterrupted_one(
    workdir, default_fit
):
    """SIGKILL at 10 seeded moments (mid-step or mid-save), `fit --ckpt_path last` after each:
    the run ends with the uninterrupted one's weights, bit for bit, in one directory."""
    (uninterrupted,) = run_dirs(default_fit)
    expected = load_checkpoint(uninterrupted / "checkpoints" / "last.ckpt")
    steps_per_epoch = batches_of(expected) // (expected["epoch"] + 1)
    rng = random.Random(20261203)
    resume_step, kills = 0, []
    for attempt in range(10):
        args = ["fit"] if attempt == 0 else ["fit", "--ckpt_path=last"]
        if resume_step and rng.random() < 0.3:  # while writing its first or second checkpoint
            env = {"INSTRUMENTS_KILL_SAVE": str(rng.randint(1, 2))}
        else:  # at a step, after the first checkpoint so there is something to resume
            step = max(resume_step, steps_per_epoch) + rng.randint(1, 2 * steps_per_epoch)
            env = {"INSTRUMENTS_KILL_STEP": str(step)}
        kills.append(env)
        assert fork_cli(*args, INSTRUMENTS, cwd=workdir, env=env).wait() == -signal.SIGKILL, env
        (run,) = run_dirs(workdir)
        resume_step = resume_point(run)
    run_forked("fit", "--ckpt_path=last", cwd=workdir)
    assert run_dirs(workdir) == [run]
    final = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert (final["epoch"], final["global_step"]) == (expected["epoch"], expected["global_step"])
    assert not list(workdir.rglob("*.partial"))
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_identical(final[key], expected[key], f"{key} (kills: {kills})")
    assert reached(best_score(final), TARGET, MODE)
