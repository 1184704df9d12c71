"""Every private name of Lightning, torch or Optuna the kit uses, in one place (and the
words of jsonargparse's messages it reads).

Each is something the public API does not offer; each says what it is for and
the release it was checked on (`CHECKED_ON`). tests/kit/test_internals.py exercises
every one, so a release that moves one fails there first, by name, rather than
somewhere in a run; another release than CHECKED_ON's is not a fault in itself
(`doctor` names it in one line). The private methods the kit overrides are listed in
`OVERRIDDEN`, and the same test holds their signatures to the ones written here.
One more is torch's: `DataLoader._index_sampler`, the property its iterators read
their indices from, which kit/data.py's ResumableLoader overrides to skip the
batches a resumed epoch already trained; the same test file checks it.
"""

import re
from importlib import metadata
from typing import Any

CHECKED_ON = {"lightning": "2.6.6", "jsonargparse": "4.53.0", "torch": "2.13.0", "optuna": "5.1.0"}
# How much of a version is a release here: torch's patches and build tags (+cpu, +cu130)
# move no private name.
RELEASE_PARTS = {"lightning": 3, "jsonargparse": 3, "torch": 2, "optuna": 2}


def unchecked_releases() -> dict[str, str]:
    """The installed releases that differ from CHECKED_ON's, each as "installed (checked on
    X)". Not a fault: tests/kit/test_internals.py says whether each private name still
    works on them, and `doctor` reports them. Needs no Lightning."""

    def release(text: str, parts: int) -> str:
        return ".".join(text.split("+")[0].split(".")[:parts])

    differ = {}
    for name, parts in RELEASE_PARTS.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if release(installed, parts) != release(CHECKED_ON[name], parts):
            differ[name] = f"{installed} (checked on {CHECKED_ON[name]})"
    return differ


# Private methods the kit overrides, by the class that defines them: their names
# and parameters, as checked on CHECKED_ON's releases.
OVERRIDDEN = {
    # Best and last share one write when they hold the same state (kit/checkpoints.py).
    "lightning.pytorch.callbacks.ModelCheckpoint": {
        "_save_checkpoint": ("self", "trainer", "filepath"),
        "_save_last_checkpoint": ("self", "trainer", "monitor_candidates"),
    },
    # The kit's callbacks become one, after Lightning's CLI made them (kit/cli.py).
    "lightning.pytorch.cli.LightningCLI": {
        "_instantiate_trainer": ("self", "config", "callbacks"),
    },
    # A continued run appends to its metrics.csv instead of deleting it (kit/runs.py).
    "lightning.fabric.loggers.csv_logs._ExperimentWriter": {
        "_check_log_dir_exists": ("self",),
    },
    # A trial whose process is gone fails at once, not after the grace period (kit/sweep.py).
    "optuna.storages.RDBStorage": {
        "_get_stale_trial_ids": ("self", "study_id"),
    },
}


def format_summary_table(*args: Any) -> str:
    """ModelSummary's table from its columns: the kit's summary drops a column first
    (FLOPs, when nothing counted them), and Lightning builds the table in one private step."""
    from lightning.pytorch.utilities.model_summary import model_summary

    return model_summary._format_summary_table(*args)


# The training loop ------------------------------------------------------------


def accumulating(trainer: Any) -> bool:
    """Whether this batch only accumulates gradients (no optimizer step): Lightning
    decides it in its epoch loop and exposes no flag for it."""
    return trainer.fit_loop.epoch_loop._should_accumulate()


def loggers_write_now(trainer: Any) -> bool:
    """Whether the loggers write at the end of this step (every log_every_n_steps, and
    the last): the logger connector decides it, and no public name says so."""
    return bool(trainer._logger_connector.should_update_logs)


def request_stop(trainer: Any, stop: bool = True) -> None:
    """Have Lightning stop the fit as it does on SIGTERM (`stop` False: not yet): it raises
    SIGTERMException after this step, every rank together (a multi-process run
    broadcasts rank 0's flag each step)."""
    trainer._signal_connector.received_sigterm = stop


