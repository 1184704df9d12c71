"""The command line: Lightning's own CLI, with the kit's callbacks and the project's defaults.

    <command> fit                       # train what project.py names
    <command> fit --config configs/gpu.yaml --trainer.max_epochs 5
    <command> fit --print_config        # the full, resolved config
    <command> fit --ckpt_path last      # continue the newest run
    <command> validate|test|predict --ckpt_path <file>

`main(["fit", ...], project)` runs the same thing in-process, for tests and
scripts; `run` is the command line's wrapper around it (error hints, exit code).
The defaults are the project's config file (`Project.defaults`,
configs/default.yaml), read before any other.
"""

import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import (
    BasePredictionWriter,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    StochasticWeightAveraging,
    WeightAveraging,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from .callbacks import (
    EnvironmentReport,
    FailureContext,
    KitCallbacks,
    NoProfiler,
    find_callback,
    keep_context,
)
from .checkpoints import (
    ASYNC,
    AtomicCheckpointIO,
    BestAndLast,
    CheckpointError,
    CheckpointSaveError,
    InterruptCheckpoint,
    ResumeCheck,
    check_checkpoint,
    foreign_model,
    is_sharded,
    resolve_last,
    state_dict_mismatch,
)
from .console import EpochLines, Summary, TQDMBar, TrainLoss
from .hardware import (
    CompileNetwork,
    cuda_capabilities,
    mps_available,
    resolve_precision,
    run_accelerator,
    use_tensor_cores,
)
from .health import TrainingHealth
from .internals import wrong_type
from .machine import free_port
from .predict import PredictionWriter
from .resume import ResumeState
from .runs import (
    DiscardFailedStart,
    FinishRun,
    FitResult,
    KeepTestMetrics,
    claim_new_run,
    continue_run,
    discard_run,
    end_open_runs,
    is_first_process,
    run_directory,
    run_of_checkpoint,
    uploads_each_checkpoint,
)
from .schedules import ScheduleLength
from .shards import ShardCheck
from .spec import ConfigError, FSDPOptions, Project
from .unfrozen import UnfrozenGradients
from .watch import Diverged, Divergence, RankWatch

# What each logger needs from the environment before it starts (a variable the
# user set wins): MLflow 3 refuses its local file store unless asked (a folder
# needs no database or server; --trainer.logger.init_args.tracking_uri names one);
# W&B runs offline, needing no account or network (`wandb sync logs/wandb/offline-run-*`
# uploads a run later; WANDB_MODE=online after `wandb login` sends it as it runs).
LOGGER_ENVIRONMENT = {
    "MLFlowLogger": {"MLFLOW_ALLOW_FILE_STORE": "true"},
    "WandbLogger": {"WANDB_MODE": "offline"},
}
# Loggers whose relative folder would follow another process's working directory:
# MLflow caches its store by URI (the first run's folder in this process), W&B's
# service process resolves it against its own.
ABSOLUTE_SAVE_DIR = {"MLFlowLogger": "mlruns", "WandbLogger": "."}


# What Lightning prints to sell a service, not about the run (a line's start).
# Lightning's lines that the kit says better: the accelerator, whether CUDA is
# available and the processes of a DDP run (the environment report; a rank that does
# not arrive is named by RankWatch), the checkpoint a fit resumes from (said as it
# starts, and Lightning says again that it restored it); and its adverts.
REPORTED = (
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "Initializing distributed:",
    "distributed_backend=",
    "Restoring states from the checkpoint path at",
    "💡 Tip:",
)
REPORTING = (  # Lightning's loggers that write them
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.distributed",
)
# What Lightning's own code warns about under newer torch and jsonargparse releases,
# and its model summary's note on mixed precision: nothing a user can act on. Its
# warning on a mid-epoch resume, which takes loaders without `state_dict` to resume
# inexactly: the kit's ResumeState resumes its loaders, and says which it cannot.
LIBRARY_NOISE = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"Precision .* is not supported by the model summary",
    r"You're resuming from a checkpoint that ended before the epoch ended",
)


def _not_reported(record: logging.LogRecord) -> bool:
    return not str(record.msg).lstrip("-\n").startswith(REPORTED)


