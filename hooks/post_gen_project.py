"""Say what to do next. Offline and idempotent: it writes nothing, so cruft can
run it again in a temporary copy without effect."""

import sys

SLUG = {{ cookiecutter.project_slug | py_string }}
EXAMPLE = {{ cookiecutter.example | py_string }}


def next_steps() -> str:
    return f"""
Rendered {SLUG}/ ({EXAMPLE} example). Next:

    cd {SLUG}
    pip install torch          # first, the build for your machine (README.md, Install)
    pip install -e ".[dev]"
    {SLUG} fit
    pytest
"""


if __name__ == "__main__":
    print(next_steps(), file=sys.stderr)
