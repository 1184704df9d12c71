"""What stops a run that went wrong at once, and says why, in one line.

`Divergence` (`--divergence.*`): a training loss, a monitored metric or weights
that are no longer finite stop the run, every rank at the same point, before a
non-finite state is written over a good checkpoint. The loss is checked where
`TrainLoss` already reads it, once a logging window (no host sync of its own);
`--divergence.every_step true` reads every step's, for finding the step.

`RankWatch` (`--distributed.*`): a job of several processes whose ranks stop
meeting ends in seconds, not at the process group's 30-minute timeout:

- a rank that fails writes its error into the job's store (rank 0's TCPStore,
  which outlives any collective); every other rank reads it within a second,
  says `stopping: rank 1 failed: ...` and exits 1;
- a rank that Lightning's launcher started ends when the launcher (rank 0) has;
- when a rank saw no progress for `timeout` seconds (`start_timeout` while it waits
  for the others to meet it), the ranks compare where they are through the store:
  one line names the ranks that do not answer, or are busy elsewhere while the
  others wait in a collective (where they were last seen, their Python line), or
  says that every rank waits in one collective that does not complete, with the
  usual causes.

The watch is a thread: the steps only count their hooks (no clock, no device).
"""

import json
import math
import os
import sys
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from time import monotonic, sleep
from typing import Any

import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .checkpoints import CheckpointError
from .internals import main_thread_frame
from .spec import ConfigError


class Diverged(RuntimeError):
    """A loss, a monitored metric or the weights stopped being finite; the message says
    where, the last finite value, and what to try."""


def finite(tensors) -> bool:
    """Whether every value of `tensors` (this rank's shard of a DTensor) is finite: one
    read of the device for all of them. A sum is finite only if its terms are."""
    sums = [
        (t.to_local() if hasattr(t, "to_local") else t).detach().sum(dtype=torch.float32)
        for t in tensors
        if t.is_floating_point()
    ]
    return not sums or bool(torch.isfinite(torch.stack(sums).sum()))


def weights_finite(trainer: Trainer, module: LightningModule) -> bool:
    """Whether the weights of every rank are finite (a collective: every rank asks)."""
    return trainer.strategy.reduce_boolean_decision(finite(module.parameters()), all=True)


def diverged(
    trainer: Trainer, what: str, window: str, last: tuple[float, str] | None, saved: str = ""
) -> str:
    """The line a divergence stops the run with: what, where, the last finite value, and
    what to try."""
    tries = ["a lower learning rate"]
    if str(trainer.precision).startswith("16"):
        tries.append("--trainer.precision bf16-mixed instead of 16-mixed")
    if not trainer.gradient_clip_val:
        tries.append("--trainer.gradient_clip_val 1.0")
    tries.append(f"a look at the batches of {window}")
    before = f"; the last finite value was {last[0]:.6g}, at {last[1]}" if last else ""
    return (
        f"diverged: {what} at epoch {trainer.current_epoch}, {window}{before}. {saved}Nothing"
        " non-finite was saved: `fit --ckpt_path last` resumes from the last good"
        f" checkpoint. Try {', '.join(tries)}"
    )


def returned_loss(outputs: Any) -> torch.Tensor | None:
    """The loss a `training_step` returned (alone, or under "loss"); None if none."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return loss if isinstance(loss, torch.Tensor) else None


def check_loss(
    trainer: Trainer,
    module: LightningModule,
    name: str,
    value: float,
    window: str,
    last: tuple[float, str] | None,
) -> None:
    """Stop the run on a non-finite training loss `value`, seen alike by every rank;
    unless fp16's GradScaler skipped those steps and the weights are still finite."""
    if math.isfinite(value):
        return
    if getattr(trainer.precision_plugin, "scaler", None) is not None:
        if weights_finite(trainer, module):
            rank_zero_warn(
                f"{name} was {value} over {window}: 16-mixed's gradient scaler skipped those"
                " steps and the weights are finite; training goes on"
            )
            return
    raise Diverged(diverged(trainer, f"{name} is {value}", window, last))


