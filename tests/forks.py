"""Start an entry script's ranks as forks of a server that has already imported torch, Lightning and the project.

A rank that `fabric run` or torchrun starts spends seconds of CPU importing torch and Lightning
before it trains, and the launcher as many again: most of a short test run. Tests that check what
a run computes, not how it is launched, start their ranks here instead. They are real processes
that meet over gloo, each with the environment its launcher gives its workers (`RANK`,
`WORLD_SIZE`, torchelastic's variables and, for `fabric run`, Lightning's `LT_*`), and the job's
store is hosted here as torchrun's agent hosts it. They are forked from multiprocessing's fork
server, a single-threaded process that paid the imports once.

What only a launcher does (its signals, restarts, exit codes and messages) is tested with the
launchers themselves (`conftest.launch`).
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_zero_only

# Imported once, by the fork server: what every rank of a test run imports.
PRELOAD = [
    "torch",
    "torch.distributed",
    "lightning.fabric",
    "gymnasium",
    "tensorboard",
    "rl.cli",
    "rl.runtime",
    "rl.modes.coupled",
    "rl.modes.decoupled",
    "rl.algos.ppo.algorithm",
    "rl.algos.sac.algorithm",
    "forks",
]
GRACE_SECONDS = 30  # how long the other ranks may take to end once one has failed, as a launcher waits


def _server() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def worker_env(launcher: str, rank: int, nproc: int, port: int, run_id: str) -> dict[str, str]:
    """The variables `fabric run --accelerator=cpu --devices=N` or `torchrun --standalone` give a worker."""
    if launcher == "python":
        return {}
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    if launcher == "fabric run":
        env |= {"LT_CLI_USED": "1", "LT_ACCELERATOR": "cpu", "LT_DEVICES": str(nproc), "LT_NUM_NODES": "1"}
    return env


def run_rank(script: str, args: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the forked rank: run `script` as `python script args` would, with its output appended to the job's files."""
    os.environ.clear()  # exactly the test's environment now, not the server's when it started
    os.environ.update(env)
    # Lightning reads the rank once, as it is imported: the server imported it with no RANK, hence rank 0.
    rank_zero_only.rank = int(env.get("RANK") or env.get("LOCAL_RANK") or 0)
    os.chdir(cwd)
    for fd, path in ((1, stdout), (2, stderr)):
        file = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
    sys.stdout.reconfigure(line_buffering=True)
    sys.argv = [script, *args]
    sys.path[:0] = [os.path.dirname(script), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:  # as the interpreter ends: an int is the code, a message goes to stderr with 1
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # reported as the interpreter would; the rank fails
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_forked(
    launcher: str, script: Path, args: list[str], cwd: Path, nproc: int, timeout: float, env: dict[str, str]
) -> tuple[int, str, str]:
    """Run `script` as `launcher` would with `nproc` ranks forked from the server: the launcher's exit code
    (a `python` run's own; 0 or 1 for `fabric run` and torchrun, as they report their workers), stdout, stderr."""
    assert launcher in ("python", "fabric run", "torchrun"), launcher
    nproc = 1 if launcher == "python" else nproc  # as `python script` runs, whatever was asked
    store = None if launcher == "python" else dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run_id = "none" if launcher == "fabric run" else uuid.uuid4().hex  # fabric run's static group has no job id
    with tempfile.TemporaryDirectory() as folder:
        stdout, stderr = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        Path(stdout).touch()
        Path(stderr).touch()
        ranks, server = [], _server()
        for rank in range(nproc):
            rank_env = env | worker_env(launcher, rank, nproc, store.port if store else 0, run_id)
            process = server.Process(target=run_rank, args=(str(script), args, str(cwd), rank_env, stdout, stderr))
            process.start()
            ranks.append(process)
        codes = wait_for(ranks, timeout)
        output = Path(stdout).read_text(), Path(stderr).read_text()
    code = codes[0] if launcher == "python" else int(any(codes))
    return code, *output


def wait_for(ranks: list[multiprocessing.Process], timeout: float) -> list[int]:
    """Every rank's exit code; once one fails, the others get `GRACE_SECONDS` to end before they are killed."""
    deadline, failed_at = time.monotonic() + timeout, None
    while any(rank.is_alive() for rank in ranks):
        now = time.monotonic()
        if failed_at is None and any(rank.exitcode not in (None, 0) for rank in ranks):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + GRACE_SECONDS):
            for rank in ranks:
                rank.kill()
            if now > deadline:
                raise subprocess.TimeoutExpired("forked ranks", timeout)
        time.sleep(0.02)
    return [rank.exitcode for rank in ranks]