def quiet_library_noise() -> None:
    """Keep the warnings of LIBRARY_NOISE, the deprecations raised inside Lightning's
    CLI, and Lightning's lines of REPORTED off the console."""
    for name in REPORTING:
        logging.getLogger(name).addFilter(_not_reported)
    for message in LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message)
    inside_the_cli = r"lightning\.pytorch\.cli"
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=inside_the_cli)


def logger_kind(logger: Any) -> str:
    """The class name a logger config names ("MLFlowLogger"), or ""."""
    path = logger.get("class_path") if hasattr(logger, "get") else None
    return str(path).rpartition(".")[2] if path else ""


def choose_rendezvous_port(trainer: Trainer) -> None:
    """MASTER_PORT, when not given, for the ranks this process starts on this machine:
    one that no rank's connection can take from rank 0 (machine.RENDEZVOUS_PORTS)."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if (
        trainer.world_size > 1
        and trainer.num_nodes == 1
        and "MASTER_PORT" not in os.environ
        and type(environment) is LightningEnvironment
        and not environment.creates_processes_externally
    ):
        os.environ["MASTER_PORT"] = str(free_port())


def prepare_logger(logger: Any) -> None:
    """What the configured logger needs before it starts, for every kind of logger."""
    kind = logger_kind(logger)
    for name, value in LOGGER_ENVIRONMENT.get(kind, {}).items():
        os.environ.setdefault(name, value)
    init = logger.get("init_args") if kind in ABSOLUTE_SAVE_DIR else None
    if init is not None and not init.get("tracking_uri"):
        init["save_dir"] = os.path.abspath(init.get("save_dir") or ABSOLUTE_SAVE_DIR[kind])


def resolve_hardware(trainer: dict[str, Any], say=rank_zero_info) -> None:
    """Fill in what depends on the accelerator the run will use, in a trainer config.

    Precision when none is given (`--trainer.precision` always wins); and
    SyncBatchNorm only on CUDA, the one place it works.
    """
    cuda, bf16 = cuda_capabilities()
    accelerator = run_accelerator(trainer.get("accelerator", "auto"), cuda, mps_available())
    if trainer.get("precision") is None:
        trainer["precision"] = resolve_precision(accelerator, bf16)
    if trainer.get("sync_batchnorm") and accelerator != "cuda":
        trainer["sync_batchnorm"] = False
        say(
            f"sync_batchnorm off: SyncBatchNorm works on CUDA only and this run uses"
            f" {accelerator}; each rank normalises its own part of the batch"
        )


class ProjectParser(LightningArgumentParser):
    """Lightning's parser; `--print_config` shows the precision the run will use, and a
    bad flag or config file gets one line that names it (not the whole usage)."""

    command = "<command>"  # the console command, for the error line (main() sets it)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:
            return super().error(message, ex)
        text = _short_parse_error(" ".join(str(message).split()))
        words = self.prog.split()
        command = words[-1] if words and words[-1] in LightningCLI.subcommands() else "<command>"
        help_ = f"`{self.command} {command} --help` lists every flag"
        sys.stderr.write(f"error: {text} ({help_})\n")
        self.exit(2)

    def dump(self, cfg, *args, **kwargs) -> str:
        if "skip_none" in kwargs:  # Lightning's own calls still use the old name
            kwargs["skip_unset"] = kwargs.pop("skip_none")
        if "skip_check" not in kwargs:
            # What is dumped here was validated when parsed; validating it again
            # on every dump (Lightning dumps it for the hyperparameters, the run
            # for its config.yaml) costs a tenth of a second each time.
            kwargs.setdefault("skip_validation", True)
        if "trainer" in cfg and cfg.get("trainer.precision") is None:
            cfg = cfg.clone()
            resolve_hardware(cfg["trainer"], say=lambda line: None)
        return super().dump(cfg, *args, **kwargs)


def _short_parse_error(text: str) -> str:
    """jsonargparse's account of a value of the wrong type, in a few words:
    `trainer.max_epochs=many: expected int or null`."""
    parts = wrong_type(text)
    if parts is None:
        return text
    key, given, expected = parts
    if not expected:
        return f"{key}={given}: {text}"
    listed = ", ".join(expected[:-1]) + f" or {expected[-1]}" if len(expected) > 1 else expected[0]
    return f"{key}={given}: expected {listed}"


class SaveRunConfig(SaveConfigCallback):
    """Lightning's config.yaml, written into the run's own directory for every logger.

    (Lightning's own callback would put MLflow's at the top of its store, one
    file overwritten by every run.) Only `fit` writes it: `validate` and `test`
    logging into a run keep its config; a run without a logger has no directory.
    """

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.already_saved or trainer.logger is None:
            return
        run = str(run_directory(trainer)) if trainer.is_global_zero else None
        run = trainer.strategy.broadcast(run)
        if trainer.is_global_zero:
            os.makedirs(run, exist_ok=True)
            path = os.path.join(run, self.config_filename)
            self.parser.save(  # validated when parsed: not again
                self.config,
                path,
                skip_unset=False,
                skip_validation=True,
                overwrite=True,
                multifile=self.multifile,
            )
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True


class ProjectCLI(LightningCLI):
    """LightningCLI plus the callbacks every run of a project gets."""

    def __init__(self, *args, project: Project, **kwargs) -> None:
        self.project = project
        words = kwargs.get("args")
        words = sys.argv[1:] if words is None else words
        first = words[0] if isinstance(words, list) and words else None
        # Each subcommand's parser costs ~0.2 s to build: build only the one asked for.
        self._only = first if first in LightningCLI.subcommands() else None
        self._new_run: bool = False
        self._claimed: Path | None = None
        if "parser_kwargs" in kwargs:  # those of the subcommands not built go nowhere
            built, every = self.subcommands(), LightningCLI.subcommands()
            kwargs["parser_kwargs"] = {
                key: value
                for key, value in kwargs["parser_kwargs"].items()
                if key not in every or key in built
            }
        try:
            super().__init__(*args, **kwargs)
        except BaseException as error:
            keep_context(error, self.settings())  # what the error hints quote
            # A run that failed before the Trainer started leaves no empty directory.
            claimed = self._claimed
            if claimed is not None and claimed.is_dir() and not any(claimed.iterdir()):
                discard_run(claimed)
            raise

    def __deepcopy__(self, memo: dict[int, Any]) -> "ProjectCLI":
        # A callable argument the CLI made (`optimizer: OptimizerCallable`, kept on the model)
        # holds the CLI, through jsonargparse's instantiators, and so the Trainer and its
        # launched processes: a deep copy of the model (Lightning's EMAWeightAveraging
        # makes one) shares the CLI instead of copying what cannot be copied.
        return self

    def settings(self) -> dict[str, Any]:
        """The parsed settings the error hints quote (the trainer's own, where it
        was built, win: `FailureContext`)."""
        config = getattr(self, "config", None)
        config = config.get(config.get("subcommand") or "", config) if config else None
        if config is None:
            return {}
        trainer = config.get("trainer") or {}
        return {
            "batch_size": (config.get("data") or {}).get("batch_size"),
            "precision": trainer.get("precision"),
            "accumulate_grad_batches": trainer.get("accumulate_grad_batches"),
            "devices": trainer.get("devices"),
            "accelerator": trainer.get("accelerator"),
            "cuda_device_count": torch.cuda.device_count(),
        }

    def subcommands(self) -> dict[str, set[str]]:
        everything = LightningCLI.subcommands()
        if self._only is None:
            return everything
        return {self._only: everything[self._only]}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Always on, and configurable as --checkpoint.* (best and last).
        parser.add_lightning_class_args(BestAndLast, "checkpoint")
        parser.add_argument(
            f"--checkpoint.{ASYNC}",
            type=bool,
            default=True,
            help="write each checkpoint in the background, from a copy in host memory;"
            " false: write it in the step",
        )
        parser.set_defaults(
            {
                "checkpoint.monitor": self.project.monitor,
                "checkpoint.mode": self.project.mode,
                "checkpoint.filename": "best-epoch{epoch:02d}-step{step}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(TrainLoss, "train_loss")
        parser.add_lightning_class_args(Divergence, "divergence")
        parser.add_lightning_class_args(RankWatch, "distributed")
        parser.add_class_arguments(FSDPOptions, "fsdp", fail_untyped=False)
        parser.add_lightning_class_args(EnvironmentReport, "environment_report")
        parser.add_lightning_class_args(TrainingHealth, "health")
        parser.add_lightning_class_args(FailureContext, "failure_context")
        parser.add_lightning_class_args(InterruptCheckpoint, "interrupt_checkpoint")
        parser.add_lightning_class_args(ResumeCheck, "resume_check")
        parser.add_lightning_class_args(ResumeState, "resume_state")
        parser.add_lightning_class_args(FinishRun, "finish_run")
        # The callbacks that also take what the project says of its own code: their
        # flags are parsed here, and the CLI builds them with the project's values.
        for key, (kind, given) in self.project_callbacks().items():
            parser.add_class_arguments(
                kind, key, skip=set(given), instantiate=False, fail_untyped=False
            )

    def project_callbacks(self) -> dict[str, tuple[type[Callback], dict[str, Any]]]:
        """The kit's callbacks built with the project's values: flags, class, values."""
        project = self.project
        return {
            "compile": (CompileNetwork, {"wrap": project.wrap}),
            "fit_result": (FitResult, {"command": project.command}),
            "predictions": (PredictionWriter, {"columns": project.prediction_columns}),
        }

    def section(self, config: Any) -> Any:
        """The running subcommand's part of a config (the whole of it without subcommands)."""
        return config[self.subcommand] if self.subcommand else config

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """The arguments, then where the run goes and what it continues. A new run's
        directory is claimed later, once they are all read (`claim_run`): `--help`,
        `--print_config` and a bad flag leave nothing on disk."""
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand or "")
        if config is None:
            return
        logger = config.get("trainer", {}).get("logger")
        if logger:
            prepare_logger(logger)
        restarted = False
        if subcommand == "fit":
            self.place_run(config)
            restarted = elastic_restart(config)
        # Before Lightning reads the checkpoint's hyperparameters:
        # `--ckpt_path last` becomes the newest checkpoint of the newest run
        # (and the logger continues that run); a damaged file is refused by name.
        if subcommand == "fit" and resolve_last(config, newest_run=restarted):
            # Continuing a run: its checkpoint folder is expected to hold files.
            warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
        elif subcommand == "fit":
            self._start_new_run(config)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path in (None, "last", "best", "hpc"):
            if subcommand in ("validate", "test"):
                self._start_new_run(config)
            return
        checkpoint = check_checkpoint(ckpt_path)
        foreign = foreign_model(checkpoint, self.project.model)
        if foreign:
            raise CheckpointError(foreign)
        fsdp = config.get("fsdp")
        if is_sharded(checkpoint) and not (fsdp and fsdp.get("enabled")):
            if subcommand == "fit":
                raise CheckpointError(
                    f"checkpoint '{checkpoint}' is a folder of shards of an FSDP run: continue"
                    " it with --fsdp.enabled true (or --config configs/fsdp.yaml)"
                )
            # Without the sharded strategy, Lightning reads one file: the shards, joined.
            from .sharding import consolidated  # (like FSDP2Strategy: only a sharded run's)

            config["ckpt_path"] = str(consolidated(checkpoint))
        if subcommand not in ("validate", "test"):
            return
        run = run_of_checkpoint(checkpoint)
        if run and continue_run(logger, run):
            rank_zero_info(f"Logging {subcommand} into the checkpoint's run, {run}")
        else:
            self._start_new_run(config)

    def place_run(self, config) -> None:
        """Where a fit's run goes, decided before `--ckpt_path last` is resolved and a
        new run directory claimed: here, where the config says. (The sweep puts each
        trial's run into its study's directory.)"""

    def _start_new_run(self, config) -> None:
        """A command that continues no run gets a run directory of its own."""
        trainer = config.get("trainer", {})
        self._new_run = bool(trainer.get("logger")) and not trainer.get("fast_dev_run")

    def claim_run(self) -> None:
        """Rank 0 claims a new run's directory, before the logger is built."""
        if self._new_run and self.subcommand and is_first_process():
            self._claimed = claim_new_run(self.config[self.subcommand]["trainer"]["logger"])

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as error:  # a class refused a value: the user's input, not a bug
            raise ConfigError(str(error)) from error
        strategy = self.trainer.strategy
        if type(strategy.checkpoint_io) is TorchCheckpointIO:  # not a plugin of the user's
            background = getattr(self.trainer.checkpoint_callback, "background", True)
            logger = self.section(self.config)["trainer"].get("logger")
            if background and uploads_each_checkpoint(logger):
                rank_zero_info("checkpoint.async: off, the logger uploads each file as it is saved")
                background = False
            strategy.checkpoint_io = AtomicCheckpointIO(background)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        # `callbacks` are the kit's, one per group of flags (--checkpoint.*, --health.*, ...),
        # and those built here with the project's values.
        section = self.section(self.config_init)
        callbacks = [
            *callbacks,
            DiscardFailedStart(new_run=self._new_run),
            KeepTestMetrics(),
            ShardCheck(),
            UnfrozenGradients(),
            ScheduleLength(),
            *(
                kind(**section[key].as_dict(), **given)
                for key, (kind, given) in self.project_callbacks().items()
            ),
        ]

        def as_list(value) -> list:  # a config may give one callback or a list
            return [] if value is None else value if isinstance(value, list) else [value]

        listed, defaults = config.get("callbacks"), self.trainer_defaults.get("callbacks")
        given = [*callbacks, *as_list(listed), *as_list(defaults)]
        if self.subcommand not in (None, "predict"):  # it writes predictions, nothing else
            callbacks = [c for c in callbacks if not isinstance(c, BasePredictionWriter)]
        shown = not config.get("barebones")
        summary = None
        if shown and config.get("enable_model_summary") is not False:
            if not any(isinstance(callback, ModelSummary) for callback in given):
                # Lightning's own would be added (and announce it skipped one) otherwise.
                summary, config["enable_model_summary"] = Summary(), False
        if shown and config.get("enable_progress_bar") is not False:
            if not any(isinstance(callback, ProgressBar) for callback in given):
                # A bar where a terminal (or a notebook) redraws it, on stdout as tqdm
                # writes it; a line an epoch where stdout is a file or a pipe.
                shows_a_bar = sys.stdout.isatty() or "ipykernel" in sys.modules
                callbacks = [*callbacks, TQDMBar() if shows_a_bar else EpochLines()]
        own = {
            id(c)
            for c in callbacks
            if not isinstance(c, ModelCheckpoint | BasePredictionWriter | ProgressBar)
        }
        options = section["fsdp"]
        if isinstance(options, FSDPOptions) and options.enabled:
            if config.get("strategy") not in (None, "auto", "fsdp"):
                raise ConfigError(
                    f"fsdp.enabled with trainer.strategy={config['strategy']!r}: FSDP is the"
                    " strategy; leave trainer.strategy out (configs/fsdp.yaml does)"
                )
            from .sharding import FSDP2Strategy

            project = self.project
            config["strategy"] = FSDP2Strategy(options, project.wrap, project.shard_blocks)
        manual = getattr(self.model, "automatic_optimization", True) is False
        if manual and self.subcommand in (None, "fit"):
            manual_optimization(type(self.model).__name__, config)
        trainer = super()._instantiate_trainer(config, callbacks)
        # The config callback Lightning's CLI added is the kit's too.
        own |= {id(c) for c in trainer.callbacks if isinstance(c, SaveConfigCallback)}
        parts = [c for c in trainer.callbacks if id(c) in own] + ([summary] if summary else [])
        if parts:  # one callback in the first one's place
            first = next((i for i, c in enumerate(trainer.callbacks) if id(c) in own), 0)
            others = [c for c in trainer.callbacks if id(c) not in own]
            trainer.callbacks = [*others[:first], KitCallbacks(parts), *others[first:]]
        if type(trainer.profiler) is PassThroughProfiler:  # no --trainer.profiler given
            trainer.profiler = NoProfiler()
        refuse_whole_copies(trainer)
        choose_rendezvous_port(trainer)
        watch = find_callback(trainer, RankWatch)
        if watch is not None:
            watch.arm(trainer)
        return trainer

    def before_instantiate_classes(self) -> None:
        self.claim_run()
        use_tensor_cores()
        config = self.config.get(self.subcommand or "", self.config)
        if "weights_only" in config and config.get("weights_only") is None:
            # Tensors and plain values only: a checkpoint cannot run code when loaded.
            config["weights_only"] = True
        trainer = config["trainer"]
        resolve_hardware(trainer)
        if self.subcommand == "predict":
            trainer["logger"] = False  # predictions go to their CSV file, not a new run