class Divergence(Callback):
    """Stops a run whose loss, monitored metric or weights are no longer finite.

    It stops every rank together, before anything non-finite is saved.

    Args:
        every_step: read every step's training loss (a host sync a step: for finding
            the step a divergence starts at, not for speed); by default it is checked
            once a logging window, where `train/loss` is read anyway.
    """

    def __init__(self, every_step: bool = False) -> None:
        self.every_step = every_step
        self._last_loss: tuple[float, str] | None = None
        self._last_metric: tuple[float, str] | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last_loss = self._last_metric = None
        if self.every_step:
            rank_zero_info(
                "divergence.every_step: each step's loss is read from the device, a host"
                " sync a step: for finding where a run diverges, not for speed"
            )

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.every_step:
            return
        loss = returned_loss(outputs)
        if loss is None:
            return
        value = float(trainer.strategy.reduce(loss.detach().float(), reduce_op="mean"))
        where = f"batch {trainer.fit_loop.total_batch_idx}"
        check_loss(trainer, pl_module, "the training loss", value, where, self._last_loss)
        if math.isfinite(value):
            self._last_loss = (value, where)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        monitor = getattr(trainer.checkpoint_callback, "monitor", None)
        if trainer.sanity_checking or monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[monitor])
        where = f"epoch {trainer.current_epoch}'s validation"
        if trainer.strategy.reduce_boolean_decision(math.isfinite(value), all=True):
            self._last_metric = (value, where)
            return
        raise Diverged(diverged(trainer, f"{monitor} is {value}", where, self._last_metric))

    # Every save passes here first, on every rank: a save waits for the device anyway.
    def on_save_checkpoint(self, trainer: Trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if not weights_finite(trainer, pl_module):
            what, window = "the weights are not finite", f"step {trainer.global_step}"
            saved = "The checkpoint due there was not written. "
            raise Diverged(diverged(trainer, what, window, None, saved))


# Stops every rank meets at once, each on its own, and refusals every rank makes alike
# (one line for the job): no rank tells the others.
SHARED_STOPS = (SIGTERMException, KeyboardInterrupt, Diverged, ConfigError, CheckpointError)

COLLECTIVE_CAUSES = (
    "NCCL's peer-to-peer path broken on this machine (NCCL_P2P_DISABLE=1),"
    " InfiniBand that does not work (NCCL_IB_DISABLE=1), the wrong network interface"
    " (NCCL_SOCKET_IFNAME); `doctor --distributed` tests the machine"
)
STRAGGLER_CAUSES = (
    "code that runs on some ranks only (a branch on self.global_rank around a step, a log"
    " with sync_dist=True on one rank), a loader or file system that stalled, another"
    " number of batches on that rank; long work on one rank that the others wait for"
    " needs a longer --distributed.timeout"
)
# Where a main thread waits for the other ranks: a collective, a barrier, the rendezvous,
# DDP's forward and backward (their syncs).
WAITING_IN = tuple(
    os.path.join("torch", part, "") for part in ("distributed", os.path.join("nn", "parallel"))
) + (os.path.join("torch", "autograd", ""),)


def plural(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def hang_report(seen: dict[int, dict[str, Any]], world: int, idle: float, flag: str) -> str | None:
    """What the ranks say of a job in which this one advanced for `idle` seconds: `seen`
    maps each rank that answers to where it was last seen, the Python line its main
    thread is on, and whether that line waits for the other ranks. None when no rank
    waits for another (each is busy with work of its own)."""
    gone = [rank for rank in range(world) if rank not in seen]
    busy = sorted(rank for rank, at in seen.items() if not at["waiting"])
    waiting = sorted(rank for rank, at in seen.items() if at["waiting"])
    if not gone and not waiting:
        return None
    parts = [f"stopped: no progress for {idle:.0f} s ({flag})"]
    if gone:
        parts.append(
            f"{plural(gone)} does not answer: its process has ended or is frozen (a node"
            " that went down, the OOM killer)"
        )
    if busy and waiting:
        parts += [
            f"rank {rank} did not arrive: last seen {seen[rank]['where']}, now at"
            f" {seen[rank]['line']}"
            for rank in busy
        ]
    if waiting and (busy or gone):
        first = seen[waiting[0]]
        parts.append(f"{plural(waiting)} wait{'s' * (len(waiting) == 1)} at {first['line']}")
        parts.append(f"usual causes: {STRAGGLER_CAUSES}")
    elif waiting:
        first = seen[waiting[0]]
        parts.append(
            f"every rank waits at {first['line']}, last seen {first['where']}: a collective"
            f" they all entered does not complete; usual causes: {COLLECTIVE_CAUSES}"
        )
    return "; ".join(parts)


def main_thread_at() -> tuple[str, bool]:
    """`file:line in function` of what the main thread runs now, and whether that waits
    for the other ranks (it is in torch.distributed, DDP or the autograd engine)."""
    frame = main_thread_frame()
    if frame is None:
        return "an unknown line", False
    code = frame.f_code
    waiting = any(part in code.co_filename for part in WAITING_IN)
    return f"{Path(code.co_filename).name}:{frame.f_lineno} in {code.co_name}", waiting


def launcher_gone(parent: int) -> bool:
    """Whether the process that started this one, Lightning's launcher (rank 0, running
    the same command), has ended: this one was handed to another parent, or already had
    been (the parent it has runs something else)."""
    if os.getppid() != parent:
        return True
    try:
        words = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:  # no /proc: the parent's id is all there is to go by
        return False
    mine = [word.encode() for word in sys.argv[1:]]
    return bool(mine) and words[-len(mine) :] != mine


class RankWatch(Callback):
    """Ends a job of several processes in seconds when its ranks stop meeting.

    It says which rank and why (the module's docstring has what it looks at). Each rank's thread
    writes, every `poll` seconds, where the rank was last seen and its main thread's
    line into the job's store, and reads there whether the job ends.

    Args:
        timeout: seconds this rank may see no progress (a batch, a backward) before the
            ranks compare where they are. Below the process group's own timeout (30
            minutes), so the kit's account comes first.
        start_timeout: seconds a rank may wait for the others to meet it (the
            rendezvous), when a misconfiguration is likeliest.
    """

    clock = staticmethod(monotonic)
    poll = 1.0  # seconds between two looks

    def __init__(self, timeout: float = 600.0, start_timeout: float = 300.0) -> None:
        for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
            if not value > 0:
                raise ValueError(f"distributed.{name}={value}: give a number of seconds > 0")
        self.timeout = timeout
        self.start_timeout = start_timeout
        self._count = 0
        self._where: tuple[str, int] = ("starting", 0)
        self._store: Any = None
        self._stopped = False  # the fit ended, or failed on this rank
        self._trainer: Trainer | None = None
        self._exiting: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy of the callback (a deep copy of a module that knows its trainer) watches
        # nothing: the store's connection and the trainer stay with the original.
        return {**self.__dict__, "_store": None, "_trainer": None, "_exiting": None}

    @property
    def trainer(self) -> Trainer:
        """The trainer it watches (set by `arm`)."""
        if self._trainer is None:
            raise RuntimeError("the watch is not armed: arm(trainer) first")
        return self._trainer

    def arm(self, trainer: Trainer) -> None:
        """Start watching `trainer`'s job (called once it is built; nothing for one process)."""
        if trainer.world_size < 2:
            return
        self._trainer, self._stopped = trainer, False
        self._exiting = threading.Lock()
        environment = getattr(trainer.strategy, "cluster_environment", None)
        launched = (
            type(environment) is LightningEnvironment
            and environment.creates_processes_externally
            and environment.local_rank() > 0
        )
        parent = os.getppid() if launched else None
        threading.Thread(target=self._watch, args=(parent,), name="rank-watch", daemon=True).start()

    # The steps' only cost: a count and a label.
    def _at(self, where: str, index: int) -> None:
        self._count += 1
        self._where = (where, index)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._at("setting up", 0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._at("in the forward of training batch", batch_idx)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._at("in the backward (the gradient sync) of training batch", self._where[1])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._at("after training batch", batch_idx)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        self._at("in validation batch", batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self._at("after validation batch", batch_idx)

    def on_exception(self, trainer: Trainer, pl_module, exception: BaseException) -> None:
        self._stopped = True
        if trainer.world_size < 2 or isinstance(exception, SHARED_STOPS):
            return
        text = str(exception).strip().splitlines()
        said = f"rank {trainer.global_rank} failed: {type(exception).__name__}"
        said += f": {text[0]}" if text else ""
        if self._store is None:
            self._open_store()
        mine = f"stopping: {said}"
        first = self._claim(mine, everyone=True)
        if first is not None and (first["by"] != trainer.global_rank or first["text"] != mine):
            self._read_end(first)  # what followed another rank's failure, or a stall
        self._read(first)  # the others read it before this rank ends (and the store)

    def teardown(self, trainer: Trainer, pl_module, stage: str) -> None:
        self._stopped = True

    def _key(self, name: str) -> str:
        # A key of each start of torchrun's workers: a restarted group may share the store.
        return f"kit/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"

    def _open_store(self) -> None:
        """A client of the job's store (rank 0's TCPStore, where Lightning said it is),
        once the ranks met."""
        try:
            if torch.distributed.is_initialized():
                self._store = torch.distributed.TCPStore(
                    os.environ["MASTER_ADDR"],
                    int(os.environ["MASTER_PORT"]),
                    is_master=False,
                    timeout=timedelta(seconds=30),
                    wait_for_workers=False,
                )
        except Exception:  # (the next look tries again)
            self._store = None

    def _claim(self, text: str, everyone: bool) -> dict[str, Any] | None:
        """End the job with `text` (said by every rank, or by this one only), unless a rank
        ended it first: what ends the job; None without a store."""
        try:
            mine = {"text": text, "everyone": everyone, "by": self.trainer.global_rank}
            return json.loads(self._store.compare_set(self._key("end"), "", json.dumps(mine)))
        except Exception:  # no store (yet, or any more): the others find out otherwise
            return None

    def _read(self, ended: dict[str, Any] | None) -> None:
        """This rank has read how the job ends. Rank 0 holds the store, so it ends last:
        it waits (a few seconds at most) for every other rank to have read it; another
        rank, for rank 0 to have."""
        store, rank, world = self._store, self.trainer.global_rank, self.trainer.world_size
        deadline = self.clock() + 3 * self.poll
        try:
            if ended is None:
                return
            if rank == 0:
                store.set(self._key("read by 0"), "1")
                while store.add(self._key("read"), 0) < world - 1 and self.clock() < deadline:
                    sleep(self.poll / 10)
            else:  # the count last: rank 0 may end as soon as it is full
                while not store.check([self._key("read by 0")]) and self.clock() < deadline:
                    sleep(self.poll / 10)
                store.add(self._key("read"), 1)
        except Exception:  # the store is gone: nothing left to wait for
            pass

    def _read_end(self, ended: dict[str, Any]) -> None:
        """End this rank as `ended` says (saying why, where every rank is to)."""
        self._read(ended)
        self._exit(ended["text"] if ended["everyone"] else None)

    def _watch(self, parent: int | None) -> None:
        seen, since, beat = -1, self.clock(), 0
        while not self._stopped:
            sleep(self.poll)
            if self._stopped:
                return
            if self._store is None:
                self._open_store()
                if self._store is not None:  # the ranks met: that is progress
                    since = self.clock()
            if parent is not None and launcher_gone(parent):
                sleep(2 * self.poll)  # at a fit's normal end, rank 0 may end first
                if not self._stopped:
                    self._exit("stopping: rank 0, which started this process, has ended")
                return
            line, waiting = main_thread_at()
            beat += 1
            ended = self._beat(beat, line, waiting)
            if ended is not None and ended["by"] != self.trainer.global_rank:
                self._read_end(ended)
            if self._count != seen:
                seen, since = self._count, self.clock()
            elif self.clock() - since > (self.timeout if self._store else self.start_timeout):
                self._stalled(self.clock() - since, waiting)
                since = self.clock()  # every rank busy with its own work: another period

    def _beat(self, beat: int, line: str, waiting: bool) -> dict[str, Any] | None:
        """Write where this rank is; read whether the job ends (None: it goes on)."""
        if self._store is None:
            return None
        trainer = self.trainer
        where = f"{self._where[0]} {self._where[1]} of epoch {trainer.current_epoch}"
        at = {"beat": beat, "count": self._count, "where": where, "line": line, "waiting": waiting}
        try:
            self._store.set(self._key(f"at/{trainer.global_rank}"), json.dumps(at))
            if self._store.check([self._key("end")]):
                return json.loads(self._store.get(self._key("end")))
        except Exception:  # the store is gone with rank 0: the launcher's checks decide
            self._store = None
        return None

    def _others(self) -> dict[int, dict[str, Any]]:
        """Every rank's last beat, and those whose beat no longer advances left out."""
        world = self.trainer.world_size
        keys = [self._key(f"at/{rank}") for rank in range(world)]

        def read() -> dict[int, dict[str, Any]]:
            return {
                rank: json.loads(self._store.get(key))
                for rank, key in enumerate(keys)
                if self._store.check([key])
            }

        before = read()
        sleep(2 * self.poll)
        after = read()
        mine = self.trainer.global_rank  # (its beat waits for this look)
        return {
            rank: at
            for rank, at in after.items()
            if rank == mine or rank not in before or at["beat"] != before[rank]["beat"]
        }

    def _stalled(self, idle: float, waiting: bool) -> None:
        trainer = self.trainer
        world = trainer.world_size
        if self._store is None:
            if waiting:  # at the rendezvous (not busy building a model, say)
                self._exit(
                    f"stopped: the job's {world} processes did not all meet within"
                    f" {self.start_timeout:g} s (--distributed.start_timeout); usual causes:"
                    " a node that did not start, another --trainer.num_nodes or"
                    " --trainer.devices on some node, a MASTER_ADDR or port that the others"
                    " cannot reach (a firewall), a stray NODE_RANK or WORLD_SIZE in the shell"
                    " (`doctor --distributed` checks the machine)"
                )
            return
        flag = f"--distributed.timeout {self.timeout:g}"
        try:
            report = hang_report(self._others(), world, idle, flag)
        except Exception as error:  # rank 0 and its store are gone
            report = (
                f"stopped: no progress for {idle:.0f} s ({flag}) and rank 0's store does not"
                f" answer ({type(error).__name__}): rank 0 has ended or its node is unreachable"
            )
            self._exit(report)
        if report is not None:
            first = self._claim(report, everyone=False)
            if first is not None and first["by"] != trainer.global_rank:
                self._read_end(first)  # another rank said it
            self._say(report)
            self._read(first)
            self._exit(None)

    def _say(self, line: str) -> None:
        trainer = self.trainer
        print(f"[rank {trainer.global_rank}/{trainer.world_size}] {line}", file=sys.stderr)

    def _exit(self, line: str | None) -> None:
        """Say `line` (as this rank) and end this process now: its main thread is stuck.
        Once: the watch and the main thread may both get here."""
        if not self._exiting.acquire(blocking=False):
            threading.Event().wait()  # the other one ends the process
        if line:
            self._say(line)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
