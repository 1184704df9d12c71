"""Every supported combination renders the exact file set, clean, lint-free and valid."""

import ast
import os
import py_compile
import re
import subprocess
import sys
import tomllib
from itertools import product
from pathlib import Path

import pytest
import yaml
from conftest import TEMPLATE, python, render, run

# The options, and a pairwise matrix over them: every value of every option at
# least once, and every pair of values of two options together at least once
# (the interactions: logger x cluster in the launch files, logger x example in
# the configs, python x ci in the workflow...). Greedy, deterministic, starting
# from the defaults.
OPTIONS = {
    "example": ["digits", "minimal"],
    "logger": ["tensorboard", "csv", "mlflow", "wandb"],
    "license": ["MIT", "Apache-2.0", "BSD-3-Clause", "none"],
    "cluster": [True, False],
    "ci": [True, False],
    "python_version": ["3.11", "3.10", "3.12", "3.13"],
}
DEFAULTS = {name: values[0] for name, values in OPTIONS.items()}


def pairs_of(row: dict) -> set:
    items = sorted(row.items())
    return {(a, b) for i, a in enumerate(items) for b in items[i + 1 :]}


def pairwise_matrix() -> list[dict]:
    names = list(OPTIONS)
    candidates = [dict(zip(names, values, strict=True)) for values in product(*OPTIONS.values())]
    uncovered = set().union(*(pairs_of(row) for row in candidates))
    rows = []
    while uncovered:
        best = DEFAULTS if not rows else max(candidates, key=lambda r: len(pairs_of(r) & uncovered))
        rows.append(best)
        uncovered -= pairs_of(best)
    return rows


MATRIX = pairwise_matrix()
# Names that try to break TOML and Python, on the defaults.
NAMES = [
    {"project_name": "Digit Lab"},
    {
        "project_name": 'Zoë\'s "Lab" \\ Ünïcode',
        "description": "Says \"hi\" \\ and 'bye' \u2014 \u2211 \U0001f600 <b>&amp;</b>",
        "author_name": 'O\'Brien "Bob" \\ \u0141ukasz',
        "author_email": "o.brien+lab@example.co.uk",
    },
]
COMBINATIONS = MATRIX + NAMES


def combination_id(answers: dict) -> str:
    if "author_name" in answers:
        return "hostile-names"
    if "project_name" in answers:
        return answers["project_name"].replace(" ", "_")
    answers = {**DEFAULTS, **answers}
    return "-".join(
        [
            answers["example"],
            answers["logger"],
            f"license={answers['license']}",
            "cluster" if answers["cluster"] else "no-cluster",
            "ci" if answers["ci"] else "no-ci",
            f"py{answers['python_version']}",
        ]
    )


def expected_files(package: str, answers: dict) -> set[str]:
    answers = {**DEFAULTS, **answers}
    users = "__init__ __main__ data model project"
    kit = (
        "__init__ callbacks checkpoints cli console data doctor draws export export_flags folder"
        " footprint hardware health schedules shards unfrozen"
        " hints"
        " bench internals machine memory peaks predict repeat resume runs sharding spec stopping"
        " sweep trial watch collectives"
    )
    users_tests = "conftest test_example"
    kit_tests = (
        "host_syncs instruments test_bad_input test_bench test_callbacks test_checkpoints"
        " test_fsdp test_memory"
        " test_cli test_compile test_data test_ddp test_doctor test_export test_faults"
        " test_gpu test_hardware test_health test_hints test_imports test_internals test_lock"
        " test_model"
        " test_numerics test_peaks test_repeat test_resume test_runs test_schedules test_streams"
        " test_sweep test_syncs test_watch"
    )
    support = "__init__ batches fits models processes project readers"
    configs = "accumulate ddp debug default fsdp gpu profile sweep"
    docs = (
        "install train resume data configure gpus bench sweeps doctor troubleshooting testing"
        " updates defaults"
    )
    files = {
        ".gitignore",
        ".pre-commit-config.yaml",
        "AGENTS.md",
        "README.md",
        "mkdocs.yml",
        "docs/_home.py",
        "pyproject.toml",
        "requirements.lock",
        *(f"configs/{name}.yaml" for name in configs.split()),
        *(f"docs/{name}.md" for name in docs.split()),
        *(f"src/{package}/{name}.py" for name in users.split()),
        *(f"src/{package}/kit/{name}.py" for name in kit.split()),
        *(f"tests/{name}.py" for name in users_tests.split()),
        "tests/numerics.json",
        *(f"tests/kit/{name}.py" for name in kit_tests.split()),
        *(f"tests/support/{name}.py" for name in support.split()),
    }
    if answers["cluster"]:
        files |= {
            "scripts/torchrun.sh",
            "scripts/slurm.sbatch",
            "scripts/sweep.sbatch",
            "k8s/pytorchjob.yaml",
            "Dockerfile",
            ".dockerignore",
            "tests/kit/test_cluster.py",
            "docs/cluster.md",
        }
    if answers["ci"]:
        files |= {".github/workflows/ci.yml", ".github/workflows/template-update.yml"}
    if answers["license"] != "none":
        files.add("LICENSE")
    return files


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


