"""The project under test, as its command runs it: the one place tests get it from."""

import re
from functools import cache, partial
from pathlib import Path

from {{ cookiecutter.package_name }}.__main__ import project
from {{ cookiecutter.package_name }}.kit import cli

PROJECT = project()
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = PROJECT_ROOT / "configs"
SRC = PROJECT_ROOT / "src"
TESTS = PROJECT_ROOT / "tests"
KIT_TESTS = TESTS / "kit"  # the kit's tests and their instruments
PACKAGE = PROJECT.package
# The console command pyproject.toml declares, as the docs name it (read as text:
# tomllib is not in every supported Python).
SCRIPT = re.search(
    r"^\[project\.scripts\]\s*^([\w.-]+)\s*=",
    (PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"),
    re.MULTILINE,
).group(1)


@cache
def optimizes_by_hand() -> bool:
    """Whether the project's model steps its optimizers itself (`automatic_optimization`
    False, as a GAN's does): Lightning then accumulates no gradients for it."""
    return PROJECT.model().automatic_optimization is False


# The kit's CLI for this project: main(["fit", ...], run=False, callbacks=[...]).
main = partial(cli.main, project=PROJECT)


@cache
def whole_copies() -> str | None:
    """The callback of the project's configs that keeps a whole copy of the model
    (Lightning's EMA or SWA), which FSDP cannot make: the project's FSDP runs are refused
    in one line. None where there is none."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging, WeightAveraging

    trainer = main(["--trainer.logger=false"], run=False).trainer
    kinds = WeightAveraging | StochasticWeightAveraging
    return next((type(c).__name__ for c in trainer.callbacks if isinstance(c, kinds)), None)
