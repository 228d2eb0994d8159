"""Environment construction, seeding and space checks."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from rl import masked_cartpole, pixel_cartpole, two_cues  # noqa: F401  (register rl/MaskedCartPole-v1 and others)
from rl.env_faults import (
    FLAG_NOT_ONE_BOOL,
    GYMNASIUM_MAKE,
    AsyncEnvFaultsNamed,
    WorkerEnv,
    WorkersErrorsRaised,
    env_frames,
    flag_test_failed,
    own_frames,
    summary,
    warnings_shown_if_it_succeeds,
)
from rl.errors import UsageError, did_you_mean, listed, print_error
from rl.gil_watch import envs_step_here
from rl.multi_input import (
    MultiInputLayout,
    PackObservations,
    is_image_space,
    is_multi_input_space,
    is_vector_leaf,
    packed_layout,
)
from rl.signals import signal_when_parent_dies
from rl.uploads import to_device


def has_display() -> bool:
    """Whether windows can open here: on Linux (and in its containers) only through X11 or Wayland."""
    return not sys.platform.startswith("linux") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


# This project renders to arrays only. Without a display, pygame's SDL would probe for one (and for a sound
# device) and print errors; with one, a user's own `render_mode="human"` env must still open its window.
if not has_display():
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

VectorMode = Literal["auto", "sync", "async", "native", "envpool"]

SUPPORTED_ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Box)


@dataclass(frozen=True)
class Preprocessing:
    """How the envs are made: gym.make's keyword arguments (`--env-kwargs`), and how image observations
    are prepared, through gymnasium's wrappers; vector observations pass unchanged.

    The image defaults are Atari's (Mnih et al. 2015, as CleanRL and SB3 use them); noop_max and
    frame_skip apply to ALE envs only. What training alone sees (episodic life, clipped rewards) is
    not here: the envs keep the game's own episodes and score, which is what gets logged.
    """

    grayscale: bool = True
    resize: int = 84  # square side in pixels; 0 keeps the env's size
    frame_stack: int = 4  # 1: no stacking
    noop_max: int = 30  # ALE: up to this many no-op actions after a reset
    frame_skip: int = 4  # ALE: each action repeats this many frames (the last two max-pooled)
    env_kwargs: tuple[tuple[str, Any], ...] = ()  # (key, value) pairs for gym.make
    time_feature: bool = False  # vector observations: append the elapsed fraction of the episode's time limit

    def single_env_flag(self) -> str | None:
        """The flag that native and envpool vector envs cannot honour: they are made whole, without
        gym.make's keyword arguments or gymnasium's wrappers."""
        if self.env_kwargs:
            return "--env-kwargs"
        return "--time-feature" if self.time_feature else None


ATARI_PREPROCESSING = Preprocessing()


@dataclass(frozen=True)
class EnvSpaces:
    """What the agent needs to know about an environment (its observations as preprocessed)."""

    env_id: str
    obs_dim: int
    action_space: gym.Space
    observation_space: gym.Space
    preprocessing: Preprocessing = ATARI_PREPROCESSING
    atari: bool = False  # an ALE game: it has lives, and its rewards may be clipped for training

    @property
    def pixels(self) -> bool:
        """Whether observations are images, stored and sent as uint8 in their own shape."""
        return is_image_space(self.observation_space)

    @property
    def multi_input(self) -> MultiInputLayout | None:
        """The keys of a Dict observation with images, carried as rows of bytes; None for any other."""
        return packed_layout(self.observation_space)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """One observation as the experience stores it: its image shape, or a flat vector (of bytes, for a
        Dict with images)."""
        return tuple(self.observation_space.shape) if self.pixels else (self.obs_dim,)

    @property
    def obs_dtype(self) -> torch.dtype:
        return torch.uint8 if stored_as_bytes(self.observation_space) else torch.float32


def space_summary(space: gym.Space) -> str:
    """A space in a few words: a Box by its shape, without its bounds; a Dict with images as the env gives it."""
    plain_box = isinstance(space, gym.spaces.Box) and packed_layout(space) is None
    return f"a Box of shape {space.shape}" if plain_box else repr(space)


def stored_as_bytes(space: gym.Space) -> bool:
    """Observations kept as uint8 from the env to the encoder: images, and Dict observations with images
    (packed into rows of bytes)."""
    return is_image_space(space) or packed_layout(space) is not None


def observations_tensor(obs: np.ndarray, as_bytes: bool, device: torch.device) -> torch.Tensor:
    """Observations [rows, ...] as the policy takes them: uint8 images and packed rows as they are, anything
    else as float32 rows."""
    if as_bytes:
        return to_device(obs, device)
    rows = obs.shape[0]  # -1 cannot stand for a row's width where there are no rows (an empty batch to predict)
    return to_device(obs.reshape(rows, -1 if rows else math.prod(obs.shape[1:])), device, torch.float32)


def is_atari(env_id: str) -> bool:
    """An ALE game: `ALE/Pong-v5`, or one of ale-py's older ids such as `PongNoFrameskip-v4`."""
    if env_id.startswith("ALE/"):
        return True
    spec = gym.envs.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def ends_its_episodes_in_time(envs: gym.vector.VectorEnv) -> bool:
    """Whether the envs cut an episode after a set number of steps: gymnasium's time limit (the id's, or
    `max_episode_steps` given to gym.make), or ALE's frame limit."""
    spec = envs.unwrapped.get_attr("spec")[0]
    return spec is not None and (
        spec.max_episode_steps is not None or bool(spec.kwargs.get("max_num_frames_per_episode"))
    )


