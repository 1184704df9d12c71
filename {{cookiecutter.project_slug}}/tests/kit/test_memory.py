"""`doctor --memory` counts parameters, gradients and optimizer state as a hand
calculation does, under DDP and FSDP; measures a step's activations on fake tensors;
and names configs/fsdp.yaml exactly when DDP does not fit and FSDP does.

Kit test: the estimate runs on whatever model and data `project.py` names.
"""

import json
import math
import re
from types import SimpleNamespace

import pytest
import torch
from support import PROJECT
from support.models import CriticFirst, FrozenBackbone, TwoNetworks
from torch import nn

from {{ cookiecutter.package_name }}.kit import doctor, footprint, memory
from {{ cookiecutter.package_name }}.kit.callbacks import format_environment, memory_facts
from {{ cookiecutter.package_name }}.kit.footprint import Param, PerRank, per_rank, shard_numel
from {{ cookiecutter.package_name }}.kit.memory import Gpu
from {{ cookiecutter.package_name }}.kit.spec import init_parameters

# nn.Linear(1000, 1000): 1,000,000 weights + 1,000 biases = 1,001,000 parameters.
LINEAR = 1_001_000
# How a step's activations were measured: on fake tensors, or (a step that reads values)
# by a real step of a tiny batch, scaled.
MEASURED = ("peak of one step, fake tensors", "peak of one real CPU step of batch")


def linear_on_meta() -> nn.Module:
    with torch.device("meta"):
        return nn.Linear(1000, 1000)


def test_fsdp_shards_are_dim_0_chunks_padded_to_the_first():
    # ceil(dim0 / world size) rows a rank, whatever the rank (FSDP2's padding).
    assert shard_numel((1000, 1000), 1) == 1_000_000
    assert shard_numel((1000, 1000), 3) == 334 * 1000  # not 333,333.3
    assert shard_numel((1000,), 8) == 125
    assert shard_numel((10,), 4) == 3  # ranks hold 3, 3, 3 and 1 + 2 rows of padding
    assert shard_numel((7, 3), 8) == 3  # more ranks than rows: one padded row each
    assert shard_numel((), 4) == 1  # a scalar is one row


@pytest.mark.parametrize(
    ("world_size", "per_rank_params"),
    [(2, 500 * 1000 + 500), (4, 250 * 1000 + 250), (3, 334 * 1000 + 334)],
)
def test_a_linear_layer_by_hand_under_ddp_and_fsdp(world_size, per_rank_params):
    model = linear_on_meta()
    optimizer = torch.optim.AdamW(model.parameters())  # no state until a step: nothing allocated
    params, buffers, facts = footprint.params_of(model, [optimizer])
    assert sum(math.prod(p.shape) for p in params) == LINEAR and buffers == 0
    assert facts.name == "AdamW"
    ddp = per_rank(params, world_size, sharded=False)
    assert ddp == PerRank(parameters=4_004_000, gradients=4_004_000, optimizer_state=8_008_000)
    fsdp = per_rank(params, world_size, sharded=True)
    fp32 = 4 * per_rank_params
    assert fsdp == PerRank(parameters=fp32, gradients=fp32, optimizer_state=2 * fp32)
    if world_size in (2, 4):  # divides 1,000 rows: exactly a world size's share
        assert fsdp.parameters == 4_004_000 // world_size


