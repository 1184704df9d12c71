"""`<command> repeat`: the same `fit` over several seeds or folds, and the spread of its metric.

    <command> repeat --seeds 5                             # seed_everything 0 to 4
    <command> repeat --folds 5 -- --trainer.max_epochs 10  # 5-fold cross-validation
    <command> repeat --seeds 8 --workers 4                 # 4 runs at once on this machine

A repeat is a sweep (sweep.py) whose space is fixed: Optuna's grid sampler over
`seed_everything` 0..N-1, or over `data.fold` 0..K-1 with `--data.folds K`
given to every run; nothing is pruned. So each run is a real `fit` in a run
directory of its own under `repeats/<study>/`, `--workers` and `--storage` are
the sweep's, and a repeat that was stopped or killed continues where it stopped
when the same command runs again, never redoing a finished run.

A run's score is the best value of the project's monitored metric (`monitor`
of the Project, better as its `mode` says), as a sweep's trial scores. At the
end it prints each run's score and run directory, writes them to
`repeats/<study>/repeat.csv`, and prints their mean, sample standard deviation
and 95 % confidence interval (Student's t) in one line.
"""

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .spec import init_parameters
from .stopping import SweepError
from .sweep import Sweep, TrialFailed, optuna_missing, retried, run, shown, table

if TYPE_CHECKING:  # (importing it would import torch: `repeat --help` answers without)
    from .spec import Project

REPEATS = Path("repeats")
# What each kind of repeat varies, and the flag of fit it sets.
VARIED = {"seeds": "seed_everything", "folds": "data.fold"}
CONFIDENCE = 0.95


def parser(command: str = "<command>") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{command} repeat",
        description="The same fit over several seeds or folds: the monitored metric of"
        " project.py (Project.monitor) as mean, sample standard deviation and 95% confidence"
        " interval, each run's score and run directory in repeat.csv.",
        epilog="Flags after `--` (and any flag not listed above) go to every run's `fit`,"
        " e.g. `-- --config configs/gpu.yaml --trainer.max_epochs 10`. Each run is a trial of"
        " an Optuna study, as `sweep`'s are: run the same command again to continue it.",
        allow_abbrev=False,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--seeds", type=int, metavar="N", help="N runs, with seed_everything 0 to N-1"
    )
    which.add_argument(
        "--folds",
        type=int,
        metavar="K",
        help="K runs, one a fold: train and val pooled and cut into K folds (--data.folds K),"
        " each run validating on one of them (--data.fold 0 to K-1)",
    )
    parser.add_argument(
        "--study",
        help="the study's name (default: seeds-N or folds-K); its runs go in repeats/<study>/",
    )
    parser.add_argument(
        "--storage",
        help="where the study lives, as for sweep: an Optuna storage URL or a journal file"
        " (default: sqlite:///repeats/<study>/study.db)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs at once on this machine, each in its own process with its own GPU (or"
        " share of the CPUs) (default: %(default)s)",
    )
    return parser


def parse(argv: list[str], command: str = "<command>") -> tuple[argparse.Namespace, list[str]]:
    """The repeat's own options, and the flags that go to every run's fit."""
    options, fit_args = parser(command).parse_known_args(argv)
    if "--" in fit_args:  # (where argparse leaves it depends on the Python version)
        fit_args.remove("--")
    kind = "seeds" if options.seeds is not None else "folds"
    problems = []
    if getattr(options, kind) < 2:
        problems.append(f"--{kind} must be at least 2 (a spread needs two runs)")
    if options.workers < 1:
        problems.append("--workers must be at least 1")
    own = [VARIED[kind]] + (["data.folds"] if kind == "folds" else [])
    for flag in own:
        if any(arg == f"--{flag}" or arg.startswith(f"--{flag}=") for arg in fit_args):
            problems.append(f"--{flag} is what --{kind} sets for each run: leave it out")
    if problems:
        parser(command).error("; ".join(problems))
    return options, fit_args


