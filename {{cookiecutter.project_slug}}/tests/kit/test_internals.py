"""Each private name of Lightning, jsonargparse and torch the kit uses (kit/internals.py),
exercised on the installed releases: one that moved fails here, by name.

Run against a newer Lightning (`pip install -U lightning` in a scratch
environment, then `pytest tests/kit/test_internals.py`) to see whether the kit's
upper bound on Lightning can rise.
"""

import importlib
import inspect
import os
import signal
from importlib import metadata

import pytest
import torch
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from support import PROJECT, main, quiet_trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.kit import internals


class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Probe(Callback):
    """What the loop accessors say at each training batch's end."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(
            (
                internals.accumulating(trainer),
                internals.loggers_write_now(trainer),
                internals.logging_step(trainer),
            )
        )


def loader(n: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=1)


@pytest.fixture
def fitted(tmp_path):
    probe = Probe()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_last=True)
    trainer = Trainer(
        max_epochs=1,
        accumulate_grad_batches=2,
        log_every_n_steps=2,
        logger=CSVLogger(tmp_path),
        callbacks=[probe, checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny(), loader(), loader(2))
    return trainer, probe, checkpoint


def test_the_loop_accessors(fitted):
    trainer, probe, _ = fitted
    # 8 batches, 2 accumulated a step: 4 optimizer steps, the loggers writing every 2nd.
    assert [seen[0] for seen in probe.seen] == [True, False] * 4
    steps = [seen[2] for seen in probe.seen if not seen[0]]
    assert steps == [0, 1, 2, 3]  # the optimizer steps before each one, Lightning's x-axis
    writes = [seen[1] for seen in probe.seen if not seen[0]]
    assert writes == [False, True, False, True]
    assert internals.logging_step(trainer) == trainer.global_step == 4


def test_the_checkpoint_accessors(fitted):
    trainer, _, checkpoint = fitted
    path, step = internals.last_saved(checkpoint)
    assert path in (checkpoint.last_model_path, checkpoint.best_model_path) and step == 4
    internals.note_saved(checkpoint, checkpoint.best_model_path)
    assert internals.last_saved(checkpoint)[0] == checkpoint.best_model_path
    assert internals.skips_saving(checkpoint, trainer) is True  # this step is saved already
    assert {"epoch", "step", "val/loss"} <= set(internals.monitor_candidates(checkpoint, trainer))
    # Validation once an epoch: Lightning saves at the epoch's end, unless told otherwise.
    assert internals.saves_at_train_epoch_end(checkpoint, trainer) is True
    after = ModelCheckpoint(save_on_train_epoch_end=False)
    assert internals.saves_at_train_epoch_end(after, trainer) is False
    internals.forget_step_saved(checkpoint, 3)
    assert internals.last_saved(checkpoint)[1] == 3
    assert internals.skips_saving(checkpoint, trainer) is False  # step 4 is not saved now


def test_the_saved_batch_progress(fitted):
    _, _, checkpoint = fitted
    saved = torch.load(checkpoint.last_model_path, weights_only=True)
    progress = internals.saved_batch_progress(saved)
    assert progress["total"]["processed"] == progress["current"]["processed"] == 8


def test_the_main_threads_frame_is_seen_from_another_thread():
    import threading

    seen = []
    watcher = threading.Thread(target=lambda: seen.append(internals.main_thread_frame()))
    watcher.start()
    watcher.join()
    names, frame = [], seen[0]
    while frame is not None:  # (the innermost is threading's, where the test waits)
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    assert "test_the_main_threads_frame_is_seen_from_another_thread" in names


def test_the_logger_accessors(tmp_path):
    logger = CSVLogger(tmp_path)
    assert internals.open_experiment(logger) is None  # nothing started by asking
    writer = logger.experiment
    assert internals.open_experiment(logger) is writer
    assert internals.filesystem(logger).isdir(str(tmp_path))
    assert internals.filesystem(writer).isdir(str(tmp_path))
    internals.set_experiment(logger, None)
    assert internals.open_experiment(logger) is None


class StopsAt(Callback):
    """Saves a checkpoint at a training batch's end, then asks for a stop there."""

    def __init__(self, batch: int, path):
        self.batch, self.path = batch, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == self.batch:
            trainer.save_checkpoint(self.path)
            internals.request_stop(trainer)


