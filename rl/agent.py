"""Trained agents as a library: `load_agent(path).predict(obs)`, in the manner of Stable-Baselines3's `predict`.

An `Agent` is a saved agent (`RUN/agent.ckpt`) or a training checkpoint, rebuilt by the algorithm
that trained it, with what it did to observations and actions inside: the observation
normalization's statistics, the image layout, and Box actions clipped to the env's bounds, as
training sent them to its envs. It reads weights only (`torch.load(weights_only=True)`), so
loading a file runs none of its code. `rl.evaluate` and `rl.export` load agents through it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl.algos.base import Algorithm
from rl.checkpoint import SavedAgent, load_checkpoint, restored_agent
from rl.envs import (
    EnvActions,
    Preprocessing,
    env_own_spaces,
    inspect_env,
    make_env,
    needs_flattening,
    observations_tensor,
    space_summary,
    stored_as_bytes,
)
from rl.errors import UsageError
from rl.evaluation import evaluate_greedy
from rl.multi_input import pack_each, packed_layout
from rl.normalization import ObservationNormalizer
from rl.registry import ALGORITHMS

INTEGER_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
EAGER_FLOAT32 = {"precision": "32-true", "compile": False}  # saved weights are float32 whatever the run's precision


def restore_agent(state: SavedAgent, env_id: str) -> tuple[Algorithm, nn.Module, ObservationNormalizer]:
    """The algorithm that trained the agent, built for `env_id`, and the trained policy and observation
    normalizer it rebuilt."""
    kind = ALGORITHMS[state.algorithm]
    fields = kind.config_type.__dataclass_fields__
    saved = {key: value for key, value in state.config.items() if key in fields}
    # Inference makes its own envs; the training envs' vector mode need not exist for `env_id`.
    trained = kind.config_type(**saved | {"vector_mode": "sync"})
    spaces = inspect_env(env_id, trained.preprocessing())
    try:
        kind.check_spaces(spaces)
        algorithm = kind(trained, spaces)
        return algorithm, *restored_agent(algorithm, state)
    except (UsageError, RuntimeError) as error:  # RuntimeError: weights of other shapes than the env's spaces need
        if env_id == trained.env_id and isinstance(error, UsageError):
            raise
        raise UsageError(
            "--env-id",
            f"{env_id} does not fit this agent, trained on {trained.env_id}: it observes "
            f"{space_summary(spaces.observation_space)} and acts in {space_summary(spaces.action_space)}",
        ) from None


@dataclass
class Agent:
    """A trained policy that maps observations, as the env gives them, to actions for the env."""

    policy: nn.Module
    normalizer: ObservationNormalizer
    env_id: str
    preprocessing: Preprocessing  # how the env's observations were prepared in training (image wrappers)
    observation_space: gym.Space  # as the policy takes it (a Dict or Tuple flattened into a Box)
    action_space: gym.Space  # as the policy acts (one vector, where training flattened the env's)
    device: torch.device
    cnn: bool  # the policy sees its observations through a CNN (else through an MLP)
    env_observation_space: gym.Space | None = None  # the env's own, where training flattened it
    env_actions: EnvActions | None = None  # how the env takes each action, where the policy acts in another space
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator(device=self.device).manual_seed(0)

    def __repr__(self) -> str:
        # What a notebook shows of it: the env, the spaces as the env has them, and where it acts; not its networks.
        observes = space_summary(self.env_observation_space or self.observation_space)
        kind = "recurrent " if self.recurrent else ""
        acts = space_summary(self.action_space)
        return f"Agent({kind}policy for {self.env_id}: observes {observes}, acts in {acts}, on {self.device})"

    @property
    def recurrent(self) -> bool:
        """Whether the policy carries a state from step to step (`predict` takes and returns it)."""
        return bool(self.policy.recurrent)

    def seed(self, seed: int) -> None:
        """Seed the actions that `predict(..., deterministic=False)` samples."""
        self.generator.manual_seed(seed)

    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """An env of the agent's env id, as its run made them: what `predict` takes and gives.

        It has the run's env keywords (`--env-kwargs`) and prepares observations as training did (the image
        wrappers: grayscale, resize, frame stack, Atari's preprocessing; the time feature); it takes the env's own
        actions, and plays the game as it is otherwise (no episodic life, no clipped rewards).

        Args:
            render_mode: Gymnasium's: `"human"` for a window, `"rgb_array"` for frames.
        """
        return make_env(self.env_id, None, self.preprocessing, own_spaces=True, render_mode=render_mode)

    def evaluate(
        self,
        episodes: int = 10,
        seed: int = 0,
        deterministic: bool = True,
        video_dir: str | None = None,
        render: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Play whole episodes of the agent's env as `python -m rl.evaluate` does (the benchmarks' protocol).

        The envs are made as `make_env` makes them: the run's image wrappers, no episodic life or clipped rewards.

        Args:
            episodes: How many episodes; episode i's env is seeded from `seed` and i.
            seed: Seeds the envs, and the sampled actions.
            deterministic: Greedy actions, else sampled ones.
            video_dir: A folder to record the first episode in (the video extra).
            render: Show the first episode in a window.

        Returns:
            The episodes' returns and lengths, two arrays.

        Raises:
            ValueError: `episodes` or `seed` is no whole number in range, or `video_dir` is a file.
        """
        if not is_whole_number(episodes) or episodes <= 0:
            raise ValueError(f"episodes must be a positive whole number, got {episodes!r}")
        if not is_whole_number(seed) or not 0 <= seed < 2**63:  # torch's generator takes no other
            raise ValueError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed!r}")
        if video_dir is not None and os.path.exists(video_dir) and not os.path.isdir(video_dir):
            raise ValueError(f"video_dir {video_dir} is a file: give a folder to record the first episode in")
        return evaluate_greedy(
            self.policy,
            self.env_id,
            episodes,
            seed,
            self.normalizer,
            self.device,
            video_dir,
            deterministic,
            self.preprocessing,
            window=render,
        )

    @torch.no_grad()
    def predict(
        self, obs: Any, state: Tensor | None = None, deterministic: bool = True, episode_start: Any = None
    ) -> tuple[np.ndarray, Tensor | None]:
        """Actions for the env, as Stable-Baselines3's `predict` gives them.

        Args:
            obs: One observation, as the env gives it (shaped as its observation space), or a batch of them (a
                vector env's).
            state: A recurrent policy's state, as `predict` returned it for the step before; None where every
                episode starts here.
            deterministic: The distribution's mode, else a sample (`seed` seeds the samples).
            episode_start: Whether each observation is the first of an episode, for a recurrent policy (default:
                only where `state` is None).

        Returns:
            The action (or a batch of them), and the state to give the next call: None for a feed-forward policy.
        """
        batch, single = self._as_batch(obs)
        rows = batch.shape[0]
        inputs = self.normalizer(batch)
        exploration = None if deterministic else self.policy.exploration_matrices(rows, self.generator)
        if not self.recurrent:
            if deterministic:
                action = self.policy.greedy_action(inputs)
            else:
                action = self.policy.act(inputs, self.generator, exploration)[0]
            return self._as_actions(action, single), None
        memory = self.policy.initial_memory(rows, self.device)
        if state is not None:
            if state.shape != memory.shape:  # another batch's state would broadcast over this one in silence
                raise ValueError(
                    f"a state of shape {tuple(state.shape)} for {rows} observation(s), which take one of shape "
                    f"{tuple(memory.shape)}: give the state that predict returned for this batch, or None"
                )
            memory = state.to(self.device)
        starts = np.asarray(state is None if episode_start is None else episode_start, dtype=bool)
        if starts.shape not in ((), (rows,)):
            raise ValueError(f"episode_start of shape {starts.shape} for {rows} observation(s): give one flag for each")
        starts_t = torch.as_tensor(np.broadcast_to(starts, (rows,)).copy(), device=self.device)
        if deterministic:
            action, memory = self.policy.greedy_action(inputs, memory, starts_t)
        else:
            action, _, _, memory = self.policy.act(inputs, self.generator, memory, starts_t, exploration)
        return self._as_actions(action, single), memory

    def _as_batch(self, obs: Any) -> tuple[Tensor, bool]:
        """`obs` as a batch of float32 vectors or uint8 images on the agent's device, and whether it was one.

        A Dict or Tuple env's observations come as the env gives them (one, a list of them, or a vector
        env's batch: each key's values stacked), and are flattened as training flattened them; a Dict
        with images is packed into rows of bytes, as training carried it."""
        layout = packed_layout(self.observation_space)
        own_space = layout.space if layout is not None else self.env_observation_space
        if own_space is not None:
            obs = each_observation(own_space, obs)
        if layout is not None and not isinstance(obs, np.ndarray | Tensor):
            obs = pack_each(layout, obs)  # a Dict with images: each observation as its row of bytes
        elif self.env_observation_space is not None:
            obs = self._flattened(obs, self.env_observation_space)
        array = obs.cpu().numpy() if isinstance(obs, Tensor) else np.asarray(obs)
        shape = tuple(self.observation_space.shape or ())
        single = array.shape == shape
        if not single and array.shape[1:] != shape:
            raise ValueError(
                f"observations of shape {array.shape}: this agent takes {shape}, or a batch of them, as the env "
                "that agent.make_env() makes gives them (with the run's image wrappers and time feature)"
            )
        batch = array[None] if single else array
        return observations_tensor(batch, stored_as_bytes(self.observation_space), self.device), single

    def _flattened(self, obs: Any, space: gym.Space) -> Any:
        """The env's own observation (or a list or array of them) as training saw it; a flat one as it is."""
        if isinstance(space, gym.spaces.Box):
            return flat_box_observations(obs, space)
        flat_shape = tuple(self.observation_space.shape or ())
        if isinstance(obs, np.ndarray | Tensor) and obs.dtype not in INTEGER_DTYPES and obs.shape[-1:] == flat_shape:
            return obs  # flattened already
        one = obs.numpy() if isinstance(obs, Tensor) else obs
        try:
            if isinstance(one, dict | tuple | int | np.integer) or (
                isinstance(one, np.ndarray) and space.contains(one)
            ):
                return gym.spaces.flatten(space, one)
            rows = [gym.spaces.flatten(space, each) for each in one]
            return rows if rows else np.empty((0, *flat_shape), np.float32)  # an empty batch: no rows to stack
        except (TypeError, ValueError, IndexError, KeyError) as error:  # gymnasium's, on what is not of the space
            raise ValueError(f"{obs!r} is not an observation of {space}, nor a batch of them") from error

    def _as_actions(self, action: Tensor, single: bool) -> np.ndarray:
        if isinstance(self.action_space, gym.spaces.Box):
            low = torch.as_tensor(self.action_space.low, dtype=action.dtype, device=action.device)
            high = torch.as_tensor(self.action_space.high, dtype=action.dtype, device=action.device)
            action = torch.maximum(torch.minimum(action, high), low)
        actions = action.cpu().numpy()
        if self.env_actions is not None:
            actions = self.env_actions.batch(actions)
        return actions[0] if single else actions