def takes_folds(datamodule: type) -> bool:
    """Whether a DataModule class can be cut into folds: its __init__ takes fold and folds."""
    return {"fold", "folds"} <= init_parameters(datamodule)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p above 0.5) of Student's t with `df` degrees of freedom.

    Neither torch (its StudentT has no icdf), numpy, statistics nor Optuna has
    it, and scipy is no dependency of the project; for whole degrees of freedom
    the distribution function has a closed form (Abramowitz & Stegun 26.7.3-4),
    inverted here by bisection to the last bit.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile(p={p}, df={df}): needs 0.5 < p < 1 and df >= 1")

    def central(t: float) -> float:  # P(|T| < t)
        theta = math.atan(t / math.sqrt(df))
        sin, cos2 = math.sin(theta), math.cos(theta) ** 2
        if df % 2 == 0:
            term = total = 1.0
            for k in range(1, df // 2):
                term *= cos2 * (2 * k - 1) / (2 * k)
                total += term
            return sin * total
        term = total = math.cos(theta)
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + (sin * total if df > 1 else 0.0))

    target, low, high = 2 * p - 1, 0.0, 1.0
    while central(high) < target:
        high *= 2
    while True:
        middle = (low + high) / 2
        if middle in (low, high):
            return high
        low, high = (middle, high) if central(middle) < target else (low, middle)


def spread(scores: list[float]) -> tuple[float, float, float, float]:
    """(mean, sample standard deviation, and the confidence interval's ends) of 2+ scores."""
    mean, sd = statistics.mean(scores), statistics.stdev(scores)
    half = t_quantile((1 + CONFIDENCE) / 2, len(scores) - 1) * sd / math.sqrt(len(scores))
    return mean, sd, mean - half, mean + half


def summary(monitor: str, kind: str, scores: list[float], asked: int) -> str:
    """The one line a README quotes: the metric's mean, sd and confidence interval."""
    over = f"{monitor} over {len(scores)} {kind}"
    if len(scores) < asked:
        over = f"{monitor} over {len(scores)} of {asked} {kind} (the others did not complete)"
    if not scores:
        return f"{over}: no score"
    if len(scores) == 1 or not all(map(math.isfinite, scores)):
        values = ", ".join(f"{score:.6g}" for score in scores)
        return f"{over}: {values} (no spread: {'one run' if len(scores) == 1 else 'not finite'})"
    mean, sd, low, high = spread(scores)
    # Two significant digits of the sd, and the mean to the same place (at least 4 decimals).
    places = 4 if sd == 0 else min(12, max(4, 1 - math.floor(math.log10(sd))))
    return (
        f"{over}: {mean:.{places}f} ± {sd:.{places}f} (mean ± sd),"
        f" {CONFIDENCE * 100:.0f}% CI [{low:.{places}f}, {high:.{places}f}]"
    )


