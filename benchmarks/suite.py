"""The learning benchmark: MuJoCo PPO and SAC and Atari PPO (Pong, Breakout) against published scores, resumable.

    python benchmarks/suite.py [--rows ppo/halfcheetah sac/hopper ...] [--seeds 1 2 3] [--parallel 2]
                               [--out benchmarks/results/suite] [--report-only] [--dry-run]

Each row is a preset trained for the published figure's env steps with the published
configuration: a MuJoCo run is one process (rl-zoo's and CleanRL's presets are for one env),
an Atari run is CleanRL's rollout split over 2 processes. `--parallel` runs go side by side, with one
torch thread per process. Every run has a fixed `--run-name` under OUT/runs and checkpoints
every 5 minutes, so a suite that is stopped picks each run up from its newest checkpoint when
started again; finished runs are never launched again (`benchmarks/resumable.py`).

Each finished run leaves its row, its curve (OUT/curves) and, for a row's first seed (every seed where
a figure is played from it), its trained agent (OUT/agents, listed with its score on docs/agents.md by
`benchmarks/agents.py`). After the runs it writes, from every finished run:
- OUT/results.csv: one line per run (algorithm, env, config, topology, seed, steps, greedy return over
  10 episodes, the return over 10 episodes with sampled actions where a published figure is measured so,
  mean return of the last 100 training episodes, wall time, env steps/s);
- OUT/figures/ROW.png: the training return against env steps and against training wall
  time, mean and min-max over seeds, with the published figure as a line;
- the Markdown table (docs/benchmarks/learning.md's), and rliable's IQM of the scores normalized by the published
  means, with stratified-bootstrap 95% confidence intervals, per group of rows
  (`pip install -e ".[bench]"`).

Every run has two figures: its greedy return over 10 episodes (rl-zoo's metric), and the mean return
of its last 100 training episodes (CleanRL's; on Atari an episode is a whole game). rl-zoo samples
the actions of its Atari agents, so an Atari run also plays 10 episodes with sampled actions from its
saved agent. A row matches when the mean over seeds of the figure that its first published source
reports is at least that source's mean minus one published std, at the same or fewer env steps.
Pong's row has a target of
its own instead: its run ends at the first greedy return of 18 or more (evaluated every 250k
steps), and it matches when the closing evaluation holds 18 within the published 10M steps.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import importlib.util
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch import RESULTS, fabric_run
from resumable import (
    Run,
    agent_file,
    curve,
    curve_file,
    resumable_flags,
    row_file,
    run_all,
    segments,
    training_return_of_last,
)

from rl.agent import load_agent
from rl.config import flag
from rl.evaluation import evaluate_greedy

REPO = Path(__file__).resolve().parents[1]
HYPERPARAMETERS_PAGE = REPO / "docs" / "benchmarks" / "hyperparameters.md"


GREEDY = "eval_return"  # rl-zoo's figures: the mean return of greedy evaluation episodes
TRAINING = "training_return_last100"  # CleanRL's: the mean return of the last 100 training episodes of a seed
# rl-zoo's Atari figures: evaluation episodes with sampled actions (its benchmark is greedy but for Atari games)
SAMPLED = "eval_return_sampled"
METRIC_NAMES = {GREEDY: "greedy", TRAINING: "last 100 training episodes", SAMPLED: "sampled actions"}
SAMPLED_EPISODES = 10  # played as `python -m rl.evaluate AGENT --stochastic --episodes 10 --seed 0` plays them


@dataclass(frozen=True)
class Published:
    source: str
    mean: float
    std: float
    metric: str = GREEDY  # a run's figure that compares with this one

    def __str__(self) -> str:
        figure = f"{self.source}: {self.mean:,.2f} ± {self.std:,.2f}".replace(".00 ", " ").replace(".00", "")
        return f"{figure} ({METRIC_NAMES[self.metric]})"


@dataclass(frozen=True)
class Row:
    algorithm: str
    preset: str
    env_id: str
    steps: int
    published: tuple[Published, ...]  # the first is the one a row is judged by
    group: str  # rows aggregated together ("": left out of the aggregate)
    seeds: tuple[int, ...] = (1, 2, 3)
    flags: tuple[str, ...] = field(default_factory=tuple)
    devices: int = 1  # coupled processes of one torch thread each
    target: float | None = None  # a greedy return that ends the run early and judges the row instead
    variant: str = ""  # what the row changes in its preset, as the table names its config

    @property
    def config(self) -> str:
        return f"{self.preset} {self.variant}".strip()

    @property
    def rule(self) -> str:
        """What judges the row, in words."""
        if self.target is not None:
            return f"its own target: a greedy {self.target:g} within {self.steps:,} steps"
        judge = self.published[0]
        return f"{judge.source}'s mean − std, {METRIC_NAMES[judge.metric]}"

    def metric_used(self, metric: str) -> bool:
        return any(source.metric == metric for source in self.published)

    @property
    def topology(self) -> str:
        return f"coupled, {self.devices} process{'es' if self.devices > 1 else ''} of 1 thread"

    def command(self, seed: int, name: str, out: Path) -> list[str]:
        algorithm = ["sac"] if self.algorithm == "sac" else []
        target = [] if self.target is None else ["--eval-every", "250000", "--stop-at-return", str(self.target)]
        flags = [*algorithm, "--preset", self.preset, *self.flags, *target, "--seed", str(seed)]
        flags += resumable_flags(name, out)
        if self.devices > 1:  # a fresh port at each launch
            return fabric_run(flags, self.devices)
        return [sys.executable, str(REPO / "train_fabric.py"), *flags]


def _rl_zoo(mean: float, std: float) -> Published:
    return Published("rl-zoo v3", mean, std)


SAVE_BUFFER = ("--save-buffer",)
ROWS: dict[str, Row] = {
    "ppo/halfcheetah": Row("ppo", "halfcheetah", "HalfCheetah-v5", 1_000_000, (_rl_zoo(5819, 664),), "PPO MuJoCo"),
    "ppo/hopper": Row("ppo", "hopper", "Hopper-v5", 1_000_000, (_rl_zoo(2410, 10),), "PPO MuJoCo"),
    "ppo/walker2d": Row("ppo", "walker2d", "Walker2d-v5", 1_000_000, (_rl_zoo(3479, 822),), "PPO MuJoCo"),
    "ppo/ant": Row("ppo", "ant", "Ant-v5", 1_000_000, (_rl_zoo(1327, 452),), "PPO MuJoCo"),
    "ppo/swimmer": Row("ppo", "swimmer", "Swimmer-v5", 1_000_000, (_rl_zoo(282, 10),), "PPO MuJoCo"),
    # SAC checkpoints its replay buffer: a run resumed without it would refill --learning-starts transitions
    # before training again, off the published replay ratio, and train on a buffer that forgot its past.
    "sac/halfcheetah": Row(
        "sac",
        "halfcheetah",
        "HalfCheetah-v5",
        1_000_000,
        (_rl_zoo(9535, 100), Published("CleanRL v2", 9635, 1424, TRAINING)),
        "SAC MuJoCo",
        (1, 2, 3),
        SAVE_BUFFER,
    ),
    "sac/hopper": Row(
        "sac",
        "hopper",
        "Hopper-v5",
        1_000_000,
        (_rl_zoo(2326, 1130), Published("CleanRL v2", 2310, 343, TRAINING)),
        "SAC MuJoCo",
        (1, 2, 3),
        SAVE_BUFFER,
    ),
    "sac/walker2d": Row(
        "sac",
        "walker2d",
        "Walker2d-v5",
        1_000_000,
        (_rl_zoo(3863, 254), Published("CleanRL v2", 3591, 911, TRAINING)),
        "SAC MuJoCo",
        (1, 2, 3),
        SAVE_BUFFER,
    ),
    # The published Pong figures are PongNoFrameskip-v4's (no sticky actions), at 10M steps. The run stops at the
    # first greedy return of 18 or more (evaluated every 250k steps), which judges the row. CleanRL's rollout (8
    # envs x 128 steps, minibatches of 256) is split over 2 ranks: 4 envs and minibatches of 128 per rank.
    "ppo/pong": Row(
        "ppo",
        "atari-ppo",
        "PongNoFrameskip-v4",
        10_000_000,
        (Published("rl-zoo", 20.99, 0.11, SAMPLED), Published("CleanRL", 20.36, 0.20, TRAINING)),
        "PPO Atari",
        (1,),
        (
            "--env-id",
            "PongNoFrameskip-v4",
            "--total-timesteps",
            "10000000",
            "--num-envs",
            "4",
            "--per-rank-batch-size",
            "128",
        ),
        devices=2,
        target=18.0,
    ),
    # A second round: rl-zoo's retuned Swimmer entry, CleanRL's continuous PPO on Hopper beside rl-zoo's, and
    # Breakout for the whole 10M steps, split over 2 ranks as Pong is.
    "ppo/swimmer-tuned": Row("ppo", "swimmer-tuned", "Swimmer-v5", 1_000_000, (_rl_zoo(282, 10),), "PPO MuJoCo"),
    "ppo/hopper-cleanrl": Row(
        "ppo",
        "cleanrl-mujoco",
        "Hopper-v5",
        1_000_000,
        (Published("CleanRL", 2382.86, 271.74, TRAINING),),
        "PPO MuJoCo",
    ),
    "ppo/breakout": Row(
        "ppo",
        "atari-ppo",
        "BreakoutNoFrameskip-v4",
        10_000_000,
        (Published("CleanRL", 414.66, 28.09, TRAINING), Published("rl-zoo", 398.0, 33.3, SAMPLED)),
        "PPO Atari",
        (1,),
        ("--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "4", "--per-rank-batch-size", "128"),
        devices=2,
    ),
    # gSDE on rl-zoo's configurations that use it, each beside the same configuration without it (not aggregated).
    "ppo/pendulum-gsde": Row("ppo", "pendulum-gsde", "Pendulum-v1", 100_000, (_rl_zoo(-172.2, 104.2),), ""),
    "ppo/pendulum-no-gsde": Row(
        "ppo",
        "pendulum-gsde",
        "Pendulum-v1",
        100_000,
        (_rl_zoo(-172.2, 104.2),),
        "",
        flags=("--no-use-sde",),
        variant="--no-use-sde",
    ),
    "sac/bipedalwalker-gsde": Row(
        "sac", "bipedalwalker", "BipedalWalker-v3", 500_000, (_rl_zoo(297.7, 33.1),), "", (1,), SAVE_BUFFER
    ),
    "sac/bipedalwalker-no-gsde": Row(
        "sac",
        "bipedalwalker",
        "BipedalWalker-v3",
        500_000,
        (_rl_zoo(297.7, 33.1),),
        "",
        (1,),
        (*SAVE_BUFFER, "--no-use-sde"),
        variant="--no-use-sde",
    ),
}
# The SAC Walker2d row's lead: the actor's loss from the critics after their update, as Stable-Baselines3 and CleanRL
# take it (the preset takes it from the same parameters as the critics', as the original SAC does). Not aggregated.
ROWS["sac/walker2d-actor-after-critics"] = dataclasses.replace(
    ROWS["sac/walker2d"],
    group="",
    flags=(*SAVE_BUFFER, "--actor-after-critics"),
    variant="--actor-after-critics",
)
# The SAC Walker2d row's other lead: Walker2d-v5 on the model of v3 and v4, whose right foot has a friction of 0.9
# (v5 gives both feet 1.9; nothing else in the model differs). rl-zoo's figure was measured on v3. Not aggregated.
ROWS["sac/walker2d-v4-model"] = dataclasses.replace(
    ROWS["sac/walker2d"],
    group="",
    flags=(*SAVE_BUFFER, "--env-kwarg", "xml_file=walker2d.xml"),
    variant="--env-kwarg xml_file=walker2d.xml",
)
# SAC HalfCheetah as a GPU runs it by default: each update starts while the envs take the phase's last step, and
# misses that step's transitions (--update-while-stepping, the default with --cuda), here on the CPU. Not aggregated.
ROWS["sac/halfcheetah-while-stepping"] = dataclasses.replace(
    ROWS["sac/halfcheetah"],
    group="",
    flags=(*SAVE_BUFFER, "--update-while-stepping"),
    variant="--update-while-stepping",
)


# What a run's config holds that is bookkeeping rather than a hyperparameter.
NOT_HYPERPARAMETERS = {
    "seed",
    "run_name",
    "log_dir",
    "checkpoint_every",
    "keep_last",
    "torch_threads",
    "progress_bar",
    "preset",
    "eval_every",
    "stop_at_return",
    "exp_name",
    "env_kwarg",
}


def row_config(name: str, seed: int = 1) -> Any:
    """The config a row's run trains with (its preset, then its flags), as the run itself parses it."""
    from rl.cli import parse_config

    command = ROWS[name].command(seed, run_name(name, seed), REPO / "unused")
    script = next(i for i, part in enumerate(command) if part.endswith("train_fabric.py"))
    return parse_config(command[script + 1 :])


