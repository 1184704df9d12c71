"""What a user does after rendering: install it, run its command, run its tests."""

import re
import site
import sys
import venv
from pathlib import Path

import pytest
import torch
from conftest import env_without_mlflow_uri, python, render, run


def passed_count(pytest_output: str) -> int:
    match = re.search(r"(\d+) passed", pytest_output)
    return int(match.group(1)) if match else 0


# Three renders whose own suites run in full: together they run every logger,
# both examples, and the project with and without its optional files.
SUITES = {
    "digits-tensorboard-every-option": {},
    "minimal-csv-no-cluster-no-ci-no-license": {
        "example": "minimal",
        "logger": "csv",
        "cluster": False,
        "ci": False,
        "license": "none",
    },
    "digits-mlflow": {"logger": "mlflow"},
}


@pytest.mark.slow
@pytest.mark.parametrize("answers", SUITES.values(), ids=SUITES.keys())
def test_rendered_project_passes_its_own_test_suite(tmp_path, answers):
    project = render(tmp_path, **answers)
    env = env_without_mlflow_uri()
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        timeout=900,
        env=env,
    )
    # Every CPU test ran and passed; only the GPU ones may skip, with a reason.
    assert not re.search(r"\d+ (failed|errors?)\b", result.stdout), result.stdout[-3000:]
    assert passed_count(result.stdout) >= 90, result.stdout[-3000:]
    skipped = re.findall(r"SKIPPED \[\d+\] \S+: (.*)", result.stdout)
    if not torch.cuda.is_available():
        # The GPU config's fast_dev_run and the GPU fit, nothing else.
        assert skipped == ["needs a CUDA device; torch.cuda.is_available() is False"] * 2


@pytest.mark.slow
def test_installed_command_is_the_module(tmp_path):
    project = render(tmp_path, project_name="Digit Lab")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    env_python = str(bin_dir / "python")
    # The new environment sees this one's packages (torch, lightning, pip,
    # setuptools) through a .pth file, so only the project itself installs.
    env_site = run(
        [env_python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp_path
    ).stdout.strip()
    Path(env_site, "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run(
        [
            env_python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--editable",
            ".",
        ],
        cwd=project,
    )
    command = str(bin_dir / "digit-lab")
    assert Path(command).exists()
    smoke = ["fit", "--config", "configs/debug.yaml"]
    for cmd in ([command, *smoke], [env_python, "-m", "digit_lab", *smoke]):
        result = run(cmd, cwd=project, timeout=300)
        assert "Environment" in result.stderr and "fast_dev_run" in result.stderr
    doctor = run([command, "doctor"], cwd=project).stdout
    assert "torch " in doctor and "Result: " in doctor
    help_text = run([command, "fit", "--help"], cwd=project).stdout
    assert "--trainer.accumulate_grad_batches" in help_text and "--data.batch_size" in help_text


@pytest.mark.gpu
@pytest.mark.slow
def test_rendered_project_fits_on_gpu(tmp_path):
    project = render(tmp_path)
    result = python(
        "-m",
        "my_lightning_project",
        "fit",
        "--config",
        "configs/gpu.yaml",
        "--trainer.max_epochs",
        "10",
        cwd=project,
        PYTHONPATH=str(project / "src"),
        timeout=600,
    )
    assert "CUDAAccelerator" in result.stderr and "bf16-mixed" in result.stderr
    (best,) = (project / "logs" / "digits" / "version_0" / "checkpoints").glob("best-*.ckpt")
    state = torch.load(best, map_location="cpu", weights_only=True)
    (checkpoint_state,) = [s for s in state["callbacks"].values() if "best_model_score" in s]
    assert float(checkpoint_state["best_model_score"]) >= 0.97
    python("-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", cwd=project)
