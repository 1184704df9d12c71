"""The Lightning CLI: configs, the full fit, and validate/test/predict from a checkpoint."""

import pytest
import torch
import yaml
from conftest import CONFIGS, load_checkpoint, logged_scalars, run_cli, run_dirs
from lightning.pytorch.profilers import SimpleProfiler

from {{ cookiecutter.package_name }}.cli import MONITOR, main


def printed_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_print_config_shows_trainer_model_and_data(capsys):
    config = printed_config(capsys)
    assert {"trainer", "model", "data", "checkpoint"} <= set(config)
    for key in ("precision", "accumulate_grad_batches", "strategy", "devices", "num_nodes"):
        assert key in config["trainer"]
    assert config["trainer"]["max_epochs"] == 20
    assert config["checkpoint"]["monitor"] == MONITOR
    assert config["model"]["optimizer"]["class_path"].startswith("torch.optim.")


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
    assert config["trainer"]["sync_batchnorm"] is True
    assert config["trainer"]["accumulate_grad_batches"] == 2


# What each config must have changed, checked on the Trainer it built.
CONFIG_EFFECTS = {
    "accumulate.yaml": lambda t: t.accumulate_grad_batches == 4,
    "debug.yaml": lambda t: t.datamodule.loader_settings.num_workers == 0,
    "default.yaml": lambda t: t.checkpoint_callback.save_last is True,
    "profile.yaml": lambda t: isinstance(t.profiler, SimpleProfiler),
}


def config_params():
    for path in sorted(CONFIGS.glob("*.yaml")):
        marks = [pytest.mark.gpu] if path.name == "gpu.yaml" else []
        yield pytest.param(path, id=path.stem, marks=marks)


def test_every_config_is_covered():
    names = {path.name for path in CONFIGS.glob("*.yaml")}
    assert names == set(CONFIG_EFFECTS) | {"ddp.yaml", "gpu.yaml"}


@pytest.mark.parametrize("path", config_params())
def test_fast_dev_run_with_each_config(path, workdir):
    if path.name == "ddp.yaml":
        # DDP re-launches the entry point, so it must run in its own process.
        # SyncBatchNorm is CUDA-only: on CPUs the config needs it switched off.
        cpu_only = [] if torch.cuda.is_available() else ["--trainer.sync_batchnorm=false"]
        result = run_cli(
            "fit", "--config", str(path), "--trainer.fast_dev_run=true", *cpu_only, cwd=workdir
        )
        assert "strategy: DDPStrategy" in result.stderr
        return
    cli = main(["fit", "--config", str(path), "--trainer.fast_dev_run", "true"])
    trainer = cli.trainer
    assert trainer.state.finished and trainer.global_step == 1
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    if path.name == "gpu.yaml":
        assert trainer.precision == "bf16-mixed"
        assert trainer.strategy.root_device.type == "cuda"
    else:
        assert CONFIG_EFFECTS[path.name](trainer)


@pytest.mark.slow
def test_default_fit_reaches_the_target_then_validate_test_predict(workdir):
    cli = main(["fit"])
    (log_dir,) = run_dirs(workdir)
    checkpoint = cli.trainer.checkpoint_callback
    best = log_dir / "checkpoints" / checkpoint.best_model_path.split("/")[-1]
    assert best.name.startswith("best-") and best.exists()
    assert (log_dir / "checkpoints" / "last.ckpt").exists()
    assert (log_dir / "config.yaml").exists()
    logged = logged_scalars(log_dir)
    assert {"train/loss", "val/loss"} <= set(logged)
    assert load_checkpoint(best)["global_step"] > 0
{%- if cookiecutter.example == "digits" %}
    best_acc = float(checkpoint.best_model_score)
    assert best_acc >= 0.97, f"val/acc {best_acc:.4f} below the 0.97 target"
    assert max(logged["val/acc"]) == pytest.approx(best_acc)

    validated = main(["validate", "--ckpt_path", str(best)]).trainer.callback_metrics
    assert float(validated["val/acc"]) == pytest.approx(best_acc)

    tested = main(["test", "--ckpt_path", str(best)]).trainer.callback_metrics
    assert float(tested["test/acc"]) >= 0.95

    predicted = main(["predict", "--ckpt_path", str(best)]).trainer
    probabilities = torch.cat(predicted.predict_loop.predictions)
    labels = predicted.datamodule.splits["test"].tensors[1]
    assert probabilities.shape == (270, 10)
    assert torch.allclose(probabilities.sum(dim=1), torch.ones(270), atol=1e-5)
    assert (probabilities.argmax(dim=1) == labels).float().mean() >= 0.95
{%- else %}
    val_loss = logged["val/loss"]
    assert len(val_loss) == 20
    assert val_loss[-1] < 0.05 * val_loss[0], f"val/loss did not fall enough: {val_loss}"
    best_loss = float(checkpoint.best_model_score)
    assert best_loss < 0.03  # the noise floor is 0.1**2 = 0.01

    validated = main(["validate", "--ckpt_path", str(best)]).trainer.callback_metrics
    assert float(validated["val/loss"]) == pytest.approx(best_loss, rel=1e-4)

    tested = main(["test", "--ckpt_path", str(best)]).trainer.callback_metrics
    assert float(tested["test/loss"]) < 0.03

    predicted = main(["predict", "--ckpt_path", str(best)]).trainer
    predictions = torch.cat(predicted.predict_loop.predictions)
    targets = predicted.datamodule.splits["test"].tensors[1]
    assert predictions.shape == targets.shape == (614, 1)
    assert torch.mean((predictions - targets) ** 2) < 0.03
{%- endif %}
