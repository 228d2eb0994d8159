"""Observation and reward normalization whose statistics are identical on every rank.

The statistics stay frozen during a rollout and change only in `sync_update`, which pools the
rollout's moments from all ranks with one all-reduce. Every rank therefore normalizes with the
same numbers, and the numbers that produced the stored observations are the ones PPO trains on.
The statistics live on the rollout's device, so that a GPU's rollout is never read on the host to
update them; their arithmetic is gymnasium's `RunningMeanStd`, operation for operation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

AllReduceSum = Callable[[Tensor], Tensor]
CLIP = 10.0
EPSILON = 1e-8
INITIAL_COUNT = 1e-4  # gymnasium's: the prior's weight against the first batch


class RunningMoments:
    """Running mean, variance and count as float64 tensors on a device.

    `update` does gymnasium's `update_mean_var_count_from_moments` in the same order of operations,
    so its statistics are those of `RunningMeanStd` bit for bit; gymnasium's works on numpy arrays,
    and reading a GPU's moments into them would make the host wait for the GPU every rollout."""

    def __init__(self, shape: tuple[int, ...], device: torch.device) -> None:
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.tensor(INITIAL_COUNT, dtype=torch.float64, device=device)

    def update(self, batch_mean: Tensor, batch_var: Tensor, batch_count: Tensor) -> None:
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        squares = self.var * self.count + batch_var * batch_count + delta.square() * self.count * batch_count / total
        self.var = squares / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        # Tensors and floats only, so checkpoints load with torch.load(weights_only=True).
        return {"mean": self.mean.cpu(), "var": self.var.cpu(), "count": float(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.mean.device
        self.mean = torch.as_tensor(state["mean"], dtype=torch.float64).to(device)
        self.var = torch.as_tensor(state["var"], dtype=torch.float64).to(device)
        self.count = torch.tensor(float(state["count"]), dtype=torch.float64, device=device)


def _pooled_moments(samples: Tensor, all_reduce_sum: AllReduceSum) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, variance and count of `samples` (rows) pooled over all ranks, on the samples' device."""
    flat = samples.reshape(samples.shape[0], -1).double()
    count = flat.new_full((1,), flat.shape[0])  # filled on the device: a host value copied there would wait
    sums = torch.cat([count, flat.sum(0), flat.pow(2).sum(0)])
    sums = all_reduce_sum(sums)
    count = sums[0]
    width = flat.shape[1]
    mean = sums[1 : 1 + width] / count
    var = (sums[1 + width :] / count - mean.pow(2)).clamp_min(0.0)
    return mean, var, count


class ObservationNormalizer:
    def __init__(self, obs_dim: int, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.device = device
        self.moments = RunningMoments((obs_dim,), device)
        self._mean = torch.empty(obs_dim, dtype=torch.float32, device=device)
        self._scale = torch.empty(obs_dim, dtype=torch.float32, device=device)
        self._refresh()

    def _refresh(self) -> None:
        # In place: a CUDA graph that normalizes reads these tensors where they were when it was captured.
        self._mean.copy_(self.moments.mean)
        self._scale.copy_(1.0 / torch.sqrt(self.moments.var + EPSILON))

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
        self.moments.update(*_pooled_moments(raw_obs, all_reduce_sum))
        self._refresh()

    def state_dict(self) -> dict[str, Any]:
        return self.moments.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.load_state_dict(state)
        self._refresh()


class RewardScaler:
    """Divides rewards by the running std of each env's discounted return (as SB3's VecNormalize).

    The discounted returns run on the host, step by step, beside the envs; the rewards are divided
    on the rollout's device once the rollout is complete (the std is frozen during it), so that
    nothing is read back from a GPU."""

    def __init__(
        self,
        num_envs: int,
        gamma: float,
        enabled: bool,
        device: torch.device | None = None,
        moments: RunningMoments | None = None,
    ) -> None:
        """`moments`: the statistics of another scaler, shared with it (a group of a rank's envs has its own)."""
        self.enabled = enabled
        self.gamma = gamma
        self.moments = RunningMoments((), device or torch.device("cpu")) if moments is None else moments
        self.discounted_returns = np.zeros(num_envs)

    def track(self, rewards: np.ndarray, episode_ended: np.ndarray) -> np.ndarray:
        """The discounted returns after this step's rewards, which feed the next statistics update."""
        if not self.enabled:
            return self.discounted_returns
        self.discounted_returns = self.discounted_returns * self.gamma + rewards
        tracked = self.discounted_returns.copy()
        self.discounted_returns[episode_ended] = 0.0
        return tracked

    def scale(self, rewards: Tensor) -> Tensor:
        """`rewards` (float64, for the division to round as it always has) divided by the std and clipped."""
        if not self.enabled:
            return rewards
        return (rewards / torch.sqrt(self.moments.var + EPSILON)).clamp(-CLIP, CLIP)

    def sync_update(
        self, discounted_returns: Tensor, all_reduce_sum: AllReduceSum, samples: Tensor | None = None
    ) -> None:
        """`samples`: a mask of the returns that are samples (None: all are)."""
        if not self.enabled:
            return  # before the mask, which a boolean index reads on the host
        if samples is not None:
            discounted_returns = discounted_returns[samples]
        mean, var, count = _pooled_moments(discounted_returns.reshape(-1, 1), all_reduce_sum)
        self.moments.update(mean[0], var[0], count)

    def state_dict(self) -> dict[str, Any]:
        state = self.moments.state_dict()
        return {"mean": float(state["mean"]), "var": float(state["var"]), "count": state["count"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.load_state_dict(state)
