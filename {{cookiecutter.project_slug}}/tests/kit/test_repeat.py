"""`repeat`: one fit over several seeds or folds, and the mean, standard deviation and
confidence interval of its metric; folds of a split DataModule.

Kit test: the runs train whatever model and data `project.py` names, one short epoch
each, and read the metric and its direction from project.py. Folds need a DataModule
that takes `fold` and `folds`: the project's own, or, where it does not pass them on to
SplitDataModule, a subclass of it made here that does.
"""

import csv
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from lightning.pytorch import LightningDataModule
from optuna.trial import TrialState
from support import PACKAGE, PROJECT, cli_env, run_forked
from torch.utils.data import ConcatDataset, Dataset, TensorDataset

from {{ cookiecutter.package_name }}.kit.data import SplitDataModule, fold_splits, split_dataset
from {{ cookiecutter.package_name }}.kit.repeat import main as repeat
from {{ cookiecutter.package_name }}.kit.repeat import parse, summary, t_quantile, takes_folds
from {{ cookiecutter.package_name }}.kit.spec import init_parameters

# One short epoch a run: the repeat is under test here, not the model.
SHORT = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.num_sanity_val_steps=0",
]
# Student's t, the 0.975 quantile by degrees of freedom (30 digits from mpmath, rounded).
T_975 = {1: 12.706204736174704, 2: 4.302652729749464, 4: 2.7764451051977943}
SUMMARY = re.compile(
    r"(?P<monitor>\S+) over (?P<n>\d+) (?P<kind>seeds|folds): (?P<mean>\S+) ± (?P<sd>\S+)"
    r" \(mean ± sd\), 95% CI \[(?P<low>\S+), (?P<high>\S+)\]"
)


class FoldingData(PROJECT.datamodule):
    """The project's DataModule, taking `fold` and `folds` (SplitDataModule reads them
    from the hyperparameters) for a project whose own does not pass them on."""

    def __init__(self, fold: int = 0, folds: int = 1, **kwargs):
        super().__init__(**kwargs)


def folding_project():
    """The project, with a DataModule that can be cut into folds."""
    if takes_folds(PROJECT.datamodule):
        return PROJECT
    if not issubclass(PROJECT.datamodule, SplitDataModule):
        pytest.skip(f"{PROJECT.datamodule.__name__} takes no fold and folds")
    return replace(PROJECT, datamodule=FoldingData)


class Base:
    def __init__(self, fold: int = 0, folds: int = 1): ...


class PassesThemOn(Base):
    def __init__(self, size: int = 3, **kwargs):
        super().__init__(**kwargs)


class KeepsThem(Base):
    def __init__(self, size: int = 3): ...


def test_a_datamodule_takes_folds_through_its_kwargs():
    assert init_parameters(PassesThemOn) == {"size", "fold", "folds"}
    assert takes_folds(PassesThemOn) and takes_folds(Base) and not takes_folds(KeepsThem)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def study_of(folder: Path, name: str) -> optuna.Study:
    storage = f"sqlite:///{folder / 'repeats' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage)


def assert_summary_is_the_hand_calculation(printed: str, scores: list[float], kind: str):
    """The summary line of `printed` holds the mean, sd and 95% CI of `scores`, each to
    the places it shows."""
    (line,) = [match for match in map(SUMMARY.fullmatch, printed.splitlines()) if match]
    n = len(scores)
    mean = sum(scores) / n
    sd = math.sqrt(sum((score - mean) ** 2 for score in scores) / (n - 1))
    half = T_975[n - 1] * sd / math.sqrt(n)
    assert (line["monitor"], int(line["n"]), line["kind"]) == (PROJECT.monitor, n, kind)
    expected = {"mean": mean, "sd": sd, "low": mean - half, "high": mean + half}
    for name, value in expected.items():
        shown = line[name]
        assert abs(float(shown) - value) <= 0.5 * 10.0 ** -len(shown.split(".")[1]) + 1e-12


def test_the_t_quantile_is_exact():
    for df, value in T_975.items():
        assert t_quantile(0.975, df) == pytest.approx(value, rel=1e-13)
    assert t_quantile(0.995, 1) == pytest.approx(math.tan(math.pi * 0.495), rel=1e-13)
    assert t_quantile(0.975, 1000) == pytest.approx(1.9623390808264085, rel=1e-13)