def hyperparameters_page() -> str:
    """docs/benchmarks/hyperparameters.md: per algorithm, every value in which its rows' configs differ from the
    defaults or from each other, generated from the presets and the rows' flags."""
    lines = [
        "# Benchmark hyperparameters",
        "",
        "Generated by `python benchmarks/suite.py --hyperparameters` from each row's preset and flags: every "
        "value in which a row's configuration differs from the defaults of `train_fabric.py` or from another "
        "row's. Values are per process; a row of 2 processes collects twice the rollout. "
        "The [learning page](learning.md) has the results.",
        "",
    ]
    for algorithm in dict.fromkeys(row.algorithm for row in ROWS.values()):
        names = [name for name, row in ROWS.items() if row.algorithm == algorithm]
        configs = {name: row_config(name).to_dict() for name in names}
        defaults = type(row_config(names[0]))().to_dict()
        keys = [
            key
            for key in defaults
            if key not in NOT_HYPERPARAMETERS and any(config[key] != defaults[key] for config in configs.values())
        ]
        keys = sorted({*keys} - {"env_id", "total_timesteps"}, key=list(defaults).index)
        lines += [
            f"## {algorithm.upper()}",
            "",
            "| | " + " | ".join(f"`{name}`" for name in names) + " |",
            "| --- |" + " --- |" * len(names),
        ]
        rows = {
            "env": [ROWS[n].env_id for n in names],
            "config": [ROWS[n].config for n in names],
            "env steps": [f"{ROWS[n].steps:,}" for n in names],
            "seeds": [", ".join(map(str, ROWS[n].seeds)) for n in names],
            "processes": [str(ROWS[n].devices) for n in names],
        }
        rows |= {flag(key): [hyperparameter_value(configs[n][key]) for n in names] for key in keys}
        lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows.items()]
        lines.append("")
    return "\n".join(lines)


