"""The run-level configuration every algorithm shares, its validation, and tyro parsing.

Each algorithm's config (`rl/algos/<name>/config.py`) derives from `RunConfig` and adds its
own fields. Flag names and meanings follow Lightning's fabric RL example (PPO) and
Stable-Baselines3 / CleanRL (SAC), so their commands run unchanged.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import itertools
import json
import math
import os
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import InitVar, asdict, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_args

import torch
import tyro

from rl.compiling import CompileMode, check_compiler
from rl.encoders import EncoderKind
from rl.envs import Preprocessing, VectorMode
from rl.errors import UsageError, counted, did_you_mean
from rl.logger import LoggerName
from rl.precision import (
    DEFAULT_PRECISION,
    PrecisionName,
    check_precision_device,
    check_precision_on_this_gpu,
    full_precision_name,
    warn_of_emulated_bf16,
)

# A text field's mark: it holds a JSON object, which Python and config files may give as a dict.
JSON_OBJECT = "json-object"


@dataclass
class RunFlags:
    """The run-level flags every mode takes: the run, its envs, its processes, logging and checkpoints."""

    config: str | None = None
    """a YAML or JSON file of flags (by their names, such as num_envs: 4); flags on the command line override it,
    and its algorithm: key (ppo or sac) picks the algorithm where the command line names none; every run folder
    keeps its resolved flags as config.yaml, which this flag takes back"""
    write_config: str | None = None
    """write the resolved flags (defaults, preset, --config, the command line) to this YAML or JSON file and
    exit without training"""
    exp_name: str = "default"
    """the name of this experiment; part of the run folder's name"""
    seed: int = 42
    """seed of the experiment; envs, action sampling and shuffling derive their seeds from it"""
    cuda: bool = False
    """train on the GPU (NCCL between GPU ranks, gloo otherwise)"""
    player_on_gpu: bool = False
    """with --cuda, run the player on the GPU too (decoupled mode only)"""
    torch_deterministic: bool = True
    """use deterministic torch algorithms (cudnn.deterministic)"""
    precision: PrecisionName = DEFAULT_PRECISION
    """the networks' numeric precision (Lightning Fabric's names; its short ones bf16, 16 and 32 too): 32-true,
    bf16-mixed (bf16 autocast, float32 weights), 16-mixed (fp16 autocast and loss scaling; CUDA only), bf16-true
    (bf16 weights); the heads, losses, statistics, buffers and checkpoints stay float32 in every one"""
    compile: bool = False
    """torch.compile the acting forward and the update's losses (the compile time is reported on its own line and
    left out of the env steps/s)"""
    compile_mode: CompileMode = "default"
    """torch.compile's mode with --compile: default, reduce-overhead (CUDA graphs on a GPU) or max-autotune"""
    cuda_graphs: bool = False
    """with --cuda, capture each gradient step (PPO's minibatch steps, SAC's gradient steps), each acting step and PPO's
    GAE as CUDA graphs, which the GPU replays without the host launching their kernels one by one (among several
    learners, with each gradient average run between two graphs); on by default with --cuda for one learner, where
    they can serve (not 16-mixed, --compile or --target-kl) and were measured faster (not yet a recurrent policy,
    whose captured replay steps its LSTM one step at a time), off elsewhere"""

    num_envs: int = 2
    """the number of parallel environments per rank"""
    vector_mode: VectorMode = "sync"
    """how a rank steps its envs: sync (in its process), async (a process per env), native (the env's own
    vectorized implementation, many times faster where one exists: CartPole, ale-py's Atari), envpool (envpool's
    C++ pool: Atari, classic control), auto (native where it exists)"""
    share_data: bool = False
    """coupled: all-gather each batch so every rank trains on a shard of everyone's data;
    decoupled: broadcast one batch that the trainers split, instead of one batch per trainer"""
    env_id: str = "CartPole-v1"
    """the id of the gymnasium environment (ALE/Pong-v5 and the other Atari games with the atari extra); an id of
    your own as my_package.my_module:MyEnv-v0 imports the module, which registers it"""
    env_kwargs: Annotated[str, JSON_OBJECT] = "{}"
    """keyword arguments for the env's gym.make, as a JSON object ('{"continuous": true}'; a dict in Python and
    config files); the run saves them and evaluation makes its envs with them again"""
    env_kwarg: Annotated[list[str], tyro.conf.UseAppendAction] = field(default_factory=list)
    """one keyword argument for gym.make as key=value (the value read as JSON where it parses: true, 3, 0.5,
    "text"; else as text), repeatable; added to --env-kwargs"""
    encoder: EncoderKind = "auto"
    """how observations become features: cnn (the Nature-DQN CNN, for image observations), mlp, or
    auto (cnn for images, mlp for vectors)"""
    time_feature: bool = False
    """vector observations: append the elapsed fraction of the env's time limit to each observation (rl-zoo's
    TimeFeatureWrapper), so the critic can tell how much of the episode is left"""
    grayscale: bool = True
    """image observations: convert colour frames to grayscale"""
    resize: int = 84
    """image observations: resize frames to this square side in pixels (0 keeps their size)"""
    frame_stack: int = 4
    """image observations: stack this many consecutive frames into one observation (1: none)"""
    noop_max: int = 30
    """Atari: start each game with up to this many no-op actions"""
    frame_skip: int = 4
    """Atari: repeat each action this many frames"""
    episodic_life: bool = True
    """Atari, training only: a lost life ends the episode for the learner (the game goes on; the logged
    return is the whole game's score)"""
    clip_rewards: bool = True
    """Atari, training only: the learner sees the sign of each reward (the logged return is the game's score)"""
    capture_video: bool = False
    """record videos of rank 0's first environment into the run folder"""
    total_timesteps: int = 2**16
    """total environment steps, counted across all ranks; a run trains the whole global iterations that fit"""
    gamma: float = 0.99
    """the discount factor"""
    use_sde: bool = False
    """explore with generalized state-dependent exploration (gSDE, continuous actions): the noise is a function of
    the policy's features through a random matrix, redrawn every --sde-sample-freq steps and at each rollout's start
    (PPO) or learning phase's start (SAC), as in Stable-Baselines3"""
    sde_sample_freq: int = -1
    """with --use-sde: env steps between two draws of the noise matrix within a rollout; -1 draws it only at the
    rollout's (or learning phase's) start"""

    eval_episodes: int = 10
    """greedy evaluation episodes at the end of training (0 skips the evaluation)"""
    logger: tuple[LoggerName, ...] = ("tensorboard",)
    """where the run logs its scalars, one or several: tensorboard (event files), csv (RUN/csv/metrics.csv) and
    wandb (Weights & Biases, offline without a network; pip install -e '.[tracking]'), through Lightning's loggers;
    --logger alone logs no scalars"""
    log_dir: str = "logs"
    """root folder of the TensorBoard logs and run folders"""
    progress_bar: bool = True
    """show a progress bar on rank 0"""
    checkpoint_every: str = "0"
    """write a training checkpoint every this many env steps (8192), or this often (90s, 10m, 2h), which
    bounds the work a failure can cost whatever the speed (0: only at the end)"""
    keep_last: int = 3
    """how many of the newest training checkpoints to keep"""
    resume_from: str | None = None
    """continue the run saved in this training checkpoint, with the run's own flags where none are given (same envs,
    network and seed; coupled ranks, decoupled players and trainers may change in number)"""
    run_name: str | None = None
    """the run folder's name under --log-dir (default: experiment, env, seed and start time, then _2, _3 for runs
    started in the same second; under torchrun, the job's --rdzv-id instead of the time); a run whose folder holds a
    checkpoint resumes from its newest, with the run's own flags where none are given"""
    torch_threads: int = 0
    """torch threads per process; 0: one for an MLP, and for a CNN the machine's cores divided by the local
    processes"""
    collective_timeout: float = 300.0
    """seconds a collective may wait for a peer, and a starting process for the job's others to join, before the
    job fails (instead of gloo's 30 minutes)"""


@dataclass
class CoupledFlags:
    """Coupled mode's own flags (train_fabric.py, train_torch.py)."""

    eval_every: int = 0
    """coupled mode: also evaluate --eval-episodes greedy episodes every this many env steps during training,
    on rank 0 while the others wait (within --collective-timeout), logged as Eval/return_mean, keeping the best
    agent as best.ckpt (0: only at the end)"""
    stop_at_return: float | None = None
    """coupled mode: end training, as at its last step, once an --eval-every evaluation's mean return reaches
    this"""


@dataclass
class DecoupledFlags:
    """Decoupled mode's own flags (train_fabric_decoupled.py)."""

    pipeline: bool = False
    """decoupled mode: the players collect the next batch while the trainers train on this one
    (they act with weights exactly one update old)"""
    num_players: int = 1
    """decoupled mode: processes that run envs and act (ranks 0..K-1); the trainers learn from the union of
    their batches"""
    asynchronous: Annotated[bool, tyro.conf.arg(name="async")] = False
    """decoupled mode: the players never wait for the trainers beyond --max-policy-lag updates, and act
    with the newest weights they have been sent"""
    max_policy_lag: int = 1
    """decoupled mode with --async: how many updates the weights a batch was collected with may trail
    the weights it is trained on (logged as Info/policy_lag)"""
    evaluator: bool = False
    """decoupled mode: one more process evaluates the newest weights whenever it is free (never making
    anyone wait), logs Eval/ scalars and keeps the best agent as best.ckpt"""


