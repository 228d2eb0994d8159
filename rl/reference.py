"""The flags reference, generated from the configs the command line is parsed into: `python -m rl.reference`.

Each algorithm's flags, with their choices, defaults and meanings, come from its config
dataclass: the fields and the docstring under each, which `--help` shows too. `docs/flags.md`
is this module's output, and a test fails when the two differ, so the page cannot drift from
the command line.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

from rl.config import RunConfig, flag
from rl.flag_parsing import field_docstrings, stated_default
from rl.registry import ALGORITHMS


def _type_text(hint: Any) -> str:
    choices = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    literals = [
        value for arg in [hint, *choices] if typing.get_origin(arg) is typing.Literal for value in typing.get_args(arg)
    ]
    if literals:
        return " \\| ".join(str(value) for value in literals)
    if typing.get_origin(hint) is typing.Annotated:
        return _type_text(typing.get_args(hint)[0])
    if typing.get_origin(hint) is list:
        return "key=value, repeatable"
    names = [getattr(arg, "__name__", str(arg)) for arg in (choices or [hint])]
    return " or ".join(names)


def _default_text(field: dataclasses.Field, default_in_words: str | None) -> str:
    if default_in_words is not None:
        return default_in_words
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
        return "none" if not value else repr(value)
    return f"`{field.default}`" if field.default not in (None, "") else "none"


def flags_table(config_type: type[RunConfig]) -> str:
    hints = typing.get_type_hints(config_type, include_extras=True)
    docs = field_docstrings(config_type)
    lines = ["| flag | takes | default | what it does |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(config_type):
        name = flag(field.name)
        hint = hints[field.name]
        if hint is bool:
            name, takes = f"{name}, --no-{name.removeprefix('--')}", "a switch"
        else:
            takes = _type_text(hint)
        meaning, default_in_words = stated_default(docs.get(field.name, ""))
        cells = [f"`{name}`", takes, _default_text(field, default_in_words), meaning.replace("|", "\\|")]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def reference() -> str:
    sections = [
        "# Flags",
        "",
        "Generated from the command line's own definitions (`python -m rl.reference > docs/flags.md`); "
        "`python train_fabric.py [ALGORITHM] --help` prints the same. Every entry point takes them: "
        "`train_fabric.py`, `train_torch.py`, `train_fabric_decoupled.py` and `train_hogwild.py`, each "
        "followed by an algorithm's name (PPO without one). A switch also takes a value (`--anneal-lr true`, "
        "`--share-data=false`), and a whole number its exponent form (`--total-timesteps 1e6`).",
    ]
    for name, kind in ALGORITHMS.items():
        doc = inspect.getdoc(kind.config_type) or ""
        sections += ["", f"## {name.upper()}", "", doc.splitlines()[0], "", flags_table(kind.config_type)]
    return "\n".join(sections) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
