"""No step waits for the device where the logger does not write: the kit's train loss,
progress bar, health report, checkpoints and in-memory data, and what Lightning does
with what they log, read nothing from the device between logging steps.

Kit test: it trains whatever model and data `project.py` names. A sync in your own
`training_step` (a `.item()`, a `print` of a tensor, an `if loss > x`) fails it
too, by name and line: on a GPU it would stall every step.
"""

import functools
import inspect
import re
import warnings

import pytest
from host_syncs import SyncCounter
from support import PROJECT, configured, main

# 14 steps (batches), logging every third: steps that log, steps that do not, and an
# epoch's start (where in-memory data copies its new order once): two epochs of 7
# batches, or more epochs of fewer for data of fewer batches.
BATCHES = 14
FLAGS = [
    "fit",
    "--trainer.max_epochs=14",
    "--trainer.limit_train_batches=7",
    "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=3",
]


def fit_counting(*flags: str) -> SyncCounter:
    counter = SyncCounter(batches=BATCHES)
    main([*FLAGS, *flags], callbacks=[counter])
    return counter


@functools.cache
def library_callbacks() -> dict[str, str]:
    """The source files of the callbacks the project takes from a library (Lightning's
    EMAWeightAveraging, in its configs or its module's configure_callbacks), by path as
    the counter names them: code its user cannot change."""
    cli = configured()
    given = cli.model.configure_callbacks() or []
    given = given if isinstance(given, list | tuple) else [given]
    files = {}
    for callback in [*cli.trainer.callbacks, *given]:
        if type(callback).__module__.partition(".")[0] in (PROJECT.package, "instruments"):
            continue  # the kit's, or the project's own: counted
        for kind in type(callback).__mro__[:-1]:
            path = inspect.getsourcefile(kind) or ""
            files[re.sub(r".*(site-packages|src|tests)/", "", path)] = type(callback).__name__
    return files


def left_out(counter: SyncCounter) -> SyncCounter:
    """The counter without the reads of library callbacks, each named in a warning once."""
    files = library_callbacks()
    named = set()
    for index, (step, logs, calls) in enumerate(counter.steps):
        kept = []
        for name, where in calls:
            file = where.split(" <- ")[0].rpartition(":")[0]  # "<path>:<line> <function>"
            if file in files:
                named.add(f"{files[file]} ({where.split(' <- ')[0]}, {name})")
            else:
                kept.append((name, where))
        counter.steps[index] = (step, logs, kept)
    for which in sorted(named):
        message = f"left out: a host sync every step in {which}, not code of yours"
        warnings.warn(message, stacklevel=2)
    return counter


def check(counter: SyncCounter) -> None:
    counter = left_out(counter)
    quiet = [s for s in counter.steps if not s[1]]
    logging = [s for s in counter.steps if s[1]]
    assert len(quiet) >= 8 and len(logging) >= 3, counter.steps
    synced = [s for s in quiet if s[2]]
    assert not synced, "host syncs on steps the logger does not write:\n" + counter.report(synced)
    # On a logging step, at most one read of the device for the kit's whole group of
    # values (the train loss), plus one per scalar the module logs itself.
    too_many = [s for s in logging if len(s[2]) > 1 + module_logged(s[2])]
    assert not too_many, "more than one host sync on a logging step:\n" + counter.report(too_many)


def module_logged(calls) -> int:
    """The reads Lightning makes to write the module's own step metrics to the loggers."""
    return sum("convert_tensors_to_scalars" in where for _, where in calls)


def test_no_step_waits_for_the_device_between_logging_steps(workdir):
    check(fit_counting())


def test_nor_with_the_progress_bar_off_and_the_health_report_printed_as_it_goes(workdir):
    check(fit_counting("--trainer.enable_progress_bar=false", "--health.every_n_steps=2"))


@pytest.mark.slow
def test_nor_when_compiled(workdir):
    check(fit_counting("--compile.enabled=true"))


def test_the_counter_sees_a_sync_in_a_step(workdir, monkeypatch):
    """The test above would fail on the classic mistake: a value read in every step."""
    Model = PROJECT.model  # noqa: N806  (a class)
    step = Model.training_step

    def reads_a_value(self, batch, batch_idx):
        output = step(self, batch, batch_idx)
        self.last_value = next(self.parameters()).sum().item()
        return output

    monkeypatch.setattr(Model, "training_step", reads_a_value)
    counter = left_out(fit_counting())
    quiet = [s for s in counter.steps if not s[1]]
    assert all(len(calls) == 1 for _, _, calls in quiet)
    assert "reads_a_value" in quiet[0][2][0][1]