@dataclass
class HogwildFlags:
    """Hogwild mode's own flags (train_hogwild.py)."""

    workers: int = 1
    """Hogwild mode (train_hogwild.py): worker processes, each with its own envs, training one set of networks"""
    sync: Literal["shared", "synced"] = "shared"
    """Hogwild mode: shared (every worker steps the global networks lock-free) or synced (each trains a
    copy and merges it with the global networks every --sync-every updates)"""
    sync_every: int = 1
    """Hogwild synced mode: a worker's updates between two merges with the global networks"""


MODE_GROUPS: dict[str, type] = {"coupled": CoupledFlags, "decoupled": DecoupledFlags, "hogwild": HogwildFlags}
# How each mode is launched, for advice that sends a user to another mode's entry script.
MODE_COMMANDS = {
    "coupled": "coupled mode: fabric run ... train_fabric.py ...",
    "decoupled": "decoupled mode: fabric run ... train_fabric_decoupled.py ...",
    "hogwild": "Hogwild mode: python train_hogwild.py ...",
}


@dataclass
class RunConfig(HogwildFlags, DecoupledFlags, CoupledFlags, RunFlags):
    """What every algorithm shares: the run-level flags, then each mode's own group (fields gather from the
    last base to the first)."""

    # Each mode's own flags, from its group: the other modes' entry scripts do not take them (`mode_view`).
    MODE_FIELDS: ClassVar[dict[str, tuple[str, ...]]] = {
        mode: tuple(member.name for member in fields(group)) for mode, group in MODE_GROUPS.items()
    }
    ALGORITHM: ClassVar[str]  # the algorithm's name on the command line, and in config files
    # Tuned starting points by name (`--preset`), each a mapping of field names to values.
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    REPORT_FLAG: ClassVar[str | None] = None  # the flag that sets the steps between reports, where there is one
    # Fields a resumed run must share with its checkpoint: they shape the envs, the networks or the random streams.
    IMMUTABLE = (
        "seed",
        "env_id",
        "env_kwargs",
        "env_kwarg",
        "num_envs",
        "vector_mode",
        "num_players",
        "encoder",
        "use_sde",
        "grayscale",
        "resize",
        "time_feature",
        "frame_stack",
        "frame_skip",
    )
    # Fields that hold one rank's share: coupled ranks resumed at another world size rescale them.
    PER_RANK: ClassVar[tuple[str, ...]] = ("num_envs",)
    POSITIVE = (
        "num_envs",
        "total_timesteps",
        "keep_last",
        "collective_timeout",
        "workers",
        "sync_every",
        "num_players",
        "frame_stack",
        "frame_skip",
    )
    NON_NEGATIVE = ("eval_episodes", "eval_every", "torch_threads", "max_policy_lag", "resize", "noop_max")

    @property
    def steps_per_row(self) -> int:
        """Env steps one row of a batch holds (a recurrent policy's row is a whole sequence)."""
        return 1

    @property
    def steps_per_iteration(self) -> int:
        """Env steps one rank collects between two learning phases."""
        raise NotImplementedError

    def preprocessing(self) -> Preprocessing:
        """How the envs are made: gym.make's keyword arguments, and how image observations are prepared."""
        return Preprocessing(
            self.grayscale,
            self.resize,
            self.frame_stack,
            self.noop_max,
            self.frame_skip,
            tuple(sorted(self.make_kwargs().items())),
            self.time_feature,
        )

    def env_kwargs_flag(self, keys: Iterable[str]) -> str:
        """The flag that gave these of the env's keyword arguments: --env-kwarg where it gave each of them."""
        given_alone = {item.partition("=")[0] for item in self.env_kwarg}
        return "--env-kwarg" if set(keys) <= given_alone else "--env-kwargs"

    def make_kwargs(self) -> dict[str, Any]:
        """--env-kwargs with each --env-kwarg added; raises `UsageError` naming the flag that does not parse."""
        try:
            kwargs = json.loads(self.env_kwargs)
        except json.JSONDecodeError as error:
            raise UsageError("--env-kwargs", f"is not JSON ({error}): {self.env_kwargs!r}") from None
        if not isinstance(kwargs, dict):
            raise UsageError("--env-kwargs", f"must be a JSON object of keyword arguments, got {self.env_kwargs!r}")
        for item in self.env_kwarg:
            key, equals, text = item.partition("=")
            if not equals or not key.isidentifier():
                raise UsageError("--env-kwarg", f"takes key=value with a keyword for a key, got {item!r}")
            try:
                kwargs[key] = json.loads(text)
            except json.JSONDecodeError:
                kwargs[key] = text
        return kwargs

    @property
    def checkpoint_steps(self) -> int:
        """--checkpoint-every as env steps (0: a time, or only at the end)."""
        return checkpoint_interval(self.checkpoint_every)[0]

    @property
    def checkpoint_seconds(self) -> float:
        """--checkpoint-every as seconds (0: env steps, or only at the end)."""
        return checkpoint_interval(self.checkpoint_every)[1]

    def global_iteration_steps(self, env_ranks: int) -> int:
        """Env steps of one global iteration: every env rank's steps between two learning phases."""
        return self.steps_per_iteration * env_ranks

    def num_iterations(self, env_ranks: int) -> int:
        return self.total_timesteps // self.global_iteration_steps(env_ranks)

    def trained_timesteps(self, env_ranks: int) -> int:
        """The env steps a run trains to: --total-timesteps rounded down to whole global iterations."""
        return self.num_iterations(env_ranks) * self.global_iteration_steps(env_ranks)

    def iterations_per_report(self, env_ranks: int) -> int:
        """Iterations between two logged points (and interrupt and checkpoint checks)."""
        return 1

    # Fields whose default follows other fields (with --cuda, the fastest setting measured on a GPU) until a command
    # line, preset, config file or caller sets them; `following_defaults` gives their values.
    FOLLOWING_DEFAULTS: ClassVar[tuple[str, ...]] = ("cuda_graphs",)
    # Set by fill_defaults (and when built, for the fields not named): the value each following field took by
    # default (filling the defaults again chooses anew, and a learner among several steps aside from graphs that came
    # by default, as that is not yet measured on several GPUs), and the following fields that were chosen, which keep
    # their values. InitVars rather than fields (no flag, no key of a config file), which `dataclasses.replace`
    # passes on to the copy as it does fields. Annotated with objects rather than this module's strings: Python 3.10's
    # `typing.get_type_hints` (which tyro calls) refuses a string that names an InitVar.
    __annotations__["followed"] = InitVar[Annotated[frozenset, tyro.conf.Suppress]]
    followed = frozenset()  # (field name, value by default)
    __annotations__["chosen_defaults"] = InitVar[Annotated[frozenset, tyro.conf.Suppress]]
    chosen_defaults = frozenset()  # field names
    # The fields that the caller who built this config by hand named (or set on it since, for the following ones),
    # until fill_defaults takes them into account, so that one given its default value (`cuda_graphs=False` with
    # `cuda=True`) counts as chosen (`rl.api.completed`); set by `__new__`, which sees the caller's arguments, and
    # passed on by `dataclasses.replace`, which names every field.
    __annotations__["named_when_built"] = InitVar[Annotated[frozenset, tyro.conf.Suppress]]
    named_when_built = frozenset()

    def __new__(cls, *args: Any, **kwargs: Any) -> RunConfig:
        config = super().__new__(cls)
        if "followed" not in kwargs:  # built, not copied
            positional = list(inspect.signature(cls.__init__).parameters)[1 : 1 + len(args)] if args else []
            config.named_when_built = frozenset([*positional, *kwargs])
        return config

    def __post_init__(self, followed: frozenset, chosen_defaults: frozenset, named_when_built: frozenset) -> None:
        built = "named_when_built" in vars(self)  # set by __new__ for a config built, not copied
        self.followed, self.chosen_defaults = followed, chosen_defaults
        if named_when_built:  # a copy's, of the config it copies
            self.named_when_built = named_when_built
        # The fields its builder did not name follow from the start: a copy that changes one
        # (`dataclasses.replace(config, cuda_graphs=False)`) is then told from a copy that keeps it.
        if built:
            self.follow_defaults(self.named_when_built)

    def follow_defaults(self, chosen: Iterable[str]) -> None:
        """Give the following fields not `chosen` the values that follow from the others, by default."""
        values = {name: value for name, value in self.following_defaults().items() if name not in chosen}
        for name, value in values.items():
            super().__setattr__(name, value)  # by default: not named, as `__setattr__` would make it
        self.followed = frozenset(values.items())

    def __setattr__(self, name: str, value: Any) -> None:
        """A following field set on a built config (`config.cuda_graphs = False`) counts as named, as if built so."""
        super().__setattr__(name, value)
        if name in self.FOLLOWING_DEFAULTS and "chosen_defaults" in vars(self):  # built: __post_init__ has run
            super().__setattr__("named_when_built", self.named_when_built | {name})
            super().__setattr__("followed", frozenset(pair for pair in self.followed if pair[0] != name))

    def fill_defaults(self, given: set[str]) -> None:
        """Defaults that follow from other fields; `given`: the fields set by the command line or the preset.

        A following field is chosen once given, unless it holds the value it took by default; one that took a
        value by default and now holds another (changed by `dataclasses.replace`) is chosen too, whether or not it
        is given."""
        chosen, took = set(self.chosen_defaults), dict(self.followed)
        for name in self.FOLLOWING_DEFAULTS:
            if name in took:  # it took a value by default: chosen if it now holds another
                if getattr(self, name) != took[name]:
                    chosen.add(name)
            elif name in given:
                chosen.add(name)
        self.chosen_defaults = frozenset(chosen)
        self.follow_defaults(chosen)
        self.named_when_built = frozenset()  # `given` held them, if they counted

    def with_changes(self: RunConfigT, **changes: Any) -> RunConfigT:
        """A copy with `changes` (field names), each of them chosen: `dataclasses.replace` keeps track of the
        following defaults too, but takes a following field changed to the value it took by default as still
        following."""
        copy = dataclasses.replace(self, **changes)
        copy.chosen_defaults = self.chosen_defaults | (set(changes) & set(self.FOLLOWING_DEFAULTS))
        copy.followed = frozenset((name, value) for name, value in self.followed if name not in copy.chosen_defaults)
        return copy

    def came_by_default(self, name: str) -> bool:
        """Whether following field `name` holds the value fill_defaults gave it, rather than one chosen."""
        return (name, getattr(self, name)) in self.followed

    def following_defaults(self) -> dict[str, Any]:
        """The values of FOLLOWING_DEFAULTS where none is chosen. CUDA graphs: on with --cuda where they can serve
        and were measured faster; --compile with graphs was not measured, so it stays a choice."""
        return {
            "cuda_graphs": self.cuda
            and not self.compile
            and self.cuda_graphs_refusal() is None
            and self.cuda_graphs_measured_faster()
        }

    def cuda_graphs_measured_faster(self) -> bool:
        """Whether CUDA graphs were measured faster on a GPU for this kind of run (then on by default)."""
        return True

    def cuda_graphs_refusal(self) -> str | None:
        """Why this run's steps cannot be captured as CUDA graphs (a --cuda-graphs error's end), or None."""
        if not self.cuda:
            return "captures the learner's step on a GPU: add --cuda"
        if self.precision == "16-mixed":
            return "cannot capture 16-mixed's loss scaler, which changes its scale on the host: use bf16-mixed"
        if self.compile and self.compile_mode == "reduce-overhead":
            return "and --compile-mode reduce-overhead both capture CUDA graphs: keep one of them"
        return None

    def validate_algorithm(self) -> None:
        """The algorithm's own checks; raise `UsageError` naming the flag."""

    def validate_steps(self, env_ranks: int) -> None:
        """The algorithm's checks of the env steps a run trains (`trained_timesteps`); raise `UsageError`."""

    def validate_decoupled(self, num_trainers: int) -> None:
        """What the algorithm needs to feed `num_trainers` trainers from one player."""

    def validate_learner_rows(self, num_trainers: int | None) -> None:
        """The algorithm's checks of the rows each learner trains on: its rank's own (`num_trainers` None), or a
        decoupled trainer's share of the players' batches."""

    def learners_shares(self, mode: str) -> tuple[str, ...]:
        """The PER_RANK fields that hold one learner's share of the global batch in `mode` (a decoupled trainer's);
        the others hold one env process's share of the envs (a decoupled player's)."""
        return tuple(name for name in self.PER_RANK if name != "num_envs")

    def share_unit(self, name: str) -> tuple[int, str]:
        """What each share of PER_RANK field `name` must be a whole number of, and its words ("whole sequences of
        --num-steps 128"); (1, "") where any whole number serves."""
        return 1, ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def checkpoint_interval(text: str) -> tuple[int, float]:
    """`--checkpoint-every` as (env steps, seconds), one of them 0: "8192" (or "1e5", as the whole-number flags take
    it) is steps, "90s", "10m", "2h" a time."""
    value = str(text).strip().lower()
    try:
        if value[-1:] in TIME_UNITS:
            seconds = float(value[:-1]) * TIME_UNITS[value[-1]]
            if 0 < seconds < math.inf:
                return 0, seconds
        elif WHOLE_NUMBER_IN_EXPONENT_FORM.fullmatch(value) and float(value).is_integer():
            return int(float(value)), 0.0
        elif int(value) >= 0:
            return int(value), 0.0
    except ValueError:
        pass
    raise UsageError("--checkpoint-every", f"give env steps (8192) or a positive time (90s, 10m, 2h), got {text!r}")