def refuse_whole_copies(trainer: Trainer) -> None:
    """Refuse, in one line, a callback that keeps a whole copy of the model (Lightning's
    weight averaging, EMA, SWA) under a strategy that shards it: FSDP cannot copy it."""
    if not isinstance(trainer.strategy, FSDPStrategy | ModelParallelStrategy):
        return
    for callback in trainer.callbacks:
        if isinstance(callback, WeightAveraging | StochasticWeightAveraging):
            raise ConfigError(
                f"trainer.callbacks: {type(callback).__name__} keeps a whole copy of the model,"
                f" which {type(trainer.strategy).__name__} cannot make of a sharded one: drop it"
                " from the config under FSDP, or train with configs/ddp.yaml"
            )


def elastic_restart(config: dict[str, Any]) -> bool:
    """Whether torchrun started this fit's workers again after one of them failed
    (`--max-restarts`); a restart with no checkpoint named continues the job's run,
    the newest, from its newest checkpoint (`ckpt_path: last`)."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not restart or config.get("ckpt_path") not in (None, "last"):
        return False
    rank_zero_info(f"torchrun restart {restart}: continuing the newest run, if it saved")
    config["ckpt_path"] = "last"
    return True


def manual_optimization(model: str, trainer: dict[str, Any]) -> None:
    """What a Trainer config needs for a module that steps its optimizers itself: no
    accumulation by Lightning (refused in one line), and under DDP the parameters a
    backward leaves out (a GAN's, in each of its two) looked for, said in one line."""
    accumulate = trainer.get("accumulate_grad_batches") or 1
    if accumulate != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={accumulate} with manual optimization"
            f" ({model}.automatic_optimization is False): Lightning accumulates only the"
            f" steps it takes; accumulate in training_step (step the optimizers every"
            f" {accumulate} batches) and leave accumulate_grad_batches at 1"
        )
    if trainer.get("strategy") == "ddp":
        trainer["strategy"] = "ddp_find_unused_parameters_true"
        rank_zero_info(
            "ddp: manual optimization, so each backward may leave some parameters out:"
            " DDP looks for them (strategy ddp_find_unused_parameters_true)"
        )


