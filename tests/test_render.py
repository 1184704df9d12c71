"""Every supported combination renders the exact file set, clean, lint-free and valid."""

import ast
import py_compile
import re
import tomllib
from pathlib import Path

import pytest
from conftest import python, render

# One option changed at a time from the defaults, plus names that try to
# break TOML and Python. `example` is the option that changes code.
COMBINATIONS = [
    {},
    {"example": "minimal"},
    {"python_version": "3.10"},
    {"python_version": "3.12"},
    {"python_version": "3.13"},
    {"python_version": "3.10", "example": "minimal"},
    {"project_name": "Digit Lab"},
    {
        "project_name": 'Zoë\'s "Lab" \\ Ünïcode',
        "description": "Says \"hi\" \\ and 'bye' \u2014 \u2211 \U0001f600 <b>&amp;</b>",
        "author_name": 'O\'Brien "Bob" \\ \u0141ukasz',
        "author_email": "o.brien+lab@example.co.uk",
    },
]


def combination_id(answers: dict) -> str:
    if not answers:
        return "defaults"
    if "author_name" in answers:
        return "hostile-names"
    return "-".join(f"{k}={v}" for k, v in answers.items()).replace(" ", "_")


def expected_files(package: str) -> set[str]:
    return {
        ".gitignore",
        "README.md",
        "pyproject.toml",
        *(
            f"configs/{name}.yaml"
            for name in ("accumulate", "ddp", "debug", "default", "gpu", "profile")
        ),
        *(
            f"src/{package}/{name}.py"
            for name in (
                "__init__",
                "__main__",
                "callbacks",
                "cli",
                "data",
                "doctor",
                "hardware",
                "health",
                "hints",
                "model",
            )
        ),
        *(
            f"tests/{name}.py"
            for name in (
                "conftest",
                "test_callbacks",
                "test_cli",
                "test_data",
                "test_ddp",
                "test_doctor",
                "test_gpu",
                "test_hardware",
                "test_health",
                "test_hints",
                "test_model",
            )
        ),
    }


def files_of(project: Path) -> set[str]:
    return {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}


@pytest.fixture(scope="module", params=COMBINATIONS, ids=combination_id)
def rendered(request, tmp_path_factory) -> tuple[dict, Path]:
    answers = request.param
    return answers, render(tmp_path_factory.mktemp("render"), **answers)


def package_of(project: Path) -> str:
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]["scripts"][
        project.name
    ].split(".")[0]


def test_exact_file_set(rendered):
    _, project = rendered
    assert files_of(project) == expected_files(package_of(project))


def test_nothing_of_the_template_survives(rendered):
    _, project = rendered
    leftovers = re.compile(r"\{\{|\}\}|\{%|%\}|cookiecutter", re.IGNORECASE)
    for relative in sorted(files_of(project)):
        assert not leftovers.search(relative), relative
        text = (project / relative).read_text(encoding="utf-8")
        match = leftovers.search(text)
        assert match is None, f"{relative}: {text[max(0, match.start() - 60) : match.end() + 60]!r}"


def test_ruff_check_and_format(rendered):
    _, project = rendered
    python("-m", "ruff", "check", "--no-cache", ".", cwd=project)
    python("-m", "ruff", "format", "--check", "--no-cache", ".", cwd=project)


def test_pyproject_round_trips_every_answer(rendered):
    answers, project = rendered
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    project_table = meta["project"]
    assert project_table["name"] == project.name
    defaults = {
        "description": "A PyTorch Lightning project that trains on any hardware with the "
        "Lightning CLI.",
        "author_name": "Your Name",
        "author_email": "you@example.com",
        "python_version": "3.11",
    }
    want = {**defaults, **answers}
    assert project_table["description"] == want["description"]
    author = {"name": want["author_name"], "email": want["author_email"]}
    assert project_table["authors"] == [author]
    assert project_table["requires-python"] == f">={want['python_version']}"
    assert meta["tool"]["ruff"]["target-version"] == "py" + want["python_version"].replace(".", "")
    package = package_of(project)
    assert project_table["scripts"][project.name] == f"{package}.__main__:console_main"
    has_sklearn = any(dep.startswith("scikit-learn") for dep in project_table["dependencies"])
    assert has_sklearn == (want.get("example", "digits") == "digits")


def test_python_files_compile_and_name_is_kept(rendered):
    answers, project = rendered
    for path in project.rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
    package = package_of(project)
    init = ast.parse((project / "src" / package / "__init__.py").read_text(encoding="utf-8"))
    assert ast.get_docstring(init) == answers.get("project_name", "My Lightning Project")


def test_readme_mentions_only_the_chosen_example(rendered):
    answers, project = rendered
    readme = (project / "README.md").read_text(encoding="utf-8")
    if answers.get("example") == "minimal":
        assert "synthetic regression" in readme and "val/acc" not in readme
    else:
        assert "handwritten digits" in readme and "synthetic regression" not in readme


@pytest.mark.parametrize(
    ("name", "slug", "package"),
    [
        ("My Lightning Project", "my-lightning-project", "my_lightning_project"),
        ("Digit Lab", "digit-lab", "digit_lab"),
        ("  Café  Ünïcode Lab ", "cafe-unicode-lab", "cafe_unicode_lab"),
        ("GPU_Trainer 2", "gpu-trainer-2", "gpu_trainer_2"),
    ],
)
def test_names_are_derived_from_the_project_name(tmp_path, name, slug, package):
    project = render(tmp_path, project_name=name)
    assert project == tmp_path / slug
    assert (project / "src" / package / "cli.py").exists()


def test_rendering_twice_is_identical(tmp_path):
    first = render(tmp_path / "a")
    second = render(tmp_path / "b")
    assert files_of(first) == files_of(second)
    for relative in files_of(first):
        assert (first / relative).read_bytes() == (second / relative).read_bytes(), relative


def test_template_readme_and_ci_run_the_same_test_command():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    assert "scripts/test.sh" in (root / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in (root / ".github" / "workflows" / "ci.yml").read_text()