class Repeat(Sweep):
    """A study of one fit over fixed seeds or folds: the sweep's machinery, a fixed grid."""

    label = "repeat"
    root = REPEATS

    def __init__(
        self, options: argparse.Namespace, fit_args: list[str], project: "Project"
    ) -> None:
        from optuna.distributions import CategoricalDistribution

        self.kind = "seeds" if options.seeds is not None else "folds"
        self.count = getattr(options, self.kind)
        self.flag = VARIED[self.kind]
        study = argparse.Namespace(
            space=None,
            trials=self.count,
            study=options.study or f"{self.kind}-{self.count}",
            storage=options.storage,
            workers=options.workers,
            sampler="grid",
            seed=0,
            pruner="none",
            warmup_epochs=0,
            threshold=None,
        )
        given = [f"--data.folds={self.count}"] if self.kind == "folds" else []
        space = {self.flag: CategoricalDistribution(list(range(self.count)))}
        super().__init__(study, [*fit_args, *given], project, space=space)

    def record_setup(self, study) -> None:
        """A study run with other flags holds other runs: refuse it, rather than mix them."""
        changed = self.setup_changes(study)
        if changed:
            names = {"monitor": "metric", "fit_args": "flags after --", "space": "seeds or folds"}
            before = " ".join(study.user_attrs.get("fit_args", [])) or "none"
            raise SweepError(
                f"the study '{self.name}' in {shown(self.storage_url)} holds runs with other"
                f" {' and '.join(names[key] for key in changed)} (its flags: {before}): no"
                " repeats of this command's; name a study for these with --study"
            )

    def objective(self, trial) -> float:
        """A run's fit; none for a trial beyond the repeat's runs, which two workers that
        finished at the same moment may both have started (it ends FAIL, not run)."""
        counted = trial.study.get_trials(deepcopy=False, states=self.counted())
        if sum(t.number < trial.number for t in counted) >= self.count:
            trial.set_user_attr("surplus", True)
            self.say(f"trial {trial.number}: not run, every run of the repeat has started")
            raise TrialFailed("every run of the repeat has started")
        return super().objective(trial)

    def announce(self, done: int) -> str:
        return (
            f"{self.count} {self.kind} ({self.flag} 0 to {self.count - 1}) of fit, scored by"
            f" {self.monitor} ({self.direction}): {done} run(s) finished; study"
            f" '{self.name}' in {shown(self.storage_url)}, {self.options.workers} worker(s);"
            f" runs in {self.folder}/"
        )

    def runs(self, study) -> list:
        """(seed or fold, its run's trial) for each tried: the trial that completed, else
        the last that tried."""
        from optuna.trial import TrialState

        trials = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("surplus")]
        runs = []
        for value in range(self.count):
            tried = [t for t in trials if t.params.get(self.flag) == value]
            done = [t for t in tried if t.state == TrialState.COMPLETE]
            if tried:
                runs.append((value, (done or tried)[-1]))
        return runs

    def report(self, study) -> bool:
        """Each run's score and directory (printed, and in repeat.csv), then the spread of
        the scores in one line; whether every run completed."""
        from optuna.trial import TrialState

        runs = self.runs(study)
        header = [self.flag, self.monitor, "state", "epochs", "trial", "run"]
        shown_rows = [[*row(value, trial, digits=6), note(trial)] for value, trial in runs]
        print(table([*header, "note"], shown_rows))
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "repeat.csv"
        with open(path, "w", newline="") as file:
            csv.writer(file).writerows([header, *(row(value, trial) for value, trial in runs)])
        self.say(f"each run's score and run directory: {path}")
        scores = [trial.value for _, trial in runs if trial.state == TrialState.COMPLETE]
        print(summary(self.monitor, self.kind, scores, self.count), flush=True)
        return len(scores) == self.count


def row(value: int, trial, digits: int | None = None) -> list[str]:
    """A run: its seed or fold, score (every digit, or `digits`), state, epochs, trial, run."""
    score = "" if trial.value is None else repr(trial.value)
    if digits and trial.value is not None:
        score = f"{trial.value:.{digits}g}"
    return [
        str(value),
        score,
        trial.state.name,
        str(len(trial.intermediate_values)),
        str(trial.number),
        str(trial.user_attrs.get("run", "")),
    ]


def note(trial) -> str:
    return f"#{trial.system_attrs['retry_history'][-1]} continued" if retried(trial) else ""


def main(argv: list[str] | None, project: "Project") -> int:
    """The repeat command; returns the exit code (2: a bad option, or folds the project's
    DataModule cannot make; 1: a run did not complete; 130/143: stopped)."""
    options, fit_args = parse(sys.argv[1:] if argv is None else argv, project.command)
    if options.folds is not None and not takes_folds(project.datamodule):
        print(
            f"error: repeat --folds: {project.datamodule.__name__}.__init__ takes no `fold` and"
            " `folds`, so its data cannot be cut into folds (subclass kit.data.SplitDataModule"
            " and pass both on to it)",
            file=sys.stderr,
        )
        return 2
    if optuna_missing("repeat"):
        return 2
    return run(lambda: Repeat(options, fit_args, project))
