"""SAC's experience: each rank's envs stepped by the actor, their transitions in its replay buffer, and
the batches sampled from it for the learner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl.algos.sac.config import SACConfig
from rl.algos.sac.networks import SquashedGaussianActor
from rl.algos.sac.replay import ReplayBuffer
from rl.batch import Column, TensorBatch
from rl.envs import EnvSpaces
from rl.experience import Collector, EnvStep, EpisodeLog, StateDependentExploration, TrainingSignal
from rl.normalization import AllReduceSum, ObservationNormalizer, RewardScaler
from rl.seeds import (
    ACTION_STREAM,
    REPLAY_STREAM,
    env_seeds,
    seeded_generator,
)
from rl.uploads import HostCopy, to_device


@dataclass
class Transitions(TensorBatch):
    """Replayed transitions; `next_obs` is the true final observation where an episode ended."""

    obs: Tensor
    actions: Tensor
    rewards: Tensor
    next_obs: Tensor
    terminated: Tensor  # 1.0 where the episode terminated (no bootstrap); truncation keeps it


def transition_columns(spaces: EnvSpaces) -> dict[str, Column]:
    action_dim = int(spaces.action_space.shape[0])
    obs = Column(spaces.obs_shape, spaces.obs_dtype)  # images stay uint8 in the buffer
    return {
        "obs": obs,
        "actions": Column((action_dim,)),
        "rewards": Column(()),
        "next_obs": obs,
        "terminated": Column(()),
    }


class ReplayCollector(Collector):
    """Steps the envs `train_freq` times per iteration into a replay buffer, and samples batches from it."""

    def __init__(
        self,
        cfg: SACConfig,
        envs: gym.vector.VectorEnv,
        action_space: gym.spaces.Box,
        buffer: ReplayBuffer,
        rank: int,
        env_ranks: int,
        batch_rows: int,
        device: torch.device,
        signal: TrainingSignal,
        exploration: StateDependentExploration | None = None,
    ) -> None:
        self.cfg, self.buffer, self.batch_rows = cfg, buffer, batch_rows
        self.exploration = exploration
        self.steps_per_vector_step = cfg.num_envs * env_ranks  # global env steps per step of this rank's envs
        self.rows_before_training = cfg.batch_size
        self.sampler = seeded_generator(device, cfg.seed, REPLAY_STREAM, rank)
        space = action_space  # the env's own bounds: ClipAction widens the vector env's to +-inf
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
        self.action_range = torch.as_tensor(space.high - space.low, dtype=torch.float32, device=device)
        disabled_normalizer = ObservationNormalizer(buffer.columns["obs"].width, False, device)
        super().__init__(
            envs,
            device,
            disabled_normalizer,
            RewardScaler(cfg.num_envs, cfg.gamma, False),
            env_seeds(cfg.seed, rank, cfg.num_envs),
            seeded_generator(device, cfg.seed, ACTION_STREAM, rank),
            signal,
        )

    def collect(self, policy: SquashedGaussianActor, global_step: int) -> EpisodeLog:
        return self.collect_phase(policy, global_step)

    def collect_and_learn(
        self, policy: SquashedGaussianActor, global_step: int, learn: Callable[[], None]
    ) -> EpisodeLog:
        if not self.cfg.update_while_stepping:
            return super().collect_and_learn(policy, global_step, learn)
        return self.collect_phase(policy, global_step, learn)

    def collect_phase(
        self, policy: SquashedGaussianActor, global_step: int, while_last_step: Callable[[], None] | None = None
    ) -> EpisodeLog:
        """`train_freq` vector steps; `while_last_step` runs after the last step's actions are queued, before
        the host waits for them: on a GPU, what it launches runs while the envs step."""
        episodes = EpisodeLog()
        for step in range(self.cfg.train_freq):
            actions = self.actions(policy, step, global_step)
            on_host = HostCopy(actions)
            if while_last_step is not None and step == self.cfg.train_freq - 1:
                while_last_step()
            stepped = self.step_envs(on_host.numpy())
            self.store(actions, stepped)
            episodes.record(stepped.info)
            global_step += self.steps_per_vector_step
        return episodes

    def actions(self, policy: SquashedGaussianActor, step: int, global_step: int) -> Tensor:
        """The actions of the phase's `step`: uniform over the action space until --learning-starts (as SB3 and
        CleanRL), then the policy's."""
        if global_step < self.cfg.learning_starts:
            return self.action_low + self.action_range * torch.rand(
                (self.envs.num_envs, *self.action_low.shape), generator=self.generator, device=self.device
            )
        exploration = None
        if self.exploration is not None:
            exploration = self.exploration.for_step(policy, step, self.envs.num_envs, self.generator)
        actions, _ = policy.act(self.raw_obs, self.generator, exploration)
        return actions

    def store(self, actions: Tensor, stepped: EnvStep) -> None:
        """The step's transitions into the buffer; the next observations become the ones to act on."""
        led_to = self.led_to(stepped.next_obs, stepped.ended, stepped.info)
        observed = self.to_tensor(stepped.next_obs)
        # Two uploads where no episode ended (the next observation is the one the transition led to), and the
        # rewards and terminated flags as one.
        rewards_and_terminated = np.stack([stepped.reward, stepped.terminated], dtype=np.float32)
        on_device = to_device(rewards_and_terminated, self.device)
        self.buffer.add(
            obs=self.raw_obs,
            actions=actions,
            rewards=on_device[0],
            next_obs=observed if led_to is stepped.next_obs else self.to_tensor(led_to),
            terminated=on_device[1],
        )
        self.raw_obs = observed

    def next_batch(self, global_step: int, all_reduce_sum: AllReduceSum) -> Transitions | None:
        if global_step <= self.cfg.learning_starts or len(self.buffer) < self.rows_before_training:
            return None
        return Transitions(**self.buffer.sample(self.batch_rows, self.sampler))

    def capture_state(self) -> dict[str, Any]:
        state = super().capture_state() | {"sampler": self.sampler.get_state()}
        if self.cfg.save_buffer:
            state["buffer"] = self.buffer.state_dict()
        return state

    def restore_state(self, state: dict[str, Any], fresh_seeds: list[int]) -> bool:
        self.sampler.set_state(state["sampler"])
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])
        else:
            self.refill_before_training()
        return super().restore_state(state, fresh_seeds)

    def take_share(self, saved: list[dict[str, Any]], rank: int, ranks: int) -> str:
        buffers = [state.get("buffer") for state in saved]
        if any(buffer is None for buffer in buffers):
            self.refill_before_training()
            return (
                "; the replay buffers were not saved (--save-buffer): each refills its share of --learning-starts "
                f"{self.cfg.learning_starts:,} transitions before training again"
            )
        self.buffer.load_share(buffers, rank, ranks)  # type: ignore[arg-type]
        return f"; the replay buffers' {sum(buffer['size'] for buffer in buffers):,} transitions are shared out"

    def refill_before_training(self) -> None:
        """Refill this rank's share of --learning-starts rows, acting with the policy, before training again:
        gradient steps on the first few hundred rows would fit the critics to those alone."""
        share = -(-self.cfg.learning_starts * self.cfg.num_envs // self.steps_per_vector_step)
        self.rows_before_training = max(self.cfg.batch_size, share)
