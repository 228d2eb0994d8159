"""PPO's experience: the rollout loop and generalized advantage estimation, shared by every mode."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl.algos.ppo.policy import ActorCritic, action_shape_and_dtype
from rl.batch import TensorBatch
from rl.envs import EnvSpaces
from rl.experience import GAME_SIGNAL, EpisodeLog, ExperienceSource, TrainingSignal
from rl.normalization import AllReduceSum, ObservationNormalizer, RewardScaler


@dataclass
class Rollout:
    """`num_steps` x `num_envs` transitions; the buffers are allocated once and refilled."""

    obs: Tensor  # normalized observations the policy acted on
    actions: Tensor  # unclipped samples
    logprobs: Tensor  # of the behaviour policy
    values: Tensor
    rewards: Tensor  # after reward scaling
    terminated: Tensor
    truncated: Tensor
    final_values: Tensor  # V(final observation) where an episode was truncated, else 0
    raw_obs: Tensor  # unnormalized, for the normalizer's statistics
    discounted_returns: Tensor  # for the reward scaler's statistics
    is_transition: Tensor  # False on a NEXT_STEP env's reset step, which trains nothing
    next_obs: Tensor = field(default_factory=lambda: torch.empty(0))
    next_value: Tensor = field(default_factory=lambda: torch.empty(0))

    @classmethod
    def allocate(
        cls, num_steps: int, num_envs: int, spaces: EnvSpaces, device: torch.device, normalizes_obs: bool
    ) -> Rollout:
        action_shape, action_dtype = action_shape_and_dtype(spaces.action_space)
        steps = (num_steps, num_envs)

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        obs = zeros(*steps, *spaces.obs_shape, dtype=spaces.obs_dtype)
        return cls(
            obs=obs,
            actions=zeros(*steps, *action_shape, dtype=action_dtype),
            logprobs=zeros(*steps),
            values=zeros(*steps),
            rewards=zeros(*steps),
            terminated=zeros(*steps, dtype=torch.bool),
            truncated=zeros(*steps, dtype=torch.bool),
            final_values=zeros(*steps),
            raw_obs=zeros(*steps, *spaces.obs_shape) if normalizes_obs else obs,  # the same without normalization
            discounted_returns=zeros(*steps),
            is_transition=zeros(*steps, dtype=torch.bool),
        )


class RolloutCollector(ExperienceSource):
    """Steps a vector env with the current policy and fills a `Rollout`, one per iteration."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        num_steps: int,
        spaces: EnvSpaces,
        device: torch.device,
        obs_normalizer: ObservationNormalizer,
        reward_scaler: RewardScaler,
        env_seeds: list[int],
        generator: torch.Generator,
        gamma: float,
        gae_lambda: float,
        signal: TrainingSignal = GAME_SIGNAL,
    ) -> None:
        self.num_steps = num_steps
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.buffer = Rollout.allocate(num_steps, envs.num_envs, spaces, device, obs_normalizer.enabled)
        self._env_side = {
            name: np.zeros(tuple(getattr(self.buffer, name).shape), dtype=dtype)
            for name, dtype in [
                ("rewards", np.float32),
                ("discounted_returns", np.float32),
                ("terminated", np.bool_),
                ("truncated", np.bool_),
                ("is_transition", np.bool_),
            ]
        }
        super().__init__(envs, device, obs_normalizer, reward_scaler, env_seeds, generator, signal)

    def collect(self, policy: ActorCritic, global_step: int = 0) -> EpisodeLog:
        """Run `num_steps` vector steps; the observation normalizer is frozen meanwhile."""
        buf, episodes = self.buffer, EpisodeLog()
        env_side = self._env_side  # numpy staging: cheaper per step than tensor writes
        for step in range(self.num_steps):
            obs = self.obs_normalizer(self.raw_obs)
            action, logprob, value = policy.act(obs, self.generator)
            raw_next, reward, terminated, truncated, info, is_transition, _ = self.step_envs(action.cpu().numpy())
            env_side["rewards"][step], env_side["discounted_returns"][step] = self.reward_scaler(
                reward, terminated | truncated
            )
            env_side["terminated"][step] = terminated
            env_side["truncated"][step] = truncated
            env_side["is_transition"][step] = is_transition
            if buf.raw_obs is not buf.obs:  # one buffer without observation normalization
                buf.raw_obs[step] = self.raw_obs
            buf.obs[step] = obs
            buf.actions[step] = action
            buf.logprobs[step] = logprob
            buf.values[step] = value
            buf.final_values[step] = self._truncation_values(policy, truncated & ~terminated, raw_next, info)
            episodes.record(info)
            self.raw_obs = self.to_tensor(raw_next)

        for name, array in env_side.items():
            getattr(buf, name).copy_(torch.from_numpy(array))
        buf.next_obs = self.obs_normalizer(self.raw_obs)
        with torch.no_grad():
            buf.next_value = policy.value(buf.next_obs)
        return episodes

    def _truncation_values(
        self, agent: ActorCritic, bootstrap: np.ndarray, raw_next: np.ndarray, info: dict
    ) -> Tensor | float:
        """V(final observation) for envs cut off by a time limit: their return continues."""
        if not bootstrap.any():
            return 0.0
        index = np.flatnonzero(bootstrap)
        final_obs = self.final_observations(raw_next, info, index)
        values = torch.zeros(self.envs.num_envs, device=self.device)
        with torch.no_grad():
            values[index] = agent.value(self.obs_normalizer(self.to_tensor(final_obs)))
        return values

    def next_batch(self, global_step: int, all_reduce_sum: AllReduceSum) -> Batch:
        """Fold the rollout into the pooled normalization statistics, then compute its advantages."""
        self.sync_normalizers(self.buffer, all_reduce_sum)
        return rollout_to_batch(self.buffer, self.gamma, self.gae_lambda)

    def batch_stats(self, batch: Batch) -> dict[str, float]:
        return {"explained_variance": explained_variance(batch.values, batch.returns)}

    def sync_normalizers(self, rollout: Rollout, all_reduce_sum: AllReduceSum) -> None:
        """Fold this rollout into the normalization statistics, pooled over all ranks."""
        self.obs_normalizer.sync_update(rollout.raw_obs.flatten(0, 1), all_reduce_sum)
        returns = rollout.discounted_returns
        if self.resets_next_step:
            returns = returns[rollout.is_transition]  # a reset step's return is a placeholder 0, not a sample
        self.reward_scaler.sync_update(returns, all_reduce_sum)


