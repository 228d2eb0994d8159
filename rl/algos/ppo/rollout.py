"""PPO's experience: the rollout loop and generalized advantage estimation, shared by every mode."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl.algos.ppo.policy import ActorCritic, action_noise, action_shape_and_dtype
from rl.algos.ppo.recurrent import Memory, RecurrentActorCritic, initial_memory
from rl.batch import Column, TensorBatch
from rl.cuda_graphs import captured_function
from rl.envs import EnvSpaces
from rl.experience import GAME_SIGNAL, Collector, EnvStep, EpisodeLog, StateDependentExploration, TrainingSignal
from rl.normalization import AllReduceSum, ObservationNormalizer, RewardScaler
from rl.uploads import HostCopy, to_device

ROLLOUT_ENDS = ("next_obs", "next_value")  # where a rollout's envs ended up, set as it ends


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
    starts: Tensor  # recurrent: the observation begins an episode (the env's state zeroes before it); on the host
    memory: Tensor  # recurrent: each env's state when the rollout began, [N, 2, layers, hidden]; else empty
    next_obs: Tensor = field(default_factory=lambda: torch.empty(0))
    next_value: Tensor = field(default_factory=lambda: torch.empty(0))

    @property
    def recurrent(self) -> bool:
        return self.memory.numel() > 0

    def envs_view(self, envs: slice) -> Rollout:
        """The rollout of the envs in `envs`, sharing this one's memory: what a group of envs writes lands here."""

        def columns(tensor: Tensor) -> Tensor:
            return tensor[:, envs] if tensor.numel() else tensor

        view = {f.name: columns(getattr(self, f.name)) for f in fields(self) if f.name not in (*ROLLOUT_ENDS, "memory")}
        view["memory"] = self.memory[envs]  # [envs, ...], or empty
        if self.raw_obs is self.obs:
            view["raw_obs"] = view["obs"]  # one buffer without observation normalization, as in this rollout
        return Rollout(**view)

    @staticmethod
    def step_columns(spaces: EnvSpaces, normalizes_obs: bool) -> dict[str, Column]:
        """What a rollout holds for each env step: its buffers but a recurrent one's starts and memory (and without
        observation normalization, `raw_obs`, which is then `obs` itself)."""
        action_shape, action_dtype = action_shape_and_dtype(spaces.action_space)
        number, flag = Column(()), Column((), torch.bool)
        columns = {"obs": Column(spaces.obs_shape, spaces.obs_dtype), "actions": Column(action_shape, action_dtype)}
        columns |= {"logprobs": number, "values": number, "rewards": number, "terminated": flag, "truncated": flag}
        columns |= {"final_values": number, "discounted_returns": number, "is_transition": flag}
        if normalizes_obs:
            columns["raw_obs"] = Column(spaces.obs_shape)
        return columns

    @classmethod
    def allocate(
        cls,
        num_steps: int,
        num_envs: int,
        spaces: EnvSpaces,
        device: torch.device,
        normalizes_obs: bool,
        memory_shape: tuple[int, int] | None = None,
    ) -> Rollout:
        steps = (num_steps, num_envs)
        buffers = {
            name: torch.zeros((*steps, *column.shape), dtype=column.dtype, device=device)
            for name, column in cls.step_columns(spaces, normalizes_obs).items()
        }
        buffers.setdefault("raw_obs", buffers["obs"])  # the same buffer without observation normalization
        if memory_shape is None:
            starts, memory = torch.zeros(0, device=device), torch.zeros(0, device=device)
        else:  # starts on the host, where the envs report them: training plans its sequences' segments from them there
            starts = torch.zeros(steps, dtype=torch.bool)
            memory = torch.zeros((num_envs, 2, *memory_shape), device=device)
        return cls(**buffers, starts=starts, memory=memory)


