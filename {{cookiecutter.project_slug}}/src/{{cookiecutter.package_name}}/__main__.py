"""The project's command (`pyproject.toml` names it), also `python -m <package>`.

It hands the kit the project that project.py describes. `doctor` is dispatched
before Lightning or your code is imported, so it works (and is fast) even when
an install is broken; `export`, `sweep`, `repeat` and `bench` (TOOLS) have their
own small parsers; fit, validate, test and predict are the Lightning CLI.
"""

import difflib
import importlib
import sys

COMMANDS = {
    "fit": "train the model (`fit --help` lists every flag; `--ckpt_path last` resumes)",
    "validate": "evaluate a checkpoint on the validation split (--ckpt_path FILE)",
    "test": "evaluate a checkpoint on the test split (--ckpt_path FILE)",
    "predict": "write predictions.csv from a checkpoint (--ckpt_path FILE)",
    "doctor": "is this machine ready to train on its GPU? (--memory: will the model fit?"
    " --distributed: can its ranks meet?)",
    "export": "write the trained network of a checkpoint as a plain file",
    "sweep": "an Optuna study over fit's flags (configs/sweep.yaml; --workers N, --storage URL)",
    "repeat": "the same fit over --seeds N or --folds K: the metric's mean, sd and 95% CI",
    "bench": "where a training step's time goes here, and what to change first",
}


# The kit's tools, each run by the kit module of its name (`main(argv, project)`); its
# `parser` answers `--help` before the project, torch or Lightning is imported. Not one
# argparse tree of subcommands: it builds every subcommand's parser, importing every
# tool, to answer any one command.
TOOLS = ("export", "sweep", "repeat", "bench")
# Where a tool's `parser` is, when not in its own module: export's work imports torch.
PARSERS = {"export": "export_flags"}
# `python -m` runs this module as __main__, with __package__ set.
PACKAGE = __name__.rpartition(".")[0] or str(__package__)


def project():
    """The project, as this package's command runs it."""
    from .project import PROJECT

    return PROJECT.bound(PACKAGE)


def command() -> str:
    """The console command, without importing the project (or Lightning)."""
    from .kit.spec import command_of

    return command_of(PACKAGE)


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name.ljust(width)}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(
        [
            f"usage: {command()} <command> [flags]   (<command> --help for its flags)",
            "",
            "commands:",
            *lines,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Run a command; `argv` defaults to the command line. Returns the exit code."""
    words = sys.argv[1:] if argv is None else argv
    first = words[0] if words else None
    if first in (None, "-h", "--help"):
        print(usage(), file=sys.stdout if first else sys.stderr)
        return 0 if first else 2
    if first == "doctor":
        from .kit.doctor import main as doctor

        # The project (and with it Lightning) is imported only for `doctor --memory`.
        return doctor(words[1:], command=f"{command()} doctor", project=project)
    if first in TOOLS:
        if any(word in ("-h", "--help") for word in words[1:]):
            flags = importlib.import_module(f"{PACKAGE}.kit.{PARSERS.get(first, first)}")
            flags.parser(command()).parse_known_args(words[1:])  # prints the help and exits
        tool = importlib.import_module(f"{PACKAGE}.kit.{first}")
        return with_project(tool.main, words[1:])
    if first not in COMMANDS and not first.startswith("-"):
        close = difflib.get_close_matches(first, COMMANDS, n=1)
        guess = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"error: unknown command '{first}'{guess}\n\n{usage()}", file=sys.stderr)
        return 2
    from .kit.cli import run

    return with_project(run, argv)


def with_project(command, argv: list[str] | None) -> int:
    """`command(argv, project)`; exit code 2 with one line when project.py describes a
    project the kit cannot run (a field of Project refused its value)."""
    try:
        described = project()
    except ValueError as error:
        print(f"error: project.py: {error}", file=sys.stderr)
        return 2
    return command(argv, described)


def console_main() -> None:
    sys.exit(main())


# The guard matters: DataLoader workers and DDP re-import this module.
if __name__ == "__main__":
    console_main()