class CountsIterations(DataLoader):
    """A DataLoader that counts the iterators made of it."""

    def __init__(self):
        super().__init__(TensorDataset(torch.randn(8, 2)), batch_size=1)
        self.iterations = 0

    def __iter__(self):
        self.iterations += 1
        return super().__iter__()


class RestartsAtTrainStart(Callback):
    """Makes the training iteration again as training starts, counting the iterators."""

    def on_train_start(self, trainer, pl_module):
        self.before = trainer.train_dataloader.iterations
        internals.restart_train_iteration(trainer)
        self.after = trainer.train_dataloader.iterations


def plain_trainer(tmp_path, *callbacks: Callback) -> Trainer:
    return quiet_trainer(default_root_dir=tmp_path, max_epochs=2, callbacks=list(callbacks))


def test_a_requested_stop_ends_the_fit_after_this_step(tmp_path):
    trainer = plain_trainer(tmp_path, StopsAt(2, tmp_path / "stopped.ckpt"))
    with pytest.raises(SIGTERMException):
        trainer.fit(Tiny(), loader())
    assert trainer.global_step == 3  # batches 0, 1 and 2 of the first epoch


class SendsSigterm(Callback):
    """Takes SIGTERM over in fits (noting it), and sends it at a fit's or a
    validation's second batch."""

    def __init__(self):
        self.noted = []

    def on_fit_start(self, trainer, pl_module):
        internals.on_sigterm_in_fit(trainer, lambda signum, frame: self.noted.append(signum))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1 and trainer.current_epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1 and trainer.state.fn == "validate":
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_in_a_fit_reaches_the_handler_that_took_it_over(tmp_path):
    sends = SendsSigterm()
    trainer = plain_trainer(tmp_path, sends)
    trainer.fit(Tiny(), loader())
    assert sends.noted == [signal.SIGTERM] and not trainer.received_sigterm
    assert trainer.global_step == 16  # noted, not stopped
    with pytest.raises(SIGTERMException):  # a validation keeps Lightning's own
        trainer.validate(Tiny(), loader())
    assert sends.noted == [signal.SIGTERM]


def test_the_stop_check_runs_before_the_step_starts_broadcast(tmp_path):
    trainer = plain_trainer(tmp_path)
    internals.before_each_step_stop_check(trainer, lambda: internals.request_stop(trainer))
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    with pytest.raises(SIGTERMException):  # the flag the check set, broadcast
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()


def test_the_training_iteration_can_be_made_again_as_training_starts(tmp_path):
    probe = RestartsAtTrainStart()
    trainer = plain_trainer(tmp_path, probe)
    trainer.fit(Tiny(), CountsIterations())
    assert (probe.before, probe.after) == (1, 2)  # Lightning's first, then the one made again
    assert trainer.train_dataloader.iterations == 3 and trainer.global_step == 16  # 2 epochs


@pytest.mark.parametrize("workers", [0, 1])
def test_dataloaders_read_their_indices_from_the_index_sampler(workers):
    class FirstTwo(DataLoader):
        @property
        def _index_sampler(self):
            return [[0], [1]]

    values = torch.arange(8.0)
    batches = list(FirstTwo(TensorDataset(values), batch_size=1, num_workers=workers))
    assert [batch[0].tolist() for batch in batches] == [[0.0], [1.0]]
    assert isinstance(inspect.getattr_static(DataLoader, "_index_sampler"), property)


def test_the_summary_table(capsys):
    modes = {"train": 1, "eval": 0}
    columns = ((" ", ["0"]), ("Name", ["net"]))
    table = internals.format_summary_table(1000, 900, 0.004, modes, 0, *columns)
    assert "net" in table and "Trainable params" in table


