"""This project against Stable-Baselines3 on the same MuJoCo configurations, side by side in one run.

    python benchmarks/sb3_side_by_side.py [--rows ppo/halfcheetah sac/hopper] [--steps 200000] [--seed 1]
                                          [--sb3-python .venv-sb3/bin/python] [--out docs/benchmarks/sb3]

For each row, ours (`python train_fabric.py [sac] --preset NAME`, one process) and SB3's `learn`
with the same hyperparameters (rl-zoo's, which the presets are) start together, one torch thread
each, so both meet the same machine load. Each reports its training loop's env steps/s and wall
time, then the greedy (deterministic) return over 10 episodes at the same step count. SB3 lives
in its own virtual environment and is never a dependency of this project:

    python3 -m venv .venv-sb3 && .venv-sb3/bin/pip install torch==2.13.0 stable-baselines3==2.9.2 \\
        "gymnasium[mujoco]==1.4.0" mujoco==4.0.0

A row takes one uninterrupted launch (SB3 has no resume here): PPO's 200k steps take minutes,
SAC's take about two hours on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launch import REPO, SUMMARY
from resumable import EVALUATION

ENV_IDS = {"ppo/halfcheetah": "HalfCheetah-v5", "sac/hopper": "Hopper-v5"}

# Stable-Baselines3 with rl-zoo's hyperparameters for each row (the presets' values), timed around `learn`.
SB3_RUN = """
import json, sys, time
import gymnasium as gym, torch
from torch import nn
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

row, env_id, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
env = make_vec_env(env_id, n_envs=1, seed=seed)
if row == "ppo/halfcheetah":
    env = VecNormalize(env, gamma=0.98)
    model = PPO("MlpPolicy", env, n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05,
                ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8,
                vf_coef=0.58096, seed=seed, device="cpu",
                policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                                   net_arch=dict(pi=[256, 256], vf=[256, 256])))
else:
    model = SAC("MlpPolicy", env, learning_starts=10_000, seed=seed, device="cpu")
started = time.perf_counter()
model.learn(total_timesteps=steps)
seconds = time.perf_counter() - started
if isinstance(env, VecNormalize):
    env.training, env.norm_reward = False, False
returns, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=True, return_episode_rewards=True)
print(json.dumps({"steps": steps, "loop_s": seconds, "eval_return": sum(returns) / len(returns)}))
"""


def ours(row: str, steps: int, seed: int, out: Path) -> dict:
    algorithm, preset = row.split("/")
    command = [sys.executable, str(REPO / "train_fabric.py"), *(["sac"] if algorithm == "sac" else []), "--preset",
               preset, "--total-timesteps", str(steps), "--seed", str(seed), "--torch-threads", "1",
               "--no-progress-bar", "--log-dir", str(out / "runs")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    summary, evaluation = SUMMARY.search(done.stdout), EVALUATION.search(done.stdout)
    if done.returncode != 0 or summary is None or evaluation is None:
        sys.exit(f"ours failed on {row}:\n{done.stderr[-2000:]}")
    steps, loop_seconds = int(summary.group(1)), float(summary.group(2))
    return {"steps": steps, "loop_s": loop_seconds, "eval_return": float(evaluation.group(1))}


def stable_baselines3(python: str, row: str, steps: int, seed: int) -> dict:
    done = subprocess.run([python, "-c", SB3_RUN, row, ENV_IDS[row], str(steps), str(seed)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"Stable-Baselines3 failed on {row} (is it installed in {python}?):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def side_by_side(row: str, steps: int, seed: int, python: str, out: Path) -> dict:
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        mine = pool.submit(ours, row, steps, seed, out)
        theirs = pool.submit(stable_baselines3, python, row, steps, seed)
        result = {"row": row, "env": ENV_IDS[row], "seed": seed, "ours": mine.result(), "sb3": theirs.result()}
    result["wall_time_s"] = round(time.perf_counter() - started, 1)
    return result


def markdown(results: list[dict]) -> str:
    header = ["row", "steps", "ours: env steps/s", "SB3: env steps/s", "ours / SB3", "ours: loop time",
              "SB3: loop time", "ours: greedy return", "SB3: greedy return"]  # fmt: skip
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
    parser.add_argument("--rows", nargs="+", default=list(ENV_IDS), choices=list(ENV_IDS))
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sb3-python", default=str(REPO / ".venv-sb3" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "sb3")
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
