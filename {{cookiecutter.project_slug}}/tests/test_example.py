{%- if cookiecutter.example == "digits" -%}
"""The digits example's own tests: its data, its network, its flags.

Example test: rewrite or delete this file when you replace the example; every
other test file is the kit's and runs whatever `project.py` names.
"""

import math

import pytest
import torch
from lightning.pytorch import Trainer
from optuna.trial import FixedTrial
from support import CONFIGS, FakeClock, configured, main
from torch import nn

from {{ cookiecutter.package_name }}.data import DigitFiles, DigitsDataModule, write_digit_files
from {{ cookiecutter.package_name }}.kit.callbacks import find_callback
from {{ cookiecutter.package_name }}.kit.data import LoaderSettings
from {{ cookiecutter.package_name }}.kit.health import TrainingHealth
from {{ cookiecutter.package_name }}.kit.sweep import as_flags, read_space, suggest
from {{ cookiecutter.package_name }}.model import DigitsClassifier, DigitsCNN


def test_the_split_is_70_15_15_of_all_ten_classes():
    data = DigitsDataModule()
    data.setup("fit")
    assert [len(data.splits[name]) for name in ("train", "val", "test")] == [1257, 270, 270]
    x, y = data.splits["train"][0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.long
    assert {int(data.splits["train"][i][1]) for i in range(len(data.splits["train"]))} == set(
        range(10)
    )


def test_the_cnn_maps_images_to_ten_logits():
    assert DigitsCNN()(torch.zeros(4, 1, 8, 8)).shape == (4, 10)
    assert DigitsCNN(channels=8)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def flops_per_sample_by_hand(network: nn.Module, sample: torch.Tensor) -> int:
    """The network's FLOPs for one training sample, from its convolutions and linear
    layers (2 per multiply-add; normalization, activations and pooling count none).

    Backward: each layer's weight gradient costs its forward again, and its input
    gradient once more, except the first layer's (the image needs none).
    """
    forwards = []

    def count(layer: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(layer, nn.Conv2d):
            per_output = layer.in_channels // layer.groups * math.prod(layer.kernel_size)
            forwards.append(2 * output.numel() * per_output)
        else:
            forwards.append(2 * layer.in_features * layer.out_features)

    layers = [m for m in network.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    hooks = [layer.register_forward_hook(count) for layer in layers]
    with torch.no_grad():
        network.eval()(sample.unsqueeze(0))
    for hook in hooks:
        hook.remove()
    return sum(forwards) + forwards[0] + 2 * sum(forwards[1:])


def test_the_health_report_counts_the_cnns_flops_exactly(workdir):
    cli = main(["fit", "--trainer.max_steps=1", "--trainer.logger=false", "--data.batch_size=16"])
    health = find_callback(cli.trainer, TrainingHealth)
    expected = 16 * flops_per_sample_by_hand(cli.model.net, torch.zeros(1, 8, 8))
    assert health.flops_per_batch == expected, (
        f"the health report counts {health.flops_per_batch} FLOP for a batch of 16, the"
        f" network's convolutions and linear layers {expected}: a layer of another kind needs"
        " its count in flops_per_sample_by_hand (tests/test_example.py)"
    )
    # By hand for the default 32 channels: 5,397,504 a sample.
    assert flops_per_sample_by_hand(DigitsCNN(), torch.zeros(1, 8, 8)) == 5_397_504


def test_optimizer_and_scheduler_are_chosen_from_the_command_line():
    cli = configured(
        "--model.optimizer=torch.optim.SGD",
        "--model.optimizer.lr=0.05",
        "--model.optimizer.momentum=0.9",
        "--model.scheduler=torch.optim.lr_scheduler.StepLR",
        "--model.scheduler.step_size=3",
    )
    config = cli.model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["lr"] == 0.05 and optimizer.defaults["momentum"] == 0.9
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR) and scheduler.step_size == 3
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in cli.model.parameters()
    }


def test_predictions_are_a_class_and_its_probability():
    model = DigitsClassifier().eval()
    images = torch.rand(5, 1, 8, 8) * 16
    with torch.no_grad():
        out = model.predict_step((images, torch.zeros(5, dtype=torch.long)), 0)
        assert torch.equal(out["predicted"], model(images).argmax(dim=1))
    assert ((0.1 <= out["probability"]) & (out["probability"] <= 1)).all()


def test_digit_files_hold_the_same_digits_as_memory(tmp_path):
    folder = tmp_path / "digits"
    write_digit_files(folder)
    write_digit_files(folder)  # written once: the second call finds it done
    assert len(list(folder.iterdir())) == 1797
    assert [p.name for p in tmp_path.iterdir()] == ["digits"]  # no staging folder left
    files = DigitsDataModule(from_files=True, data_dir=str(folder))
    memory = DigitsDataModule()
    files.setup("fit")
    memory.setup("fit")
    assert isinstance(files.splits["train"].dataset, DigitFiles)
    for name in ("train", "val", "test"):
        for index in (0, len(memory.splits[name]) - 1):
            (x_file, y_file), (x_mem, y_mem) = files.splits[name][index], memory.splits[name][index]
            assert torch.equal(x_file, x_mem) and y_file == int(y_mem)


def test_digit_files_get_loader_workers(tmp_path, monkeypatch):
    monkeypatch.setattr("{{ cookiecutter.package_name }}.kit.data.available_cpus", lambda: 4)
    data = DigitsDataModule(from_files=True, data_dir=str(tmp_path / "digits"))
    data.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    data.prepare_data()
    data.setup("fit")
    assert data.loader_settings == LoaderSettings(3, False, True)  # read per item: workers


# 1257 training samples: 39 whole batches of 32 (the 9 left wait for another epoch's
# order), all read in the wait windows; every step but the first (which counts the
# FLOPs) timed.
WITHOUT_WORKERS = 38 * 32 * 0.001 / (38 * 32 * 0.001 + 38 * 0.032)


@pytest.mark.parametrize(("workers", "share"), [(0, WITHOUT_WORKERS), (2, 0.0)])
def test_loader_workers_lower_the_data_wait_of_digit_files(workdir, monkeypatch, workers, share):
    """Each file read costs 1 ms of the reading process's clock and each step 32 ms:
    without workers the training process waits half the time, with workers not at all."""
    clock = FakeClock()
    read = DigitFiles.__getitem__
    step = DigitsClassifier.training_step

    def slow_read(self, index):
        clock.advance(0.001)
        return read(self, index)

    def timed_step(self, batch, batch_idx):
        clock.advance(0.032)
        return step(self, batch, batch_idx)

    monkeypatch.setattr(DigitFiles, "__getitem__", slow_read)
    monkeypatch.setattr(DigitsClassifier, "training_step", timed_step)
    cli = main(
        [
            "--data.from_files=true",
            "--data.batch_size=32",
            f"--data.num_workers={workers}",
            "--trainer.max_epochs=1",
            "--trainer.limit_val_batches=0",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    health = find_callback(cli.trainer, TrainingHealth)
    health.clock = clock
    cli.trainer.fit(cli.model, cli.datamodule)
    assert health.summary["data_wait_share"] == pytest.approx(share, abs=1e-3)

{%- else -%}
"""The minimal example's own tests: its data, its network, its flags.

Example test: rewrite or delete this file when you replace the example; every
other test file is the kit's and runs whatever `project.py` names.
"""

import torch
from optuna.trial import FixedTrial
from support import CONFIGS, configured, main
from torch import nn

from {{ cookiecutter.package_name }}.data import SyntheticRegressionDataModule
from {{ cookiecutter.package_name }}.kit.callbacks import find_callback
from {{ cookiecutter.package_name }}.kit.health import TrainingHealth
from {{ cookiecutter.package_name }}.kit.sweep import as_flags, read_space, suggest
from {{ cookiecutter.package_name }}.model import MLP, Regressor


def test_the_split_is_70_15_15_and_the_same_every_time():
    first, second = SyntheticRegressionDataModule(), SyntheticRegressionDataModule()
    first.setup("fit")
    second.setup("fit")
    assert [len(first.splits[name]) for name in ("train", "val", "test")] == [2868, 614, 614]
    x, y = first.splits["train"][0]
    assert x.shape == (16,) and y.shape == (1,)
    for a, b in zip(first.splits["val"].tensors, second.splits["val"].tensors, strict=True):
        assert torch.equal(a, b)


def test_the_health_report_counts_the_mlps_flops_exactly(workdir):
    cli = main(["fit", "--trainer.max_steps=1", "--trainer.logger=false", "--data.batch_size=16"])
    health = find_callback(cli.trainer, TrainingHealth)
    # By hand, 2 FLOPs per multiply-add: forward through each linear layer (16->32->1 by
    # default: 1,088); backward, each layer's weight gradient again, and every layer's
    # input gradient but the first's (the features need none).
    layers = [m for m in cli.model.modules() if isinstance(m, nn.Linear)]
    forwards = [2 * layer.in_features * layer.out_features for layer in layers]
    expected = 16 * (sum(forwards) + forwards[0] + 2 * sum(forwards[1:]))
    assert health.flops_per_batch == expected, (
        f"the health report counts {health.flops_per_batch} FLOP for a batch of 16, the"
        f" network's linear layers {expected}: a layer of another kind needs its count here"
        " (tests/test_example.py)"
    )


def test_the_mlp_maps_features_to_one_output():
    assert MLP()(torch.zeros(4, 16)).shape == (4, 1)


def test_optimizer_and_scheduler_are_chosen_from_the_command_line():
    cli = configured(
        "--model.optimizer=torch.optim.SGD",
        "--model.optimizer.lr=0.05",
        "--model.scheduler=torch.optim.lr_scheduler.StepLR",
        "--model.scheduler.step_size=3",
    )
    config = cli.model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["lr"] == 0.05
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR) and scheduler.step_size == 3


def test_predictions_are_one_number_per_sample():
    model = Regressor().eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        out = model.predict_step((x, torch.zeros(5, 1)), 0)
        assert torch.equal(out["prediction"], model(x)[:, 0])

{%- endif %}


def test_the_sweep_searches_flags_of_this_example():
    """configs/sweep.yaml searches this example's own flags: fit takes each of them at both
    ends of its range (a model or data of your own needs a search space of its own)."""
    space = read_space(CONFIGS / "sweep.yaml")
    for end in (0, -1):
        chosen = {
            name: dist.choices[end] if hasattr(dist, "choices") else (dist.low, dist.high)[end]
            for name, dist in space.items()
        }
        cli = configured(*as_flags(suggest(FixedTrial(chosen), space)))
        assert cli.model.hparams  # built with the trial's values