RENAMED_FLAGS = {"asynchronous": "--async"}  # fields whose flag is a Python keyword


def flag(field_name: str) -> str:
    """The command-line spelling of a config field."""
    return RENAMED_FLAGS.get(field_name, "--" + field_name.replace("_", "-"))


def check_signs(cfg: RunConfig, positive: tuple[str, ...], non_negative: tuple[str, ...] = ()) -> None:
    for name in positive:
        if not getattr(cfg, name) > 0:
            raise UsageError(flag(name), f"must be positive, got {getattr(cfg, name)}")
    for name in non_negative:
        if getattr(cfg, name) < 0:
            raise UsageError(flag(name), f"must not be negative, got {getattr(cfg, name)}")


LONGEST_TIMEOUT_SECONDS = timedelta.max.total_seconds()  # the longest span Python's timedelta (gloo's timeout) holds


def check_seed(seed: int, bits: int = 63, seeded: str = "torch") -> None:
    """A seed that `seeded` takes: at least 0 and below 2**`bits`."""
    if seed < 0:
        raise UsageError("--seed", f"must not be negative, got {seed}")
    if seed >= 2**bits:
        raise UsageError("--seed", f"must be below 2**{bits} ({seeded} takes no larger seed), got {seed}")


def check_finite_numbers(cfg: RunConfig) -> None:
    """No flag takes NaN or infinity: each would reach a loss, a comparison or a timeout as nonsense (a limit that
    is off has its own value: 0 or none)."""
    for member in fields(cfg):
        value = getattr(cfg, member.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(flag(member.name), f"must be a finite number, got {value}")


def validate(
    cfg: RunConfig, world_size: int, gpu_count: int, env_ranks: int | None = None, decoupled: bool = False
) -> None:
    """Check everything that does not need an environment; raise `UsageError` naming the flag.

    `env_ranks` is how many processes run environments: all of them unless given (decoupled
    mode runs them on the player alone).
    """
    env_ranks = world_size if env_ranks is None else env_ranks
    trainers = trainer_count(world_size, env_ranks, cfg.evaluator) if decoupled else None
    validate_values(cfg, env_ranks, trainers)
    validate_hardware(cfg, world_size, gpu_count, env_ranks, decoupled)


def validate_values(cfg: RunConfig, env_ranks: int, num_trainers: int | None = None, stepper: str = "rank") -> None:
    """The checks of `validate` that any machine makes alike: of the values and how they fit `env_ranks` (and,
    in decoupled mode, `num_trainers`); `stepper` names a process that steps envs (a player, a Hogwild worker)."""
    check_finite_numbers(cfg)
    check_seed(cfg.seed)
    check_signs(cfg, cfg.POSITIVE, cfg.NON_NEGATIVE)
    if cfg.collective_timeout > LONGEST_TIMEOUT_SECONDS:
        longest = f"{LONGEST_TIMEOUT_SECONDS:.0f}"
        raise UsageError("--collective-timeout", f"must be at most {longest} seconds, got {cfg.collective_timeout}")
    checkpoint_interval(cfg.checkpoint_every)
    if cfg.run_name is not None and not is_folder_name(cfg.run_name):
        raise UsageError("--run-name", folder_name_refusal(cfg.run_name))
    if not 0.0 < cfg.gamma <= 1.0:
        raise UsageError("--gamma", f"must be in (0, 1], got {cfg.gamma}")
    if cfg.sde_sample_freq == 0 or cfg.sde_sample_freq < -1:
        raise UsageError(
            "--sde-sample-freq", f"must be positive, or -1 for one draw per rollout; got {cfg.sde_sample_freq}"
        )
    cfg.make_kwargs()
    cfg.validate_algorithm()
    cfg.validate_learner_rows(num_trainers)
    check_checkpoint_steps(cfg, env_ranks)
    global_iteration = cfg.global_iteration_steps(env_ranks)
    if cfg.total_timesteps < global_iteration:
        raise UsageError(
            "--total-timesteps",
            f"{cfg.total_timesteps} is smaller than one global {iteration_name(cfg)} "
            f"({counted(env_ranks, stepper)} x {counted(cfg.num_envs, 'env')} x "
            f"{counted(cfg.steps_per_iteration // cfg.num_envs, 'step')} = {global_iteration})",
        )
    cfg.validate_steps(env_ranks)
    if cfg.player_on_gpu and not cfg.cuda:
        raise UsageError("--player-on-gpu", "needs --cuda as well")
    check_precision_device(cfg.precision, cfg.cuda)
    check_periodic_evaluation(cfg)
    check_cuda_graphs(cfg)
    if cfg.compile_mode != "default" and not cfg.compile:
        raise UsageError("--compile-mode", "chooses how --compile compiles; add --compile (or drop the flag)")


def validate_hardware(cfg: RunConfig, world_size: int, gpu_count: int, env_ranks: int, decoupled: bool) -> None:
    """The checks of `validate` against this machine: its GPUs and compiler, and the launcher that started it."""
    if cfg.cuda and gpu_count == 0:
        raise UsageError("--cuda", "no CUDA GPU is available on this machine")
    gpu_ranks_here = sum(uses_gpu(cfg, rank, world_size, decoupled) for rank in ranks_on_this_node())
    if gpu_count < gpu_ranks_here:
        raise UsageError(
            "--cuda",
            f"needs a GPU for each of the {gpu_ranks_here} processes here that compute on one, found {gpu_count}",
        )
    launcher_accelerator = os.environ.get("LT_ACCELERATOR")
    if launcher_accelerator in ("cuda", "gpu") and not cfg.cuda:
        raise UsageError(
            "--cuda",
            f"fabric run --accelerator={launcher_accelerator} was given, but without --cuda "
            "every process trains on the CPU: add --cuda",
        )
    check_launcher_strategy(os.environ.get("LT_STRATEGY"))
    check_launcher_devices(os.environ.get("LT_DEVICES"))
    check_equal_nodes(world_size)
    check_precision_on_this_gpu(cfg.precision, cfg.cuda)
    warn_of_emulated_bf16(cfg.precision, cfg.cuda)
    if cfg.compile:  # every role on a GPU compiles with Triton; a CPU role needs a C++ compiler
        check_compiler(cfg.cuda and (cfg.player_on_gpu or env_ranks == world_size) and not cfg.evaluator)


# `fabric run --strategy` values that name what every coupled run does: DDP's process group, over which the learners
# average their gradients themselves (no module is wrapped, so no parameter goes unused).
LAUNCHER_STRATEGIES = ("auto", "ddp", "ddp_find_unused_parameters_true")


def check_launcher_strategy(strategy: str | None) -> None:
    """`fabric run --strategy` (None: not given): DP, FSDP and DeepSpeed shard or wrap a module, which no mode has."""
    if strategy is not None and strategy not in LAUNCHER_STRATEGIES:
        raise UsageError(
            "--strategy",
            f"fabric run --strategy={strategy}: every process here keeps whole networks and averages their gradients "
            "over DDP's process group itself: give --strategy=ddp, or leave it out",
        )


def check_launcher_devices(devices: str | None) -> None:
    """`fabric run --devices` (None: not given) counts the processes on each machine: a list of GPUs would choose
    them, which this program does itself, each process by its place on the machine."""
    if devices is not None and ("," in devices or "[" in devices):
        raise UsageError(
            "--devices",
            f"fabric run --devices={devices}: each process here takes its GPU by its place on the machine: give "
            "a count (--devices=2), and choose the GPUs with CUDA_VISIBLE_DEVICES",
        )


def check_equal_nodes(world_size: int) -> None:
    """Under torchrun, every node runs as many processes: Fabric places a job's processes as nodes x processes per
    node, and a node that started another number would fail in Fabric's own check, on some ranks only."""
    nodes = os.environ.get("GROUP_WORLD_SIZE")
    if nodes is not None and int(nodes) * local_world_size_from_env() != world_size:
        raise UsageError(
            "--nproc-per-node",
            f"this node runs {counted(local_world_size_from_env(), 'process', 'processes')}, but the job's "
            f"{nodes} nodes run {world_size} in all: give every node's torchrun the same --nproc-per-node",
        )


def check_cuda_graphs(cfg: RunConfig) -> None:
    """Refuse the combinations a captured step cannot take, before training."""
    refusal = cfg.cuda_graphs_refusal() if cfg.cuda_graphs else None
    if refusal is not None:
        raise UsageError("--cuda-graphs", refusal)


def check_checkpoint_steps(cfg: RunConfig, env_ranks: int) -> None:
    """A checkpoint interval in steps no finer than the reports, where every mode checks whether one is due."""
    report = cfg.iterations_per_report(env_ranks) * cfg.global_iteration_steps(env_ranks)
    if 0 < cfg.checkpoint_steps < report:
        shorter = f"; or report more often with {cfg.REPORT_FLAG}" if cfg.REPORT_FLAG else ""
        raise UsageError(
            "--checkpoint-every",
            f"{counted(cfg.checkpoint_steps, 'step')} is finer than the run's reports, every "
            f"{report} env steps, which is when checkpoints are written: give {report} or more"
            f"{shorter}",
        )


def check_periodic_evaluation(cfg: RunConfig) -> None:
    if cfg.eval_every and cfg.eval_episodes == 0:
        raise UsageError("--eval-every", "evaluates --eval-episodes episodes each time; give at least 1")
    if cfg.stop_at_return is not None and not cfg.eval_every:
        raise UsageError("--stop-at-return", "is checked at each --eval-every evaluation; add --eval-every STEPS")


def iteration_name(cfg: RunConfig) -> str:
    return getattr(cfg, "ITERATION_NAME", "iteration")


def trainer_count(world_size: int, num_players: int, evaluator: bool) -> int:
    """A decoupled job's trainers: the processes that are neither players nor the evaluator."""
    return world_size - num_players - int(evaluator)


@dataclass(frozen=True)
class ProcessCount:
    """How a job's number of processes is set, as the checks of its roles name it: the flag, and how to get more."""

    flag: str
    more: str

    @staticmethod
    def here() -> ProcessCount:
        """As this process was started: by fabric run, by torchrun, or alone (a script, or code run otherwise)."""
        if os.environ.get("LT_CLI_USED") == "1":  # fabric run's, which starts its processes through torchrun
            return ProcessCount("--devices", "launch more processes (fabric run --devices)")
        if "WORLD_SIZE" in os.environ:
            return ProcessCount("--nproc-per-node", "launch more processes (torchrun --nproc-per-node)")
        return ProcessCount("--devices", f"launch it with fabric run --accelerator=cpu --devices=2 {script_run()}")


def script_run() -> str:
    """The script this process runs, as Python was given it; "SCRIPT" where it runs none of its own: a notebook (whose
    kernel's launcher is `sys.argv[0]`), `python -c`, an interactive session."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    ran = main_file is not None and os.path.abspath(main_file) == os.path.abspath(sys.argv[0])
    return sys.argv[0] if ran and sys.argv[0].endswith(".py") else "SCRIPT"


def validate_decoupled(cfg: RunConfig, world_size: int, processes: ProcessCount | None = None) -> int:
    """Check the decoupled roles `world_size` processes make (their number set as `processes` says, by default as
    this process was started); the number of trainers."""
    processes = processes or ProcessCount.here()
    if world_size < 2:
        raise UsageError(
            processes.flag,
            f"decoupled mode needs at least 2 processes (a player and a trainer), got {world_size}: {processes.more}",
        )
    if cfg.evaluator and world_size < 3:
        raise UsageError(
            "--evaluator",
            f"needs a third process (a player, a trainer and the evaluator), got {world_size}: {processes.more}",
        )
    if cfg.evaluator and cfg.eval_episodes == 0:
        raise UsageError("--evaluator", "evaluates --eval-episodes episodes each time; give at least 1")
    num_trainers = trainer_count(world_size, cfg.num_players, cfg.evaluator)
    if num_trainers < 1:
        raise UsageError(
            "--num-players",
            f"{world_size} processes leave no trainer beside {counted(cfg.num_players, 'player')}"
            f"{' and the evaluator' if cfg.evaluator else ''}: {processes.more}",
        )
    if cfg.asynchronous and cfg.pipeline:
        raise UsageError("--pipeline", "is --async with a lag of exactly 1 update; give one of them")
    if cfg.max_policy_lag != 1 and not cfg.asynchronous:
        raise UsageError("--max-policy-lag", "bounds the policy lag of --async; add --async (or drop the flag)")
    cfg.validate_decoupled(num_trainers)
    return num_trainers


_RULE = re.compile(r"^[\s╭╮╰╯│─-]*$")
Config = TypeVar("Config")
RunConfigT = TypeVar("RunConfigT", bound=RunConfig)


def other_modes_fields(config_type: type[RunConfig], mode: str) -> list[str]:
    return [name for other, names in config_type.MODE_FIELDS.items() if other != mode for name in names]


@functools.cache
def mode_view(config_type: type[RunConfigT], mode: str | None) -> type[RunConfigT]:
    """`config_type` as one mode's entry script parses it: without the other modes' flags (all of them: None)."""
    if mode is None:
        return config_type
    hidden = other_modes_fields(config_type, mode)
    hints = typing.get_type_hints(config_type, include_extras=True)
    defaults = config_type()
    suppressed = [
        (name, Annotated[hints[name], tyro.conf.Suppress], field(default=getattr(defaults, name))) for name in hidden
    ]
    view = dataclasses.make_dataclass(config_type.__name__, suppressed, bases=(config_type,))
    view.__doc__ = config_type.__doc__  # --help's description
    setattr(view, VIEW_MARK, True)
    return view


def parse_config_flags(
    config_type: type[RunConfigT],
    argv: list[str],
    prog: str | None = None,
    mode: str | None = None,
    log_subdir: str | None = None,
) -> RunConfigT:
    """A run config from the command line; `--preset NAME` replaces the defaults with the preset's values, and a
    resumed run's own flags (`--resume-from`'s, or those of the run `--run-name` names in `log_subdir`) the
    defaults and the preset's.

    `mode`: the flags of that mode's entry script (its own, and those every mode shares)."""
    path_flags = {spelling: flag(name) for name in PATH_FIELDS for spelling in (flag(name), f"--{name}")}
    argv = respelled(argv, path_flags, home_expanded_flag)
    config_path = flag_value(argv, "--config")
    checkpoint = flag_value(argv, "--resume-from") or named_runs_newest_checkpoint(
        flag_value(argv, "--run-name"), flag_value(argv, "--log-dir") or RunFlags.log_dir, log_subdir
    )
    if config_path is not None:
        from_file = config_file_values(config_type, config_path)
    else:  # a resumed run's own flags, where it has them
        from_file = resumed_run_values(config_type, checkpoint, mode) if checkpoint else {}
    name = flag_value(argv, "--preset") or from_file.get("preset")
    flags_file = config_path or (resumed_run_flags_file(checkpoint) if checkpoint else None)
    check_one_preset(name, from_file, flags_file)
    preset = {} if name is None else preset_values(config_type, name)
    base = preset | from_file | ({} if name is None else {"preset": name})
    argv = command_line_spellings(config_type, argv)
    view = mode_view(config_type, mode)
    parsed = parse_dataclass(view, argv, prog, view(**base) if base else None)
    cfg = config_type(**{member.name: getattr(parsed, member.name) for member in fields(config_type)})
    cfg.precision = launcher_precision() or cfg.precision
    on_command_line = fields_on_command_line(config_type, argv)
    check_given_alone(cfg, on_command_line)
    for name in displaced_by(cfg, on_command_line) & (set(base) - on_command_line):  # a file's, a resumed run's
        setattr(cfg, name, getattr(config_type(), name))
    cfg.fill_defaults(set(base) | on_command_line)
    return cfg


