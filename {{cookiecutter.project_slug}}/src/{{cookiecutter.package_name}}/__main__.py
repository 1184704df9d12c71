"""The `{{ cookiecutter.project_slug }}` command, also `python -m {{ cookiecutter.package_name }}`.

`doctor` is dispatched before Lightning is imported, so it works (and is fast)
even when Lightning's install is broken; `export` has its own small parser;
everything else is the Lightning CLI.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    """Run a command; `argv` defaults to the command line. Returns the exit code."""
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["doctor"]:
        from {{ cookiecutter.package_name }}.doctor import main as doctor

        return doctor(words[1:])
    if words[:1] == ["export"]:
        from {{ cookiecutter.package_name }}.export import main as export

        return export(words[1:])
    from {{ cookiecutter.package_name }}.cli import run

    return run(argv)


def console_main() -> None:
    sys.exit(main())


# The guard matters: DataLoader workers and DDP re-import this module.
if __name__ == "__main__":
    console_main()
