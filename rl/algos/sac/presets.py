"""SAC's tuned presets (`--preset NAME`): per-rank values.

`pendulum` is measured with `fabric run --devices=2`. The MuJoCo presets are rl-baselines3-zoo's
values for one process, whose one env step per gradient step of 256 rows is the published replay
ratio (`benchmarks/suite.py`); each further rank adds an env step per gradient step.
"""

from __future__ import annotations

from typing import Any

# rl-zoo's MuJoCo SAC: Stable-Baselines3's defaults (both learning rates 3e-4, batch 256, a million
# transitions, one gradient step per env step) after 10,000 random steps.
_RL_ZOO_MUJOCO: dict[str, Any] = {
    "total_timesteps": 1_000_000,
    "learning_starts": 10_000,
    "policy_lr": 3e-4,
    "q_lr": 3e-4,
}

SAC_PRESETS: dict[str, dict[str, Any]] = {
    # rl-zoo's Pendulum settings: both learning rates 1e-3; batch 256 per rank.
    "pendulum": {
        "env_id": "Pendulum-v1",
        "total_timesteps": 20_000,
        "policy_lr": 1e-3,
        "q_lr": 1e-3,
    },
    "halfcheetah": {**_RL_ZOO_MUJOCO, "env_id": "HalfCheetah-v5"},
    "hopper": {**_RL_ZOO_MUJOCO, "env_id": "Hopper-v5"},
    "walker2d": {**_RL_ZOO_MUJOCO, "env_id": "Walker2d-v5"},
    # rl-zoo's tuned BipedalWalker-v3 entry, which explores with gSDE: 64 env steps then 64 gradient steps,
    # a 400 x 300 network, one process.
    "bipedalwalker": {
        "env_id": "BipedalWalker-v3",
        "total_timesteps": 500_000,
        "learning_starts": 10_000,
        "buffer_size": 300_000,
        "batch_size": 256,
        "policy_lr": 7.3e-4,
        "q_lr": 7.3e-4,
        "gamma": 0.98,
        "tau": 0.02,
        "train_freq": 64,
        "gradient_steps": 64,
        "net_arch": (400, 300),
        "use_sde": True,
        "log_std_init": -3.0,
    },
}
