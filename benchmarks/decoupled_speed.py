"""Decoupled lock-step and pipelined PPO against single-process coupled PPO, one run.

    python benchmarks/decoupled_speed.py [--repeats 3]

Same total envs and steps everywhere: CartPole-v1, 4 envs x 128 steps, minibatch 64, 10 epochs,
32,768 env steps. Coupled runs as one process (`python train_fabric.py`); decoupled runs as
`fabric run --devices=2` (one player, one trainer). Prints the training loop's env steps/s of
each, and the ratios. Targets: lock-step >= coupled; pipelined >= 1.5x lock-step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from launch import loop_steps_per_second

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = "--env-id CartPole-v1 --num-envs 4 --num-steps 128 --total-timesteps 32768 --no-progress-bar".split()
DECOUPLED = [str(BIN / "fabric"), "run", "--accelerator=cpu", "--devices=2", str(REPO / "train_fabric_decoupled.py")]
RUNS = {
    "coupled, 1 process": [sys.executable, str(REPO / "train_fabric.py")],
    "decoupled lock-step": DECOUPLED,
    "decoupled pipelined": [*DECOUPLED, "--pipeline"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the three runs, interleaved")
    repeats = parser.parse_args().repeats
    ratios: dict[str, list[float]] = {"lock-step / coupled": [], "pipelined / lock-step": []}
    for _ in range(repeats):
        speed = {name: loop_steps_per_second(command + CONFIG) for name, command in RUNS.items()}
        for name, steps_per_second in speed.items():
            print(f"{name:<21} {steps_per_second:>8,.0f} steps/s")
        lock_step, pipelined = speed["decoupled lock-step"], speed["decoupled pipelined"]
        ratios["lock-step / coupled"].append(lock_step / speed["coupled, 1 process"])
        ratios["pipelined / lock-step"].append(pipelined / lock_step)
        for name, values in ratios.items():
            print(f"{name:<22} {values[-1]:.2f}x", flush=True)
    if repeats > 1:  # the machine is shared: one round can be slowed by a neighbour
        for name, values in ratios.items():
            print(f"median {name:<15} {statistics.median(values):.2f}x over {repeats} rounds")


if __name__ == "__main__":
    main()
