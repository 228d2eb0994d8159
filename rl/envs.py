"""Environment construction, seeding and space checks."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

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


def make_vector_env(env_id: str, num_envs: int, video_dir: str | None = None) -> gym.vector.VectorEnv:
    """Synchronous envs that reset in the same step as they end, with episode statistics.

    SAME_STEP autoreset returns the first observation of the next episode together with the
    last transition and puts the true last observation in `info["final_obs"]`, so the rollout
    never stores the fake reset step that NEXT_STEP would produce.
    """
    thunks = [_make_env_thunk(env_id, video_dir if index == 0 else None) for index in range(num_envs)]
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def video_folder(run_dir: str, prefix: str) -> str:
    return os.path.join(run_dir, f"{prefix}_videos")
