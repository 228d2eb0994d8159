"""Stable-Baselines3 trained on one of this project's MuJoCo presets, in SB3's own virtual environment.

SB3 is never a dependency of this project; it lives in a virtual environment of its own:

    python3 -m venv .venv-sb3 && .venv-sb3/bin/pip install torch==2.13.0 stable-baselines3==2.9.2 \\
        "gymnasium[mujoco]==1.4.0" mujoco==4.0.0

`sb3_spec` reads SB3's arguments off the preset itself (rl-zoo's hyperparameters), so both sides
always train the same configuration. `run_sb3` trains it on one torch thread and returns the
training loop's steps and seconds, and its return over 10 episodes both greedy (deterministic, rl-zoo's
metric) and with sampled actions (SB3's `deterministic=False`). Given
a checkpoint folder, the run saves its model (and its normalization statistics and replay buffer)
there every few minutes and on Ctrl-C, and a later launch goes on from that save, so a run may
span sessions; a resumed run starts fresh episodes, so it is not the one an uninterrupted run
would have been.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from launch import REPO

from rl.algos.ppo.config import PPOConfig
from rl.algos.sac.config import SACConfig
from rl.flag_parsing import preset_values

SB3_PYTHON = REPO / ".venv-sb3" / "bin" / "python"
CHECKPOINT_EVERY_S = 300
INTERRUPTED_EXIT = 130
_running: set[subprocess.Popen] = set()  # SB3 runs in flight, which `interrupt_all` stops

# The program SB3's interpreter runs: argv[1] is the JSON of `sb3_spec`, plus "checkpoint_dir" (or null).
SB3_PROGRAM = """
import functools, json, os, signal, sys, time
import torch
from gymnasium.wrappers import TimeAwareObservation
from torch import nn
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

spec = json.loads(sys.argv[1])
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with Ctrl-C ignored
torch.set_num_threads(1)
Algorithm = {"ppo": PPO, "sac": SAC}[spec["algorithm"]]
folder = spec["checkpoint_dir"]
path = lambda name: os.path.join(folder, name)
resumed = folder is not None and os.path.exists(path("model.zip"))
# rl-zoo's TimeFeatureWrapper, as gymnasium gives it: this project's --time-feature.
time_feature = functools.partial(TimeAwareObservation, normalize_time=True) if spec["time_feature"] else None
env = make_vec_env(spec["env_id"], n_envs=spec["n_envs"], seed=spec["seed"], env_kwargs=spec["env_kwargs"],
                   wrapper_class=time_feature)
if spec["normalize"] is not None:
    env = VecNormalize.load(path("vecnormalize.pkl"), env) if resumed else VecNormalize(env, **spec["normalize"])
if resumed:
    model = Algorithm.load(path("model.zip"), env=env, device="cpu")
    if spec["algorithm"] == "sac":
        model.load_replay_buffer(path("replay.pkl"))
    loop_s = json.loads(open(path("progress.json")).read())["loop_s"]
else:
    policy = dict(spec["policy"])
    if "activation_fn" in policy:
        policy["activation_fn"] = {"relu": nn.ReLU, "tanh": nn.Tanh}[policy["activation_fn"]]
    model = Algorithm("MlpPolicy", env, seed=spec["seed"], device="cpu", policy_kwargs=policy, **spec["model"])
    loop_s = 0.0
started = time.perf_counter()

def save():
    # Each file is written whole under a temporary name first, so a kill mid-save leaves the previous save.
    os.makedirs(folder, exist_ok=True)
    model.save(path("model.tmp.zip"))
    os.replace(path("model.tmp.zip"), path("model.zip"))
    if spec["normalize"] is not None:
        env.save(path("vecnormalize.tmp.pkl"))
        os.replace(path("vecnormalize.tmp.pkl"), path("vecnormalize.pkl"))
    if spec["algorithm"] == "sac":
        model.save_replay_buffer(path("replay.tmp.pkl"))
        os.replace(path("replay.tmp.pkl"), path("replay.pkl"))
    with open(path("progress.tmp.json"), "w") as file:
        json.dump({"steps": model.num_timesteps, "loop_s": loop_s + time.perf_counter() - started}, file)
    os.replace(path("progress.tmp.json"), path("progress.json"))

class SaveEveryFewMinutes(BaseCallback):
    def __init__(self):
        super().__init__()
        self.last = time.monotonic()

    def _on_step(self):
        if folder is not None and time.monotonic() - self.last >= spec["checkpoint_every_s"]:
            save()
            self.last = time.monotonic()
        return True

