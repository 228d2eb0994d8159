"""Decoupled lock-step, pipelined and asynchronous training against single-process coupled training, one run.

    python benchmarks/decoupled_speed.py [--algorithm ppo|sac] [--repeats 3] [--against REV] [--flags "..."]

The same total envs and steps everywhere. PPO: CartPole-v1, 4 envs x 128 steps, minibatch 64,
10 epochs, 32,768 env steps. SAC: `sac --preset pendulum` with 16-unit networks (so that, as for
a GPU trainer, the messages are a visible share of an update), 3,000 env steps, learning from
step 256, one torch thread a process. Coupled runs as one process (`python train_fabric.py`);
decoupled as `fabric run --devices=2` (one player, one trainer). Prints the training loop's env
steps/s of each and its ratio to coupled; PPO's targets: lock-step >= coupled, pipelined >= 1.5x
lock-step. With `--against REV` every run is timed here and at git revision REV, alternated, and
the median ratio this tree / REV of each mode is printed. `--flags` adds flags to every run (for SAC,
`--flags "--train-freq 4 --gradient-steps 4"` sends one message each way per 4 env steps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from launch import REPO, alternated_ratios, checkout, loop_steps_per_second

BIN = Path(sys.executable).parent
CONFIGS = {
    "ppo": "--env-id CartPole-v1 --num-envs 4 --num-steps 128 --total-timesteps 32768 --no-progress-bar".split(),
    "sac": (
        "sac --preset pendulum --net-arch 16 16 --total-timesteps 3000 --learning-starts 256 --eval-episodes 0 "
        "--torch-threads 1 --no-progress-bar"
    ).split(),
}
COUPLED = "coupled, 1 process"
DECOUPLED_MODES = {"decoupled lock-step": [], "decoupled pipelined": ["--pipeline"], "decoupled async": ["--async"]}


def runs(tree: Path, config: list[str]) -> dict[str, list[str]]:
    """Each mode's command, with `tree`'s entry scripts (which import its `rl`)."""
    fabric = [str(BIN / "fabric"), "run", "--accelerator=cpu", "--devices=2"]
    decoupled = [*fabric, str(tree / "train_fabric_decoupled.py")]
    commands = {COUPLED: [sys.executable, str(tree / "train_fabric.py"), *config]}
    return commands | {name: [*decoupled, *config, *flags] for name, flags in DECOUPLED_MODES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=list(CONFIGS), default="ppo")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the runs, interleaved")
    parser.add_argument("--against", metavar="REV", help="time every run here and at git revision REV, alternated")
    parser.add_argument("--flags", default="", help="flags added to every run's command, in one string")
    args = parser.parse_args()
    config = CONFIGS[args.algorithm] + args.flags.split()
    if args.against:
        with checkout(args.against) as baseline:
            against(runs(REPO, config), runs(baseline, config), baseline, args.against, args.repeats)
    else:
        by_itself(runs(REPO, config), args.repeats)


def by_itself(commands: dict[str, list[str]], repeats: int) -> None:
    ratios: dict[str, list[float]] = {}
    for _ in range(repeats):
        speed = {name: loop_steps_per_second(command) for name, command in commands.items()}
        for name, steps_per_second in speed.items():
            ratio = steps_per_second / speed[COUPLED]
            ratios.setdefault(name, []).append(ratio)
            print(f"{name:<21} {steps_per_second:>8,.0f} steps/s  {ratio:.2f}x coupled", flush=True)
        print(f"pipelined / lock-step {speed['decoupled pipelined'] / speed['decoupled lock-step']:.2f}x", flush=True)
    if repeats > 1:  # the machine is shared: one round can be slowed by a neighbour
        for name, values in ratios.items():
            print(f"median {name:<21} {statistics.median(values):.2f}x coupled over {repeats} rounds")


def against(
    ours: dict[str, list[str]], theirs: dict[str, list[str]], baseline: Path, revision: str, rounds: int
) -> None:
    """Each mode's run here (`ours`) and in `baseline` (`theirs`), alternated: the median ratio of each."""
    commands = {REPO: ours, baseline: theirs}
    ratios = alternated_ratios(
        list(ours), lambda name, tree: loop_steps_per_second(commands[tree][name]), baseline, revision, rounds
    )
    for name, values in ratios.items():
        print(f"median this tree / {revision}, {name}: {statistics.median(values):.2f}x over {rounds} rounds")


if __name__ == "__main__":
    main()
