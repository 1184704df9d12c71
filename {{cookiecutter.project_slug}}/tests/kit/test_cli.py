"""The command line: the commands it lists, configs, and the full fit to its target
followed by validate, test and predict from the best checkpoint.

Kit test: it runs whatever model and data `project.py` names, with whatever configs
configs/ holds. The full default fit, held to `TARGET` on the project's metric, is
marked `target` and runs only when asked for (`pytest -m target`).
"""

import csv
import json
import logging
import re
import shutil
import warnings
from dataclasses import replace

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import StochasticWeightAveraging, WeightAveraging
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.utilities.model_helpers import is_overridden
from support import (
    CONFIGS,
    PROJECT,
    PROJECT_ROOT,
    batches_trained,
    best_score,
    configured,
    folder_of,
    load_checkpoint,
    loader_length,
    logged_scalars,
    made_a_run,
    main,
    optimizes_by_hand,
    reached,
    run_dirs,
)

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit import (
    checkpoints,
    console,
    hardware,
    health,
    predict,
    resume,
    runs,
    spec,
    watch,
)
from {{ cookiecutter.package_name }}.kit.cli import (
    LIBRARY_NOISE,
    REPORTING,
    ConfigError,
    manual_optimization,
    quiet_library_noise,
)
from {{ cookiecutter.package_name }}.project import TARGET

MODE = PROJECT.mode
MONITOR = PROJECT.monitor
# Callbacks that keep a whole copy of the model: FSDP refuses them, in one line.
WHOLE_COPIES = (WeightAveraging, StochasticWeightAveraging)


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


def help_of(capsys, *args: str) -> dict[str, list[str]]:
    """`fit --help`, as its groups: the heading, then each flag's lines."""
    with pytest.raises(SystemExit):
        main(["fit", "--help", *args])
    groups: dict[str, list[str]] = {}
    for block in capsys.readouterr().out.split("\n\n"):
        heading, _, rest = block.partition("\n")
        groups[heading] = rest.splitlines()
    return groups


def described(lines: list[str]) -> dict[str, str]:
    """Each flag of a group's help, and what its help says before `(type: ...)`."""
    flags: dict[str, str] = {}
    name = None
    for line in lines:
        if line.startswith("  --"):
            name, _, text = line.strip().partition("  ")
            flags[name] = text.strip()
        elif name is not None:
            flags[name] += " " + line.strip()
    return {name: text.split("(type:")[0].strip() for name, text in flags.items()}


KIT_GROUPS = (
    "checkpoint",
    "train_loss",
    "divergence",
    "distributed",
    "fsdp",
    "health",
    "resume_state",
    "compile",
    "fit_result",
    "predictions",
)


def test_the_help_describes_every_flag_of_the_kit_and_names_each_group(capsys):
    """Each kit flag says what it does (from its class's `Args:`), no type prints as
    Untyped, and each group's heading is its class's first line, a whole sentence."""
    groups = help_of(capsys)
    seen = set()
    for heading, lines in groups.items():
        for flag, text in described(lines).items():
            assert "Untyped" not in text and "Untyped" not in " ".join(lines), flag
            key = flag.split()[0].removeprefix("--").split(".")[0]
            if key in KIT_GROUPS and not flag.startswith(f"--{key} CONFIG"):
                seen.add(key)
                assert text, f"{flag}: no description in --help (its class's Args:)"
                assert heading.endswith(":") and not heading.endswith(",:"), heading
    assert seen == set(KIT_GROUPS)
    classes = (
        checkpoints.BestAndLast,
        console.TrainLoss,
        watch.Divergence,
        watch.RankWatch,
        spec.FSDPOptions,
        health.TrainingHealth,
        resume.ResumeState,
        hardware.CompileNetwork,
        runs.FitResult,
        predict.PredictionWriter,
    )
    for kind in classes:
        first = (kind.__doc__ or "").strip().splitlines()[0]
        assert first.endswith("."), f"{kind.__name__}: its heading is cut: {first!r}"


