"""The run-level configuration every algorithm shares, and its validation.

The command line is read into it in `rl/flag_parsing.py`; config files and run folders' flags in
`rl/config_files.py`.

Each algorithm's config (`rl/algos/<name>/config.py`) derives from `RunConfig` and adds its
own fields. Flag names and meanings follow Lightning's fabric RL example (PPO) and
Stable-Baselines3 / CleanRL (SAC), so their commands run unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import InitVar, asdict, dataclass, field, fields
from datetime import timedelta
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import tyro

from rl.compiling import CompileMode, check_compiler
from rl.encoders import EncoderKind
from rl.envs import Preprocessing, VectorMode
from rl.errors import UsageError, counted
from rl.logger import LoggerName
from rl.precision import (
    DEFAULT_PRECISION,
    PrecisionName,
    check_precision_device,
    check_precision_on_this_gpu,
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
# 1e6 or 1.5E3: a whole number as config files and rl-zoo write it, which the whole-number flags take.
WHOLE_NUMBER_IN_EXPONENT_FORM = re.compile(r"\d+(\.\d*)?[eE]\+?\d+")


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


RunConfigT = TypeVar("RunConfigT", bound=RunConfig)


def other_modes_fields(config_type: type[RunConfig], mode: str) -> list[str]:
    return [name for other, names in config_type.MODE_FIELDS.items() if other != mode for name in names]


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
