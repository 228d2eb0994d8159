"""A SLURM batch script for a multi-node run: `python -m rl.slurm [flags] -- SCRIPT [ARGS...]`.

Prints an sbatch script that starts one launcher per node with `srun`: `fabric run` with the
node's rank and the first node as the main address, or torchrun with its c10d rendezvous on
the first node. Both are torch.distributed; nothing here transports data. The job runs in the
folder the script was made in, wherever it is submitted from. Submit it with
`python -m rl.slurm --nodes 4 -- train_fabric.py sac > job.sbatch && sbatch job.sbatch`.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field, fields
from typing import Annotated, Literal

import tyro

from rl.config import ProcessCount, RunConfig, flag, uses_gpu
from rl.errors import UsageError, counted, exit_on_usage_error, misspelled_option
from rl.flag_parsing import flag_spellings, parse_dataclass
from rl.peer_flags import SBATCH_PEER_FLAGS, tools_peer_flag


@dataclass
class SlurmConfig:
    """Render an sbatch script that trains across nodes."""

    command: Annotated[list[str], tyro.conf.Positional, tyro.conf.arg(metavar="SCRIPT [FLAGS ...]")] = field(
        default_factory=lambda: ["train_fabric.py"]
    )
    """the entry script and its flags, after `--` (e.g. -- train_fabric.py sac --env-id Hopper-v5)"""
    nodes: int = 2
    """how many nodes"""
    processes_per_node: int = 1
    """ranks per node: one per GPU with --gpus-per-node, else a share of the node's cores each"""
    gpus_per_node: int = 0
    """GPUs to request per node (0: a CPU job); the script gets --cuda when non-zero"""
    cpus_per_node: int = 16
    """cores to request per node"""
    launcher: Literal["fabric", "torchrun"] = "fabric"
    """`fabric run` per node, or torchrun with its c10d rendezvous"""
    max_restarts: int = 0
    """torchrun only: restart every worker up to this many times after a failure; each restart resumes from the
    run's newest checkpoint (pair it with --checkpoint-every in the script's flags)"""
    min_nodes: int = 0
    """torchrun only: go on with as few as this many nodes when others are lost, and take nodes back in when
    they join (0: exactly --nodes)"""
    port: int = 29400
    """the rendezvous port on the first node"""
    time: str = "04:00:00"
    """the job's wall-time limit"""
    job_name: str = "rl"
    """the job's name in the queue"""
    python: str = "python"
    """the Python interpreter on the nodes (e.g. the project's .venv/bin/python)"""


# torchrun 2.13 shares one store across rounds, and a round that a node joins then waits forever for it.
ELASTIC_STORE_LINES = [
    "# a store per round, so that a node can join a later round",
    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
]


SPLITS_A_WORD = re.compile(r"[\s\"'\\]")  # what a shell (or an #SBATCH line) reads as more than one word


def interpreter(python: str) -> str:
    """--python as the node's shell reads it: quoted where a space or quote would split it, else as given, so that
    `~` and `$HOME` expand on the node."""
    return shlex.quote(python) if SPLITS_A_WORD.search(python) else python


def launcher_command(cfg: SlurmConfig) -> list[str]:
    """The command `srun` starts once per node; `$SLURM_*` and `$MAIN_NODE` expand on the node."""
    if cfg.launcher == "fabric":
        accelerator = "cuda" if cfg.gpus_per_node else "cpu"
        return [
            interpreter(cfg.python),
            "-m",
            "lightning.fabric.cli",
            f"--accelerator={accelerator}",  # = fabric run
            f"--devices={cfg.processes_per_node}",
            '--num-nodes="$SLURM_NNODES"',
            '--node-rank="$SLURM_NODEID"',
            '--main-address="$MAIN_NODE"',
            f"--main-port={cfg.port}",
        ]
    nodes = f"{cfg.min_nodes}:$SLURM_NNODES" if cfg.min_nodes else "$SLURM_NNODES"
    return [
        interpreter(cfg.python),
        "-m",
        "torch.distributed.run",
        f'--nnodes="{nodes}"',
        f"--nproc-per-node={cfg.processes_per_node}",
        "--rdzv-backend=c10d",
        f"--max-restarts={cfg.max_restarts}",
        f'--rdzv-endpoint="$MAIN_NODE:{cfg.port}"',
        '--rdzv-id="$SLURM_JOB_ID"',
    ]


# sbatch's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes or
# days-hours:minutes:seconds
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}")


def check_job_shape(cfg: SlurmConfig) -> None:
    """Counts the job cannot run with, a port that is none, a time limit sbatch would refuse: one line each."""
    for name in ("nodes", "processes_per_node", "cpus_per_node"):
        if getattr(cfg, name) < 1:
            raise UsageError(flag(name), f"must be at least 1, got {getattr(cfg, name)}")
    if cfg.gpus_per_node < 0:
        raise UsageError("--gpus-per-node", f"must not be negative, got {cfg.gpus_per_node}")
    if not 1 <= cfg.port <= 65535:
        raise UsageError("--port", f"must be a port number, 1 to 65535, got {cfg.port}")
    if not SLURM_TIME.fullmatch(cfg.time):
        raise UsageError("--time", f"takes sbatch's forms (04:00:00, 90, 2-12:00), got {cfg.time!r}")
    if not cfg.job_name or SPLITS_A_WORD.search(cfg.job_name):  # the script's #SBATCH line holds it as it is
        raise UsageError("--job-name", f"must be one word, without spaces or quotes, got {cfg.job_name!r}")


