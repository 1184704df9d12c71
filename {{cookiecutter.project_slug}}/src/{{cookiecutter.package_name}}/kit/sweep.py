"""`<command> sweep`: an Optuna study over any flags of `fit`.

    <command> sweep                          # configs/sweep.yaml, 20 trials
    <command> sweep --trials 50 --workers 4  # 4 trials at once on this machine
    <command> sweep --storage postgresql://user:secret@db-host/sweeps
    <command> sweep --trials 30 -- --config configs/gpu.yaml --trainer.max_epochs 10

The search space is a YAML file (`--space`): each flag of `fit` with its
distribution. Each trial is a real `fit`, with the flags after `--` and then
the trial's own, in a run directory of its own under `sweeps/<study>/`. After
every validation it reports the project's monitored metric (`monitor` of the
Project, better as its `mode` says) to the study, and Optuna's Lightning
callback stops a trial that the pruner finds unpromising. A trial's score is
the best value of the metric, the one its best checkpoint was kept for.

The study lives in its storage (by default the SQLite file
`sweeps/<study>/study.db`). `--trials` counts the study's finished trials,
whoever ran them: the same command again continues the study, and the same
command on several machines sharing one storage divides the work. Each worker
runs Optuna's `study.optimize`, with its heartbeat: a trial whose process died
(SIGKILL, a lost node) is marked FAIL and Optuna's retry callback queues its
flags again, continuing its run from its last checkpoint; so is a trial that
SIGTERM or Ctrl-C stopped.

At the end it prints a table of the trials and writes, in the study's
directory: `best.yaml` (the best trial's whole config: `fit --config` it to
train the same model again), `trials.csv`, `history.png` and `importance.png`.
"""

import argparse
import csv
import math
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .stopping import STOP, Interrupted, SweepError, on_signal

if TYPE_CHECKING:  # (importing it would import torch: `sweep --help` answers without)
    from .spec import Project

DEFAULT_SPACE = Path("configs/sweep.yaml")
SWEEPS = Path("sweeps")
SAMPLERS = ("tpe", "random", "qmc", "grid")
PRUNERS = ("median", "hyperband", "threshold", "none")
# Optuna's heartbeat: each running trial's worker beats every HEARTBEAT_S, and a
# trial not heard from for GRACE_S is marked FAIL (on any machine). One of this
# machine is failed as soon as its process is gone.
HEARTBEAT_S = 30
GRACE_S = 300
# What every trial's fit gets first (the flags after -- can set them back): one
# line per trial from the sweep instead of a progress bar and a model summary.
TRIAL_DEFAULTS = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--fit_result.enabled=false",
]
# How often the flags of a killed or stopped trial are tried again.
RETRIES = 2
# A worker stops after this many trials in a row failed with an error.
FAILURES_IN_A_ROW = 3


def parser(command: str = "<command>") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{command} sweep",
        description="An Optuna study over flags of `fit`: each trial a real fit, the metric"
        " and its direction from project.py (Project.monitor, .mode), unpromising trials pruned.",
        epilog="Flags after `--` (and any flag not listed above) go to every trial's `fit`,"
        " e.g. `-- --config configs/gpu.yaml --trainer.max_epochs 10`. Run the same command"
        " again to continue the study; run it on several machines with one --storage to share"
        " it.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--space",
        type=Path,
        default=None,
        help="YAML file: each flag of fit with its distribution (default: the project's"
        f" {DEFAULT_SPACE}, beside the configs fit reads first)",
    )
    parser.add_argument(
        "--trials",
        type=int,
        default=20,
        help="finished trials (complete or pruned) the study should have, whoever ran them:"
        " every worker, machine and rerun counts toward it (default: %(default)s)",
    )
    parser.add_argument(
        "--study", help="the study's name (default: the space file's name, e.g. 'sweep')"
    )
    parser.add_argument(
        "--storage",
        help="where the study lives: an Optuna storage URL (sqlite:///file.db,"
        " postgresql://..., mysql+pymysql://...) or the path of a journal file on a shared"
        " filesystem (default: sqlite:///sweeps/<study>/study.db)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="trials at once on this machine, each in its own process with its own GPU (or"
        " share of the CPUs) (default: %(default)s)",
    )
    parser.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default="tpe",
        help="how the next trial's flags are chosen; grid: every combination of categorical"
        " and stepped values (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="the sampler's seed (worker i takes seed + i); none by default, so that machines"
        " sharing a study do not sample the same flags (the grid's order, which they must"
        " share, is drawn from it in every worker, or from 0)",
    )
    parser.add_argument(
        "--pruner",
        choices=PRUNERS,
        default="median",
        help="median: stop a trial worse than the median of earlier trials at the same"
        " epoch (after 5 trials); hyperband; threshold: stop a trial worse than --threshold;"
        " none (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup_epochs",
        "--warmup-epochs",
        type=int,
        default=1,
        help="validations every trial gets before the pruner may stop it (default: %(default)s)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        help="for --pruner threshold: the value of the metric a trial must reach (or beat)",
    )
    return parser


