"""Training from Python: `rl.train(config)`, `rl.preset(name, **overrides)` and `rl.load_config(path, **overrides)`.

`train` runs a mode in this process: coupled (alone, or in each rank of a script that `fabric
run` or torchrun launched, every rank calling it with the same config), decoupled (in each rank
of such a script), or Hogwild (its workers are started from here). It takes the same config
classes that the command line parses (`PPOConfig`, `SACConfig`), checks them as the command line
does, and raises `UsageError` for bad input instead of exiting. `callbacks` (`rl.Callback`
instances, one or a list) run on the training loop's events.
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from typing import Any, get_args

from rl.cli import Mode, flags_of, other_modes_value, parse_config, peer_advice, prepare_config
from rl.config import MODE_COMMANDS, RunConfig, flag
from rl.config_files import check_field_types, named_runs_newest_checkpoint, resumed_run_values
from rl.errors import UsageError, did_you_mean
from rl.flag_parsing import displaced_by, env_id_as_preset, preset_values
from rl.loop import Callback
from rl.modes.coupled import train_coupled
from rl.peer_flags import PeerFlag, peer_flag
from rl.registry import ALGORITHMS, DEFAULT_ALGORITHM
from rl.run import TrainingResult
from rl.runtime import FabricRuntime, LocalRuntime, process_torch_settings_restored
from rl.signals import deliver_held_sigterm
from rl.spawned import importing_the_script_that_spawned_this_process

FLAG_IN_TEXT = re.compile(r"--[a-z][a-z0-9-]*")  # a command-line flag named in a text


@contextmanager
def field_names_in_errors() -> Iterator[None]:
    """A `UsageError` that names a config's flag names its field as well, as code that builds a config spells it:
    `num_envs (--num-envs): must be positive, got 0`."""
    try:
        yield
    except UsageError as error:
        fields_of_flags = fields_named_by_flags(kind.config_type for kind in ALGORITHMS.values())
        if error.flag in fields_of_flags:
            error.args = (f"{fields_of_flags[error.flag]} ({error.flag}): {error.message}",)
        raise


def fields_named_by_flags(config_types: Iterable[type[RunConfig]]) -> dict[str, str]:
    """Each flag of these configs, and the field it sets."""
    return {flag(member.name): member.name for config_type in config_types for member in fields(config_type)}


def python_advice(peer: PeerFlag, config_type: type[RunConfig]) -> str:
    """What a peer program's flag or key is here, to code that builds a config."""
    return peer.python or with_field_names(peer_advice(peer), config_type)


def with_field_names(advice: str, config_type: type[RunConfig]) -> str:
    """`advice` as code that builds a config reads it: each flag of `config_type` that it names, as its field."""
    fields_of_flags = fields_named_by_flags([config_type])
    return FLAG_IN_TEXT.sub(lambda found: fields_of_flags.get(found.group(0), found.group(0)), advice)


@field_names_in_errors()
def preset(name: str, **overrides: Any) -> RunConfig:
    """The config of a preset, as `--preset NAME` gives it, with `overrides` on top.

    Args:
        name: PPO's preset (`"hopper"`), or another algorithm's with its name first (`"sac/hopper"`).
        **overrides: Fields of the config (`seed=3`, `num_envs=4`), as the flags on the command line.

    Raises:
        UsageError: No such preset or field, or a value the field does not take.
    """
    if not isinstance(name, str):
        raise TypeError(f"preset takes a preset's name, such as 'cartpole' or 'sac/hopper'; got {name!r}")
    algorithm, preset_name = algorithm_and_preset(name)
    config_type = ALGORITHMS[algorithm].config_type
    check_fields(config_type, overrides)
    values = preset_values(config_type, preset_name) | overrides
    config = config_type(**values)
    check_field_types(config)
    config.fill_defaults(set(values))
    return config


def algorithm_and_preset(name: str) -> tuple[str, str]:
    """ "sac/hopper" as SAC's preset "hopper", "hopper" as PPO's. An env's id ("ALE/Pong-v5") is the default
    algorithm's preset name, which its refusal answers with the preset or flag to give instead."""
    algorithm, slash, preset_name = name.partition("/")
    if not slash or (algorithm not in ALGORITHMS and env_id_as_preset(name, ())):
        return DEFAULT_ALGORITHM, name
    if algorithm not in ALGORITHMS:
        raise UsageError("--preset", f"there is no algorithm {algorithm!r}; name one of {', '.join(ALGORITHMS)}")
    return algorithm, preset_name


@field_names_in_errors()
def load_config(path: str | os.PathLike[str], **overrides: Any) -> RunConfig:
    """The config of a YAML or JSON file of flags, as `--config PATH` gives it, with `overrides` on top.

    Args:
        path: A run folder's `config.yaml`, a `--write-config` file or tuning's `best.yaml`. Its `algorithm:` key
            picks PPO or SAC (PPO where it names none).
        **overrides: Fields of the config, as the flags on the command line; but `preset`, which goes beneath the
            file, as `--preset` does.

    Raises:
        UsageError: A file that is missing or unreadable, or a key or value the config does not take.
    """
    preset_flag = ["--preset", str(overrides.pop("preset"))] if "preset" in overrides else []
    config = parse_config(["--config", os.fspath(path), *preset_flag])  # a preset beneath the file, as on the CLI
    check_fields(type(config), overrides)
    config = config.with_changes(**overrides)
    check_field_types(config)
    return config