# Fields of which a run takes one: decoupled mode's schedules.
ALTERNATIVES = (frozenset({"pipeline", "asynchronous"}),)


def displaced_by(cfg: RunConfig, chosen: set[str]) -> set[str]:
    """The fields that those of `chosen` set on displace: the others of their `ALTERNATIVES` (--async given on the
    command line displaces a resumed run's or a config file's --pipeline)."""
    set_on = {name for name in chosen if getattr(cfg, name, False) is True}
    return {other for group in ALTERNATIVES if group & set_on for other in group - set_on}


LONGEST_FOLDER_NAME = 255  # bytes: the longest name a folder takes on Linux's and macOS's file systems


def name_bytes(name: str) -> int:
    """How long `name` is where the file system counts it (`LONGEST_FOLDER_NAME`)."""
    return len(os.fsencode(name))


def is_folder_name(name: str) -> bool:
    """Whether `name` names one folder inside another: not blank, no path, not `.` or `..`, not too long."""
    named = bool(name.strip()) and os.sep not in name and name not in (os.curdir, os.pardir)
    return named and name_bytes(name) <= LONGEST_FOLDER_NAME


def folder_name_refusal(name: str) -> str:
    """Why `name` names no folder (`is_folder_name`)."""
    if name_bytes(name) > LONGEST_FOLDER_NAME:
        return f"must be a folder name, at most {LONGEST_FOLDER_NAME} bytes long; got {name_bytes(name)}"
    return f"must be a folder name, without {os.sep}; got {name!r}"


