"""Config files: the `--config` files a run reads and the `config.yaml` each run folder keeps, their values typed as
the flags take them, and the flags a resumed run was started with."""

from __future__ import annotations

import functools
import json
import os
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

import torch

from rl.config import (
    JSON_OBJECT,
    PATH_FIELDS,
    RunConfig,
    flag,
    home_expanded,
    is_folder_name,
    other_modes_fields,
)
from rl.errors import UsageError
from rl.precision import full_precision_name

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
CONFIG_FILENAME = "config.yaml"  # in every run folder: the run's resolved flags
NOT_IN_CONFIG_FILES = ("config", "write_config")  # what a config file neither sets nor keeps
# What a run folder's config file leaves out, so that --config given it repeats the run: a resumed run's
# checkpoint would make it resume that run, in its folder, again.
NOT_IN_RUN_FOLDER_CONFIG = ("resume_from",)
ALGORITHM_KEY = "algorithm"  # a config file's key that names the algorithm whose flags it holds


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


def named_runs_newest_checkpoint(run_name: str | None, log_dir: str, log_subdir: str | None) -> str | None:
    """The newest checkpoint of the run `--run-name` names, which the run resumes from; None for a new run."""
    if run_name is None or log_subdir is None or not is_folder_name(run_name):
        return None  # a name that is no folder's is refused with the other flags
    return newest_checkpoint(os.path.join(log_dir, log_subdir, run_name))


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