def test_optimizer_state_is_counted_per_optimizer_and_its_options():
    assert footprint.state_slots("AdamW") == footprint.state_slots("Adam") == 2
    assert footprint.state_slots("Adam", amsgrad=True) == 3
    assert footprint.state_slots("SGD") == 0
    assert footprint.state_slots("SGD", momentum=0.9) == 1
    assert footprint.state_slots("RMSprop", momentum=0.9, centered=True) == 3
    assert footprint.state_slots("SomethingElse") is None
    model = linear_on_meta()
    for optimizer, state in [
        (torch.optim.SGD(model.parameters(), lr=0.1), 0),
        (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), 4_004_000),
        (torch.optim.Adam(model.parameters(), amsgrad=True), 12_012_000),
    ]:
        params, _, facts = footprint.params_of(model, [optimizer])
        assert per_rank(params).optimizer_state == state, facts.name
    # Frozen weights count as trained: a fine-tune may unfreeze them, and the plan is for
    # the whole run. Their optimizer state is that of the optimizer's weights.
    frozen = linear_on_meta().requires_grad_(False)
    params, _, facts = footprint.params_of(frozen, [])
    assert per_rank(params) == PerRank(4_004_000, 4_004_000, 8_008_000)
    assert "1,001,000 frozen weights counted" in str(facts.note)
    half = linear_on_meta()
    half.bias.requires_grad_(False)
    params, _, _ = footprint.params_of(half, [torch.optim.Adam([half.weight])])
    assert per_rank(params) == PerRank(4_004_000, 4_004_000, 8_008_000)


def test_an_optimizer_that_cannot_be_built_on_the_meta_device_is_assumed_adamw():
    class NeedsATrainer(nn.Linear):
        def configure_optimizers(self):
            raise RuntimeError("not attached to a Trainer")

    with torch.device("meta"):
        model = NeedsATrainer(1000, 1000)
    found, why = memory.optimizers_of(model)
    assert found == [] and "configure_optimizers failed on the meta model" in why
    params, _, facts = footprint.params_of(model, found)
    assert facts.name == "AdamW (assumed)"
    assert per_rank(params).optimizer_state == 8_008_000


def plan_linear(free: int, world_size: int = 4, activations: int = 1_000_000) -> memory.Plan:
    gpus = [Gpu(f"cuda:{i}", free) for i in range(world_size)]
    model = linear_on_meta()
    return memory.plan(
        model,
        world_size,
        gpus,
        memory.Activations(activations, "given"),
        batch_size=64,
        optimizers=[torch.optim.AdamW(model.parameters())],
        given=True,
    )


def test_the_verdict_names_the_fsdp_config_exactly_when_only_fsdp_fits():
    # DDP: 16,016,000 B of states + 1,000,000 of activations = 17,016,000 B a rank;
    # FSDP over 4: 4,004,000 + 1,000,000 = 5,004,000 B; 10% of the free memory is kept.
    assert plan_linear(free=20_000_000).ddp.total == 17_016_000
    fits = plan_linear(free=20_000_000)  # 18,000,000 usable
    assert fits.kind == "ddp" and fits.advice.startswith("DDP fits")
    assert "configs/fsdp.yaml" not in fits.advice and "10% headroom" in fits.advice
    sharded = plan_linear(free=10_000_000)  # 9,000,000 usable
    assert sharded.fsdp.total == 5_004_000
    assert sharded.kind == "fsdp"
    assert "`fit --config configs/fsdp.yaml`" in sharded.advice
    neither = plan_linear(free=5_000_000)  # 4,500,000 usable
    assert neither.kind == "neither"
    for advice in ("--fsdp.activation_checkpointing true", "--trainer.accumulate_grad_batches"):
        assert advice in neither.advice
    # 5 ranks: ceil(1000/5) = 200 rows, 200,200 x 16 B + 1,000,000 = 4,203,200 B.
    assert "FSDP fits from 5 ranks" in neither.advice
    crowded = plan_linear(free=1_000_000)  # 900,000 usable: the activations alone are more
    assert crowded.kind == "neither" and "more devices do not shrink them" in crowded.advice
    text = memory.format_plan(sharded)
    for expected in ("planned world size 4", "per-device batch 64", "AdamW", "DDP", "FSDP"):
        assert expected in text
    assert "verdict: DDP does not fit" in text


def test_without_a_gpu_or_a_figure_there_is_nothing_to_compare_with():
    kind, advice = memory.verdict(PerRank(1, 1, 1, 1), PerRank(1, 1, 1, 1), [], 1)
    assert kind == "no-gpu" and "--devices_free_gib" in advice