def named_runs_newest_checkpoint(run_name: str | None, log_dir: str, log_subdir: str | None) -> str | None:
    """The newest checkpoint of the run `--run-name` names, which the run resumes from; None for a new run."""
    if run_name is None or log_subdir is None or not is_folder_name(run_name):
        return None  # a name that is no folder's is refused with the other flags
    return newest_checkpoint(os.path.join(log_dir, log_subdir, run_name))


def check_one_preset(name: str | None, from_file: dict[str, Any], flags_file: str | None) -> None:
    """Refuse a --preset beside flags written with another preset, or none: a --config file (a run folder's, a
    --write-config file's) or the resumed run's own. Their values come on top of the preset's and would override
    all that it sets, leaving a run labelled with a preset it does not follow."""
    if flags_file is None or "preset" not in from_file or from_file["preset"] == name:
        return
    made = "without a preset" if from_file["preset"] is None else f"with preset {from_file['preset']}"
    raise UsageError(
        "--preset",
        f"{flags_file} holds the flags of a run {made}, which override all that --preset {name} sets: "
        "give one or the other",
    )


def check_given_alone(cfg: RunConfig, on_command_line: set[str]) -> None:
    """Refuse a flag given on the command line that refines one the run goes without (a preset's value of it
    is left alone: `--preset pendulum-gsde --no-use-sde` trains the preset without gSDE)."""
    if "sde_sample_freq" in on_command_line and not cfg.use_sde:
        raise UsageError(
            "--sde-sample-freq", "sets how often --use-sde redraws its noise; add --use-sde (or drop the flag)"
        )


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
CONFIG_FILENAME = "config.yaml"  # in every run folder: the run's resolved flags
NOT_IN_CONFIG_FILES = ("config", "write_config")  # what a config file neither sets nor keeps
# What a run folder's config file leaves out, so that --config given it repeats the run: a resumed run's
# checkpoint would make it resume that run, in its folder, again.
NOT_IN_RUN_FOLDER_CONFIG = ("resume_from",)
ALGORITHM_KEY = "algorithm"  # a config file's key that names the algorithm whose flags it holds
# Fields that name a file or folder, which a user may start with ~ where no shell expands it: a config file's value,
# Python's, or --log-dir=~/runs (a shell expands ~ at a word's start only).
PATH_FIELDS = ("config", "write_config", "log_dir", "resume_from")


def home_expanded(value: Any) -> Any:
    """A path that starts with ~ as the user's home names it; anything else as it is."""
    return os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value


def expand_home_in_paths(cfg: RunConfig) -> None:
    """Give each of `cfg`'s PATH_FIELDS that starts with ~ its home, as a shell would: else a run would write its
    checkpoints under a folder named ~ in the working directory, and TensorBoard's files (which expand it) apart."""
    for name in PATH_FIELDS:
        expanded = home_expanded(getattr(cfg, name))
        if expanded is not getattr(cfg, name):
            setattr(cfg, name, expanded)


def home_expanded_flag(name: str, value: str) -> str | None:
    """`--log-dir=~/runs` as `--log-dir=/home/me/runs`; None for a value that does not start with ~."""
    return f"{name}={home_expanded(value)}" if value.startswith("~") else None


class UnknownConfigKey(UsageError):
    """A `--config` file's key that is no flag of the config it was read for: perhaps another algorithm's."""

    def __init__(self, path: str, key: Any, name: str, config_type: type[RunConfig]) -> None:
        super().__init__("--config", f"{path} sets {key!r}, which is no flag of {config_type.__name__}")
        self.path, self.key, self.name = path, key, name


def config_file_values(config_type: type[RunConfig], path: str, others: bool = False) -> dict[str, Any]:
    """The fields a `--config` file sets, checked against `config_type`. `others`: leave out the keys that are no
    field of it, or whose value is not of its type (another algorithm's), rather than refuse them."""
    values = read_config_file(path)
    values.pop(ALGORITHM_KEY, None)  # it chose `config_type` (`config_file_algorithm`)
    known = {member.name: member for member in fields(config_type)}
    hints = typing.get_type_hints(config_type, include_extras=True)
    result = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in known or name in NOT_IN_CONFIG_FILES:
            if others:
                continue
            if name in NOT_IN_CONFIG_FILES:  # a flag of every algorithm, which a file cannot nest
                raise UsageError("--config", f"{path} sets {key!r}, which only the command line takes ({flag(name)})")
            raise UnknownConfigKey(path, key, name, config_type)
        try:
            result[name] = typed_value(hints[name], in_full(name, value))
        except (TypeError, ValueError):
            if others:
                continue
            message = f"{path} sets {key}: {value!r}, which is not {type_name(hints[name])}"
            raise UsageError("--config", message + schedule_advice(key, value, known)) from None
        if name in PATH_FIELDS:
            result[name] = home_expanded(result[name])
    return result


def schedule_advice(key: Any, value: Any, fields_here: dict[str, Any]) -> str:
    """For rl-zoo's linear schedule (`learning_rate: lin_3e-4`): what gives it here, if anything does."""
    if not (isinstance(value, str) and value.startswith("lin_")):
        return ""
    start = value.removeprefix("lin_")
    if key == "learning_rate" and "anneal_lr" in fields_here:
        return f": rl-zoo's linear schedule; give {key}: {start} with anneal_lr: true, which decays it linearly to 0"
    return f": rl-zoo's linear schedule, which this key does not take; give {key}: {start}"


def resumed_run_values(config_type: type[RunConfig], checkpoint: str, mode: str | None) -> dict[str, Any]:
    """With `--resume-from` and no `--config`: the flags the run was started with, for the command line to change:
    its folder's config file's, or for a checkpoint moved out of its folder the config the checkpoint holds; {}
    where there is neither. Another algorithm's fields, and another mode's than `mode`, are left out: the checkpoint
    names the algorithm and mode it was written in."""
    path = resumed_run_flags_file(checkpoint)
    values = (
        folder_config_values(config_type, path) if path != checkpoint else checkpoint_config_values(config_type, path)
    )
    values.pop("resume_from", None)  # a resumed run's flags name the checkpoint it resumed from
    values.pop("cuda_graphs", None)  # it followed from the run's --cuda: it follows this one's
    others = other_modes_fields(config_type, mode) if mode is not None else []
    return {name: value for name, value in values.items() if name not in others}


def resumed_run_flags_file(checkpoint: str) -> str:
    """Where a resumed run's own flags are kept: its folder's config file, or the checkpoint itself where it lies
    outside a run folder that has one (copied elsewhere, say)."""
    run_dir = run_dir_of(checkpoint)
    path = os.path.join(run_dir, CONFIG_FILENAME) if run_dir else ""
    return path if os.path.isfile(path) else checkpoint


def folder_config_values(config_type: type[RunConfig], path: str) -> dict[str, Any]:
    """The flags in a run folder's config file; {} for another algorithm's run."""
    if read_config_file(path).get(ALGORITHM_KEY, config_type.ALGORITHM) != config_type.ALGORITHM:
        return {}  # another algorithm's run, which the checkpoint's check names: its values mean other things here
    return config_file_values(config_type, path, others=True)


