"""Running an entry point in a scratch folder and reading the training loop's speed from its summary."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

SUMMARY = re.compile(r"training loop: (\d+) steps in ([\d.]+) s")
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"  # every study's rows, curves, figures and kept agents
BIN = Path(sys.executable).parent

# The benchmarks run on a machine they have to themselves, where torch's OpenMP threads are fastest spinning while
# they wait (benchmarks/omp_wait.py), as they do in the peers' programs; every run they start inherits this. The
# project's entry points otherwise make them sleep, which keeps a shared machine from slowing many-fold.
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")


def free_port() -> int:
    """A port no other job holds, so a benchmark can run beside other jobs on this machine."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fabric_run(
    flags: list[str], devices: int = 2, script: str = "train_fabric.py", accelerator: str = "cpu"
) -> list[str]:
    """`fabric run` of an entry point on `devices` processes (CPU ones unless told), on a port of its own."""
    launcher = [
        str(BIN / "fabric"),
        "run",
        f"--accelerator={accelerator}",
        f"--devices={devices}",
        f"--main-port={free_port()}",
    ]
    return [*launcher, str(REPO / script), *flags]


def run_in_folder(command: list[str], folder: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run `command` in `folder`, keeping its stdout.txt and stderr.txt there; it and its wall time."""
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
    wall_time = time.perf_counter() - started
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)
    return done, wall_time


def run_in_scratch_folder(command: list[str]) -> str:
    """The command's stdout; a failed command ends the benchmark with its error output."""
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def loop_steps_per_second(command: list[str]) -> float:
    """Env steps per second of the training loop, from the summary line rank 0 (or the player) prints."""
    stdout = run_in_scratch_folder(command)
    match = SUMMARY.search(stdout)
    if match is None:
        sys.exit(f"no training-loop summary from {' '.join(command)}:\n{stdout[-2000:]}")
    return int(match.group(1)) / float(match.group(2))


@contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """A temporary worktree of this repository at `revision`, removed afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def alternated_ratios(
    runs: list[str], speed_in: Callable[[str, Path], float], baseline: Path, revision: str, rounds: int
) -> dict[str, list[float]]:
    """Each run's speed (`speed_in(run, tree)`) in this tree and in `baseline` (a checkout of `revision`), round
    after round, the tree that goes first alternating: the ratios this tree / `revision` by run, each printed as
    it is measured."""
    ratios: dict[str, list[float]] = {}
    for round_ in range(1, rounds + 1):
        for run in runs:
            trees = [baseline, REPO] if round_ % 2 else [REPO, baseline]
            speeds = {tree: speed_in(run, tree) for tree in trees}
            before, after = speeds[baseline], speeds[REPO]
            ratios.setdefault(run, []).append(after / before)
            print(
                f"round {round_}, {run}: {revision} {before:,.0f}, this tree {after:,.0f} env steps/s "
                f"({after / before:.3f}x)",
                flush=True,
            )
    return ratios
