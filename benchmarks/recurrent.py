"""Recurrent PPO: what it learns that feed-forward cannot, and what its memory costs.

    python benchmarks/recurrent.py learning [--seeds 1 2 3] [--out benchmarks/results/recurrent]
    python benchmarks/recurrent.py speed [--rounds 3]

`learning` trains, with `fabric run --devices=2` (one torch thread per rank):
- rl/MaskedCartPole-v1 (CartPole without its velocities) with `--preset masked-cartpole`, and the
  same preset feed-forward (`--no-recurrent`), over the seeds;
- rl/PixelCartPole-v1 from single frames (`--frame-stack 1`, so no frame carries motion),
  recurrent and feed-forward, seed 1.
It prints the greedy return (10 episodes, mean ± std over seeds) and draws both policies' training
returns per env in one figure (OUT/figures/recurrent_vs_feed_forward.png). Runs are named and resumable
(`benchmarks/resumable.py`).

`speed` alternates, round by round, each config (the masked-cartpole preset, and PixelCartPole
from single frames) recurrent and feed-forward on 2 coupled ranks and prints the loop's env
steps/s and their ratio; then times one masked-cartpole minibatch's loss
and backward on one thread: feed-forward, the recurrent replay as the project runs it (every
segment through the LSTM kernel at once), and the same replay stepped one step at a time in
Python, so the fused replay's worth is measured.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

from launch import RESULTS, fabric_run, loop_steps_per_second
from resumable import Run, curve, resumable_flags, run_all

PIXEL_SINGLE_FRAMES = [
    "--env-id",
    "rl/PixelCartPole-v1",
    "--resize",
    "0",
    "--frame-stack",
    "1",
    "--total-timesteps",
    "100000",
    "--num-envs",
    "4",
    "--num-steps",
    "128",
    "--update-epochs",
    "4",
    "--per-rank-batch-size",
    "256",
    "--learning-rate",
    "1e-3",
    "--normalize-rewards",
]
CONFIGS: dict[str, list[str]] = {
    "masked-cartpole/recurrent": ["--preset", "masked-cartpole"],
    "masked-cartpole/feed-forward": ["--preset", "masked-cartpole", "--no-recurrent"],
    "pixel-cartpole-1-frame/recurrent": [*PIXEL_SINGLE_FRAMES, "--recurrent"],
    "pixel-cartpole-1-frame/feed-forward": PIXEL_SINGLE_FRAMES,
}
SINGLE_SEED = ("pixel-cartpole-1-frame/recurrent", "pixel-cartpole-1-frame/feed-forward")


def run_name(config: str, seed: int) -> str:
    return f"{config.replace('/', '-')}-seed{seed}"


def command(config: str, seed: int, out: Path) -> list[str]:
    return fabric_run([*CONFIGS[config], "--seed", str(seed), *resumable_flags(run_name(config, seed), out)])


def plan(seeds: list[int], out: Path) -> list[Run]:
    """Recurrent and feed-forward alternate seed by seed."""
    return [
        Run(run_name(config, seed), functools.partial(command, config, seed, out), {"config": config, "seed": seed})
        for seed in seeds
        for config in CONFIGS
        if seed == seeds[0] or config not in SINGLE_SEED
    ]


def markdown(rows: list[dict]) -> str:
    lines = [
        "| env | policy | greedy return | per seed | steps | wall time per run | env steps/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in CONFIGS:
        members = [row for row in rows if row["config"] == config]
        if not members:
            continue
        env, policy = config.split("/")
        returns = [row["eval_return"] for row in members]
        lines.append(
            f"| {env} | {policy} | {statistics.mean(returns):.1f} ± {statistics.pstdev(returns):.1f} | "
            f"{', '.join(f'{r:.1f}' for r in returns)} | {members[0]['steps']:,} | "
            f"{statistics.mean(row['wall_time_s'] for row in members):.0f} s | "
            f"{statistics.mean(row['env_steps_per_s'] for row in members):,.0f} |"
        )
    return "\n".join(lines)


def figure(runs: list[Run], out: Path) -> None:
    """Per env, the training return of both policies against env steps: mean and min-max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    envs = list(dict.fromkeys(config.split("/")[0] for config in CONFIGS))
    figure, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4))
    for axis, env in zip(axes, envs, strict=True):
        for config in (c for c in CONFIGS if c.startswith(env)):
            curves = [c for c in (curve(out, run.name) for run in runs if run.keys["config"] == config) if c[0]]
            if not curves:
                continue
            grid = np.linspace(0, min(c[0][-1] for c in curves), 200)
            values = np.array([np.interp(grid, c[0], c[2]) for c in curves])
            axis.plot(grid, values.mean(0), label=f"{config.split('/')[1]}, {len(curves)} seed(s)")
            axis.fill_between(grid, values.min(0), values.max(0), alpha=0.25)
        axis.set_title(env)
        axis.set_xlabel("env steps")
        axis.set_ylabel("training episode return")
        axis.legend()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "figures" / "recurrent_vs_feed_forward.png", dpi=110, bbox_inches="tight")


