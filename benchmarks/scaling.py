"""The scaling study: how much faster N processes train, and whether learning stays the same.

    python benchmarks/scaling.py [--algorithm ppo|sac] [--env-id ID] [--modes coupled ...]
        [--world-sizes 1 2 4] [--total-timesteps N] [--seeds 1 2] [--out DIR] [--scale-lr]

DIR defaults to benchmarks/results/scaling/ALGORITHM.

Every configuration is a real launched job (`fabric run`, torchrun for the baseline, or
`python train_hogwild.py --workers N`), in its own folder under DIR/runs. Runs stay comparable
as in the DSAC study: the global batch is the same at every world size, because each process's
share (PPO: envs and minibatch; SAC: batch, and coupled replay buffers as always) is divided by
the number of processes that collect or learn; the learning rates stay as given (SAC's
`--scale-lr`, the DSAC rule, only with --scale-lr here). A world size above this machine's
cores is marked *oversubscribed*.

A finished run leaves DIR/rows/KEY.json and its curve, read from its TensorBoard logs, in
DIR/curves/KEY.csv; a study started again skips those, so a crash costs one run. It writes
DIR/results.csv (one line per run: mode, world size, seed, wall time, env steps/s, speedup
against world size 1, parallel efficiency, final greedy evaluation) and, with matplotlib (`pip
install -e ".[plots]"`), four figures in DIR/figures: return against steps per process, against
total steps and against wall time (mean and min-max band over seeds), and the speedup of each
world size beside the ideal line. Speedup is against the same mode at world size 1, or, for the decoupled modes
(which need a trainer beside their players), against coupled at world size 1.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from launch import RESULTS, SUMMARY, free_port, run_in_folder

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODES = {  # mode -> (entry script, extra flags)
    "coupled": ("train_fabric.py", []),
    "coupled-share": ("train_fabric.py", ["--share-data"]),
    "decoupled": ("train_fabric_decoupled.py", []),
    "decoupled-pipeline": ("train_fabric_decoupled.py", ["--pipeline"]),
    "decoupled-2players": ("train_fabric_decoupled.py", ["--num-players", "2"]),
    "decoupled-async": ("train_fabric_decoupled.py", ["--async", "--max-policy-lag", "2"]),
    "decoupled-2players-async": (
        "train_fabric_decoupled.py",
        ["--num-players", "2", "--async", "--max-policy-lag", "2"],
    ),
    "torchrun": ("train_torch.py", []),
    "hogwild-shared": ("train_hogwild.py", ["--sync", "shared"]),
    "hogwild-synced": ("train_hogwild.py", ["--sync", "synced"]),  # a merge after every update
}
DEFAULTS = {  # algorithm -> (env, total steps, base flags, global batch)
    "ppo": ("CartPole-v1", 98_304, ["--num-steps", "128", "--update-epochs", "4", "--learning-rate", "2.5e-3"], 384),
    "sac": ("Pendulum-v1", 10_000, ["sac", "--policy-lr", "1e-3", "--q-lr", "1e-3"], 256),
}
PPO_ENVS = 12  # envs over all collecting processes: divisible by 1, 2, 3 and 4
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Run:
    mode: str
    world_size: int
    seed: int

    @property
    def key(self) -> str:
        return f"{self.mode}-w{self.world_size}-s{self.seed}"

    @property
    def oversubscribed(self) -> bool:
        return self.world_size > CORES

    @property
    def decoupled(self) -> bool:
        return self.mode.startswith("decoupled")

    @property
    def players(self) -> int:
        """Decoupled processes that collect (the rest train)."""
        flags = MODES[self.mode][1]
        return int(flags[flags.index("--num-players") + 1]) if "--num-players" in flags else 1


def share_flags(algorithm: str, run: Run, global_batch: int) -> list[str]:
    """Each process's share, so the global batch is the same at every world size."""
    collectors = run.players if run.decoupled else run.world_size  # decoupled: the players collect
    learners = run.world_size - run.players if run.decoupled else run.world_size
    shared = run.mode.endswith("share")
    if algorithm == "ppo":
        return ["--num-envs", str(PPO_ENVS // collectors), "--per-rank-batch-size", str(global_batch // learners)]
    # SAC: a coupled rank or a decoupled trainer takes --batch-size rows per step (rounded down).
    return ["--batch-size", str(global_batch if shared and run.decoupled else global_batch // learners)]


def command(args: argparse.Namespace, run: Run) -> list[str]:
    script, mode_flags = MODES[run.mode]
    _, _, base_flags, global_batch = DEFAULTS[args.algorithm]
    if run.mode == "torchrun":
        launcher = [str(BIN / "torchrun"), f"--nproc_per_node={run.world_size}", "--standalone"]
    elif run.mode.startswith("hogwild"):
        launcher, mode_flags = [sys.executable], [*mode_flags, "--workers", str(run.world_size)]
    else:
        launcher = [
            str(BIN / "fabric"),
            "run",
            "--accelerator=cpu",
            f"--devices={run.world_size}",
            f"--main-port={free_port()}",
        ]
    flags = [
        *base_flags,
        *mode_flags,
        *share_flags(args.algorithm, run, global_batch),
        "--env-id",
        args.env_id,
        "--total-timesteps",
        str(args.total_timesteps),
        "--seed",
        str(run.seed),
        "--torch-threads",
        str(max(1, CORES // run.world_size)),
        "--no-progress-bar",
    ]
    if args.scale_lr and args.algorithm == "sac":
        flags.append("--scale-lr")
    return [*launcher, str(REPO / script), *flags]


def launch(args: argparse.Namespace, run: Run, folder: Path) -> dict:
    """Run one job; its row (the curve comes from its TensorBoard logs)."""
    done, wall_time = run_in_folder(command(args, run), folder)
    if done.returncode != 0:
        raise RuntimeError(f"{run.key} failed (exit {done.returncode}); see {folder / 'stderr.txt'}")
    summary = SUMMARY.search(done.stdout)
    steps, loop_seconds = int(summary.group(1)), float(summary.group(2))
    curve = read_curve(folder)
    return asdict(run) | {
        "oversubscribed": run.oversubscribed,
        "wall_time_s": round(wall_time, 2),
        "loop_time_s": loop_seconds,
        "env_steps_per_s": round(steps / loop_seconds, 1),
        "final_eval_return": curve.pop("final_eval_return"),
        "curve": curve,
    }


def read_curve(folder: Path) -> dict:
    """Episode return against global step and wall time, and the greedy evaluation, from TensorBoard
    (a Hogwild run has two event files: its worker 0's training scalars and its supervisor's evaluation)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    returns, evaluation = [], []
    for events in sorted(glob.glob(str(folder / "logs" / "*" / "*" / "events.*"))):
        accumulator = EventAccumulator(events, size_guidance={"scalars": 0})
        accumulator.Reload()
        tags = accumulator.Tags()["scalars"]
        returns += accumulator.Scalars("Rewards/rew_avg") if "Rewards/rew_avg" in tags else []
        evaluation += accumulator.Scalars("Test/return_mean") if "Test/return_mean" in tags else []
    start = returns[0].wall_time if returns else 0.0
    return {
        "steps": [event.step for event in returns],
        "seconds": [round(event.wall_time - start, 3) for event in returns],
        "returns": [event.value for event in returns],
        "final_eval_return": evaluation[-1].value if evaluation else None,
    }


def plan(args: argparse.Namespace) -> list[Run]:
    runs = []
    for seed in args.seeds:
        for world_size in args.world_sizes:
            for mode in args.modes:
                run = Run(mode, world_size, seed)
                if run.decoupled and world_size <= run.players:
                    continue  # its players and at least one trainer
                runs.append(run)
    return runs


def check_same_study(args: argparse.Namespace) -> None:
    """A folder's finished rows are reused only by a study with the same settings."""
    settings = {name: getattr(args, name) for name in ("algorithm", "env_id", "total_timesteps", "scale_lr")}
    stored = args.out / "study.json"
    if stored.exists() and json.loads(stored.read_text()) != settings:
        sys.exit(
            f"error: --out: {args.out} holds a study with other settings ({stored.read_text()}); choose another folder"
        )
    stored.write_text(json.dumps(settings))


def run_study(args: argparse.Namespace, runs: list[Run]) -> list[dict]:
    """Every run not already finished, with a line of progress each; the finished rows."""
    rows_dir = args.out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    check_same_study(args)
    rows, started = [], time.perf_counter()
    pending = [run for run in runs if not (rows_dir / f"{run.key}.json").exists()]
    print(f"{len(runs)} runs, {len(runs) - len(pending)} already done; {CORES} cores", flush=True)
    for done_count, run in enumerate(pending, start=1):
        flag = " (oversubscribed)" if run.oversubscribed else ""
        print(f"[{done_count}/{len(pending)}] {run.key}{flag} ...", end=" ", flush=True)
        row = launch(args, run, args.out / "runs" / run.key)
        write_curve(args.out / "curves" / f"{run.key}.csv", row.pop("curve"))
        (rows_dir / f"{run.key}.json").write_text(json.dumps(row))
        elapsed = time.perf_counter() - started
        eta = elapsed / done_count * (len(pending) - done_count)
        evaluation = "n/a" if row["final_eval_return"] is None else f"{row['final_eval_return']:.1f}"
        print(
            f"{row['env_steps_per_s']:,.0f} env steps/s, eval {evaluation}, "
            f"{row['wall_time_s']:.0f} s (study ETA {eta / 60:.1f} min)",
            flush=True,
        )
    for run in runs:
        row = json.loads((rows_dir / f"{run.key}.json").read_text())
        rows.append(row | {"curve": read_curve_file(args.out / "curves" / f"{run.key}.csv")})
    return rows


CURVE_COLUMNS = ("steps", "seconds", "returns")


def write_curve(path: Path, curve: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["env_steps", "seconds", "episode_return"])
        writer.writerows(zip(*(curve[column] for column in CURVE_COLUMNS), strict=True))


def read_curve_file(path: Path) -> dict:
    with path.open() as file:
        lines = list(csv.reader(file))[1:]
    steps, seconds, returns = zip(*lines, strict=True) if lines else ((), (), ())
    return {
        "steps": [int(s) for s in steps],
        "seconds": [float(s) for s in seconds],
        "returns": [float(r) for r in returns],
    }


def add_speedups(rows: list[dict]) -> None:
    """Speedup against world size 1 of the same mode (decoupled: of coupled), and efficiency = speedup / N."""
    baseline: dict[str, list[float]] = {}
    for row in rows:
        if row["world_size"] == 1:
            baseline.setdefault(row["mode"], []).append(row["env_steps_per_s"])
    reference = {mode: statistics.mean(speeds) for mode, speeds in baseline.items()}
    for row in rows:
        base = reference.get("coupled" if row["mode"].startswith("decoupled") else row["mode"])
        row["speedup"] = round(row["env_steps_per_s"] / base, 3) if base else None
        row["efficiency"] = round(row["speedup"] / row["world_size"], 3) if base else None


COLUMNS = [
    "mode",
    "world_size",
    "seed",
    "oversubscribed",
    "wall_time_s",
    "env_steps_per_s",
    "speedup",
    "efficiency",
    "final_eval_return",
]


def write_results(out: Path, rows: list[dict]) -> None:
    with open(out / "results.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def label(mode: str, world_size: int) -> str:
    return f"{mode} x{world_size}" + (" (oversubscribed)" if world_size > CORES else "")


def plot(out: Path, rows: list[dict], title: str) -> list[Path]:
    """The four figures; one colour per (mode, world size) in all of them."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print('no figures: matplotlib is not installed (pip install -e ".[plots]")')
        return []
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["mode"], row["world_size"]), []).append(row)
    colours = dict(zip(groups, plt.get_cmap("tab20").colors, strict=False))
    paths = []
    for name, x_of in (
        ("return_vs_steps_per_process", lambda r, s: np.asarray(s) / r["world_size"]),
        ("return_vs_total_steps", lambda r, s: np.asarray(s)),
        ("return_vs_wall_time", None),
    ):
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for group, members in groups.items():
            grid, curves = mean_curve(members, x_of)
            if grid is None:
                continue
            axes.plot(grid, curves.mean(0), color=colours[group], label=label(*group))
            axes.fill_between(grid, curves.min(0), curves.max(0), color=colours[group], alpha=0.2)
        axes.set_xlabel(
            {
                "return_vs_steps_per_process": "env steps per process",
                "return_vs_total_steps": "env steps, all processes",
                "return_vs_wall_time": "wall time (s)",
            }[name]
        )
        axes.set_ylabel("episode return")
        axes.set_title(title)
        axes.legend(fontsize=7)
        paths.append(save(figure, out / "figures" / f"{name}.png"))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    sizes = sorted({size for _, size in groups})
    modes = list(dict.fromkeys(mode for mode, _ in groups))
    width = 0.8 / len(modes)
    for index, mode in enumerate(modes):
        for size in sizes:
            members = groups.get((mode, size), [])
            speedups = [row["speedup"] for row in members if row["speedup"] is not None]
            if speedups:
                axes.bar(
                    sizes.index(size) + index * width,
                    statistics.mean(speedups),
                    width,
                    color=colours[(mode, size)],
                    label=label(mode, size),
                )
    axes.plot(np.arange(len(sizes)) + 0.4 - width / 2, sizes, "k--", label="ideal")
    axes.set_xticks(np.arange(len(sizes)) + 0.4 - width / 2, [str(size) for size in sizes])
    axes.set_xlabel("processes")
    axes.set_ylabel("speedup in env steps/s")
    axes.set_title(title)
    axes.legend(fontsize=7)
    paths.append(save(figure, out / "figures" / "speedup.png"))
    return paths


def mean_curve(members: list[dict], x_of) -> tuple:
    """The seeds' curves on a common grid (interpolated), as an array [seeds, points]."""
    import numpy as np

    curves = [member for member in members if member["curve"]["steps"]]
    if not curves:
        return None, None
    xs = [np.asarray(m["curve"]["seconds"]) if x_of is None else x_of(m, m["curve"]["steps"]) for m in curves]
    grid = np.linspace(max(x[0] for x in xs), min(x[-1] for x in xs), 50)
    return grid, np.stack([np.interp(grid, x, m["curve"]["returns"]) for x, m in zip(xs, curves, strict=True)])


def save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=sorted(DEFAULTS), default="ppo")
    parser.add_argument("--env-id", help="default: CartPole-v1 (PPO), Pendulum-v1 (SAC)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--total-timesteps", type=int, help="env steps per run, over all processes")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--scale-lr", action="store_true", help="SAC: multiply the learning rates by the learners")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/scaling/ALGORITHM")
    args = parser.parse_args()
    env_id, total_timesteps, _, _ = DEFAULTS[args.algorithm]
    args.env_id = args.env_id or env_id
    args.total_timesteps = args.total_timesteps or total_timesteps
    args.out = (args.out or RESULTS / "scaling" / args.algorithm).resolve()
    rows = run_study(args, plan(args))
    add_speedups(rows)
    write_results(args.out, rows)
    print(f"{'run':32s} {'steps/s':>9s} {'speedup':>8s} {'effic.':>7s} {'eval':>8s} {'wall s':>7s}")
    for row in rows:
        name = Run(row["mode"], row["world_size"], row["seed"]).key + (" (oversub.)" if row["oversubscribed"] else "")
        print(
            f"{name:32s} {row['env_steps_per_s']:9,.0f} {row['speedup'] or 0:8.2f} {row['efficiency'] or 0:7.2f} "
            f"{row['final_eval_return'] or float('nan'):8.1f} {row['wall_time_s']:7.0f}"
        )
    figures = plot(args.out, rows, f"{args.algorithm.upper()} on {args.env_id}, {args.total_timesteps:,} steps")
    print(
        f"wrote {args.out / 'results.csv'}, {args.out / 'rows'}, {args.out / 'curves'}"
        + "".join(f", {p}" for p in figures)
    )


if __name__ == "__main__":
    main()
