"""Environment construction, seeding and space checks."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np

from rl.errors import UsageError

# Rendering is to arrays only; pygame's SDL must not look for a display or a sound device.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

# gymnasium 1.x removed these ids; their successors keep the same spaces and dynamics fixes.
RENAMED_ENV_IDS = {
    "LunarLander-v2": "LunarLander-v3",
    "LunarLanderContinuous-v2": "LunarLanderContinuous-v3",
    "BipedalWalker-v2": "BipedalWalker-v3",
    "BipedalWalkerHardcore-v2": "BipedalWalkerHardcore-v3",
    "CarRacing-v1": "CarRacing-v3",
}

VectorMode = Literal["auto", "sync", "async", "native"]

SUPPORTED_ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box)


@dataclass(frozen=True)
class EnvSpaces:
    """What the agent needs to know about an environment."""

    env_id: str
    obs_dim: int
    action_space: gym.Space
    observation_space: gym.Space


def resolve_env_id(env_id: str) -> str:
    """Map ids that gymnasium 1.x removed to their successors, with a warning."""
    if env_id in RENAMED_ENV_IDS:
        successor = RENAMED_ENV_IDS[env_id]
        warnings.warn(f"--env-id: {env_id} was removed in gymnasium 1.x; using {successor}", stacklevel=2)
        return successor
    return env_id


def inspect_env(env_id: str) -> EnvSpaces:
    """Resolve the id, build one env and check its spaces; raise `UsageError` on bad input."""
    env_id = resolve_env_id(env_id)
    try:
        env = gym.make(env_id)
    except gym.error.Error as error:
        raise UsageError("--env-id", f"cannot make {env_id!r}: {error}") from None
    except ImportError as error:
        raise UsageError("--env-id", f"{env_id!r} needs a missing package: {error}") from None
    try:
        obs_space = env.observation_space
        return EnvSpaces(env_id, _obs_dim(obs_space), _checked_action_space(env.action_space), obs_space)
    finally:
        env.close()


def _obs_dim(space: gym.Space) -> int:
    if not isinstance(space, gym.spaces.Box):
        raise UsageError("--env-id", f"observation space {space} is not supported; only Box observations are")
    return int(np.prod(space.shape))


def _checked_action_space(space: gym.Space) -> gym.Space:
    if not isinstance(space, SUPPORTED_ACTION_SPACES):
        raise UsageError("--env-id", f"action space {space} is not supported; use Discrete, MultiDiscrete or Box")
    if isinstance(space, gym.spaces.Box) and len(space.shape) != 1:
        raise UsageError("--env-id", f"Box action space of shape {space.shape} is not supported; it must be 1-D")
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) != 1:
        raise UsageError("--env-id", f"MultiDiscrete action space {space} is not supported; it must be 1-D")
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) and np.any(space.start != 0):
        raise UsageError("--env-id", f"action space {space} is not supported; its actions must start at 0")
    return space


def _make_env_thunk(env_id: str, video_dir: str | None):
    def thunk() -> gym.Env:
        env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
        if len(env.observation_space.shape) != 1:
            env = gym.wrappers.FlattenObservation(env)
        if isinstance(env.action_space, gym.spaces.Box):
            # The policy's log-prob is that of the unclipped sample; only the env sees the clip.
            env = gym.wrappers.ClipAction(env)
        if video_dir:
            env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)
        return env

    return thunk


def make_vector_env(
    env_id: str, num_envs: int, video_dir: str | None = None, mode: VectorMode = "sync"
) -> gym.vector.VectorEnv:
    """`num_envs` envs stepped as one, with episode statistics.

    - `sync` / `async`: gymnasium's vector wrappers around single envs, in this process or one
      process per env. They reset an env in the same step as it ends (SAME_STEP autoreset):
      the step returns the next episode's first observation, and the true last one is in
      `info["final_obs"]`, so a rollout never stores a step that is not a transition.
    - `native`: the env's own vectorized implementation (`gym.make_vec`, gymnasium's
      `vector_entry_point`), far faster where one exists. It resets an env one step after it
      ends (NEXT_STEP): that step ignores the action and only returns the first observation.
    """
    if mode == "native":
        envs = gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point")
        return gym.wrappers.vector.RecordEpisodeStatistics(envs)
    thunks = [_make_env_thunk(env_id, video_dir if index == 0 else None) for index in range(num_envs)]
    vector_type = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
    envs = vector_type(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def resets_next_step(envs: gym.vector.VectorEnv) -> bool:
    """Whether an ended env returns its first observation one step late (see `make_vector_env`)."""
    return envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP) == gym.vector.AutoresetMode.NEXT_STEP


def reset_vector_env(envs: gym.vector.VectorEnv, seeds: list[int]) -> np.ndarray:
    """Reset every env: one seed each where the envs are separate, the first seed for a native vector env."""
    separate = isinstance(envs.unwrapped, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv)
    first_obs, _ = envs.reset(seed=seeds if separate else seeds[0])
    return first_obs


def has_native_vector_env(env_id: str) -> bool:
    """Whether gymnasium registers a vectorized implementation of the env that imports here."""
    spec = gym.envs.registry.get(env_id)
    entry_point = None if spec is None else spec.vector_entry_point
    if not isinstance(entry_point, str):
        return entry_point is not None
    try:
        gym.envs.registration.load_env_creator(entry_point)
    except (ImportError, gym.error.DependencyNotInstalled):
        return False  # e.g. the JAX envs of gymnasium.envs.phys2d without jax installed
    return True


def choose_vector_mode(mode: VectorMode, env_id: str, capture_video: bool, algorithm_allows_native: bool) -> VectorMode:
    """The mode to build: `auto` is `native` where the env has it (and video and the algorithm allow), else `sync`.

    Raises `UsageError` when `native` was asked for and cannot be had.
    """
    native_ok = has_native_vector_env(env_id)
    if mode == "auto":
        return "native" if native_ok and not capture_video and algorithm_allows_native else "sync"
    if mode == "native":
        if not native_ok:
            raise UsageError("--vector-mode", f"{env_id} has no native vector env here; use sync or async")
        if capture_video:
            raise UsageError("--vector-mode", "native envs do not record video; use sync with --capture-video")
        if not algorithm_allows_native:
            raise UsageError("--vector-mode", "this algorithm needs envs that reset as they end; use sync or async")
    return mode


def video_folder(run_dir: str, prefix: str) -> str:
    return os.path.join(run_dir, f"{prefix}_videos")
