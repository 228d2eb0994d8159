"""SAC behind the algorithm interface: what it builds (networks, learner, replay collector) and checks."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rl.algos.base import Algorithm
from rl.algos.sac.collector import ReplayCollector, Transitions, transition_columns
from rl.algos.sac.config import SACConfig
from rl.algos.sac.learner import SACLearner
from rl.algos.sac.networks import SquashedGaussianActor
from rl.algos.sac.replay import ReplayBuffer, check_buffer_fits, check_buffer_holds
from rl.batch import DataShard, RowCodec, shard_sizes
from rl.encoders import FlatPixels, image_encoder
from rl.envs import EnvSpaces
from rl.errors import UsageError
from rl.runtime import Runtime
from rl.seeds import env_seeds


class SAC(Algorithm):
    config_type = SACConfig
    name = SACConfig.ALGORITHM
    stat_tags: ClassVar[dict[str, str]] = {
        "critic_loss": "Loss/critic_loss",
        "actor_loss": "Loss/actor_loss",
        "alpha_loss": "Loss/alpha_loss",
        "entropy": "Loss/entropy",
        "q_values": "Info/q_values",
        "alpha": "Info/alpha",
        "gradient_step_ms": "Time/gradient_step_ms",
    }
    cfg: SACConfig

    @classmethod
    def check_spaces(cls, spaces: EnvSpaces) -> None:
        action_space, env_id = spaces.action_space, spaces.env_id
        if not isinstance(action_space, gym.spaces.Box):
            raise UsageError(
                "--env-id",
                f"SAC needs continuous (Box) actions, but {env_id} has {type(action_space).__name__} actions; "
                "train it with PPO instead (no 'sac' subcommand, or a PPOConfig)",
            )
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise UsageError(
                "--env-id",
                f"SAC squashes actions into the action bounds, but {env_id}'s are not finite "
                f"({action_space}); wrap the env with finite bounds (gymnasium's RescaleAction), or use PPO",
            )

    def check_memory(self, env_ranks: int, processes_here: int, gpu: int | None) -> None:
        check_buffer_fits(self.capacity_per_rank(env_ranks), transition_columns(self.spaces), processes_here, gpu)

    def check_rank_states(self, rank_states: list[dict[str, Any]], env_ranks: int) -> None:
        capacity = self.capacity_per_rank(env_ranks)
        for state in rank_states:
            if "buffer" in state:
                check_buffer_holds(state["buffer"]["size"], capacity)

    def capacity_per_rank(self, env_ranks: int) -> int:
        """Each rank that runs envs holds its share of --buffer-size, as in the DSAC reference."""
        return max(self.cfg.buffer_size // env_ranks, self.cfg.batch_size)

    def build_policy(self, device: torch.device) -> nn.Module:
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every rank and in every mode
        spaces = self.spaces
        encoder = image_encoder(spaces.observation_space) if self.cnn else FlatPixels() if spaces.pixels else None
        actor = SquashedGaussianActor(
            spaces.obs_dim,
            spaces.action_space,
            self.cfg.net_arch,
            encoder,
            self.precision(device),
            self.cfg.use_sde,
            self.cfg.log_std_init,
        )
        if self.cfg.compile:
            actor.compile_acting(self.cfg.compile_mode)
        if self.cfg.cuda_graphs and device.type == "cuda":
            actor.capture_acting()
        return actor.to(device)

    def make_source(
        self, rank: int, device: torch.device, video_dir: str | None, env_ranks: int, batch_rows: int
    ) -> ReplayCollector:
        buffer = ReplayBuffer(self.capacity_per_rank(env_ranks), transition_columns(self.spaces), device)
        envs = self.make_envs(video_dir, env_seeds(self.cfg.seed, rank, self.cfg.num_envs)[0])
        return ReplayCollector(
            self.cfg,
            envs,
            self.spaces.action_space,
            buffer,
            rank,
            env_ranks,
            batch_rows,
            device,
            self.training_signal(),
            self.exploration(),
        )

    def make_learner(self, policy: nn.Module, runtime: Runtime, shard: DataShard, env_ranks: int) -> SACLearner:
        assert isinstance(policy, SquashedGaussianActor)
        return SACLearner(self.cfg, policy, runtime, shard)

    def batch_rows(self, learners_fed: int) -> int:
        return self.cfg.gradient_steps * self.cfg.batch_size * learners_fed

    def rows_per_source(self, learners_fed: int, num_sources: int) -> list[int]:
        """The learners' batch, sampled in near-equal parts from each source's replay buffer."""
        return shard_sizes(self.batch_rows(learners_fed), num_sources)

    def batch_codec(self) -> RowCodec:
        return RowCodec(Transitions, transition_columns(self.spaces))