EnvFamily = Literal["mujoco", "atari", "images"]


def env_family(env_id: str, observation_space: gym.Space | None = None) -> EnvFamily | None:
    """The kind of env a preset can be tuned for: MuJoCo, Atari, other image envs; None for the rest."""
    if is_atari(env_id):
        return "atari"
    spec = gym.envs.registry.get(env_id)
    if spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        return "mujoco"
    if observation_space is not None and is_image_space(observation_space):
        return "images"
    return None


# ale-py's older ids (PongNoFrameskip-v4, Breakout-ramDeterministic-v4), which gymnasium knows only once it is imported
OLDER_ATARI_ID = re.compile(r"^[A-Z]\w*?(-ram)?(NoFrameskip|Deterministic)-v[04]$")
# a module that envs import: its package's name and the extra that installs it
EXTRA_OF_MODULE = {"mujoco": ("mujoco", "mujoco"), "ale_py": ("ale-py", "atari")}


def needs_extra(env_id: str, module: str) -> UsageError:
    """`env_id` refused for want of `module`, one of `EXTRA_OF_MODULE`: the extra to install."""
    package, extra = EXTRA_OF_MODULE[module]
    return UsageError("--env-id", f"{env_id} needs {package}: pip install -e '.[{extra}]'")


def refusal_for_missing_module(env_id: str, error: BaseException | None) -> UsageError | None:
    """`env_id` refused naming the extra to install, where making it failed for want of a module that one installs:
    an ImportError, or gymnasium's DependencyNotInstalled raised from one."""
    while error is not None:
        module = (error.name or "").partition(".")[0] if isinstance(error, ImportError) else ""
        if module in EXTRA_OF_MODULE:
            return needs_extra(env_id, module)
        error = error.__cause__
    return None


def refusal_for_unfound_env_module(env_id: str, error: ImportError) -> UsageError | None:
    """`env_id` (`my_package.my_module:MyEnv-v0`) refused because Python found no module of its module's path,
    saying where Python looks: a script's folder, not the current one, which is where users keep their envs."""
    module, colon, _ = env_id.partition(":")
    while error.__cause__ is not None and error.name is None:  # gymnasium raises its own over Python's
        error = error.__cause__
    if not colon or not isinstance(error, ModuleNotFoundError) or error.name is None:
        return None
    if module != error.name and not module.startswith(error.name + "."):
        return None  # a module that the env's own module imports: a missing package
    top = error.name.partition(".")[0]
    where = "Python looks for it in the entry script's folder and on PYTHONPATH"
    if os.path.abspath("") not in map(os.path.abspath, sys.path) and (
        os.path.isdir(top) or os.path.isfile(f"{top}.py")
    ):
        where += f", not in the current folder, which holds {top}: run with PYTHONPATH={os.getcwd()}"
    return UsageError("--env-id", f"cannot import {error.name} (for {env_id}): {where}")


def register_optional_envs(env_id: str) -> None:
    """Import ale-py where the id may be one of its games: it registers the ALE/ ids and the older
    NoFrameskip-v4 family on import."""
    if not env_id.startswith("ALE/") and env_id in gym.envs.registry:
        return
    try:
        import ale_py
    except ImportError:
        if env_id.startswith("ALE/") or OLDER_ATARI_ID.match(env_id):
            raise needs_extra(env_id, "ale_py") from None
        return
    gym.register_envs(ale_py)