def explained_variance(predictions: Tensor, targets: Tensor) -> float:
    """1 - Var[targets - predictions] / Var[targets]; NaN when the targets do not vary."""
    target_var = targets.var()
    if target_var == 0:
        return float("nan")
    return float(1.0 - (targets - predictions).var() / target_var)


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    final_values: Tensor,
    next_value: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns for `[T, N]` tensors.

    An episode end (either kind) stops the backup at that step. A truncated step's return
    continues past the cut through gamma * V(final observation); a terminated one's does not.
    The backward recursion runs in numpy: T tiny steps cost far less there than as torch ops.
    """
    as_numpy = [t.detach().cpu().double().numpy() for t in (rewards, values, final_values, next_value)]
    rewards_np, values_np, final_values_np, next_value_np = as_numpy
    terminated_np, truncated_np = terminated.cpu().numpy(), truncated.cpu().numpy()
    rewards_np = rewards_np + gamma * final_values_np * (truncated_np & ~terminated_np)
    continues = (~(terminated_np | truncated_np)).astype(np.float64)
    next_values = np.concatenate([values_np[1:], next_value_np[None]])
    deltas = rewards_np + gamma * next_values * continues - values_np
    advantages = np.zeros_like(rewards_np)
    running = np.zeros_like(next_value_np)
    for t in reversed(range(rewards_np.shape[0])):
        running = deltas[t] + gamma * gae_lambda * continues[t] * running
        advantages[t] = running
    advantages_t = torch.from_numpy(advantages).to(device=values.device, dtype=values.dtype)
    return advantages_t, advantages_t + values


@dataclass
class Batch(TensorBatch):
    """Flat training data: one row per transition."""

    obs: Tensor
    actions: Tensor
    logprobs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    is_transition: Tensor  # False: a NEXT_STEP env's reset step, left out of every loss

    def minibatches(self, epoch: list[list[int]]) -> list[Batch]:
        """One `Batch` per list of row indices: one gather for the whole epoch, then views of it."""
        order = torch.as_tensor([row for rows in epoch for row in rows], device=self.obs.device)
        sizes = [len(rows) for rows in epoch]
        columns = {f.name: getattr(self, f.name)[order].split(sizes) for f in fields(self)}
        return [Batch(**{name: parts[i] for name, parts in columns.items()}) for i in range(len(sizes))]


def rollout_to_batch(rollout: Rollout, gamma: float, gae_lambda: float) -> Batch:
    advantages, returns = compute_gae(
        rollout.rewards,
        rollout.values,
        rollout.terminated,
        rollout.truncated,
        rollout.final_values,
        rollout.next_value,
        gamma,
        gae_lambda,
    )
    num_rows = rollout.rewards.numel()
    return Batch(
        obs=rollout.obs.reshape(num_rows, *rollout.obs.shape[2:]),
        actions=rollout.actions.reshape(num_rows, *rollout.actions.shape[2:]),
        logprobs=rollout.logprobs.reshape(-1),
        values=rollout.values.reshape(-1),
        advantages=advantages.reshape(-1),
        returns=returns.reshape(-1),
        is_transition=rollout.is_transition.reshape(-1),
    )