def minibatch_seconds(recurrent: bool, stepped: bool = False, lstm_only: bool = False, repeats: int = 20) -> float:
    """Seconds of one minibatch's loss and backward at the masked-cartpole preset's per-rank sizes (with
    `lstm_only`, of the replay through the LSTM kernel alone: the floor of the recurrent update)."""
    import torch

    from rl.algos.ppo.algorithm import PPO, hyperparameters
    from rl.algos.ppo.config import PPOConfig
    from rl.algos.ppo.recurrent import replay_lstm
    from rl.algos.ppo.update import minibatch_loss
    from rl.cli import parse_config
    from rl.envs import inspect_env

    torch.set_num_threads(1)
    cfg = parse_config(["--preset", "masked-cartpole", "--recurrent" if recurrent else "--no-recurrent"])
    assert isinstance(cfg, PPOConfig)
    algorithm = PPO(cfg, inspect_env(cfg.env_id))
    policy = algorithm.build_policy(torch.device("cpu"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=algorithm.batch_rows(1))
    source.collect(policy)
    batch = source.next_batch(0, lambda tensor: tensor)
    minibatch = batch.minibatches([list(range(cfg.per_rank_batch_size // cfg.steps_per_row))])[0]
    if stepped:  # the replay as a Python loop over steps, for comparison only
        import rl.algos.ppo.recurrent as recurrent_module

        def step_by_step(lstm, features, starts, memory):  # type: ignore[no-untyped-def]
            hidden, cell = memory.unbind(0)
            outputs = []
            for t in range(starts.shape[1]):
                keep = (~starts[:, t]).float().view(1, -1, 1)
                output, (hidden, cell) = lstm(features[:, t].unsqueeze(0), (hidden * keep, cell * keep))
                outputs.append(output.squeeze(0))
            return torch.stack(outputs, 1).reshape(-1, outputs[0].shape[-1])

        recurrent_module.replay_lstm = step_by_step  # type: ignore[assignment]
    try:
        hp = hyperparameters(cfg)
        if lstm_only:
            steps = minibatch.starts.shape[1]
            features = policy.encode(minibatch.obs.flatten(0, 1)).view(len(minibatch), steps, -1).detach()
            features.requires_grad_(True)
            memory = minibatch.memory.permute(1, 2, 0, 3)
        started = time.perf_counter()
        for _ in range(repeats):
            if lstm_only:
                replay_lstm(policy.lstm, features, minibatch.starts, memory).sum().backward()
            else:
                minibatch_loss(policy, minibatch, hp)[0].backward()
        return (time.perf_counter() - started) / repeats
    finally:
        if stepped:
            recurrent_module.replay_lstm = replay_lstm


SPEED_CONFIGS = {  # the same config recurrent and feed-forward; short runs
    "masked-cartpole": ["--preset", "masked-cartpole", "--total-timesteps", "32768"],
    "pixel-cartpole-1-frame": [*PIXEL_SINGLE_FRAMES, "--total-timesteps", "16384"],
}


def speed(rounds: int) -> None:
    common = ["--eval-episodes", "0", "--torch-threads", "1", "--no-progress-bar"]
    for name, flags in SPEED_CONFIGS.items():
        ratios = []
        for round_ in range(1, rounds + 1):
            recurrent = loop_steps_per_second(fabric_run([*flags, *common, "--recurrent"]))
            feed_forward = loop_steps_per_second(fabric_run([*flags, *common, "--no-recurrent"]))
            ratios.append(recurrent / feed_forward)
            print(
                f"round {round_}: {name}, 2 ranks: recurrent {recurrent:,.0f} env steps/s, feed-forward "
                f"{feed_forward:,.0f}: {ratios[-1]:.2f}x",
                flush=True,
            )
        print(f"{name}: recurrent / feed-forward, median over {rounds} rounds: {statistics.median(ratios):.2f}x")
    for label, recurrent, stepped in (
        ("feed-forward", False, False),
        ("recurrent, fused replay", True, False),
        ("recurrent, stepped in Python", True, True),
    ):
        print(
            f"masked-cartpole, one minibatch's loss and backward, {label}: "
            f"{minibatch_seconds(recurrent, stepped) * 1000:.1f} ms"
        )
    lstm_floor = minibatch_seconds(True, lstm_only=True) * 1000
    print(f"masked-cartpole, the LSTM kernel alone, forward and backward over the same minibatch: {lstm_floor:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", choices=["learning", "speed"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "recurrent")
    args = parser.parse_args()
    if args.study == "speed":
        speed(args.rounds)
        return
    runs = plan(args.seeds, args.out)
    rows = run_all(runs, args.out)
    print(markdown(rows))
    figure(runs, args.out)


if __name__ == "__main__":
    main()
