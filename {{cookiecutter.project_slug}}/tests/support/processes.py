"""The command in a process of its own: a subprocess, or forked from a server that
imported Lightning once; and waiting on what it writes."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .project import KIT_TESTS, PACKAGE, SRC, TESTS

# Timeouts are several times what a step takes on a quiet 2-core machine, so a
# busy one fails no test; none of them is an assertion about speed.
SUBPROCESS_TIMEOUT = 600


def cli_env(env: dict | None = None) -> dict:
    """The environment for a CLI subprocess: src/, tests/ and tests/kit/ (the instruments)
    importable."""
    env = {**os.environ, **(env or {})}
{%- if cookiecutter.logger == "mlflow" %}
    env.pop("MLFLOW_TRACKING_URI", None)  # the test's own ./mlruns, not a server or another test's
{%- elif cookiecutter.logger == "wandb" %}
    env.pop("WANDB_SERVICE", None)  # its own W&B service, as a command of its own would have
{%- endif %}
    paths = [str(SRC), str(TESTS), str(KIT_TESTS), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return env


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = SUBPROCESS_TIMEOUT,
    check: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """`python -m <package> args...` in a fresh process (needed for DDP).

    With `check`, a non-zero exit fails the test with the command's output.
    """
    result = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(failure(f"{PACKAGE} {' '.join(args)}", result))
    return result


def failure(command: str, result) -> str:
    """A readable account of a failed subprocess, for assertion messages."""
    return (
        f"{command} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    )


SWEEP_MODULES = [
    f"{PACKAGE}.kit.trial",
    "optuna.storages._rdb.storage",
    "optuna.importance",
    "optuna.visualization.matplotlib",
    "matplotlib.pyplot",
]


def forkserver():
    """Processes forked from a server that imported Lightning and the kit once (and what
    a sweep's trials and report import: Optuna, its database and plots)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["lightning.pytorch", f"{PACKAGE}.kit.cli", "instruments", *SWEEP_MODULES]
    )
    return context


class ForkedRun:
    """A run of the command in a process forked from a server that imported Lightning
    once: a real process (signals, SIGKILL, exit codes), without the import in each."""

    def __init__(self, args: tuple[str, ...], cwd: Path, env: dict | None):
        import instruments

        env = {**(env or {}), "INSTRUMENTS_PACKAGE": PACKAGE}
        self.workdir = cwd
        self.process = forkserver().Process(
            target=instruments.run_command, args=(list(args), str(cwd), env, str(cwd))
        )
        self.process.start()

    def send_signal(self, sent: int) -> None:
        os.kill(self.process.pid, sent)

    def poll(self) -> int | None:
        return self.process.exitcode

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float = SUBPROCESS_TIMEOUT) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            raise AssertionError(f"the run did not end within {timeout} s")
        return self.process.exitcode

    def output(self) -> subprocess.CompletedProcess:
        """Its exit code and what it printed, as subprocess.run would give them."""
        return subprocess.CompletedProcess(
            self.process.pid,
            self.returncode,
            (self.workdir / "stdout.txt").read_text(),
            (self.workdir / "stderr.txt").read_text(),
        )


def fork_cli(*args: str, cwd: Path, env: dict | None = None) -> ForkedRun:
    """Start `<package> args...` in the background (not for DDP, which re-runs the command)."""
    for name in ("stdout.txt", "stderr.txt"):
        (cwd / name).write_text("")
    return ForkedRun(args, cwd, cli_env(env))


def _stat(pid: int | str) -> list[str] | None:
    """A process's /proc stat fields after its name (state first), or None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def children_until_it_ends(run: ForkedRun) -> set[tuple[int, str]]:
    """The processes `run` started (its loader workers), as (pid, start time), watched on
    Linux's /proc until it ends (empty elsewhere); its exit code is then `run.wait()`'s."""
    seen: set[tuple[int, str]] = set()
    while run.poll() is None and Path("/proc").is_dir():
        for entry in Path("/proc").iterdir():
            fields = _stat(entry.name) if entry.name.isdigit() else None
            if fields and fields[1] == str(run.process.pid):  # its parent: the run
                seen.add((int(entry.name), fields[19]))
        time.sleep(0.1)
    return seen


def still_alive(processes: set[tuple[int, str]], within: float) -> set[tuple[int, str]]:
    """Those of `processes` alive (not zombies) after up to `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        alive = set()
        for pid, started in processes:
            fields = _stat(pid)
            if fields and fields[19] == started and fields[0] != "Z":
                alive.add((pid, started))
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def run_forked(*args: str, cwd: Path, env: dict | None = None, check: bool = True):
    """Run `<package> args...` to the end in a forked process; like run_cli."""
    result = fork_cli(*args, cwd=cwd, env=env)
    result.wait()
    completed = result.output()
    if check and completed.returncode != 0:
        raise AssertionError(failure(f"{PACKAGE} {' '.join(args)}", completed))
    return completed


def wait_for(path: Path, process, timeout: float = SUBPROCESS_TIMEOUT) -> None:
    """Wait until `path` exists; fail early, with the output, if `process` ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(
                f"the run ended (exit {process.returncode}) before {path.name} appeared\n"
                + (process.workdir / "stderr.txt").read_text()[-8000:]
            )
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.05)


def killed_together(*args: str, cwd: Path, env: dict, sent: int = signal.SIGKILL) -> None:
    """`python -m <package> args...` in a session of its own, stopped as a scheduler stops
    a job: SIGKILL, rank 0 kills the whole process group when step INSTRUMENTS_KILL_STEP
    starts; SIGTERM reaches the ranks at different points of a step (rank r receives it
    when step INSTRUMENTS_KILL_STEP - r starts)."""
    how = "INSTRUMENTS_KILL_GROUP" if sent == signal.SIGKILL else "INSTRUMENTS_KILL_STAGGER"
    stop = {how: "1", "INSTRUMENTS_KILL_SIGNAL": sent.name}
    killed = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=cli_env({**env, **stop}),
        capture_output=True,
        start_new_session=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    expected = -sent if sent == signal.SIGKILL else 128 + sent  # the kit exits on SIGTERM
    assert killed.returncode == expected, failure(" ".join(args), killed)