def resolve_env_id(env_id: str) -> str:
    """Map ids that gymnasium 1.x removed to their successors, with a warning."""
    if env_id in RENAMED_ENV_IDS:
        successor = RENAMED_ENV_IDS[env_id]
        warnings.warn(f"--env-id: {env_id} was removed in gymnasium 1.x; using {successor}", stacklevel=2)
        return successor
    return env_id


def newest_version_hint(env_id: str, error: Exception) -> str:
    """Where an old version of an env cannot be made (MuJoCo's -v3 needs mujoco-py, gone from gymnasium 1.x),
    its newest registered version, unless `error` names it already."""
    try:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id)
        newest = gym.envs.registration.find_highest_version(namespace, name)
    except gym.error.Error:
        return ""
    if version is None or newest is None or newest <= version:
        return ""
    newest_id = gym.envs.registration.get_env_id(namespace, name, newest)
    return "" if newest_id in str(error) else f" (this env's newest version is {newest_id})"


def inspect_env(env_id: str, preprocessing: Preprocessing = ATARI_PREPROCESSING) -> EnvSpaces:
    """Resolve the id, build one env as training will and check its spaces (and a user's env against
    gymnasium's API); raise `UsageError` on bad input."""
    env_id = resolve_env_id(env_id)
    register_optional_envs(env_id)
    with warnings_shown_if_it_succeeds():
        if is_users_env(env_id):
            check_env_api(env_id, preprocessing)
        env = made_to_inspect(env_id, preprocessing)
    try:
        obs_space = env.observation_space
        action_space = _checked_action_space(env.action_space)
        return EnvSpaces(env_id, _obs_dim(obs_space), action_space, obs_space, preprocessing, is_atari(env_id))
    finally:
        env.close()


RENDERED_AS = {"human": "to a window", "rgb_array": "frames to record"}


def check_renders(env_id: str, preprocessing: Preprocessing, mode: str, flag: str) -> None:
    """The env must list render mode `mode` ("human" for a window, "rgb_array" for a video): made with a mode it
    lacks, an env plays without a window, or raises that it takes no render_mode."""
    env = make_env(env_id, None, preprocessing)
    modes = env.metadata.get("render_modes", [])
    env.close()
    if mode not in modes:
        raise UsageError(flag, f"{env_id} does not render {RENDERED_AS[mode]} (render_mode {mode!r})")


def made_to_inspect(env_id: str, preprocessing: Preprocessing) -> gym.Env:
    """One env as training makes it, with the env's own action bounds; `UsageError` where it cannot be made."""
    try:
        return make_env(env_id, None, preprocessing, clip_actions=False)
    except gym.error.Error as error:
        raise refusal_for_missing_module(env_id, error) or UsageError(
            "--env-id", f"cannot make {env_id!r}: {error}{newest_version_hint(env_id, error)}"
        ) from None
    except ImportError as error:
        raise (
            refusal_for_missing_module(env_id, error)
            or refusal_for_unfound_env_module(env_id, error)
            or UsageError(
                "--env-id", f"{env_id!r} needs a missing package: {error}{newest_version_hint(env_id, error)}"
            )
        ) from None
    except UsageError:
        raise  # a flag that the env does not fit, named as the env was made
    except Exception as error:
        if isinstance(error, TypeError) and preprocessing.env_kwargs:  # a keyword it does not take, most often
            raise env_keywords_refusal(env_id, dict(preprocessing.env_kwargs), error) from None
        refuse_if_its_constructor_raised(env_id, preprocessing, error)
        raise


def refuse_if_its_constructor_raised(env_id: str, preprocessing: Preprocessing, error: Exception) -> None:
    """`UsageError` where the env's own code raised as `gym.make` made it, refusing the keyword arguments given (a
    value out of its range, a missing model file) or failing by itself: one line, a user's env's frames above it.
    An error raised elsewhere (this program's wrappers) is left as it is."""
    own = own_frames(error.__traceback__)
    if not own or not any(frame.filename == GYMNASIUM_MAKE for frame in traceback.extract_tb(error.__traceback__)):
        return
    if is_users_env(env_id):
        print_error(env_frames(error.__traceback__))
    if preprocessing.env_kwargs:
        given = dict(preprocessing.env_kwargs)
        raise UsageError("--env-kwargs", f"{env_id} does not take {given}: {summary(error)}") from None
    raise UsageError("--env-id", f"{env_id}'s {own[0].name} raised {summary(error)}") from None


