"""The `{{ cookiecutter.project_slug }}` command, also `python -m {{ cookiecutter.package_name }}`.

`doctor` is dispatched before Lightning is imported, so it works (and is fast)
even when Lightning's install is broken; `export` and `sweep` have their own
small parsers (`sweep --help` answers before Lightning is imported); fit,
validate, test and predict are the Lightning CLI.
"""

import difflib
import sys

COMMANDS = {
    "fit": "train the model (`fit --help` lists every flag; `--ckpt_path last` resumes)",
    "validate": "evaluate a checkpoint on the validation split (--ckpt_path FILE)",
    "test": "evaluate a checkpoint on the test split (--ckpt_path FILE)",
    "predict": "write predictions.csv from a checkpoint (--ckpt_path FILE)",
    "doctor": "is this machine ready to train on its GPU? (never imports Lightning)",
    "export": "write the trained network of a checkpoint as a plain file",
    "sweep": "an Optuna study over fit's flags (configs/sweep.yaml; --workers N, --storage URL)",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name.ljust(width)}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(
        [
            "usage: {{ cookiecutter.project_slug }} <command> [flags]   (<command> --help for its flags)",
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
        from {{ cookiecutter.package_name }}.kit.doctor import main as doctor

        return doctor(words[1:])
    if first == "export":
        from {{ cookiecutter.package_name }}.kit.export import main as export

        return export(words[1:])
    if first == "sweep":
        from {{ cookiecutter.package_name }}.kit.sweep import main as sweep

        return sweep(words[1:])
    if first not in COMMANDS and not first.startswith("-"):
        close = difflib.get_close_matches(first, COMMANDS, n=1)
        guess = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"error: unknown command '{first}'{guess}\n\n{usage()}", file=sys.stderr)
        return 2
    from {{ cookiecutter.package_name }}.kit.cli import run

    return run(argv)


def console_main() -> None:
    sys.exit(main())


# The guard matters: DataLoader workers and DDP re-import this module.
if __name__ == "__main__":
    console_main()
