"""A run that goes wrong stops at once and says why: a loss or weights that are no
longer finite, a rank that fails before the others meet, a rank that stops taking part.

Kit test: it runs whatever model and data `project.py` names. The faults are real
(a NaN in the weights, an exception on one rank, a rank asleep in its step); the
timeouts are the tests' own, a few seconds; no test asserts how long anything took
(a hang fails on the subprocess's timeout instead).
"""

import re
import socket
from types import SimpleNamespace

import pytest
import torch
from support import (
    CONFIGS,
    DDP,
    INSTRUMENTS,
    failure,
    load_checkpoint,
    optimizes_by_hand,
    run_cli,
    run_forked,
    whole_copies,
)

from {{ cookiecutter.package_name }}.kit.internals import saved_batch_progress
from {{ cookiecutter.package_name }}.kit.machine import free_port
from {{ cookiecutter.package_name }}.kit.watch import (
    Diverged,
    check_loss,
    finite,
    hang_report,
)

QUICK = ("--trainer.max_epochs=2", "--trainer.enable_progress_bar=false")
HANG = 180  # seconds after which a job that should have ended fails the test


def test_a_loss_that_turns_nan_stops_the_run_at_that_logging_step_in_one_line(workdir):
    ran = run_forked(
        "fit",
        *QUICK,
        "--trainer.log_every_n_steps=1",
        INSTRUMENTS,
        cwd=workdir,
        env={"INSTRUMENTS_NAN_STEP": "1"},
        check=False,
    )
    assert ran.returncode == 1, failure("fit", ran)
    (line,) = [line for line in ran.stderr.splitlines() if "diverged" in line]
    # The kit's train/loss, or the loss of a module that logs its own; a module that
    # steps its optimizers by hand may return none: then its metric or weights tell.
    said = re.match(
        r"diverged: (train/loss is nan at epoch \d+, steps 1-1|the training loss is nan at"
        r" epoch \d+, step 1); the last finite value was \S+, at steps? 0(-0)?\. Nothing",
        line,
    )
    assert said or (optimizes_by_hand() and line.startswith("diverged: ")), line
    assert "Traceback" not in ran.stderr


@pytest.mark.slow
def test_every_step_finds_the_step_a_divergence_starts_at_and_says_what_it_costs(workdir):
    ran = run_forked(
        "fit",
        *QUICK,
        "--trainer.log_every_n_steps=100000",
        "--divergence.every_step=true",
        INSTRUMENTS,
        cwd=workdir,
        env={"INSTRUMENTS_NAN_STEP": "2"},
        check=False,
    )
    assert ran.returncode == 1, failure("fit", ran)
    assert "each step's loss is read from the device, a host sync a step" in ran.stderr
    (line,) = [line for line in ran.stderr.splitlines() if "diverged" in line]
    said = re.match(r"diverged: the training loss is nan at epoch \d+, batch 2;", line)
    assert said or optimizes_by_hand(), line


@pytest.mark.slow
def test_weights_that_are_not_finite_are_never_saved_and_the_last_good_state_resumes(workdir):
    # No validation and no logging step: the save at an epoch's end finds the NaN.
    flags = (
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=100000",
        "--trainer.limit_val_batches=0",
        "--checkpoint.monitor=null",
    )
    run_forked("fit", "--trainer.max_epochs=1", *flags, cwd=workdir)
    last = next(workdir.rglob("last.ckpt"))
    batches = saved_batch_progress(load_checkpoint(last))["total"]["completed"]  # an epoch's
    ran = run_forked(
        "fit",
        "--ckpt_path=last",
        "--trainer.max_epochs=3",
        *flags,
        INSTRUMENTS,
        cwd=workdir,
        env={"INSTRUMENTS_NAN_STEP": str(batches + 1)},
        check=False,
    )
    assert ran.returncode == 1, failure("fit", ran)
    assert "diverged: the weights are not finite at epoch" in ran.stderr
    assert "The checkpoint due there was not written" in ran.stderr
    kept = saved_batch_progress(load_checkpoint(last))["total"]["completed"]
    assert batches <= kept <= batches + 1  # the newest state before the NaN, kept
    for path in workdir.rglob("*.ckpt"):
        assert finite(load_checkpoint(path)["state_dict"].values()), path


class FakeStrategy:
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision


def fake_trainer(scaler: object | None) -> SimpleNamespace:
    return SimpleNamespace(
        precision="16-mixed" if scaler else "32-true",
        precision_plugin=SimpleNamespace(scaler=scaler),
        strategy=FakeStrategy(),
        gradient_clip_val=None,
        current_epoch=3,
    )


def test_steps_the_fp16_scaler_skipped_are_not_a_divergence_while_the_weights_are_finite():
    weights = torch.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="gradient scaler skipped those steps"):
        check_loss(fake_trainer(object()), weights, "train/loss", float("inf"), "steps 5-9", None)
    with torch.no_grad():
        weights.weight[0, 0] = float("nan")
    with pytest.raises(Diverged, match="bf16-mixed instead of 16-mixed"):
        check_loss(fake_trainer(object()), weights, "train/loss", float("nan"), "steps 5-9", None)
    with pytest.raises(
        Diverged, match=r"nan at epoch 3, steps 5-9; the last finite value was 0\.5, at steps 0-4"
    ):
        check_loss(
            fake_trainer(None),
            torch.nn.Linear(2, 2),
            "train/loss",
            float("nan"),
            "steps 5-9",
            (0.5, "steps 0-4"),
        )
    check_loss(
        fake_trainer(None), weights, "train/loss", 0.25, "steps 5-9", None
    )  # finite: nothing


def at(where: str, line: str, waiting: bool) -> dict:
    return {"beat": 1, "count": 7, "where": where, "line": line, "waiting": waiting}