def hyperparameter_value(value: Any) -> str:
    if isinstance(value, tuple | list):
        return " ".join(str(part) for part in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def run_name(row: str, seed: int) -> str:
    return f"{row.replace('/', '-')}-seed{seed}"


def plan(rows: list[str], seeds: list[int] | None, out: Path) -> list[Run]:
    """The runs of `rows`, seed by seed across rows (so the first seed of every row finishes first)."""
    runs = []
    for seed in sorted({s for row in rows for s in (seeds or ROWS[row].seeds)}):
        for row in rows:
            if seed in (seeds or ROWS[row].seeds):
                name = run_name(row, seed)
                command = functools.partial(ROWS[row].command, seed, name, out)
                # A row compared by sampled actions keeps every seed's agent: the figure is played from it.
                keep = seed == ROWS[row].seeds[0] or ROWS[row].metric_used(SAMPLED)  # the row's first, however run
                runs.append(Run(name, command, {"row": row, "seed": seed}, keep_agent=keep))
    return runs


def finished_rows(runs: list[Run], out: Path) -> list[dict]:
    return [json.loads(row_file(out, run.name).read_text()) for run in runs if row_file(out, run.name).exists()]


def every_finished_run(out: Path) -> list[dict]:
    """Every finished run of every row under `out`, whichever rows and seeds this launch planned, in the
    table's order: results.csv is the whole table's, so a launch of one row never drops the others."""
    results = [json.loads(path.read_text()) for path in (out / "rows").glob("*.json")]
    order = list(ROWS)
    return sorted((r for r in results if r.get("row") in ROWS), key=lambda r: (order.index(r["row"]), r["seed"]))


def write_csv(results: list[dict], path: Path) -> None:
    columns = [
        "algorithm",
        "env",
        "config",
        "topology",
        "seed",
        "steps",
        "greedy_return",
        "sampled_return",
        "training_return_last100",
        "wall_time_s",
        "env_steps_per_s",
    ]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, columns)
        writer.writeheader()
        for result in results:
            row = ROWS[result["row"]]
            writer.writerow(
                {
                    "algorithm": row.algorithm,
                    "env": row.env_id,
                    "config": row.config,
                    "topology": row.topology,
                    "seed": result["seed"],
                    "steps": result["steps"],
                    "greedy_return": result["eval_return"],
                    "sampled_return": result.get(SAMPLED),
                    "training_return_last100": result.get(TRAINING),
                    "wall_time_s": result["wall_time_s"],
                    "env_steps_per_s": result["env_steps_per_s"],
                }
            )


