"""Dict observations with an image and a vector: what a CNN per image key beside an MLP learns from both
keys, against either key alone.

    python benchmarks/dict_observations.py [--seeds 1] [--total-timesteps 100000] [--out DIR]

Trains PPO (one process, one torch thread, the default flags) on rl/TwoCues-v0, where the rewarded
action is the sum of the image's cue and the vector's cue, modulo 4: with both keys (a Dict of an
image and a vector), with the image alone (a Dict of one image) and with the vector alone (a Dict
of one vector, flattened). An episode is 16 steps: the best return is 16, a guess's expected
return 4. It prints the greedy return over 20 episodes and the last 100 training episodes' mean.
Runs are named and resumable (`benchmarks/resumable.py`).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

from launch import REPO, RESULTS
from resumable import Run, resumable_flags, run_all

KEYS = {"image and vector": ["image", "vector"], "image alone": ["image"], "vector alone": ["vector"]}


def run_name(config: str, seed: int) -> str:
    return f"two-cues-{config.replace(' ', '-')}-seed{seed}"


def command(config: str, seed: int, total_timesteps: int, out: Path) -> list[str]:
    env_kwargs = json.dumps({"keys": KEYS[config]})
    flags = ["--env-id", "rl/TwoCues-v0", "--env-kwargs", env_kwargs, "--total-timesteps", str(total_timesteps)]
    flags += ["--eval-episodes", "20", "--seed", str(seed), *resumable_flags(run_name(config, seed), out)]
    return [sys.executable, str(REPO / "train_fabric.py"), *flags]


def plan(seeds: list[int], total_timesteps: int, out: Path) -> list[Run]:
    return [
        Run(
            run_name(config, seed),
            functools.partial(command, config, seed, total_timesteps, out),
            {"config": config, "seed": seed},
        )
        for seed in seeds
        for config in KEYS
    ]


def markdown(rows: list[dict]) -> str:
    lines = [
        "| observation | greedy return (20 episodes) | last 100 training episodes | env steps | wall time |",
        "| --- | --- | --- | --- | --- |",
    ]
    for config in KEYS:
        members = [row for row in rows if row["config"] == config]
        greedy = [row["eval_return"] for row in members]
        training = [row["training_return_last100"] for row in members if row["training_return_last100"] is not None]
        lines.append(
            f"| {config} | {statistics.mean(greedy):.1f} | "
            f"{statistics.mean(training):.1f} | {members[0]['steps']:,} | "
            f"{statistics.mean(row['wall_time_s'] for row in members):.0f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "dict_observations")
    args = parser.parse_args()
    rows = run_all(plan(args.seeds, args.total_timesteps, args.out), args.out)
    print(markdown(rows))


if __name__ == "__main__":
    main()
