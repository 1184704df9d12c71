"""The sweep: an Optuna study whose trials are real fits of the project, pruned on
the monitored metric, that survives a kill and shares its storage between workers.

Kit test: it runs whatever model and data `project.py` names. The studies here
search flags every project has (the seed, the Trainer's number of training
batches and its epochs), read the metric and its direction from project.py,
and train one to three short epochs a trial: any model, even one whose epoch
is a single batch.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import FixedTrial, TrialState
from support import (
    CONFIGS,
    PROJECT,
    SRC,
    batches_of,
    best_score,
    configured,
    fork_cli,
    load_checkpoint,
    loader_length,
    main,
    run_forked,
    shared,
    wait_for,
)

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit import sweep as sweep_module
from {{ cookiecutter.package_name }}.kit.sweep import (
    Sweep,
    SweepError,
    as_flags,
    grid_of,
    parse,
    read_space,
    suggest,
)

MODE = PROJECT.mode

# Flags of every project: which batches, how many, in what order. A count of batches, not a
# share of the epoch: Lightning takes all of an epoch shorter than that, even one batch.
SPACE = {
    "seed_everything": {"type": "int", "low": 0, "high": 1000},
    "trainer.limit_train_batches": {"type": "int", "low": 1, "high": 2},
}
# A few batches a trial: the sweep is under test here, not the model.
FEW_BATCHES = ["--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0"]
INSTRUMENTS = "--trainer.callbacks+=instruments.Instruments"
COMPLETE, PRUNED, FAIL, RUNNING = (
    TrialState.COMPLETE,
    TrialState.PRUNED,
    TrialState.FAIL,
    TrialState.RUNNING,
)


def write_space(folder: Path, space: dict) -> Path:
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def study_in(folder: Path, name: str = "space") -> optuna.Study:
    """The study a sweep in `folder` made in its default storage."""
    storage = f"sqlite:///{folder / 'sweeps' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage)


def test_the_space_is_the_projects_from_any_folder(workdir):
    """As fit finds configs/default.yaml from the project, sweep finds configs/sweep.yaml:
    run from another folder, with no --space, it searches the project's own."""
    if not (CONFIGS / "sweep.yaml").is_file():
        pytest.skip("the project has no configs/sweep.yaml")
    options, fit_args = parse([])
    sweep = Sweep(options, fit_args, PROJECT)
    assert sweep.space == read_space(CONFIGS / "sweep.yaml") and sweep.name == "sweep"
    assert not (workdir / "configs").exists()


def test_a_space_file_gives_each_flag_its_distribution(tmp_path):
    path = write_space(
        tmp_path,
        {
            "--model.lr": {"type": "float", "low": "1e-4", "high": 0.1, "log": True},
            "data.batch_size": {"type": "categorical", "choices": [32, 64]},
            "trainer.max_epochs": {"type": "int", "low": 2, "high": 10, "step": 2},
            "trainer.deterministic": {"type": "categorical", "choices": [True, None]},
        },
    )
    space = read_space(path)
    assert space["model.lr"].log and space["model.lr"].low == 1e-4  # the dashes are optional
    chosen = {
        "model.lr": 0.001,
        "data.batch_size": 64,
        "trainer.max_epochs": 4,
        "trainer.deterministic": None,
    }
    assert as_flags(suggest(FixedTrial(chosen), space)) == [
        "--model.lr=0.001",
        "--data.batch_size=64",
        "--trainer.max_epochs=4",
        "--trainer.deterministic=null",
    ]
    stepped = {name: dist for name, dist in space.items() if name != "model.lr"}
    assert grid_of(stepped)["trainer.max_epochs"] == [2, 4, 6, 8, 10]
    with pytest.raises(SweepError, match="model.lr is a continuous or log-scale range"):
        grid_of(space)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type": "uniform", "low": 0, "high": 1}, "needs `type:` float, int or categorical"),
        ({"type": "float", "low": 0.1}, "a float needs `high:`"),
        ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, "model.dropout: "),
        ({"type": "int", "low": 1, "high": 4, "choices": [1]}, "unknown choices"),
        ({"type": "categorical", "choices": []}, "must be a list of values"),
    ],
)
def test_a_bad_space_entry_is_refused_by_name(tmp_path, entry, message):
    path = write_space(tmp_path, {"model.dropout": entry})
    with pytest.raises(SweepError, match=message) as refused:
        read_space(path)
    assert str(path) in str(refused.value)


