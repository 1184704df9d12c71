"""`bench`: the loader alone, the step alone and the full loop of the project's own
model and data, then one verdict that follows from those figures.

Kit test: it runs whatever model and data `project.py` names. The verdict's rules
are held to figures given here, and the measurements to an injected clock, never
to this machine's speed.
"""

import dataclasses
import json
import os

import pytest
from support import configured

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit import bench
from {{ cookiecutter.package_name }}.kit.bench import Figures, verdict
from {{ cookiecutter.package_name }}.kit.health import TrainingHealth

# A GPU step at 5000 samples/s, fed and run well.
BALANCED = Figures(
    device="cuda:0",
    precision="bf16-mixed",
    batch_size=64,
    steps=50,
    loader_samples_per_s=20000.0,
    step_samples_per_s=5000.0,
    loop_samples_per_s=4800.0,
    data_wait_share=0.01,
    idle_share=0.02,
    host_ms_per_step=0.5,
    flops_per_step=1e12,
    flops_per_s=1e14,
    mfu=0.3,
    peak_memory_mib=10000.0,
    device_memory_mib=80000.0,
    num_workers=4,
    pin_memory=True,
    on_device=False,
    compiled=True,
)


def given(**changes) -> Figures:
    return dataclasses.replace(BALANCED, **changes)


@pytest.mark.parametrize(
    ("figures", "kind", "named"),
    [
        (given(loader_samples_per_s=1000.0, num_workers=0), "data-bound", "--data.num_workers"),
        (given(loader_samples_per_s=1000.0, pin_memory=False), "data-bound", "--data.pin_memory"),
        # Data first: a slow loader is the verdict even when the step is small and memory full.
        (
            given(loader_samples_per_s=1000.0, loop_samples_per_s=900.0, peak_memory_mib=79000.0),
            "data-bound",
            "__getitem__",
        ),
        (given(loop_samples_per_s=2000.0), "host-bound", "bigger batch"),
        (given(loop_samples_per_s=2000.0, compiled=False), "host-bound", "--compile.enabled"),
        (given(idle_share=0.4), "host-bound", "idle 40% of the time between steps"),
        (given(peak_memory_mib=79000.0), "memory", "--trainer.accumulate_grad_batches"),
        (given(precision="32-true"), "compute-bound", "--trainer.precision bf16-mixed"),
        (given(compiled=False), "compute-bound", "--compile.enabled true"),
        (given(), "compute-bound", "more devices"),
        (
            given(device="cpu", precision="32-true", mfu=None, compiled=False),
            "compute-bound",
            "--compile.enabled true",
        ),
    ],
)
def test_the_verdict_follows_from_the_figures_in_the_tuning_order(figures, kind, named):
    found, advice = verdict(figures)
    assert (found, named in advice) == (kind, True), advice


def test_a_cpu_verdict_names_no_gpu_flag():
    _, advice = verdict(given(device="cpu", loader_samples_per_s=10.0, pin_memory=False))
    assert "pin_memory" not in advice and "on_device" not in advice


class Clock:
    """A clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def names_the_data_writes(folder) -> set[str]:
    """What the DataModule's own prepare_data and setup leave in a working directory (a
    DataModule may write its data there)."""
    previous = os.getcwd()
    os.chdir(folder)
    try:
        datamodule = configured().datamodule
        datamodule.prepare_data()
        datamodule.setup("fit")
    finally:
        os.chdir(previous)
    return {path.name for path in folder.iterdir()}


@pytest.mark.slow
def test_bench_measures_the_project_and_writes_nothing(
    workdir, tmp_path_factory, monkeypatch, capsys
):
    # Each read of the loader's clock is 10 s on: the loader is slower than any step.
    monkeypatch.setattr(bench.Bench, "clock", staticmethod(Clock(10.0)))
    assert command(["bench", "--steps", "3", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    kind, advice = figures.pop("verdict"), figures.pop("advice")
    assert (kind, advice) == verdict(Figures(**figures)) and kind == "data-bound"
    measured = Figures(**figures)
    assert 0 < measured.loader_samples_per_s <= 3 * measured.batch_size / 10.0  # 10 s, <= 3 batches
    assert measured.step_samples_per_s > 0 and measured.loop_samples_per_s > 0
    assert measured.flops_per_step is None or measured.flops_per_step > 0
    # No run directory, no checkpoint: nothing but what the data writes itself.
    data = names_the_data_writes(tmp_path_factory.mktemp("data"))
    assert {path.name for path in workdir.iterdir()} <= data


@pytest.mark.slow
def test_the_step_alone_and_the_loop_are_timed_by_the_health_clock(workdir, monkeypatch, capsys):
    monkeypatch.setattr(TrainingHealth, "clock", staticmethod(Clock(0.5)))
    monkeypatch.setattr(bench.Bench, "clock", staticmethod(Clock(0.001)))
    assert command(["bench", "--steps", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:3] for line in lines[1:5]] == ["(a)", "(b)", "(c)", "ver"]
    # Every step of (b) and (c) took the same time on that clock: no host time above (b).
    assert "host time above (b): 0.00 ms" in lines[3]
    assert lines[4].startswith("verdict: ")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--steps", "1"], "--steps 1: must be 2 or more"),
        (["--batch_size", "many"], "--batch_size many: must be a positive whole number or auto"),
        (
            ["--batch_size", "auto", "--", "--trainer.accelerator=cpu"],
            "--batch_size auto: it finds the largest batch that fits a GPU's memory",
        ),
    ],
)
def test_a_bench_that_cannot_run_says_why_in_one_line(workdir, capsys, flags, said):
    assert command(["bench", *flags]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {said}"), line
    assert list(workdir.iterdir()) == []
