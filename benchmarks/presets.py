"""What each tuned preset learns: greedy return over seeds, wall time and steps, beside published figures.

    python benchmarks/presets.py [--presets ppo/cartpole sac/pendulum ...] [--seeds 1 2 3] [--out DIR]

Each run is `fabric run --devices=2 train_fabric.py [sac] --preset NAME --seed S` with one torch
thread per rank, in its own folder under OUT/runs. A finished run's row is kept in OUT/rows, so
a study that stopped resumes where it was. Prints a Markdown table (mean ± std over seeds of the
final greedy evaluation over 10 episodes) and writes it with every row to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from launch import SUMMARY, fabric_run, run_in_folder
from resumable import EVALUATION

# Published greedy-or-deterministic returns the presets aim to match at the same or fewer steps.
PUBLISHED = {
    "ppo/cartpole": ("CartPole-v1", 500.0, 100_000),
    "ppo/acrobot": ("Acrobot-v1", -73.5, 1_000_000),
    "ppo/lunarlander": ("LunarLander-v3", 242.0, 1_000_000),
    "ppo/pendulum": ("Pendulum-v1", -172.0, 100_000),
    "sac/pendulum": ("Pendulum-v1", -157.0, 20_000),
}


def command(preset: str, seed: int) -> list[str]:
    algorithm, name = preset.split("/")
    return fabric_run([algorithm, "--preset", name, "--seed", str(seed), "--torch-threads", "1", "--no-progress-bar"])


def train(preset: str, seed: int, folder: Path) -> dict:
    """One run's row: greedy return, wall time of the whole job, env steps and the loop's speed."""
    done, wall_time = run_in_folder(command(preset, seed), folder)
    evaluation, summary = EVALUATION.search(done.stdout), SUMMARY.search(done.stdout)
    if done.returncode != 0 or evaluation is None or summary is None:
        sys.exit(f"{preset} seed {seed} failed (exit {done.returncode}); see {folder}")
    steps, loop_seconds = int(summary.group(1)), float(summary.group(2))
    return {
        "preset": preset,
        "seed": seed,
        "eval_return": float(evaluation.group(1)),
        "wall_time_s": round(wall_time, 1),
        "steps": steps,
        "env_steps_per_s": round(steps / loop_seconds),
    }


def run_all(presets: list[str], seeds: list[int], out: Path) -> list[dict]:
    """Every (preset, seed) not already finished, with a line of progress each; all rows."""
    rows_dir = out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    plan = [(preset, seed) for preset in presets for seed in seeds]
    pending = [(p, s) for p, s in plan if not (rows_dir / row_name(p, s)).exists()]
    print(f"{len(plan)} runs, {len(plan) - len(pending)} already done", flush=True)
    started = time.perf_counter()
    for count, (preset, seed) in enumerate(pending, start=1):
        print(f"[{count}/{len(pending)}] {preset} seed {seed} ...", end=" ", flush=True)
        row = train(preset, seed, out / "runs" / row_name(preset, seed).removesuffix(".json"))
        (rows_dir / row_name(preset, seed)).write_text(json.dumps(row))
        eta = (time.perf_counter() - started) / count * (len(pending) - count)
        print(f"return {row['eval_return']:.1f}, {row['wall_time_s']:.0f} s (ETA {eta / 60:.1f} min)", flush=True)
    return [json.loads((rows_dir / row_name(p, s)).read_text()) for p, s in plan]


def row_name(preset: str, seed: int) -> str:
    return f"{preset.replace('/', '-')}-seed{seed}.json"


def summarize(rows: list[dict], presets: list[str]) -> list[dict]:
    table = []
    for preset in presets:
        members = [row for row in rows if row["preset"] == preset]
        returns = [row["eval_return"] for row in members]
        env_id, published, published_steps = PUBLISHED[preset]
        table.append(
            {
                "preset": preset,
                "env_id": env_id,
                "seeds": len(members),
                "return_mean": round(statistics.mean(returns), 1),
                "return_std": round(statistics.pstdev(returns), 1),
                "steps": members[0]["steps"],
                "wall_time_s": round(statistics.mean(row["wall_time_s"] for row in members), 1),
                "published": published,
                "published_steps": published_steps,
                "matched": statistics.mean(returns) >= published and members[0]["steps"] <= published_steps,
            }
        )
    return table


def markdown(table: list[dict]) -> str:
    lines = [
        "| preset | env | greedy return (3 seeds) | steps | wall time per run | published | at steps | matched |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in table:
        lines.append(
            f"| `{entry['preset']}` | {entry['env_id']} | {entry['return_mean']:.1f} ± {entry['return_std']:.1f} "
            f"| {entry['steps']:,} | {entry['wall_time_s']:.0f} s | {entry['published']:g} "
            f"| {entry['published_steps']:,} | {'yes' if entry['matched'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PUBLISHED), choices=list(PUBLISHED))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("presets-study"))
    args = parser.parse_args()
    rows = run_all(args.presets, args.seeds, args.out)
    table = summarize(rows, args.presets)
    (args.out / "results.json").write_text(json.dumps({"table": table, "rows": rows}, indent=2))
    print(markdown(table))


if __name__ == "__main__":
    main()
