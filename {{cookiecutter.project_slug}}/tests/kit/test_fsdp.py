"""FSDP2 with configs/fsdp.yaml on two CPU processes (gloo): the project's network
sharded with no code of its own, checkpoints that are folders of shards written
whole, a killed run resumed exactly, the shards joined for export and test.

Kit test: it runs whatever model and data `project.py` names.
"""

import os
import re
import shutil
import signal

import pytest
import torch
from instruments import read_records
from lightning.pytorch import LightningModule
from support import (
    CONFIGS,
    INSTRUMENTS,
    NO_DROPOUT,
    PROJECT,
    assert_float_close,
    assert_identical,
    batches_of,
    logged_scalars,
    quiet_trainer,
    run_cli,
    run_dirs,
    run_forked,
    shared,
    whole_copies,
)
from support.models import TwoNetworks
from support.processes import killed_together
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.kit import cli
from {{ cookiecutter.package_name }}.kit.checkpoints import (
    COMMITTED,
    CheckpointError,
    CheckpointSaveError,
    check_checkpoint,
    commit_folder,
    is_sharded,
    recover_folders,
    resume_candidates,
)
from {{ cookiecutter.package_name }}.kit.memory import optimizers_of
from {{ cookiecutter.package_name }}.kit.sharding import (
    FSDP2Strategy,
    FSDPOptions,
    consolidate,
    find_blocks,
    find_parts,
)
from {{ cookiecutter.package_name }}.kit.spec import ConfigError, units_of
from {{ cookiecutter.package_name }}.kit.sweep import fsdp_requested

MONITOR = PROJECT.monitor
FSDP = (f"--config={CONFIGS / 'fsdp.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2")
FLAGS = (
    "--trainer.max_epochs=2",
    "--trainer.enable_progress_bar=false",
    "--checkpoint.every_n_train_steps=2",
)