def test_the_summary_line_is_mean_sd_and_confidence_interval():
    assert summary("val/acc", "seeds", [0.90, 0.92, 0.91], 3) == (
        "val/acc over 3 seeds: 0.9100 ± 0.0100 (mean ± sd), 95% CI [0.8852, 0.9348]"
    )
    assert summary("val/loss", "folds", [0.0123, 0.0125], 3) == (
        "val/loss over 2 of 3 folds (the others did not complete): 0.01240 ± 0.00014"
        " (mean ± sd), 95% CI [0.01113, 0.01367]"
    )
    assert summary("val/acc", "seeds", [0.5], 2).endswith(": 0.5 (no spread: one run)")
    assert summary("val/loss", "seeds", [0.5, math.inf], 2).endswith(
        ": 0.5, inf (no spread: not finite)"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds=1"], "--seeds must be at least 2"),
        (["--seeds=3", "--folds=3"], "not allowed with argument"),
        (["--seeds=3", "--", "--seed_everything=7"], "--seed_everything is what --seeds sets"),
        (["--folds=3", "--", "--data.folds", "4"], "--data.folds is what --folds sets"),
    ],
)
def test_repeat_options_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as refused:
        parse(argv)
    assert refused.value.code == 2 and message in capsys.readouterr().err
    options, fit_args = parse(["--folds", "4", "--workers=2", "--", "--trainer.max_epochs", "3"])
    assert (options.folds, options.seeds, options.workers) == (4, None, 2)
    assert fit_args == ["--trainer.max_epochs", "3"]