class RolloutCollector(Collector):
    """Steps a vector env with the current policy and fills a `Rollout`, one per iteration.

    With `memory_shape` (layers, hidden) the policy is recurrent: the collector carries each env's
    state from step to step and across rollouts, and records where episodes start.
    """

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
        memory_shape: tuple[int, int] | None = None,
        exploration: StateDependentExploration | None = None,
        capture: bool = False,
        buffer: Rollout | None = None,
    ) -> None:
        """`buffer`: the rollout to fill (a group's view of a larger one), else one of its own."""
        self.num_steps = num_steps
        self.exploration = exploration
        on_gpu = device.type == "cuda"
        gae = functools.partial(compute_gae, gamma=gamma, gae_lambda=gae_lambda)
        self.advantages: Advantages = captured_function(gae) if capture and on_gpu else gae  # one CUDA graph
        if buffer is None:
            buffer = Rollout.allocate(num_steps, envs.num_envs, spaces, device, obs_normalizer.enabled, memory_shape)
        self.buffer = buffer
        # `capture`: each step's acting and its row of the rollout as one CUDA graph on a GPU (run as it is
        # elsewhere), the row found by a counter on the device, which the graph advances.
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)
        self.recorded_step: Callable[..., tuple[Tensor, ...]] | None = None
        if capture:
            self.recorded_step = captured_function(self._act_and_record) if on_gpu else self._act_and_record
        self._recording_policy: ActorCritic | RecurrentActorCritic | None = None
        # Recurrent: each env's state before its next observation, and whether that observation begins
        # an episode (`_set_starts`, first by the reset in `super().__init__`); `stepped_memory` is the
        # state after the current step's observation.
        self.memory: Memory | None = None
        if memory_shape is not None:
            layers, hidden = memory_shape
            self.memory = initial_memory(layers, envs.num_envs, hidden, device)
        self.stepped_memory = self.memory
        # Unscaled, in float64: the reward scaler divides them on the device once the rollout is complete.
        self._raw_rewards = np.zeros(tuple(self.buffer.rewards.shape), dtype=np.float64)
        self._env_side = {
            name: np.zeros(tuple(getattr(self.buffer, name).shape), dtype=dtype)
            for name, dtype in [
                ("discounted_returns", np.float32),
                ("terminated", np.bool_),
                ("truncated", np.bool_),
                ("is_transition", np.bool_),
            ]
        }
        super().__init__(envs, device, obs_normalizer, reward_scaler, env_seeds, generator, signal)

    def collect(self, policy: ActorCritic | RecurrentActorCritic, global_step: int = 0) -> EpisodeLog:
        """Run `num_steps` vector steps; the observation normalizer is frozen meanwhile."""
        buf, episodes = self.buffer, EpisodeLog()
        env_side = self._env_side  # numpy staging: cheaper per step than tensor writes
        if self.memory is not None:
            buf.memory.copy_(self.memory.permute(2, 0, 1, 3))  # the state each env begins the rollout with
        self.cursor.zero_()
        buf.final_values.zero_()  # the steps where a time limit cut an episode off get V(final observation)
        for step in range(self.num_steps):
            if self.memory is not None:  # where episodes start, as the envs reported them
                buf.starts[step] = torch.from_numpy(self.starts_on_host)
            if self.recorded_step is not None:
                action = self._record_step(policy, step)
            else:
                action = self._act_and_write(policy, step)
            stepped = self.step_envs(HostCopy(action).numpy())
            raw_next, reward, terminated, truncated, info, is_transition, _ = stepped
            self._raw_rewards[step] = reward
            env_side["discounted_returns"][step] = self.reward_scaler.track(reward, terminated | truncated)
            env_side["terminated"][step] = terminated
            env_side["truncated"][step] = truncated
            env_side["is_transition"][step] = is_transition
            cut_off = truncated & ~terminated
            if cut_off.any():
                buf.final_values[step] = self._truncation_values(policy, cut_off, raw_next, info)
            episodes.record(info)
            self.raw_obs = self.to_tensor(raw_next)
            self._advance_memory(stepped)

        for name, array in env_side.items():
            getattr(buf, name).copy_(to_device(array, self.device))
        buf.rewards.copy_(self.reward_scaler.scale(to_device(self._raw_rewards, self.device)))
        buf.next_obs = self.obs_normalizer(self.raw_obs)
        buf.next_value = self._value(policy, buf.next_obs, self.memory, self.starts)
        return episodes

    def _act_and_write(self, policy: ActorCritic | RecurrentActorCritic, step: int) -> Tensor:
        """Act on the current observation and write the step's row of the rollout; the action."""
        buf = self.buffer
        obs = self.obs_normalizer(self.raw_obs)
        action, logprob, value = self._act(policy, obs, step)
        if buf.raw_obs is not buf.obs:  # one buffer without observation normalization
            buf.raw_obs[step] = self.raw_obs
        buf.obs[step] = obs
        buf.actions[step] = action
        buf.logprobs[step] = logprob
        buf.values[step] = value
        return action

    def _record_step(self, policy: ActorCritic | RecurrentActorCritic, step: int) -> Tensor:
        """`_act_and_write` through `recorded_step`, which draws no random number: its noise is drawn here."""
        assert self.recorded_step is not None
        if self._recording_policy is not policy:  # a graph holds the weights it was captured with, in place
            assert self._recording_policy is None, "a collector records the steps of one policy"
            self._recording_policy = policy
        exploration = None
        if self.exploration is not None:
            exploration = self.exploration.for_step(policy, step, self.envs.num_envs, self.generator)
        noise = action_noise(policy.action_head, self.envs.num_envs, self.generator, exploration)
        if self.memory is None:
            (action,) = self.recorded_step(self.raw_obs, *noise)
            return action
        action, self.stepped_memory = self.recorded_step(self.raw_obs, self.memory, self.starts, *noise)
        return action

    @torch.no_grad()
    def _act_and_record(self, raw_obs: Tensor, *inputs: Tensor) -> tuple[Tensor, ...]:
        """The step `_act_and_write` takes, as a function of its inputs: the row goes where the device-side
        cursor points, and the cursor moves on (nothing here reads a value on the host). `inputs`: the noise;
        a recurrent policy's state and starts before it, and its next state returned after the action."""
        buf, policy = self.buffer, self._recording_policy
        obs = self.obs_normalizer(raw_obs)
        carried: tuple[Tensor, ...] = ()
        if isinstance(policy, RecurrentActorCritic):
            action, logprob, value, next_memory = policy.act_with_noise(obs, *inputs)
            carried = (next_memory,)
        else:
            assert policy is not None
            action, logprob, value = policy.act_with_noise(obs, *inputs)
        rows = [(buf.obs, obs), (buf.actions, action), (buf.logprobs, logprob), (buf.values, value)]
        if buf.raw_obs is not buf.obs:
            rows.append((buf.raw_obs, raw_obs))
        for column, row in rows:
            column.index_copy_(0, self.cursor, row.unsqueeze(0).to(column.dtype))
        self.cursor.add_(1)
        return (action, *carried)

    def _act(self, policy: ActorCritic | RecurrentActorCritic, obs: Tensor, step: int) -> tuple[Tensor, Tensor, Tensor]:
        exploration = None
        if self.exploration is not None:
            exploration = self.exploration.for_step(policy, step, self.envs.num_envs, self.generator)
        if self.memory is None:
            assert isinstance(policy, ActorCritic)
            return policy.act(obs, self.generator, exploration)
        assert isinstance(policy, RecurrentActorCritic)
        action, logprob, value, self.stepped_memory = policy.act(
            obs, self.generator, self.memory, self.starts, exploration
        )
        return action, logprob, value

    def _advance_memory(self, stepped: EnvStep) -> None:
        """The stepped state carries over; an env whose next observation begins an episode zeroes it first."""
        if self.memory is not None:
            self.memory = self.stepped_memory
            self._set_starts(self.episode_begins(stepped))

    def _set_starts(self, starts: np.ndarray) -> None:
        """Which envs' next observations begin an episode: on the host for the rollout, on the device for acting."""
        self.starts_on_host = starts.copy()
        self.starts = to_device(starts, self.device)

    @staticmethod
    def _value(
        policy: ActorCritic | RecurrentActorCritic, obs: Tensor, memory: Memory | None, starts: Tensor
    ) -> Tensor:
        with torch.no_grad():
            return policy.value(obs) if memory is None else policy.value(obs, memory, starts)

    def _truncation_values(
        self, agent: ActorCritic | RecurrentActorCritic, bootstrap: np.ndarray, raw_next: np.ndarray, info: dict
    ) -> Tensor:
        """V(final observation) for envs cut off by a time limit, 0 for the others: their return continues (a
        recurrent policy's value takes the state carried to that observation)."""
        index = np.flatnonzero(bootstrap)
        final_obs = self.obs_normalizer(self.to_tensor(self.final_observations(raw_next, info, index)))
        on_device = to_device(index, self.device)
        memory = None if self.stepped_memory is None else self.stepped_memory[:, :, on_device]
        values = torch.zeros(self.envs.num_envs, device=self.device)
        values[on_device] = self._value(
            agent, final_obs, memory, torch.zeros(len(index), dtype=torch.bool, device=self.device)
        )
        return values

    def reset_envs(self, seeds: list[int]) -> None:
        super().reset_envs(seeds)
        self._set_starts(np.ones(self.envs.num_envs, dtype=bool))  # all fresh episodes

    def capture_state(self) -> dict[str, Any]:
        state = super().capture_state()
        if self.memory is not None:
            state |= {"memory": self.memory.cpu(), "starts": torch.from_numpy(self.starts_on_host.copy())}
        return state

    def restore_state(self, state: dict[str, Any], fresh_seeds: list[int]) -> bool:
        restored = super().restore_state(state, fresh_seeds)
        if restored and self.memory is not None:  # envs mid-episode go on with the state they had
            self.memory = state["memory"].to(self.device)
            self._set_starts(state["starts"].numpy())
        return restored

    def next_batch(self, global_step: int, all_reduce_sum: AllReduceSum) -> Batch:
        return self.batch_of(self.buffer, all_reduce_sum)

    def batch_of(self, rollout: Rollout, all_reduce_sum: AllReduceSum) -> Batch:
        """Fold `rollout` into the pooled normalization statistics, then compute its advantages."""
        self.sync_normalizers(rollout, all_reduce_sum)
        return rollout_to_batch(rollout, self.advantages)

    def batch_stats(self, batch: Batch) -> dict[str, Tensor]:
        return {"explained_variance": explained_variance(batch.values, batch.returns)}

    def sync_normalizers(self, rollout: Rollout, all_reduce_sum: AllReduceSum) -> None:
        """Fold this rollout into the normalization statistics, pooled over all ranks."""
        self.obs_normalizer.sync_update(rollout.raw_obs.flatten(0, 1), all_reduce_sum)
        # A reset step's return is a placeholder 0, not a sample.
        samples = rollout.is_transition if self.resets_next_step else None
        self.reward_scaler.sync_update(rollout.discounted_returns, all_reduce_sum, samples)


