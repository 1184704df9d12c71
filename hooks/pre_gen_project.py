"""Validate every answer before a single file is written.

A bad answer stops rendering with one message that names the variable, the
value and the rule; cookiecutter then removes the half-made directory.
"""

import keyword
import re
import sys

ANSWERS = {
    "project_name": {{ cookiecutter.project_name | py_string }},
    "project_slug": {{ cookiecutter.project_slug | py_string }},
    "package_name": {{ cookiecutter.package_name | py_string }},
    "author_name": {{ cookiecutter.author_name | py_string }},
    "author_email": {{ cookiecutter.author_email | py_string }},
    "description": {{ cookiecutter.description | py_string }},
}

# Import names the rendered project depends on or its tests use; a package of
# the same name would shadow them.
DEPENDENCIES = {
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "torch",
    "torchmetrics",
    "tensorboard",
    "mlflow",
    "jsonargparse",
    "numpy",
    "sklearn",
    "yaml",
    "pytest",
    "ruff",
    "tests",
    "setuptools",
}
SLUG_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
PACKAGE_RE = re.compile(r"^[a-z][a-z0-9_]*$")
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def problems(answers: dict) -> list:
    """Every rule the answers break, as `variable 'value': rule` lines."""
    found = []

    def bad(name: str, rule: str) -> None:
        found.append(f"{name} {answers[name]!r}: {rule}")

    if not any(c.isalnum() for c in answers["project_name"]):
        bad("project_name", "must contain at least one letter or digit")
    if not SLUG_RE.match(answers["project_slug"]):
        bad(
            "project_slug",
            "is not a valid distribution and command name; use lowercase ASCII "
            "letters, digits and single hyphens, starting with a letter "
            "(e.g. 'digit-lab')",
        )
    package = answers["package_name"]
    if not (PACKAGE_RE.match(package) and package.isidentifier()) or keyword.iskeyword(
        package
    ):
        bad(
            "package_name",
            "is not a valid import name; use lowercase ASCII letters, digits and "
            "underscores, starting with a letter, and no Python keyword "
            "(e.g. 'digit_lab')",
        )
    elif package in DEPENDENCIES or package in sys.stdlib_module_names:
        bad(
            "package_name",
            "would shadow the module of the same name that the project imports "
            "(a dependency or the standard library); pick another name",
        )
    if not EMAIL_RE.match(answers["author_email"]):
        bad("author_email", "is not an e-mail address (expected name@domain.tld)")
    # Choices (python_version, example, logger, license) and yes/no questions
    # are checked by cookiecutter itself before this hook runs.
    return found


def main() -> int:
    found = problems(ANSWERS)
    if not found:
        return 0
    print("Cannot render the project:", file=sys.stderr)
    for line in found:
        print(f"  - {line}", file=sys.stderr)
    print("Nothing was written. Fix the answer(s) above and run again.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
