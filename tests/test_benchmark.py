"""The benchmark runs end to end and writes every figure the README quotes."""

import json

import pytest
from conftest import TEMPLATE, python


@pytest.mark.slow
def test_benchmark_writes_its_json(tmp_path):
    output = tmp_path / "bench.json"
    python(
        str(TEMPLATE / "benchmarks" / "bench.py"),
        "--repeats=1",
        "--epochs=1",
        f"--output={output}",
        cwd=tmp_path,
        timeout=600,
    )
    report = json.loads(output.read_text())
    assert report["work"] == {"epochs": 1, "batch_size": 64, "steps": 20}
    assert set(report["seconds"]) == {"plain", "trainer", "project"}
    assert all(s > 0 for s in report["seconds"].values())
    ratio = report["seconds"]["project"] / report["seconds"]["plain"]
    assert report["ratio_project_over_plain"] == pytest.approx(ratio, rel=0.01)  # both rounded
    assert 0 <= report["project_health"]["data_wait_share"] <= 1
    assert report["project_health"]["samples_per_s"] > 0
    cold = report["cold_start"]
    for key in ("import_lightning_s", "fast_dev_run_s", "import_torch_s", "doctor_s"):
        assert cold[key] > 0
    assert report["machine"]["cpus"] >= 1