def with_training_returns(out: Path, results: list[dict]) -> list[dict]:
    """Each finished run with its mean over the last 100 training episodes: runs that finished before the
    figure was kept get it from their logs, written into their row file so that it outlives the logs."""
    for result in results:
        if result.get(TRAINING) is None:
            result[TRAINING] = training_return_of_last(out, run_name(result["row"], result["seed"]))
            if result[TRAINING] is not None:
                row_file(out, run_name(result["row"], result["seed"])).write_text(json.dumps(result))
    return results


def with_sampled_returns(out: Path, results: list[dict]) -> list[dict]:
    """Each finished run of a row that a published figure compares by sampled actions, with its return over
    `SAMPLED_EPISODES` such episodes, played once from its saved agent and written into its row file."""
    for result in results:
        name = run_name(result["row"], result["seed"])
        if ROWS[result["row"]].metric_used(SAMPLED) and result.get(SAMPLED) is None and agent_file(out, name).exists():
            result[SAMPLED], result[f"{SAMPLED}_std"] = sampled_return(agent_file(out, name))
            row_file(out, name).write_text(json.dumps(result))
    return results


def sampled_return(agent_path: Path) -> tuple[float, float]:
    """The mean and std of the agent's return over `SAMPLED_EPISODES` episodes with sampled actions, on evaluation
    seed 0 (the training run's own evaluation uses its training seed)."""
    agent = load_agent(str(agent_path))
    returns, _ = evaluate_greedy(
        agent.policy,
        agent.env_id,
        SAMPLED_EPISODES,
        0,
        agent.normalizer,
        agent.device,
        deterministic=False,
        preprocessing=agent.preprocessing,
    )
    return round(float(returns.mean()), 2), round(float(returns.std()), 2)