def test_lightnings_lines_that_the_kit_says_better_are_left_out():
    """Lightning's own words, as its loggers write them: those the environment report and
    the resume line say again are dropped, the others kept."""
    quiet_library_noise()
    said_again = [
        "GPU available: False, used: False",
        "TPU available: False, using: 0 TPU cores",
        "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2",
        f"{'-' * 100}\ndistributed_backend=gloo\nAll distributed processes registered.",
        "Restoring states from the checkpoint path at logs/version_0/checkpoints/last.ckpt",
    ]
    kept = ["Seed set to 42", "`Trainer.fit` stopped: `max_epochs=20` reached."]
    for name in REPORTING:
        logger = logging.getLogger(name)
        for message in [*said_again, *kept]:
            record = logger.makeRecord(name, logging.INFO, __file__, 0, message, (), None)
            assert bool(logger.filter(record)) == (message in kept), (name, message)


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


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--print_config"], ["--trainer.max_epoch", "2"]],
    ids=["help", "print_config", "bad flag"],
)
def test_parsing_the_arguments_writes_nothing(workdir, capsys, args):
    with pytest.raises(SystemExit):
        main(["fit", *args])
    assert not list(workdir.iterdir())


def test_default_yaml_is_the_defaults(capsys, tmp_path):
    """configs/default.yaml is read first by every command, and nothing else holds its
    values: a project whose defaults file says otherwise trains otherwise."""
    assert PROJECT.defaults == CONFIGS / "default.yaml"
    assert printed_config(capsys, "--config", str(CONFIGS / "default.yaml")) == printed_config(
        capsys
    )
    defaults = yaml.safe_load(PROJECT.defaults.read_text())
    defaults["trainer"]["max_epochs"] += 7
    changed = tmp_path / "default.yaml"
    changed.write_text(yaml.safe_dump(defaults))
    with pytest.raises(SystemExit):
        main(["fit", "--print_config"], project=replace(PROJECT, defaults=changed))
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == defaults["trainer"]["max_epochs"]


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


# What each shipped config must have changed, checked on the Trainer it built; a
# config of your own only has to train.
CONFIG_EFFECTS = {
    "accumulate.yaml": lambda t: t.accumulate_grad_batches == 4,
    "debug.yaml": lambda t: t.train_dataloader.num_workers == 0,
    "default.yaml": lambda t: t.checkpoint_callback.save_last is True,
    "profile.yaml": lambda t: isinstance(t.profiler, SimpleProfiler),
}


def kind_of(path) -> str:
    """What a file in configs/ is: a search space (its keys are flags, `model.lr`), a
    config that starts processes (DDP re-runs the command: tests/kit/test_ddp.py runs it),
    one for a GPU, or a config `fit` runs in this process."""
    config = yaml.safe_load(path.read_text()) or {}
    if any("." in str(key) for key in config):
        return "space"
    trainer = config.get("trainer") or {}
    if str(trainer.get("strategy", "")).startswith("ddp"):
        return "processes"
    if trainer.get("accelerator") in ("gpu", "cuda"):
        return "gpu"
    return "fit"


def config_params() -> list:
    return [
        pytest.param(path, id=path.stem, marks=[pytest.mark.gpu] if kind == "gpu" else [])
        for path in sorted(CONFIGS.glob("*.yaml"))
        if (kind := kind_of(path)) in ("fit", "gpu")
    ]


def test_every_listed_config_is_shipped():
    shipped = {path.name: kind_of(path) for path in CONFIGS.glob("*.yaml")}
    assert set(CONFIG_EFFECTS) <= {name for name, kind in shipped.items() if kind == "fit"}


def test_a_config_of_your_own_trains(workdir):
    """The README's invitation: a copy of default.yaml, changed, is a config like any other."""
    mine = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    mine["trainer"]["max_epochs"] = 1
    (workdir / "mine.yaml").write_text(yaml.safe_dump(mine))
    assert kind_of(workdir / "mine.yaml") == "fit"
    cli = main(["fit", "--config", "mine.yaml", "--trainer.fast_dev_run", "true"])
    assert cli.trainer.state.finished