def explained_variance(predictions: Tensor, targets: Tensor) -> Tensor:
    """1 - Var[targets - predictions] / Var[targets]; NaN when the targets do not vary. A tensor on their device:
    the host reads it with the other statistics, once per report."""
    target_var = targets.var()
    return torch.where(target_var == 0, torch.nan, 1.0 - (targets - predictions).var() / target_var)


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
    """Advantages and returns for `[T, N]` tensors, computed where the tensors are.

    An episode end (either kind) stops the backup at that step. A truncated step's return
    continues past the cut through gamma * V(final observation); a terminated one's does not.
    The arithmetic is in float64. The backward recursion's T tiny steps run on numpy views of
    CPU tensors (a third of torch's cost per op there), and as torch ops on a GPU, so that the
    rollout never travels to the host and back.
    """
    rewards, values64, final_values, next_value = (
        t.detach().to(torch.float64) for t in (rewards, values, final_values, next_value)
    )
    rewards = rewards + gamma * final_values * (truncated & ~terminated)
    continues = (~(terminated | truncated)).to(torch.float64)
    next_values = torch.cat([values64[1:], next_value[None]])
    deltas = rewards + gamma * next_values * continues - values64
    discounts = gamma * gae_lambda * continues
    advantages = torch.empty_like(deltas)
    steps: tuple[Any, ...] = (deltas, discounts, advantages)
    if deltas.device.type == "cpu":
        steps = tuple(tensor.numpy() for tensor in steps)  # views: writing them writes `advantages`
    step_deltas, step_discounts, step_advantages = steps
    running: Any = 0.0
    for t in range(len(step_deltas) - 1, -1, -1):
        running = step_deltas[t] + step_discounts[t] * running
        step_advantages[t] = running
    advantages = advantages.to(values.dtype)
    return advantages, advantages + values