def test_a_bad_world_size_names_the_value_and_the_rule(capsys):
    with pytest.raises(ValueError, match=r"--world_size 0: must be 1 or more"):
        per_rank([Param((4,), 4)], 0, sharded=True)
    code = doctor.main(["--memory", "--world_size", "0"], project=PROJECT)
    assert code == 2
    assert (
        "error: --world_size 0: must be 1 or more (the number of ranks" in capsys.readouterr().err
    )
    assert doctor.main(["--world_size", "2"]) == 2  # without --memory
    assert "--world_size: only with --memory" in capsys.readouterr().err
    code = doctor.main(["--memory", "--devices_free_gib", "0"], project=PROJECT)
    assert code == 2 and "--devices_free_gib 0: must be above 0" in capsys.readouterr().err


def expected_figures() -> tuple[int, int]:
    """(parameters, bytes of weights and buffers) of the project's model with its defaults."""
    with torch.device("meta"):
        model = PROJECT.model()
    count = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return count, weights + sum(b.numel() * b.element_size() for b in model.buffers())


def test_doctor_memory_prints_the_table_for_the_project(capsys):
    code = doctor.main(
        ["--memory", "--world_size", "2", "--devices_free_gib", "1000", "--precision", "32-true"],
        project=PROJECT,
    )
    out = capsys.readouterr().out
    assert code == 0
    count, _ = expected_figures()
    assert "memory per rank (planned world size 2, per-device batch" in out
    assert f"{count:,} parameters" in out
    for row in ("parameters", "gradients", "optimizer state", "activations", "total"):
        assert f"\n{row} " in out
    assert re.search(r"\nactivations +\S+ \w+ +\S+ \w+   \((peak of one (step|real CPU step))", out)
    assert "GPUs: 2 x 1000 GiB free each (given: --devices_free_gib)" in out
    assert "verdict: DDP fits" in out  # an example's model, on a thousand GiB


def test_doctor_memory_json_has_the_figures_in_bytes(capsys):
    code = doctor.main(
        ["--memory", "--json", "--world_size", "1", "--precision", "32-true"], project=PROJECT
    )
    report = json.loads(capsys.readouterr().out)
    plan = report["memory"]
    count, weights = expected_figures()
    assert plan["parameter_count"] == count
    assert plan["ddp"]["parameters"] == plan["fsdp"]["parameters"] == weights  # one rank
    assert plan["ddp"]["activations"] > 0 and plan["activations_method"].startswith(MEASURED)
    assert plan["batch_size"] == PROJECT.datamodule().batch_size
    if not torch.cuda.is_available():
        assert plan["gpus"] == [] and plan["verdict"] == "no-gpu" and code == 0


def test_flags_after_the_separator_configure_the_run_as_fit_would(capsys):
    if "batch_size" not in init_parameters(PROJECT.datamodule):
        pytest.skip("the DataModule takes no batch_size")
    args = ["--memory", "--json", "--precision", "32-true", "--", "--data.batch_size", "3"]
    assert doctor.main(args, project=PROJECT) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["batch_size"] == 3
    assert doctor.main(["--memory", "--", "--data.batch_size", "many"], project=PROJECT) == 2
    assert "error: fit refused the flags after `--` (--data.batch_size many)" in (
        capsys.readouterr().err
    )


def project_batch(size: int):
    built = doctor.build_for_memory(PROJECT, [])
    batch, batch_size = memory.first_batch(built.datamodule)
    return built.model, memory._sliced(batch, batch_size, size)


