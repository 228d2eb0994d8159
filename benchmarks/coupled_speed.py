"""Speed and memory of coupled PPO at the Lightning example's defaults, both launchers, one run.

    python benchmarks/coupled_speed.py [--repeats 3]

CartPole-v1, 2 ranks x 2 envs x 128 steps, minibatch 64 per rank, 10 epochs, lr 1e-3,
32,768 env steps. For each launcher it prints the env steps/s of the training loop, the wall
time of the whole launch command, the share of it outside the training loop (start-up and
teardown), and each rank's peak RSS. Each round runs both launchers back to back, and the
medians end with Fabric's overhead: fabric run's whole process / torchrun's.

`--imports` adds what a fresh interpreter takes to import what each process needs (the
launcher, a Fabric rank, a torchrun rank), which is where start-up goes.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = (
    "--env-id CartPole-v1 --num-envs 2 --num-steps 128 --per-rank-batch-size 64 --update-epochs 10 "
    "--learning-rate 1e-3 --total-timesteps 32768 --no-progress-bar"
).split()
LAUNCHES = {
    "fabric run": [str(BIN / "fabric"), "run", "--accelerator=cpu", "--devices=2", str(REPO / "train_fabric.py")],
    "torchrun": [str(BIN / "torchrun"), "--nproc_per_node=2", "--standalone", str(REPO / "train_torch.py")],
}
SUMMARY = re.compile(r"in ([\d.]+) s \(([\d,]+) steps/s\); peak RSS per rank \(MB\): ([\d, ]+);")
IMPORTS = {
    "import torch (a torchrun rank)": "import torch",
    "import lightning.fabric (a Fabric rank)": "import torch, lightning.fabric",
    "fabric run's launcher (lightning.fabric.cli)": "import lightning.fabric.cli",
    "torchrun's launcher (torch.distributed.run)": "import torch.distributed.run",
    "this project's entry script (rl.cli)": "import rl.cli, rl.modes.coupled, rl.runtime",
}


def measure(command: list[str]) -> tuple[float, float, float, list[int]]:
    """Loop env steps/s, loop seconds, whole-process seconds and each rank's peak RSS of one launch."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        done = subprocess.run(command + CONFIG, cwd=cwd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    match = SUMMARY.search(done.stdout)
    if match is None:
        sys.exit(f"no summary line in:\n{done.stdout}")
    loop_seconds, steps_per_second = float(match.group(1)), float(match.group(2).replace(",", ""))
    return steps_per_second, loop_seconds, wall, [int(mb) for mb in match.group(3).split(",")]


def import_seconds(statement: str, repeats: int = 3) -> float:
    """Median wall time of a fresh interpreter that runs `statement` (the interpreter alone subtracted)."""

    def run(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
        return time.perf_counter() - start

    bare = statistics.median(run("pass") for _ in range(repeats))
    return statistics.median(run(statement) for _ in range(repeats)) - bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="runs per launcher, interleaved")
    parser.add_argument("--imports", action="store_true", help="also time each process's imports")
    args = parser.parse_args()
    print(
        f"{'launcher':<11} {'loop steps/s':>12} {'loop s':>7} {'whole s':>8} {'outside loop':>13} "
        f"{'peak RSS per rank MB':>21}"
    )
    wall_times: dict[str, list[float]] = {name: [] for name in LAUNCHES}
    outside: dict[str, list[float]] = {name: [] for name in LAUNCHES}
    for _ in range(args.repeats):
        for name, command in LAUNCHES.items():
            steps_per_second, loop, wall, rss = measure(command)
            wall_times[name].append(wall)
            outside[name].append((wall - loop) / wall)
            print(
                f"{name:<11} {steps_per_second:>12,.0f} {loop:>7.2f} {wall:>8.2f} {outside[name][-1]:>12.0%} "
                f"{', '.join(map(str, rss)):>21}",
                flush=True,
            )
    fabric, torchrun = (statistics.median(wall_times[name]) for name in LAUNCHES)
    print(
        f"medians: fabric run {fabric:.2f} s ({statistics.median(outside['fabric run']):.0%} outside the loop), "
        f"torchrun {torchrun:.2f} s ({statistics.median(outside['torchrun']):.0%}); "
        f"Fabric's overhead {fabric / torchrun:.2f}x"
    )
    if args.imports:
        for label, statement in IMPORTS.items():
            print(f"{label:<46} {import_seconds(statement):5.2f} s", flush=True)


if __name__ == "__main__":
    main()