# Where a run resumed from a checkpoint outside its folder writes: its own folder, named as a new run's.
NOT_FROM_A_MOVED_CHECKPOINT = ("run_name", "log_dir")


def checkpoint_config_values(config_type: type[RunConfig], path: str) -> dict[str, Any]:
    """The flags a checkpoint's run was trained with, from the config the file holds, read without loading its
    tensors; {} for another algorithm's file, or one that cannot be read (resuming from it says why). A field
    that follows others (`FOLLOWING_DEFAULTS`) at the value they gave it is left to follow this run's flags."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # torch.load raises many kinds; the checks that load the file to resume name the problem
        return {}
    if not isinstance(state, dict) or state.get("algorithm") != config_type.ALGORITHM:
        return {}
    taken = {member.name for member in fields(config_type)} - {*NOT_IN_CONFIG_FILES, *NOT_FROM_A_MOVED_CHECKPOINT}
    saved = {name: value for name, value in dict(state.get("config") or {}).items() if name in taken}
    trained = config_type(**saved)
    following = trained.following_defaults()
    return {name: value for name, value in saved.items() if name not in following or following[name] != value}


CHECKPOINT_DIR = "checkpoints"  # a run folder's training checkpoints


def run_dir_of(checkpoint: str) -> str | None:
    """The run folder a checkpoint was written into (…/<run>/checkpoints/step_*.ckpt); None for one moved out of
    it, whose resumed run takes a folder of its own rather than write into whatever folder holds the file's. Named
    as a new run's folder is: relative to the working folder where it lies below it."""
    folder = Path(checkpoint).resolve().parent
    return as_given_here(str(folder.parent)) if folder.name == CHECKPOINT_DIR else None


def as_given_here(path: str) -> str:
    """`path` relative to the working folder where it lies below it (as the run folder is, by default)."""
    relative = os.path.relpath(path)
    return path if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def newest_checkpoint(run_dir: str) -> str | None:
    """The newest complete checkpoint of a run: a file interrupted mid-write is still `*.tmp`, never `step_*.ckpt`."""
    checkpoints = sorted((Path(run_dir) / CHECKPOINT_DIR).glob("step_*.ckpt"))
    return str(checkpoints[-1]) if checkpoints else None


def check_field_types(cfg: RunConfig) -> None:
    """Give each field of a config built in Python its flag's type, as a config file's values get it; raise
    `UsageError` naming the flag of a value that is not of that type (`num_envs="four"`, `logger="csv"` becomes
    `("csv",)`)."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for member in fields(cfg):
        value = getattr(cfg, member.name)
        try:
            typed = typed_value(hints[member.name], in_full(member.name, value))
        except (TypeError, ValueError):
            raise UsageError(flag(member.name), not_of_type_message(member.name, value, hints[member.name])) from None
        if typed is not value:  # set only what changes: setting a following field names it (`__setattr__`)
            setattr(cfg, member.name, typed)


def not_of_type_message(name: str, value: Any, hint: Any) -> str:
    message = f"{value!r} is not {type_name(hint)}"
    if name == "env_id" and not isinstance(value, str):  # Stable-Baselines3 takes an env object, or its class
        message += (
            ": give the env's registered id, such as 'CartPole-v1' (every process makes its own envs from it); "
            "register an env of your own with gymnasium.register('MyEnv-v0', entry_point=MyEnv)"
        )
    return message


def in_full(name: str, value: Any) -> Any:
    """A field's value from a config file or from Python, a short name it takes (Fabric's `bf16`) as its full one."""
    return full_precision_name(value) if name == "precision" else value


def typed_value(hint: Any, value: Any) -> Any:
    """`value`, read from a config file, as the field typed `hint` takes it (a list as a tuple; a number that YAML
    left as text, such as 3e-4, as the number); raises `ValueError` where it is not of that type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        if JSON_OBJECT in args[1:] and isinstance(value, dict):
            return json.dumps(value)
        return typed_value(args[0], value)
    if origin is Literal:
        if value not in args:
            raise ValueError(value)
        return value
    if origin in (typing.Union, types.UnionType):
        return _first_typed_value(args, value)
    if origin in (tuple, list):
        return _typed_sequence(origin, args, value)
    return _typed_scalar(hint, value)


def _first_typed_value(options: tuple[Any, ...], value: Any) -> Any:
    """`value` as the first of a union's types that takes it (None for null where the union has it)."""
    for option in options:
        if option is type(None):
            if value is None:
                return None
            continue
        try:
            return typed_value(option, value)
        except (TypeError, ValueError):
            continue
    raise ValueError(value)


def _typed_sequence(origin: type, args: tuple[Any, ...], value: Any) -> Any:
    """A list (or a tuple, as the field's type has it) of typed items; a lone value for a list of any length."""
    variadic = origin is list or args[-1] is Ellipsis
    if not isinstance(value, list | tuple):
        if not variadic:
            raise ValueError(value)
        value = [value]  # logger: csv, as --logger csv
    kinds = [args[0]] * len(value) if variadic else list(args)
    if len(kinds) != len(value):
        raise ValueError(value)
    return origin(typed_value(kind, item) for kind, item in zip(kinds, value, strict=True))


def _typed_scalar(hint: Any, value: Any) -> Any:
    if hint is bool or isinstance(value, bool):  # YAML's true and false go to a bool, and to nothing else
        if hint is not bool or not isinstance(value, bool):
            raise ValueError(value)
        return value
    if hint in (int, float):
        if isinstance(value, int):
            return hint(value)
        number = float(value)  # "3e-4" and "1e6", which YAML leaves as text; "four" raises
        if hint is int and not number.is_integer():
            raise ValueError(value)
        return hint(number)
    if hint is str and isinstance(value, str | int | float):
        return str(value)
    raise ValueError(value)


def type_name(hint: Any) -> str:
    """How a field's type reads in an error: 'a number', 'one of sync, async, ...'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return "a dict of keyword arguments (or its JSON text)" if JSON_OBJECT in args[1:] else type_name(args[0])
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if arg is type(None) else type_name(arg) for arg in args)
    if origin in (tuple, list):
        size = "" if origin is list or args[-1] is Ellipsis else f" of {len(args)}"
        return f"a list{size}, each {type_name(args[0])}"
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
    return names.get(hint, str(hint))


class KeyGivenTwice(ValueError):
    """A file that sets one key twice, of which YAML's and JSON's readers would keep the last in silence."""


def read_mapping(text: str, as_json: bool = False) -> Any:
    """A YAML (or JSON) file's values; raises `KeyGivenTwice` for a mapping that sets a key twice, as an edited
    file may (which of the two was meant?), besides the readers' own errors."""
    if as_json:
        return json.loads(text, object_pairs_hook=pairs_each_once)
    import yaml

    return yaml.load(text, Loader=keys_once_loader())  # a SafeLoader: no Python objects


def pairs_each_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; `KeyGivenTwice` where a key comes twice."""
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise KeyGivenTwice(f"sets {key!r} twice")
        mapping[key] = value
    return mapping


@functools.cache
def keys_once_loader() -> type:
    """yaml's SafeLoader, refusing a mapping that sets a key twice (made on first use: yaml loads only then)."""
    import yaml

    class KeysOnceLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, typing.Hashable):
                    continue  # yaml's own construction refuses it
                line = key_node.start_mark.line + 1
                if key in lines:
                    where = f"line {line}" if lines[key] == line else f"lines {lines[key]} and {line}"
                    raise KeyGivenTwice(f"sets {key!r} twice ({where})")
                lines[key] = line
            return super().construct_mapping(node, deep)

    return KeysOnceLoader


def read_config_file(path: str) -> dict[str, Any]:
    import yaml

    path = home_expanded(path)
    if os.path.isfile(os.path.join(path, CONFIG_FILENAME)):  # a run's folder, whose flags its config.yaml holds
        raise UsageError("--config", f"{path} is a run's folder: give its {os.path.join(path, CONFIG_FILENAME)}")
    if not path.endswith(CONFIG_SUFFIXES):
        raise UsageError("--config", f"{path}: give a .yaml, .yml or .json file")
    try:
        with open(path, encoding="utf-8") as file:
            values = read_mapping(file.read(), as_json=path.endswith(".json"))
    except OSError as error:
        raise UsageError("--config", f"cannot read {path}: {error.strerror or error}") from None
    except KeyGivenTwice as error:
        raise UsageError("--config", f"{path} {error}: keep one") from None
    except (yaml.YAMLError, json.JSONDecodeError) as error:
        raise UsageError(
            "--config",
            f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {str(error).splitlines()[0]}",
        ) from None
    if not isinstance(values, dict):
        raise UsageError("--config", f"{path} must map flag names to values, as num_envs: 4")
    return values


def config_file_algorithm(argv: list[str]) -> str | None:
    """The algorithm that the file a command line gives to `--config` names (its `algorithm` key, which files
    this program writes hold); None where there is no such file or key, or the file cannot be read (reading it
    for its flags says why)."""
    path = config_file_of(argv)
    if path is None:
        return None
    try:
        named = read_config_file(path).get(ALGORITHM_KEY)
    except UsageError:
        return None
    return None if named is None else str(named)


