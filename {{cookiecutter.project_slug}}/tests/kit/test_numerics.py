"""The model's numbers, pinned: a change that moves them fails here, by name.

Kit test: it runs whatever model and data `project.py` names. With a fixed seed
and the first training batch of the project's own data, it takes statistics
(mean, standard deviation, largest magnitude) of the initial weights, the
network's output, the gradients of one training step and the weights after its
optimizer step, and compares them with those recorded in tests/numerics.json,
within a tolerance that fits each tensor's dtype. The step is Lightning's own,
one step of a fit: the optimizers come from `configure_optimizers` with the
Trainer attached (a schedule over `estimated_stepping_batches` works), and a
model that steps its optimizers itself does so. A change meant to move the
numbers records them again, and the file is committed with it:

    pytest tests/kit/test_numerics.py --record-numerics

A record of another model class (project.py now names yours) is replaced by
your model's numbers, with a warning that says so; under CI (the CI variable
set) it fails instead, with that command.
"""

import json
import math
import os
import warnings

import pytest
import torch
from support import PROJECT, TESTS, configured, first_batch, quiet_trainer

from {{ cookiecutter.package_name }}.kit.export import network_inputs, tensors_of
from {{ cookiecutter.package_name }}.kit.spec import network_of

RECORD = TESTS / "numerics.json"
SEED = 0
RECORD_AGAIN = "pytest tests/kit/test_numerics.py --record-numerics"
STATISTICS = ("mean", "std", "max |x|")
PHASES = {
    "init": "initial weight",
    "forward": "network output",
    "grad": "gradient",
    "step": "weight after one optimizer step",
}


def statistics(tensor: torch.Tensor) -> dict:
    """What is recorded of one tensor: its dtype, shape, and mean, standard deviation and
    largest magnitude, in float64."""
    values = tensor.detach().double()
    stats = [values.mean(), values.std(unbiased=False), values.abs().max()]
    return {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "stats": [float(f"{v:.8g}") for v in stats] if values.numel() else [],
    }


def model_name() -> str:
    """The model's class, without the package (a project renamed keeps its record)."""
    module = PROJECT.model.__module__.removeprefix(f"{PROJECT.package}.")
    return f"{module}.{PROJECT.model.__qualname__}"


def numerics(change_forward=None) -> dict[str, dict]:
    """The statistics of every tensor, in order: the initial weights, the network's
    output (eval mode, no gradient), the first gradient of each weight in one training
    step, the weights after it. `change_forward(output)` replaces the network's output."""
    cli = configured(f"--seed_everything={SEED}")
    model = cli.model.cpu()
    batch = first_batch(cli)
    weights = dict(model.named_parameters())
    found = {f"init/{name}": statistics(p) for name, p in weights.items()}
    _, network = network_of(model, PROJECT.network)
    if change_forward is not None:
        network.register_forward_hook(lambda module, args, output: change_forward(output))
    model.eval()
    with torch.no_grad():
        outputs = tensors_of(network(*network_inputs(batch, PROJECT.network_inputs)))
    found |= {f"forward/{index}": statistics(out) for index, out in enumerate(outputs)}
    model.train()
    grads: dict[str, dict] = {}

    def first_gradient(weight: torch.Tensor) -> None:
        name = names[id(weight)]
        if name not in grads:
            grads[name] = statistics(weight.grad)

    names = {id(weight): f"grad/{name}" for name, weight in weights.items()}
    for weight in weights.values():
        if weight.requires_grad:  # (a frozen one takes no hook)
            weight.register_post_accumulate_grad_hook(first_gradient)
    torch.manual_seed(SEED)  # the loader's order and the step's own draws: dropout, noise
    one_step = quiet_trainer(max_steps=1, limit_val_batches=0, num_sanity_val_steps=0)
    one_step.fit(model, datamodule=cli.datamodule)
    found |= dict(sorted(grads.items(), key=lambda item: list(weights).index(item[0][5:])))
    return found | {f"step/{name}": statistics(p) for name, p in weights.items()}


