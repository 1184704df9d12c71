"""The command line: the commands it lists, configs, and the full fit to its target
followed by validate, test and predict from the best checkpoint.

Kit test: it runs whatever model and data `project.py` names, and holds the fit
to `project.MONITOR` reaching `project.TARGET` (`project.MODE` says which way is better).
"""

import csv
import shutil

import pytest
import torch
import yaml
from conftest import (
    CONFIGS,
    PROJECT_ROOT,
    best_score,
    configured,
    folder_of,
    load_checkpoint,
    loader_length,
    logged_scalars,
    made_a_run,
    reached,
    run_dirs,
)
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.utilities.model_helpers import is_overridden

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit.cli import main
from {{ cookiecutter.package_name }}.project import MODE, MONITOR, TARGET


def printed_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_help_lists_every_command(capsys):
    assert command(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("fit", "validate", "test", "predict", "doctor", "export"):
        assert f"\n  {name} " in out, name


def test_an_unknown_command_is_named_with_the_closest_one(capsys):
    assert command(["exprot"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown command 'exprot' (did you mean 'export'?)" in err
    assert "doctor" in err and "fit" in err


def test_print_config_shows_trainer_model_data_and_checkpoint(capsys):
    config = printed_config(capsys)
    assert {"trainer", "model", "data", "checkpoint"} <= set(config)
    for key in ("precision", "accumulate_grad_batches", "strategy", "devices", "num_nodes"):
        assert key in config["trainer"]
    assert config["trainer"]["precision"] in ("32-true", "16-mixed", "bf16-mixed")
    assert (config["checkpoint"]["monitor"], config["checkpoint"]["mode"]) == (MONITOR, MODE)


def test_default_yaml_is_the_defaults(capsys):
    assert printed_config(capsys, "--config", str(CONFIGS / "default.yaml")) == printed_config(
        capsys
    )


def test_configs_compose_and_flags_win(capsys):
    config = printed_config(
        capsys,
        "--config",
        str(CONFIGS / "ddp.yaml"),
        "--config",
        str(CONFIGS / "accumulate.yaml"),
        "--trainer.accumulate_grad_batches",
        "2",
    )
    assert config["trainer"]["strategy"] == "ddp"
    # What the run will use: SyncBatchNorm only where there is CUDA.
    assert config["trainer"]["sync_batchnorm"] is torch.cuda.is_available()
    assert config["trainer"]["accumulate_grad_batches"] == 2


# What each config must have changed, checked on the Trainer it built.
CONFIG_EFFECTS = {
    "accumulate.yaml": lambda t: t.accumulate_grad_batches == 4,
    "debug.yaml": lambda t: t.train_dataloader.num_workers == 0,
    "default.yaml": lambda t: t.checkpoint_callback.save_last is True,
    "profile.yaml": lambda t: isinstance(t.profiler, SimpleProfiler),
}


# Not a config of fit: the sweep's search space (tests/test_sweep.py reads it).
SWEEP_SPACE = "sweep.yaml"


def config_params() -> list:
    # ddp.yaml re-launches the entry point, so tests/test_ddp.py runs it in its own processes.
    return [
        pytest.param(path, id=path.stem, marks=[pytest.mark.gpu] if path.name == "gpu.yaml" else [])
        for path in sorted(CONFIGS.glob("*.yaml"))
        if path.name not in ("ddp.yaml", SWEEP_SPACE)
    ]


def test_every_config_is_covered():
    names = {path.name for path in CONFIGS.glob("*.yaml")}
    assert names == set(CONFIG_EFFECTS) | {"ddp.yaml", "gpu.yaml", SWEEP_SPACE}


@pytest.mark.parametrize("path", config_params())
def test_fast_dev_run_with_each_config(path, workdir):
    cli = main(["fit", "--config", str(path), "--trainer.fast_dev_run", "true"])
    trainer = cli.trainer
    assert trainer.state.finished and trainer.global_step == 1
    if path.name == "gpu.yaml":
        assert trainer.precision == "bf16-mixed"
        assert trainer.strategy.root_device.type == "cuda"
    else:
        assert CONFIG_EFFECTS[path.name](trainer)


@pytest.fixture(scope="module")
def fitted(default_fit):
    (run,) = run_dirs(default_fit)
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    return run, best


@pytest.mark.slow
def test_default_fit_reaches_the_target(fitted):
    run, best = fitted
    assert (run / "checkpoints" / "last.ckpt").exists()
    assert (run / "config.yaml").exists()
    logged = logged_scalars(run)
    assert MONITOR in logged
    score = best_score(load_checkpoint(best))
    assert reached(score, TARGET, MODE), f"{MONITOR} {score:.4f}, target {TARGET} ({MODE})"
    assert score == pytest.approx(max(logged[MONITOR]) if MODE == "max" else min(logged[MONITOR]))
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"] == 19


@pytest.mark.slow
def test_validate_and_test_the_best_checkpoint_into_its_run(trained_checkpoint, workdir):
    # This test's own copy of a two-epoch run, to add to.
    shutil.copytree(folder_of(trained_checkpoint), workdir / "copy")
    (run,) = run_dirs(workdir / "copy")
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    before = len(logged_scalars(run)[MONITOR])
    validated = main(["validate", "--ckpt_path", str(best)]).trainer
    assert float(validated.callback_metrics[MONITOR]) == pytest.approx(
        best_score(load_checkpoint(best)), rel=1e-5
    )
    if is_overridden("test_step", validated.lightning_module):
        tested = main(["test", "--ckpt_path", str(best)]).trainer
        assert any(name.startswith("test/") for name in tested.callback_metrics)
    # Into the checkpoint's own run, beside its training curves; no new run anywhere.
    assert run_dirs(workdir / "copy") == [run]
    assert len(logged_scalars(run)[MONITOR]) == before + 1
    assert not made_a_run(workdir)


@pytest.mark.slow
def test_predict_writes_a_row_per_sample_and_no_run(fitted, workdir):
    _, best = fitted
    main(["predict", "--ckpt_path", str(best), "--predictions.output=out/predictions.csv"])
    with open(workdir / "out" / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    expected = loader_length(configured(), "predict")
    assert [int(row["index"]) for row in rows] == list(range(expected))
    assert list(rows[0])[0] == "index" and len(rows[0]) > 1
    assert not made_a_run(workdir)


def test_readme_commands_name_the_real_configs():
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    for path in CONFIGS.glob("*.yaml"):
        assert f"configs/{path.name}" in readme, path.name
