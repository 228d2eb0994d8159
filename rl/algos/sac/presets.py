"""SAC's tuned presets (`--preset NAME`), per rank, measured with `fabric run --devices=2`."""

from __future__ import annotations

from typing import Any

SAC_PRESETS: dict[str, dict[str, Any]] = {
    # rl-zoo's Pendulum settings: both learning rates 1e-3; batch 256 per rank.
    "pendulum": {
        "env_id": "Pendulum-v1",
        "total_timesteps": 20_000,
        "policy_lr": 1e-3,
        "q_lr": 1e-3,
    },
}