def test_matrix_covers_every_pair_of_option_values():
    every_pair = set().union(
        *(pairs_of(dict(zip(OPTIONS, v, strict=True))) for v in product(*OPTIONS.values()))
    )
    assert set().union(*(pairs_of(row) for row in MATRIX)) == every_pair
    assert MATRIX[0] == DEFAULTS and len(MATRIX) <= 24


def test_exact_file_set(rendered):
    answers, project = rendered
    assert files_of(project) == expected_files(package_of(project), answers)


def test_nothing_of_the_template_survives(rendered):
    _, project = rendered
    leftovers = re.compile(r"\{\{|\}\}|\{%|%\}|cookiecutter\.", re.IGNORECASE)
    github_expression = re.compile(r"\$\{\{ [^{}]+ \}\}")  # meant for GitHub Actions
    for relative in sorted(files_of(project)):
        assert not leftovers.search(relative), relative
        text = (project / relative).read_text(encoding="utf-8")
        if relative.startswith(".github/"):
            text = github_expression.sub("", text)
        match = leftovers.search(text)
        assert match is None, f"{relative}: {text[max(0, match.start() - 60) : match.end() + 60]!r}"


def test_ruff_check_and_format_and_ty_check(rendered):
    _, project = rendered
    python("-m", "ruff", "check", "--no-cache", ".", cwd=project)
    python("-m", "ruff", "format", "--check", "--no-cache", ".", cwd=project)
    # The types of the kit, the user's files and the tests, as the rendered CI checks them.
    python("-m", "ty", "check", "--python", sys.executable, cwd=project)


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
    license = {**DEFAULTS, **answers}["license"]
    if license == "none":
        assert "license" not in project_table
    else:
        assert project_table["license"] == license
        assert project_table["license-files"] == ["LICENSE"]
        assert (project / "LICENSE").read_text().count("\n") > 15


LOGGER_PACKAGE = {
    "tensorboard": "tensorboard",
    "csv": None,
    "mlflow": "mlflow-skinny",
    "wandb": "wandb",
}
LOGGER_CLASS = {
    "tensorboard": "TensorBoardLogger",
    "csv": "CSVLogger",
    "mlflow": "MLFlowLogger",
    "wandb": "WandbLogger",
}