def tolerance(dtype: str) -> float:
    """How far a statistic may move, relative to the tensor's scale: the square root of
    the dtype's machine epsilon (3.5e-4 for float32); 0 for integers."""
    kind = getattr(torch, dtype)
    return math.sqrt(torch.finfo(kind).eps) if kind.is_floating_point else 0.0


def first_moved(recorded: dict, now: dict) -> str | None:
    """What moved first, in the recorded order, as one line; None if nothing did."""
    if recorded["model"] != now["model"]:
        return f"tests/numerics.json records {recorded['model']}; project.py names {now['model']}"
    before, after = recorded["tensors"], now["tensors"]
    gone, new = [k for k in before if k not in after], [k for k in after if k not in before]
    if gone or new:
        return f"the tensors differ: gone {gone or 'none'}, new {new or 'none'}"
    for key, was in before.items():
        phase, _, name = key.partition("/")
        what = f"{PHASES[phase]} {name}"
        got = after[key]
        if (got["dtype"], got["shape"]) != (was["dtype"], was["shape"]):
            return f"{what}: {got['dtype']} {got['shape']}, recorded {was['dtype']} {was['shape']}"
        allowed = tolerance(was["dtype"]) * (1 + max(map(abs, was["stats"]), default=0))
        for label, a, b in zip(STATISTICS, got["stats"], was["stats"], strict=True):
            if not abs(a - b) <= allowed:
                return f"{what}: {label} {a:.6g}, recorded {b:.6g} (allowed {allowed:.2g})"
    return None


def record_of(tensors: dict) -> dict:
    return {
        "model": model_name(),
        "seed": SEED,
        "recorded with": f"torch {torch.__version__}",
        "tensors": tensors,
    }


def as_text(record: dict) -> str:
    """The record as JSON, a line per tensor, so that a change reads well in a diff."""
    head = json.dumps({k: v for k, v in record.items() if k != "tensors"}, indent=1)
    tensors = record["tensors"]
    lines = ",\n".join(f"  {json.dumps(key)}: {json.dumps(tensors[key])}" for key in tensors)
    return head[:-2] + ',\n "tensors": {\n' + lines + "\n }\n}\n"


@pytest.fixture(scope="module")
def now(tmp_path_factory) -> dict:
    """This model's numbers, as the file holds them (the data, if the project writes
    any, in a folder of its own)."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("numerics"))
    try:
        return json.loads(as_text(record_of(numerics())))
    finally:
        os.chdir(here)


def test_the_models_numbers_are_the_recorded_ones(now, request):
    if request.config.getoption("record_numerics"):
        RECORD.write_text(as_text(now), encoding="utf-8")
        return
    assert RECORD.is_file(), f"no tests/{RECORD.name} yet: record it with `{RECORD_AGAIN}`"
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    if recorded["model"] != now["model"]:  # the example replaced by a model of your own
        assert not os.environ.get("CI"), (
            f"tests/{RECORD.name} records {recorded['model']}, project.py names"
            f" {now['model']}: `{RECORD_AGAIN}`, and commit tests/{RECORD.name}"
        )
        RECORD.write_text(as_text(now), encoding="utf-8")
        warnings.warn(
            f"tests/{RECORD.name} recorded {recorded['model']}; project.py names"
            f" {now['model']}, whose numbers it now records: commit it",
            stacklevel=1,
        )
        return
    moved = first_moved(recorded, now)
    assert moved is None, (
        f"the model's numbers moved: {moved}. If that is meant: `{RECORD_AGAIN}`, and"
        f" commit tests/{RECORD.name}"
    )


def test_a_changed_forward_is_named(now, workdir):
    def shifted(output):
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            pytest.skip(f"the network returns {type(output).__name__}, not a float tensor")
        return output + 0.01 * (1 + output.detach().abs().max())

    moved = first_moved(now, record_of(numerics(shifted)))
    assert moved is not None and moved.startswith("network output 0: mean"), moved