def on_sigterm_in_fit(trainer: Any, handler: Any) -> None:
    """Have `handler(signum, frame)` take the place of Lightning's own reaction to SIGTERM
    (its notifier) while this trainer fits; validate, test and predict keep Lightning's.
    Call it before the fit registers its signal handlers: by `on_fit_start`."""
    connector = trainer._signal_connector
    lightnings = type(connector)._sigterm_notifier_fn.__get__(connector)

    def notify(signum: Any, frame: Any) -> None:
        (handler if trainer.state.fn == "fit" else lightnings)(signum, frame)

    connector._sigterm_notifier_fn = notify


def before_each_step_stop_check(trainer: Any, check: Any) -> None:
    """Call `check()` at the start of each training step of a multi-process fit, just
    before Lightning broadcasts rank 0's SIGTERM flag (and every rank stops if it is set)."""
    loop = trainer.fit_loop.epoch_loop
    broadcast = type(loop)._broadcast_sigterm_tensor.__get__(loop)

    def checked() -> None:
        check()
        broadcast()

    loop._broadcast_sigterm_tensor = checked


def lightning_shards(trainer: Any) -> bool:
    """Whether Lightning puts a DistributedSampler into the loaders of this (multi-process)
    fit: `Trainer(use_distributed_sampler=...)`, which it keeps in no public attribute."""
    return bool(trainer._accelerator_connector.use_distributed_sampler)


def restart_train_iteration(trainer: Any) -> None:
    """Make the training DataLoaders' iterators again, as Lightning does at an epoch's start
    (it made them before the checkpoint's loader positions were known)."""
    iter(trainer.fit_loop._data_fetcher)


