"""Every command the README and the docs show is accepted by the program it names.

Commands are read from fenced code blocks and from inline code that starts with a command. A
synopsis is expanded: `[sac]` gives the command with and without it, `[--pipeline | --async]` and
`shared|synced` give one command per choice, and `[flags]` stands for none. Each training command
is parsed by the project's own CLI and validated for the number of processes its launcher starts,
as every rank does before training; the launcher's own flags are parsed by `fabric run` (click)
and torchrun (argparse). Benchmark scripts parse their arguments with their own parser and stop
there. Nothing is trained: the commands that train are run at a tiny size by the other tests.
"""

from __future__ import annotations

import argparse
import itertools
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gymnasium as gym
import pytest
from lightning.fabric.cli import _run as fabric_run_command
from torch.distributed.run import get_args_parser as torchrun_parser

from rl.cli import check_values_for_job, parse_config
from rl.config import validate_hardware
from rl.envs import register_optional_envs
from rl.evaluate import EvalConfig
from rl.export import ExportConfig
from rl.flag_parsing import parse_dataclass
from rl.slurm import SlurmConfig, render

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    REPO / "ARCHITECTURE.md",
    *sorted(p for p in (REPO / "docs").rglob("*.md") if p.name != "flags.md"),
]
PROGRAMS = r"python3?|fabric|torchrun|pip|tensorboard|mkdocs|sbatch|train_\w+\.py"
COMMAND = re.compile(rf"^(?:\.venv/bin/)?(?:{PROGRAMS})(?:\s|$)")
MODES = {
    "train_fabric.py": "coupled",
    "train_torch.py": "coupled",
    "train_fabric_decoupled.py": "decoupled",
    "train_hogwild.py": "hogwild",
}
# Stand-ins for what a reader fills in: a node's rank and address, a job id, a player count.
PLACEHOLDERS = {
    "--node-rank=R": "--node-rank=0",
    "NODE0": "10.0.0.1",
    "=JOB": "=1",
    "--num-players K": "--num-players 1",
}
# Tools that are not this project's (and the shell's `source`): shown for the reader, with nothing of ours to parse.
OTHER_TOOLS = {"tensorboard", "mkdocs", "sbatch", "source"}


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for every command in a fenced block or an inline code span, continuations joined."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                if COMMAND.match(line.strip()):
                    found.append((page.name, line.strip()))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        # in prose a command runs a script, a module or pip; `fabric run` alone names the tool
        found += [
            (page.name, span)
            for span in re.findall(r"`([^`\n]+)`", prose)
            if COMMAND.match(span) and (".py" in span or " -m " in span or span.startswith("pip "))
        ]
    return found


def expansions(command: str) -> list[list[str]]:
    """Every concrete command a synopsis stands for, as argument lists, split at `&&` and `>`."""
    command = command.replace("\\|", "|")
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    groups = re.findall(r"(?:^|(?<=\s))\[([^\]]*)\]", command)  # `[x]`, never pip's `.[extra]`
    template = re.sub(r"(?:^|(?<=\s))\[[^\]]*\]", "{}", command.replace("{", "{{").replace("}", "}}"))
    choices = [
        [""] + ([] if g.strip().lower() in ("flags", "args...") else [c.strip() for c in g.split("|")]) for g in groups
    ]
    concrete = []
    for picked in itertools.product(*choices):
        words = shlex.split(template.format(*picked), comments=True)
        for alternative in itertools.product(*[word.split("|") if "|" in word else [word] for word in words]):
            concrete += split_shell(list(alternative))
    return concrete


def split_shell(words: list[str]) -> list[list[str]]:
    """The commands of `a && b > file`: each program with its arguments, redirections dropped."""
    commands, current, skip = [], [], False
    for word in words:
        if skip:
            skip = False
        elif word == "&&":
            commands.append(current)
            current = []
        elif word == ">":
            skip = True
        elif word != "...":
            current.append(word)
    return [*commands, current]


def check(argv: list[str]) -> None:
    program = argv[0].removeprefix(".venv/bin/")
    if program in MODES:  # `train_fabric.py --preset ...` in prose, under the smallest launch its mode takes
        return check_training(program, argv[1:], processes=2 if MODES[program] == "decoupled" else 1)
    if program in OTHER_TOOLS:
        return
    if program == "pip":
        return check_pip(argv[1:])
    if program == "fabric":
        return check_fabric_run(argv[1:])
    if program == "torchrun":
        return check_torchrun(argv[1:])
    assert program in ("python", "python3"), f"no check for {program}"
    if argv[1] == "-m":
        return check_module(argv[2], argv[3:])
    script, args = argv[1], argv[2:]
    assert (REPO / script).is_file(), f"{script} does not exist"
    if script in MODES:
        return check_training(script, args, processes=1)
    assert script.startswith("benchmarks/"), f"no check for {script}"
    check_benchmark(script, args)