# (rewards, values, terminated, truncated, final values, next value) -> (advantages, returns)
Advantages = Callable[..., tuple[Tensor, ...]]


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

    def model_inputs(self) -> tuple[Tensor, ...]:
        """What the actor-critic's forward takes to score these rows' actions."""
        return self.obs, self.actions

    def minibatches(self, epoch: list[list[int]]) -> list[Batch]:
        """One batch per list of row indices: one gather for the whole epoch, then views of it (a column on the
        host, such as a sequence's starts, is gathered there)."""
        flat = [row for rows in epoch for row in rows]
        order = {device: to_device(flat, device) for device in {column.device for column in self.tensors()}}
        sizes = [len(rows) for rows in epoch]
        columns = {}
        for name, column in zip([f.name for f in fields(self)], self.tensors(), strict=True):
            columns[name] = column[order[column.device]].split(sizes)
        return [type(self)(**{name: parts[i] for name, parts in columns.items()}) for i in range(len(sizes))]


@dataclass
class SequenceBatch(Batch):
    """A recurrent policy's training data: one row per env, each column [envs, steps, ...], with where
    episodes start and the state each sequence began with; minibatches take whole sequences."""

    starts: Tensor  # on the host, which plans each minibatch's segments from them (`replay_lstm`); a replay in
    # steps takes them on the device
    memory: Tensor  # [envs, 2, layers, hidden]

    def model_inputs(self) -> tuple[Tensor, ...]:
        return self.obs, self.actions, self.starts, self.memory


def rollout_to_batch(rollout: Rollout, advantages_of: Advantages) -> Batch:
    """The rollout's rows with their advantages: one per transition, or one sequence per env (recurrent)."""
    advantages, returns = advantages_of(
        rollout.rewards,
        rollout.values,
        rollout.terminated,
        rollout.truncated,
        rollout.final_values,
        rollout.next_value,
    )
    columns = {
        "obs": rollout.obs,
        "actions": rollout.actions,
        "logprobs": rollout.logprobs,
        "values": rollout.values,
        "advantages": advantages,
        "returns": returns,
        "is_transition": rollout.is_transition,
    }
    if rollout.recurrent:
        sequences = {name: steps.transpose(0, 1) for name, steps in columns.items()}  # [T, N] -> [N, T]
        return SequenceBatch(**sequences, starts=rollout.starts.transpose(0, 1), memory=rollout.memory)
    return Batch(**{name: steps.flatten(0, 1) for name, steps in columns.items()})
