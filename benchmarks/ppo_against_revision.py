"""PPO's loop speed in this tree against another git revision, alternated round by round in one run.

    python benchmarks/ppo_against_revision.py REV [--rounds 3]

Checks out REV into a temporary worktree and runs, for both trees: coupled PPO at the Lightning
example's defaults under `fabric run --devices=2` and `torchrun` (as `coupled_speed.py`), and
decoupled lock-step and pipelined PPO with 2 processes (as `decoupled_speed.py`). Prints each
run's training-loop env steps/s (the trees alternate which goes first) and, at the end, the median
ratio this tree / REV of each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coupled_speed import CONFIG as COUPLED
from decoupled_speed import CONFIGS as DECOUPLED_CONFIGS
from decoupled_speed import against
from launch import checkout

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DECOUPLED = DECOUPLED_CONFIGS["ppo"]


def runs(tree: Path) -> dict[str, list[str]]:
    fabric = [str(BIN / "fabric"), "run", "--accelerator=cpu", "--devices=2"]
    return {
        "coupled, fabric run": [*fabric, str(tree / "train_fabric.py"), *COUPLED],
        "coupled, torchrun": [
            str(BIN / "torchrun"),
            "--nproc_per_node=2",
            "--standalone",
            str(tree / "train_torch.py"),
            *COUPLED,
        ],
        "decoupled lock-step": [*fabric, str(tree / "train_fabric_decoupled.py"), *DECOUPLED],
        "decoupled pipelined": [*fabric, str(tree / "train_fabric_decoupled.py"), *DECOUPLED, "--pipeline"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revision")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with checkout(args.revision) as baseline:
        against(runs(REPO), runs(baseline), baseline, args.revision, args.rounds)


if __name__ == "__main__":
    main()