def env_keywords_refusal(env_id: str, given: dict[str, Any], error: TypeError) -> UsageError:
    """Why the env refused the keyword arguments `given`: the first that it does not take, with the one it is a
    slip of and those it takes, where its creator's signature tells; else the error the env raised."""
    taken = env_keywords(env_id)
    unknown = [] if taken is None else [key for key in given if key not in taken | MAKE_KEYWORDS]
    if taken is None or not unknown:
        return UsageError("--env-kwargs", f"{env_id} does not take {given}: {error}")
    slip = did_you_mean(unknown[0], taken | MAKE_KEYWORDS)
    refused = f"{env_id} takes no keyword {unknown[0]!r}" + (f" ({slip})" if slip else "")
    return UsageError("--env-kwargs", f"{refused}: it takes {listed(sorted(taken)) if taken else 'none'}")


MAKE_KEYWORDS = frozenset({"max_episode_steps", "disable_env_checker"})  # gym.make's own, not the env's


def env_keywords(env_id: str) -> frozenset[str] | None:
    """The keyword arguments the env's creator takes, read off its signature; None where it takes any (`**kwargs`)
    or cannot be read."""
    entry_point = getattr(registered_spec(env_id), "entry_point", None)
    try:
        creator = entry_point if callable(entry_point) else gym.envs.registration.load_env_creator(entry_point)
        parameters = inspect.signature(creator).parameters.values()
    except (AttributeError, ImportError, TypeError, ValueError, gym.error.Error):
        return None
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(parameter.name for parameter in parameters if parameter.kind in named)


TRUSTED_ENV_PACKAGES = ("gymnasium", "ale_py", "rl")  # their envs keep the API; checking them costs start-up time


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec | None:
    """The spec of `env_id`, after importing its module for an id of the form `my_module:MyEnv-v0`."""
    module, colon, name = env_id.partition(":")
    if colon:
        try:
            importlib.import_module(module)
        except ImportError:
            return None  # gym.make names the missing module
    return gym.envs.registry.get(name if colon else env_id)


def is_users_env(env_id: str) -> bool:
    spec = registered_spec(env_id)
    if spec is None:
        return False  # gym.make names the missing id
    entry = spec.entry_point
    module = entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")
    return module.split(".")[0] not in TRUSTED_ENV_PACKAGES


def check_env_api(env_id: str, preprocessing: Preprocessing) -> None:
    """Run gymnasium's env checker on the env as registered: a broken rule ends the run now, in one line,
    instead of as a traceback from deep in a rollout."""
    from gymnasium.utils.env_checker import check_env

    try:
        env = gym.make(env_id, disable_env_checker=True, **dict(preprocessing.env_kwargs))
    except Exception:
        return  # making it fails again below, with the error named there
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # advice (float64 spaces, unbounded boxes) is not a broken rule
            check_env(env.unwrapped, skip_render_check=True)
    except Exception as error:
        own = own_frames(error.__traceback__)
        if own:  # the env's own code raised, not one of the checker's rules
            print_error(env_frames(error.__traceback__))
            raise UsageError("--env-id", f"{env_id}'s {own[0].name} raised {summary(error)}") from None
        if not isinstance(error, AssertionError | gym.error.Error | TypeError | ValueError):
            raise
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if flag_test_failed(error.__traceback__):
            message = f"step() returned {FLAG_NOT_ONE_BOOL} (testing it raised {summary(error)})"
        if "values to unpack" in message:
            message = f"step() must return (obs, reward, terminated, truncated, info): {message}"
        raise UsageError("--env-id", f"{env_id} breaks the gymnasium API: {message}") from None
    finally:
        with contextlib.suppress(Exception):  # a close that raises has been named: the checker closes it too
            env.close()


def needs_flattening(space: gym.Space) -> bool:
    """A Box of more than one axis (not an image), or a Dict or Tuple of vectors: trained on as one vector
    (gymnasium flattens it, choices one-hot)."""
    if isinstance(space, gym.spaces.Box):
        return len(space.shape) != 1 and not is_image_space(space)
    return is_vector_leaf(space)  # a choice (Discrete, ...) becomes one-hot; a Dict or Tuple is concatenated


