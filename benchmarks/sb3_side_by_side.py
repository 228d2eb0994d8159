"""This project against Stable-Baselines3 on the same MuJoCo configurations, side by side in one run.

    python benchmarks/sb3_side_by_side.py [--rows ppo/halfcheetah sac/hopper] [--steps 200000] [--seed 1]
                                          [--sb3-python .venv-sb3/bin/python] [--out benchmarks/results/sb3]

For each row, ours (`python train_fabric.py [sac] --preset NAME`, one process) and SB3's `learn`
with the same hyperparameters (read off the preset, `benchmarks/sb3.py`) start together, one
torch thread each, so both meet the same machine load. Each reports its training loop's env
steps/s and wall time, then the greedy (deterministic) return over 10 episodes at the same step
count. SB3 lives in its own virtual environment (`benchmarks/sb3.py` gives the install line) and
is never a dependency of this project.

A row takes one uninterrupted launch of each side, whose loop times it compares: PPO's 200k
steps take minutes, SAC's take about two hours on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launch import REPO, RESULTS, SUMMARY
from resumable import EVALUATION
from sb3 import SB3_PYTHON, run_sb3
from suite import ROWS as SUITE_ROWS

DEFAULT_ROWS = ["ppo/halfcheetah", "sac/hopper"]
MUJOCO_ROWS = [name for name, row in SUITE_ROWS.items() if row.env_id.endswith("-v5")]


def ours(row: str, steps: int, seed: int, out: Path) -> dict:
    algorithm, preset = row.split("/")
    command = [
        sys.executable,
        str(REPO / "train_fabric.py"),
        *(["sac"] if algorithm == "sac" else []),
        "--preset",
        preset,
        "--total-timesteps",
        str(steps),
        "--seed",
        str(seed),
        "--torch-threads",
        "1",
        "--no-progress-bar",
        "--log-dir",
        str(out / "runs"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    summary, evaluation = SUMMARY.search(done.stdout), EVALUATION.search(done.stdout)
    if done.returncode != 0 or summary is None or evaluation is None:
        sys.exit(f"ours failed on {row}:\n{done.stderr[-2000:]}")
    steps, loop_seconds = int(summary.group(1)), float(summary.group(2))
    return {"steps": steps, "loop_s": loop_seconds, "eval_return": float(evaluation.group(1))}


def side_by_side(row: str, steps: int, seed: int, python: str, out: Path) -> dict:
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        mine = pool.submit(ours, row, steps, seed, out)
        theirs = pool.submit(run_sb3, python, row, steps, seed)
        result = {
            "row": row,
            "env": SUITE_ROWS[row].env_id,
            "seed": seed,
            "ours": mine.result(),
            "sb3": theirs.result(),
        }
    result["wall_time_s"] = round(time.perf_counter() - started, 1)
    return result


def markdown(results: list[dict]) -> str:
    header = [
        "row",
        "steps",
        "ours: env steps/s",
        "SB3: env steps/s",
        "ours / SB3",
        "ours: loop time",
        "SB3: loop time",
        "ours: greedy return",
        "SB3: greedy return",
    ]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for result in results:
        ours_, sb3 = result["ours"], result["sb3"]
        speed_ours, speed_sb3 = ours_["steps"] / ours_["loop_s"], sb3["steps"] / sb3["loop_s"]
        lines.append(
            f"| {result['row']} ({result['env']}) | {ours_['steps']:,} | {speed_ours:,.0f} | {speed_sb3:,.0f} | "
            f"{speed_ours / speed_sb3:.2f}x | {ours_['loop_s'] / 60:.0f} min | {sb3['loop_s'] / 60:.0f} min | "
            f"{ours_['eval_return']:,.1f} | {sb3['eval_return']:,.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, choices=MUJOCO_ROWS)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sb3-python", default=str(SB3_PYTHON))
    parser.add_argument("--out", type=Path, default=RESULTS / "sb3")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.json"
    # Rows measured by earlier launches are kept: each row is one uninterrupted launch, often in a session of its own.
    results = {r["row"]: r for r in json.loads(results_file.read_text())} if results_file.exists() else {}
    for row in args.rows:
        results[row] = side_by_side(row, args.steps, args.seed, args.sb3_python, args.out)
        results_file.write_text(json.dumps(list(results.values()), indent=2))
        print(markdown([results[row]]), flush=True)
    print(markdown(list(results.values())))


if __name__ == "__main__":
    main()
