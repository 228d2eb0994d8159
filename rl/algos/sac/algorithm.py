"""SAC behind the algorithm interface: replay experience, twin critics, a tuned temperature."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl.algos.base import Algorithm, Learner
from rl.algos.sac.config import AUTO, SACConfig
from rl.algos.sac.losses import actor_loss, critic_loss, soft_target, temperature_loss
from rl.algos.sac.networks import CriticEnsemble, SquashedGaussianActor
from rl.algos.sac.replay import ReplayBuffer, check_buffer_fits
from rl.batch import Column, DataShard, RowCodec, TensorBatch, shard_sizes, shard_slice
from rl.compiling import compiled
from rl.encoders import FlatPixels, NatureCNN
from rl.envs import EnvSpaces
from rl.errors import UsageError
from rl.experience import EpisodeLog, ExperienceSource, StateDependentExploration, TrainingSignal
from rl.normalization import AllReduceSum, ObservationNormalizer, RewardScaler
from rl.optim import FlatGradients, clip_grad_norm, optimizer_steps
from rl.runtime import Runtime
from rl.seeds import (
    ACTION_STREAM,
    CRITIC_STREAM,
    LEARNER_STREAM,
    REPLAY_STREAM,
    derive_seed,
    env_seeds,
    seeded_generator,
)


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


class ReplayCollector(ExperienceSource):
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
        episodes = EpisodeLog()
        for step in range(self.cfg.train_freq):
            if global_step < self.cfg.learning_starts:  # uniform exploration first, as SB3 and CleanRL
                actions = self.action_low + self.action_range * torch.rand(
                    (self.envs.num_envs, *self.action_low.shape), generator=self.generator, device=self.device
                )
            else:
                exploration = None
                if self.exploration is not None:
                    exploration = self.exploration.for_step(policy, step, self.envs.num_envs, self.generator)
                actions, _ = policy.act(self.raw_obs, self.generator, exploration)
            next_obs, rewards, terminated, _, info, _, ended = self.step_envs(actions.cpu().numpy())
            self.buffer.add(
                obs=self.raw_obs,
                actions=actions,
                rewards=torch.as_tensor(rewards, dtype=torch.float32, device=self.device),
                next_obs=self.to_tensor(self.led_to(next_obs, ended, info)),
                terminated=torch.as_tensor(terminated, dtype=torch.float32, device=self.device),
            )
            episodes.record(info)
            self.raw_obs = self.to_tensor(next_obs)
            global_step += self.steps_per_vector_step
        return episodes

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
            # Refill this rank's share of --learning-starts rows, acting with the policy, before training
            # again: gradient steps on the first few hundred rows would fit the critics to those alone.
            share = -(-self.cfg.learning_starts * self.cfg.num_envs // self.steps_per_vector_step)
            self.rows_before_training = max(self.cfg.batch_size, share)
        return super().restore_state(state, fresh_seeds)


class StatMeans:
    """Per-step statistics kept as tensors and averaged once per update: no host sync per step."""

    def __init__(self) -> None:
        self.values: dict[str, list[Tensor]] = {}

    def add(self, **stats: Tensor) -> None:
        for name, value in stats.items():
            self.values.setdefault(name, []).append(value.detach().reshape(()))

    def means(self) -> dict[str, Tensor]:
        return {name: torch.stack(values).mean() for name, values in self.values.items()}


class SACLearner(Learner):
    """Twin critics with Polyak targets, a squashed-Gaussian actor and (optionally) a tuned temperature.

    A gradient step takes the critics', the actor's and the temperature's losses from the same
    parameters, as the original SAC implementation does (Stable-Baselines3 and CleanRL update
    the critics first and show the actor the updated ones). The three gradients are separate by
    construction: the critics' target carries no gradient, the actor sees the critics through
    detached weights, the temperature a detached log-prob. So one backward pass writes them
    all into one flat buffer, and one collective per gradient step averages them across
    learners, where DDP would need one per module and a wait for the critics' update.
    """

    CRITIC, ACTOR = 0, 1  # the gradient buffer's groups: the critics, then the actor and the temperature

    def __init__(self, cfg: SACConfig, actor: SquashedGaussianActor, runtime: Runtime, shard: DataShard):
        super().__init__(actor)
        self.cfg, self.shard, self.runtime = cfg, shard, runtime
        device = runtime.device
        lr_scale = runtime.world_size if cfg.scale_lr else 1
        torch.manual_seed(derive_seed(cfg.seed, CRITIC_STREAM))  # the same critics on every learner
        self.critic = CriticEnsemble(actor.feature_dim, actor.action_dim, cfg.net_arch, precision=actor.precision).to(
            device
        )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        # An image encoder belongs to the critics' side: their loss trains it, their target has a copy.
        self.encoder_parameters = [] if actor.encoder is None else list(actor.encoder.parameters())
        self.target_encoder = copy.deepcopy(actor.encoder).requires_grad_(False) if self.encoder_parameters else None
        critic_side = [*self.critic.parameters(), *self.encoder_parameters]
        self.target_entropy = -float(actor.action_dim) if cfg.target_entropy == AUTO else float(cfg.target_entropy)
        self.log_alpha = torch.zeros(1, device=device, requires_grad=cfg.autotune)
        self.fixed_alpha = torch.tensor([1.0 if cfg.autotune else float(cfg.ent_coef)], device=device)
        temperature = [self.log_alpha] if cfg.autotune else []
        self.gradients = FlatGradients(critic_side, [*actor.head_parameters(), *temperature])
        self.critic_optimizer = adam(critic_side, cfg.q_lr * lr_scale)
        self.actor_optimizer = adam(actor.head_parameters(), cfg.policy_lr * lr_scale)
        self.alpha_optimizer = adam(temperature, cfg.q_lr * lr_scale) if cfg.autotune else None
        self.noise = torch.Generator(device=device)
        self.gradient_steps = 0
        self.losses = compiled(self._losses, cfg.compile_mode) if cfg.compile else self._losses

    def update(self, batch: Transitions, iteration: int) -> dict[str, Tensor]:
        start = time.perf_counter()
        # Reseeded per update from (seed, learner, iteration): exact on resume with nothing to save.
        self.noise.manual_seed(derive_seed(self.cfg.seed, LEARNER_STREAM, self.runtime.rank, iteration))
        stats = StatMeans()
        steps = self.cfg.gradient_steps
        own = shard_slice(len(batch) // steps, self.shard.shards, self.shard.index)
        for step in range(steps):
            # Strided: the rows are independent draws, and a batch may join several sources' draws
            # one after another (decoupled players); every gradient step takes its share of each.
            self.gradient_step(batch.map(lambda t, s=step: t[s::steps][own]), stats)
        # Once per update, on the averaged gradients (the same on every learner, so all stop together);
        # with fp16's loss scaler an overflow is a step the scaler skipped, not a divergence.
        if self.runtime.scaler is None:
            clip_grad_norm(list(self.critic.parameters()), max_norm=0.0)
        elapsed_ms = 1000.0 * (time.perf_counter() - start) / self.cfg.gradient_steps
        return stats.means() | {"gradient_step_ms": torch.tensor(elapsed_ms)}

    def gradient_step(self, batch: Transitions, stats: StatMeans) -> None:
        cfg = self.cfg
        self.gradient_steps += 1
        trains_actor = self.gradient_steps % cfg.policy_frequency == 0
        next_noise = self.policy.noise(len(batch), self.noise)
        actor_noise = None
        if trains_actor:  # gSDE draws one noise matrix per gradient step, for both samples (as SB3)
            actor_noise = next_noise if self.policy.state_dependent else self.policy.noise(len(batch), self.noise)
        loss, features, step_stats = self.losses(batch, next_noise, actor_noise)
        stats.add(**step_stats)
        self.backward_and_average(loss, self.CRITIC, self.ACTOR if trains_actor else self.CRITIC)
        self.step_optimizers(self.critic_optimizer, *(self.actor_optimizers() if trains_actor else []))
        if trains_actor:
            stats.add(alpha=self.alpha)
            for _ in range(cfg.policy_frequency - 1):  # a delayed actor catches up (TD3's rule, as CleanRL)
                actor_noise = self.policy.noise(len(batch), self.noise)
                loss = self.actor_and_temperature_loss(features.detach(), actor_noise, stats)
                self.backward_and_average(loss, self.ACTOR, self.ACTOR)
                self.step_optimizers(*self.actor_optimizers())
                stats.add(alpha=self.alpha)
        if self.gradient_steps % cfg.target_network_frequency == 0:
            torch._foreach_lerp_(self.target_tensors(), self.online_tensors(), cfg.tau)

    def _losses(
        self, batch: Transitions, next_noise: Tensor, actor_noise: Tensor | None
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One gradient step's loss (the critics', plus the actor's and the temperature's given `actor_noise`),
        the encoder's features of the observations, and the step's statistics (compiled with --compile)."""
        stats = StatMeans()
        features = self.policy.encode(batch.obs)  # through the encoder, which the critics' loss trains
        loss = self.critic_loss(batch, features, next_noise, stats)
        if actor_noise is not None:
            loss = loss + self.actor_and_temperature_loss(features.detach(), actor_noise, stats)
        return loss, features, {name: values[0] for name, values in stats.values.items()}

    def critic_loss(self, batch: Transitions, features: Tensor, next_noise: Tensor, stats: StatMeans) -> Tensor:
        with torch.no_grad():
            next_actions, next_logprob = self.policy(batch.next_obs, next_noise)
            next_features = batch.next_obs if self.target_encoder is None else self.target_encoder(batch.next_obs)
            next_q = self.critic_target(next_features, next_actions)
            target = soft_target(batch.rewards, batch.terminated, next_q, next_logprob, self.alpha, self.cfg.gamma)
        q_values = self.critic(features, batch.actions)
        loss = critic_loss(q_values, target)
        stats.add(critic_loss=loss, q_values=q_values.mean())
        return loss

    def actor_and_temperature_loss(self, features: Tensor, noise: Tensor, stats: StatMeans) -> Tensor:
        """From detached features: the actor's loss trains the actor's head alone, never the encoder."""
        actions, logprob = self.policy.from_features(features, noise)
        loss = actor_loss(logprob, self.critic.q_values_of_actions(features, actions), self.alpha)
        stats.add(actor_loss=loss, entropy=-logprob.mean())
        if not self.cfg.autotune:
            return loss
        alpha_loss = temperature_loss(self.log_alpha, logprob, self.target_entropy)
        stats.add(alpha_loss=alpha_loss)
        return loss + alpha_loss

    @property
    def alpha(self) -> Tensor:
        """The temperature, read from `log_alpha` when tuned: other processes may have changed it (Hogwild)."""
        return self.log_alpha.detach().exp() if self.cfg.autotune else self.fixed_alpha

    def backward_and_average(self, loss: Tensor, first_group: int, last_group: int) -> None:
        """Write the gradients of `loss` into groups first..last (the others keep theirs), and
        average them over the learners in one collective."""
        self.runtime.backward_and_average(loss, self.gradients.spans(first_group, last_group))

    def actor_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.actor_optimizer, *([self.alpha_optimizer] if self.alpha_optimizer is not None else [])]

    def step_optimizers(self, *optimizers: torch.optim.Optimizer) -> None:
        """Step the optimizers of one backward pass's gradients (through fp16's loss scaler, where there is one)."""
        optimizer_steps(list(optimizers), self.runtime.scaler)

    def online_tensors(self) -> list[Tensor]:
        """What the target networks follow: the critics, and the encoder where there is one."""
        return [*self.critic.parameters(), *self.encoder_parameters]

    def target_tensors(self) -> list[Tensor]:
        target_encoder = [] if self.target_encoder is None else list(self.target_encoder.parameters())
        return [*self.critic_target.parameters(), *target_encoder]

    def weight_tensors(self) -> list[Tensor]:
        targets = [*self.critic.parameters(), *self.target_tensors()]
        return [*self.policy.parameters(), *targets, *([self.log_alpha] if self.cfg.autotune else [])]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.critic_optimizer, *self.actor_optimizers()]

    def state_dict(self) -> dict[str, Any]:
        state = {
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "target_encoder": None if self.target_encoder is None else self.target_encoder.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha": self.alpha.cpu(),
            "gradient_steps": self.gradient_steps,
        }
        if self.cfg.autotune:
            assert self.alpha_optimizer is not None
            state |= {"log_alpha": self.log_alpha.detach().cpu(), "alpha_optimizer": self.alpha_optimizer.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        if self.target_encoder is not None:
            self.target_encoder.load_state_dict(state["target_encoder"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.gradient_steps = state["gradient_steps"]
        if self.alpha_optimizer is not None:
            with torch.no_grad():
                self.log_alpha.copy_(state["log_alpha"])
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])


def adam(parameters: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=lr, fused=True)


class SAC(Algorithm):
    name = "sac"
    config_type = SACConfig
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
                f"SAC needs continuous (Box) actions, but {env_id} has {action_space}; "
                "train it with PPO instead (drop the 'sac' subcommand)",
            )
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise UsageError(
                "--env-id",
                f"SAC squashes actions into the action bounds, but {env_id}'s are not finite "
                f"({action_space}); wrap the env with finite bounds (gymnasium's RescaleAction), or use PPO",
            )

    def check_memory(self, env_ranks: int, processes_here: int, on_gpu: bool) -> None:
        check_buffer_fits(self.capacity_per_rank(env_ranks), transition_columns(self.spaces), processes_here, on_gpu)

    def capacity_per_rank(self, env_ranks: int) -> int:
        """Each rank that runs envs holds its share of --buffer-size, as in the DSAC reference."""
        return max(self.cfg.buffer_size // env_ranks, self.cfg.batch_size)

    def build_policy(self, device: torch.device) -> nn.Module:
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every rank and in every mode
        spaces = self.spaces
        encoder = NatureCNN(spaces.obs_shape) if self.cnn else FlatPixels() if spaces.pixels else None
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