def judged_figures(row: Row, members: list[dict], source: Published | None = None) -> list[float]:
    """Each run's figure in the metric of `source` (default: the published figure that judges the row)."""
    metric = GREEDY if row.target is not None and source is None else (source or row.published[0]).metric
    return [member[metric] for member in members if member.get(metric) is not None]


def meets(source: Published, figures: list[float]) -> bool:
    return bool(figures) and statistics.mean(figures) >= source.mean - source.std


def matched(row: Row, members: list[dict], steps: int) -> bool:
    if steps > row.steps:
        return False
    if row.target is not None:
        return bool(judged_figures(row, members)) and statistics.mean(judged_figures(row, members)) >= row.target
    return meets(row.published[0], judged_figures(row, members))


def verdicts(row: Row, members: list[dict]) -> str:
    """Whether the row meets each published figure by that figure's own metric and rule (mean − std)."""
    return "; ".join(verdict(source, judged_figures(row, members, source)) for source in row.published)


def verdict(source: Published, figures: list[float]) -> str:
    """Yes or no; with the figure where the table has no column for it (returns with sampled actions)."""
    said = f"{source.source}: {'yes' if meets(source, figures) else 'no'}"
    return f"{said} ({statistics.mean(figures):,.1f})" if source.metric == SAMPLED and figures else said