@pytest.mark.parametrize("path", config_params())
def test_fast_dev_run_with_each_config(path, workdir, capsys):
    trainer_config = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
    if trainer_config.get("accumulate_grad_batches", 1) != 1 and optimizes_by_hand():
        # Lightning accumulates only the steps it takes: refused in one line, naming the choice.
        assert command(["fit", "--config", str(path), "--trainer.fast_dev_run", "true"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "accumulate in training_step" in err
        return
    copies = [c for c in configured().trainer.callbacks if isinstance(c, WHOLE_COPIES)]
    if copies and (yaml.safe_load(path.read_text()) or {}).get("fsdp"):
        # The project's weight averaging keeps a whole copy, which FSDP cannot make.
        assert command(["fit", "--config", str(path), "--trainer.fast_dev_run", "true"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{type(copies[0]).__name__} keeps a whole copy" in err
        return
    cli = main(["fit", "--config", str(path), "--trainer.fast_dev_run", "true"])
    trainer = cli.trainer
    assert trainer.state.finished and batches_trained(trainer) == 1
    # A smoke test (configs/debug.yaml) leaves no checkpoint, and offers none to continue.
    assert not list(workdir.rglob("*.ckpt")) and "continue:" not in capsys.readouterr().err
    if path.name == "gpu.yaml":
        assert trainer.precision == "bf16-mixed"
        assert trainer.strategy.root_device.type == "cuda"
    elif path.name in CONFIG_EFFECTS:
        assert CONFIG_EFFECTS[path.name](trainer)


def test_a_model_that_steps_its_own_optimizers_gets_ddp_that_finds_unused_parameters():
    """Manual optimization (a GAN): each backward leaves the other network's parameters
    out, which DDP looks for; Lightning accumulates no gradients for it: one line says so."""
    trainer = {"strategy": "ddp", "accumulate_grad_batches": 1}
    manual_optimization("PointGAN", trainer)
    assert trainer["strategy"] == "ddp_find_unused_parameters_true"
    with pytest.raises(ConfigError) as refused:
        manual_optimization("PointGAN", {"accumulate_grad_batches": 4})
    assert str(refused.value).startswith(
        "trainer.accumulate_grad_batches=4 with manual optimization"
        " (PointGAN.automatic_optimization is False)"
    )
    assert "accumulate in training_step" in str(refused.value)


@pytest.mark.target
def test_default_fit_reaches_the_target(default_fit):
    (run,) = run_dirs(default_fit)
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    assert (run / "checkpoints" / "last.ckpt").exists()
    assert (run / "config.yaml").exists()
    logged = logged_scalars(run)
    assert MONITOR in logged
    score = best_score(load_checkpoint(best))
    assert reached(score, TARGET, MODE), f"{MONITOR} {score:.4f}, target {TARGET} ({MODE})"
    assert score == pytest.approx(max(logged[MONITOR]) if MODE == "max" else min(logged[MONITOR]))
    epochs = yaml.safe_load(PROJECT.defaults.read_text())["trainer"]["max_epochs"]
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["epoch"] == epochs - 1


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
        # Kept beside the run, by checkpoint, for the model card of an export of it.
        kept = json.loads((run / "test_metrics.json").read_text())
        assert kept == {
            best.name: {name: float(value) for name, value in tested.callback_metrics.items()}
        }
        assert command(["export", "--ckpt_path", str(best), "--output", "handed-over/"]) == 0
        card = (workdir / "handed-over" / "README.md").read_text()
        for name, value in kept[best.name].items():
            assert f"| {name} | {value:.4g} |" in card
    # Into the checkpoint's own run, beside its training curves; no new run anywhere.
    assert run_dirs(workdir / "copy") == [run]
    assert len(logged_scalars(run)[MONITOR]) == before + 1
    assert not made_a_run(workdir)


@pytest.mark.slow
def test_predict_writes_a_row_per_sample_and_no_run(trained_checkpoint, workdir):
    (best,) = trained_checkpoint.parent.glob("best-*.ckpt")
    main(["predict", "--ckpt_path", str(best), "--predictions.output=out/predictions.csv"])
    with open(workdir / "out" / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    expected = loader_length(configured(), "predict")
    assert [int(row["index"]) for row in rows] == list(range(expected))
    assert list(rows[0])[0] == "index" and len(rows[0]) > 1
    assert not made_a_run(workdir)


def test_lightnings_adverts_do_not_reach_the_console(workdir, caplog):
    with caplog.at_level(logging.INFO):
        main(["--trainer.logger=false"], run=False)  # where Lightning offers its service
    assert caplog.records and not [r for r in caplog.records if "Tip:" in r.getMessage()]


def test_no_deprecation_warning_of_lightning_reaches_the_console(workdir):
    """Lightning's code warns under newer torch releases (LeafSpec): the kit keeps it,
    and every other deprecation raised inside Lightning, off a user's console."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "--trainer.fast_dev_run=true", "--trainer.logger=false"])
    noise = [
        f"{w.category.__name__}: {w.message} ({w.filename})"
        for w in caught
        if issubclass(w.category, DeprecationWarning | FutureWarning)
        or any(re.search(pattern, str(w.message)) for pattern in LIBRARY_NOISE)
    ]
    assert noise == []


def test_the_configs_the_docs_name_are_there():
    """Every config a page names exists (configs of your own need no page)."""
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    docs = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    named = set(re.findall(r"configs/([\w.-]+\.yaml)", docs)) - {"mine.yaml"}  # (an example)
    assert named and not named - {path.name for path in CONFIGS.glob("*.yaml")}
