"""What a saved agent holds: weights, normalization statistics and the config."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from rl.config import PPOConfig
from rl.normalization import ObservationNormalizer, RewardScaler

AGENT_FILENAME = "agent.ckpt"


def agent_state(
    agent: nn.Module, obs_normalizer: ObservationNormalizer, reward_scaler: RewardScaler, cfg: PPOConfig, env_id: str
) -> dict[str, Any]:
    return {
        "agent": agent.state_dict(),
        "obs_normalizer": obs_normalizer.state_dict(),
        "reward_scaler": reward_scaler.state_dict(),
        "config": cfg.to_dict(),
        "env_id": env_id,
    }


def agent_path(run_dir: str) -> str:
    return os.path.join(run_dir, AGENT_FILENAME)