def markdown(results: list[dict], rows: list[str], reached: dict[str, int] | None = None) -> str:
    """One line per row, finished or not: a row that misses is reported, never dropped. `reached`: the env
    steps a row's unfinished runs have reached, for a row none of whose runs has finished."""
    lines = [
        "| algorithm | env | config | steps | seeds | greedy return | last 100 training episodes "
        "| greedy per seed | published | judged by | matched | each source's mean − std | wall time per run "
        "| env steps/s |",
        "|" + " --- |" * 14,
    ]
    for name in rows:
        row, members = ROWS[name], [r for r in results if r["row"] == name]
        published = "; ".join(str(p) for p in row.published)
        start = f"| {row.algorithm.upper()} | {row.env_id} | {row.config} |"
        if not members:
            steps_so_far = (reached or {}).get(name)
            status = "not yet run" if steps_so_far is None else f"running: {steps_so_far:,} steps so far"
            lines.append(
                f"{start} {row.steps:,} | 0 of {len(row.seeds)} | {status} | | | {published} | {row.rule} | | | | |"
            )
            continue
        returns, steps = [r["eval_return"] for r in members], max(r["steps"] for r in members)
        training = [r[TRAINING] for r in members if r.get(TRAINING) is not None]
        lines.append(
            f"{start} {steps:,} | {len(members)} of {len(row.seeds)} | {mean_and_std(returns)} | "
            f"{mean_and_std(training)} | {', '.join(f'{r:,.1f}' for r in returns)} | {published} | {row.rule} | "
            f"{'yes' if matched(row, members, steps) else 'no'} | {verdicts(row, members)} | "
            f"{statistics.mean(r['wall_time_s'] for r in members) / 3600:.1f} h | "
            f"{statistics.mean(r['env_steps_per_s'] for r in members):,.0f} |"
        )
    return "\n".join(lines)


def mean_and_std(values: list[float]) -> str:
    return f"{statistics.mean(values):,.1f} ± {statistics.pstdev(values):,.1f}" if values else ""


def normalized_scores(results: list[dict], rows: list[str]) -> dict[str, list[list[float]]]:
    """Per group, a (seeds x rows) matrix of the judged figures over the first published means, over the seeds
    that every finished row of the group has (rliable needs a full matrix)."""
    groups: dict[str, list[list[float]]] = {}
    for group in dict.fromkeys(ROWS[name].group for name in rows if ROWS[name].group):
        members = [name for name in rows if ROWS[name].group == group and any(r["row"] == name for r in results)]
        if not members:
            continue
        by_run = {
            (r["row"], r["seed"]): judged_figures(ROWS[r["row"]], [r])[0]
            for r in results
            if judged_figures(ROWS[r["row"]], [r])
        }
        seeds = sorted(set.intersection(*({s for (n, s) in by_run if n == name} for name in members)))
        groups[group] = [[by_run[(name, seed)] / ROWS[name].published[0].mean for name in members] for seed in seeds]
    return groups


BOOTSTRAP_REPS = 50_000  # rliable's recommended count for the CIs of a published table


def iqm_estimates(scores: dict, reps: int = BOOTSTRAP_REPS) -> tuple[dict, dict]:
    """rliable's IQM per group and its stratified-bootstrap 95% CI, drawn from a fixed seed: the same runs give
    the same table. rliable resamples with NumPy's global generator whatever `random_state` it is given, so that
    generator is seeded here, and given back its state after."""
    import numpy as np
    from rliable import library, metrics

    state = np.random.get_state()
    np.random.seed(0)
    try:
        return library.get_interval_estimates(
            scores, lambda matrix: np.array([metrics.aggregate_iqm(matrix)]), reps=reps
        )
    finally:
        np.random.set_state(state)


def aggregate(results: list[dict], rows: list[str]) -> str:
    """rliable's IQM with stratified-bootstrap 95% CIs, per group."""
    import numpy as np

    scores = {group: np.array(matrix) for group, matrix in normalized_scores(results, rows).items()}
    if not scores:
        return "no finished runs to aggregate"
    points, intervals = iqm_estimates(scores)
    lines = ["| group | runs x rows | IQM of score / published mean | 95% CI |", "| --- | --- | --- | --- |"]
    for group, matrix in scores.items():
        low, high = intervals[group][:, 0]
        lines.append(
            f"| {group} | {matrix.shape[0]} x {matrix.shape[1]} | {points[group][0]:.2f} | [{low:.2f}, {high:.2f}] |"
        )
    return "\n".join(lines)


