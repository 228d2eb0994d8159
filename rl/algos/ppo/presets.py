"""PPO's tuned presets (`--preset NAME`): per-rank values.

The classic-control presets are tuned and measured with `fabric run --devices=2`: each follows
rl-baselines3-zoo's tuned hyperparameters for its env where rl-zoo has them, with half of rl-zoo's
env count per rank, so that the two ranks together collect rl-zoo's rollout
(`benchmarks/presets.py`). The MuJoCo presets are rl-zoo's values exactly, for one process: rl-zoo
runs them on a single env, which two ranks cannot halve (`benchmarks/suite.py`); their value-loss
coefficients are doubled to give SB3's loss (`_sb3_vf_coef`). `atari-ppo` is
CleanRL's Atari PPO per rank, and `cleanrl-mujoco` CleanRL's continuous-action PPO.
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


def _sb3_vf_coef(coefficient: float) -> float:
    """Stable-Baselines3's value loss is the mean squared error, this project's half of it (as CleanRL's and
    Lightning's): twice SB3's coefficient gives SB3's loss, whose weight against the policy loss sets how
    the shared gradient-norm clip scales both."""
    return 2 * coefficient


# rl-zoo's tuned MuJoCo PPO for HalfCheetah and Hopper: one env of 512-step rollouts, separate ReLU 256x256 actor
# and critic without orthogonal init, an initial log-std of -2, observations and rewards normalized.
_RL_ZOO_TUNED_MUJOCO: dict[str, Any] = {
    "total_timesteps": 1_000_000,
    "num_envs": 1,
    "num_steps": 512,
    "activation_function": "relu",
    "hidden_size": 256,
    "log_std_init": -2.0,
    "ortho_init": False,
    "normalize_advantages": True,
    "normalize_observations": True,
    "normalize_rewards": True,
}

# rl-zoo's untuned MuJoCo entries: Stable-Baselines3's PPO defaults on one env, normalized.
_SB3_DEFAULT_MUJOCO: dict[str, Any] = {
    **_SB3_STYLE_PPO,
    "vf_coef": _sb3_vf_coef(0.5),
    "total_timesteps": 1_000_000,
    "num_envs": 1,
    "num_steps": 2048,
    "per_rank_batch_size": 64,
    "update_epochs": 10,
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "normalize_observations": True,
    "normalize_rewards": True,
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
    # CartPole without its velocities, through an LSTM: the cartpole preset (rl-zoo's CartPoleNoVel-v1 for
    # RecurrentPPO is the same), with observations and rewards normalized and 10 epochs, measured here:
    # the LSTM that the critic shares would otherwise take gradients dominated by unscaled returns.
    "masked-cartpole": {
        **_SB3_STYLE_PPO,
        "env_id": "rl/MaskedCartPole-v1",
        "recurrent": True,
        "total_timesteps": 150_000,
        "num_envs": 4,
        "num_steps": 32,
        "per_rank_batch_size": 128,
        "update_epochs": 10,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "learning_rate": 1e-3,
        "anneal_lr": True,
        "normalize_observations": True,
        "normalize_rewards": True,
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
    # rl-zoo's tuned PPO Pendulum-v1 entry, which explores with gSDE: 4 envs of 1,024 steps, SB3's default network
    # and minibatch, one process.
    "pendulum-gsde": {
        **_SB3_STYLE_PPO,
        "vf_coef": _sb3_vf_coef(0.5),
        "env_id": "Pendulum-v1",
        "total_timesteps": 100_000,
        "num_envs": 4,
        "num_steps": 1024,
        "per_rank_batch_size": 64,
        "update_epochs": 10,
        "gamma": 0.9,
        "gae_lambda": 0.95,
        "learning_rate": 1e-3,
        "use_sde": True,
        "sde_sample_freq": 4,
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
    "halfcheetah": {
        **_RL_ZOO_TUNED_MUJOCO,
        "env_id": "HalfCheetah-v5",
        "per_rank_batch_size": 64,
        "update_epochs": 20,
        "learning_rate": 2.0633e-05,
        "gamma": 0.98,
        "gae_lambda": 0.92,
        "clip_coef": 0.1,
        "ent_coef": 0.000401762,
        "vf_coef": _sb3_vf_coef(0.58096),
        "max_grad_norm": 0.8,
    },
    "hopper": {
        **_RL_ZOO_TUNED_MUJOCO,
        "env_id": "Hopper-v5",
        "per_rank_batch_size": 32,
        "update_epochs": 5,
        "learning_rate": 9.80828e-05,
        "gamma": 0.999,
        "gae_lambda": 0.99,
        "clip_coef": 0.2,
        "ent_coef": 0.00229519,
        "vf_coef": _sb3_vf_coef(0.835671),
        "max_grad_norm": 0.7,
    },
    # rl-zoo tunes Walker2d's optimisation but not its network, which stays SB3's default (tanh 64x64).
    "walker2d": {
        **_SB3_DEFAULT_MUJOCO,
        "env_id": "Walker2d-v5",
        "num_steps": 512,
        "per_rank_batch_size": 32,
        "update_epochs": 20,
        "learning_rate": 5.05041e-05,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_coef": 0.1,
        "ent_coef": 0.000585045,
        "vf_coef": _sb3_vf_coef(0.871923),
        "max_grad_norm": 1.0,
    },
    # rl-zoo's published Ant and Swimmer agents were trained with SB3's defaults and its time feature (their saved
    # configs name sb3_contrib's TimeFeatureWrapper); Swimmer's 0.9999 discount reaches past the 1,000-step limit.
    # Ant-v3 on MuJoCo 2 read its contact forces as zeros, so the published Ant agent observed none: Ant-v5 leaves
    # them out of the observation too (its reward, contact cost included, is unchanged).
    "ant": {
        **_SB3_DEFAULT_MUJOCO,
        "env_id": "Ant-v5",
        "env_kwargs": '{"include_cfrc_ext_in_observation": false}',
        "time_feature": True,
    },
    "swimmer": {**_SB3_DEFAULT_MUJOCO, "env_id": "Swimmer-v5", "gamma": 0.9999, "time_feature": True},
    # rl-zoo's current Swimmer entry, retuned after its published agent (rl-baselines3-zoo PR #335): 4 envs of
    # 1,024 steps, no time feature.
    "swimmer-tuned": {
        **_SB3_DEFAULT_MUJOCO,
        "env_id": "Swimmer-v5",
        "num_envs": 4,
        "num_steps": 1024,
        "per_rank_batch_size": 256,
        "learning_rate": 6e-4,
        "gamma": 0.9999,
        "gae_lambda": 0.98,
    },
    # CleanRL's ppo_continuous_action.py defaults, for any MuJoCo env (Hopper-v5 unless --env-id says otherwise): SB3's
    # MuJoCo defaults (one env of 2,048 steps in 32 minibatches), with an annealed learning rate, the clipped value
    # loss, and CleanRL's value loss as it is (half the squared error, as here).
    "cleanrl-mujoco": {
        **_SB3_DEFAULT_MUJOCO,
        "env_id": "Hopper-v5",
        "vf_coef": 0.5,
        "anneal_lr": True,
        "clip_vloss": True,
    },
}
