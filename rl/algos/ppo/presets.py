"""PPO's tuned presets (`--preset NAME`), per rank, tuned and measured with `fabric run --devices=2`.

Each follows rl-baselines3-zoo's tuned hyperparameters for its env where rl-zoo has them, with
half of rl-zoo's env count per rank, so that the two ranks together collect rl-zoo's rollout.
`benchmarks/presets.py` trains each with 3 seeds; the README has the table.
"""

from __future__ import annotations

from typing import Any

# PPO in the style SB3 and rl-zoo tune it: tanh, orthogonal init, normalized advantages.
_SB3_STYLE_PPO: dict[str, Any] = {
    "activation_function": "tanh",
    "ortho_init": True,
    "normalize_advantages": True,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
}

PPO_PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": {
        **_SB3_STYLE_PPO,
        "env_id": "CartPole-v1",
        "total_timesteps": 100_000,
        "num_envs": 4,
        "num_steps": 32,
        "per_rank_batch_size": 128,
        "update_epochs": 20,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "learning_rate": 1e-3,
        "anneal_lr": True,
    },
    "acrobot": {
        **_SB3_STYLE_PPO,
        "env_id": "Acrobot-v1",
        "total_timesteps": 1_000_000,
        "num_envs": 8,
        "num_steps": 256,
        "per_rank_batch_size": 32,
        "update_epochs": 4,
        "gamma": 0.99,
        "gae_lambda": 0.94,
        "learning_rate": 1e-3,  # annealed from 1e-3 instead of rl-zoo's constant 3e-4: measured better here
        "anneal_lr": True,
        "normalize_observations": True,
        "normalize_rewards": True,
    },
    "lunarlander": {
        **_SB3_STYLE_PPO,
        "env_id": "LunarLander-v3",
        "total_timesteps": 1_000_000,
        "num_envs": 8,
        "num_steps": 1024,
        "per_rank_batch_size": 32,
        "update_epochs": 4,
        "gamma": 0.999,
        "gae_lambda": 0.98,
        "learning_rate": 3e-4,
        "ent_coef": 0.01,
    },
    "pendulum": {
        **_SB3_STYLE_PPO,
        "env_id": "Pendulum-v1",
        "total_timesteps": 100_000,
        "num_envs": 2,
        "num_steps": 512,
        "per_rank_batch_size": 32,
        "update_epochs": 10,
        "gamma": 0.9,
        "gae_lambda": 0.95,
        "learning_rate": 1e-3,
        "normalize_observations": True,
        "normalize_rewards": True,
    },
    # CleanRL's ppo_atari.py (Huang et al. 2022, "The 37 implementation details of PPO"), per rank.
    "atari-ppo": {
        "env_id": "ALE/Breakout-v5",
        "total_timesteps": 10_000_000,
        "num_envs": 8,
        "num_steps": 128,
        "per_rank_batch_size": 256,  # 4 minibatches of the 1,024-step rollout
        "update_epochs": 4,
        "learning_rate": 2.5e-4,
        "anneal_lr": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_coef": 0.1,
        "clip_vloss": True,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "normalize_advantages": True,
        "ortho_init": True,
        "encoder": "cnn",
        "vector_mode": "auto",  # ale-py's native vector env: the fastest of the four here (benchmarks/atari.py)
    },
}
