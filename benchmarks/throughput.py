"""Coupled PPO's training-loop throughput on a large CartPole config, and its weak scaling, in one run.

    python benchmarks/throughput.py [--rounds 3] [--steps 524288]

Per rank: 64 envs x 128 steps, minibatch 2048, 4 epochs, one torch thread. Each round launches,
back to back, `fabric run` with 1 and with 2 ranks, for `--vector-mode sync` (gymnasium's
SyncVectorEnv of 64 envs) and `native` (gymnasium's vectorized CartPole). The 1-rank runs take
half the steps, so every run does the same work per rank. Prints each run's loop env steps/s
and, per vector mode, the median throughput at 2 ranks (target >= 50,000 env steps/s) and the
weak-scaling efficiency: steps/s at 2 ranks / (2 x steps/s at 1 rank) (target >= 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from launch import free_port, loop_steps_per_second

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = "--env-id CartPole-v1 --num-envs 64 --num-steps 128 --per-rank-batch-size 2048 --update-epochs 4"
MODES = ("sync", "native")


def command(mode: str, ranks: int, steps: int) -> list[str]:
    launcher = [str(BIN / "fabric"), "run", "--accelerator=cpu", f"--devices={ranks}", f"--main-port={free_port()}"]
    flags = [
        *CONFIG.split(),
        "--vector-mode",
        mode,
        "--total-timesteps",
        str(steps // (3 - ranks)),
        "--torch-threads",
        "1",
        "--eval-episodes",
        "0",
        "--no-progress-bar",
    ]
    return [*launcher, str(REPO / "train_fabric.py"), *flags]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2**19, help="env steps of a 2-rank run")
    args = parser.parse_args()
    speeds: dict[tuple[str, int], list[float]] = {(mode, ranks): [] for mode in MODES for ranks in (1, 2)}
    for round_index in range(args.rounds):
        for mode, ranks in speeds:
            speed = loop_steps_per_second(command(mode, ranks, args.steps))
            speeds[mode, ranks].append(speed)
            print(f"round {round_index + 1}: {mode:<6} {ranks} rank(s): {speed:>8,.0f} env steps/s", flush=True)
    for mode in MODES:
        one, two = statistics.median(speeds[mode, 1]), statistics.median(speeds[mode, 2])
        efficiencies = [b / (2 * a) for a, b in zip(speeds[mode, 1], speeds[mode, 2], strict=True)]
        rounds = ", ".join(f"{value:.2f}" for value in efficiencies)
        print(
            f"{mode}: 2 ranks {two:,.0f} env steps/s (1 rank {one:,.0f}); weak-scaling efficiency "
            f"{statistics.median(efficiencies):.2f} (rounds {rounds})"
        )


if __name__ == "__main__":
    main()