def check_pip(args: list[str]) -> None:
    if "-c" in args:
        assert (REPO / args[args.index("-c") + 1]).is_file()
    extras = project_extras()
    for requirement in (arg for arg in args if arg.startswith(".")):
        named = re.fullmatch(r"\.(?:\[(.*)\])?", requirement)
        assert named, f"pip installs the project, not {requirement}"
        for extra in (named.group(1) or "").split(","):
            assert not extra or extra in extras, f"there is no extra {extra!r}"


def project_extras() -> set[str]:
    """The names under pyproject.toml's [project.optional-dependencies] (tomllib is Python 3.11's)."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]")[1].split("\n[")[0]
    return set(re.findall(r"^([\w-]+) = \[", section, re.M))


def check_fabric_run(args: list[str]) -> None:
    assert args[0] == "run"
    params = fabric_run_command.make_context("fabric run", args[1:]).params
    processes = int(params["devices"]) * params["num_nodes"]
    check_training(params["script"], list(params["script_args"]), processes)


def check_torchrun(args: list[str]) -> None:
    parsed = torchrun_parser().parse_args(args)
    nodes = int(str(parsed.nnodes).split(":")[-1])
    check_training(parsed.training_script, parsed.training_script_args, nodes * int(parsed.nproc_per_node))


def check_module(module: str, args: list[str]) -> None:
    if module in ("venv", "pytest"):
        return
    assert (REPO / f"{module.replace('.', '/')}.py").is_file(), f"there is no module {module}"
    if not args:  # the tool named in prose
        return
    if module == "rl.evaluate":
        parse_dataclass(EvalConfig, args)
    elif module == "rl.export":
        parse_dataclass(ExportConfig, args)
    elif module == "rl.tune":
        from rl.tune import parse as parse_tuning

        _, training = parse_tuning(args)
        check_training("train_fabric.py", training, processes=1)
    elif module == "rl.slurm":
        cfg = parse_dataclass(SlurmConfig, args)
        render(cfg)
        script, *script_args = cfg.command
        check_training(script, script_args, cfg.nodes * cfg.processes_per_node)
    else:
        raise AssertionError(f"no check for python -m {module}")


def check_training(script: str, args: list[str], processes: int) -> None:
    """What every rank checks before training, for this many processes (GPUs assumed where --cuda asks)."""
    mode = MODES[script]
    cfg = parse_config(args)
    processes = cfg.workers if mode == "hogwild" else processes
    gpus = processes if cfg.cuda else 0
    check_values_for_job(cfg, mode, processes)
    env_ranks = cfg.num_players if mode == "decoupled" else processes
    validate_hardware(cfg, processes, gpus, env_ranks, mode == "decoupled")
    if ":" not in cfg.env_id:  # an env of the user's own module: tests/test_own_env.py trains the docs' example
        register_optional_envs(cfg.env_id)
        gym.spec(cfg.env_id)


class ArgumentsParsed(Exception):
    pass


@contextmanager
def stop_after_parsing() -> Iterator[None]:
    """Let a benchmark parse its arguments with its own parser, then stop it before it runs anything."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise ArgumentsParsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def check_benchmark(script: str, args: list[str]) -> None:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path = [script, *args], [str(REPO / "benchmarks"), *sys.path]
    try:
        with stop_after_parsing(), pytest.raises(ArgumentsParsed):
            runpy.run_path(str(REPO / script), run_name="__main__")
    finally:
        sys.argv, sys.path = saved_argv, saved_path


COMMANDS = shown_commands()


def test_the_pages_show_commands_of_every_kind():
    kinds = {re.sub(r"^\.venv/bin/", "", command).split()[0] for _, command in COMMANDS}
    assert {"python", "fabric", "torchrun", "pip"} <= kinds
    assert len(COMMANDS) > 60


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_a_command_shown_in_the_docs_is_accepted(page: str, command: str):
    for argv in expansions(command):
        try:
            check(argv)
        except SystemExit as exit_:  # --help, or argparse refusing a flag
            if exit_.code not in (0, None):
                raise AssertionError(f"{shlex.join(argv)} exits with {exit_.code}") from None


def test_a_synopsis_expands_to_every_choice():
    synopsis = "fabric run --devices=3 train_fabric_decoupled.py [sac] [--pipeline | --async] [flags] > out && ls"
    assert expansions(synopsis) == [
        ["fabric", "run", "--devices=3", "train_fabric_decoupled.py"],
        ["ls"],
        ["fabric", "run", "--devices=3", "train_fabric_decoupled.py", "--pipeline"],
        ["ls"],
        ["fabric", "run", "--devices=3", "train_fabric_decoupled.py", "--async"],
        ["ls"],
        ["fabric", "run", "--devices=3", "train_fabric_decoupled.py", "sac"],
        ["ls"],
        ["fabric", "run", "--devices=3", "train_fabric_decoupled.py", "sac", "--pipeline"],
        ["ls"],
        ["fabric", "run", "--devices=3", "train_fabric_decoupled.py", "sac", "--async"],
        ["ls"],
    ]
    assert expansions('pip install -e ".[atari,envpool]" --sync shared\\|synced') == [
        ["pip", "install", "-e", ".[atari,envpool]", "--sync", "shared"],
        ["pip", "install", "-e", ".[atari,envpool]", "--sync", "synced"],
    ]