def config_file_of(argv: list[str]) -> str | None:
    """The file a command line gives to `--config` (`--config FILE` or `--config=FILE`), if any."""
    for index, word in enumerate(argv):
        if word == "--config":
            return argv[index + 1] if index + 1 < len(argv) else None
        if word.startswith("--config="):
            return word.partition("=")[2]
    return None


def write_config_file(cfg: RunConfig, path: str, leave_out: tuple[str, ...] = ()) -> None:
    """The resolved flags of `cfg` as a file that `--config` takes back (YAML, or JSON by its suffix), but those
    named in `leave_out`, and the FOLLOWING_DEFAULTS not chosen: a file written on a CPU and trained with --cuda
    then runs as --cuda alone would."""
    import yaml

    leave_out += tuple(name for name in cfg.FOLLOWING_DEFAULTS if name not in cfg.chosen_defaults)
    values = {ALGORITHM_KEY: cfg.ALGORITHM} | {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in cfg.to_dict().items()
        if key not in NOT_IN_CONFIG_FILES + leave_out
    }
    text = json.dumps(values, indent=2) + "\n" if path.endswith(".json") else yaml.safe_dump(values, sort_keys=False)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


# The words Python's old `distutils.util.strtobool` read, which the Lightning example's switches take as values.
TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")
FALSE_WORDS = ("n", "no", "f", "false", "off", "0")


def flags_typed(config_type: type, kind: type) -> dict[str, str]:
    """The flags of `config_type`'s fields of type `kind` (or `kind | None`), by each spelling the parser takes
    (`--anneal-lr`, `--anneal_lr`), to the flag's own."""
    hints = typing.get_type_hints(config_type, include_extras=True)
    typed: dict[str, str] = {}
    for member in fields(config_type):
        hint = hints[member.name]
        hint = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        if hint is kind or hint == kind | None:
            name = flag(member.name)
            typed[name] = typed["--" + name[2:].replace("-", "_")] = name
    return typed


def flag_spellings(config_type: type, leave_out: Iterable[str] = ()) -> list[str]:
    """The flags of `config_type`'s fields but `leave_out`, and each switch's --no- form."""
    switches = set(flags_typed(config_type, bool).values())
    spellings = [flag(member.name) for member in fields(config_type) if member.name not in set(leave_out)]
    return spellings + ["--no-" + spelling.removeprefix("--") for spelling in spellings if spelling in switches]


def respelled(argv: list[str], flags: dict[str, str], spell: Callable[[str, str], str | None]) -> list[str]:
    """`argv` with each of `flags` that has a value (`--flag VALUE` or `--flag=VALUE`) that `spell(flag, value)`
    rewrites as one word; the rest as it is."""
    spelled, index = [], 0
    while index < len(argv):
        word, equals, value = argv[index].partition("=")
        if word in flags and not equals and index + 1 < len(argv):  # `--flag VALUE`: two words become one
            rewritten = spell(flags[word], argv[index + 1])
            index += rewritten is not None
        else:
            rewritten = spell(flags[word], value) if word in flags and equals else None
        spelled.append(argv[index] if rewritten is None else rewritten)
        index += 1
    return spelled


def as_switch(name: str, value: str) -> str | None:
    """`--anneal-lr True` as `--anneal-lr`, `--share-data=false` as `--no-share-data`; None for no such word."""
    if value.lower() in TRUE_WORDS:
        return name
    return "--no-" + name[2:] if value.lower() in FALSE_WORDS else None


WHOLE_NUMBER_IN_EXPONENT_FORM = re.compile(r"\d+(\.\d*)?[eE]\+?\d+")


def as_whole_number(name: str, value: str) -> str | None:
    """`--total-timesteps 1e6` as `--total-timesteps=1000000`, as a config file reads it; None for anything else."""
    if not WHOLE_NUMBER_IN_EXPONENT_FORM.fullmatch(value) or not float(value).is_integer():
        return None
    return f"{name}={int(float(value))}"


def command_line_spellings(config_type: type[RunConfig], argv: list[str]) -> list[str]:
    """`argv` with what other programs' command lines and this one's config files take spelled as the parser
    takes it: a switch given a value, as the Lightning example's argparse takes one (`--anneal-lr True`), and a
    whole number in exponent form (`--total-timesteps 1e6`). A value that is neither is left for the parser."""
    argv = respelled(argv, flags_typed(config_type, bool), as_switch)
    argv = respelled(argv, {"--precision": "--precision"}, as_full_precision_name)
    return respelled(argv, flags_typed(config_type, int), as_whole_number)


def as_full_precision_name(name: str, value: str) -> str | None:
    """`--precision bf16`, Fabric's short name, as `--precision=bf16-mixed`; None for any other value."""
    full = full_precision_name(value)
    return None if full == value else f"{name}={full}"


def fields_on_command_line(config_type: type[RunConfig], argv: list[str]) -> set[str]:
    """The config fields whose flags (or their --no- forms) `argv` gives."""
    spelled = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    given = set()
    for member in fields(config_type):
        name = flag(member.name)
        if {name, name.replace("-", "_"), "--no-" + name[2:], "--no_" + name[2:].replace("-", "_")} & spelled:
            given.add(member.name)
    return given