class Numbers(Dataset):
    """The numbers start to stop, read one at a time (no tensors to slice)."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int) -> int:
        return self.start + index


def numbers_in(dataset: Dataset) -> list[int]:
    return sorted(dataset[index] for index in range(len(dataset)))


@pytest.mark.parametrize("one_dataset", [True, False], ids=["subsets", "any-datasets"])
def test_the_folds_partition_train_and_val(one_dataset):
    if one_dataset:  # as split_dataset makes them: subsets of one dataset
        splits = split_dataset(Numbers(0, 23), [15, 4, 4], seed=0)
    else:
        splits = {"train": Numbers(0, 16), "val": Numbers(16, 23), "test": Numbers(23, 27)}
    pool = numbers_in(ConcatDataset([splits["train"], splits["val"]]))
    validated = []
    for fold in range(4):
        folded = fold_splits(splits, fold, 4, seed=7)
        train, val = numbers_in(folded["train"]), numbers_in(folded["val"])
        assert sorted(train + val) == pool and not set(train) & set(val)
        assert len(val) in (len(pool) // 4, len(pool) // 4 + 1)
        assert folded["test"] is splits["test"]
        assert numbers_in(fold_splits(splits, fold, 4, seed=7)["val"]) == val  # each time
        validated += val
    assert sorted(validated) == pool  # each sample validated on once
    assert fold_splits(splits, 0, 1, seed=7) is splits  # one fold: the splits as they are


class Counting(SplitDataModule):
    """Sample i is the number i, in tensors; 70/15/15."""

    def make_splits(self) -> dict[str, Dataset]:
        dataset = TensorDataset(torch.arange(40.0).unsqueeze(1))
        return split_dataset(dataset, [28, 6, 6], self.hparams.split_seed)


def test_a_split_datamodule_validates_on_each_fold_once():
    def values(module: SplitDataModule, split: str) -> set[int]:
        return {int(v) for v in module.splits[split].tensors[0].flatten()}

    unfolded = Counting()
    unfolded.setup()
    assert len(unfolded.splits["val"]) == 6  # folds=1: the splits of make_splits
    validated = []
    for fold in range(3):
        module = Counting(fold=fold, folds=3)
        module.setup()
        assert values(module, "test") == values(unfolded, "test")
        assert values(module, "train") | values(module, "val") == set(range(40)) - values(
            module, "test"
        )
        validated += values(module, "val")
    assert sorted(validated) == sorted(set(range(40)) - values(unfolded, "test"))


@pytest.mark.parametrize(
    ("fold", "folds", "message"),
    [
        (3, 3, r"data.fold=3: must be one of the data.folds=3 folds, 0 to 2"),
        (-1, 5, r"data.fold=-1: must be one of the data.folds=5 folds, 0 to 4"),
        (1, 1, r"data.fold=1: must be one of the data.folds=1 folds, 0 to 0"),
        (0, 0, r"data.folds=0: must be 1 or more"),
    ],
)
def test_a_bad_fold_is_refused_by_value(fold, folds, message):
    with pytest.raises(ValueError, match=message):
        Counting(fold=fold, folds=folds)


class Unsplittable(LightningDataModule):
    def __init__(self, batch_size: int = 8):
        super().__init__()


def test_folds_of_a_datamodule_that_cannot_split_are_refused_in_one_line(workdir, capsys):
    assert repeat(["--folds=3", "--", *SHORT], replace(PROJECT, datamodule=Unsplittable)) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and len(printed.err.splitlines()) == 1
    assert "Unsplittable.__init__ takes no `fold` and `folds`" in printed.err
    assert not any(workdir.iterdir())  # nothing written


@pytest.mark.slow
def test_a_three_seed_repeat_reports_the_spread_of_its_runs(workdir):
    result = run_forked("repeat", "--seeds=3", "--", *SHORT, cwd=workdir)
    rows = read_csv(workdir / "repeats" / "seeds-3" / "repeat.csv")
    trials = study_of(workdir, "seeds-3").get_trials()
    assert [row["seed_everything"] for row in rows] == ["0", "1", "2"]
    assert len(trials) == 3 and all(t.state == TrialState.COMPLETE for t in trials)
    by_seed = {t.params["seed_everything"]: t for t in trials}
    for row in rows:  # each run's score, as the study has it, and its own run directory
        trial = by_seed[int(row["seed_everything"])]
        assert float(row[PROJECT.monitor]) == trial.value and row["run"] == trial.user_attrs["run"]
        config = yaml.safe_load((workdir / row["run"] / "config.yaml").read_text())
        assert config["seed_everything"] == int(row["seed_everything"])
    assert len({row["run"] for row in rows}) == 3
    scores = [float(row[PROJECT.monitor]) for row in rows]
    assert_summary_is_the_hand_calculation(result.stdout, scores, "seeds")
    assert result.stdout.rstrip().splitlines()[-1].startswith(f"{PROJECT.monitor} over 3 seeds")


@pytest.mark.slow
def test_a_three_fold_repeat_validates_on_each_fold(workdir, capsys):
    assert repeat(["--folds=3", "--", *SHORT], folding_project()) == 0
    printed = capsys.readouterr().out
    rows = read_csv(workdir / "repeats" / "folds-3" / "repeat.csv")
    assert [row["data.fold"] for row in rows] == ["0", "1", "2"]
    assert {row["state"] for row in rows} == {"COMPLETE"}
    for row in rows:  # every run given the folds, and its own
        config = yaml.safe_load((workdir / row["run"] / "config.yaml").read_text())
        assert (config["data"]["fold"], config["data"]["folds"]) == (int(row["data.fold"]), 3)
    scores = [float(row[PROJECT.monitor]) for row in rows]
    assert_summary_is_the_hand_calculation(printed, scores, "folds")


def wait_until(done, process: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if process.poll() is not None:
            raise AssertionError(f"the repeat ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.1)


@pytest.mark.slow
def test_a_killed_repeat_continues_and_never_redoes_a_finished_run(workdir):
    """Two workers, three seeds of two epochs: the process group is killed while the
    third run waits at its second epoch, the first two finished. The same command again
    continues the third from its last checkpoint, and keeps the other two."""
    args = ["repeat", "--seeds=3", "--workers=2", "--", *SHORT, "--trainer.max_epochs=2"]
    args.append("--trainer.callbacks+=instruments.Instruments")
    marker = workdir / "paused"
    pause = {"INSTRUMENTS_PAUSE_EPOCH": "1", "INSTRUMENTS_PAUSE_FIT": "1"}
    with open(workdir / "first.txt", "w") as output:
        first = subprocess.Popen(
            [sys.executable, "-m", PACKAGE, *args],
            cwd=workdir,
            env=cli_env({**pause, "INSTRUMENTS_PAUSE_MARKER": str(marker)}),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the repeat and its workers
        )
    try:
        wait_until(marker.exists, first, "third run's pause")

        def finished() -> list:
            trials = study_of(workdir, "seeds-3").get_trials()
            return [t for t in trials if t.state == TrialState.COMPLETE]

        wait_until(lambda: len(finished()) == 2, first, "two finished runs")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = {t.number: t for t in study_of(workdir, "seeds-3").get_trials()}
    (stopped,) = [t for t in before.values() if t.state == TrialState.RUNNING]

    second = run_forked(*args, cwd=workdir)
    trials = study_of(workdir, "seeds-3").get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.params["seed_everything"] for t in complete) == [0, 1, 2]
    for trial in before.values():  # the finished runs kept as they were
        if trial.state == TrialState.COMPLETE:
            kept = trials[trial.number]
            assert (kept.value, kept.datetime_complete) == (trial.value, trial.datetime_complete)
    (again,) = [t for t in complete if t.number not in before]
    assert trials[stopped.number].state == TrialState.FAIL
    assert again.params == stopped.params and again.system_attrs["retry_history"] == [
        stopped.number
    ]
    run = stopped.user_attrs["run"]
    assert again.user_attrs["run"] == run
    assert f"Resuming from {run}/checkpoints/last.ckpt" in second.stderr
    assert again.intermediate_values[0] == stopped.intermediate_values[0]
    rows = read_csv(workdir / "repeats" / "seeds-3" / "repeat.csv")
    assert [(row["seed_everything"], row["state"]) for row in rows] == [
        (str(seed), "COMPLETE") for seed in range(3)
    ]
    assert len({row["run"] for row in rows}) == 3
