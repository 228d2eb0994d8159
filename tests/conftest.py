"""Helpers that launch the real entry points, as a user would, and read what they wrote."""

from __future__ import annotations

import os

# Every process of the suite waits for work without spinning, as the entry points' processes do (rl/__init__.py):
# set before torch loads OpenMP, which this process may do before it imports the project.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import signal

# The Ctrl-C tests send their runs SIGINT, which a suite started in the background (`nohup pytest &`, a shell
# without job control) ignores, and so would every process it starts: they take the default again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import ast
import contextlib
import functools
import glob
import importlib.util
import io
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from forks import launch_forked

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPTS = {
    "fabric": REPO / "train_fabric.py",
    "torch": REPO / "train_torch.py",
    "decoupled": REPO / "train_fabric_decoupled.py",
    "hogwild": REPO / "train_hogwild.py",
}
# The loop's summary line with the time its envs took to step (every mode prints it), then other figures, each
# after a semicolon.
ENVS_STEPPED = re.compile(
    r"^training loop: \d+ steps in [\d.]+ s \([\d,]+ steps/s\); "
    r"stepping the envs: [\d.]+ s \(\d+%\)(; [^;]*[^;\s])*$",
    re.MULTILINE,
)
# envpool has no wheel for Python 3.10: its extra installs nothing there, and the tests that step its envs skip.
needs_envpool = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason="envpool is not installed (its extra starts at Python 3.11)"
)
LOG_SUBDIRS = {
    "fabric": "fabric_logs",
    "torch": "torch_logs",
    "decoupled": "fabric_decoupled_logs",
    "hogwild": "hogwild_logs",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def join_as_rank(rank: int, port: int, world_size: int = 2) -> None:
    """In a process that `torch.multiprocessing.spawn` started: the environment torchrun would give rank
    `rank` of a one-machine job, and one torch thread."""
    os.environ |= {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    torch.set_num_threads(1)


def launch_command(launcher: str, script: Path, args: list[str], nproc: int, accelerator: str = "cpu") -> list[str]:
    if launcher == "fabric run":
        return [
            str(BIN / "fabric"),
            "run",
            f"--accelerator={accelerator}",
            f"--devices={nproc}",
            f"--main-port={free_port()}",
            str(script),
            *args,
        ]
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), f"--nproc_per_node={nproc}", "--standalone", str(script), *args]
    if launcher == "python":
        return [sys.executable, str(script), *args]
    raise ValueError(launcher)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def launch(
    launcher: str,
    script: Path,
    args: list[str],
    cwd: Path,
    nproc: int = 2,
    timeout: float = 240,
    accelerator: str = "cpu",
) -> Finished:
    start_time = time.monotonic()
    done = subprocess.run(
        launch_command(launcher, script, args, nproc, accelerator),
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Finished(done.returncode, done.stdout, done.stderr, time.monotonic() - start_time)


def run_ranks(
    launcher: str, script: Path, args: list[str], cwd: Path, nproc: int = 2, timeout: float = 240
) -> Finished:
    """What `launch` runs, with the launcher's ranks forked from a server that has imported torch, Lightning
    and the project (tests/forks.py): for tests of what a run computes rather than of how it is launched."""
    start_time = time.monotonic()
    code, stdout, stderr = launch_forked(launcher, script, args, cwd, nproc, timeout, child_env())
    return Finished(code, stdout, stderr, time.monotonic() - start_time)


def launch_together(*jobs: tuple[str, Path, list[str], Path, int], via=launch) -> list[Finished]:
    """`via` (`launch` or `run_ranks`) independent jobs (launcher, script, args, cwd, nproc) at once: on two
    cores their start-ups overlap, and runs that must agree bit for bit do not depend on the load."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(lambda job: via(*job), jobs))


def child_env() -> dict[str, str]:
    """The test environment plus tests/ on the path, so `--env-id envs_for_tests:...` ids resolve."""
    path = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    # Weights & Biases (--logger wandb) stays offline: the tests reach no network
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def kill_process_group(job: subprocess.Popen) -> None:
    """A test's cleanup: SIGKILL whatever is left of `job`'s process group, children it left behind included."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)


def start_as_foreground_job(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`command` as a shell's foreground job: in a process group of its own (`os.killpg(pid, SIGINT)` is the
    terminal's Ctrl-C), with Ctrl-C's default action whatever this process does with it."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env or child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def start(
    launcher: str,
    script: Path,
    args: list[str],
    cwd: Path,
    nproc: int,
    env: dict[str, str] | None = None,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen:
    """Launch without waiting, in a session of its own (`env`: added to the children's environment)."""
    return subprocess.Popen(
        launch_command(launcher, script, args, nproc),
        cwd=cwd,
        env=child_env() | (env or {}),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def child_pids(parent: int) -> list[int]:
    """Processes whose parent is `parent` (the launcher's ranks: torchrun gives each its own session)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(entry.name))
    return children


def running(pid: int) -> bool:
    """Whether process `pid` still runs: an orphan that ended stays a zombie until reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def without_lock_watchers(pids: list[int]) -> list[int]:
    """`pids` but the runs' lock watchers (`rl/gil_watch.py`, one beside each process that steps envs), which end
    with their runs."""
    watchers = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"gil_watch.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                watchers.append(pid)
    return [pid for pid in pids if pid not in watchers]


def kill_outright(job: subprocess.Popen, children: list[int]) -> tuple[str, list[int]]:
    """SIGKILL `job` alone, as kill -9 or the out-of-memory killer would: its stderr to the end (which children it
    started hold open too), and those of `children` still running after it."""
    job.kill()
    try:
        _, stderr = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        holders = sorted({job.pid, *children, *process_group(job.pid)})
        raise AssertionError(f"60 s after the SIGKILL, the job's pipes are still open: {described(holders)}") from None
    return stderr, still_running(children)


def process_group(pgid: int) -> list[int]:
    """The processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(entry.name))
    return members


def described(pids: list[int]) -> str:
    """Each process's command, and the state of each of its threads with the kernel function it waits in: what a
    failure that leaves a process behind is diagnosed from."""
    lines = []
    for pid in pids:
        try:
            command = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().split())[:160]
            threads = []
            for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                threads.append(f"{task.name} {state} {(task / 'wchan').read_text() or '-'}")
            lines.append(f"{pid} ({command}): {', '.join(threads)}")
        except OSError:
            lines.append(f"{pid}: gone")
    return "\n".join(lines)


def still_running(pids: list[int], seconds: float = 10) -> list[int]:
    """Those of `pids` still running after up to `seconds`: a process closes its files (the pipes a test reads to
    their end) before it has ended."""
    deadline = time.monotonic() + seconds
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]


def wait_until_the_run_opens(cwd: Path, jobs: list[subprocess.Popen], seconds: float = 240) -> None:
    """Wait for a launched run's TensorBoard file under `cwd`. Every rank is past its start-up by then (the lead opens
    the run in a collective every rank joins), so a process lost from here on is one its peers report. Start-up
    alone can take a minute or more where CI runs three tests at once on two cores."""
    deadline = time.monotonic() + seconds
    while not list(cwd.glob("logs/*/*/events.*")):
        ended = [job.returncode for job in jobs if job.poll() is not None]
        assert not ended, f"the job ended (exit {ended}) before its run opened"
        assert time.monotonic() < deadline, f"the run did not open within {seconds:.0f} s"
        time.sleep(0.2)


def reached_step(cwd: Path) -> int:
    """The step a run in a fixed folder (`--run-name`), launched by `fabric run` or torchrun, has reached, as rank 0
    tells its journal after each iteration (-1 before it says)."""
    for file in cwd.glob("logs/*/*/elastic.step"):
        with contextlib.suppress(OSError, ValueError):
            return int(file.read_text().strip())
    return -1


def rank_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the launcher's child that runs as `rank`."""
    for pid in child_pids(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    return None


def run_dir(cwd: Path, mode: str) -> Path:
    (path,) = glob.glob(str(cwd / "logs" / LOG_SUBDIRS[mode] / "*"))
    return Path(path)


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def read_text_tags(directory: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return events.Tags()["tensors"]


def load_agent(directory: Path) -> dict:
    return torch.load(directory / "agent.ckpt", weights_only=True)


def all_scalars(directory: Path, tag: str) -> dict[int, float]:
    """A tag's values by step over every event file of a run folder (a resumed run adds one); a later file's value
    of a step replaces an earlier one's."""
    return {step: value for points in scalars_per_file(directory, tag) for step, value in points}


def scalars_per_file(directory: Path, tag: str) -> list[list[tuple[int, float]]]:
    """The (step, value) points of `tag` in each event file of a run folder, in the files' name order (one per
    launch, by the second it opened)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    for events_file in sorted(glob.glob(str(directory / "events.*"))):
        events = EventAccumulator(events_file)
        events.Reload()
        logged = tag in events.Tags()["scalars"]
        points.append([(event.step, event.value) for event in events.Scalars(tag)] if logged else [])
    return points


def wandb_record(directory: Path, role: str | None = None) -> bytes:
    """W&B's own offline logs (history and config) of the run in `directory`, or of its process with that role:
    those of every launch that continued it, one after the other."""
    run_id = (directory / ("wandb_id" if role is None else f"wandb_id-{role}")).read_text().strip()
    launches = sorted((directory / "wandb").glob(f"offline-run-*-{run_id}"))
    assert launches, f"no offline W&B run {run_id} in {directory}"
    return b"".join((launch / f"run-{run_id}.wandb").read_bytes() for launch in launches)


def in_wandb_run(record: bytes, **fields: str) -> bool:
    """Whether W&B's offline log holds a run record with these `RunRecord` fields, each as protobuf encodes it."""
    from wandb.proto import wandb_internal_pb2

    return all(
        wandb_internal_pb2.RunRecord(**{name: value}).SerializeToString() in record for name, value in fields.items()
    )


MODES = {"fabric": "coupled", "torch": "coupled", "decoupled": "decoupled", "hogwild": "hogwild"}


def refusal_line(script: str, args: list[str], cwd: Path) -> str:
    """Run what `script` checks before training, in this process, as one process would; the one error line
    it stops with (exit code 2, nothing written). One launched test per mode checks the same exit end to end."""
    from rl.cli import prepare
    from rl.errors import exit_on_usage_error

    stderr, previous = io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with redirect_stderr(stderr), pytest.raises(SystemExit) as stopped, exit_on_usage_error():
            prepare(args, LOG_SUBDIRS[script], mode=MODES[script])
    finally:
        os.chdir(previous)
    assert stopped.value.code == 2
    (line,) = [line for line in stderr.getvalue().splitlines() if line.startswith("error: ")]
    assert not (cwd / "logs").exists()
    return line


# A test is `launched` when it, a fixture it requests, or a function of its module that either calls
# starts processes: the conftest's launchers, subprocess, multiprocessing, or a benchmark's `run_all`.
# The fast tier, `pytest -m "not slow and not launched"`, runs the rest.
LAUNCHERS = {"launch", "launch_together", "run_ranks", "start"}
PROCESS_CALLS = {"run", "Popen", "spawn", "Process", "get_context", "run_all"}  # as attributes: subprocess.run, ...
PROCESS_MODULES = {"subprocess", "mp", "multiprocessing", "resumable"}


def _calls(function: ast.AST) -> tuple[set[str], bool]:
    """The bare names a function calls, and whether it calls a process-starting function of a module."""
    names, starts_processes = set(), False
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name):
            names.add(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            starts_processes |= node.func.value.id in PROCESS_MODULES and node.func.attr in PROCESS_CALLS
    return names, starts_processes


@functools.cache
def launching_functions(path: str) -> frozenset[str]:
    """The module-level functions of a test module that start processes, directly or through each other."""
    tree = ast.parse(Path(path).read_text())
    functions = {node.name: _calls(node) for node in tree.body if isinstance(node, ast.FunctionDef)}
    launching = {name for name, (_, direct) in functions.items() if direct}
    grown = True
    while grown:
        before = len(launching)
        launching |= {name for name, (called, _) in functions.items() if called & (LAUNCHERS | launching)}
        grown = len(launching) > before
    return frozenset(launching)


def uses_a_module_fixture(item: pytest.Item) -> bool:
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs.values() if fixtures else []
    return any(definition.scope == "module" for chain in definitions for definition in chain)


# Before pytest-xdist reads the groups (it appends each to the test's id in its own hook).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        launching = launching_functions(str(item.path))
        requested = {item.originalname, *item.fixturenames} if isinstance(item, pytest.Function) else set()
        if requested & launching:
            item.add_marker(pytest.mark.launched)
        # The tests that share a module's fixture run on one worker, which computes it once
        # (`--dist loadgroup`); every other test is handed out on its own.
        if uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    # pytest-xdist hands out work in this order (`--no-loadscope-reorder`): the longest first, so that the
    # suite's tail is short tests spread over every worker.
    items.sort(key=expected_length)


def expected_length(item: pytest.Item) -> int:
    """0 for the slow tests, 1 for the groups that share a module's runs, 2 for the other tests that
    start processes and 3 for the rest: the order to start them in."""
    if item.get_closest_marker("slow"):
        return 0
    if item.get_closest_marker("xdist_group"):
        return 1
    return 2 if item.get_closest_marker("launched") else 3
