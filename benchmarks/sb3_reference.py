"""Stable-Baselines3 on a learning benchmark's rows, at the rows' full steps: a reference for a row that misses.

    python benchmarks/sb3_reference.py [--rows ppo/hopper ppo/walker2d] [--seeds 1] [--parallel 2]
                                       [--sb3-python .venv-sb3/bin/python] [--out benchmarks/results]

A row of `benchmarks/suite.py` misses when this project's greedy return falls short of the
published figure. SB3 trained on the same preset (`benchmarks/sb3.py`), env, seed and step count
tells whether the published configuration reaches that figure on these envs at all, or whether the
miss is this project's. Each run trains SB3 alone on one torch thread, saves itself every 5 minutes
under OUT/sb3/checkpoints/NAME (never committed), and goes on from there when the script is started
again (Ctrl-C, or `pkill -INT -f sb3_reference.py`, saves every run in flight first); a finished
run's figures go to OUT/sb3/reference.json and its save is deleted. The table
sets each SB3 run beside this project's run of the same row and seed (where
the suite has finished it: OUT/suite/rows/NAME.json) and the published figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launch import RESULTS
from resumable import row_file
from sb3 import SB3_PYTHON, interrupt_all, run_sb3
from suite import ROWS, run_name


def reference_run(python: str, row: str, seed: int, out: Path, results: dict, lock: threading.Lock) -> None:
    """Train (or go on training) SB3 on one row and seed; record its figures when it finishes."""
    name = run_name(row, seed)
    checkpoint_dir = out / "sb3" / "checkpoints" / name
    result = run_sb3(python, row, ROWS[row].steps, seed, checkpoint_dir)
    with lock:
        results.update(read_results(out))  # another launch of this script may have finished runs of its own
        results[name] = {"row": row, "seed": seed, **result}
        write_results(out, results)
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    print(f"{name}: greedy return {result['eval_return']:,.1f} after {result['steps']:,} steps", flush=True)


def results_file(out: Path) -> Path:
    return out / "sb3" / "reference.json"


def read_results(out: Path) -> dict:
    path = results_file(out)
    return json.loads(path.read_text()) if path.exists() else {}


def write_results(out: Path, results: dict) -> None:
    results_file(out).parent.mkdir(parents=True, exist_ok=True)
    results_file(out).write_text(json.dumps(results, indent=2))


def ours(out: Path, name: str) -> dict | None:
    """This project's finished run of the same row and seed, from the suite's row file."""
    path = row_file(out / "suite", name)
    return json.loads(path.read_text()) if path.exists() else None


def markdown(results: dict, out: Path) -> str:
    header = [
        "row",
        "seed",
        "steps",
        "SB3: greedy return",
        "SB3: sampled actions",
        "ours: greedy return",
        "published",
        "SB3: env steps/s",
    ]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for name, result in sorted(results.items()):
        row, mine = ROWS[result["row"]], ours(out, name)
        ours_return = "not yet run" if mine is None else f"{mine['eval_return']:,.1f}"
        lines.append(
            f"| {row.algorithm.upper()} {row.env_id} | {result['seed']} | {result['steps']:,} | "
            f"{figure_cell(result, 'eval')} | {figure_cell(result, 'sampled')} | {ours_return} | "
            f"{row.published[0]} | {result['steps'] / result['loop_s']:,.0f} |"
        )
    return "\n".join(lines)


def figure_cell(result: dict, figure: str) -> str:
    """`eval` (greedy) or `sampled`: runs recorded before SB3 was also evaluated with sampled actions lack it."""
    if f"{figure}_return" not in result:
        return "not measured"
    return f"{result[f'{figure}_return']:,.1f} ± {result[f'{figure}_std']:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mujoco_rows = [name for name, row in ROWS.items() if row.env_id.endswith("-v5")]
    parser.add_argument("--rows", nargs="+", default=["ppo/hopper"], choices=mujoco_rows)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--parallel", type=int, default=1, help="runs side by side, one torch thread each")
    parser.add_argument("--sb3-python", default=str(SB3_PYTHON))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # `pkill -INT` stops a suite started in the background
    results, lock = read_results(args.out), threading.Lock()
    pending = [(row, seed) for seed in args.seeds for row in args.rows if run_name(row, seed) not in results]
    print(f"{len(pending)} SB3 runs to train, {len(results)} already done", flush=True)
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [
            pool.submit(reference_run, args.sb3_python, row, seed, args.out, results, lock) for row, seed in pending
        ]
        try:
            for future in futures:
                future.result()
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()  # those not started yet
            interrupt_all()
            print("interrupted: each SB3 run in flight saves itself and goes on from there at the next launch")
    print(markdown(results, args.out))


if __name__ == "__main__":
    main()