def is_whole_number(value: Any) -> bool:
    """An int of Python's or numpy's, not a bool (which Python counts as one)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def flat_box_observations(obs: Any, space: gym.spaces.Box) -> Any:
    """One observation of a Box of several axes (or of none), or a batch of them, flattened as training flattened
    them, row by row; anything else as it is (flattened already, or of a shape that `predict` refuses)."""
    array = obs.cpu().numpy() if isinstance(obs, Tensor) else np.asarray(obs)
    if array.shape == space.shape:
        return array.reshape(-1)
    if array.shape[1:] == space.shape:
        return array.reshape(len(array), math.prod(space.shape))  # not -1, which no row gives in an empty batch
    return obs


def each_observation(space: gym.Space, obs: Any) -> Any:
    """A vector env's batch of Dict or Tuple observations (each key's values stacked, the batch first) as the
    list of its observations; anything else as it is."""
    if not isinstance(space, gym.spaces.Dict | gym.spaces.Tuple) or not isinstance(obs, dict | tuple):
        return obs
    rows = stacked_rows(space, obs)
    if rows is None:
        return obs
    return list(gym.vector.utils.iterate(gym.vector.utils.batch_space(space, rows), obs))


def stacked_rows(space: gym.Space, obs: Any) -> int | None:
    """How many observations `obs` stacks, read off its first leaf's extra leading axis; None for one observation."""
    while isinstance(space, gym.spaces.Dict | gym.spaces.Tuple) and len(space.spaces):
        first = next(iter(space.spaces)) if isinstance(space, gym.spaces.Dict) else 0
        try:
            space, obs = space[first], obs[first]
        except (KeyError, IndexError, TypeError):
            return None  # not of this space: flattening it says so
    shape = np.shape(obs)
    return shape[0] if len(shape) == len(space.shape or ()) + 1 else None


