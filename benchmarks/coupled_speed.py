"""Speed and memory of coupled PPO at the Lightning example's defaults, both launchers, one run.

    python benchmarks/coupled_speed.py [--repeats 3]

CartPole-v1, 2 ranks x 2 envs x 128 steps, minibatch 64 per rank, 10 epochs, lr 1e-3,
32,768 env steps. For each launcher it prints the env steps/s of the training loop, the wall
time of the whole launch command, and each rank's peak RSS. Targets on the 2-core reference
machine: >= 5,000 steps/s, <= 12 s, <= 400 MB per rank.
"""

from __future__ import annotations

import argparse
import re
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
SUMMARY = re.compile(r"\(([\d,]+) steps/s\); peak RSS per rank \(MB\): ([\d, ]+);")


def measure(command: list[str]) -> tuple[float, float, list[int]]:
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        done = subprocess.run(command + CONFIG, cwd=cwd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    match = SUMMARY.search(done.stdout)
    if match is None:
        sys.exit(f"no summary line in:\n{done.stdout}")
    steps_per_second = float(match.group(1).replace(",", ""))
    return steps_per_second, wall, [int(mb) for mb in match.group(2).split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="runs per launcher, interleaved")
    repeats = parser.parse_args().repeats
    print(f"{'launcher':<11} {'loop steps/s':>12} {'wall s':>7} {'peak RSS per rank MB':>21}")
    for _ in range(repeats):
        for name, command in LAUNCHES.items():
            steps_per_second, wall, rss = measure(command)
            print(f"{name:<11} {steps_per_second:>12,.0f} {wall:>7.2f} {', '.join(map(str, rss)):>21}", flush=True)


if __name__ == "__main__":
    main()