def test_sweep_options_and_fit_flags_are_told_apart():
    options, fit_args = parse(
        ["--trials", "5", "--workers=2", "--", "--config", "c.yaml", "--trainer.max_epochs", "3"]
    )
    assert (options.trials, options.workers, options.sampler) == (5, 2, "tpe")
    assert fit_args == ["--config", "c.yaml", "--trainer.max_epochs", "3"]
    _, fit_args = parse(["--trainer.max_epochs=3", "--trials=2", "--", "--config", "c.yaml"])
    assert fit_args == ["--trainer.max_epochs=3", "--config", "c.yaml"]
    with pytest.raises(SystemExit) as refused:
        parse(["--pruner", "threshold"])
    assert refused.value.code == 2


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("sweep", ["--workers", "--storage"]),
        ("repeat", ["--seeds N", "--folds K"]),
        ("bench", ["--steps", "--batch_size"]),
        ("export", ["--ckpt_path", "--output", "--format"]),
        ("doctor", ["--ckpt_path", "--world_size", "--memory"]),
    ],
)
def test_a_command_is_listed_and_its_help_needs_no_lightning(capsys, name, flags):
    assert command(["--help"]) == 0
    assert f"  {name} " in capsys.readouterr().out
    code = (
        "import sys\n"
        "from {{ cookiecutter.package_name }}.__main__ import main\n"
        "try:\n"
        f"    main([{name!r}, '--help'])\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "assert not loaded & {'lightning', 'torch', 'optuna'}, loaded\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert all(flag in result.stdout for flag in flags), result.stdout


@pytest.mark.slow  # it waits out a grace period; the storage's, whatever the model
@pytest.mark.parametrize("storage", [[], ["--storage=journal.log"]], ids=["sqlite", "journal"])
def test_dead_trials_are_failed_and_queued_again(workdir, storage, monkeypatch, capsys):
    """Optuna's heartbeat: a trial that beat lately is left alone, one silent for longer
    than the grace period is marked FAIL; so is at once one of this machine whose process
    is gone. The flags of both wait for the next worker, with their runs."""
    monkeypatch.setattr(sweep_module, "GRACE_S", 1)
    options, fit_args = parse([f"--space={write_space(workdir, SPACE)}", *storage])
    sweep = Sweep(options, fit_args, PROJECT)
    study, storage = sweep.open_study()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    trials = {}
    for name in ("live", "silent", "gone"):
        with pytest.warns(UserWarning, match="supposed to be used with Study.optimize"):
            trial = trials[name] = study.ask()
        trial.suggest_int("seed_everything", 0, 1000)
        trial.set_user_attr("run", f"sweeps/{name}")
        storage.record_heartbeat(trial._trial_id)
    owners = {"silent": ("another-machine", 1), "gone": (socket.gethostname(), ended.pid)}
    for name, (host, pid) in owners.items():
        owner = {"host": host, "pid": pid, "start": None, "trial": trials[name].number}
        trials[name].set_user_attr("process", owner)
    time.sleep(2.5)
    for name in ("live", "gone"):
        storage.record_heartbeat(trials[name]._trial_id)
    assert sweep.wants_more(study)
    live, silent, gone, *again = study.get_trials()
    assert (live.state, silent.state, gone.state) == (RUNNING, FAIL, FAIL)
    assert [t.state for t in again] == [TrialState.WAITING] * 2
    retries = {tuple(t.system_attrs["retry_history"]): t for t in again}
    for failed in (silent, gone):
        retry = retries[(failed.number,)]
        assert retry.params == failed.params
        assert retry.user_attrs["run"] == failed.user_attrs["run"]
    printed = capsys.readouterr().out
    assert f"trial {gone.number} marked FAIL: its process ({ended.pid}) ended" in printed
    assert f"trial {silent.number} marked FAIL: its worker on another-machine" in printed


@pytest.mark.slow  # two threads racing for a storage, whatever the model
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_of_two_workers_reaching_for_one_trial_at_once_one_takes_it(workdir, kind, monkeypatch):
    """Two workers start the same queued trial, then mark the same dead trial FAIL, each
    at once: one moves it, the other is told no, so a trial runs once and is queued
    again once. On SQLite each waits, between reading the trial's state and writing its
    own, until the other has read too (or for two seconds, if it cannot read meanwhile);
    the journal orders the two moves by its log."""
    url = f"sqlite:///{workdir / 'study.db'}" if kind == "sqlite" else str(workdir / "journal.log")
    storages = [sweep_module.open_storage(url, lambda study, trial: None) for _ in range(2)]
    study = optuna.create_study(storage=storages[0], study_name="race")
    study.enqueue_trial({"seed_everything": 0})
    trial_id = study.get_trials()[0]._trial_id
    both_read = threading.Barrier(2, timeout=2.0)
    for storage in storages:
        checked = storage.check_trial_is_updatable

        def wait_for_the_other(trial_id, state, checked=checked):
            try:
                both_read.wait()
            except threading.BrokenBarrierError:
                pass
            checked(trial_id, state)

        monkeypatch.setattr(storage, "check_trial_is_updatable", wait_for_the_other)

    for state in (RUNNING, FAIL):
        both_read.reset()
        answers = [None, None]

        def move(index, state=state, answers=answers):
            try:
                answers[index] = storages[index].set_trial_state_values(trial_id, state)
            except optuna.exceptions.UpdateFinishedTrialError:
                answers[index] = "refused"

        workers = [threading.Thread(target=move, args=(index,)) for index in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
        refusal = False if state == RUNNING else "refused"
        assert answers.count(True) == 1 and refusal in answers, (state, answers)
        assert study.get_trials()[0].state == state


# A bar no model clears: each trial still running after its warm-up validation is pruned.
IMPOSSIBLE = 1e30 if MODE == "max" else -1e30


def _short_sweep(folder: Path) -> None:
    """Every combination of one or three epochs and two seeds: under a threshold no model
    reaches, with a warm-up of one validation, the one-epoch trials complete and the
    three-epoch trials are pruned after their second validation, whatever the model."""
    space = write_space(
        folder,
        {
            "trainer.max_epochs": {"type": "categorical", "choices": [1, 3]},
            "seed_everything": {"type": "categorical", "choices": [0, 1]},
        },
    )
    result = run_forked(
        "sweep",
        f"--space={space}",
        "--sampler=grid",
        "--pruner=threshold",
        f"--threshold={IMPOSSIBLE}",
        "--warmup_epochs=1",
        "--",
        "--trainer.limit_train_batches=2",
        "--trainer.deterministic=true",  # so that the best config trains to the same score
        *FEW_BATCHES,
        cwd=folder,
    )
    (folder / "output.txt").write_text(result.stdout)


@pytest.fixture(scope="module")
def short_sweep(request, tmp_path_factory) -> Path:
    return shared(request, tmp_path_factory, "short-sweep", _short_sweep)


@pytest.mark.slow
def test_a_short_sweep_completes_prunes_and_reports(short_sweep):
    trials = study_in(short_sweep).get_trials()
    by_epochs = {e: [t for t in trials if t.params["trainer.max_epochs"] == e] for e in (1, 3)}
    assert [t.state for t in by_epochs[1]] == [COMPLETE, COMPLETE]
    assert [t.state for t in by_epochs[3]] == [PRUNED, PRUNED]
    for trial in by_epochs[3]:  # stopped at its second validation: the third epoch never ran
        assert sorted(trial.intermediate_values) == [0, 1]
        run = short_sweep / trial.user_attrs["run"]
        assert load_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"] <= 1
    for trial in trials:  # each a run of its own, in the study's directory
        run = Path(trial.user_attrs["run"])
        assert run.parts[:2] == ("sweeps", "space")
        assert (short_sweep / run / "config.yaml").is_file()
    assert len({t.user_attrs["run"] for t in trials}) == 4
    for trial in by_epochs[1]:  # its score: the best checkpoint's
        (best,) = (short_sweep / trial.user_attrs["run"] / "checkpoints").glob("best-*.ckpt")
        assert best_score(load_checkpoint(best)) == pytest.approx(trial.value)

    printed = (short_sweep / "output.txt").read_text()
    table = printed[printed.index("#  state") :]
    assert table.count("COMPLETE") == 2 and table.count("PRUNED") == 2
    folder = short_sweep / "sweeps" / "space"
    for name in ("best.yaml", "trials.csv", "history.png", "importance.png"):
        assert (folder / name).stat().st_size > 0, name
    assert (folder / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_best_config_trains_to_the_best_score_again(short_sweep, workdir):
    study = study_in(short_sweep)
    best = short_sweep / "sweeps" / "space" / "best.yaml"
    config = yaml.safe_load(best.read_text())
    assert config["seed_everything"] == study.best_params["seed_everything"]
    cli = main(["fit", f"--config={best}"])
    score = float(cli.trainer.checkpoint_callback.best_model_score)
    assert score == pytest.approx(study.best_value, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_stopped_sweep_continues_its_study(workdir, stop):
    """Stopped in its second trial, one epoch in: the same command keeps the first trial,
    marks the second FAIL and runs its flags again, continuing its run to its last epoch."""
    space = write_space(workdir, SPACE)
    args = ("sweep", f"--space={space}", "--trials=2", "--", "--trainer.max_epochs=3", *FEW_BATCHES)
    args += (INSTRUMENTS,)
    marker = workdir / "paused"
    pause = {"INSTRUMENTS_PAUSE_EPOCH": "1", "INSTRUMENTS_PAUSE_FIT": "1"}
    first = fork_cli(*args, cwd=workdir, env={**pause, "INSTRUMENTS_PAUSE_MARKER": str(marker)})
    wait_for(marker, first)
    first.send_signal(stop)
    assert first.wait() == (-stop if stop == signal.SIGKILL else 143)
    before = study_in(workdir).get_trials()
    if stop == signal.SIGKILL:  # nothing had the time to tell the study
        assert [t.state for t in before] == [COMPLETE, RUNNING]
        resumed_from = "last.ckpt"
    else:
        assert [t.state for t in before] == [COMPLETE, FAIL, TrialState.WAITING]
        resumed_from = "interrupted.ckpt"

    second = run_forked(*args, cwd=workdir)
    kept, stopped, again = study_in(workdir).get_trials()
    assert (kept.state, stopped.state, again.state) == (COMPLETE, FAIL, COMPLETE)
    assert (kept.value, kept.datetime_complete) == (before[0].value, before[0].datetime_complete)
    assert again.params == stopped.params and again.system_attrs["retry_history"] == [1]
    run = stopped.user_attrs["run"]
    assert again.user_attrs["run"] == run
    assert f"Resuming from {run}/checkpoints/{resumed_from}" in second.stderr
    # Its first epoch's value, from the stopped trial; then its own, up to its last epoch
    # (a stop after the last batch of an epoch leaves that epoch without a validation).
    assert again.intermediate_values[0] == stopped.intermediate_values[0]
    assert max(again.intermediate_values) == 2
    if stop == signal.SIGKILL:
        assert "trial 1 marked FAIL: its process" in second.stdout


@pytest.mark.slow
def test_two_workers_share_one_sqlite_study(workdir):
    """Two worker processes on one SQLite file: every trial is run by one of them, in a run
    of its own, and recorded complete; none is lost or left running."""
    space = write_space(workdir, SPACE)
    run_forked(
        "sweep",
        f"--space={space}",
        "--workers=2",
        "--trials=4",
        "--pruner=none",
        "--",
        "--trainer.max_epochs=1",
        *FEW_BATCHES,
        cwd=workdir,
    )
    trials = study_in(workdir).get_trials()
    assert len(trials) >= 4 and all(t.state == COMPLETE for t in trials), trials
    assert {t.user_attrs["worker"] for t in trials} == {0, 1}
    assert len({t.user_attrs["process"]["pid"] for t in trials}) == 2
    runs = [t.user_attrs["run"] for t in trials]
    assert len(set(runs)) == len(trials)
    assert all((workdir / run / "config.yaml").is_file() for run in runs)
    assert all(len(t.intermediate_values) == 1 for t in trials)  # MONITOR, reported once


@pytest.mark.slow
def test_a_sweep_trains_a_model_whose_epoch_is_one_batch(workdir):
    """The tests' space holds for any model: with a batch as large as the training split,
    every epoch is one batch, and a two-trial sweep completes."""
    samples = loader_length(configured(), "train")
    run_forked(
        "sweep",
        f"--space={write_space(workdir, SPACE)}",
        "--trials=2",
        "--pruner=none",
        "--",
        "--trainer.max_epochs=2",
        f"--data.batch_size={samples}",
        *FEW_BATCHES,
        cwd=workdir,
    )
    trials = study_in(workdir).get_trials()
    assert [t.state for t in trials] == [COMPLETE, COMPLETE]
    for trial in trials:  # two epochs, one batch each
        last = load_checkpoint(workdir / trial.user_attrs["run"] / "checkpoints" / "last.ckpt")
        assert (last["epoch"], batches_of(last)) == (1, 2)
