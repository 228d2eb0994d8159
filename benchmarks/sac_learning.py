"""What SAC learns within a budget: Pendulum-v1 on 1 and 2 ranks, and HalfCheetah-v5 on 2 ranks.

    python benchmarks/sac_learning.py pendulum [--seeds 1 2 3] [--ranks 1 2] [--flags="--update-while-stepping"]
    python benchmarks/sac_learning.py halfcheetah        # needs: pip install -e ".[mujoco]"

pendulum: 20,000 env steps in total (across ranks) with rl-zoo's settings (learning rate 1e-3,
batch 256 per rank, 100 random steps, one gradient step per env step), 1 rank and 2 coupled
ranks under `fabric run`, one thread per rank. Prints each run's greedy evaluation over 10
episodes and the mean over seeds; target: >= -200 for both (rl-zoo's SAC reaches -157 at 20k).

halfcheetah: 50,000 env steps in total on 2 coupled ranks, SB3's defaults (learning rate 3e-4)
with rl-zoo's 10,000 random steps. Prints the greedy evaluation and the loop's env steps/s.

--flags: more flags for every run, to see whether an option changes what SAC learns.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from launch import run_in_scratch_folder

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EVALUATION = re.compile(r"evaluation over \d+ greedy episodes?: return (-?[\d.]+) ± ([\d.]+)")
LOOP = re.compile(r"\(([\d,]+) steps/s\)")
TASKS = {
    "pendulum": "--env-id Pendulum-v1 --total-timesteps 20000 --policy-lr 1e-3 --q-lr 1e-3",
    "halfcheetah": "--env-id HalfCheetah-v5 --total-timesteps 50000 --learning-starts 10000",
}


def train(task: str, ranks: int, seed: int, flags: list[str]) -> tuple[float, float, float]:
    """(greedy return mean, its std, loop env steps/s) of one run."""
    launcher = (
        [sys.executable] if ranks == 1 else [str(BIN / "fabric"), "run", "--accelerator=cpu", f"--devices={ranks}"]
    )
    args = ["sac", *TASKS[task].split(), "--seed", str(seed), "--torch-threads", "1", "--no-progress-bar", *flags]
    stdout = run_in_scratch_folder([*launcher, str(REPO / "train_fabric.py"), *args])
    evaluation, loop = EVALUATION.search(stdout), LOOP.search(stdout)
    if evaluation is None or loop is None:
        sys.exit(f"{task} on {ranks} rank(s), seed {seed}: no evaluation or loop speed in\n{stdout[-2000:]}")
    return float(evaluation.group(1)), float(evaluation.group(2)), float(loop.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="pendulum's rank counts")
    parser.add_argument("--flags", default="", help="more flags for every run, as one string")
    args = parser.parse_args()
    flags = args.flags.split()
    if args.task == "halfcheetah":
        mean, std, speed = train("halfcheetah", 2, args.seeds[0], flags)
        print(
            f"HalfCheetah-v5, 2 ranks, 50,000 steps, seed {args.seeds[0]}: greedy return {mean:.1f} ± {std:.1f} "
            f"({speed:,.0f} env steps/s)"
        )
        return
    for ranks in args.ranks:
        means = []
        for seed in args.seeds:
            mean, std, speed = train("pendulum", ranks, seed, flags)
            means.append(mean)
            print(
                f"Pendulum-v1, {ranks} rank(s), seed {seed}: greedy return {mean:.1f} ± {std:.1f} "
                f"({speed:,.0f} env steps/s)",
                flush=True,
            )
        verdict = "meets" if statistics.mean(means) >= -200 else "misses"
        print(f"Pendulum-v1, {ranks} rank(s): mean over seeds {statistics.mean(means):.1f} ({verdict} >= -200)")


if __name__ == "__main__":
    main()