def launcher_precision() -> PrecisionName | None:
    """`fabric run` takes a `--precision` anywhere on its command line as its own option, even after the
    script, and hands it to the ranks as LT_PRECISION: it is the run's --precision all the same."""
    name = full_precision_name(os.environ.get("LT_PRECISION"))
    if name is None:
        return None
    if name not in get_args(PrecisionName):
        raise UsageError("--precision", f"{name!r} is not one of {', '.join(get_args(PrecisionName))}")
    return name  # type: ignore[return-value]


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of `NAME VALUE` or `NAME=VALUE` in `argv` (the last, if given twice); None without one."""
    value = None
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(f"{name}="):
            value = arg.split("=", 1)[1]
    return value


def preset_values(config_type: type[RunConfig], name: str) -> dict[str, Any]:
    if name not in config_type.PRESETS:
        choices = ", ".join(config_type.PRESETS) or "none exist"
        slip = did_you_mean(name, config_type.PRESETS)
        refused = f"there is no preset {name!r} for this algorithm" + (f" ({slip})" if slip else "")
        raise UsageError("--preset", f"{refused}; choose from {choices}{env_id_as_preset(name, config_type.PRESETS)}")
    return {"preset": name, **config_type.PRESETS[name]}


ENV_ID = re.compile(r"(?:[\w.-]+/)?(?P<name>[\w.:-]+?)-v\d+")


def env_id_as_preset(name: str, presets: Iterable[str]) -> str:
    """Where `name` is an env's id, as rl-zoo's hyperparameters are keyed: the preset named after that env, or the
    flag that takes the id; empty otherwise."""
    env = ENV_ID.fullmatch(name)
    if env is None:
        return ""
    simple = env["name"].rpartition(":")[2].replace("-", "").lower()
    named = next((preset for preset in presets if preset.replace("-", "") == simple), None)
    instead = f"--preset {named} (or --env-id {name})" if named else f"--env-id {name}"
    return f"; {name} is an env's id: give {instead}"


STATED_DEFAULT = re.compile(r"\s*\(default: ([^()]*)\)")


def stated_default(doc: str) -> tuple[str, str | None]:
    """A field's help without the default it states in words, "(default: the one it was trained on)", and that
    default: a field whose value by default is None, meaning "worked out at run time", says what it works out."""
    stated = STATED_DEFAULT.search(doc)
    if stated is None:
        return doc, None
    return doc[: stated.start()] + doc[stated.end() :], stated.group(1)


def field_docstrings(config_type: type) -> dict[str, str]:
    """The docstring under each field, from the class and its bases (a subclass's own wins)."""
    docs: dict[str, str] = {}
    for cls in reversed(config_type.__mro__):
        if not dataclasses.is_dataclass(cls) or is_view(cls):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
        for statement, following in itertools.pairwise(body):
            documented = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and documented:
                docs[statement.target.id] = " ".join(str(following.value.value).split())
    return docs


VIEW_MARK = "_rl_view"


def is_view(cls: type) -> bool:
    """A class this module made at run time (a mode's view, one-line help), which has no source to read."""
    return bool(cls.__dict__.get(VIEW_MARK))


@functools.cache  # one class per config: tyro reads a class's fields once
def with_one_line_help(config_type: type[Config]) -> type[Config]:
    """`config_type` whose fields' help is their docstring on one line. tyro keeps a field docstring's line
    breaks, which `--help` then prints as they fall in the source, between its own."""
    docs = field_docstrings(config_type)
    hints = typing.get_type_hints(config_type, include_extras=True)
    helped = []
    for member in fields(config_type):
        if member.name not in docs:
            continue
        if member.default_factory is dataclasses.MISSING:
            default = field(default=member.default)
        else:
            default = field(default_factory=member.default_factory)
        help_text, default_in_words = stated_default(docs[member.name])
        # tyro's "(default: None)" would follow the default the help states in words
        if default_in_words is None and member.default is None:
            default_in_words = "none"
        hint = None if default_in_words is None else f"(default: {default_in_words})"
        helped_arg = tyro.conf.arg(
            help=help_text, help_behavior_hint=hint, metavar=optional_metavar(hints[member.name])
        )
        helped.append((member.name, Annotated[hints[member.name], helped_arg], default))
    view = dataclasses.make_dataclass(config_type.__name__, helped, bases=(config_type,))
    view.__doc__ = config_type.__doc__  # --help's description
    setattr(view, VIEW_MARK, True)
    return view


SCALAR_METAVARS = {str: "STR", int: "INT", float: "FLOAT"}


def optional_metavar(hint: Any) -> str | None:
    """An optional value's placeholder in --help as its type's alone (`--run-name STR`, where tyro shows
    `{None}|STR`; `--preset {cartpole,...}`); None for any other type, which tyro names itself."""
    bare = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
    if type(None) not in typing.get_args(bare):
        return None
    kept = without_none(bare)
    if typing.get_origin(kept) is Literal:
        return "{" + ",".join(str(choice) for choice in typing.get_args(kept)) + "}"
    return SCALAR_METAVARS.get(kept)


def parse_dataclass(
    config_type: type[Config],
    argv: list[str],
    prog: str | None = None,
    default: Config | None = None,
    description: str | None = None,
) -> Config:
    """Parse the command line with tyro (from `default`'s values, if given), condensing its boxed errors into one line.

    `--help` prints tyro's help as usual; any parse error raises `UsageError`. A switch given true or false (`--render
    false`) is taken as its own spelling (`--no-render`), as the Lightning example's argparse took it.
    """
    argv = respelled(argv, flags_typed(config_type, bool), as_switch)
    out, err = io.StringIO(), io.StringIO()
    helped = with_one_line_help(config_type)
    if default is not None:
        default = helped(**{member.name: getattr(default, member.name) for member in fields(config_type)})
    try:
        with redirect_stdout(out), redirect_stderr(err):
            return tyro.cli(helped, args=argv, prog=prog or command_name(), default=default, description=description)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            print(out.getvalue(), end="")
            raise
        named, message = _summarize_tyro_error(err.getvalue() + out.getvalue())
        # An unknown flag before a positional argument takes the argument as its value, so the parser reports the
        # argument missing: the unknown flag is what went wrong.
        unknown = unknown_option(config_type, argv) if MISSING_POSITIONAL.match(message) else None
        if unknown is not None:
            raise UsageError(unknown, f"Unrecognized options: {unknown}") from None
        raise (
            switch_given_a_word(config_type, argv, message)
            or required_missing(message)
            or UsageError(named, value_not_of_type(config_type, named, values_missing(message)))
        ) from None


MISSING_POSITIONAL = re.compile(r"Missing value for argument '\w")  # a flag's name starts with a dash
# The parser's and Python's words for a value a flag's type does not take
VALUE_NOT_READ = re.compile(
    r"Error parsing (--[\w-]+): (?:(?:invalid literal for int\(\) with base 10|could not convert string to float): "
    r"'(?P<one>.*)'|Could not parse arguments \[(?P<many>.*)\] into .*"
    r"|no type matching .* could be instantiated from \[(?P<optional>.*?)\]\. Got errors: .*)"
    r"|invalid choice '(?P<choice>.*)' for argument '--[\w-]+'\. Expected one of \((?P<choices>.*)\)\."
)


MISSING_REQUIRED = re.compile(r"Missing from (?P<program>.+?): (?P<wanted>.+)")
# one required argument in that list: its name, its type's placeholder for a flag (STR), its help
REQUIRED = re.compile(r"(--[\w-]+|[A-Z][A-Z_]*)\s+(?:[A-Z]+\s+)?(.*?)\s+\(required\)")


def required_missing(message: str) -> UsageError | None:
    """The parser's `Missing from python -m rl.export: CHECKPOINT the file to export (required) --out STR ...` as
    `CHECKPOINT: missing: python -m rl.export needs CHECKPOINT (the file to export) and --out (...)`; None for any
    other message."""
    missing = MISSING_REQUIRED.fullmatch(message)
    wanted = REQUIRED.findall(missing["wanted"]) if missing else []
    if not wanted:
        return None
    needs = " and ".join(f"{name} ({meaning})" for name, meaning in wanted)
    return UsageError(wanted[0][0], f"missing: {missing['program']} needs {needs}")


MISSING_VALUES = re.compile(r"Missing value for argument '--[\w-]+'\. Expected (\d+) values?\.")


def values_missing(message: str) -> str:
    """The parser's `Missing value for argument '--seed'. Expected 1 values.` as `needs a value`; any other message
    as it is."""
    missing = MISSING_VALUES.fullmatch(message)
    if missing is None:
        return message
    count = int(missing[1])
    return "needs a value" if count == 1 else f"needs {count} values"


def value_not_of_type(config_type: type, named: str, message: str) -> str:
    """The parser's `Error parsing --num-envs: invalid literal for int() with base 10: '2.5'` as a config file's
    value is refused: `'2.5' is not a whole number` (a choice's slip: `did you mean async?`); any other message
    as it is."""
    refused = VALUE_NOT_READ.fullmatch(message)
    hints = typing.get_type_hints(config_type, include_extras=True)
    field_name = named[2:].replace("-", "_")
    if refused is None or field_name not in hints:
        return message
    if refused["choice"] is not None:  # one word of the value, for a list of choices (--logger)
        hint = hints[field_name]
        choice = typing.get_args(hint)[0] if typing.get_origin(hint) in (tuple, list) else hint
        slip = did_you_mean(refused["choice"], re.findall(r"'(.*?)'", refused["choices"]))
        return f"{refused['choice']!r} is not {type_name(choice)}{'; ' if slip else ''}{slip}"
    if refused["one"] is not None:
        value = refused["one"]
    else:  # the words given, of a list or of an optional value (which the command line leaves out by no flag)
        value = " ".join(re.findall(r"'(.*?)'", refused["many"] or refused["optional"]))
    return f"{value!r} is not {type_name(without_none(hints[field_name]))}"


def without_none(hint: Any) -> Any:
    """An optional field's type but None (`float | None`: float), for what a flag given a value takes; a union of
    more types as it is."""
    if typing.get_origin(hint) is Annotated:
        return without_none(typing.get_args(hint)[0])
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint
    kept = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return kept[0] if len(kept) == 1 else hint


def switch_given_a_word(config_type: type, argv: list[str], message: str) -> UsageError | None:
    """`--anneal-lr maybe`: the parser finds the word after a switch an unknown argument; name the switch."""
    word = message.removeprefix("Unrecognized options: ")
    switches = flags_typed(config_type, bool)
    given_to = [before for before, after in itertools.pairwise(argv) if after == word]
    given_to += [arg.partition("=")[0] for arg in argv if arg.partition("=")[2] == word]
    if word == message or " " in word or not given_to or given_to[0] not in switches:
        return None
    switch = switches[given_to[0]]
    return UsageError(
        switch, f"a switch takes no value, or true or false; got {word!r}: give {switch} or --no-{switch[2:]}"
    )


NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?")


def unknown_option(config_type: type, argv: list[str]) -> str | None:
    """The first word of `argv` that is an option (`-x`, `--name`, `--name=value`) that `config_type` has no field
    for; None where there is none."""
    known = {"-h", "--help"}
    for member in fields(config_type):
        spelled = flag(member.name)
        known |= {spelled, "--" + member.name, "--no-" + spelled[2:], "--no_" + member.name}
    for word in argv:
        name = word.partition("=")[0]
        if word.startswith("-") and not NUMBER.fullmatch(word) and name not in known:
            return name
    return None


def command_name() -> str:
    """The command as the user typed it: `python -m rl.evaluate` for a module of this package (whose file path is
    what Python puts in `sys.argv[0]`), else the script's name."""
    script = os.path.abspath(sys.argv[0])
    if os.path.dirname(script) == os.path.dirname(os.path.abspath(__file__)):
        return f"python -m rl.{os.path.splitext(os.path.basename(script))[0]}"
    return os.path.basename(script)


def _summarize_tyro_error(text: str) -> tuple[str, str]:
    """The flag and the message of a tyro error box, on one line.

    The box is a title, a rule, the message lines, then another rule and help we drop.
    """
    lines = [line.strip(" │╭╮╰╯") for line in text.splitlines()]
    rules = [i for i, line in enumerate(lines) if line and _RULE.match(line)]
    body = lines[rules[0] + 1 : rules[1]] if len(rules) >= 2 else lines
    message = " ".join(line.strip() for line in body if line.strip()) or "invalid command line"
    named = re.search(r"(--[a-z0-9-]+)", message)
    return (named.group(1) if named else "command line"), message


def world_size_from_env() -> int:
    """The number of processes the launcher started (1 when run as a plain script)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_world_size_from_env() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def ranks_on_this_node() -> range:
    """The global ranks the launcher started on this machine (it numbers a node's ranks consecutively)."""
    rank = int(os.environ.get("RANK", "0"))
    first = rank - int(os.environ.get("LOCAL_RANK", "0"))
    return range(first, first + local_world_size_from_env())


def uses_gpu(cfg: RunConfig, rank: int, world_size: int, decoupled: bool) -> bool:
    """Whether `rank` computes on a GPU: with --cuda every coupled rank does; in decoupled mode the
    trainers do, the players only with --player-on-gpu, and the evaluator never."""
    if not cfg.cuda:
        return False
    if not decoupled:
        return True
    is_evaluator = cfg.evaluator and rank == world_size - 1
    return not is_evaluator and (rank >= cfg.num_players or cfg.player_on_gpu)


def local_gpu_index(cfg: RunConfig, rank: int, world_size: int, decoupled: bool) -> int:
    """This rank's GPU on its machine: how many GPU ranks come before it there, so that CPU players
    beside a trainer leave the GPUs to the trainers."""
    return sum(uses_gpu(cfg, other, world_size, decoupled) for other in ranks_on_this_node() if other < rank)