class Transformer(nn.Module):
    """An embedding, three encoder layers (each with an attention inside) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.head = nn.Linear(8, 2)


def test_the_repeated_blocks_are_sharded_one_by_one_the_outermost_only():
    network = Transformer()
    blocks = find_blocks([network])
    assert blocks == list(network.encoder.layers)  # not the attention inside each
    assert find_blocks([network], ["encoder.layers.*"]) == blocks
    assert find_blocks([network], ["TransformerEncoderLayer"]) == blocks
    assert find_blocks([network], ["head"]) == [network.head]
    assert find_blocks([nn.Sequential(nn.Linear(2, 2), nn.ReLU())]) == []  # the root alone
    # Blocks repeated across the modules FSDP wraps: each module's, named from it.
    other = Transformer()
    assert find_blocks([network, other]) == blocks + list(other.encoder.layers)
    assert find_blocks([network, other], ["head"]) == [network.head, other.head]


def test_the_networks_other_parts_are_units_of_their_own_unless_they_share_a_weight():
    network = Transformer()
    blocks = find_blocks([network])
    assert find_parts(network, blocks) == [network.embed, network.head]  # encoder: blocks only
    network.head = nn.Linear(8, 4, bias=False)
    network.embed = nn.Linear(4, 8, bias=False)
    network.head.weight = network.embed.weight  # tied: both stay with the network
    assert find_parts(network, blocks) == []


class CallsPartsOneByOne(LightningModule):
    """A step that calls the network's parts itself, never the network's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Transformer()

    def training_step(self, batch, batch_idx):
        hidden = self.net.encoder(self.net.embed(batch[0]))
        return nn.functional.cross_entropy(self.net.head(hidden[:, -1]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_step_may_call_the_networks_parts_one_by_one(tmp_path):
    data = TensorDataset(torch.randn(8, 3, 4), torch.randint(0, 2, (8,)))
    strategy = FSDP2Strategy()  # the module's one child with weights: net
    trainer = quiet_trainer(default_root_dir=tmp_path, strategy=strategy, max_steps=2)
    module = CallsPartsOneByOne()
    trainer.fit(module, DataLoader(data, batch_size=4))
    assert trainer.global_step == 2 and trainer.strategy.sharded_blocks == 3


def test_a_block_name_that_matches_nothing_is_named_with_what_there_is():
    with pytest.raises(ValueError, match=r"fsdp.blocks: 'Layer' matches no module") as caught:
        find_blocks([Transformer()], ["Layer"])
    assert "TransformerEncoderLayer" in str(caught.value)


def test_the_projects_network_has_blocks_or_is_sharded_whole():
    """Whatever the project's model, what FSDP wraps holds every weight, and finding its
    blocks works and finds modules of it."""
    model = PROJECT.model()
    units = units_of(model, PROJECT.wrap)
    held = {id(p) for unit in units for p in unit.parameters()}
    assert units and all(id(p) in held for p in model.parameters())
    blocks = find_blocks(units, PROJECT.shard_blocks)
    inside = [module for unit in units for module in unit.modules()]
    assert all(any(block is module for module in inside) for block in blocks)


def test_fsdp_wraps_every_network_of_the_module_whatever_export_writes(tmp_path):
    data = TensorDataset(torch.randn(8, 2))
    strategy = FSDP2Strategy()  # Project.network ("generator", for export) plays no part
    trainer = quiet_trainer(default_root_dir=tmp_path, strategy=strategy, max_steps=4)
    module = TwoNetworks()
    trainer.fit(module, DataLoader(data, batch_size=4))
    assert trainer.global_step == 4  # two batches, two optimizer steps each
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(module.generator, FSDPModule) and isinstance(module.critic, FSDPModule)


def test_weights_fsdp_would_not_shard_are_refused_in_one_line(tmp_path):
    module = TwoNetworks()
    module.scale = nn.Parameter(torch.ones(()))  # on the module itself, in no submodule
    trainer = quiet_trainer(default_root_dir=tmp_path, strategy=FSDP2Strategy(), max_steps=1)
    with pytest.raises(ConfigError, match=r"fsdp: TwoNetworks has weights outside .* \(scale\)"):
        trainer.fit(module, DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4))
    with pytest.raises(ConfigError, match=r"Project.wrap='gen' is not a submodule of TwoNetworks"):
        units_of(TwoNetworks(), ["gen"])


def test_tensor_parallelism_and_a_second_strategy_are_refused_by_name(workdir, capsys):
    with pytest.raises(ValueError, match=r"fsdp.tensor_parallel_size=2: .* data-parallel"):
        FSDP2Strategy(FSDPOptions(enabled=True, tensor_parallel_size=2))
    code = cli.run(["fit", "--fsdp.enabled=true", "--trainer.strategy=ddp"], PROJECT)
    assert code == 2
    assert "fsdp.enabled with trainer.strategy='ddp'" in capsys.readouterr().err
    assert not (workdir / "logs").exists() and not (workdir / "mlruns").exists()


def shard_folder(path, text: str, committed: bool = True):
    path.mkdir(parents=True)
    (path / "meta.pt").write_text(text)
    (path / ".metadata").write_text(text)
    if committed:
        (path / COMMITTED).write_text("complete\n")
    return path


def test_a_sharded_save_replaces_the_folder_whole_and_a_kill_leaves_one_to_resume(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    last = shard_folder(folder / "last.ckpt", "old")
    commit_folder(shard_folder(folder / "last.ckpt.partial", "new", committed=False), last)
    assert (last / "meta.pt").read_text() == "new" and (last / COMMITTED).is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    assert check_checkpoint(last) == last
    assert resume_candidates([tmp_path / "run"]) == [last]
    # Killed between the two renames: the previous folder is put back, the new one dropped.
    os.replace(last, folder / "last.ckpt.old")
    shard_folder(folder / "last.ckpt.partial", "newer")
    assert recover_folders(folder) == [
        "restored last.ckpt from last.ckpt.old",
        "removed last.ckpt.partial",
    ]
    assert (last / "meta.pt").read_text() == "new"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]


def test_a_folder_whose_write_did_not_finish_is_refused_by_name(tmp_path):
    unfinished = shard_folder(tmp_path / "best.ckpt", "x", committed=False)
    with pytest.raises(CheckpointError, match=r"best.ckpt' is not usable: its write did not"):
        check_checkpoint(unfinished)


@pytest.mark.parametrize(
    ("wrapped", "background"),
    [(False, False), (True, False), (True, True)],
    ids=["OSError", "CheckpointException", "in the background"],
)
def test_a_full_disk_during_a_sharded_save_is_one_error_and_keeps_the_last_folder(
    tmp_path, monkeypatch, wrapped, background
):
    """A real distributed-checkpoint save (one process), then one whose writer fails the
    way a full disk does (torch.distributed.checkpoint gathers each rank's error)."""
    from concurrent.futures import Future

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from {{ cookiecutter.package_name }}.kit import sharding
    from {{ cookiecutter.package_name }}.kit.checkpoints import AtomicCheckpointIO

    strategy, last = FSDP2Strategy(), tmp_path / "checkpoints" / "last.ckpt"
    strategy.checkpoint_io = io = AtomicCheckpointIO(background)
    weights = {"weight": torch.arange(6.0).reshape(2, 3)}
    strategy.save_checkpoint({"state_dict": weights, "epoch": 0}, last)
    weights["weight"] += 1  # training goes on; the save holds its own step's state
    if background:
        io.writer.wait()
    assert check_checkpoint(last) == last
    assert torch.equal(consolidate(last)["state_dict"]["weight"], torch.arange(6.0).reshape(2, 3))

    def full_disk(state, folder):
        (folder / "__0_0.distcp").write_bytes(b"half")
        error = OSError(28, "No space left on device")
        raise CheckpointException("save", {0: (error, None)}) if wrapped else error

    def full_disk_later(state, checkpoint_id, **kwargs):
        written = Future()
        try:
            full_disk(state, checkpoint_id)
        except BaseException as error:
            written.set_exception(error)
        return written

    monkeypatch.setattr(sharding, "dcp_save", full_disk)
    monkeypatch.setattr(dcp, "async_save", full_disk_later)
    with pytest.raises(CheckpointSaveError, match=r"No space left on device") as caught:
        strategy.save_checkpoint({"state_dict": {"weight": torch.zeros(2, 3)}, "epoch": 1}, last)
        if background:
            io.writer.wait()
    assert "last.ckpt" in str(caught.value) and "free" in str(caught.value)
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]  # no .partial
    assert consolidate(last)["epoch"] == 0