def env_own_spaces(env_id: str, preprocessing: Preprocessing) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of the env itself, before any wrapper (a Dict, or a matrix of actions,
    where training flattens it)."""
    env = gym.make(resolve_env_id(env_id), **dict(preprocessing.env_kwargs))
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


ARRAY_ACTION_SPACES = (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)


@dataclass(frozen=True)
class EnvActions:
    """How the policy's actions become the env's where the env's own action space is not one the policy acts in
    (`policy_action_space`): each flat action, counted from 0, is offset by the space's `start` and takes its
    `shape`."""

    shape: tuple[int, ...]
    start: np.ndarray | None  # added to each flat action: the start of choices that start elsewhere than 0
    choice: bool  # a Discrete's: one number, as a vector env hands it, not an array

    @staticmethod
    def of(space: gym.Space) -> EnvActions | None:
        """None where the policy acts in the env's own space."""
        if policy_action_space(space) is None:
            return None
        start = np.asarray(getattr(space, "start", 0)).reshape(-1)  # a Box or MultiBinary has none
        return EnvActions(tuple(space.shape), start if np.any(start) else None, isinstance(space, gym.spaces.Discrete))

    def one(self, action: np.ndarray) -> np.ndarray:
        """One of the policy's actions as the env takes it (per env step: a reshape, and the start where any)."""
        env_action = np.asarray(action) if self.start is None else np.asarray(action) + self.start
        return env_action.reshape(self.shape)[()] if self.choice else env_action.reshape(self.shape)

    def batch(self, actions: np.ndarray) -> np.ndarray:
        """A batch of the policy's actions (one row each) as the env takes them."""
        if self.start is not None:
            actions = actions.reshape(len(actions), self.start.size) + self.start
        return actions.reshape(len(actions), *self.shape)


def policy_action_space(space: gym.Space) -> gym.Space | None:
    """The space the policy acts in where it is not the env's own: one vector, for a Box, MultiBinary or
    MultiDiscrete of another number of axes (a matrix, or a single number), and choices counted from 0, for a
    Discrete or MultiDiscrete whose `start` is not 0. None where the policy acts in the env's own space."""
    starts_elsewhere = isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) and bool(np.any(space.start))
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Discrete(int(space.n)) if starts_elsewhere else None
    if not isinstance(space, ARRAY_ACTION_SPACES) or (len(space.shape) == 1 and not starts_elsewhere):
        return None
    if isinstance(space, gym.spaces.Box):
        return gym.spaces.Box(space.low.reshape(-1), space.high.reshape(-1), dtype=space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return gym.spaces.MultiBinary(int(np.prod(space.shape)))
    return gym.spaces.MultiDiscrete(space.nvec.reshape(-1), dtype=space.dtype)


def _with_policy_actions(env: gym.Env, policy_space: gym.Space) -> gym.Env:
    """The policy acts in `policy_space`; the env takes each action in its own space."""
    env_actions = EnvActions.of(env.action_space)
    assert env_actions is not None
    return gym.wrappers.TransformAction(env, env_actions.one, policy_space)


def _obs_dim(space: gym.Space) -> int:
    if not isinstance(space, gym.spaces.Box):
        raise UsageError(
            "--env-id",
            f"observation space {space} is not supported: give Box observations (vectors "
            "or images), a Dict or Tuple of vectors, which are flattened, or a Dict of images and vectors",
        )
    return int(np.prod(space.shape))


def _checked_action_space(space: gym.Space) -> gym.Space:
    if not isinstance(space, SUPPORTED_ACTION_SPACES):
        raise UsageError(
            "--env-id", f"action space {space} is not supported; use Discrete, MultiDiscrete, MultiBinary or Box"
        )
    if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
        raise UsageError(
            "--env-id",
            f"action space {space} holds integers, which a policy does not give: use a float Box or a MultiDiscrete",
        )
    return space


# MuJoCo 4 deprecates a compiler attribute that gymnasium's MuJoCo models set, and warns of it each time one is
# loaded: advice for the models' authors, which a run cannot act on.
MUJOCO_MODEL_ADVICE = ("compiler attribute 'settotalmass' is deprecated",)


@functools.cache  # once per process
def quiet_mujoco_model_advice() -> None:
    """Leave out MuJoCo's warnings about gymnasium's models; print every other one as MuJoCo would (an
    unstable simulation's, say)."""
    import mujoco

    def warn(message: str) -> None:
        if not message.startswith(MUJOCO_MODEL_ADVICE):
            sys.stderr.write(f"WARNING: {message}\n\n")

    mujoco.set_mju_user_warning(warn)


def make_env(
    env_id: str,
    video_dir: str | None,
    preprocessing: Preprocessing,
    clip_actions: bool = True,
    window: bool = False,
    own_spaces: bool = False,
    render_mode: str | None = None,
    video_episodes: Callable[[int], bool] | None = None,
) -> gym.Env:
    """One env as training steps it: observations preprocessed, Box actions clipped to the bounds. `window`: the
    env shows itself in a window as it steps (`render_mode="human"`); else `render_mode`, where no video sets it.
    `video_episodes`: which episodes `video_dir` records (gymnasium's schedule by default: 0, 1, 8, 27, ...).
    `own_spaces`: the env's own observations where training flattened them (a Dict, a Tuple, a choice, a matrix)
    and its own actions, as `Agent.predict` takes and gives them; images and the time feature are prepared as in
    training, since the policy needs them."""
    register_optional_envs(env_id)  # also in a process of its own (async envs)
    if env_family(env_id) == "mujoco":
        quiet_mujoco_model_advice()
    options: dict[str, Any] = dict(preprocessing.env_kwargs)
    if video_dir or window or render_mode:
        options["render_mode"] = "human" if window else "rgb_array" if video_dir else render_mode
    if is_atari(env_id) and options.get("obs_type") != "ram":
        options["frameskip"] = 1  # AtariPreprocessing skips frames, max-pooling the last two of each skip
    with warnings_shown_if_it_succeeds():  # gymnasium's note of an old version, once in a process
        env = gym.make(env_id, **options)
    if video_dir:  # innermost: the video shows the env's own frames, every one, not the agent's input
        env = gym.wrappers.RecordVideo(env, video_dir, episode_trigger=video_episodes, disable_logger=True)
    flattens = not own_spaces or preprocessing.time_feature  # the time feature extends a flat vector
    if is_image_space(env.observation_space):
        env = _preprocess_images(env, preprocessing, is_atari(env_id))
    elif is_multi_input_space(env.observation_space) and not own_spaces:  # a CNN per image key: rows of bytes
        env = PackObservations(env)
    elif needs_flattening(env.observation_space) and flattens:  # a Dict or Tuple in the order gymnasium flattens it
        env = gym.wrappers.FlattenObservation(env)
    if preprocessing.time_feature:
        env = _with_time_feature(env, env_id)
    if own_spaces:
        return env
    if clip_actions and isinstance(env.action_space, gym.spaces.Box):
        # The policy's log-prob is that of the unclipped sample; only the env sees the clip.
        env = gym.wrappers.ClipAction(env)
    policy_actions = policy_action_space(env.action_space)
    if policy_actions is not None:
        env = _with_policy_actions(env, policy_actions)
    return env


def _with_time_feature(env: gym.Env, env_id: str) -> gym.Env:
    """Append the elapsed fraction of the time limit to each observation (rl-zoo's TimeFeatureWrapper, as
    gymnasium's own wrapper gives it): the critic then sees how much of the episode the limit leaves."""
    if not isinstance(env.observation_space, gym.spaces.Box) or stored_as_bytes(env.observation_space):
        raise UsageError("--time-feature", f"needs vector observations; {env_id} gives {env.observation_space}")
    if env.spec is None or env.spec.max_episode_steps is None:
        raise UsageError("--time-feature", f"{env_id} has no time limit to measure the episode against")
    return gym.wrappers.TimeAwareObservation(env, normalize_time=True)


def _preprocess_images(env: gym.Env, steps: Preprocessing, atari: bool) -> gym.Env:
    """Grayscale, resize and stack frames with gymnasium's wrappers (Atari's with its own preprocessing)."""
    if atari:
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=steps.noop_max,
            frame_skip=steps.frame_skip,
            screen_size=steps.resize or env.observation_space.shape[:2],
            grayscale_obs=steps.grayscale,
        )
    else:
        if steps.grayscale and env.observation_space.shape[-1] == 3:
            env = gym.wrappers.GrayscaleObservation(env)
        if steps.resize and env.observation_space.shape[:2] != (steps.resize, steps.resize):
            env = gym.wrappers.ResizeObservation(env, (steps.resize, steps.resize))
    if steps.frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, steps.frame_stack)
    return env


def first_episode(episode: int) -> bool:
    """An evaluation's video: its env's first episode alone. The vector env resets an env in the step that ends its
    episode, which would begin a second recording, of one frame."""
    return episode == 0