def available_device(device: str | torch.device) -> torch.device:
    """`device` as torch names it, if this machine has it (rather than torch's assertion, later, that it lacks
    CUDA)."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError("device", f"{device!r} names no device: give cpu or cuda") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device", "no CUDA GPU is available on this machine")
    if target.type != "cpu":
        try:
            torch.empty(0, device=target)
        except (RuntimeError, AssertionError):  # a kind this torch was not built for (mps), a GPU index it lacks
            raise UsageError("device", f"no {target} device is available on this machine") from None
    return target


def load_agent(path: str | os.PathLike[str], device: str | torch.device = "cpu", env_id: str | None = None) -> Agent:
    """The agent saved in a file, to act with.

    Args:
        path: A run's `agent.ckpt` (or `best.ckpt`), or a training checkpoint.
        device: Where the policy runs: `"cpu"`, `"cuda"`, `"cuda:1"`, ...
        env_id: Another env with the same spaces to act in (default: the one it was trained on).

    Raises:
        UsageError: A file that is missing, unreadable or no checkpoint of this program, an env the policy does
            not fit, or a device this machine lacks.
    """
    return agent_from_file(path, device, env_id, flag="path")


ENV_FLAGS_OF_THE_RUN = ("--env-kwargs", "--time-feature")  # how the training run made its envs, as the agent does


def agent_from_file(path: str | os.PathLike[str], device: str | torch.device, env_id: str | None, flag: str) -> Agent:
    """`load_agent`, whose refusals of the file or env name `flag`: the command line's name for the path."""
    target = available_device(device)
    state = load_checkpoint(os.path.expanduser(str(path)), flag=flag)  # ~, which Python's own open() does not read
    state = replace(state, config=state.config | EAGER_FLOAT32)
    env = env_id or state.env_id
    try:
        algorithm, policy, normalizer = restore_agent(state, env)
    except UsageError as error:
        if error.flag not in ENV_FLAGS_OF_THE_RUN:
            raise
        # Not a flag of the tools that load an agent: the run's, which every env it plays is made with.
        given_by = "--env-id" if env_id else flag
        raise UsageError(given_by, f"{error.flag} of the agent's training run: {error.message}") from None
    spaces = algorithm.spaces
    normalizer.device = target
    normalizer.load_state_dict(normalizer.state_dict())  # its tensors, moved to `target`
    own_space, own_actions = env_own_spaces(env, spaces.preprocessing)
    structured = own_space if needs_flattening(own_space) else None  # the env's own, where training flattened it
    return Agent(
        policy.eval().requires_grad_(False).to(target),
        normalizer,
        env,
        spaces.preprocessing,
        spaces.observation_space,
        spaces.action_space,
        target,
        algorithm.cnn,
        structured,
        EnvActions.of(own_actions),
    )
