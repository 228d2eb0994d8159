"""The trained agents that the learning benchmark keeps, replayed and listed on docs/agents.md.

    python benchmarks/agents.py [--out benchmarks/results/suite]

The suite keeps the saved agent of each row's first seed (OUT/agents/RUN.ckpt) when that run
finishes. This replays each with `python -m rl.evaluate` (10 greedy episodes, evaluation seed 0)
and writes the page: per row its env, config, the replay's return, the run's own closing
evaluation and the command that replays it, so that anyone can check a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from launch import REPO, RESULTS
from resumable import agent_file, row_file
from suite import ROWS, run_name

PAGE = REPO / "docs" / "agents.md"
REPLAYED = re.compile(r"episodes?: return (-?[\d.]+) ± ([\d.]+)")


def replay_command(agent: Path) -> list[str]:
    return ["python", "-m", "rl.evaluate", str(agent.relative_to(REPO)), "--episodes", "10", "--seed", "0"]


def replay(agent: Path) -> tuple[float, float]:
    """The agent's mean and std of return over the command's greedy episodes."""
    command = [sys.executable, *replay_command(agent)[1:]]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    found = REPLAYED.search(done.stdout)
    if done.returncode != 0 or found is None:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def this_cpu() -> str:
    """This machine's CPU as the page names it, "a 2-core AMD EPYC with AVX-512": the kernels a replay ran on."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE)
    vectors = "AVX-512" if " avx512f" in info else "AVX2" if " avx2" in info else "neither AVX2 nor AVX-512"
    name = model.group(1).strip() if model else platform.processor() or "an unnamed CPU"
    return f"a {os.cpu_count()}-core {name} with {vectors}"


def page(out: Path) -> str:
    lines = [
        "# Trained agents",
        "",
        "The learning benchmark keeps the trained agent of each row's first seed, under "
        "`benchmarks/results/suite/agents/`. Each line's command replays it: 10 greedy episodes on "
        "evaluation seed 0, which gives the return shown. The run's own closing evaluation, on the "
        "training run's evaluation envs, is beside it; the [learning benchmark](benchmarks/learning.md) "
        "has the rows over all their seeds. `rl.load_agent(path)` loads any of them in Python: "
        "`agent.make_env()` makes its env as the run did, and `agent.predict(obs)` acts. The replays ran on "
        f"{this_cpu()}; another CPU's kernels round differently, which can move a replay a little.",
        "",
        "| row | env | config | env steps | return (10 greedy episodes) | run's closing evaluation | replay |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in ROWS.items():
        run = run_name(name, row.seeds[0])
        agent = agent_file(out, run)
        if not agent.exists():
            continue
        finished = json.loads(row_file(out, run).read_text())
        mean, std = replay(agent)
        command = " ".join(replay_command(agent))
        lines.append(
            f"| `{name}` | {row.env_id} | {row.config} | {finished['steps']:,} | {mean:,.2f} ± {std:,.2f} | "
            f"{finished['eval_return']:,.1f} | `{command}` |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "suite")
    args = parser.parse_args()
    PAGE.write_text(page(args.out.resolve()))
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
