"""A rank's environments and the experience they produce, whatever the algorithm stores it in.

`ExperienceSource` is what a mode asks of a rank's experience. `Collector` is one over a single
vector env: it owns the env, the last observations, the action generator and the normalizers,
plus the rank's own checkpoint state. An algorithm's collector (PPO's rollout, SAC's replay
buffer) adds how steps are stored and batches are made.
"""

from __future__ import annotations

import contextlib
import pickle
import time
import warnings
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import cloudpickle
import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl.batch import TensorBatch
from rl.env_faults import ENV_RESET, ENV_STEP, check_finite, close_envs, warnings_shown_if_it_succeeds
from rl.envs import (
    observations_tensor,
    reset_vector_env,
    resets_next_step,
    stored_as_bytes,
)
from rl.multi_input import packed_layout
from rl.normalization import AllReduceSum, ObservationNormalizer, RewardScaler


class Policy(Protocol):
    """The plain (never DDP-wrapped) module a rank acts with.

    A recurrent policy (`recurrent`) also takes and returns each env's state between steps, and
    where episodes start (see `rl.algos.ppo.recurrent`).
    """

    recurrent: bool

    def act(
        self, obs: Tensor, generator: torch.Generator | None, exploration: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        """Sampled actions first, then whatever else the algorithm stores (gSDE: through `exploration`)."""

    def greedy_action(self, obs: Tensor) -> Tensor: ...

    def exploration_matrices(self, rows: int, generator: torch.Generator | None) -> Tensor | None:
        """gSDE's noise matrices for `rows` envs; None for a policy that explores otherwise."""


class StateDependentExploration:
    """gSDE's noise matrices for one rank's envs, on Stable-Baselines3's schedule: drawn afresh from the acting
    stream at the start of each collection and, with `sample_freq` > 0, every `sample_freq` steps within it.

    Checkpoints fall between collections, so the acting stream's saved state redraws them exactly on resume.
    """

    def __init__(self, sample_freq: int) -> None:
        self.sample_freq = sample_freq
        self.matrices: Tensor | None = None

    def for_step(self, policy: Any, step: int, rows: int, generator: torch.Generator) -> Tensor | None:
        """The matrices to act with at the collection's `step` (0: its first)."""
        due = step == 0 or self.matrices is None or (self.sample_freq > 0 and step % self.sample_freq == 0)
        if due:
            self.matrices = policy.exploration_matrices(rows, generator)
        return self.matrices


class EnvStep(NamedTuple):
    next_obs: np.ndarray
    reward: np.ndarray  # as the learner sees it (clipped, with --clip-rewards on Atari)
    terminated: np.ndarray  # as the learner sees it (a lost life too, with --episodic-life on Atari)
    truncated: np.ndarray
    info: dict
    is_transition: np.ndarray  # False where a NEXT_STEP env only reset (its action was ignored)
    ended: np.ndarray  # the env's episode really ended: it resets


@dataclass(frozen=True)
class TrainingSignal:
    """What the learner sees differently from the game, as Atari agents are trained (Mnih et al. 2015).

    The envs keep the game's own episodes and score, so episode statistics, evaluation and
    videos show the real game; only the stored experience changes.
    """

    episodic_life: bool = False  # a lost life is terminal for the learner; the game goes on
    clip_rewards: bool = False  # the learner sees each reward's sign

    def apply(self, reward: np.ndarray, terminated: np.ndarray, life_lost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.clip_rewards:
            reward = np.sign(reward)
        if self.episodic_life:
            terminated = terminated | life_lost
        return reward, terminated


GAME_SIGNAL = TrainingSignal()  # the learner sees the game as it is


@dataclass
class EpisodeLog:
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def record(self, info: dict) -> None:
        """Add the episodes that ended in this vector step (gymnasium's RecordEpisodeStatistics)."""
        if "_episode" not in info:
            return
        done = info["_episode"]
        self.returns.extend(info["episode"]["r"][done].tolist())
        self.lengths.extend(info["episode"]["l"][done].tolist())


# Box2D worlds pickle without error but unpickle broken (the first step fails an assertion).
UNPICKLABLE_ENV_PACKAGES = ("gymnasium.envs.box2d",)


def _bytes_tensor(blob: bytes) -> Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


@runtime_checkable
class ExperienceSource(Protocol):
    """What a mode asks of a rank's experience: collect an iteration's steps, hand over batches to learn from, and
    checkpoint and close its envs. A `Collector` steps one vector env; PPO's env groups join several."""

    obs_normalizer: ObservationNormalizer
    reward_scaler: RewardScaler

    @property
    @abstractmethod
    def num_envs(self) -> int: ...

    @property
    @abstractmethod
    def env_seconds(self) -> float:
        """Seconds spent stepping the envs: the bound the loop cannot pass."""

    @abstractmethod
    def collect(self, policy: Policy, global_step: int) -> EpisodeLog:
        """Step the envs for one iteration and store what they showed; `global_step` counts every rank's steps."""

    def collect_and_learn(self, policy: Policy, global_step: int, learn: Callable[[], None]) -> EpisodeLog:
        """`collect`, and the iteration's learning (`learn`: the mode's, which takes its batch from `next_batch`)
        once the steps are stored. A source may start it earlier, while its envs step."""
        episodes = self.collect(policy, global_step)
        learn()
        return episodes

    @abstractmethod
    def next_batch(self, global_step: int, all_reduce_sum: AllReduceSum) -> TensorBatch | None:
        """The batch to learn from after this iteration, or None while there is nothing to learn yet.

        `all_reduce_sum` pools statistics over every rank that runs envs (an identity for one).
        """

    def batch_stats(self, batch: TensorBatch) -> dict[str, Tensor]:
        """Metrics of a batch that only the acting side can compute (PPO's explained variance)."""
        return {}

    @abstractmethod
    def reset_envs(self, seeds: list[int]) -> None: ...

    def take_share(self, saved: list[dict[str, Any]], rank: int, ranks: int) -> str:
        """After a change in the number of processes that run envs, whose saved states (`saved`, one per process
        that wrote the checkpoint) match none of them now: take this one's share (`rank` of `ranks`) of what they
        hold in common; what became of it, as a clause of the line that says so ("" where nothing is shared)."""
        return ""

    @abstractmethod
    def capture_state(self) -> dict[str, Any]: ...

    @abstractmethod
    def restore_state(self, state: dict[str, Any], fresh_seeds: list[int]) -> bool: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def abandon(self) -> None: ...


NO_HOLD = contextlib.nullcontext()  # reusable: the steps after an env's first hold no warnings, and make nothing


class Collector(ExperienceSource):
    """Steps a vector env with a policy; subclasses collect into their storage and make batches of it."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        device: torch.device,
        obs_normalizer: ObservationNormalizer,
        reward_scaler: RewardScaler,
        env_seeds: list[int],
        generator: torch.Generator,
        signal: TrainingSignal = GAME_SIGNAL,
    ) -> None:
        self.envs = envs
        self.signal = signal
        self.as_bytes = stored_as_bytes(envs.single_observation_space)
        self.layout = packed_layout(envs.single_observation_space)  # a Dict with images: how its bytes hold it
        self.device = device
        self.obs_normalizer = obs_normalizer
        self.reward_scaler = reward_scaler
        self.generator = generator
        # Native vector envs reset an ended env on the step after: that step is no transition.
        self.resets_next_step = resets_next_step(envs)
        self.stepping_seconds = 0.0  # spent in the vector env's step
        self.reset_envs(env_seeds)

    @property
    def num_envs(self) -> int:
        return self.envs.num_envs

    @property
    def env_seconds(self) -> float:
        return self.stepping_seconds

    def reset_envs(self, seeds: list[int]) -> None:
        # gymnasium's checker warns of what an env's first reset and step return: held while the call runs, and
        # dropped where it fails (this run's line names the fault), but shown above a value found not finite after
        # it (an env's None reward, stored as nan, which the warning names)
        with warnings_shown_if_it_succeeds(), ENV_RESET:
            first_obs, info = reset_vector_env(self.envs, seeds)
        check_finite(first_obs, call="reset", layout=self.layout)
        self.stepped = False
        self.raw_obs = self.to_tensor(first_obs)
        self.ended = np.zeros(self.envs.num_envs, dtype=np.bool_)  # which envs' last step ended an episode
        self.lives = self._lives(info)

    @staticmethod
    def _lives(info: dict) -> np.ndarray | None:
        """Each env's lives left (Atari games report them), or None for envs without lives."""
        return np.array(info["lives"], copy=True) if "lives" in info else None

    def step_envs(self, actions: np.ndarray) -> EnvStep:
        """One vector step, and which of its rows are transitions (not a NEXT_STEP env's reset step)."""
        is_transition = ~self.ended if self.resets_next_step else np.ones(self.envs.num_envs, dtype=np.bool_)
        started = time.perf_counter()
        with NO_HOLD if self.stepped else warnings_shown_if_it_succeeds(), ENV_STEP:
            raw_next, reward, terminated, truncated, info = self.envs.step(actions)
        self.stepping_seconds += time.perf_counter() - started
        self.stepped = True
        check_finite(raw_next, reward, layout=self.layout)  # before it reaches a buffer, a normalizer or a loss
        self.ended = terminated | truncated
        lives = self._lives(info)
        # A reset restores the lives; only a drop within an episode is a lost life.
        life_lost = lives < self.lives if lives is not None and self.lives is not None else np.zeros_like(self.ended)
        self.lives = lives
        reward, learner_terminated = self.signal.apply(reward, terminated, life_lost & is_transition)
        return EnvStep(raw_next, reward, learner_terminated, truncated, info, is_transition, self.ended)

    def episode_begins(self, stepped: EnvStep) -> np.ndarray:
        """Which envs' new observations begin an episode: those whose episode ended, where the env resets in the
        same step; those whose step was the reset, where it resets a step late (it first returns the last one)."""
        return ~stepped.is_transition if self.resets_next_step else stepped.ended

    def final_observations(self, raw_next: np.ndarray, info: dict, index: np.ndarray) -> np.ndarray:
        """The true last observations of the envs in `index`, which ended in this step."""
        if self.resets_next_step:
            return raw_next[index]  # the reset comes on the next step; this one returned the last observation
        final = np.stack([info["final_obs"][i] for i in index])
        check_finite(final, layout=self.layout, what="an episode's last observation", envs=index)
        return final

    def led_to(self, raw_next: np.ndarray, ended: np.ndarray, info: dict) -> np.ndarray:
        """The observation each env's transition led to: its true last one where its episode ended."""
        if self.resets_next_step or not ended.any():
            return raw_next
        index = np.flatnonzero(ended)
        observations = np.array(raw_next, copy=True)
        observations[index] = self.final_observations(raw_next, info, index)
        return observations

    def to_tensor(self, array: np.ndarray) -> Tensor:
        """Observations of shape [rows, ...] on this rank's device: uint8 images as they are, anything
        else as float32 vectors."""
        return observations_tensor(array, self.as_bytes, self.device)

    def close(self) -> None:
        close_envs(self.envs)

    def abandon(self) -> None:
        """Close the envs of a run that failed without waiting on them: an async env's worker may be the one that
        failed, or be mid-call, so the workers are ended at once."""
        if getattr(self.envs, "closed", False):
            return
        if isinstance(self.envs.unwrapped, gym.vector.AsyncVectorEnv):
            with warnings.catch_warnings():  # that a call is in progress, which is why they are ended
                warnings.filterwarnings("ignore", ".*Calling `close` while waiting for a pending call", UserWarning)
                self.envs.close(terminate=True)
        else:
            self.envs.close()

    # Checkpoints: this rank's own state.
    def capture_state(self) -> dict[str, Any]:
        """This rank's envs mid-episode, what they last showed, and its random streams."""
        envs = None  # these envs restart from fresh resets on resume
        if self._restorable_from_pickle():
            with contextlib.suppress(TypeError, AttributeError, pickle.PicklingError):
                envs = _bytes_tensor(cloudpickle.dumps(self.envs))
        return {
            "envs": envs,
            "raw_obs": self.raw_obs.cpu(),
            "ended": torch.from_numpy(self.ended.copy()),
            "lives": None if self.lives is None else torch.from_numpy(self.lives.copy()),
            "discounted_returns": torch.from_numpy(self.reward_scaler.discounted_returns.copy()),
            "action_generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }

    def restore_state(self, state: dict[str, Any], fresh_seeds: list[int]) -> bool:
        """Put this rank back where it was; returns False when its envs had to restart from a reset."""
        self.generator.set_state(state["action_generator"])
        torch.set_rng_state(state["torch_rng"])
        self.reward_scaler.discounted_returns = state["discounted_returns"].double().numpy()
        if state["envs"] is None:
            self.reset_envs(fresh_seeds)
            return False
        self.envs.close()
        self.envs = pickle.loads(state["envs"].numpy().tobytes())  # the user's own checkpoint
        self.raw_obs = state["raw_obs"].to(self.device)
        self.ended = state["ended"].numpy().copy() if "ended" in state else np.zeros_like(self.ended)
        self.lives = None if state.get("lives") is None else state["lives"].numpy().copy()
        return True

    def _restorable_from_pickle(self) -> bool:
        vector = self.envs.unwrapped
        if isinstance(vector, gym.vector.AsyncVectorEnv):
            return False  # its envs live in worker processes
        modules = [type(env.unwrapped).__module__ for env in getattr(vector, "envs", [vector])]
        return not any(module.startswith(UNPICKLABLE_ENV_PACKAGES) for module in modules)