def parse(argv: list[str], command: str = "<command>") -> tuple[argparse.Namespace, list[str]]:
    """The sweep's own options, and the flags that go to every trial's fit."""
    options, fit_args = parser(command).parse_known_args(argv)
    if "--" in fit_args:  # (where argparse leaves it depends on the Python version)
        fit_args.remove("--")
    problems = []
    if options.trials < 1:
        problems.append("--trials must be at least 1")
    if options.workers < 1:
        problems.append("--workers must be at least 1")
    if options.warmup_epochs < 0:
        problems.append("--warmup_epochs cannot be negative")
    if (options.pruner == "threshold") != (options.threshold is not None):
        problems.append("--threshold goes with --pruner threshold, and that pruner needs it")
    if problems:
        parser(command).error("; ".join(problems))
    return options, fit_args


# The search space ------------------------------------------------------------

SETTINGS = {
    "float": {"low", "high", "log", "step"},
    "int": {"low", "high", "log", "step"},
    "categorical": {"choices"},
}


def read_space(path: Path) -> dict[str, Any]:
    """The distributions of a space file: {flag without its dashes: optuna distribution}."""
    import yaml
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    try:
        entries = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SweepError(f"cannot read the search space {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise SweepError(f"{path} is not valid YAML: {error}") from error
    if not isinstance(entries, dict) or not entries:
        raise SweepError(f"{path}: expected each flag of fit with its distribution, found none")
    space = {}
    for flag, spec in entries.items():
        name = str(flag).lstrip("-")
        where = f"{path}, {name}"
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind not in SETTINGS:
            raise SweepError(f"{where}: needs `type:` float, int or categorical, and its settings")
        unknown = set(spec) - SETTINGS[kind] - {"type"}
        if unknown:
            allowed = ", ".join(sorted(SETTINGS[kind]))
            raise SweepError(
                f"{where}: unknown {', '.join(sorted(unknown))} (a {kind} takes {allowed})"
            )
        try:
            if kind == "categorical":
                choices = spec.get("choices")
                if not isinstance(choices, list) or not choices:
                    raise ValueError("`choices:` must be a list of values")
                space[name] = CategoricalDistribution(choices)
            elif kind == "float":
                step = spec.get("step")
                space[name] = FloatDistribution(
                    float(spec["low"]),
                    float(spec["high"]),
                    log=bool(spec.get("log", False)),
                    step=None if step is None else float(step),
                )
            else:
                space[name] = IntDistribution(
                    int(spec["low"]),
                    int(spec["high"]),
                    log=bool(spec.get("log", False)),
                    step=int(spec.get("step", 1)),
                )
        except KeyError as error:
            raise SweepError(f"{where}: a {kind} needs `{error.args[0]}:`") from error
        except (TypeError, ValueError) as error:
            raise SweepError(f"{where}: {error}") from error
    return space


def suggest(trial, space: dict[str, Any]) -> dict[str, Any]:
    """The trial's value of every flag of the space."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    values = {}
    for name, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            values[name] = trial.suggest_categorical(name, dist.choices)
        elif isinstance(dist, FloatDistribution):
            values[name] = trial.suggest_float(
                name, dist.low, dist.high, log=dist.log, step=dist.step
            )
        else:
            values[name] = trial.suggest_int(
                name, dist.low, dist.high, log=dist.log, step=dist.step
            )
    return values


def flag_value(value: Any) -> str:
    """A value as the command line writes it (YAML: true, false, null)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, float) else str(value)


