"""The interface between an algorithm and a mode.

An algorithm knows its config, its networks and optimizers, how its experience is gathered and
batched (`ExperienceSource`), how a batch becomes one synchronized update (`Learner`), and what
it checkpoints. A mode knows processes, roles, collectives, devices, logging, checkpoints,
faults and shutdown, and talks to any algorithm through the classes below alone:

- every rank that runs envs: `build_policy` + `make_source`, then `collect` / `next_batch` (a rank that
  learns too: `collect_and_learn`, which runs its learning where the algorithm starts it);
- every rank that learns: `build_policy` + `make_learner`, then `update(batch)`;
- a decoupled player ships batches packed by `batch_codec` and loads `policy_weights`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl.batch import Column, DataShard, RowCodec, TensorBatch
from rl.config import RunConfig
from rl.encoders import uses_cnn
from rl.envs import EnvSpaces, VectorMode, choose_vector_mode, make_vector_env
from rl.errors import UsageError
from rl.experience import ExperienceSource, StateDependentExploration, TrainingSignal
from rl.normalization import ObservationNormalizer
from rl.optim import DivergenceGuard, flat_parameters
from rl.precision import Precision
from rl.runtime import Runtime


class Learner(ABC):
    """One rank's learning side: the trained modules, optimizers and update step, averaged through the runtime."""

    def __init__(self, policy: nn.Module) -> None:
        self.policy = policy  # the plain module: acting and evaluation use it, and it shares the trained weights
        self.divergence = DivergenceGuard(next(policy.parameters()).device)

    def raise_if_diverged(self) -> None:
        """Raise `TrainingDiverged` if an update skipped a step for a non-finite gradient. It reads a
        value from the device: modes call it where they read the statistics (each report, each checkpoint)."""
        self.divergence.raise_if_diverged()

    @abstractmethod
    def update(self, batch: TensorBatch, iteration: int) -> dict[str, Tensor | float]:
        """One learning phase on `batch`; returns named statistics (a subset of the algorithm's `stat_tags`):
        tensors where they were computed, floats where the host knows them.

        Every learner calls it at the same iteration with a batch of the same size, so the
        collectives inside (the gradient averages) stay in step.
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything beyond the policy's weights that an exact resume needs (optimizers, targets, counters)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    @abstractmethod
    def weight_tensors(self) -> list[Tensor]:
        """Every tensor an update writes besides optimizer state (parameters, target networks, a
        temperature), in a fixed order: what Hogwild workers share or merge."""

    @abstractmethod
    def optimizers(self) -> list[torch.optim.Optimizer]: ...

    def policy_weights(self) -> Tensor:
        """The weights a player acts with, as one vector."""
        return flat_parameters(self.policy)


class Algorithm(ABC):
    """An algorithm for one config and env; the factory of its policy, experience source and learner."""

    name: ClassVar[str]
    config_type: ClassVar[type[RunConfig]]
    stat_tags: ClassVar[dict[str, str]]  # statistic name -> TensorBoard tag, in the order they travel
    passes_per_batch: ClassVar[int] = 1  # how often an update reuses each row (PPO: its epochs)
    # Whether its experience can skip the reset steps of envs that reset a step late (native vector envs).
    handles_late_resets: ClassVar[bool] = False

    def __init__(self, cfg: RunConfig, spaces: EnvSpaces) -> None:
        self.cfg = cfg
        self.spaces = spaces
        self.vector_mode: VectorMode = choose_vector_mode(
            cfg.vector_mode,
            spaces.env_id,
            cfg.capture_video,
            None if self.handles_late_resets else self.name.upper(),
            spaces.preprocessing.single_env_flag(),
        )
        self.cnn = uses_cnn(cfg.encoder, spaces.observation_space)  # else an MLP

    def make_envs(self, video_dir: str | None, seed: int, num_envs: int | None = None) -> gym.vector.VectorEnv:
        """A rank's vector env, or one of `num_envs` of them (`seed` seeds envpool, which takes no seeds at reset)."""
        cfg, spaces = self.cfg, self.spaces
        num_envs = num_envs or cfg.num_envs
        envs = make_vector_env(spaces.env_id, num_envs, video_dir, self.vector_mode, spaces.preprocessing, seed)
        if tuple(envs.single_observation_space.shape) != tuple(spaces.observation_space.shape):
            raise UsageError(
                "--vector-mode",
                f"{self.vector_mode} envs give observations of shape "
                f"{envs.single_observation_space.shape}, gymnasium's {spaces.observation_space.shape}; use sync",
            )
        return envs

    def training_signal(self) -> TrainingSignal:
        """What the learner sees differently from the game: Atari's episodic life and clipped rewards."""
        atari = self.spaces.atari
        return TrainingSignal(atari and self.cfg.episodic_life, atari and self.cfg.clip_rewards)

    def exploration(self) -> StateDependentExploration | None:
        """gSDE's noise schedule for a rank's envs, with --use-sde."""
        return StateDependentExploration(self.cfg.sde_sample_freq) if self.cfg.use_sde else None

    def obs_column(self) -> Column:
        """How one observation is stored and sent: uint8 images in their shape, or a float32 vector."""
        return Column(self.spaces.obs_shape, self.spaces.obs_dtype)

    @classmethod
    def check_spaces(cls, spaces: EnvSpaces) -> None:
        """Refuse an env this algorithm cannot train on, with a `UsageError` that says what to do instead."""
        return  # every env `inspect_env` accepts, by default

    def check_memory(self, env_ranks: int, processes_here: int, gpu: int | None) -> None:
        """Refuse, before anything is allocated, storage this machine cannot hold.

        `processes_here` ranks on this machine run envs; `gpu`: the GPU here their storage goes onto, one each (None:
        they share the host's memory).
        """
        return  # nothing large is allocated, by default

    def check_rank_states(self, rank_states: list[dict[str, Any]], env_ranks: int) -> None:
        """Refuse, before the run opens its folder, a checkpoint's per-rank states (one per rank that runs envs)
        that this run's ranks cannot take back."""
        return  # what the envs' state holds fits any run that the checkpoint's config checks passed, by default

    def precision(self, device: torch.device) -> Precision:
        """How this run's networks compute on `device` (--precision)."""
        return Precision.on(self.cfg.precision, device)

    def obs_normalizer(self, device: torch.device) -> ObservationNormalizer:
        """The observation normalizer the policy acts through (its statistics come from the experience source)."""
        return ObservationNormalizer(self.spaces.obs_dim, False, device)

    @abstractmethod
    def build_policy(self, device: torch.device) -> nn.Module:
        """The acting module, with the same initial weights on every rank and in every mode."""

    @abstractmethod
    def make_source(
        self, rank: int, device: torch.device, video_dir: str | None, env_ranks: int, batch_rows: int
    ) -> ExperienceSource:
        """This rank's envs, seeded for (seed, rank), and the storage its batches of `batch_rows` rows come from."""

    @abstractmethod
    def make_learner(self, policy: nn.Module, runtime: Runtime, shard: DataShard, env_ranks: int) -> Learner:
        """The learning side around `policy`; its gradients are averaged across learners through `runtime`."""

    @abstractmethod
    def batch_rows(self, learners_fed: int) -> int:
        """Rows of one batch that feeds `learners_fed` learners each their own data."""

    def rows_per_source(self, learners_fed: int, num_sources: int) -> list[int]:
        """The rows each of `num_sources` experience sources adds to one update's batch.

        By default each adds a whole batch of its own (on-policy: every collected step is trained on).
        """
        return [self.batch_rows(learners_fed)] * num_sources

    @abstractmethod
    def batch_codec(self) -> RowCodec:
        """How a batch travels between processes."""

    def iterations_per_report(self, env_ranks: int) -> int:
        """Iterations between two logged points (and interrupt and checkpoint checks)."""
        return self.cfg.iterations_per_report(env_ranks)
