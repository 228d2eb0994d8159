"""The command line read into a run config: presets, config files and a resumed run's flags beneath it, the
spellings other programs' command lines use, tyro's parsing, and its errors retold as one line naming the flag."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import itertools
import os
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import field, fields
from typing import Annotated, Any, Literal, TypeVar, get_args

import tyro

from rl.config import (
    PATH_FIELDS,
    WHOLE_NUMBER_IN_EXPONENT_FORM,
    RunConfig,
    RunConfigT,
    RunFlags,
    flag,
    home_expanded,
    other_modes_fields,
)
from rl.config_files import (
    config_file_values,
    named_runs_newest_checkpoint,
    resumed_run_flags_file,
    resumed_run_values,
    type_name,
)
from rl.errors import UsageError, did_you_mean
from rl.precision import PrecisionName, full_precision_name

Config = TypeVar("Config")


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


def home_expanded_flag(name: str, value: str) -> str | None:
    """`--log-dir=~/runs` as `--log-dir=/home/me/runs`; None for a value that does not start with ~."""
    return f"{name}={home_expanded(value)}" if value.startswith("~") else None


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


# A line of tyro's box drawing, which its errors wear around the message.
_RULE = re.compile(r"^[\s╭╮╰╯│─-]*$")


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