def test_fake_tensors_measure_what_a_real_step_allocates(monkeypatch):
    """On layers with no scratch memory of their own, fake tensors and a real step agree to
    the byte, and the fallback scales a real step of a tiny slice of the batch.

    (A real CPU convolution also allocates its kernel's workspace, which fake tensors do
    not have: the two differ by that much, which at a tiny batch is a large share.)"""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    batch = (torch.randn(64, 32),)
    fake = memory.measure_activations(model, batch, 64)
    assert fake.method == "peak of one step, fake tensors"
    # Held at once at least: the input (64 x 32), the ReLU's output that the backward
    # needs (64 x 64) and the gradient flowing into it (64 x 64), float32.
    assert fake.bytes >= 4 * 64 * (32 + 64 + 64)
    real = memory._real_peak(model, batch, memory.training_step, None, None)
    assert real == fake.bytes

    def fails(*args):
        raise RuntimeError("an op fake tensors cannot run")

    monkeypatch.setattr(memory, "_fake_peak", fails)
    scaled = memory.measure_activations(model, batch, 64)
    tiny = memory.TINY_BATCH
    assert scaled.method.startswith(f"peak of one real CPU step of batch {tiny}, x{64 // tiny}")
    assert "fake tensors failed: RuntimeError" in scaled.method
    small = memory._real_peak(model, (batch[0][:tiny],), memory.training_step, None, None)
    assert scaled.bytes == small * 64 // tiny


def test_a_step_that_optimizes_by_hand_and_calls_a_network_twice_is_measured():
    with torch.device("meta"):
        model = TwoNetworks()
    measured = memory.measure_activations(model, (torch.randn(64, 2),), 64)
    assert measured.method == "peak of one step, fake tensors" and measured.bytes > 0


def test_a_gan_that_generates_again_after_a_backward_is_measured():
    with torch.device("meta"):
        model = CriticFirst()
    measured = memory.measure_activations(model, (torch.randn(64, 2),), 64)
    assert measured.method == "peak of one step, fake tensors" and measured.bytes > 0


def test_a_model_with_frozen_weights_is_measured_as_a_real_step_allocates():
    """MemTracker hooks every parameter's gradient, which a frozen one refuses: the step
    is measured with the frozen weights held as buffers, as the real step holds them."""
    with torch.device("meta"):
        model = FrozenBackbone()
    batch = (torch.randn(64, 16),)
    measured = memory.measure_activations(model, batch, 64)
    assert measured.method == "peak of one step, fake tensors" and measured.bytes > 0
    assert measured.bytes == memory._real_peak(model, batch, memory.training_step, None, None)
    assert not any(p.requires_grad for p in model.backbone.parameters())  # left as it was


def test_the_projects_step_is_measured():
    """Whatever the project's model, one step of its batch is measured: on fake tensors, or
    where its step cannot run on them (it reads values), by a real step of a tiny batch."""
    model, batch = project_batch(memory.TINY_BATCH)
    measured = memory.measure_activations(model, batch, memory.TINY_BATCH)
    assert measured.method.startswith(MEASURED) and measured.bytes > 0, measured.method


def test_the_environment_report_has_the_figures_of_the_live_model(monkeypatch):
    model = nn.Linear(1000, 1000)
    trainer = SimpleNamespace(
        lightning_module=model,
        strategy=object(),  # neither FSDP strategy: replicated
        optimizers=[torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)],
        world_size=4,
    )

    def no_step(*args):
        raise AssertionError("a step at fit start")

    monkeypatch.setattr(memory, "_tracked_peak", no_step)  # shapes only: no step
    facts = memory_facts(trainer)
    assert facts == {
        "optimizer": "SGD+momentum",
        "ranks": 4,
        "ddp_bytes": 3 * 4_004_000,
        "fsdp_bytes": 3 * 1_001_000,
        "sharded": False,
    }
    report = format_environment(
        {**dict.fromkeys(("batch_size", "num_workers")), "gpus": [], "memory": facts}
        | {k: "x" for k in ("torch", "torch_build", "lightning", "cudnn", "cuda_available")}
        | {k: "x" for k in ("accelerator", "strategy", "devices", "num_nodes", "world_size")}
        | {k: "x" for k in ("precision", "matmul_precision")}
    )
    assert (
        "memory per rank (weights, gradients, SGD+momentum state): DDP 11.5 MiB"
        " | FSDP over 4 ranks 2.86 MiB | this run replicates | activations: see doctor --memory"
    ) in report