def main(
    args: list[str] | None = None,
    project: Project | None = None,
    callbacks: list[Callback] | None = None,
    cli_class: Callable[..., ProjectCLI] = ProjectCLI,
    **cli_kwargs,
) -> ProjectCLI:
    """Run the CLI of `project` on `args` (default: the command line).

    `cli_kwargs` go to LightningCLI: `main([...], project, run=False)` only
    builds the model, data and trainer, as tests and notebooks want.
    `callbacks` are added to the Trainer's own (objects that a config cannot
    name, like the sweep's pruning callback, which holds its trial);
    `cli_class` builds the CLI.
    """
    if project is None:
        raise TypeError("main() needs the project: main(args, PROJECT) (see kit/spec.py)")
    quiet_library_noise()
    end_open_runs()
    trainer_defaults = {"callbacks": list(callbacks)} if callbacks else {}
    # `--trainer.max_epoch` is a typo to report, not an abbreviation to accept.
    parser_kwargs: dict[str, Any] = {"allow_abbrev": False}
    words = sys.argv[1:] if args is None else list(args)
    defaults = [str(project.defaults)] if project.defaults else []
    # The project's config file first: as a `--config` of the subcommand, which may hold
    # whatever a --config file holds (jsonargparse reads `default_config_files` by narrower
    # rules: an optimizer by `class_path` and `init_args` is refused there). Where options
    # come before the subcommand (`--config all.yaml fit`), as defaults, read before them.
    first = bool(words) and words[0] in LightningCLI.subcommands()
    if defaults and first:
        words = [words[0], "--config", defaults[0], *words[1:]]
    elif defaults and cli_kwargs.get("run") is False:  # one parser, no subcommands
        words = ["--config", defaults[0], *words]
    for subcommand in LightningCLI.subcommands():
        parser_kwargs[subcommand] = {"allow_abbrev": False}
        if not first and cli_kwargs.get("run") is not False:
            parser_kwargs[subcommand]["default_config_files"] = defaults
    with warnings.catch_warnings():
        # The arguments are always given (the project's config file goes first).
        warnings.filterwarnings("ignore", "LightningCLI's args parameter is intended")
        return cli_class(
            project.model,
            project.datamodule,
            project=project,
            args=words,
            trainer_defaults=trainer_defaults,
            parser_class=type("ProjectParser", (ProjectParser,), {"command": project.command}),
            parser_kwargs=parser_kwargs,
            # The model builds its own optimizer in configure_optimizers, so the
            # CLI's generic --optimizer/--lr_scheduler groups stay off.
            auto_configure_optimizers=False,
            # config.yaml goes into the run's directory, beside checkpoints/; a
            # resumed run rewrites it in the directory it continues.
            save_config_callback=SaveRunConfig,
            save_config_kwargs={"overwrite": True},
            **cli_kwargs,
        )


