"""Bad answers stop rendering with one clear message and leave nothing behind."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEMPLATE, render
from cookiecutter.exceptions import FailedHookException
from test_readme import commands_of

BAD_ANSWERS = [
    ({"package_name": "2fast"}, "package_name '2fast': is not a valid import name"),
    ({"package_name": "my-project"}, "package_name 'my-project': is not a valid import name"),
    ({"package_name": "class"}, "package_name 'class': is not a valid import name"),
    ({"package_name": "torch"}, "package_name 'torch': would shadow the module"),
    ({"package_name": "lightning"}, "package_name 'lightning': would shadow the module"),
    ({"package_name": "json"}, "package_name 'json': would shadow the module"),
    ({"project_slug": "My Project"}, "project_slug 'My Project': is not a valid distribution"),
    ({"project_slug": "-lab"}, "project_slug '-lab': is not a valid distribution"),
    ({"project_slug": "lab--x"}, "project_slug 'lab--x': is not a valid distribution"),
    ({"author_email": "nobody"}, "author_email 'nobody': is not an e-mail address"),
    ({"author_email": "a@b"}, "author_email 'a@b': is not an e-mail address"),
    ({"project_name": "   "}, "project_name '   ': must contain at least one letter or digit"),
    ({"project_name": "?!"}, "project_name '?!': must contain at least one letter or digit"),
]


def case_id(case) -> str:
    answers = case[0] if isinstance(case, tuple) else case
    return ",".join(f"{k}={v!r}" for k, v in answers.items())


@pytest.mark.parametrize(("answers", "message"), BAD_ANSWERS, ids=[case_id(c) for c in BAD_ANSWERS])
def test_bad_answer_is_named_and_nothing_is_written(tmp_path, capfd, answers, message):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FailedHookException):
        render(out, **answers)
    err = capfd.readouterr().err
    assert message in err
    assert "Nothing was written" in err
    assert list(out.iterdir()) == []


def test_every_broken_rule_is_reported_at_once(tmp_path, capfd):
    with pytest.raises(FailedHookException):
        render(tmp_path, package_name="torch", author_email="nope", project_slug="-x")
    err = capfd.readouterr().err
    assert "package_name 'torch'" in err
    assert "author_email 'nope'" in err
    assert "project_slug '-x'" in err
    assert list(tmp_path.iterdir()) == []


def test_unknown_example_is_refused_by_cookiecutter(tmp_path):
    with pytest.raises(ValueError, match="example, but the choices are"):
        render(tmp_path, example="imagenet")
    assert list(tmp_path.iterdir()) == []


def test_command_line_user_sees_the_message_and_a_failing_exit_code(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            str(TEMPLATE),
            "--no-input",
            "--output-dir",
            str(tmp_path),
            "package_name=torch",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "package_name 'torch': would shadow the module" in result.stderr
    assert list(Path(tmp_path).iterdir()) == []


def test_post_gen_prints_the_next_steps(tmp_path, capfd):
    """The message gives the rendered README's Start block, the environment first."""
    project = render(tmp_path, project_name="Digit Lab")
    err = capfd.readouterr().err
    assert project.name == "digit-lab"
    steps = err.split("Start says:\n\n")[1].split("\n\n")[0]
    told = [re.sub(r"\s{2,}#.*$", "", line).strip() for line in steps.splitlines()]
    start = (project / "README.md").read_text().split("## Start")[1].split("\n## ")[0]
    assert told == ["cd digit-lab", *commands_of(start)]
    assert told[1] == "python -m venv .venv && source .venv/bin/activate"


# Choices and yes/no questions are checked by cookiecutter itself, before the
# hook runs; the message names the value, the variable and the allowed values.
BAD_CHOICES = [
    ({"example": "mnist"}, "mnist provided for choice variable example, but the choices are"),
    ({"logger": "comet"}, "comet provided for choice variable logger"),
    ({"license": "GPL"}, "GPL provided for choice variable license"),
    ({"cluster": "maybe"}, "maybe provided for variable cluster could not be converted"),
    ({"python_version": "3.8"}, "3.8 provided for choice variable python_version"),
]


@pytest.mark.parametrize(("answers", "message"), BAD_CHOICES, ids=[case_id(c) for c in BAD_CHOICES])
def test_bad_choice_is_refused_before_anything_is_written(tmp_path, answers, message):
    with pytest.raises(ValueError, match=message):
        render(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []
