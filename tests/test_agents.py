"""The trained-agents page: every agent the benchmark keeps is listed, and a listed score is what its command gives."""

import re
import subprocess
import sys

import pytest
from conftest import REPO, child_env

PAGE = REPO / "docs" / "agents.md"
AGENTS = REPO / "benchmarks" / "results" / "suite" / "agents"
LINE = re.compile(r"^\| `(?P<row>[^`]+)` \|.*\| (?P<score>-?[\d,.]+ ± [\d,.]+) \| [^|]* \| `(?P<command>[^`]+)` \|$")


def listed() -> dict[str, tuple[str, str]]:
    """Per row on the page: its score and its replay command."""
    matches = (LINE.match(line) for line in PAGE.read_text().splitlines())
    return {m["row"]: (m["score"], m["command"]) for m in matches if m}


def test_the_page_lists_every_kept_agent_and_nothing_else():
    commands = [command for _, command in listed().values()]
    listed_files = sorted(command.split()[3] for command in commands)
    kept = sorted(str(path.relative_to(REPO)) for path in AGENTS.glob("*.ckpt"))
    assert listed_files == kept, "regenerate the page: python benchmarks/agents.py"


@pytest.mark.slow
def test_a_listed_agent_scores_what_the_page_says_when_replayed():
    score, command = listed()["ppo/pendulum-gsde"]
    done = subprocess.run(
        [sys.executable, *command.split()[1:]], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"return {score.replace(',', '')}," in done.stdout, done.stdout