def check_fields(config_type: type[RunConfig], names: Iterable[str]) -> None:
    """Raise `UsageError` for the first of `names` that is no field of `config_type`, with what to give instead
    where another program names it so (SB3's `learning_rate` for SAC)."""
    known = {member.name for member in fields(config_type)}
    for field_name in names:
        if field_name not in known:
            instead = instead_of(field_name, config_type)
            raise UsageError(field_name, f"{config_type.__name__} has no such field{instead}")


def instead_of(field_name: str, config_type: type[RunConfig]) -> str:
    """What to give for `field_name`, no field of `config_type`: the field another program's name is here, or the
    field it is a slip of; empty where neither."""
    found = peer_flag([flag(field_name)], config_type.ALGORITHM, flags_of(config_type))
    if found is not None:
        return f": {found[1].program}'s name; {python_advice(found[1], config_type)}"
    slip = did_you_mean(field_name, [member.name for member in fields(config_type)])
    return f": {slip}" if slip else ""


def check_no_stray_attributes(cfg: RunConfig) -> None:
    """An attribute set on a config that is none of its fields (`cfg.learning_rate = ...` on a SAC config) would
    be ignored: raise `UsageError` for it instead."""
    check_fields(type(cfg), [name for name in vars(cfg) if not hasattr(type(cfg), name)])


@field_names_in_errors()
def train(
    config: RunConfig, callbacks: Sequence[Callback] | Callback = (), mode: Mode = "coupled"
) -> TrainingResult | None:
    """Train `config` in this process: one rank of the job under a launcher, or the whole job on its own.

    The fields the config's builder did not name take the defaults that follow from the others, as on the command
    line (CUDA graphs with `cuda=True`, a recurrent minibatch: give `cuda_graphs=False` to train on a GPU without
    graphs); with `resume_from`, those left at their defaults take the resumed run's values.

    Args:
        config: What to train: `rl.PPOConfig(...)`, `rl.SACConfig(...)`, `rl.preset(...)` or `rl.load_config(...)`.
        callbacks: Code of your own on the loop's events (`rl.Callback`). Hogwild's workers receive them pickled,
            by value where a worker could not import them (a notebook's, a function's own).
        mode: `"coupled"` (every rank acts and learns), `"decoupled"` (players and trainers) or `"hogwild"`
            (workers on this machine that share one set of networks). Hogwild starts its workers as Python's
            multiprocessing does: a script keeps its training under `if __name__ == "__main__":`.

    Returns:
        The run's folder, its saved agent and its closing evaluation; in decoupled mode, on the lead player
            (rank 0), and None on the other roles.

    Raises:
        UsageError: Bad input (a field, the env, a checkpoint), before training starts; it names the field.
        RunStopped: A fault stopped the run: an env raised or returned a NaN or infinite value, the system refused
            to write a file of the run (a full disk; the partial copy is removed), or a Hogwild worker ended or
            failed. The checkpoints written before it are kept.
        TrainingDiverged: A loss or gradient stopped being finite. The step that would have spread it was not taken,
            and the checkpoints written before hold finite weights.

    A run that raises (a callback's error, say) closes its envs and logs first. SIGTERM stops training with a
    checkpoint, as Ctrl-C does, and reaches this process's own SIGTERM handler once the run has closed. Torch's
    thread count and cuDNN's determinism, which a run sets for its process (`torch_threads`,
    `torch_deterministic`), are put back as they were when it returns."""
    if not isinstance(config, RunConfig):
        raise TypeError(
            f"train takes a config, such as rl.PPOConfig(), rl.SACConfig() or rl.preset(...); got {config!r}"
        )
    if mode not in get_args(Mode):  # else a misspelt mode would train coupled
        raise ValueError(f"mode must be one of {', '.join(get_args(Mode))}, got {mode!r}")
    if importing_the_script_that_spawned_this_process():  # a Hogwild worker would train a run of its own
        raise RuntimeError(
            "rl.train was called while a spawned process (a Hogwild worker, say) ran the script that started it "
            'again: put the script\'s training under `if __name__ == "__main__":`'
        )
    listed = callback_list(callbacks)
    cfg = completed(config, mode)
    with process_torch_settings_restored():  # a run sets them for the process; the caller's stay
        try:
            return _train_in_mode(cfg, listed, mode)
        finally:
            deliver_held_sigterm()  # a run stopped by SIGTERM has checkpointed and closed: the caller's handler has it