def run(args: list[str] | None, project: Project) -> int:
    """`main` for the command line: a known error gets a hint after its traceback.

    Nothing is swallowed: the traceback is printed in full and the exit code is
    1; 2 for an unusable checkpoint file (the message says which and why); 143
    (128 + SIGTERM) when a scheduler stopped the run; 1 and one line when it diverged.
    """
    try:
        main(args, project)
    except (CheckpointError, ConfigError) as error:  # every rank refuses it: one line
        if getattr(rank_zero_only, "rank", 0) == 0:
            print(f"error: {error}", file=sys.stderr)
        return 2
    except Diverged as error:  # every rank stops at the same point: one line
        if getattr(rank_zero_only, "rank", 0) == 0:
            print(error, file=sys.stderr)
        return 1
    except CheckpointSaveError as error:  # a rank's own disk
        print(f"{_rank()}error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        mismatch = state_dict_mismatch(error)
        if mismatch is None:
            return _failed(error, project)
        print(f"{_rank()}error: {mismatch}", file=sys.stderr)
        return 2
    except SIGTERMException as stop:
        if getattr(stop, "run_context", {}).get("finished"):
            return 0  # the run had trained all it was to when the signal came
        by = getattr(stop, "run_context", {}).get("stopped_by", "SIGTERM")
        print(f"{_rank()}stopped by {by}; resume with `fit --ckpt_path last`", file=sys.stderr)
        return 143
    except Exception as error:
        return _failed(error, project)
    return 0


def _failed(error: Exception, project: Project) -> int:
    """One line and its exit code for an error of the input or the machine (`one_line`);
    else the traceback in full, the error, and the hint for it if there is one, exit 1."""
    from .hints import explain, one_line  # (only a failure reads them)

    said = one_line(error, project.model.__module__.partition(".")[0])
    if said is not None:
        print(f"{_rank()}error: {said[0]}", file=sys.stderr)
        return said[1]
    traceback.print_exception(error)
    print(f"{_rank()}failed: {type(error).__name__}: {error}", file=sys.stderr)
    hint = explain(error, command=project.command)
    if hint:
        print(hint, file=sys.stderr)
    return 1


def _rank() -> str:
    """'[rank 1/2] ' under DDP, so a failure says which process it was; '' alone.
    (Lightning's `rank_prefixed_message` names the rank always, and not the world.)"""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    rank = getattr(rank_zero_only, "rank", 0)
    return f"[rank {rank}/{world}] " if world > 1 else ""