BUSY = at("after training batch 2", "model.py:9 in training_step", waiting=False)
WAITING = at("in the backward of batch 3", "graph.py:841 in _engine_run_backward", waiting=True)


def test_the_hang_report_names_the_rank_that_did_not_arrive_and_the_one_that_is_gone():
    report = hang_report({0: WAITING, 1: BUSY}, 3, 600, "--distributed.timeout 600")
    assert report.startswith("stopped: no progress for 600 s (--distributed.timeout 600)")
    assert "rank 2 does not answer: its process has ended or is frozen" in report
    assert "rank 1 did not arrive: last seen after training batch 2, now at model.py:9" in report
    assert "rank 0 waits at graph.py:841 in _engine_run_backward" in report
    assert "sync_dist=True on one rank" in report


def test_ranks_that_all_wait_in_one_collective_point_at_the_network():
    report = hang_report({0: WAITING, 1: WAITING}, 2, 30, "--distributed.timeout 30")
    assert "every rank waits at graph.py:841 in _engine_run_backward, last seen in the" in report
    assert "a collective they all entered does not complete" in report
    assert "NCCL_P2P_DISABLE=1" in report and "doctor --distributed" in report


def test_ranks_each_busy_with_work_of_their_own_are_left_to_it():
    assert hang_report({0: BUSY, 1: BUSY}, 2, 600, "--distributed.timeout 600") is None


FSDP = (f"--config={CONFIGS / 'fsdp.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2")


@pytest.mark.slow
def test_a_rank_that_fails_in_setup_ends_every_rank_with_its_error(workdir):
    # Under FSDP, rank 1 fails; rank 0 reads its error in the job's store and says it,
    # rather than its own account of a peer gone (gloo), or waiting out the process
    # group's 30-minute timeout (NCCL). (Under DDP where the project's callbacks keep a
    # whole copy of the model, which FSDP refuses.)
    ran = run_cli(
        "fit",
        *QUICK,
        *(DDP if whole_copies() else FSDP),
        INSTRUMENTS,
        cwd=workdir,
        check=False,
        timeout=HANG,
        env={"INSTRUMENTS_FAIL_RANK": "1", "INSTRUMENTS_FAIL_STEP": "setup"},
    )
    assert ran.returncode != 0, failure("fit", ran)
    error = "RuntimeError: injected fault on rank 1 in setup"
    assert f"[rank 1/2] failed: {error}" in ran.stderr
    assert f"[rank 0/2] stopping: rank 1 failed: {error}" in ran.stderr
    assert not list(workdir.rglob("interrupted.ckpt"))  # a crash is not an interruption


@pytest.mark.slow
def test_when_rank_0_cannot_take_its_port_the_rank_it_started_ends_too(workdir):
    # Before the ranks meet there is no store: rank 1 waits to connect to rank 0, which
    # has ended; before the kit's watch it waited out the process group's timeout.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = run_cli(
            "fit",
            *QUICK,
            *DDP,
            cwd=workdir,
            check=False,
            timeout=HANG,
            env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        )
    assert ran.returncode == 1, failure("fit", ran)
    assert "EADDRINUSE" in ran.stderr
    assert "Hint: the rendezvous port is already taken" in ran.stderr
    assert "[rank 1/2] stopping: rank 0, which started this process, has ended" in ran.stderr


@pytest.mark.slow
def test_a_rank_that_stops_taking_part_is_named_and_the_job_ends(workdir):
    ran = run_cli(
        "fit",
        *QUICK,
        *DDP,
        INSTRUMENTS,
        "--distributed.timeout=5",
        cwd=workdir,
        check=False,
        timeout=HANG,
        env={"INSTRUMENTS_SLEEP_RANK": "1", "INSTRUMENTS_SLEEP_STEP": "3"},
    )
    assert ran.returncode != 0, failure("fit", ran)
    lines = [line for line in ran.stderr.splitlines() if "] stopped: no progress" in line]
    assert len(lines) == 1, failure("fit", ran)
    (line,) = lines
    assert "(--distributed.timeout 5)" in line
    assert "rank 1 did not arrive: last seen after training batch 2 of epoch 0" in line
    assert "in on_train_batch_start" in line  # where it sleeps: the instruments' hook
    assert "rank 0 waits at " in line  # in DDP's forward or backward: their syncs


@pytest.mark.slow
def test_under_ddp_every_rank_stops_at_the_same_logging_step(workdir):
    ran = run_cli(
        "fit",
        *QUICK,
        *DDP,
        "--trainer.log_every_n_steps=2",
        INSTRUMENTS,
        cwd=workdir,
        check=False,
        timeout=HANG,
        env={"INSTRUMENTS_NAN_STEP": "3"},
    )
    assert ran.returncode == 1, failure("fit", ran)
    lines = [line for line in ran.stderr.splitlines() if "diverged" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "diverged: train/loss is nan at epoch 0, steps 2-3"
    )
    assert "stopping:" not in ran.stderr and "Traceback" not in ran.stderr


@pytest.mark.slow
def test_a_node_that_never_starts_ends_the_job_after_the_start_timeout(workdir):
    # Two nodes are asked for, only one starts: rank 0 waits for rank 1 to meet it.
    ran = run_cli(
        "fit",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.num_nodes=2",
        "--trainer.strategy=ddp",
        "--distributed.start_timeout=5",
        cwd=workdir,
        check=False,
        timeout=HANG,
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0"},
    )
    assert ran.returncode == 1, failure("fit", ran)
    assert (
        "[rank 0/2] stopped: the job's 2 processes did not all meet within 5 s"
        " (--distributed.start_timeout); usual causes: a node that did not start"
    ) in ran.stderr
    assert "Traceback" not in ran.stderr