def test_the_subcommand_parser():
    cli = main(["--trainer.logger=false"], run=False)  # no subcommand: the one parser
    parser = internals.subcommand_parser(cli, None)
    dumped = yaml.safe_load(parser.dump(cli.config, format="yaml"))
    defaults = yaml.safe_load(PROJECT.defaults.read_text())  # read first, as by every command
    assert dumped["trainer"]["max_epochs"] == defaults["trainer"]["max_epochs"]


def test_the_words_of_a_wrong_type():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--epochs", type=int | None)
    with pytest.raises(Exception) as error:
        parser.parse_args(["--epochs=many"])
    text = " ".join(str(error.value).split())
    assert internals.wrong_type(text) == ("epochs", "many", ["int", "null"])
    assert internals.wrong_type("something else") is None


@pytest.mark.parametrize(
    ("where", "name"),
    [(where, name) for where, methods in internals.OVERRIDDEN.items() for name in methods],
)
def test_each_overridden_private_method_is_as_written(where, name):
    module, _, cls = where.rpartition(".")
    method = getattr(getattr(importlib.import_module(module), cls), name)
    parameters = tuple(inspect.signature(method).parameters)
    assert parameters == internals.OVERRIDDEN[where][name]


def test_torch_compile_is_seen_through_and_seen():
    network = nn.Linear(2, 2)
    assert internals.uncompiled(torch.compile(network)) is network
    assert internals.uncompiled(network) is network
    assert not internals.is_compiled(network)
    network.compile()  # in place: the module stays itself
    assert internals.is_compiled(network) and internals.is_compiled(nn.Sequential(network))


def test_fake_tensors_and_the_memory_tracker():
    network, batch = nn.Linear(64, 64), torch.randn(32, 64)
    tracker, kinds = internals.memory_tracker()
    with tracker:
        network(batch).square().sum().backward()
    peak = tracker.get_tracker_snapshot("peak")
    assert sum(device.get(kind, 0) for device in peak.values() for kind in kinds) > 0
    with internals.fake_tensor_mode() as mode:
        fake = mode.from_tensor(batch)
        out = network(fake)  # real weights turn fake as they enter the op
    assert type(out).__name__ == "FakeTensor" and out.shape == (32, 64)


def test_a_module_is_forgotten_by_the_memory_tracker():
    """Called again from the top level, a module MemTracker holds figures of is refused;
    forgotten, it is taken as new, the other modules' figures kept."""
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    tracker, _ = internals.memory_tracker()
    with tracker:
        second(first(torch.randn(2, 4)))
        with pytest.raises(NotImplementedError, match="multiple iterative calls"):
            first(torch.randn(2, 4))
        internals.forget_module(tracker, first)
        first(torch.randn(2, 4))
    assert second in tracker.memory_tracking and first in tracker.memory_tracking


def test_whether_lightning_shards_the_loaders():
    cpu = dict(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert internals.lightning_shards(Trainer(devices=1, **cpu))
    assert not internals.lightning_shards(Trainer(use_distributed_sampler=False, **cpu))


def test_optunas_heartbeat_and_trial_table():
    from optuna.storages import RDBStorage

    assert issubclass(RDBStorage, internals.optuna_heartbeat())
    table = internals.optuna_trial_table()
    assert table.__tablename__ == "trials" and hasattr(table, "state")


def test_releases_other_than_the_checked_ones_are_named_not_failed(monkeypatch):
    """Another release than CHECKED_ON's is named (doctor prints it), never a failure:
    the tests above say whether the private names still work on it."""
    assert set(internals.CHECKED_ON) == set(internals.RELEASE_PARTS)
    print(internals.unchecked_releases() or "CHECKED_ON is what is installed")
    checked = internals.CHECKED_ON
    installed = {
        "lightning": "99.0.0",
        # another patch and a build tag: the same release
        "torch": ".".join(checked["torch"].split(".")[:2]) + ".9+cu130",
        "optuna": checked["optuna"],
    }

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(internals.metadata, "version", version)
    # a torch patch or build tag is the same release; a package not installed is left out
    assert internals.unchecked_releases() == {
        "lightning": f"99.0.0 (checked on {checked['lightning']})"
    }
