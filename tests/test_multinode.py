"""Two "nodes" on localhost: `fabric run --num-nodes=2` and torchrun's c10d rendezvous train as one
machine with two processes does, bit for bit."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    BIN,
    SCRIPTS,
    child_env,
    child_pids,
    free_port,
    load_agent,
    rank_pid,
    run_dir,
    run_ranks,
    wait_until_the_run_opens,
)

PPO_ARGS = ["--total-timesteps", "1024", "--update-epochs", "2", "--eval-episodes", "0", "--torch-threads", "1"]
SAC_ARGS = [
    "sac",
    "--total-timesteps",
    "600",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--log-every",
    "200",
    "--eval-episodes",
    "0",
    "--torch-threads",
    "1",
]


def node_command(launcher: str, node_rank: int, port: int, script: Path, args: list[str]) -> list[str]:
    if launcher == "fabric run":
        return [
            str(BIN / "fabric"),
            "run",
            "--accelerator=cpu",
            "--num-nodes=2",
            f"--node-rank={node_rank}",
            "--main-address=127.0.0.1",
            f"--main-port={port}",
            "--devices=1",
            str(script),
            *args,
        ]
    return [
        str(BIN / "torchrun"),
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=two-nodes",
        str(script),
        *args,
    ]


def launch_two_nodes(launcher: str, script: Path, args: list[str], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Both nodes at once, as a cluster scheduler starts them; the same working directory (a shared disk)."""
    port = free_port()
    commands = [node_command(launcher, rank, port, script, args) for rank in range(2)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    nodes = [subprocess.Popen(command, cwd=cwd, env=child_env(), **pipes) for command in commands]
    finished = []
    for node in nodes:
        stdout, stderr = node.communicate(timeout=240)
        finished.append(subprocess.CompletedProcess(node.args, node.returncode, stdout, stderr))
    return finished


@pytest.mark.parametrize(
    ("launcher", "mode", "args"),
    [("fabric run", "fabric", PPO_ARGS), pytest.param("torchrun", "torch", SAC_ARGS, marks=pytest.mark.slow)],
    ids=["fabric-run-ppo", "torchrun-sac"],
)
def test_two_nodes_train_exactly_as_two_processes_on_one_machine(tmp_path, launcher, mode, args):
    nodes_dir, single_dir = tmp_path / "two-nodes", tmp_path / "one-machine"
    nodes_dir.mkdir()
    single_dir.mkdir()
    for node in launch_two_nodes(launcher, SCRIPTS[mode], args, nodes_dir):
        assert node.returncode == 0, node.stderr[-3000:]
    single = run_ranks(launcher, SCRIPTS[mode], args, single_dir, nproc=2)
    assert single.returncode == 0, single.stderr[-3000:]
    across_nodes, on_one_machine = load_agent(run_dir(nodes_dir, mode)), load_agent(run_dir(single_dir, mode))
    assert across_nodes["config"]["total_timesteps"] == on_one_machine["config"]["total_timesteps"]
    for name, tensor in on_one_machine["policy"].items():
        assert torch.equal(across_nodes["policy"][name], tensor), name


def test_a_rank_killed_on_another_node_is_named_by_the_survivor(tmp_path):
    port = free_port()
    args = ["--total-timesteps", "100000000", "--no-progress-bar", "--torch-threads", "1"]
    nodes = [
        subprocess.Popen(
            node_command("fabric run", rank, port, SCRIPTS["fabric"], args),
            cwd=tmp_path,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(2)
    ]
    try:
        wait_until_the_run_opens(tmp_path, nodes)
        time.sleep(1.0)
        victim = rank_pid(nodes[1].pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, survivor_stderr = nodes[0].communicate(timeout=60)
    finally:
        for node in nodes:
            for pid in child_pids(node.pid):
                os.kill(pid, signal.SIGKILL)
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    said = [line for line in survivor_stderr.split("\n") if line.startswith("error: rank 0: ")]
    assert said and "rank 1 on another node: its heartbeat stopped" in said[0], survivor_stderr[-3000:]


def render_slurm(*args: str) -> subprocess.CompletedProcess:
    command = [str(BIN / "python"), "-m", "rl.slurm", *args]
    return subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("launcher", ["fabric", "torchrun"])
def test_the_slurm_script_starts_one_launcher_per_node_with_the_first_node_as_rendezvous(tmp_path, launcher):
    # A stand-in interpreter that prints the arguments it gets: what each node's launcher would receive. Its folder's
    # name has a space, as a project's may.
    (tmp_path / "my env").mkdir()
    (python := tmp_path / "my env" / "python").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    python.chmod(0o755)
    rendered = render_slurm(
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--processes-per-node",
        "8",
        "--launcher",
        launcher,
        "--python",
        str(python),
        "--",
        "train_fabric.py",
        "sac",
        "--exp-name",
        "it's mine",
    )
    assert rendered.returncode == 0, rendered.stderr
    script = rendered.stdout
    for directive in ("--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=16"):
        assert f"#SBATCH {directive}\n" in script
    assert "export OMP_NUM_THREADS=2" in script  # 16 cores / 8 ranks
    (path := tmp_path / "job.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0  # valid bash
    # srun runs `bash -c COMMAND` on every node; run it here as SLURM would on node 3 of 4.
    (srun_line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert srun_line.startswith("srun --nodes=4 --ntasks-per-node=1 bash -c ")
    node_3 = {"SLURM_NNODES": "4", "SLURM_NODEID": "3", "SLURM_JOB_ID": "77", "MAIN_NODE": "gpu001"}
    inner = srun_line.removeprefix("srun --nodes=4 --ntasks-per-node=1 ")
    received = subprocess.run(["bash", "-c", inner], env=child_env() | node_3, capture_output=True, text=True)
    arguments = received.stdout.splitlines()
    if launcher == "fabric":
        assert arguments[:2] == ["-m", "lightning.fabric.cli"]
        expected = {"--num-nodes=4", "--node-rank=3", "--main-address=gpu001", "--devices=8", "--accelerator=cuda"}
    else:
        assert arguments[:2] == ["-m", "torch.distributed.run"]
        expected = {"--nnodes=4", "--nproc-per-node=8", "--rdzv-endpoint=gpu001:29400", "--rdzv-id=77"}
    assert expected <= set(arguments), arguments
    assert arguments[-5:] == ["train_fabric.py", "sac", "--exp-name", "it's mine", "--cuda"]


def test_a_slurm_job_runs_in_the_folder_its_script_was_made_in_wherever_it_is_submitted_from(tmp_path):
    project, elsewhere, bin_dir = tmp_path / "my project", tmp_path / "elsewhere", tmp_path / "bin"
    for folder in (project, elsewhere, bin_dir):
        folder.mkdir()
    (project / "train_fabric.py").symlink_to(SCRIPTS["fabric"])
    rendered = subprocess.run(
        [str(BIN / "python"), "-m", "rl.slurm", "--", "train_fabric.py"],
        cwd=project,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0, rendered.stderr
    # Stand-ins for SLURM's tools: the job's one node, and an srun that tells the folder it starts in.
    for tool, body in (("scontrol", "echo node001"), ("srun", "pwd")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    (job := elsewhere / "job.sbatch").write_text(rendered.stdout)
    env = child_env() | {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node001"}
    ran = subprocess.run(["bash", str(job)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(project)


@pytest.mark.parametrize(
    ("flags", "told"),
    [
        (["--processes-per-node", "0"], "--processes-per-node: must be at least 1, got 0"),
        (["--gpus-per-node", "-1"], "--gpus-per-node: must not be negative, got -1"),
        (["--port", "70000"], "--port: must be a port number, 1 to 65535, got 70000"),
        (["--time", "four hours"], "--time: takes sbatch's forms (04:00:00, 90, 2-12:00), got 'four hours'"),
        (["--job-name", "my job"], "--job-name: must be one word, without spaces or quotes, got 'my job'"),
    ],
)
def test_a_slurm_job_it_cannot_run_names_its_flag(flags, told, capsys):
    """In this process: the command line's exit and its one line are `test_a_slurm_script_needs_an_entry_script`'s."""
    from rl.errors import UsageError
    from rl.slurm import main

    with pytest.raises(UsageError) as refused:
        main([*flags, "--", "train_fabric.py"])
    assert str(refused.value) == told and capsys.readouterr().out == ""


def test_sbatch_time_forms_are_taken(capsys):
    from rl.slurm import main

    for limit in ("90", "30:00", "04:00:00", "2-12", "2-12:30", "2-12:30:00"):
        main(["--time", limit, "--", "train_fabric.py"])
        assert f"#SBATCH --time={limit}\n" in capsys.readouterr().out, limit


def test_a_slurm_script_needs_an_entry_script():
    rendered = render_slurm("--nodes", "2", "--", "sac")
    assert rendered.returncode == 2
    assert rendered.stderr.strip() == "error: SCRIPT: give the entry script after `--`, e.g. -- train_fabric.py sac"


@pytest.mark.parametrize(
    ("argv", "told"),
    [
        (["--nodes", "2", "--", "train_fabric.py", "--num-envz", "4"], "--num-envz: Unrecognized options: --num-envz"),
        (["--", "train_fabric_decoupled.py", "--workers", "3"], "--workers: belongs to Hogwild mode"),
        (["--", "train_hogwild.py"], "SCRIPT: Hogwild runs on one machine: give train_fabric.py or"),
        (["--", "train_fabrc.py"], "SCRIPT: no file train_fabrc.py here: give the entry script's path from"),
        (["--", "train_fabric.py", "--num-envs", "0"], "--num-envs: must be positive, got 0"),
        (  # the job's world size: 2 nodes x 2 processes
            ["--nodes", "2", "--processes-per-node", "2", "--", "train_fabric.py", "--total-timesteps", "512"],
            "--total-timesteps: 512 is smaller than one global rollout (4 ranks x 2 envs x 128 steps = 1024)",
        ),
        (  # the job's processes are counted by this tool's flags, not a launcher's
            ["--nodes", "1", "--processes-per-node", "2", "--", "train_fabric_decoupled.py", "--evaluator"],
            "--evaluator: needs a third process (a player, a trainer and the evaluator), got 2: request more "
            "processes (--nodes, --processes-per-node)",
        ),
        (
            ["--nodes", "1", "--", "train_fabric_decoupled.py"],
            "--processes-per-node: decoupled mode needs at least 2 processes (a player and a trainer), got 1: "
            "request more processes (--nodes, --processes-per-node)",
        ),
        (["--", "train_fabric.py", "--precision", "16-mixed"], "--precision: 16-mixed needs a CUDA GPU (--cuda)"),
        (
            ["--gpus-per-node", "2", "--processes-per-node", "4", "--", "train_fabric.py"],
            "--gpus-per-node: 2 cannot serve 4 processes per node computing on a GPU: request 4",
        ),
        (
            ["--processes-per-node", "2", "--", "train_fabric.py", "--cuda"],
            "--gpus-per-node: 0 cannot serve 2 processes per node computing on a GPU: request 2",
        ),
        (["-N", "4", "--", "train_fabric.py"], "-N: sbatch's flag, not this program's: --nodes"),
        (["--gres", "gpu:4"], "--gres: sbatch's flag, not this program's: --gpus-per-node N"),
        (["--partition=gpu"], "--partition: sbatch's flag, not this program's: sbatch takes it beside the script's"),
    ],
)
def test_a_slurm_script_refuses_training_flags_the_nodes_would_refuse_and_answers_sbatchs_own(argv, told, capsys):
    """Refused before the job waits in the queue; sbatch's options are its own, or go to sbatch."""
    from rl.errors import UsageError
    from rl.slurm import main

    with pytest.raises(UsageError) as refused:
        main(argv)
    assert str(refused.value).startswith(told)
    assert capsys.readouterr().out == ""  # no script printed


def test_a_slurm_script_for_an_elastic_job_restarts_and_admits_fewer_nodes():
    rendered = render_slurm(
        "--nodes",
        "4",
        "--launcher",
        "torchrun",
        "--max-restarts",
        "3",
        "--min-nodes",
        "2",
        "--",
        "train_fabric.py",
        "--checkpoint-every",
        "10m",
    )
    assert rendered.returncode == 0, rendered.stderr
    assert "--max-restarts=3" in rendered.stdout and '--nnodes="2:$SLURM_NNODES"' in rendered.stdout
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in rendered.stdout
    refused = render_slurm("--nodes", "2", "--max-restarts", "3", "--", "train_fabric.py")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --max-restarts: "), refused.stderr
