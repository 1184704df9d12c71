"""Two CPU processes under DDP (gloo) with configs/ddp.yaml: each rank its own shard,
reshuffled every epoch; one set of outputs; metrics synced over ranks.

Kit test: it runs whatever model and data `project.py` names.
"""

import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from instruments import read_records
from lightning.pytorch import Trainer
from support import (
    DDP,
    PROJECT,
    best_score,
    configured,
    load_checkpoint,
    loader_length,
    logged_scalars,
    main,
    reference,
    run_dirs,
)

from {{ cookiecutter.package_name }}.kit.cli import choose_rendezvous_port
from {{ cookiecutter.package_name }}.kit.machine import RENDEZVOUS_PORTS, free_port

MONITOR = PROJECT.monitor


def test_ranks_on_one_machine_meet_on_a_port_no_connection_can_take(monkeypatch):
    """Lightning's own choice of MASTER_PORT is an ephemeral port; a rank connecting
    to it early can be handed it as its source port, and rank 0 then cannot bind it."""
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "MASTER_PORT"})
    cpu = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False}
    trainer = Trainer(devices=2, strategy="ddp", **cpu)
    choose_rendezvous_port(trainer)
    port = int(os.environ["MASTER_PORT"])
    assert port in RENDEZVOUS_PORTS and trainer.strategy.cluster_environment.main_port == port
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if ephemeral.exists():
        assert port < int(ephemeral.read_text().split()[0])

    os.environ["MASTER_PORT"] = "12910"  # a port the user gives is kept
    choose_rendezvous_port(Trainer(devices=2, strategy="ddp", **cpu))
    assert os.environ["MASTER_PORT"] == "12910"
    del os.environ["MASTER_PORT"]  # one process: no rendezvous
    choose_rendezvous_port(Trainer(devices=1, **cpu))
    assert "MASTER_PORT" not in os.environ


def test_jobs_seeded_alike_do_not_draw_the_same_port():
    """The port comes from the system's generator, not from the one a seed sets: two
    jobs started at once with one seed would otherwise both take the same port."""
    random.seed(0)
    seeded = random.getstate()
    free_port()
    assert random.getstate() == seeded


@pytest.mark.slow
def test_ddp_config_with_two_processes_writes_once_and_syncs_metrics(
    workdir, request, tmp_path_factory
):
    """configs/ddp.yaml on two CPU processes, two epochs: the session's DDP run."""
    ran = reference(request, tmp_path_factory, *DDP)
    stderr = (ran / "stderr.txt").read_text()
    # The two traps of DDP by hand: each rank must get its own part of the data
    # (a DistributedSampler), and a new order every epoch (its set_epoch).
    records = read_records(ran / "seen")
    assert sorted((r["rank"], r["epoch"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["world_size"] for r in records} == {2}
    (kind,) = {r["sampler"] for r in records}
    if records[0]["indices"] is None:  # a stream: the samples each rank trained
        each_ranks_share_of_a_stream(ran / "samples")
    else:
        each_ranks_share(records, kind, loader_length(configured(), "train"))
    # The ranks' weights stay one model, whatever changed which train (a fine-tune).
    ends = read_records(ran / "seen", "train_end")
    assert len(ends) == 2 and ends[0]["parameters"] == ends[1]["parameters"]

    # The config runs on CPUs as it is: SyncBatchNorm is switched off there, once, saying so.
    if not torch.cuda.is_available():
        assert stderr.count("sync_batchnorm off: SyncBatchNorm works on CUDA only") == 1
    # Rank 0 alone prints the report, and it sees the whole world.
    assert stderr.count("Environment\n") == 1
    assert "strategy: DDPStrategy | devices 2 x nodes 1 = world size 2" in stderr

    # One run directory, one config, one best and one last checkpoint.
    runs = run_dirs(ran)
    assert len(runs) == 1
    checkpoints = sorted(p.name for p in (runs[0] / "checkpoints").iterdir())
    assert len(checkpoints) == 2 and checkpoints[0].startswith("best-")
    assert checkpoints[1] == "last.ckpt"
    assert (runs[0] / "config.yaml").exists()
    # Two epochs, logged once each: rank 1 wrote nothing.
    assert len(logged_scalars(runs[0])[MONITOR]) == 2

    # The monitored value rank 0 saved is the metric over the whole val set
    # (both ranks' halves), so it equals a single-process validation.
    # (A copy of the best checkpoint: validating it in its run would log into that run.)
    best = shutil.copy(runs[0] / "checkpoints" / checkpoints[0], workdir)
    synced = best_score(load_checkpoint(best))
    single = main(["validate", "--ckpt_path", str(best)]).trainer.callback_metrics
    # Lightning's DistributedSampler repeats a sample where the validation set does not
    # split evenly: the synced metric then weighs it twice, at most one sample's share.
    padded = loader_length(configured(), "val") % 2
    share = padded / loader_length(configured(), "val") * max(1.0, abs(synced))
    assert float(single[MONITOR]) == pytest.approx(synced, rel=1e-5, abs=share * 1.01)


def each_ranks_share(records: list[dict], kind: str, train_size: int) -> None:
    """Each rank's indices of each epoch: its own, new every epoch, and together the
    epoch (but what its sampler leaves out to give every rank as many batches)."""
    seen = {(r["rank"], r["epoch"]): r["indices"] for r in records}
    for epoch in (0, 1):
        rank0, rank1 = seen[0, epoch], seen[1, epoch]
        together = set(rank0) | set(rank1)
        assert together <= set(range(train_size))
        if kind == "GlobalOrder":  # whole steps of one order; what fills no step waits
            (step,) = {r["step_samples"] for r in records}
            assert not set(rank0) & set(rank1) and len(rank0) == len(rank1)
            assert train_size - len(together) < step
        elif kind == "RankBatches":  # a batch sampler's batches, dealt out: none twice
            assert not set(rank0) & set(rank1) and len(together) > train_size // 2
        else:  # Lightning's DistributedSampler: an odd count padded by repeating one sample
            assert together == set(range(train_size))
            padding = len(rank0) + len(rank1) - train_size
            assert 0 <= padding < 2 and len(set(rank0) & set(rank1)) <= padding
    assert seen[0, 0] != seen[0, 1] and set(seen[0, 0]) != set(seen[0, 1])


def each_ranks_share_of_a_stream(prefix: Path) -> None:
    """A stream's samples, by rank and epoch: no sample on both ranks in one epoch, as many
    batches on each, and another order the next epoch."""
    by = {}
    for record in read_records(prefix, "batch"):
        by.setdefault((record["rank"], record["epoch"]), []).append(record["samples"])
    assert sorted(by) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for epoch in (0, 1):
        rank0, rank1 = (by[rank, epoch] for rank in (0, 1))
        assert len(rank0) == len(rank1)
        assert not {s for b in rank0 for s in b} & {s for b in rank1 for s in b}
    assert by[0, 0] != by[0, 1]