def saved_batch_progress(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The fit loop's count of each rank's training batches (this epoch's and all) in a
    checkpoint, as Lightning lays it out: no public reader has it."""
    return checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]


def logging_step(trainer: Any) -> int:
    """The step Lightning gives the metrics logged now: optimizer steps taken so far.
    (`global_step` counts the steps of every optimizer, so it differs with several.)"""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


# ModelCheckpoint ---------------------------------------------------------------


def skips_saving(callback: Any, trainer: Any) -> bool:
    """ModelCheckpoint's own rule for not saving now (sanity check, fast_dev_run, a
    step already saved, ...), for a `last` saved outside its own hooks."""
    return callback._should_skip_saving_checkpoint(trainer)


def monitor_candidates(callback: Any, trainer: Any) -> dict[str, Any]:
    """The metrics ModelCheckpoint formats file names with (epoch and step included)."""
    return callback._monitor_candidates(trainer)


def saves_at_train_epoch_end(callback: Any, trainer: Any) -> bool:
    """Whether ModelCheckpoint saves at the training epoch's end rather than after
    validation (it decides from val_check_interval and check_val_every_n_epoch)."""
    return callback._should_save_on_train_epoch_end(trainer)


def last_saved(callback: Any) -> tuple[str, int]:
    """The file ModelCheckpoint wrote last and the global step it wrote it at: the
    public `last_model_path` and `best_model_path` do not say which one came last."""
    return callback._last_checkpoint_saved, callback._last_global_step_saved


def note_saved(callback: Any, filepath: str) -> None:
    """Tell ModelCheckpoint that `filepath` is the file it wrote last (the kit copied it)."""
    callback._last_checkpoint_saved = filepath


def forget_step_saved(callback: Any, step: int) -> None:
    """Tell ModelCheckpoint that the step it saved last is `step`: a save it does not
    count, so that its own saves at the same step (after a validation) still happen."""
    callback._last_global_step_saved = step


# Loggers -------------------------------------------------------------------------


def filesystem(writer: Any) -> Any:
    """The fsspec filesystem a CSV logger or its writer works on (local or remote)."""
    return writer._fs


def open_experiment(logger: Any) -> Any:
    """The experiment a logger has started, or None: reading `.experiment` would start one."""
    return getattr(logger, "_experiment", None)


def set_experiment(logger: Any, experiment: Any) -> None:
    """Give a logger its experiment (a writer of the kit's), or None to drop a finished
    one so that the next use starts another."""
    logger._experiment = experiment


# torch -------------------------------------------------------------------------------


def uncompiled(module: Any) -> Any:
    """The module `torch.compile(module)` wrapped (its OptimizedModule's only handle on it
    is `_orig_mod`), or the module itself."""
    return getattr(module, "_orig_mod", module)


def is_compiled(module: Any) -> bool:
    """Whether `module.compile()` compiled it or a submodule in place: no public mark says so."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def fake_tensor_mode() -> Any:
    """torch's FakeTensorMode (shapes, no memory, no compute), taking real tensors too (they
    turn fake as they enter an op): what torch.export traces with; no public name has it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def memory_tracker() -> tuple[Any, tuple[Any, ...]]:
    """torch's MemTracker (a step's memory by module and kind of tensor), and the kinds that
    are the step's own: activations, temporaries and the batch (its "other")."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    return MemTracker(), (_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH)


def forget_module(tracker: Any, module: Any) -> None:
    """Drop one module's figures from a MemTracker: it refuses a module called a second time
    from the top level while it holds them, and its only public way out (`reset_mod_stats`)
    drops every module's, which a backward still to come reads."""
    del tracker.memory_tracking[module]


# Optuna ------------------------------------------------------------------------------


def optuna_heartbeat() -> type:
    """Optuna's heartbeat interface: a storage with it has its dead trials failed by the
    study (`fail_stale_trials`); its journal storage lacks it, and the sweep's adds it."""
    from optuna.storages._heartbeat import BaseHeartbeat

    return BaseHeartbeat


def optuna_trial_table() -> type:
    """The table RDBStorage keeps trials in: on SQLite, whose transactions lock no row, the
    sweep writes a trial's row before it reads it, to hold the write lock."""
    from optuna.storages._rdb.models import TrialModel

    return TrialModel


# The CLI -----------------------------------------------------------------------------


def subcommand_parser(cli: Any, subcommand: str | None) -> Any:
    """The parser LightningCLI built for `subcommand` (None: the CLI without subcommands),
    to dump a config as it parsed it."""
    return cli._parser(subcommand)


# jsonargparse words a value of the wrong type like this; no structured error says it.
_KEY = re.compile(r'Parser key "([^"]+)": (Does not validate|Expected a)')
_GIVEN = re.compile(r"(?:Given|Got) value: (.*)$")
_EXPECTED = re.compile(r"Expected a (.*?)(?= - Expected a | Given value type|\. Got value|$)")
_CLASS = re.compile(r"<class '(?:\w+\.)*(\w+)'>")


def wrong_type(text: str) -> tuple[str, str, list[str]] | None:
    """(key, value given, types expected) from jsonargparse's message for a value of the
    wrong type, or None for any other message."""
    key, given = _KEY.match(text), _GIVEN.search(text)
    if not key or not given:
        return None
    expected = []
    for kind in _EXPECTED.findall(text):
        if kind.startswith("typing.Literal["):
            expected += [value.strip() for value in kind[15:-1].split(",")]
        else:
            name = _CLASS.sub(r"\1", kind)
            expected.append("null" if name == "NoneType" else name)
    return key.group(1), given.group(1), expected


# The file beside a sharded checkpoint's shards that holds everything else of it
# (loops, callbacks, hyperparameters), as Lightning's ModelParallelStrategy names it.
DCP_METADATA = "meta.pt"


def dcp_save(state: dict[str, Any], folder: Any) -> None:
    """Each rank writes its shards of `state` into `folder` (kit/sharding.py)."""
    from lightning.fabric.strategies.fsdp import _distributed_checkpoint_save

    _distributed_checkpoint_save(state, folder)


def dcp_load_full(folder: Any) -> dict[str, Any]:
    """A sharded checkpoint folder unsharded into one process's memory, `meta.pt`
    included, with no process group (kit/sharding.py's consolidate)."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    return _load_distributed_checkpoint(folder)


def main_thread_frame() -> Any:
    """The frame the main thread runs now, or None: Python names no public way to see
    another thread's stack (the rank watch reports where a stuck rank is)."""
    import sys
    import threading

    return sys._current_frames().get(threading.main_thread().ident)