def fsdp_requested(fit_args: list[str], defaults: Any, space: dict[str, Any]) -> str | None:
    """What turns FSDP on for the trials, if anything does: a flag, a searched flag, or
    a config file (the project's defaults or a `--config`) that sets fsdp.enabled."""
    import yaml

    words = [part for arg in fit_args for part in arg.split("=", 1)]
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) else ""
        if word == "--fsdp.enabled" and following.lower() in ("true", "1", "yes"):
            return "--fsdp.enabled true"
    files = [defaults] if defaults else []
    files += [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--config"]
    for file in files:
        try:
            loaded = yaml.safe_load(Path(file).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # the fit itself names what is wrong with it
        fsdp = loaded.get("fsdp") if isinstance(loaded, dict) else None
        if isinstance(fsdp, dict) and fsdp.get("enabled") is True:
            return str(file)
    searched = [name for name in space if name.startswith("fsdp.")]
    return f"the searched flag {searched[0]}" if searched else None


def as_flags(values: dict[str, Any]) -> list[str]:
    return [f"--{name}={flag_value(value)}" for name, value in values.items()]


def grid_of(space: dict[str, Any]) -> dict[str, list]:
    """Every value of each flag, for the grid sampler: choices, or stepped ranges."""
    from optuna.distributions import CategoricalDistribution

    grid = {}
    for name, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            grid[name] = list(dist.choices)
        elif dist.step is None or dist.log:
            raise SweepError(
                f"--sampler grid: {name} is a continuous or log-scale range; give it a `step:`"
                " (and no `log:`), or make it categorical"
            )
        else:
            count = int(round((dist.high - dist.low) / dist.step)) + 1
            grid[name] = [dist.low + i * dist.step for i in range(count)]
    return grid


# Storage and study -----------------------------------------------------------


def open_storage(url: str, on_stale):
    """An Optuna storage with heartbeats: a database URL, or a journal file (safe on NFS
    and the like). `on_stale(study, trial)` hears of each trial it marked FAIL as dead."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if "://" not in url:
            Path(url).parent.mkdir(parents=True, exist_ok=True)
            return _storage_classes()[1](JournalFileBackend(url), on_stale)
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            # Workers wait for each other's writes instead of failing with "database is locked".
            engine_kwargs = {"connect_args": dict(timeout=120)}
        else:
            engine_kwargs = {"pool_pre_ping": True}
        database = _storage_classes()[0]
        for attempt in range(3):
            try:
                return database(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=on_stale,
                )
            except ImportError:
                raise
            except Exception:  # several machines creating the tables at once: one wins
                if attempt == 2:
                    raise
                time.sleep(1.0 + attempt)


def _storage_classes():
    """The storages the sweep uses: Optuna's, each failing dead trials at once."""
    from optuna.storages import RDBStorage
    from optuna.storages.journal import JournalStorage
    from optuna.trial import TrialState

    from .internals import optuna_heartbeat, optuna_trial_table

    BaseHeartbeat, TrialModel = optuna_heartbeat(), optuna_trial_table()

    class FailGone:
        # Optuna waits out the grace period even for a process known to be gone
        # (a private method: internals.OVERRIDDEN).
        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            stale = super()._get_stale_trial_ids(study_id)
            for trial in self.get_all_trials(study_id, False, states=(TrialState.RUNNING,)):
                trial_id = self.get_trial_id_from_study_id_trial_number(study_id, trial.number)
                if trial_id not in stale and process_gone(trial):
                    stale.append(trial_id)
            return stale

    class Database(FailGone, RDBStorage):
        def set_trial_state_values(self, trial_id, state, values=None) -> bool:
            # SQLite has no SELECT ... FOR UPDATE: two workers could both read a queued trial
            # WAITING and both run it, or a dead one RUNNING and both queue it again. Here
            # its move takes SQLite's write lock before it reads, as others lock the row.
            if self.engine.dialect.name == "sqlite":
                session = self.scoped_session()  # (the session Optuna's own move goes on in)
                try:
                    session.query(TrialModel).filter(TrialModel.trial_id == trial_id).update(
                        {TrialModel.state: TrialModel.state}, synchronize_session=False
                    )
                except Exception:
                    session.rollback()
                    session.close()
                    raise
            return super().set_trial_state_values(trial_id, state, values)

    class JournalHeartbeat(JournalStorage, BaseHeartbeat):
        # Optuna's journal storage has no heartbeat: this one keeps it in the trial.
        def __init__(self, backend, on_stale) -> None:
            super().__init__(backend)
            self.on_stale = on_stale

        def record_heartbeat(self, trial_id: int) -> None:
            try:
                self.set_trial_system_attr(trial_id, "heartbeat", time.time())
            except Exception:  # finished meanwhile, or the file is busy: the next beat tries
                pass

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            now, stale = time.time(), []
            for trial in self.get_all_trials(study_id, False, states=(TrialState.RUNNING,)):
                # (a trial tried again starts with its failed trial's last beat)
                beat = max(trial.system_attrs.get("heartbeat", 0), trial.datetime_start.timestamp())
                if "heartbeat" in trial.system_attrs and now - beat > GRACE_S:
                    stale.append(
                        self.get_trial_id_from_study_id_trial_number(study_id, trial.number)
                    )
            return stale

        def get_heartbeat_interval(self) -> int:
            return HEARTBEAT_S

        def get_heartbeat_stale_trial_callback(self):
            return self.on_stale

    class Journal(FailGone, JournalHeartbeat):
        pass

    return Database, Journal


def shown(url: str) -> str:
    """A storage URL as it may be printed: its password masked."""
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: opening it will say why
        return url


def close_storage(storage) -> None:
    """Close a database storage's connections (before forking workers, which open their own)."""
    engine = getattr(storage, "engine", None)
    if engine is not None:
        engine.dispose()


def process_start(pid: int) -> str | None:
    """When a process started (Linux: clock ticks since boot), to tell a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: int, started: str | None) -> bool:
    """Whether the process `pid` of this machine, started at `started`, still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    if state in ("Z", "X"):  # killed, not yet reaped
        return False
    return started is None or process_start(pid) in (None, started)


def process_gone(trial) -> bool:
    """Whether `trial` was running on this machine in a process that has ended."""
    owner = trial.user_attrs.get("process")
    # (a trial tried again starts with its failed trial's attributes, which name that trial)
    if not owner or owner["trial"] != trial.number or owner["host"] != socket.gethostname():
        return False
    return not process_alive(owner["pid"], owner["start"])


class TrialFailed(Exception):
    """A trial's fit failed with an error (printed): the study records it FAIL, and goes on."""


class Sweep:
    """One sweep command: its options, its space, its study; what each worker runs."""

    label = "sweep"  # how it signs its lines
    root = SWEEPS  # where its studies' folders go

    def __init__(
        self,
        options: argparse.Namespace,
        fit_args: list[str],
        project: "Project",
        space: dict[str, Any] | None = None,
    ) -> None:
        """`space`: the distributions to search (default: read from `options.space`)."""
        self.project = project
        self.options = options
        self.fit_args = list(fit_args)
        space_file = options.space
        if space_file is None:  # found as fit finds its configs: from the project
            folder = project.defaults.parent if project.defaults else DEFAULT_SPACE.parent
            space_file = folder / DEFAULT_SPACE.name
        self.space = read_space(space_file) if space is None else space
        sharded = fsdp_requested(self.fit_args, project.defaults, self.space)
        if sharded:
            raise SweepError(
                f"{sharded} asks for FSDP: a trial trains in its worker's process on one"
                " device, and FSDP shards over several; sweep without it (a smaller model or"
                " batch), then fit the best config with --config configs/fsdp.yaml"
            )
        self.name = options.study or space_file.stem
        self.folder = self.root / self.name
        self.storage_url = options.storage or f"sqlite:///{(self.folder / 'study.db').as_posix()}"
        if options.sampler == "grid":
            self.grid = grid_of(self.space)
        self.monitor = project.monitor
        self.direction = "maximize" if project.mode == "max" else "minimize"
        self.worker: int | None = None  # set in the process that runs trials
        self.current: int | None = None  # the number of the trial this process runs
        self.failures = 0  # trials of this process in a row that failed with an error
        self.code = 0

    def say(self, line: str) -> None:
        several = self.options.workers > 1 and self.worker is not None
        prefix = f"[{self.label} worker {self.worker}] " if several else f"[{self.label}] "
        print(prefix + line, flush=True)

    def sampler(self):
        import optuna

        seed = None if self.options.seed is None else self.options.seed + (self.worker or 0)
        name = self.options.sampler
        if name == "tpe":
            # constant_liar: workers running side by side do not all sample one spot.
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "qmc":
            return optuna.samplers.QMCSampler(seed=seed)
        # The grid sampler numbers its points in an order drawn from its seed: every worker,
        # on every machine, must draw the same, or two trials get one point and one none.
        return optuna.samplers.GridSampler(self.grid, seed=self.options.seed or 0)

    def pruner(self):
        import optuna

        warmup = self.options.warmup_epochs
        if self.options.pruner == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup)
        if self.options.pruner == "hyperband":
            return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup))
        if self.options.pruner == "threshold":
            bound = self.options.threshold
            if self.direction == "maximize":
                return optuna.pruners.ThresholdPruner(lower=bound, n_warmup_steps=warmup)
            return optuna.pruners.ThresholdPruner(upper=bound, n_warmup_steps=warmup)
        return optuna.pruners.NopPruner()

    def open_study(self):
        """The study (created on first use), and its storage."""
        import optuna

        # The sweep says how each trial went, and prints its errors with their hints.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            storage = open_storage(self.storage_url, self.on_stale)
        except Exception as error:
            raise SweepError(
                f"cannot open the storage {shown(self.storage_url)}:"
                f" {type(error).__name__}: {error}"
            ) from error
        study = optuna.create_study(
            storage=storage,
            study_name=self.name,
            direction="maximize" if self.direction == "maximize" else "minimize",
            sampler=self.sampler(),
            pruner=self.pruner(),
            load_if_exists=True,
        )
        if study.direction.name.lower() != self.direction:
            raise SweepError(
                f"the study '{self.name}' in {shown(self.storage_url)} goes the other way"
                f" ({study.direction.name.lower()}) than {self.monitor} ({self.direction});"
                " pick another --study"
            )
        return study, storage

    def setup_changes(self, study) -> list[str]:
        """Keep what the study measures in it; what a rerun measures otherwise."""
        from optuna.distributions import distribution_to_json

        setup = {
            "monitor": self.monitor,
            "fit_args": self.fit_args,
            "space": {name: distribution_to_json(d) for name, d in self.space.items()},
        }
        if "monitor" not in study.user_attrs:
            for key, value in setup.items():
                study.set_user_attr(key, value)
            return []
        return [key for key, value in setup.items() if study.user_attrs.get(key) != value]

    def record_setup(self, study) -> None:
        """Keep what the study measures in it; say so when a rerun measures otherwise."""
        changed = self.setup_changes(study)
        if changed:
            self.say(
                f"warning: the study '{self.name}' was started with other {', '.join(changed)}"
                " than this command's; its earlier scores may not compare with new ones"
            )

    def announce(self, done: int) -> str:
        """The line that starts the command: the study, and how far it is."""
        options = self.options
        return (
            f"study '{self.name}' in {shown(self.storage_url)}: {self.monitor} ({self.direction}),"
            f" {done} trial(s) finished, up to {options.trials}; sampler {options.sampler},"
            f" pruner {options.pruner}, {options.workers} worker(s); runs in {self.folder}/"
        )

    # One worker ---------------------------------------------------------------

    def work(self, worker: int = 0, study=None) -> int:
        """Run trials until the study has enough; returns the exit code. A worker
        process opens the study itself (its own connection); else pass it."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.study import MaxTrialsCallback

        self.worker = worker
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            if study is None:
                study, _ = self.open_study()
            # RUNNING counts too: workers sharing the study start no more trials than it needs.
            enough = MaxTrialsCallback(self.options.trials, states=self.counted())
            while self.code == 0 and self.wants_more(study):
                try:
                    study.optimize(
                        self.objective, catch=(TrialFailed,), callbacks=[self.after_trial, enough]
                    )
                except UpdateFinishedTrialError as refused:  # another worker took it for dead
                    self.say(f"trial {self.current}: its result could not be recorded: {refused}")
            return self.code
        except Interrupted as stop:
            # (one stopped before Optuna could tell the study is failed as dead on the next run)
            current = self.current
            stopped = None if current is None or study is None else study.get_trials()[current]
            if stopped is not None and stopped.state.name == "FAIL":
                self.retry(study, stopped)
            self.say(
                f"stopped by {stop}: the trial it interrupted is marked FAIL and its flags"
                " will be tried again; run the same command to continue the study"
            )
            return stop.code
        except SweepError as error:
            self.say(f"error: {error}")
            return 1
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @staticmethod
    def counted() -> tuple:
        """The states of the trials that --trials counts."""
        from optuna.trial import TrialState

        return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)

    def wants_more(self, study) -> bool:
        """Whether to start trials; first, mark FAIL the dead ones and queue their flags."""
        import optuna
        from optuna.trial import TrialState

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        if len(study.get_trials(deepcopy=False, states=self.counted())) >= self.options.trials:
            return False
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return True
        if self.options.sampler == "grid" and study.sampler.is_exhausted(study):
            self.say("the grid is done: every combination has been tried")
            return False
        return True

    def on_stale(self, study, trial) -> None:
        """The storage marked `trial` FAIL as dead: say why, and queue its flags again."""
        owner = trial.user_attrs.get("process", {})
        if process_gone(trial):
            why = f"its process ({owner['pid']}) ended"
        else:
            why = f"its worker on {owner.get('host', '?')} was not heard from for {GRACE_S} s"
        self.say(f"trial {trial.number} marked FAIL: {why} before it finished")
        self.retry(study, trial)

    def retry(self, study, trial) -> None:
        """Queue the flags of the failed `trial` again (they did not fail it), continuing
        its run and its reported values; up to RETRIES times."""
        import optuna
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        tried = len(trial.system_attrs.get("retry_history", [])) + 1
        if tried > RETRIES:
            self.say(f"trial {trial.number}: its flags were tried {tried} times; not again")
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            again = RetryHeartbeatStaleTrialCallback(RETRIES, inherit_intermediate_values=True)
        again(study, trial)

    def objective(self, trial) -> float:
        """A trial's fit with its flags (continuing the run of the trial it is tried again
        for, if any); its score."""
        import optuna

        from .hints import explain
        from .trial import fit_trial

        self.current = trial.number
        pid = os.getpid()
        host = socket.gethostname()
        owner = {"host": host, "pid": pid, "start": process_start(pid), "trial": trial.number}
        trial.set_user_attr("process", owner)
        trial.set_user_attr("worker", self.worker)
        flags = as_flags(suggest(trial, self.space))
        frozen = trial.study.get_trials(deepcopy=False)[trial.number]
        history = frozen.system_attrs.get("retry_history", [])
        resume = trial.user_attrs.get("run") if history else None
        again = f" (trial {history[-1]} again, continuing {resume})" if resume else ""
        self.say(f"trial {trial.number}: {' '.join(flags) or '(no flags)'}{again}")
        args = TRIAL_DEFAULTS + self.fit_args + flags
        try:
            return fit_trial(self.project, trial, args, self.folder, resume)
        except (optuna.TrialPruned, Interrupted, SweepError):
            raise
        except Exception as failure:
            traceback.print_exc()
            hint = explain(failure, command=self.project.command)
            if hint:
                print(hint, file=sys.stderr)
            self.say(f"trial {trial.number} failed: {type(failure).__name__}: {failure}")
            raise TrialFailed(str(failure)) from failure

    def after_trial(self, study, trial) -> None:
        """After each trial of this process: say how it went; stop after too many errors."""
        from optuna.trial import TrialState

        self.current = None
        if trial.state != TrialState.FAIL:
            self.failures = 0
            self.say(f"trial {trial.number} {trial.state.name}: {self.describe(trial)}")
        else:
            self.failures += 1
            if self.failures >= FAILURES_IN_A_ROW:
                self.say(f"stopping: {self.failures} trials in a row failed (errors above)")
                self.code = 1
                study.stop()
        if STOP.signum is not None:
            raise Interrupted(STOP.signum)

    def describe(self, trial) -> str:
        value = "-" if trial.value is None else f"{trial.value:.6g}"
        epochs = len(trial.intermediate_values)
        run = trial.user_attrs.get("run", "-")
        return f"{self.monitor}={value} after {epochs} validation(s), run {run}"

    # Several workers ----------------------------------------------------------

    def run_workers(self) -> int:
        """`--workers N`: N processes, each with its own GPU (or share of the CPUs)."""
        workers = self.options.workers
        gpus = visible_gpus()
        shares = cpu_shares(workers)
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        processes = [
            context.Process(
                target=_worker_main,
                args=(self, index, gpus[index % len(gpus)] if gpus else None, shares[index]),
                name=f"sweep-worker-{index}",
            )
            for index in range(workers)
        ]
        if gpus and workers > len(gpus):
            self.say(f"{workers} workers share {len(gpus)} GPU(s)")
        sys.stdout.flush()
        sys.stderr.flush()
        for process in processes:
            process.start()

        def forward(signum, frame) -> None:
            STOP.signum = signum
            if signum == signal.SIGTERM:  # (Ctrl-C reaches every process of the terminal)
                for process in processes:
                    if process.pid is not None and process.exitcode is None:
                        os.kill(process.pid, signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for process in processes:
                while process.exitcode is None:
                    process.join(timeout=1.0)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        # A worker killed by a signal exits -N: as a shell says it, 128 + N.
        exits = [p.exitcode or 0 for p in processes]  # every one has ended: none is None
        codes = [128 - code if code < 0 else code for code in exits]
        stopped = [code for code in codes if code > 128]
        if stopped:
            return stopped[0]
        if STOP.signum is not None:
            return 128 + STOP.signum
        return max(codes, key=abs)

    # The results ----------------------------------------------------------------

    def report(self, study) -> bool:
        """Print the table; write trials.csv, best.yaml and the plots; False if none completed."""
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        names = list(self.space) + sorted(
            {name for t in trials for name in t.params} - set(self.space)
        )
        header = ["#", "state", self.monitor, "epochs", *names, "run", "note"]
        again = {t.system_attrs["retry_history"][-1]: t.number for t in trials if retried(t)}
        rows = [self.row(trial, names, again.get(trial.number)) for trial in trials]
        # (study.trials_dataframe() would do, but needs pandas, which the project does not.)
        print(table(header, rows))
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "trials.csv", "w", newline="") as file:
            csv.writer(file).writerows([header, *rows])
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        self.say(
            f"study '{self.name}' ({shown(self.storage_url)}): {len(complete)} complete,"
            f" {sum(t.state == TrialState.PRUNED for t in trials)} pruned,"
            f" {sum(t.state == TrialState.FAIL for t in trials)} failed; table in"
            f" {self.folder / 'trials.csv'}"
        )
        if not complete:
            self.say("no trial has completed yet: no best config")
            return False
        best = study.best_trial
        path = self.folder / "best.yaml"
        flags = " ".join(as_flags(best.params))
        path.write_text(
            f"# The best trial of the study '{self.name}': #{best.number},"
            f" {self.monitor} = {best.value:.6g} ({self.direction}).\n"
            f"# Its flags: {flags}\n"
            f"# Train it again: {self.project.command} fit --config {path.as_posix()}\n"
            + best.user_attrs.get("config", "")
        )
        self.say(f"best: trial {best.number}, {self.monitor} = {best.value:.6g}: {flags}")
        again = f"{self.project.command} fit --config {path.as_posix()}"
        self.say(f"its config: {path} (train it again: {again})")
        self.plot(study)
        return True

    def row(self, trial, names: list[str], tried_again: int | None) -> list[str]:
        value = "" if trial.value is None else f"{trial.value:.6g}"
        params = [
            "" if name not in trial.params else flag_value(round_float(trial.params[name]))
            for name in names
        ]
        note = []
        if retried(trial):
            note.append(f"#{trial.system_attrs['retry_history'][-1]} again")
        if tried_again is not None:
            note.append(f"tried again as #{tried_again}")
        return [
            str(trial.number),
            trial.state.name,
            value,
            str(len(trial.intermediate_values)),
            *params,
            str(trial.user_attrs.get("run", "")),
            "; ".join(note),
        ]

    def plot(self, study) -> None:
        """history.png and importance.png in the study's directory (needs matplotlib)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            from matplotlib.figure import Figure
            from optuna.visualization import matplotlib as plots
        except ImportError as error:
            self.say(f"no plots: {error} (pip install matplotlib)")
            return
        drawings = {
            "history.png": plots.plot_optimization_history,
            "importance.png": plots.plot_param_importances,
        }
        written = []
        for filename, draw in drawings.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the matplotlib plots are "experimental"
                    axes = draw(study, target_name=self.monitor)
                figure = cast(Figure, axes.figure)  # each plot's own figure
                figure.savefig(self.folder / filename, dpi=120, bbox_inches="tight")
                plt.close(figure)
                written.append(str(self.folder / filename))
            except Exception as error:  # e.g. importance needs two complete trials
                self.say(f"no {filename}: {error}")
        if written:
            self.say(f"plots: {', '.join(written)}")