try:
    model.learn(total_timesteps=spec["steps"] - model.num_timesteps, reset_num_timesteps=not resumed,
                callback=SaveEveryFewMinutes())
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C (the terminal's and the forwarded one) waits
    if folder is not None:
        save()
    print(f"interrupted at step {model.num_timesteps}", file=sys.stderr)
    sys.exit(130)
loop_s += time.perf_counter() - started
if isinstance(env, VecNormalize):
    env.training, env.norm_reward = False, False

def mean_and_std(deterministic):
    returns, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=deterministic,
                                 return_episode_rewards=True)
    mean = sum(returns) / len(returns)
    return mean, (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5

figures = {"steps": model.num_timesteps, "loop_s": loop_s}
figures["eval_return"], figures["eval_std"] = mean_and_std(deterministic=True)
figures["sampled_return"], figures["sampled_std"] = mean_and_std(deterministic=False)
print(json.dumps(figures))
"""


def _ppo_spec(config: PPOConfig) -> dict[str, Any]:
    if config.anneal_lr or config.clip_vloss:
        raise ValueError(f"preset {config.preset!r}: only a constant learning rate and no value clipping map")
    # SB3's value loss is twice this project's (rl/algos/ppo/presets.py): half the coefficient gives the same loss.
    model = {
        "n_steps": config.num_steps,
        "batch_size": config.per_rank_batch_size,
        "n_epochs": config.update_epochs,
        "learning_rate": config.learning_rate,
        "gamma": config.gamma,
        "gae_lambda": config.gae_lambda,
        "clip_range": config.clip_coef,
        "ent_coef": config.ent_coef,
        "max_grad_norm": config.max_grad_norm,
        "normalize_advantage": config.normalize_advantages,
        "vf_coef": config.vf_coef / 2,
    }
    hidden = [config.hidden_size, config.hidden_size]
    policy = {
        "activation_fn": config.activation_function,
        "ortho_init": config.ortho_init,
        "log_std_init": config.log_std_init,
        "net_arch": {"pi": hidden, "vf": hidden},
    }
    normalize = None
    if config.normalize_observations or config.normalize_rewards:
        normalize = {
            "norm_obs": config.normalize_observations,
            "norm_reward": config.normalize_rewards,
            "gamma": config.gamma,
        }
    return {"model": model, "policy": policy, "normalize": normalize}


def _sac_spec(config: SACConfig) -> dict[str, Any]:
    if config.num_envs != 1 or config.policy_lr != config.q_lr or config.policy_frequency != 1:
        raise ValueError(f"preset {config.preset!r}: only one env and one learning rate map onto SB3's SAC")
    model = {
        "learning_starts": config.learning_starts,
        "learning_rate": config.policy_lr,
        "batch_size": config.batch_size,
        "buffer_size": config.buffer_size,
        "tau": config.tau,
        "gamma": config.gamma,
        "train_freq": config.train_freq,
        "gradient_steps": config.gradient_steps,
        "target_update_interval": config.target_network_frequency,
        "ent_coef": config.ent_coef,
    }
    return {"model": model, "policy": {}, "normalize": None}


def sb3_spec(row: str, steps: int, seed: int) -> dict[str, Any]:
    """SB3's arguments for a row ("ppo/hopper", "sac/halfcheetah", ...), read off the row's preset."""
    algorithm, preset = row.split("/")
    if algorithm == "ppo":
        config = PPOConfig(**preset_values(PPOConfig, preset))
        spec = _ppo_spec(config)
    else:
        config = SACConfig(**preset_values(SACConfig, preset))
        spec = _sac_spec(config)
    return {
        "algorithm": algorithm,
        "env_id": config.env_id,
        "n_envs": config.num_envs,
        "env_kwargs": config.make_kwargs(),
        "time_feature": config.time_feature,
        "steps": steps,
        "seed": seed,
        **spec,
    }


def run_sb3(python: str | Path, row: str, steps: int, seed: int, checkpoint_dir: Path | None = None) -> dict:
    """Train SB3 on the row's preset; its steps, loop seconds and greedy return. A Ctrl-C (after a save into
    `checkpoint_dir`) raises KeyboardInterrupt; any other failure ends the benchmark with SB3's error output."""
    spec = {
        **sb3_spec(row, steps, seed),
        "checkpoint_dir": None if checkpoint_dir is None else str(checkpoint_dir),
        "checkpoint_every_s": CHECKPOINT_EVERY_S,
    }
    command = [str(python), "-c", SB3_PROGRAM, json.dumps(spec)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        _running.add(process)
        try:
            stdout, stderr = process.communicate()
        except KeyboardInterrupt:  # SB3 saves on its own Ctrl-C: hand it one and wait for the save
            process.send_signal(signal.SIGINT)
            process.communicate()
            raise
        finally:
            _running.discard(process)
    if process.returncode == INTERRUPTED_EXIT:
        raise KeyboardInterrupt
    if process.returncode != 0:
        sys.exit(f"Stable-Baselines3 failed on {row} (is it installed in {python}?):\n{stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def interrupt_all() -> None:
    """Hand every SB3 run in flight a Ctrl-C (each saves and exits), for a Ctrl-C that reached only the main thread."""
    for process in list(_running):
        process.send_signal(signal.SIGINT)
