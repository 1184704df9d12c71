"""The project under test, as its command runs it: the one place tests get it from."""

from functools import partial
from pathlib import Path

from {{ cookiecutter.package_name }}.__main__ import project
from {{ cookiecutter.package_name }}.kit import cli

PROJECT = project()
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = PROJECT_ROOT / "configs"
SRC = PROJECT_ROOT / "src"
TESTS = PROJECT_ROOT / "tests"
PACKAGE = PROJECT.package
# The kit's CLI for this project: main(["fit", ...], run=False, callbacks=[...]).
main = partial(cli.main, project=PROJECT)