def figures(runs: list[Run], out: Path) -> None:
    """Per row: return against env steps and against training hours, mean and min-max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(run.keys["row"] for run in runs):
        row = ROWS[name]
        finished = [run for run in runs if run.keys["row"] == name and row_file(out, run.name).exists()]
        curves = [curve(out, run.name) for run in finished]  # a run in progress would cut the others' short
        curves = [c for c in curves if c[0]]
        if not curves:
            continue
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for axis, x_index, label in ((axes[0], 0, "env steps"), (axes[1], 1, "training wall time (h)")):
            scale = 1 / 3600 if x_index == 1 else 1
            grid = np.linspace(0, min(c[x_index][-1] for c in curves), 200)
            values = np.array([np.interp(grid, c[x_index], c[2]) for c in curves])
            axis.plot(grid * scale, values.mean(0), label=f"this project, {len(curves)} seed(s)")
            axis.fill_between(grid * scale, values.min(0), values.max(0), alpha=0.25)
            for published in row.published:
                axis.axhline(
                    published.mean,
                    linestyle="--",
                    color="grey" if published is row.published[0] else "k",
                    label=str(published),
                )
            axis.set_xlabel(label)
            axis.set_ylabel("training episode return")
        axes[0].legend(fontsize=8)
        figure.suptitle(f"{row.algorithm.upper()} {row.env_id}, --preset {row.config}, {row.topology}")
        figure.savefig(folder / figure_name(name), dpi=110, bbox_inches="tight")
        plt.close(figure)


def figure_name(row: str) -> str:
    """A row's figure: named by the row, since rows may share an env and an algorithm."""
    return f"{row.replace('/', '-')}.png"


def compute_spent(runs: list[Run], out: Path) -> str:
    """Every launch of every run so far, finished or not: wall hours, and core hours (one thread per process)."""
    wall = core = 0.0
    for run in runs:
        hours = sum(segment["wall_time_s"] for segment in segments(out, run.name)) / 3600
        wall, core = wall + hours, core + hours * ROWS[run.keys["row"]].devices
    return f"compute spent so far: {wall:,.1f} run-hours, {core:,.1f} core-hours"


def steps_reached(runs: list[Run], out: Path) -> dict[str, int]:
    """For each row with unfinished runs that have logged: the most env steps one of them has reached."""
    reached: dict[str, int] = {}
    for run in runs:
        if row_file(out, run.name).exists() or not curve_file(out, run.name).exists():
            continue
        with curve_file(out, run.name).open() as file:
            steps = [int(row["env_steps"]) for row in csv.DictReader(file)]
        if steps:
            reached[run.keys["row"]] = max(reached.get(run.keys["row"], 0), max(steps))
    return reached


def report(runs: list[Run], rows: list[str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results = with_sampled_returns(out, with_training_returns(out, finished_rows(runs, out)))
    write_csv(with_sampled_returns(out, with_training_returns(out, every_finished_run(out))), out / "results.csv")
    print(markdown(results, rows, steps_reached(runs, out)))
    print()
    print(aggregate(results, rows))
    print()
    print(compute_spent(runs, out))
    figures(runs, out)


# What the bench extra installs for the suite: its rows' envs, the aggregate scores and the figures.
BENCH_MODULES = ("mujoco", "ale_py", "rliable", "matplotlib")


def check_bench_installed() -> None:
    """Stop with one line where the bench extra is missing, before any run: not with a traceback once they end."""
    missing = [module for module in BENCH_MODULES if importlib.util.find_spec(module) is None]
    if missing:
        sys.exit(f"error: benchmarks/suite.py needs {', '.join(missing)}: pip install -c constraints.txt -e '.[bench]'")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: each row's own seeds")
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side (one torch thread each)")
    parser.add_argument("--out", type=Path, default=RESULTS / "suite")
    parser.add_argument("--report-only", action="store_true", help="write the results of the finished runs only")
    parser.add_argument("--dry-run", action="store_true", help="print each run's command and stop")
    parser.add_argument("--hyperparameters", action="store_true", help=f"write {HYPERPARAMETERS_PAGE} and stop")
    args = parser.parse_args()
    if args.hyperparameters:
        HYPERPARAMETERS_PAGE.write_text(hyperparameters_page())
        return
    runs = plan(args.rows, args.seeds, args.out)
    if args.dry_run:
        for run in runs:
            print(" ".join(run.command()))
        return
    check_bench_installed()
    if not args.report_only:
        run_all(runs, args.out, args.parallel)
    report(runs, args.rows, args.out)


if __name__ == "__main__":
    main()