def make_vector_env(
    env_id: str,
    num_envs: int,
    video_dir: str | None = None,
    mode: VectorMode = "sync",
    preprocessing: Preprocessing = ATARI_PREPROCESSING,
    seed: int = 0,
    window: bool = False,
    video_episodes: Callable[[int], bool] | None = None,
) -> gym.vector.VectorEnv:
    """`num_envs` envs stepped as one, with episode statistics; with `video_dir` the first env is recorded (its
    `video_episodes`, as `make_env` takes them), with `window` shown in a window (sync and async modes).

    - `sync` / `async`: gymnasium's vector wrappers around single envs, in this process or one
      process per env. They reset an env in the same step as it ends (SAME_STEP autoreset):
      the step returns the next episode's first observation, and the true last one is in
      `info["final_obs"]`, so a rollout never stores a step that is not a transition.
    - `native`: the env's own vectorized implementation (`gym.make_vec`, gymnasium's
      `vector_entry_point`), far faster where one exists (CartPole, ale-py's Atari). It resets
      an env one step after it ends (NEXT_STEP): that step ignores the action and only returns
      the first observation.
    - `envpool`: envpool's C++ pool of the same env, NEXT_STEP as well; `seed` seeds it (its
      reset takes no seeds).
    """
    if mode == "native":
        envs = gym.make_vec(
            env_id, num_envs, vectorization_mode="vector_entry_point", **_ale_vector_options(env_id, preprocessing)
        )
    elif mode == "envpool":
        envs = make_envpool(env_id, num_envs, preprocessing, seed)
    else:
        videos = [video_dir] + [None] * (num_envs - 1)
        thunks = [
            functools.partial(
                make_env, env_id, video, preprocessing, window=window and index == 0, video_episodes=video_episodes
            )
            for index, video in enumerate(videos)
        ]
        if mode == "async":
            parent = os.getpid()
            thunks = [functools.partial(_made_in_worker, thunk, parent) for thunk in thunks]
            # Forks, whatever Python's default (forkserver on Linux from 3.14): a worker ends with its parent, the
            # training process, and starts without importing torch again.
            envs = AsyncEnvFaultsNamed(
                WorkersErrorsRaised(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, context="fork")
            )
        else:
            envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    if mode != "async":
        envs_step_here()
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def _made_in_worker(make: Callable[[], gym.Env], parent: int) -> gym.Env:
    """An async env made in its worker, a fork of the training process (`parent`): the worker takes the default
    SIGTERM back. The handler it inherited reports the launcher stopping a rank, and closing a failed run's envs
    (or collecting them) sends their workers SIGTERM. It ignores Ctrl-C, which the terminal sends it too: the
    training process turns it into a checkpoint, for which the workers go on stepping. gymnasium also makes the
    first env in the parent, to read its spaces: that process keeps its handlers.

    A worker ends with its training process, however that ends (SIGKILL, the out-of-memory killer): else one in an
    env call that never returns would run on alone, and an idle one would print two tracebacks of its lost pipe.
    Its env fails as one that the training process steps itself (`WorkerEnv`)."""
    if os.getpid() != parent:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal_when_parent_dies(signal.SIGTERM)
        return WorkerEnv(make())
    return make()


def _ale_vector_options(env_id: str, steps: Preprocessing) -> dict[str, object]:
    """ale-py's vector env set to the game and preprocessing the single-env wrappers give: the game's own
    episodes and score (no episodic life, no clipping, no automatic FIRE), and the id's sticky actions."""
    if not is_atari(env_id):
        return {}
    return {
        "img_height": steps.resize or 210,
        "img_width": steps.resize or 160,
        "grayscale": steps.grayscale,
        "stack_num": steps.frame_stack,
        "frameskip": steps.frame_skip,
        "noop_max": steps.noop_max,
        "reward_clipping": False,
        "episodic_life": False,
        "use_fire_reset": False,
        "repeat_action_probability": gym.spec(env_id).kwargs.get("repeat_action_probability", 0.25),
    }


ENVPOOL_OPTION_NAMES = {"grayscale": "gray_scale", "frameskip": "frame_skip", "reward_clipping": "reward_clip"}


def envpool_task(env_id: str) -> str:
    return env_id.removeprefix("ALE/")


