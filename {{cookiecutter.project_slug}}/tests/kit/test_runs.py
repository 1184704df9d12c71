"""Run directories: a failed start leaves none, a finished run says so when resumed,
and a continued run keeps what it logged before.

Kit test: it runs whatever model and data `project.py` names.
"""

import functools
import logging
import re
import shlex
import shutil

import instruments
import pytest
from lightning.pytorch import Trainer
from support import (
    PACKAGE,
    PROJECT,
    SUBPROCESS_TIMEOUT,
    folder_of,
    fork_cli,
    forkserver,
    load_checkpoint,
    logged_scalars,
    main,
    run_dirs,
    schedule_ended,
)

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit.spec import ConfigError

MONITOR = PROJECT.monitor
Model = PROJECT.model


def test_a_run_that_fails_before_its_first_step_leaves_no_run_directory(
    workdir, monkeypatch, capfd, caplog
):
    def broken(self):
        raise RuntimeError("no optimizer today")

    monkeypatch.setattr(Model, "configure_optimizers", broken)
    with caplog.at_level(logging.INFO):
        assert command(["fit", "--trainer.enable_progress_bar=false"]) == 1
    assert "RuntimeError: no optimizer today" in capfd.readouterr().err
    assert "the run failed before it had results" in caplog.text
    assert run_dirs(workdir) == []


def test_a_run_that_fails_before_the_trainer_starts_leaves_no_run_directory(
    workdir, monkeypatch, capfd
):
    @functools.wraps(Trainer.__init__)  # the same signature, for the CLI's parser
    def broken(self, *args, **kwargs):
        raise RuntimeError("no trainer today")

    monkeypatch.setattr(Trainer, "__init__", broken)
    assert command(["fit"]) == 1
    assert "RuntimeError: no trainer today" in capfd.readouterr().err
    assert run_dirs(workdir) == []


def test_resuming_a_finished_run_says_so_and_how_to_continue(trained_checkpoint, workdir, caplog):
    shutil.copytree(folder_of(trained_checkpoint), workdir, dirs_exist_ok=True)
    (run,) = run_dirs(workdir)
    with caplog.at_level(logging.INFO):
        cli = main(["fit", "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert "is from a finished run: it already trained 2 epochs (max_epochs=2)" in caplog.text
    assert "raise --trainer.max_epochs (e.g. 4)" in caplog.text
    assert "Training health" not in caplog.text  # the old run's: it trained nothing now
    assert cli.trainer.global_step > 0 and run_dirs(workdir) == [run]


@pytest.mark.slow
def test_a_fit_ends_with_where_its_result_is_and_how_to_go_on(trained_checkpoint, workdir, capsys):
    shutil.copytree(folder_of(trained_checkpoint), workdir, dirs_exist_ok=True)
    (run,) = run_dirs(workdir)
    short = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2"]
    main(["fit", "--ckpt_path=last", "--trainer.max_epochs=3", *short])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    best, curves, further = last.split(" | ")
    found = re.fullmatch(rf"Best {re.escape(MONITOR)} (\S+) at epoch (\d+): (\S+)", best)
    assert found, last
    saved = load_checkpoint(workdir / found[3])  # the best checkpoint, at its epoch
    state = next(v for k, v in saved["callbacks"].items() if k.startswith("BestAndLast"))
    assert f"{state['best_model_score']:.4g}" == found[1]
    assert saved["epoch"] == int(found[2]) and run_dirs(workdir) == [run]
    assert curves.startswith("curves: ") and (workdir / curves.split()[-1]).exists(), curves
    # The command to continue, as printed, continues this run.
    words = shlex.split(further.removeprefix("continue: "))
    command = shlex.split(PROJECT.command)  # the console script, or `python -m <package>`
    assert words[: len(command) + 3] == [*command, "fit", "--ckpt_path", "last"], further
    main([*words[len(command) :], *short])
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"] == 5  # max_epochs 6


def test_a_continued_run_keeps_its_earlier_metrics(trained_checkpoint, workdir):
    shutil.copytree(folder_of(trained_checkpoint), workdir, dirs_exist_ok=True)
    (run,) = run_dirs(workdir)
    before = logged_scalars(run)
    flags = ["fit", "--ckpt_path=last", "--trainer.max_epochs=3"]
    if schedule_ended(load_checkpoint(run / "checkpoints" / "last.ckpt")):
        # A schedule built for the run's steps (OneCycleLR) ends with it: refused, unchanged.
        with pytest.raises(ConfigError, match="cannot step past its last"):
            main(flags)
        assert logged_scalars(run) == before
        return
    main([*flags, "--trainer.enable_progress_bar=false"])
    after = logged_scalars(run)
    for name, values in before.items():
        assert after[name][: len(values)] == values, name
    assert len(after[MONITOR]) == len(before[MONITOR]) + 1


def test_runs_racing_for_a_run_directory_each_get_their_own(tmp_path):
    """Eight processes released at one barrier claim run directories, five times over."""
    context = forkserver()
    init = {"save_dir": str(tmp_path), "name": "logs", "version": None}
    logger = {"class_path": "any.Logger", "init_args": init}
    claimed = []
    for _ in range(5):
        barrier, results = context.Barrier(8), context.Queue()
        processes = [
            context.Process(
                target=instruments.claim_together, args=(PACKAGE, barrier, logger, results)
            )
            for _ in range(8)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(SUBPROCESS_TIMEOUT)
            assert process.exitcode == 0
        claimed += [results.get(timeout=10) for _ in processes]
    assert len(set(claimed)) == 40
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(
        f"version_{n}" for n in range(40)
    )


@pytest.mark.slow
def test_two_fits_started_at_once_get_different_run_directories(workdir):
    short = ["fit", "--trainer.max_steps=2", "--trainer.limit_val_batches=1"]
    for _ in range(3):
        first, second = fork_cli(*short, cwd=workdir), fork_cli(*short, cwd=workdir)
        assert first.wait() == 0 and second.wait() == 0
    runs = run_dirs(workdir)
    assert len(runs) == 6
    assert all((run / "config.yaml").is_file() for run in runs)