def node_command(cfg: SlurmConfig) -> list[str]:
    """The entry script and its flags as each node runs them: with --cuda where the job has GPUs."""
    if not cfg.command or not cfg.command[0].endswith(".py"):
        raise UsageError("SCRIPT", "give the entry script after `--`, e.g. -- train_fabric.py sac")
    command = list(cfg.command)
    if cfg.gpus_per_node and "--cuda" not in command:
        command.append("--cuda")
    return command


def render(cfg: SlurmConfig) -> str:
    check_job_shape(cfg)
    for name, value in (("--max-restarts", cfg.max_restarts), ("--min-nodes", cfg.min_nodes)):
        if value and cfg.launcher != "torchrun":
            raise UsageError(name, "restarts and changing membership are torchrun's: add --launcher torchrun")
        if value < 0:
            raise UsageError(name, f"must not be negative, got {value}")
    if cfg.min_nodes > cfg.nodes:
        raise UsageError("--min-nodes", f"{cfg.min_nodes} is more than --nodes {cfg.nodes}")
    script_args = node_command(cfg)
    directives = [
        f"--job-name={cfg.job_name}",
        f"--nodes={cfg.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cfg.cpus_per_node}",
        f"--time={cfg.time}",
    ]
    if cfg.gpus_per_node:
        directives.append(f"--gpus-per-node={cfg.gpus_per_node}")
    threads = max(1, cfg.cpus_per_node // cfg.processes_per_node)
    launch = " ".join([*launcher_command(cfg), *map(shlex.quote, script_args)])
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        "# The folder the script was made in, which holds the entry script, wherever sbatch is called from.",
        f"cd {shlex.quote(os.getcwd())}",
        "# The first node hosts the rendezvous; every node starts one launcher, which starts its ranks.",
        'MAIN_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MAIN_NODE",
        f"export OMP_NUM_THREADS={threads}  # a share of the node's cores per rank",
        *(ELASTIC_STORE_LINES if cfg.min_nodes else []),
        f"srun --nodes={cfg.nodes} --ntasks-per-node=1 bash -c {shlex.quote(launch)}",
    ]
    return "\n".join(lines) + "\n"


ENTRY_SCRIPT_MODES = {
    "train_fabric.py": "coupled",
    "train_torch.py": "coupled",
    "train_fabric_decoupled.py": "decoupled",
}


JOB_PROCESSES = ProcessCount("--processes-per-node", "request more processes (--nodes, --processes-per-node)")


def check_training_flags(cfg: SlurmConfig) -> None:
    """The entry script, found here, and its flags, checked here as the job's processes will check them: a bad
    one is refused now, not after the job waited in the queue. A script of the user's own has its flags left to
    itself. Its envs and the nodes' hardware are checked on the nodes."""
    command = node_command(cfg)
    if not os.path.isfile(command[0]):  # the job starts in this folder: the script's first step goes here
        raise UsageError("SCRIPT", f"no file {command[0]} here: give the entry script's path from this folder")
    script = os.path.basename(command[0])
    if script == "train_hogwild.py":
        raise UsageError("SCRIPT", "Hogwild runs on one machine: give train_fabric.py or train_fabric_decoupled.py")
    if script in ENTRY_SCRIPT_MODES:
        from rl.cli import check_values_for_job, parse_config

        mode = ENTRY_SCRIPT_MODES[script]
        run = parse_config(command[1:], mode)
        check_values_for_job(run, mode, cfg.nodes * cfg.processes_per_node, JOB_PROCESSES)
        check_gpus_per_node(cfg, run, mode == "decoupled")


def check_gpus_per_node(cfg: SlurmConfig, run: RunConfig, decoupled: bool) -> None:
    """Refuse a job whose nodes would each have fewer GPUs than processes that compute on one."""
    world_size, per_node = cfg.nodes * cfg.processes_per_node, cfg.processes_per_node
    needed = max(
        sum(uses_gpu(run, rank, world_size, decoupled) for rank in range(node * per_node, (node + 1) * per_node))
        for node in range(cfg.nodes)
    )
    if needed > cfg.gpus_per_node:
        raise UsageError(
            "--gpus-per-node",
            f"{cfg.gpus_per_node} cannot serve {counted(needed, 'process', 'processes')} per node computing on a GPU: "
            f"request {needed} (or fewer --processes-per-node)",
        )


def main(argv: list[str]) -> None:
    try:
        cfg = parse_dataclass(SlurmConfig, argv, description=__doc__)
    except UsageError as error:
        slurm_flags = {flag(member.name) for member in fields(SlurmConfig)}
        peers = tools_peer_flag(error, SBATCH_PEER_FLAGS, slurm_flags)
        raise peers or misspelled_option(error, flag_spellings(SlurmConfig)) or error from None
    script = render(cfg)
    check_training_flags(cfg)
    sys.stdout.write(script)


if __name__ == "__main__":
    with exit_on_usage_error():
        main(sys.argv[1:])
