"""Every shell command of both READMEs (and the rendered docs/ pages) runs as written,
on a fresh render.

Each command of a ```bash block must match one rule below, which says how the
test runs it: as written, or with a stated adaptation (the torch build is the
machine's; a new virtual environment also sees the packages this one has, so
nothing is downloaded again), or where else it is tested. A command no rule
knows fails the test, so a new README command needs a rule.
"""

import os
import re
import shlex
import site
import sys
from pathlib import Path

import pytest
import torch
from conftest import TEMPLATE, env_without_mlflow_uri, render, watched

TORCH = f"torch=={torch.__version__.split('+')[0]}"
# The venvs the READMEs create see this environment's packages through a .pth file.
SHARE_PACKAGES = (
    'python -c "import sys, sysconfig; '
    "open(sysconfig.get_path('purelib') + '/parent_env.pth', 'w').write("
    + repr("\n".join(site.getsitepackages()))
    + ')"'
)


def commands_of(readme: str) -> list[str]:
    """The commands of every ```bash block, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def docs_commands(project: Path) -> list[str]:
    """The commands of a render's README, then of each docs/ page in the order its table
    links them (a reader's order), then of AGENTS.md, each once."""
    readme = (project / "README.md").read_text()
    pages = dict.fromkeys(re.findall(r"\(docs/([\w-]+)\.md\)", readme))
    texts = [readme, *((project / "docs" / f"{page}.md").read_text() for page in pages)]
    texts.append((project / "AGENTS.md").read_text())
    return list(dict.fromkeys(command for text in texts for command in commands_of(text)))


def server(command: str, url: str) -> str:
    """Start a server, wait until `url` answers (its answer goes to server-answer.txt), stop it."""
    probe = (
        "python - <<'PY'\n"
        "import time, urllib.request\n"
        "for _ in range(240):\n"
        "    try:\n"
        f"        answer = urllib.request.urlopen({url!r}, timeout=5).read()\n"
        "        break\n"
        "    except Exception:\n"
        "        time.sleep(0.5)\n"
        "else:\n"
        f"    raise SystemExit('no answer from {url}')\n"
        "open('server-answer.txt', 'wb').write(answer)\n"
        "PY"
    )
    return (
        f"{command} > server.log 2>&1 & server=$!\n{probe}\nrc=$?\n"
        "kill $server; wait $server\n"
        "[ $rc -eq 0 ] || { cat server.log >&2; exit 1; }"
    )


# (pattern, how): "run" as written; "expect N" as written, exit code N; "server URL";
# "replace WITH" (run WITH instead, the reason in a comment); "shorten FLAGS" (as
# written, plus FLAGS that cut its wait); "covered WHERE"; "skip WHY".
GPU = torch.cuda.is_available()
FIT = r"\S+ fit( --print_config| --data\.batch_size 256 --trainer\.max_epochs 5)?"
RENDERED_RULES = [
    (r"python -m venv \.venv && source \.venv/bin/activate", "then " + SHARE_PACKAGES),
    # The machine's build: PyTorch's CPU index is out of reach here, the same release of
    # its CPU build lies on this disk.
    (
        r"pip install torch --index-url https://download\.pytorch\.org/whl/cpu",
        f"replace pip install {TORCH}",
    ),
    # The lock: what differs from this environment is downloaded, every hash checked.
    (
        r"pip install --require-hashes -r requirements\.lock( && pip install --no-deps -e \.)?",
        "run",
    ),
    (r"pip install --no-deps -e \.", "run"),
    (
        r"uv pip compile pyproject\.toml -o requirements\.lock",
        "covered tests/test_uv.py (the same file again, from PyPI, under its cutoff)",
    ),
    (r"\S+ --help", "run"),
    (FIT, "run"),
    # The optimizer flags are what it shows; the default fit above trains 20 epochs already.
    (
        r"\S+ fit --model\.optimizer SGD --model\.optimizer\.lr 0\.05",
        "shorten --trainer.max_epochs 2",
    ),
    (r"\S+ fit --config configs/accumulate\.yaml --config configs/profile\.yaml", "run"),
    (r"\S+ (validate|test|predict) +--ckpt_path \$CKPT", "run"),
    (r"\S+ export +--ckpt_path \$CKPT --output model(\.pt|\.pt2|\.onnx|/)", "run"),
    (r"hf upload <user>/<model-name> model/", "skip needs a Hugging Face account and the network"),
    # PyTorch's indexes are out of reach here: test_uv.py resolves the extras offline,
    # and `uv run` runs the command in the environment pip made above.
    (
        r"uv sync --extra cu130 --extra dev",
        "covered tests/test_uv.py (each extra resolved offline, on stand-in indexes)",
    ),
    (
        r"uv run --extra cu130 \S+ fit",
        'replace uv run --no-sync "$(basename "$PWD")" fit --trainer.fast_dev_run=true',
    ),
    # No Docker daemon, registry, Apptainer or SLURM here.
    (
        r"docker build -t registry\.example\.com/\S+ \.",
        "skip no Docker daemon here; tests/kit/test_cluster.py lints the Dockerfile with hadolint",
    ),
    (r"docker (run|push) .*registry\.example\.com/\S+.*", "skip no Docker daemon or GPU here"),
    (r"apptainer build \S+\.sif docker://\S+", "skip no Apptainer here"),
    (
        r"SIF=\S+\.sif sbatch scripts/slurm\.sbatch",
        "covered tests/kit/test_cluster.py (the script under a recording srun, with SIF)",
    ),
    (r"\S+ doctor( --json)?", "run"),
    (r"\S+ doctor --memory( --world_size \d+ --devices_free_gib \d+)?", "run"),
    (r"\S+ doctor --ckpt_path \$CKPT", "run"),
    (r"\S+ doctor --distributed( --timeout \d+ --json)?", "run"),
    (r"\S+ bench( --steps \d+)?( --json)?", "run"),
    (
        r"\S+ sweep( .*)?",
        "covered tests/kit/test_sweep.py: short sweeps over a small space (trials pruned, a killed"
        " sweep continued, two workers on one study) and configs/sweep.yaml checked against fit;"
        " the default 20 trials of 20 epochs are too long for a test",
    ),
    (
        r"\S+ repeat --seeds 3 -- --trainer\.max_epochs 5",
        "shorten --trainer.max_epochs 1 --trainer.limit_train_batches 2",
    ),
    (
        r"\S+ repeat --seeds \d+( --workers \d+)?",
        "covered tests/kit/test_repeat.py: three-seed and three-fold repeats of a short epoch"
        " against a hand calculation, and a killed repeat of two workers continued",
    ),
    (r"\S+ doctor --require_gpu", "run" if GPU else "expect 1"),
    (r"tensorboard --logdir logs", "server http://localhost:6006"),
    (r'pip install "mlflow>=3,<4"', "run"),
    (
        r"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri mlruns",
        "server http://127.0.0.1:5000",
    ),
    (r"wandb login", "skip needs a Weights & Biases account"),
    (r"wandb sync logs/wandb/offline-run-\*", "skip needs a W&B account and the network"),
    (
        r"pytest( --all| -m target)?",
        "covered tests/test_rendered_project.py runs the suite, and `-m target` on two renders",
    ),
    (r"pytest tests/kit/test_numerics\.py --record-numerics", "run"),
    (r"ruff check \. && ruff format --check \.", "run"),
    (r"mkdocs build --strict", "run"),
    (r"ty check", "run"),
    (r"git init && pre-commit install", "run"),
    (r"cruft (check|update|link .*)", "covered tests/test_ecosystem.py (a cruft-made project)"),
]
TEMPLATE_RULES = [
    (r"bash scripts/demo\.sh", "covered test_demo_renders_installs_and_trains below"),
    (r"bash scripts/test\.sh", "covered .ci/run: this very suite"),
    (
        r"(WHEELHOUSE=build/wheelhouse )?bash scripts/gpu_check\.sh",
        "covered tests/test_benchmark.py (one line and exit 1 without CUDA; the whole check"
        " on a machine with CUDA)",
    ),
    (
        r"python scripts/wheelhouse\.py build/wheelhouse --python-version 3\.12 --torch 2\.11\.0",
        "covered tests/test_wheelhouse.py (built for this machine's Python, then installed with"
        " no index beside torch alone)",
    ),
    (
        r"python scripts/lock\.py",
        "covered tests/test_uv.py (its merge of the locks, and two renders' locks resolved"
        " again from PyPI: the same file); it resolves 16 renders from PyPI, minutes",
    ),
    (r'pip install "cookiecutter>=2\.7"', "run"),
    (r"cookiecutter gh:<org>/cookiecutter-lightning", "skip a placeholder for the hosted copy"),
    (
        r'cookiecutter path/to/cookiecutter-lightning --no-input project_name="Digit Lab"',
        f"replace cookiecutter {shlex.quote(str(TEMPLATE))} --no-input project_name='Digit Lab'",
    ),
    (r"cd digit-lab", "run"),
    # The rendered README's test runs the default fit as written; this one checks it trains.
    (r"\S+ fit", "shorten --trainer.max_epochs 2"),
    *[(pattern, action) for pattern, action in RENDERED_RULES if pattern != FIT],
    (r"\S+ fit( --print_config| --data\.batch_size 256 --trainer\.max_epochs 5)", "run"),
]


def how(command: str, rules: list) -> str:
    matches = [action for pattern, action in rules if re.fullmatch(pattern, command)]
    assert len(matches) == 1, f"README command {command!r} matches {len(matches)} rules"
    return matches[0]


def script_for(commands: list[str], rules: list, before: dict[str, str]) -> str:
    """A bash script that runs each command as its rule says and stops at the first failure."""
    lines = []
    for command in commands:
        action = how(command, rules)
        verb, _, rest = action.partition(" ")
        if verb in ("covered", "skip"):
            lines.append(f"echo {shlex.quote(f'# {command}: {action}')}")
            continue
        lines += [line for pattern, line in before.items() if re.search(pattern, command)]
        run = {"replace": rest, "shorten": f"{command} {rest}"}.get(verb, command)
        lines.append(f"echo {shlex.quote('$ ' + run)}")
        if verb == "server":
            lines.append(server(run, rest))
            continue
        expected = int(rest) if verb == "expect" else 0
        lines.append(run)
        lines.append(
            f"rc=$?; [ $rc -eq {expected} ] || "
            f"{{ echo FAILED with exit $rc: {shlex.quote(run)} >&2; exit 1; }}"
        )
        if verb == "then":
            lines.append(rest)
    return "\n".join(lines) + "\n"


def run_script(script: str, cwd: Path, timeout: float = 600) -> str:
    env = env_without_mlflow_uri()
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    result = watched(["bash", "-c", script], cwd=cwd, env=env, silent_for=timeout)
    output = f"--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    assert result.returncode == 0, output
    return result.stdout


# Where $CKPT comes from: the README says "any .ckpt above".
CKPT = {r"\$CKPT": "export CKPT=$(ls logs/version_*/checkpoints/best-*.ckpt | head -n 1)"}


@pytest.mark.slow
def test_every_command_of_the_rendered_readme(tmp_path):
    project = render(tmp_path)
    out = run_script(script_for(docs_commands(project), RENDERED_RULES, CKPT), cwd=project)
    assert "usage: my-lightning-project <command>" in out and "  export " in out
    assert (project / "predictions.csv").is_file() and (project / "model.pt").is_file()
    assert (project / "model.pt2").is_file() and (project / "model.onnx").is_file()
    assert (project / "model" / "model.safetensors").is_file()
    assert "| test/acc |" in (project / "model" / "README.md").read_text()  # `test` ran first
    assert (project / ".git" / "hooks" / "pre-commit").is_file()


@pytest.mark.slow
def test_the_mlflow_readme_commands(tmp_path):
    """The commands only the MLflow render has: the full MLflow, and its UI over the runs."""
    project = render(tmp_path, logger="mlflow", example="minimal")
    default = set(docs_commands(render(tmp_path / "default")))
    own = [c for c in docs_commands(project) if c not in default]
    assert own == [
        'pip install "mlflow>=3,<4"',
        "MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri mlruns",
    ]
    fit = f"{shlex.quote(sys.executable)} -m my_lightning_project fit --trainer.max_epochs=1"
    experiments = "http://127.0.0.1:5000/ajax-api/2.0/mlflow/experiments/search?max_results=10"
    script = f"export PYTHONPATH=src\n{fit} > fit.log 2>&1 || exit 1\n" + script_for(
        own, RENDERED_RULES, {}
    ).replace("http://127.0.0.1:5000", experiments)
    run_script(script, cwd=project)
    assert '"name": "my-lightning-project"' in (project / "server-answer.txt").read_text()


@pytest.mark.slow
def test_every_command_of_the_template_readme(tmp_path):
    readme = (TEMPLATE / "README.md").read_text()
    run_script(script_for(commands_of(readme), TEMPLATE_RULES, {}), cwd=tmp_path)
    project = tmp_path / "digit-lab"
    assert (project / "logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_demo_renders_installs_and_trains(tmp_path):
    venv = tmp_path / "venv"
    script = (
        f"{shlex.quote(sys.executable)} -m venv {venv} && . {venv}/bin/activate && "
        f"{SHARE_PACKAGES} && deactivate && "
        f"VENV={venv} DEMO_DIR={tmp_path / 'demo'} bash scripts/demo.sh"
    )
    env = {**env_without_mlflow_uri(), "TORCH_SPEC": TORCH}
    result = watched(["bash", "-c", script], cwd=TEMPLATE, env=env, silent_for=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    for step in ("==> Installing torch", "==> Rendering the template", "==> Training the example"):
        assert step in result.stderr, step
    run = tmp_path / "demo" / "my-lightning-project" / "logs" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_commands_are_read_from_every_bash_block():
    readme = "```bash\na  # note\n# only a comment\nb \\\n  --flag\n```\ntext\n```bash\nc\n```\n"
    assert commands_of(readme) == ["a", "b    --flag", "c"]


def test_every_rendered_and_template_command_has_exactly_one_rule(tmp_path):
    renders = ({}, {"logger": "mlflow"}, {"logger": "wandb"}, {"logger": "csv", "cluster": False})
    for index, answers in enumerate(renders):
        for command in docs_commands(render(tmp_path / str(index), **answers)):
            how(command, RENDERED_RULES)
    for command in commands_of((TEMPLATE / "README.md").read_text()):
        how(command, TEMPLATE_RULES)