def test_a_sweep_that_would_shard_its_trials_says_why_not(tmp_path):
    assert fsdp_requested(["--fsdp.enabled=true"], None, {}) == "--fsdp.enabled true"
    assert fsdp_requested(["--fsdp.enabled", "false"], None, {}) is None
    config = CONFIGS / "fsdp.yaml"
    assert fsdp_requested(["--config", str(config)], None, {}) == str(config)
    assert fsdp_requested([], config, {}) == str(config)
    assert fsdp_requested([], None, {"fsdp.cpu_offload": None}) == (
        "the searched flag fsdp.cpu_offload"
    )


# Two processes -----------------------------------------------------------------


def fit(folder, *flags: str, env: dict | None = None, check: bool = True):
    return run_cli("fit", *FLAGS, *FSDP, *flags, cwd=folder, env=env, check=check)


def joined(folder):
    (run,) = run_dirs(folder)
    return run, consolidate(run / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module")
def uninterrupted(request, tmp_path_factory):
    """Two epochs under FSDP on two ranks (dropout off), made once a session."""
    if whole_copies():
        pytest.skip(
            f"the project's {whole_copies()} keeps a whole copy of the model, which FSDP"
            " refuses in one line (test_cli.py holds the refusal)"
        )
    make = lambda folder: fit(folder, INSTRUMENTS, env=NO_DROPOUT)  # noqa: E731
    return shared(request, tmp_path_factory, "fsdp_uninterrupted", make)


@pytest.mark.slow
def test_a_refusal_on_every_rank_is_one_line_for_the_job(workdir):
    refused = fit(workdir, "--fsdp.blocks=[NoSuchBlock]", check=False)
    assert refused.returncode == 2, refused.stderr[-4000:]
    (line,) = [line for line in refused.stderr.splitlines() if "error:" in line]
    if whole_copies():  # refused before its blocks are looked for
        assert line.startswith(f"error: trainer.callbacks: {whole_copies()} keeps a whole copy")
    else:
        assert line.startswith("error: fsdp.blocks: 'NoSuchBlock' matches no module")
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_fsdp_shards_the_network_and_saves_folders_of_shards(uninterrupted):
    (run,) = run_dirs(uninterrupted)
    folders = sorted((run / "checkpoints").iterdir())
    assert {f.name for f in folders if f.name.startswith("best-")} and all(
        f.is_dir() and (f / COMMITTED).is_file() and len(list(f.glob("*.distcp"))) == 2
        for f in folders
    )
    checkpoint = consolidate(run / "checkpoints" / "last.ckpt")
    module = PROJECT.model()
    optimizers, _ = optimizers_of(module)
    assert checkpoint["global_step"] > 0
    assert len(checkpoint["optimizer_states"]) == (len(optimizers) or 1)
    # The shards join into the whole module, every weight of its full shape.
    for name, tensor in module.state_dict().items():
        assert checkpoint["state_dict"][name].shape == tensor.shape, name


@pytest.mark.slow
@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_stopped_fsdp_run_resumes_exactly(workdir, uninterrupted, sent):
    """Both ranks stopped mid-epoch. SIGTERM, reaching the ranks at different steps: they
    stop together and save their shards; resumed with --ckpt_path last, weights,
    optimizer state and the logged metric are as if never stopped. SIGKILL, together:
    the newest complete folder of shards is resumed on one process, the shards joined
    into its one shard (optimizer state included) and the global batch kept: the same
    to float precision. (Loading a folder on two ranks is the SIGTERM case's.)"""
    _, theirs = joined(uninterrupted)
    steps = batches_of(theirs) // (theirs["epoch"] + 1)
    env = {**NO_DROPOUT, "INSTRUMENTS_KILL_STEP": str(steps * 3 // 2)}
    killed_together("fit", *FLAGS, *FSDP, INSTRUMENTS, cwd=workdir, env=env, sent=sent)
    (run,) = run_dirs(workdir)
    interrupted = run / "checkpoints" / "interrupted.ckpt"
    assert is_sharded(interrupted) == (sent == signal.SIGTERM)
    if sent == signal.SIGKILL:
        one = shutil.copytree(workdir, workdir / "on-one")
        flags = (*FLAGS, *FSDP, "--ckpt_path=last", INSTRUMENTS, "--trainer.devices=1")
        alone = run_forked("fit", *flags, cwd=one, env=NO_DROPOUT)  # one process: forked
        assert "saved by 2 processes, resumed by 1" in alone.stderr
        (_, ours), (_, theirs) = joined(one), joined(uninterrupted)
        assert (ours["epoch"], ours["global_step"]) == (theirs["epoch"], theirs["global_step"])
        assert_float_close(ours["state_dict"], theirs["state_dict"], "state_dict")
        assert_float_close(ours["optimizer_states"], theirs["optimizer_states"], "optimizer")
        return
    env = {**NO_DROPOUT, "INSTRUMENTS_RECORD": str(workdir / "s")}
    resumed = fit(workdir, "--ckpt_path=last", INSTRUMENTS, env=env)
    (continued,) = re.findall(r"continue: .*", resumed.stdout + resumed.stderr)
    assert continued.endswith("--fsdp.enabled true")  # its checkpoints are shards
    starts = {r["rank"]: r["batches"] for r in read_records(workdir / "s", "train_start")}
    assert starts[0] == starts[1] and starts[0] % steps  # both ranks, mid-epoch
    (run, ours), (their_run, _) = joined(workdir), joined(uninterrupted)
    assert (ours["epoch"], ours["global_step"]) == (theirs["epoch"], theirs["global_step"])
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_identical(ours[key], theirs[key], key)
    assert logged_scalars(run)[MONITOR] == logged_scalars(their_run)[MONITOR]


@pytest.mark.slow
def test_a_folder_of_shards_exports_and_tests_as_the_unsharded_network(workdir, uninterrupted):
    (run,) = run_dirs(uninterrupted)
    folder = run / "checkpoints" / "last.ckpt"
    # One process each (forked from a server that imported Lightning once): no sharding.
    run_forked("export", "--ckpt_path", str(folder), "--output", "model.pt", cwd=workdir)
    exported = torch.load(workdir / "model.pt", map_location="cpu", weights_only=True)
    whole = consolidate(folder)["state_dict"]
    prefix = exported["attribute"] + "." if exported["attribute"] else ""
    assert exported["state_dict"].keys() == {
        key[len(prefix) :] for key in whole if key.startswith(prefix)
    }
    for name, tensor in exported["state_dict"].items():
        assert torch.equal(tensor, whole[prefix + name]), name
    run_forked("export", "--ckpt_path", str(folder), "--output", "model.pt2", cwd=workdir)
    tested = run_forked("test", "--ckpt_path", str(folder), "--trainer.logger=false", cwd=workdir)
    assert "test/" in tested.stdout + tested.stderr
    # Training on from the shards needs the sharded strategy: said in one line.
    refused = run_forked("fit", "--ckpt_path", str(folder), cwd=workdir, check=False)
    assert refused.returncode == 2
    assert "is a folder of shards of an FSDP run: continue it with --fsdp.enabled true" in (
        refused.stderr
    )
    assert not (workdir / "logs").exists() and not (workdir / "mlruns").exists()
