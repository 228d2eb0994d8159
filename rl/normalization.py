"""Observation and reward normalization whose statistics are identical on every rank.

The statistics stay frozen during a rollout and change only in `sync_update`, which pools the
rollout's moments from all ranks with one all-reduce. Every rank therefore normalizes with the
same numbers, and the numbers that produced the stored observations are the ones PPO trains on.
The running-moment arithmetic is gymnasium's `RunningMeanStd`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.wrappers.utils import RunningMeanStd
from torch import Tensor

AllReduceSum = Callable[[Tensor], Tensor]
CLIP = 10.0
EPSILON = 1e-8


def _pooled_moments(samples: Tensor, all_reduce_sum: AllReduceSum) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean, variance and count of `samples` (rows) pooled over all ranks."""
    flat = samples.reshape(samples.shape[0], -1).double().cpu()
    sums = torch.cat([flat.new_tensor([flat.shape[0]]), flat.sum(0), flat.pow(2).sum(0)])
    sums = all_reduce_sum(sums)
    count = float(sums[0])
    width = flat.shape[1]
    mean = sums[1 : 1 + width] / count
    var = (sums[1 + width :] / count - mean.pow(2)).clamp_min(0.0)
    return mean.numpy(), var.numpy(), count


class ObservationNormalizer:
    def __init__(self, obs_dim: int, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.device = device
        self.rms = RunningMeanStd(shape=(obs_dim,))
        self._refresh()

    def _refresh(self) -> None:
        self._mean = torch.as_tensor(self.rms.mean, dtype=torch.float32, device=self.device)
        self._scale = torch.as_tensor(1.0 / np.sqrt(self.rms.var + EPSILON), dtype=torch.float32, device=self.device)

    def __call__(self, obs: Tensor) -> Tensor:
        if not self.enabled:
            return obs
        return ((obs - self._mean) * self._scale).clamp(-CLIP, CLIP)

    def mean_and_scale(self) -> tuple[Tensor, Tensor]:
        """What `__call__` subtracts and multiplies by, before it clips to +-CLIP."""
        return self._mean.clone(), self._scale.clone()

    def sync_update(self, raw_obs: Tensor, all_reduce_sum: AllReduceSum) -> None:
        if not self.enabled:
            return
        self.rms.update_from_moments(*_pooled_moments(raw_obs, all_reduce_sum))
        self._refresh()

    def state_dict(self) -> dict[str, Any]:
        # Tensors and floats only, so checkpoints load with torch.load(weights_only=True).
        return {
            "mean": torch.from_numpy(self.rms.mean.copy()),
            "var": torch.from_numpy(self.rms.var.copy()),
            "count": float(self.rms.count),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.mean, self.rms.var = state["mean"].double().numpy(), state["var"].double().numpy()
        self.rms.count = state["count"]
        self._refresh()


class RewardScaler:
    """Divides rewards by the running std of each env's discounted return (as SB3's VecNormalize)."""

    def __init__(self, num_envs: int, gamma: float, enabled: bool) -> None:
        self.enabled = enabled
        self.gamma = gamma
        self.rms = RunningMeanStd(shape=())
        self.discounted_returns = np.zeros(num_envs)

    def __call__(self, rewards: np.ndarray, episode_ended: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scaled rewards and the discounted returns that will feed the next statistics update."""
        if not self.enabled:
            return rewards, self.discounted_returns
        self.discounted_returns = self.discounted_returns * self.gamma + rewards
        tracked = self.discounted_returns.copy()
        self.discounted_returns[episode_ended] = 0.0
        scaled = np.clip(rewards / np.sqrt(self.rms.var + EPSILON), -CLIP, CLIP)
        return scaled, tracked

    def sync_update(
        self, discounted_returns: Tensor, all_reduce_sum: AllReduceSum, samples: Tensor | None = None
    ) -> None:
        """`samples`: a mask of the returns that are samples (None: all are)."""
        if not self.enabled:
            return  # before the mask, which a boolean index reads on the host
        if samples is not None:
            discounted_returns = discounted_returns[samples]
        mean, var, count = _pooled_moments(discounted_returns.reshape(-1, 1), all_reduce_sum)
        self.rms.update_from_moments(mean[0], var[0], count)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": float(self.rms.mean), "var": float(self.rms.var), "count": float(self.rms.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.mean, self.rms.var, self.rms.count = state["mean"], state["var"], state["count"]