def make_envpool(env_id: str, num_envs: int, steps: Preprocessing, seed: int) -> gym.vector.VectorEnv:
    """envpool's pool of `env_id` (a gymnasium VectorEnv), set as ale-py's vector env is."""
    import envpool

    options = {
        ENVPOOL_OPTION_NAMES.get(name, name): value for name, value in _ale_vector_options(env_id, steps).items()
    }
    seed = c_int_seed(seed, num_envs)
    with warnings.catch_warnings():  # envpool gives float32 spaces float64 bounds, which gymnasium warns of
        warnings.filterwarnings("ignore", ".*precision lowered by casting to float32", UserWarning)
        pool = envpool.make(envpool_task(env_id), env_type="gymnasium", num_envs=num_envs, seed=seed, **options)
        _ = pool.observation_space, pool.action_space  # made, and kept, on first use
    return pool


def c_int_seed(seed: int, num_envs: int) -> int:
    """A seed that every vector env of its own takes (ale-py's and envpool's seed their envs seed,
    seed + 1, ... as C ints)."""
    return seed % (2**31 - num_envs)


def resets_next_step(envs: gym.vector.VectorEnv) -> bool:
    """Whether an ended env returns its first observation one step late (see `make_vector_env`)."""
    return envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP) == gym.vector.AutoresetMode.NEXT_STEP


def reset_vector_env(envs: gym.vector.VectorEnv, seeds: list[int]) -> tuple[np.ndarray, dict]:
    """Reset every env: one seed each where the envs are separate, the first seed for a native vector
    env; envpool was seeded when it was made. Returns the first observations and the info."""
    if is_envpool(envs):
        return envs.reset()
    if isinstance(envs.unwrapped, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv):
        return envs.reset(seed=seeds)
    return envs.reset(seed=c_int_seed(seeds[0], envs.num_envs))


def is_envpool(envs: gym.vector.VectorEnv) -> bool:
    return type(envs.unwrapped).__module__.startswith("envpool") or "EnvPool" in type(envs.unwrapped).__name__


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


def check_envpool_has(env_id: str) -> None:
    """Refuse `--vector-mode envpool` where envpool is not installed, or has no such env."""
    try:
        import envpool
    except ImportError:
        extra = "envpool needs the envpool extra (Python 3.11+): pip install -e '.[envpool]'"
        raise UsageError("--vector-mode", extra) from None
    if envpool_task(env_id) not in envpool.list_all_envs():
        raise UsageError(
            "--vector-mode",
            f"envpool has no {envpool_task(env_id)}: it holds Atari, MuJoCo and classic control; use sync or async",
        )


def choose_vector_mode(
    mode: VectorMode,
    env_id: str,
    capture_video: bool,
    late_resets_refused_by: str | None,
    single_env_flag: str | None = None,
) -> VectorMode:
    """The mode to build: `auto` is `native` where the env has it (and video, the algorithm and the absence
    of a `single_env_flag` such as --env-kwargs allow), else `sync`. `late_resets_refused_by` names an
    algorithm whose experience cannot skip the reset steps of envs that reset a step late (native and envpool's).

    Raises `UsageError` when `native` or `envpool` was asked for and cannot be had.
    """
    native_ok = has_native_vector_env(env_id)
    if mode == "auto":
        whole = native_ok and not capture_video and not late_resets_refused_by and not single_env_flag
        return "native" if whole else "sync"
    if mode in ("native", "envpool") and single_env_flag:
        raise UsageError("--vector-mode", f"{mode} envs are made without {single_env_flag} here; use sync or async")
    if mode == "native" and not native_ok:
        raise UsageError("--vector-mode", f"{env_id} has no native vector env here; use sync or async")
    if mode == "envpool":
        check_envpool_has(env_id)
    if mode in ("native", "envpool"):
        if capture_video:
            raise UsageError("--vector-mode", f"{mode} envs do not record video; use sync with --capture-video")
        if late_resets_refused_by:
            raise UsageError(
                "--vector-mode",
                f"{mode} envs reset a step after an episode ends, and {late_resets_refused_by} stores every step "
                "as a transition: use sync or async",
            )
    return mode


def video_folder(run_dir: str, kind: str, label: str) -> str:
    """A folder no recording has used, `<run>/<kind>_videos/<label>` (then `<label>_2`, ...): gymnasium's
    RecordVideo numbers episodes from 0 in every folder, so a resumed run, or a checkpoint evaluated twice,
    would otherwise write over the earlier videos."""
    base = os.path.join(run_dir, f"{kind}_videos", label)
    folder, copies = base, 1
    while os.path.exists(folder):
        copies += 1
        folder = f"{base}_{copies}"
    return folder
