"""Two CPU processes under DDP (gloo): one set of outputs, metrics synced over ranks."""

import pytest
from conftest import load_checkpoint, run_cli

from {{ cookiecutter.package_name }}.cli import MONITOR, main


@pytest.mark.slow
def test_fit_with_two_processes_writes_once_and_syncs_metrics(workdir):
    result = run_cli(
        "fit",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=2",
        cwd=workdir,
        timeout=600,
    )
    # Rank 0 alone prints the report, and it sees the whole world.
    assert result.stderr.count("Environment\n") == 1
    assert "strategy: DDPStrategy | devices 2 x nodes 1 = world size 2" in result.stderr
    assert "loader: num_workers 0" in result.stderr  # tensors in memory need none

    # One run directory, one config, one best and one last checkpoint.
    runs = sorted((workdir / "logs" / "{{ cookiecutter.example }}").iterdir())
    assert [run.name for run in runs] == ["version_0"]
    checkpoints = sorted(p.name for p in (runs[0] / "checkpoints").iterdir())
    assert len(checkpoints) == 2 and checkpoints[0].startswith("best-")
    assert checkpoints[1] == "last.ckpt"
    assert (runs[0] / "config.yaml").exists()
    assert len(list(runs[0].glob("events.out.tfevents.*"))) == 1

    # The monitored value rank 0 saved is the metric over the whole val set
    # (both ranks' halves), so it equals a single-process validation.
    best = runs[0] / "checkpoints" / checkpoints[0]
    state = load_checkpoint(best)
    (checkpoint_state,) = state["callbacks"].values()
    synced = float(checkpoint_state["best_model_score"])
    single = main(["validate", "--ckpt_path", str(best)]).trainer.callback_metrics
    assert float(single[MONITOR]) == pytest.approx(synced, rel=1e-5)