def callback_list(callbacks: Sequence[Callback] | Callback) -> list[Callback]:
    """`train`'s callbacks as a list (one may come alone), checked before the run starts: anything else would fail
    at the loop's first event."""
    if isinstance(callbacks, Callback) or not isinstance(callbacks, Iterable) or isinstance(callbacks, str):
        listed = [callbacks]
    else:
        listed = list(callbacks)
    for callback in listed:
        if not isinstance(callback, Callback):
            raise TypeError(
                "callbacks are rl.Callback instances (of a subclass that overrides the events it needs), one or a "
                f"list; got {callback!r}"
            )
        warn_of_methods_never_called(type(callback))
    return listed


CALLBACK_EVENTS = tuple(name for name in vars(Callback) if name.startswith("on_"))
# Stable-Baselines3's callback methods, and the event that comes nearest here.
SB3_CALLBACK_EVENTS = {
    "on_step": "on_iteration_end",
    "on_rollout_start": "on_iteration_start",
    "on_rollout_end": "on_iteration_end",
    "on_training_start": "on_iteration_start",
    "on_training_end": "on_finish",
}


def warn_of_methods_never_called(kind: type[Callback]) -> None:
    """Warn of a method of a callback class that looks meant for an event but is none (a slip, `on_reprot`, or
    Stable-Baselines3's `_on_step`), which the loop would never call; other methods are the class's own."""
    own = {name for klass in kind.__mro__[: kind.__mro__.index(Callback)] for name in vars(klass)}
    for name in sorted(own):
        code = getattr(getattr(kind, name), "__code__", None)  # a method's (the warning points at its line)
        if name in CALLBACK_EVENTS or code is None:
            continue
        event = name.removeprefix("_")
        nearest = SB3_CALLBACK_EVENTS.get(event)
        if nearest is not None:
            advice = f"Stable-Baselines3's {name}; here the nearest event is {nearest}"
        else:
            advice = did_you_mean(event, CALLBACK_EVENTS)
        if advice:
            message = (
                f"{kind.__name__}.{name} is no event of rl.Callback and is never called ({advice}); its events: "
                f"{', '.join(CALLBACK_EVENTS)}"
            )
            warnings.warn_explicit(message, UserWarning, code.co_filename, code.co_firstlineno, kind.__module__)


def completed(config: RunConfig, mode: Mode) -> RunConfig:
    """A copy of `config` as `train` takes it: checked, a resumed run's values where it has defaults, and the
    defaults that follow from other fields filled."""
    cfg = copy.deepcopy(config)
    check_no_stray_attributes(cfg)
    check_field_types(cfg)
    check_mode_fields(cfg, mode)
    defaults = type(cfg)()
    given = {
        field.name
        for field in fields(cfg)
        if getattr(cfg, field.name) != getattr(defaults, field.name) and not cfg.came_by_default(field.name)
    }
    given |= cfg.named_when_built  # built by hand: the fields its caller named, at their default values or not
    # as on the command line: a resumed run's own values where the config has defaults
    checkpoint = cfg.resume_from or named_runs_newest_checkpoint(cfg.run_name, cfg.log_dir, log_subdir(mode))
    if checkpoint is not None:
        displaced = displaced_by(cfg, given)
        for name, value in resumed_run_values(type(cfg), checkpoint, mode).items():
            if name not in given and name not in displaced:
                setattr(cfg, name, value)
                given.add(name)
    cfg.fill_defaults(given)
    return cfg


def check_mode_fields(cfg: RunConfig, mode: Mode) -> None:
    """Refuse a field of another mode than `mode` at other than its default, naming the mode that takes it."""
    found = other_modes_value(cfg, mode)
    if found is None:
        return
    name, owner = found
    default = getattr(type(cfg)(), name)
    owners_name, modes_name = (MODE_COMMANDS[each].partition(":")[0] for each in (owner, mode))
    raise UsageError(
        flag(name),
        f'belongs to {owners_name}: rl.train(config, mode="{owner}"); {modes_name} takes its default, {default!r}',
    )


def log_subdir(mode: Mode) -> str:
    """The folder under `log_dir` of the run folders of `mode`."""
    if mode == "decoupled":
        from rl.modes.decoupled import LOG_SUBDIR

        return LOG_SUBDIR
    return LocalRuntime.log_subdir if mode == "hogwild" else FabricRuntime.log_subdir


def _train_in_mode(cfg: RunConfig, callbacks: Sequence[Callback], mode: Mode) -> TrainingResult | None:
    """`cfg`, checked and completed, trained in `mode` in this process."""
    if mode == "decoupled":
        from rl.modes.decoupled import train_decoupled

        algorithm, world_size, resume = prepare_config(cfg, log_subdir(mode), "decoupled")
        return train_decoupled(algorithm, world_size, resume, callbacks)
    if mode == "hogwild":
        from rl.modes.hogwild import train_hogwild

        algorithm, _, resume = prepare_config(cfg, log_subdir(mode), "hogwild")
        return train_hogwild(algorithm, resume, callbacks)
    algorithm, world_size, resume = prepare_config(cfg, log_subdir(mode))
    return train_coupled(algorithm, FabricRuntime(algorithm.cfg, world_size), resume, callbacks)
