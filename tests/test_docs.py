"""The documentation stays true to the code and to itself: the flags reference is the command line's own, and
the README's benchmark figures are the learning page's."""

import re
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


def error_messages() -> list[tuple[str, str]]:
    """(where, message chunk) for every line the code can stop a run with: each `UsageError`, `RunStopped` and
    `print_error`, by the longest literal piece of its message (the rest is filled in at run time)."""
    import ast

    found = []
    for path in sorted((DOCS.parent / "rl").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):  # a `..._refusal` method returns the end of an error line
            if isinstance(function, ast.FunctionDef) and function.name.endswith("_refusal"):
                for node in ast.walk(function):
                    if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value:
                        found.append((f"{path.relative_to(DOCS.parent)}:{node.lineno}", node.value.value))
        for node in ast.walk(tree):
            stops = ("UsageError", "print_error", "RunStopped")
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) in stops):
                continue
            message = node.args[-1]
            pieces = (
                [message.value]
                if isinstance(message, ast.Constant)
                else [part.value for part in getattr(message, "values", []) if isinstance(part, ast.Constant)]
            )
            if pieces:  # print_error(line) relays a line built elsewhere
                found.append((f"{path.relative_to(DOCS.parent)}:{node.lineno}", max(pieces, key=len).strip()))
    return found


def test_troubleshooting_explains_every_error_line():
    page = " ".join((DOCS / "troubleshooting.md").read_text().split())
    messages = error_messages()
    assert len(messages) > 80, "the scan for error lines found too few; has UsageError moved?"
    missing = [f"{where}: {chunk!r}" for where, chunk in messages if " ".join(chunk.split()) not in page]
    assert not missing, "docs/troubleshooting.md lacks these error lines:\n" + "\n".join(missing)


def test_the_readme_opens_with_its_title_and_its_two_commands_in_at_most_120_lines():
    lines = (DOCS.parent / "README.md").read_text().splitlines()
    assert lines[0].startswith("# ") and lines[2] == "```bash" and lines[5] == "```"
    assert "pip install -c constraints.txt -e . &&" in lines[3] and '-e ".[dev]" &&' in lines[4]
    assert len(lines) <= 120


GENERATED_PAGES = ("flags.md", "api.md", "agents.md", "hyperparameters.md")  # written by the code, not by hand


def test_the_site_written_by_hand_stays_within_15000_words():
    pages = [page for page in sorted(DOCS.rglob("*.md")) if page.name not in GENERATED_PAGES]
    words = sum(len(page.read_text().split()) for page in pages)
    assert words <= 15_000, f"the site has {words} words outside its generated pages; at most 15,000"


def table_rows(page: str, header_start: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header line starts with `header_start`."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def is_mujoco_or_atari(env: str) -> bool:
    return env.endswith("-v5") or env.endswith("NoFrameskip-v4")


def greedy_mean(cell: str) -> str:
    return cell.split(" ±")[0]


def test_the_readmes_benchmark_table_and_its_tallies_are_the_learning_pages():
    readme = (DOCS.parent / "README.md").read_text()
    learning = (DOCS / "benchmarks" / "learning.md").read_text()
    # algorithm, env, ..., greedy return (5), ..., matched (10)
    every_row = table_rows(learning, "| algorithm | env | config |")
    published = [row for row in every_row if is_mujoco_or_atari(row[1])]
    # algorithm, env (and what the variant changes), ..., greedy return (4), ..., matched (7)
    summarized = table_rows(readme, "| algorithm | env | steps |")
    assert sorted((row[0], row[1], greedy_mean(row[5]), row[10]) for row in published) == sorted(
        (row[0], row[1].split(" ")[0], greedy_mean(row[4]), row[7].split(" ")[0]) for row in summarized
    ), "the README's benchmark table differs from docs/benchmarks/learning.md's MuJoCo and Atari rows"

    matches = sum(row[10] == "yes" for row in every_row)
    mujoco_atari_matches = sum(row[10] == "yes" for row in published)
    assert f"**{matches} of the {len(every_row)} rows match by their own rule**" in learning
    assert f"{mujoco_atari_matches} of the {len(published)} MuJoCo and Atari" in " ".join(learning.split())
    assert f"{len(published)} MuJoCo and Atari rows, {mujoco_atari_matches} match" in readme

    compute = learning.split("Compute: ")[1].split(" core-hours")[0]
    assert f"took {compute} core-hours" in readme, "the README's compute differs from the learning page's"
    aggregates = re.findall(
        r"(PPO MuJoCo|SAC MuJoCo|PPO Atari) (\d\.\d\d(?: \[[\d.]+, [\d.]+\])?)", " ".join(learning.split())
    )
    assert len(aggregates) == 3 and all(" ".join(pair) in " ".join(readme.split()) for pair in aggregates), (
        "the README's aggregate scores differ from the learning page's"
    )


def test_the_sac_pages_benchmark_is_the_learning_pages_rows_of_its_presets():
    learning = table_rows((DOCS / "benchmarks" / "learning.md").read_text(), "| algorithm | env | config |")
    greedy = {
        row[1]: greedy_mean(row[5]) for row in learning if row[0] == "SAC" and row[2] == row[1].split("-")[0].lower()
    }
    sac_page = table_rows((DOCS / "algorithms" / "sac.md").read_text(), "| env | greedy return (3 seeds) |")
    assert sac_page and all(row[1] == greedy[row[0]] for row in sac_page), "docs/algorithms/sac.md's table is stale"
