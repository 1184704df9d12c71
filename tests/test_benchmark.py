"""The benchmark runs end to end and writes every figure the README quotes."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import TEMPLATE, python


@pytest.mark.slow
def test_benchmark_writes_its_json(tmp_path):
    output = tmp_path / "bench.json"
    python(
        str(TEMPLATE / "benchmarks" / "bench.py"),
        "--repeats=1",
        "--epochs=1",
        "--heavy-epochs=1",
        "--no-compile",  # the compile switch has its own test in the rendered project
        "--warmup-epochs=0",  # nothing is compared: no warm-up round
        "--null-steps=30",
        f"--output={output}",
        cwd=tmp_path,
        timeout=600,
    )
    report = json.loads(output.read_text())
    # 1,257 training samples: 19 whole batches of 64 an epoch.
    assert report["work"] == {"epochs": 1, "batch_size": 64, "steps": 19}
    assert report["warmup_epochs"] == 0
    seconds = report["seconds"]
    assert set(seconds) == {"plain", "lightning_bare", "trainer", "project", "project_per_sample"}
    assert all(s > 0 for s in seconds.values())
    ratio = seconds["project"] / seconds["plain"]
    # The report rounds each ratio to 3 decimals: abs covers a small one.
    assert report["ratio_project_over_plain"] == pytest.approx(ratio, rel=0.01, abs=5e-4)
    bare = seconds["project"] / seconds["lightning_bare"]
    assert report["ratio_project_over_lightning_bare"] == pytest.approx(bare, rel=0.01, abs=5e-4)
    assert report["fastest_seconds"] == {n: min(t) for n, t in report["all_seconds"].items()}
    assert set(report["fastest_ratios"]) == {
        "project_over_plain",
        "project_over_lightning_bare",
        "trainer_over_plain",
        "heavy_project_over_plain",
        "heavy_project_over_lightning_bare",
    }
    # Each run's median step, timed from one batch's start to the next's.
    steps = report["step_ms"]
    assert set(steps) == set(seconds) and all(ms > 0 for ms in steps.values())
    # Every batch but each epoch's first closes a timed step, in every row.
    assert report["step_cycles"] == {name: 19 - 1 for name in seconds}
    assert report["all_step_ms"] == {name: [ms] for name, ms in steps.items()}
    for name in ("lightning_bare", "plain"):
        step_ratio = steps["project"] / steps[name]
        shown = report[f"ratio_step_project_over_{name}"]
        assert shown == pytest.approx(step_ratio, rel=0.01, abs=5e-4)
    assert report["ratio_step_per_sample_over_lightning_bare"] == pytest.approx(
        steps["project_per_sample"] / steps["lightning_bare"], rel=0.01, abs=5e-4
    )
    heavy = report["heavy"]
    assert heavy["channels"] == 128 and heavy["steps"] == 19
    assert set(heavy["step_ms"]) == {"plain", "lightning_bare", "project"}
    assert all(ms > 0 for ms in heavy["step_ms"].values())
    for name in ("lightning_bare", "plain"):
        assert heavy[f"ratio_step_project_over_{name}"] == pytest.approx(
            heavy["step_ms"]["project"] / heavy["step_ms"][name], rel=0.01, abs=5e-4
        )
    assert heavy["ratio_project_over_plain"] == pytest.approx(
        heavy["seconds"]["project"] / heavy["seconds"]["plain"], rel=0.01, abs=5e-4
    )
    for spent in (report["project_breakdown"], heavy["project_breakdown"]):
        assert 0 < spent["before_fit_s"] and 0 < spent["checkpoint_s"]
        assert 0 < spent["lightning_bare_before_fit_s"]
        # One epoch: its best, and last (the first save of last is never a copy).
        assert (spent["checkpoints_written"], spent["checkpoints_copied"]) == (2, 0)
    assert report["project_health"]["flops_per_batch"] > 0
    assert 0 <= report["project_health"]["data_wait_share"] <= 1
    assert report["project_health"]["samples_per_s"] > 0
    # The host's own work a step, on the near-null model: marginal microseconds.
    null = report["null"]
    assert null["steps"] == [6, 30]
    rows = {"plain", "lightning_bare", "trainer", "project"}
    rows |= {"project_no_bar", "project_no_logger", "project_no_bar_no_logger"}
    assert set(null["step_us"]) == rows and set(null["all_step_us"]) == rows
    assert all(len(us) == 1 for us in null["all_step_us"].values())
    us = null["step_us"]
    # (Rounded to 3 places: a marginal cost lost in a noisy machine's spread is a small ratio.)
    assert null["ratio_project_over_lightning_bare"] == pytest.approx(
        us["project"] / us["lightning_bare"], rel=0.01, abs=5e-4
    )
    assert null["bells_us"]["progress_bar"] == pytest.approx(
        us["project"] - us["project_no_bar"], abs=0.2
    )
    cold = report["cold_start"]
    for key in ("import_lightning_s", "fast_dev_run_s", "import_torch_s", "doctor_s"):
        assert cold[key] > 0
    assert report["machine"]["cpus"] >= 1


@pytest.mark.slow
def test_the_save_benchmark_times_a_saving_step_in_the_step_and_in_the_background(tmp_path):
    output = tmp_path / "saves.json"
    small = ("--width=256", "--layers=2", "--steps=6", "--every=2")
    scratch = tmp_path / "scratch"  # its project and checkpoints, removed at its exit
    scratch.mkdir()
    saves = str(TEMPLATE / "benchmarks" / "saves.py")
    python(saves, *small, f"--output={output}", cwd=tmp_path, TMPDIR=str(scratch))
    assert list(scratch.glob("saves-*")) == []
    report = json.loads(output.read_text())
    assert report["work"] == {
        "parameters": 2 * (256 * 256 + 256),
        "state_gb": 0.0,
        "steps": 6,
        "save_every": 2,
    }
    rows = report["rows"]
    assert list(rows) == ["no saves", "in the step", "in the background"]
    assert rows["no saves"]["saving_steps"] == [] and rows["no saves"]["saves"] == 0
    baseline = rows["no saves"]["step_ms"]
    for name in ("in the step", "in the background"):
        row = rows[name]
        # Saves after steps 2, 4 and 6: each timed up to the next batch's start.
        assert row["saving_steps"] == [1, 3, 5] and row["saves"] == 3
        assert len(row["all_step_ms"]) == 6 and all(ms > 0 for ms in row["all_step_ms"])
        assert row["save_delay_ms"] == pytest.approx(row["saving_step_ms"] - baseline, abs=0.11)
        beyond = sum(row["all_step_ms"][1:]) - 5 * baseline
        assert row["run_cost_per_save_ms"] == pytest.approx(beyond / 3, abs=0.2)
        assert row["peak_rss_mib"] > 0
    assert rows["in the background"]["copy_ms_per_save"] > 0
    assert rows["in the step"]["copy_ms_per_save"] is None
    background, in_step = (
        rows[name]["save_delay_ms"] for name in ("in the background", "in the step")
    )
    ratio = background / in_step if in_step else None  # a delay within the noise is 0.0
    assert report["ratio_background_delay_over_step_delay"] == pytest.approx(ratio, abs=1e-3)


def test_gpu_check_says_in_one_line_that_there_is_no_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: scripts/gpu_check.sh runs for real there")
    script = TEMPLATE / "scripts" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    result = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check"
    ]
    assert result.stdout == ""


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_check_runs_the_gpu_tests_and_the_benchmark(tmp_path):
    output = tmp_path / "gpu.json"
    result = subprocess.run(
        ["bash", str(TEMPLATE / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUTPUT": str(output)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(output.read_text())["rows"]
    assert len(rows) == 5 and all(row["samples_per_s"] > 0 for row in rows.values())
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["device"].startswith("cuda") and bench["mfu"] is not None, bench