def retried(trial) -> bool:
    """Whether `trial` runs again the flags of a failed one (Optuna's retry history)."""
    return bool(trial.system_attrs.get("retry_history"))


def round_float(value: Any) -> Any:
    return float(f"{value:.6g}") if isinstance(value, float) and math.isfinite(value) else value


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ["-" * width for width in widths], *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (no CUDA context made)."""
    from lightning.fabric.accelerators.cuda import num_cuda_devices

    count = num_cuda_devices()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [name.strip() for name in listed.split(",")] if listed else []
    return names[:count] if names else [str(index) for index in range(count)]


def cpu_shares(workers: int) -> list[set[int] | None]:
    """Disjoint sets of this process's CPUs, one per worker (None where it cannot be set)."""
    if workers == 1 or not hasattr(os, "sched_getaffinity"):
        return [None] * workers
    cpus = sorted(os.sched_getaffinity(0))
    return [set(cpus[index::workers]) or {cpus[index % len(cpus)]} for index in range(workers)]


def use_devices(gpu: str | None, cpus: set[int] | None) -> None:
    """Confine this process (before it touches CUDA) to one GPU and its share of the CPUs."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    if cpus is not None:
        import torch

        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))


def _worker_main(sweep: Sweep, index: int, gpu: str | None, cpus: set[int] | None) -> None:
    use_devices(gpu, cpus)
    sys.exit(sweep.work(index))


def optuna_missing(command: str) -> bool:
    """Whether Optuna or its Lightning callback is missing (then say how to install them)."""
    try:
        import optuna  # noqa: F401
        import optuna_integration  # noqa: F401
    except ImportError as error:
        print(
            f"error: {command} needs Optuna ({error.name} is missing):"
            ' pip install -e ".[sweep]" (the [dev] extra includes it)',
            file=sys.stderr,
        )
        return True
    return False


def run(make: Callable[[], Sweep]) -> int:
    """Open the study of the sweep `make()` builds, run its workers, report; the exit code."""
    try:
        sweep = make()
        study, storage = sweep.open_study()
        sweep.record_setup(study)
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    done = len([t for t in study.get_trials(deepcopy=False) if t.state.is_finished()])
    sweep.say(sweep.announce(done))
    if sweep.options.workers > 1:
        close_storage(storage)
        code = sweep.run_workers()
    else:
        gpus = visible_gpus()
        if len(gpus) > 1:
            sweep.say(f"each trial runs on one GPU: --workers {len(gpus)} uses all {len(gpus)}")
        use_devices(gpus[0] if gpus else None, None)
        code = sweep.work(study=study)
    completed = sweep.report(study)
    return code if code or completed else 1


def main(argv: list[str] | None, project: "Project") -> int:
    """The sweep command; returns the exit code (2: a bad space or option, 130/143: stopped)."""
    options, fit_args = parse(sys.argv[1:] if argv is None else argv, project.command)
    if optuna_missing("sweep"):
        return 2
    return run(lambda: Sweep(options, fit_args, project))