def test_only_the_chosen_logger_is_configured_and_installed(rendered):
    answers, project = rendered
    logger = {**DEFAULTS, **answers}["logger"]
    dependencies = tomllib.loads((project / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    names = {re.split(r"[<>=\[]", dep)[0] for dep in dependencies}
    for choice, package in LOGGER_PACKAGE.items():
        if package:
            assert (package in names) == (choice == logger), (package, names)
    default = yaml.safe_load((project / "configs" / "default.yaml").read_text())
    assert default["trainer"]["logger"]["class_path"].endswith("." + LOGGER_CLASS[logger])
    # The kit prepares every logger at run time: the choice lives in default.yaml alone.
    cli = (project / "src" / package_of(project) / "kit" / "cli.py").read_text()
    assert all(f'"{c}"' in cli for c in ("MLFlowLogger", "WandbLogger"))


def docs_of(project: Path) -> str:
    """The README and every page of docs/, as one text."""
    pages = [project / "README.md", *sorted((project / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def test_readme_mentions_only_what_was_chosen(rendered):
    answers, project = rendered
    chosen = {**DEFAULTS, **answers}
    readme = docs_of(project)
    assert ("TensorBoard" in readme) == (chosen["logger"] == "tensorboard")
    assert ("metrics.csv" in readme) == (chosen["logger"] == "csv")
    assert ("MLflow" in readme) == (chosen["logger"] == "mlflow")
    assert ("Weights & Biases" in readme) == (chosen["logger"] == "wandb")
    for word in (
        "# Scaling out",
        "scripts/torchrun.sh",
        "slurm.sbatch",
        "pytorchjob.yaml",
        "Dockerfile",
        "apptainer",
    ):
        assert (word in readme) == chosen["cluster"], word
    assert ("ci.yml" in readme) == chosen["ci"]
    if chosen["license"] == "none":
        assert "No license was chosen" in readme
    else:
        assert f"{chosen['license']}, see `LICENSE`" in readme


def test_launch_scripts_are_executable_and_valid(rendered):
    answers, project = rendered
    if not {**DEFAULTS, **answers}["cluster"]:
        assert not (project / "scripts").exists() and not (project / "k8s").exists()
        assert not (project / "Dockerfile").exists()
        return
    for script in ("scripts/torchrun.sh", "scripts/slurm.sbatch", "scripts/sweep.sbatch"):
        assert os.access(project / script, os.X_OK), script
        run(["bash", "-n", script], cwd=project)
    assert yaml.safe_load((project / "k8s" / "pytorchjob.yaml").read_text())["kind"] == "PyTorchJob"
    hadolint = Path(sys.executable).parent / "hadolint"
    run([str(hadolint), "--failure-threshold", "info", "Dockerfile"], cwd=project)


def test_rendered_workflow_is_valid_yaml_with_the_checks(rendered):
    answers, project = rendered
    chosen = {**DEFAULTS, **answers}
    path = project / ".github" / "workflows" / "ci.yml"
    if not chosen["ci"]:
        assert not (project / ".github").exists()
        return
    text = path.read_text()
    workflow = yaml.safe_load(text)
    job = workflow["jobs"]["test"]
    assert set(workflow[True]) == {"push", "pull_request"}  # YAML 1.1 reads `on:` as True
    versions = job["strategy"]["matrix"]["python"]
    assert versions[0] == chosen["python_version"] and versions[-1] == "3.13"
    runs = [step.get("run", "") for step in job["steps"]]
    assert any("torch" in r and "TORCH_INDEX_URL" in r for r in runs)
    # torch, then the lock with every hash required, then the project alone.
    torch_at = next(i for i, r in enumerate(runs) if "torch" in r and "TORCH_INDEX_URL" in r)
    locked = runs.index("python -m pip install --require-hashes -r requirements.lock")
    assert (
        torch_at
        < locked
        < runs.index("python -m pip install --no-deps -e . && python -m pip check")
    )
    # Another job resolves the lock again and fails on any difference.
    (check,) = [s["run"] for s in workflow["jobs"]["lock"]["steps"] if "run" in s]
    assert check.startswith("uv pip compile pyproject.toml -o requirements.lock\n")
    assert "git diff --exit-code requirements.lock" in check
    assert {"ruff check .", "ruff format --check .", "python -m pytest --all"} <= set(runs)
    assert "mkdocs build --strict" in runs  # the docs site, links checked
    # GitHub's own expressions arrive as written, not as template syntax.
    assert "${{ matrix.python }}" in text and "${{ vars.TORCH_INDEX_URL }}" in text


def test_template_update_workflow_checks_updates_and_opens_pull_requests(rendered):
    answers, project = rendered
    chosen = {**DEFAULTS, **answers}
    path = project / ".github" / "workflows" / "template-update.yml"
    if not chosen["ci"]:
        assert not path.exists()
        return
    text = path.read_text()
    workflow = yaml.safe_load(text)
    triggers = workflow[True]  # YAML 1.1 reads `on:` as True
    assert set(triggers) == {"schedule", "workflow_dispatch"}
    assert len(triggers["schedule"][0]["cron"].split()) == 5
    assert workflow["permissions"] == {"contents": "write", "pull-requests": "write"}
    (job,) = workflow["jobs"].values()
    steps = {step.get("id") or step.get("name") or step["uses"]: step for step in job["steps"]}
    order = list(steps)
    checkout = job["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@") and checkout["with"]["fetch-depth"] == 0
    # Nothing happens unless the project was made with cruft.
    assert "[ -f .cruft.json ]" in steps["linked"]["run"] and "cruft link" in steps["linked"]["run"]
    linked = "steps.linked.outputs.linked == 'true'"
    assert steps["check"]["if"] == linked and "cruft check" in steps["check"]["run"]
    assert steps["Install cruft"]["if"] == linked
    # Only when the template moved: update, then a pull request with the change.
    moved = "steps.check.outputs.moved == 'true'"
    update, pull_request = steps["cruft update"], steps["Open a pull request"]
    assert update["if"] == pull_request["if"] == moved
    assert update["run"].startswith("cruft update --skip-apply-ask")
    assert pull_request["uses"].startswith("peter-evans/create-pull-request@")
    assert pull_request["with"]["branch"] == "template-update"
    assert order.index("linked") < order.index("check") < order.index("cruft update")
    assert (
        order.index("cruft update") < order.index("conflicts") < order.index("Open a pull request")
    )
    # A change left in a .rej file: a draft pull request that says so and lists them.
    assert "'*.rej'" in steps["conflicts"]["run"] and steps["conflicts"]["if"] == moved
    assert pull_request["with"]["draft"] == "${{ steps.conflicts.outputs.files != '' }}"
    assert "${{ steps.conflicts.outputs.files || 'nothing' }}" in pull_request["with"]["body"]
    assert "${{ secrets.TEMPLATE_UPDATE_TOKEN || github.token }}" in text
    python_step = next(step for step in job["steps"] if "setup-python" in step.get("uses", ""))
    assert python_step["with"]["python-version"] == chosen["python_version"]


def test_python_files_compile_and_name_is_kept(rendered):
    answers, project = rendered
    for path in project.rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
    package = package_of(project)
    init = ast.parse((project / "src" / package / "__init__.py").read_text(encoding="utf-8"))
    assert ast.get_docstring(init) == answers.get("project_name", "My Lightning Project")


def test_the_readme_links_every_page_and_every_reference_resolves(rendered):
    """The README's table links each docs/ page; each `docs/<page>.md` that the docs,
    the code, the configs and the scripts name is in the render."""
    _, project = rendered
    readme = (project / "README.md").read_text(encoding="utf-8")
    pages = {path.relative_to(project).as_posix() for path in (project / "docs").glob("*.md")}
    assert pages and set(re.findall(r"\((docs/[\w-]+\.md)\)", readme)) == pages
    named = {
        f"{path.relative_to(project)}: {reference}"
        for path in project.rglob("*")
        if path.is_file() and path.suffix in (".md", ".py", ".yaml", ".yml", ".sh", ".sbatch")
        for reference in re.findall(r"\bdocs/[\w-]+\.md", path.read_text(encoding="utf-8"))
        if reference not in pages
    }
    assert not named, sorted(named)
    # The first screen reaches your own model: the Project and the three files.
    first = "\n".join(readme.splitlines()[:80])
    assert "PROJECT = Project(" in first and all(
        name in first for name in ("model.py", "data.py", "project.py")
    )


def test_agents_md_names_real_files_and_the_kits_own(rendered):
    """AGENTS.md, what a coding agent reads first: every file or folder it names in
    backticks is in the render, and it names the user's files and the kit's folders.
    (test_readme.py runs its commands.)"""
    _, project = rendered
    package = package_of(project)
    text = (project / "AGENTS.md").read_text(encoding="utf-8")
    named = {
        word
        for word in re.findall(r"`([\w./-]+)`", text)
        if "/" in word or re.fullmatch(r"[\w-]+\.(py|md|yaml|json|toml)", word)
    }
    missing = {word for word in named if not (project / word).exists()}
    assert not missing, sorted(missing)
    for own in ("model.py", "data.py", "project.py", "kit/spec.py"):
        assert f"src/{package}/{own}" in named
    assert {f"src/{package}/kit/", "tests/kit/", "configs/default.yaml"} <= named


@pytest.mark.parametrize("answers", [{}, {"cluster": False, "ci": False, "example": "minimal"}])
def test_the_docs_build_into_a_site_with_every_link_checked(tmp_path, answers):
    """mkdocs.yml: the README as the home page, every docs/ page in the nav, a link to a
    page or an anchor that is not there fails the build."""
    project = render(tmp_path, **answers)
    build = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    subprocess.run(build, cwd=project, check=True, capture_output=True, text=True)
    site = project / "site"
    pages = sorted(p.stem for p in (project / "docs").glob("*.md"))
    assert sorted(p.parent.name for p in site.glob("*/index.html")) == pages
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="install/"' in home and "PROJECT = Project(" in home
    with (project / "docs" / "train.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the resume page](resume.md#no-such-section).\n")
    broken = subprocess.run(build, cwd=project, capture_output=True, text=True)
    assert broken.returncode != 0 and "no-such-section" in broken.stderr, broken.stderr


def test_readme_mentions_only_the_chosen_example(rendered):
    answers, project = rendered
    readme = docs_of(project)
    if answers.get("example") == "minimal":
        assert "synthetic regression" in readme and "val/acc" not in readme
    else:
        assert "handwritten digits" in readme and "synthetic regression" not in readme


def test_the_readme_shows_the_project_py_it_rendered(rendered):
    """The README's "Make it yours" starts from the rendered `project.py`, word for word."""
    _, project = rendered
    readme = (project / "README.md").read_text()
    shown = readme.split("`project.py` is where your model goes:\n\n```python\n")[1]
    shown = shown.split("```")[0]
    spec = next(project.glob("src/*/project.py")).read_text()
    assert spec.endswith("\n" + shown), f"README shows:\n{shown}\nproject.py has:\n{spec}"


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
    assert (project / "src" / package / "kit" / "cli.py").exists()


def test_rendering_twice_is_identical(tmp_path):
    first = render(tmp_path / "a")
    second = render(tmp_path / "b")
    assert files_of(first) == files_of(second)
    for relative in files_of(first):
        assert (first / relative).read_bytes() == (second / relative).read_bytes(), relative


def test_template_readme_and_ci_run_the_same_test_command():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    first = "\n".join(readme.splitlines()[:30])  # the two commands, on the first screen
    assert "bash scripts/demo.sh" in first and "bash scripts/test.sh" in first
    assert "scripts/test.sh" in (root / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in (root / ".github" / "workflows" / "ci.yml").read_text()


def test_the_kit_is_the_same_text_in_every_render(tmp_path):
    """The kit takes the project as an argument and every logger at run time: no
    option, name or example changes a byte of it, so an update patches it cleanly."""
    kits = {}
    for number, answers in enumerate(COMBINATIONS):
        project = render(tmp_path / str(number), **answers)
        kit = project / "src" / package_of(project) / "kit"
        kits[combination_id(answers)] = {
            path.name: path.read_bytes() for path in sorted(kit.glob("*.py"))
        }
    first_id, first = next(iter(kits.items()))
    assert len(kits) == len(COMBINATIONS) > 10
    for combination, files in kits.items():
        assert files.keys() == first.keys(), combination
        differ = [name for name in files if files[name] != first[name]]
        assert differ == [], f"{combination} differs from {first_id} in kit/{differ}"


def test_the_kit_is_plain_python():
    """No template expression in the kit's source: it renders as it is written."""
    package = TEMPLATE / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}"
    files = sorted((package / "kit").glob("*.py"))
    assert len(files) > 10
    jinja = [f.name for f in files if any(mark in f.read_text() for mark in ("{{", "{%", "{#"))]
    assert jinja == []
