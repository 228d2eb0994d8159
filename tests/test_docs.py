"""The documentation stays true to the code: the flags reference is the command line's own."""

from pathlib import Path

from rl.config import flag
from rl.reference import reference
from rl.registry import ALGORITHMS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_flags_reference_is_the_command_lines_own():
    written = (DOCS / "flags.md").read_text()
    assert written == reference(), "the flags changed: regenerate with python -m rl.reference > docs/flags.md"


def test_the_flags_reference_names_every_flag_with_its_meaning():
    import dataclasses

    page = reference()
    for kind in ALGORITHMS.values():
        for field in dataclasses.fields(kind.config_type):
            row = next(line for line in page.splitlines() if line.startswith(f"| `{flag(field.name)}"))
            assert row.rstrip(" |").split("|")[-1].strip(), f"{flag(field.name)} has no meaning"
