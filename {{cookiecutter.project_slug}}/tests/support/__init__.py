"""What the tests share: the project (`PROJECT`, `main`), its batches, processes
running the command, readers of what a run left, and fits made once a session."""

from .batches import FakeClock, configured, first_batch, loader_length, same_values
from .fits import fit_in, quiet_trainer, shared
from .processes import (
    SUBPROCESS_TIMEOUT,
    ForkedRun,
    cli_env,
    failure,
    fork_cli,
    forkserver,
    run_cli,
    run_forked,
    wait_for,
)
from .project import CONFIGS, PACKAGE, PROJECT, PROJECT_ROOT, SRC, TESTS, main
from .readers import (
    assert_identical,
    best_score,
    folder_of,
    load_checkpoint,
    logged_scalars,
    made_a_run,
    reached,
    run_dirs,
)

__all__ = [
    "CONFIGS",
    "PACKAGE",
    "PROJECT",
    "PROJECT_ROOT",
    "SRC",
    "SUBPROCESS_TIMEOUT",
    "TESTS",
    "FakeClock",
    "ForkedRun",
    "assert_identical",
    "best_score",
    "cli_env",
    "configured",
    "failure",
    "first_batch",
    "fit_in",
    "folder_of",
    "fork_cli",
    "forkserver",
    "load_checkpoint",
    "loader_length",
    "logged_scalars",
    "made_a_run",
    "main",
    "quiet_trainer",
    "reached",
    "run_cli",
    "run_dirs",
    "run_forked",
    "same_values",
    "shared",
    "wait_for",
]
