"""Elastic runs under torchrun: restarts that resume on their own, with real `kill -9` of real processes."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import socket
import subprocess
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import (
    BIN,
    REPO,
    SCRIPTS,
    child_env,
    child_pids,
    free_port,
    launch,
    load_agent,
    rank_pid,
    reached_step,
    read_scalars,
    run_dir,
    run_ranks,
)

import rl.elastic
from rl.cli import parse_config
from rl.config import validate
from rl.elastic import (
    Journal,
    RoundRecord,
    agree_on_round,
    describe_end,
    job_store_client,
    same_failure,
    this_jobs_rounds,
)
from rl.errors import RunStopped, UsageError

QUICK_PPO = ["--update-epochs", "2", "--eval-episodes", "0", "--no-progress-bar"]
QUICK_SAC = [
    "sac",
    "--batch-size",
    "64",
    "--learning-starts",
    "200",
    "--log-every",
    "200",
    "--eval-episodes",
    "0",
    "--no-progress-bar",
]


def torchrun(script: Path, args: list[str], nproc: int = 2, max_restarts: int = 3) -> list[str]:
    return [
        str(BIN / "torchrun"),
        f"--nproc-per-node={nproc}",
        "--standalone",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.2",
        str(script),
        *args,
    ]


def run_to_the_end(command: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout)


def start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def newest_step(cwd: Path) -> int:
    steps = [int(path.stem.split("_")[1]) for path in cwd.glob("logs/*/*/checkpoints/step_*.ckpt")]
    return max(steps, default=-1)


def kill_ranks_at_random(job: subprocess.Popen, cwd: Path, kills: int, nproc: int, seed: int) -> list[int]:
    """`kill -9` a random rank at a random moment after each new checkpoint, once the round has trained
    past it (so every restart has steps to redo), `kills` times; the ranks killed."""
    rng, killed = random.Random(seed), []
    for _ in range(kills):
        seen = newest_step(cwd)
        deadline = time.monotonic() + 240
        while newest_step(cwd) <= seen:  # the restarted round is training again
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before the next kill"
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        while reached_step(cwd) <= newest_step(cwd):
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before the next kill"
            time.sleep(0.01)
        victim = rng.randrange(nproc)
        pid = rank_pid(job.pid, victim)
        if pid is None:  # between rounds: try the next checkpoint
            continue
        os.kill(pid, signal.SIGKILL)
        killed.append(victim)
    return killed


def finish(job: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    try:
        return job.communicate(timeout=timeout)
    finally:
        for pid in child_pids(job.pid):
            os.kill(pid, signal.SIGKILL)


CASES = {
    # Checkpoints every few iterations, so that a kill can land between them.
    "fabric-ppo": ("fabric", [*QUICK_PPO, "--total-timesteps", "16384", "--checkpoint-every", "1536"]),
    "torch-sac-saved-buffer": (
        "torch",
        [*QUICK_SAC, "--total-timesteps", "1600", "--checkpoint-every", "200", "--save-buffer"],
    ),
    "decoupled-ppo": (
        "decoupled",
        [*QUICK_PPO, "--num-envs", "4", "--total-timesteps", "16384", "--checkpoint-every", "1536"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_run_killed_at_random_resumes_by_itself_to_the_weights_of_an_unkilled_run(tmp_path, case):
    mode, args = CASES[case]
    reference = tmp_path / "unkilled"
    reference.mkdir()
    done = run_ranks("torchrun", SCRIPTS[mode], args, reference)
    assert done.returncode == 0, done.stderr[-3000:]
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    job = start(torchrun(SCRIPTS[mode], args), killed_dir)
    killed = kill_ranks_at_random(job, killed_dir, kills=2, nproc=2, seed=zlib.crc32(case.encode()))
    stdout, stderr = finish(job)
    assert job.returncode == 0, stderr[-4000:]
    assert len(killed) == 2
    assert "resuming from" not in stdout  # each restart's own line says where it resumes
    assert "connectFullMesh" not in stderr and "finite" not in stderr  # a fresh round; a lost rank named as lost
    restarts = [line for line in stderr.splitlines() if line.startswith("restart ")]
    assert [line.split(" of the job ")[0] for line in restarts] == ["restart 1", "restart 2"], stderr[-4000:]
    assert all("resumes from step" in line and "steps are done twice" in line for line in restarts)
    assert not any("; 0 steps are done twice" in line for line in restarts), restarts  # each killed past a checkpoint
    names = {0: "the player", 1: "trainer 1"} if mode == "decoupled" else {0: "rank 0", 1: "rank 1"}
    assert all(
        f"lost {names[victim]}: its process ended" in line for victim, line in zip(killed, restarts, strict=True)
    ), (killed, restarts)
    (folder,) = killed_dir.glob("logs/*/*")  # one run folder for the whole job
    want, got = load_agent(run_dir(reference, mode))["policy"], load_agent(folder)["policy"]
    for name in want:
        assert torch.equal(want[name], got[name]), name
    scalars = read_scalars(folder)
    steps = [step for step, _ in scalars["Time/steps_per_second"]]
    assert steps == sorted(set(steps)), "a step was logged twice, or backwards"
    assert scalars["Elastic/restarts"][-1][1] == 2.0
    redone = [entry["redone"] for entry in Journal(str(folder)).entries() if entry["event"] == "start"]
    assert scalars["Elastic/steps_redone"][-1][1] == redone[-1] and redone[-1] > 0


@pytest.mark.slow
def test_a_restart_without_a_checkpoint_starts_again_and_says_so(tmp_path):
    # No checkpoint before the end: killed once training has begun, long before the end.
    job = start(torchrun(SCRIPTS["fabric"], [*QUICK_PPO, "--total-timesteps", "16384"], max_restarts=1), tmp_path)
    deadline = time.monotonic() + 240  # start-up alone can take a minute under CI's load
    while reached_step(tmp_path) <= 0:
        assert job.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(rank_pid(job.pid, 1), signal.SIGKILL)
    _, stderr = finish(job)
    assert job.returncode == 0, stderr[-3000:]
    (line,) = [line for line in stderr.splitlines() if line.startswith("restart ")]
    assert "no checkpoint yet: starts from step 0" in line and "lost rank 1" in line, line
    assert len(list(tmp_path.glob("logs/*/*"))) == 1  # the same folder, not a new one named by the time


@pytest.mark.slow
def test_a_round_killed_during_start_up_is_named_and_the_restart_counts_agree(tmp_path):
    marker = tmp_path / "kill-the-next-start"
    args = [
        *QUICK_PPO,
        "--env-id",
        "envs_for_tests:KilledOnceAtStartup-v0",
        "--env-kwargs",
        json.dumps({"marker": str(marker)}),
        "--total-timesteps",
        "16384",
        "--checkpoint-every",
        "512",
    ]
    job = start(torchrun(SCRIPTS["fabric"], args, max_restarts=3), tmp_path)
    wait_until(lambda: newest_step(tmp_path) > 0, job)
    marker.touch()  # round 1 dies while it makes its envs, before it writes anything
    os.kill(rank_pid(job.pid, 1), signal.SIGKILL)
    _, stderr = finish(job)
    assert job.returncode == 0, stderr[-3000:]
    # Round 1's rank 0 may die before it writes anything, or after it journals its launch (where it also prints
    # its own restart line): either way round 2 names the start-up death, and both counts say 2.
    line = [line for line in stderr.splitlines() if line.startswith("restart ")][-1]
    assert line.startswith("restart 2 of the job (this node's restart 2 of at most 3): "), line
    assert "ended during start-up" in line, line


def test_a_journaled_round_that_never_trained_is_told_apart(tmp_path):
    journal = Journal(str(tmp_path))
    for entry in (
        {"event": "launch", "step": 0, "restart": 0, "host": "a", "redone": 0},
        {"event": "start", "step": 0, "redone": 0},
        {"event": "launch", "step": 512, "restart": 1, "host": "a", "redone": 100},
    ):
        journal.append(entry)
    trained, died = journal.rounds()
    assert trained.began_training and not died.began_training
    assert (died.started_at, died.reached, died.restart, died.host) == (512, 512, 1, "a")
    assert describe_end(died).startswith("it ended during start-up, before its first iteration")


def test_a_round_that_ended_cleanly_closes_its_job(tmp_path):
    journal = Journal(str(tmp_path))
    for entry in (
        {"event": "start", "step": 0},
        {"event": "fault", "role": "rank 0", "kind": "lost", "what": "rank 1: its process ended", "step": 512},
        {"event": "start", "step": 512},
        {"event": "end", "how": "interrupted", "step": 2048},  # Ctrl-C, its checkpoint written
        {"event": "start", "step": 2048},
    ):
        journal.append(entry)
    lost, interrupted, resumed = journal.rounds()
    assert (interrupted.ended, interrupted.reached, lost.ended) == ("interrupted", 2048, None)
    assert this_jobs_rounds([lost, interrupted, resumed]) == [resumed]  # what counts as its restarts
    assert this_jobs_rounds([lost, interrupted]) == []  # a launch now is a resume, no restart
    assert this_jobs_rounds([lost]) == [lost]


MODES_ONCE_MORE = {
    "fabric": ("python", 1, ["--total-timesteps", "1024"], 1024),
    "decoupled": ("fabric run", 3, ["--total-timesteps", "1024"], 1024),
    "hogwild": ("python", 1, ["--total-timesteps", "1024", "--workers", "2"], 2048),
}


# Hogwild's three launches take over a minute: with the slow tests.
@pytest.mark.parametrize(
    "mode", [pytest.param(mode, marks=[pytest.mark.slow] if mode == "hogwild" else []) for mode in MODES_ONCE_MORE]
)
def test_a_named_run_launched_again_after_it_finished_resumes_without_a_restart_line(tmp_path, mode):
    """Only a round that did not end cleanly makes the next launch a restart: a finished (or interrupted) run
    trained further is not reported as recovering from a fault, and its restarts count from there. It says which
    checkpoint it trains on from, once."""
    launcher, processes, args, more = MODES_ONCE_MORE[mode]
    args = [*QUICK_PPO, "--num-steps", "64", "--run-name", "named", *args]
    steps = int(args[args.index("--total-timesteps") + 1])

    def launch_with(total: int) -> list[str]:
        """The launch's restart and resume lines."""
        args[args.index("--total-timesteps") + 1] = str(total)
        finished = run_ranks(launcher, SCRIPTS[mode], args, tmp_path, nproc=processes)
        assert finished.returncode == 0, finished.stderr[-3000:]
        said = (finished.stdout + finished.stderr).splitlines()
        return [line for line in said if line.startswith(("restart ", "resuming "))]

    assert launch_with(steps) == []
    newest = f"step_{steps:012d}.ckpt"
    (line,) = launch_with(steps + more)  # resumed from the finished run's last checkpoint
    assert line.startswith(f"resuming from run named's newest checkpoint, step {steps:,} (") and newest in line, line
    journal = Journal(str(run_dir(tmp_path, mode)))
    assert [round_.ended for round_ in journal.rounds()] == ["finished", "finished"]
    journal.append({"event": "start", "step": steps + more})  # a round that never ended: killed
    (line,) = launch_with(steps + 2 * more)
    assert line.startswith("restart 1 of the job: ") and "no process recorded why" in line, line  # no torchrun count


@pytest.mark.slow
def test_a_run_that_fails_in_the_same_place_stops_after_max_restarts_with_the_cause(tmp_path):
    args = [
        *QUICK_PPO,
        "--env-id",
        "envs_for_tests:FailsAfter-v0",
        "--num-envs",
        "1",
        "--num-steps",
        "64",
        "--per-rank-batch-size",
        "32",
        "--total-timesteps",
        "8192",
        "--checkpoint-every",
        "128",
    ]
    done = run_to_the_end(torchrun(SCRIPTS["fabric"], args, max_restarts=3), tmp_path)
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if "restarting cannot get past it" in line]
    assert refusals and "RuntimeError: the env broke after 500 steps" in refusals[0], done.stderr[-3000:]
    assert "(this node's restart 3 of at most 3)" in refusals[0]
    starts = [entry for entry in Journal(str(run_dir(tmp_path, "fabric"))).entries() if entry["event"] == "start"]
    assert len(starts) == 3  # rounds 0-2 trained; the third restart refused before training


@pytest.mark.slow
@pytest.mark.parametrize(
    "lag",
    [[], ["--pipeline"], ["--async", "--max-policy-lag", "2"]],
    ids=["lock-step", "pipelined", "async"],
)
def test_a_decoupled_round_is_journaled_as_started_before_a_players_env_fails_at_once(tmp_path, lag):
    # The lead player journals the round's start; player 1's env raises in its first rollout, and the launcher
    # then stops the lead. Every rank waits for the start to be on record, so each round holds it, before the fault.
    # Pipelined or async, the lead finishes an iteration or two without waiting for their updates, which never come.
    misbehaves_at_once_on_player_1 = ["--env-kwargs", '{"after": 30, "on_rank": 1}', "--num-players", "2", *lag]
    args = [*QUICK_PPO, "--env-id", "envs_for_tests:Misbehaves-v0", *misbehaves_at_once_on_player_1, "--num-envs", "1"]
    done = run_to_the_end(
        torchrun(SCRIPTS["decoupled"], [*args, "--num-steps", "64"], nproc=3, max_restarts=1), tmp_path
    )
    assert done.returncode != 0 and "lost contact with the simulator" in done.stderr, done.stderr[-3000:]
    rounds: list[list[str]] = []  # each launch's entries: its event, and the process that wrote a fault
    for entry in Journal(str(run_dir(tmp_path, "decoupled"))).entries():
        if entry["event"] == "launch":
            rounds.append([])
        rounds[-1].append(f"{entry['event']} {entry.get('role', '')}".strip())
    assert len(rounds) == 2 and all(round_[:3] == ["launch", "start", "fault player 1"] for round_ in rounds), rounds
    # Player 1 never finished its first rollout: the round got no further than step 0, and redid no step.
    restart = next(line for line in done.stderr.splitlines() if line.startswith("restart 1 of the job"))
    assert "the round before ended at step 0: player 1 failed" in restart and "; 0 steps are done twice" in restart


@pytest.mark.slow
def test_every_role_of_a_decoupled_round_journals_its_fault_at_the_step_it_had_reached(tmp_path):
    # The player's env raises at its 1,000th step; the trainer and the evaluator then lose the player, each at the
    # step of the last batch or weights it had, not at the round's start.
    fails_on_the_player = ["--env-id", "envs_for_tests:Misbehaves-v0", "--env-kwargs", '{"after": 1000, "on_rank": 0}']
    args = [*QUICK_PPO, *fails_on_the_player, "--num-envs", "1", "--num-steps", "64", "--evaluator"]
    done = run_to_the_end(
        torchrun(SCRIPTS["decoupled"], [*args, "--eval-episodes", "1"], nproc=3, max_restarts=0), tmp_path
    )
    assert done.returncode != 0 and "lost contact with the simulator" in done.stderr, done.stderr[-3000:]
    faults = {
        entry["role"]: (entry["kind"], entry["step"])
        for entry in Journal(str(run_dir(tmp_path, "decoupled"))).entries()
        if entry["event"] == "fault"
    }
    assert faults.keys() == {"the player", "trainer 1", "the evaluator"}, faults
    assert faults["the player"] == ("failed", 15 * 64)  # the 1,000th step falls in the 16th rollout
    assert faults["trainer 1"][0] == faults["the evaluator"][0] == "lost"
    assert 0 < faults["the evaluator"][1] <= faults["trainer 1"][1] <= 15 * 64, faults


def test_a_run_folder_holding_another_configs_checkpoint_is_not_loaded(tmp_path):
    first = run_ranks(
        "python", SCRIPTS["fabric"], [*QUICK_PPO, "--total-timesteps", "1024", "--run-name", "job"], tmp_path
    )
    assert first.returncode == 0, first.stderr[-2000:]
    other = run_ranks(
        "python",
        SCRIPTS["fabric"],
        [*QUICK_PPO, "--total-timesteps", "2048", "--run-name", "job", "--env-id", "Acrobot-v1"],
        tmp_path,
    )
    assert other.returncode == 2
    (line,) = other.stderr.strip().splitlines()
    assert line.startswith("error: --env-id: ") and "CartPole-v1" in line, line
    again = run_ranks(
        "python", SCRIPTS["fabric"], [*QUICK_PPO, "--total-timesteps", "2048", "--run-name", "job"], tmp_path
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumes from step 1024" in again.stderr or len(list(tmp_path.glob("logs/*/job/checkpoints/*"))) >= 1


def test_a_checkpoint_folder_that_cannot_be_written_ends_the_run_at_start(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    done = launch("torchrun", SCRIPTS["fabric"], [*QUICK_PPO, "--log-dir", str(blocker / "logs")], tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines and all(line.startswith("error: --log-dir: cannot write checkpoints into") for line in lines)
    assert str(REPO / "rl") not in done.stderr  # no traceback through the project (torchrun's own summary aside)


def test_checkpoint_every_takes_a_time(tmp_path):
    done = run_ranks(
        "python",
        SCRIPTS["fabric"],
        [*QUICK_PPO, "--total-timesteps", "6144", "--checkpoint-every", "0.1s", "--keep-last", "100"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # 12 iterations, each longer than 0.1 s: a checkpoint after most of them, and the last
    assert len(list(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt"))) >= 3


@pytest.mark.parametrize("lag", [[], ["--async", "--max-policy-lag", "2"]], ids=["lock-step", "async"])
def test_decoupled_players_checkpoint_together_by_the_lead_players_clock(tmp_path, lag):
    args = [*QUICK_PPO, "--num-players", "2", "--num-envs", "1", "--num-steps", "64", "--total-timesteps", "8192"]
    done = run_ranks(
        "fabric run",
        SCRIPTS["decoupled"],
        [*args, "--checkpoint-every", "0.1s", "--keep-last", "100", *lag],
        tmp_path,
        3,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    saved = sorted(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt"))
    assert len(saved) >= 3  # 64 iterations of a few tens of ms: several by the clock, and the last
    for path in saved:  # each one written by both players at the same iteration
        checkpoint = torch.load(path, weights_only=True)
        assert len(checkpoint["rank_states"]) == 2 and checkpoint["counters"]["global_step"] % 128 == 0


@pytest.mark.slow
def test_hogwild_workers_meet_to_checkpoint_by_their_clocks(tmp_path):
    args = [*QUICK_PPO, "--workers", "2", "--total-timesteps", "8192", "--keep-last", "100"]
    done = run_ranks("python", SCRIPTS["hogwild"], [*args, "--checkpoint-every", "0.1s"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = sorted(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt"))
    assert len(saved) >= 3  # 16 iterations per worker of a few tens of ms: several by the clock, and the last
    assert all(len(torch.load(path, weights_only=True)["workers"]) == 2 for path in saved)
    # Resumed with worker 0 at its last iteration and worker 1 halfway: worker 1's clock still asks for checkpoints.
    state = torch.load(saved[0].parent / "step_000000008192.ckpt", weights_only=True)
    state["workers"][1] |= {"iteration": 4, "frames": 1024}  # 12 iterations of about 50 ms left
    state["counters"]["global_step"] = 4096 + 1024
    uneven = tmp_path / "uneven.ckpt"  # outside the run's folder: the resumed run writes a folder of its own
    torch.save(state, uneven)
    resumed = run_ranks(
        "python", SCRIPTS["hogwild"], [*args, "--checkpoint-every", "0.1s", "--resume-from", str(uneven)], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    written = set(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt")) - set(saved)
    assert len(written) >= 2  # by the clock, and the last


@pytest.mark.parametrize("text", ["10x", "-5", "0s", "m"])
def test_checkpoint_every_refuses_what_is_neither_steps_nor_a_time(text):
    # what every rank checks before training (tests/test_bad_input.py launches the one-line exit itself)
    with pytest.raises(UsageError, match=r"^--checkpoint-every: give env steps"):
        validate(parse_config(["--checkpoint-every", text]), world_size=1, gpu_count=0)


# --- A fresh round in a store that outlives the rounds ----------------------------------------


def one_round(port: int, world_size: int) -> list[str]:
    """Each rank a thread with a store client of its own: what is tested is the store protocol."""

    def join(rank: int) -> str:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
        return agree_on_round(store, rank, world_size, timeout_seconds=20)

    with ThreadPoolExecutor(max_workers=world_size) as pool:
        ids = {rank: pool.submit(join, rank) for rank in reversed(range(world_size))}  # rank 0 draws last
        return [ids[rank].result(timeout=30) for rank in range(world_size)]


def test_every_round_agrees_on_an_id_that_no_earlier_round_used():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=20))
    server.set("rl/round/ask/1", "stale-nonce")
    server.set("rl/round/answer/stale-nonce", "an-earlier-round")
    seen = set()
    for world_size in (3, 3, 2):
        ids = one_round(server.port, world_size)
        assert len(set(ids)) == 1 and ids[0] not in seen and ids[0] != "an-earlier-round"
        seen.add(ids[0])


@pytest.mark.parametrize("rank, missing", [(0, "rank 1"), (1, "rank 0")])
def test_a_round_that_a_rank_never_joins_ends_with_a_line_naming_it(monkeypatch, rank, missing):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setattr(rl.elastic, "_role", None)  # as a process joining is: a role named by an earlier test goes
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=20))
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=20))
    with pytest.raises(RunStopped) as stopped:
        agree_on_round(store, rank, 2, timeout_seconds=0.5)
    assert str(stopped.value) == (
        f"rank {rank}: {missing} did not join within --collective-timeout 0.5 s; "
        "a process that ends while starting says why in its own output"
    )


WAIT_FOR_RANK_0 = """
import sys
from datetime import timedelta
import torch.distributed as dist
from rl.elastic import agree_on_round
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=60))
print("waiting", flush=True)
agree_on_round(store, 1, 2, timeout_seconds=60)
"""


def ctrl_c_while_waiting(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `script`, which prints "waiting" before it blocks, and press Ctrl-C once it waits: its stderr, which
    it must close within 10 s."""
    process = subprocess.Popen(
        [str(BIN / "python"), "-c", script, *args],
        env={**child_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "waiting\n"
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
    return stderr


def test_a_rank_waiting_for_its_round_hears_ctrl_c_at_once():
    """A terminal's Ctrl-C during the rendezvous reaches every rank: one left waiting in C++ for a rank 0 that
    Ctrl-C already ended would hold on until the launcher kills it, 30 s later."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=20))  # no rank 0 comes
    stderr = ctrl_c_while_waiting(WAIT_FOR_RANK_0, str(server.port))
    assert "KeyboardInterrupt" in stderr, stderr[-2000:]


CONNECT_TO_A_GONE_STORE = """
from rl.elastic import job_store_client
print("waiting", flush=True)
job_store_client(timeout_seconds=60)
"""


def test_a_rank_connecting_to_a_store_that_is_gone_hears_signals_at_once():
    """A launcher killed outright takes the store it hosts with it. Its ranks hear of that by a signal (parent
    death), which must reach them while they connect, not once the connect's 60 s timeout has passed."""
    port = free_port()  # nothing listens there: the store's host is gone
    stderr = ctrl_c_while_waiting(CONNECT_TO_A_GONE_STORE, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert "KeyboardInterrupt" in stderr, stderr[-2000:]


def test_a_store_client_waits_for_a_store_that_comes_up_late_and_keeps_its_full_timeout(monkeypatch):
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    with ThreadPoolExecutor(1) as pool:
        client = pool.submit(job_store_client, 30)
        time.sleep(1)
        assert not client.done()
        server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
        store = client.result(timeout=20)
    store.set("key", "value")
    assert server.get("key") == b"value" and store.timeout == timedelta(seconds=30)


def test_a_store_client_names_the_address_where_no_store_answered(monkeypatch):
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    with pytest.raises(dist.DistNetworkError, match=f"no rendezvous store answered at 127.0.0.1:{port}"):
        job_store_client(1)


# --- The journal ---------------------------------------------------------------------------------


def test_the_journal_tells_each_round_its_start_reach_and_cause(tmp_path):
    journal = Journal(str(tmp_path))
    for entry in (
        {"event": "start", "step": 0},
        {"event": "fault", "role": "rank 0", "kind": "lost", "what": "rank 1: its process ended", "step": 512},
        {"event": "start", "step": 512, "redone": 0},
        {"event": "fault", "role": "rank 1", "kind": "failed", "what": "ValueError: x", "step": 1024},
        {"event": "fault", "role": "rank 0", "kind": "lost", "what": "rank 1: its process ended", "step": 1024},
    ):
        journal.append(entry)
    with open(journal.path, "a") as file:
        file.write('{"event": "fau')  # torn by a kill mid-write
    first, second = journal.rounds()
    assert (first.started_at, first.reached, second.started_at, second.reached) == (0, 512, 512, 1024)
    assert describe_end(first) == "rank 0 lost rank 1: its process ended"
    assert describe_end(second) == "rank 1 failed: ValueError: x"  # the cause, not its symptom
    assert not same_failure(first, second)
    assert same_failure(second, RoundRecord(512, 1024, second.faults, 0))
    lost_twice = RoundRecord(512, 1024, [f for f in second.faults if f["kind"] == "lost"], 0)
    assert not same_failure(lost_twice, lost_twice)  # a process lost twice is bad luck, not a bug to stop for
    assert json.loads(Path(journal.path).read_text().splitlines()[0])["event"] == "start"


# --- Membership that changes ---------------------------------------------------------------------


def agent(cwd: Path, port: int, args: list[str], script: str = "fabric", nproc: int = 1) -> subprocess.Popen:
    """One torchrun agent (a "node" of `nproc` processes) of a job whose c10d rendezvous admits 1 to 2 nodes."""
    command = [
        str(BIN / "torchrun"),
        "--nnodes=1:2",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=shrinks-and-grows",
        "--max-restarts=3",
        "--monitor-interval=0.2",
        "--rdzv-conf=last_call_timeout=2,keep_alive_interval=2,keep_alive_max_attempt=3",
        str(SCRIPTS[script]),
        *args,
    ]
    # torchrun 2.13's agents share one store across rounds by default, and a round that a node joins then
    # waits forever for the store's address (the first node does not publish it again): a store per round.
    env = child_env() | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.mark.slow
def test_a_node_lost_leaves_the_job_on_fewer_nodes_and_a_node_that_joins_is_taken_in(tmp_path):
    hold = tmp_path / "hold"  # while it exists, every env waits: the host cannot finish before the joiner is in
    held_env = ["--env-id", "envs_for_tests:HeldCartPole-v0", "--env-kwargs", json.dumps({"hold": str(hold)})]
    args = [*QUICK_PPO, *held_env, "--total-timesteps", "32768", "--checkpoint-every", "1024"]
    port = free_port()
    host = agent(tmp_path, port, args)  # hosts the rendezvous store: the first agent to listen on the port does
    wait_until_listening(port, host)  # else, slow to import on a loaded machine, it could find the other hosting it
    other, joiner = agent(tmp_path, port, args), None
    try:
        wait_for_new_checkpoint(host, tmp_path, newest_step(tmp_path))
        kill_node(other)  # the node is gone, agent and worker alike, and does not come back
        journal = lambda: Journal(str(next(tmp_path.glob("logs/*/*")))).entries()  # noqa: E731
        world_sizes = lambda: [e["world_size"] for e in journal() if e["event"] == "start"]  # noqa: E731
        wait_until(lambda: world_sizes() == [2, 1], host)
        wait_for_new_checkpoint(host, tmp_path, newest_step(tmp_path))  # training again, alone
        hold.touch()
        joiner = agent(tmp_path, port, args)
        # torchrun stops the held worker to take the joiner in (held, it cannot reach the checkpoint SIGTERM asks
        # for, and stops with its env call named once that has run long enough); the next round's ranks step their
        # envs before they journal its start, so the hold ends here.
        faults = lambda: [e["kind"] for e in journal() if e["event"] == "fault"]  # noqa: E731
        stopped = lambda: faults() in (["lost", "stopped"], ["lost", "stalled"])  # noqa: E731
        wait_until(stopped, host)
        hold.unlink()
        _, host_err = finish(host, timeout=300)
        _, joiner_err = finish(joiner, timeout=60)
    finally:
        for job in (host, other, joiner):
            if job is not None:
                kill_node(job)
    assert host.returncode == 0, host_err[-3000:]
    # The joiner's workers finish; its agent may then find the store gone with the host's (torchrun's exit barrier).
    assert joiner.returncode == 0 or "Error waiting on exit barrier" in joiner_err, joiner_err[-3000:]
    assert "exitcode" not in joiner_err, joiner_err[-3000:]  # no worker failed
    starts = [entry for entry in journal() if entry["event"] == "start"]
    assert [entry["world_size"] for entry in starts] == [2, 1, 2]
    assert "resumes on 1: every rank's envs restart from fresh resets (4 per rank)" in host_err + joiner_err
    assert "resumes on 2: every rank's envs restart from fresh resets (2 per rank)" in host_err + joiner_err
    agent_file = torch.load(next(tmp_path.glob("logs/*/*/agent.ckpt")), weights_only=True)
    assert agent_file["config"]["num_envs"] == 2 and agent_file["config"]["per_rank_batch_size"] == 64


@pytest.mark.slow
def test_a_node_that_joins_a_training_job_costs_no_steps_the_ranks_it_stops_checkpoint_first(tmp_path):
    # torchrun stops the round's workers with SIGTERM to take a joining node in: each rank checkpoints where it is
    # (the only checkpoint before the end: --checkpoint-every is left at 0), and the next round resumes there.
    args = [*QUICK_PPO, "--total-timesteps", "1000000"]
    port = free_port()
    host = agent(tmp_path, port, args)
    wait_until_listening(port, host)
    joiner = None
    try:
        wait_until(lambda: reached_step(tmp_path) >= 2048, host)  # the round of one node is training
        joiner = agent(tmp_path, port, args)
        journal = lambda: Journal(str(next(tmp_path.glob("logs/*/*")))).entries()  # noqa: E731
        starts = lambda: [entry for entry in journal() if entry["event"] == "start"]  # noqa: E731
        wait_until(lambda: len(starts()) == 2, host)
        wait_until(lambda: reached_step(tmp_path) > starts()[1]["step"], host)  # and the round of two trains on
    finally:
        for job in (host, joiner):
            if job is not None:
                kill_node(job)
    # The first round ended as a stop does (no fault), at the step the second round started from, redoing none.
    entries = [(entry["event"], entry.get("how"), entry.get("world_size")) for entry in journal()]
    until_the_second_round = entries[: entries.index(("start", None, 2)) + 1]
    assert until_the_second_round == [
        ("launch", None, None),
        ("start", None, 1),
        ("end", "interrupted", None),
        ("launch", None, None),
        ("start", None, 2),
    ]
    stopped_at = next(entry["step"] for entry in journal() if entry["event"] == "end")
    assert [(entry["world_size"], entry["step"], entry["redone"]) for entry in starts()] == [
        (1, 0, 0),
        (2, stopped_at, 0),
    ]
    assert newest_step(tmp_path) == stopped_at  # the checkpoint it resumed from, written as the rank stopped


@pytest.mark.slow
def test_a_decoupled_job_keeps_its_player_and_changes_its_trainers_as_nodes_leave_and_join(tmp_path):
    # Two nodes of two processes: a player and three trainers. A node lost leaves the player and one trainer, which
    # takes the whole rollout as its minibatches; a node that joins brings three trainers back. The player, the same
    # one in number, restores its envs exactly (no fresh resets) in every round.
    args = [*QUICK_PPO, "--num-envs", "6", "--total-timesteps", "100000000", "--checkpoint-every", "1536"]
    port = free_port()
    node = functools.partial(agent, tmp_path, port, args, script="decoupled", nproc=2)
    host = node()
    wait_until_listening(port, host)
    other, joiner = node(), None
    journal = lambda: [entry for run in tmp_path.glob("logs/*/*") for entry in Journal(str(run)).entries()]  # noqa: E731
    world_sizes = lambda: [entry["world_size"] for entry in journal() if entry["event"] == "start"]  # noqa: E731
    try:
        wait_until(lambda: world_sizes() == [4] and reached_step(tmp_path) > 6 * 1536, host)
        kill_node(other)
        wait_until(lambda: world_sizes() == [4, 2], host)
        wait_until(lambda: newest_step(tmp_path) > journal()[-1]["step"] + 2 * 1536, host)  # training again, alone
        one_trainer = newest_checkpoint(tmp_path)
        joiner = node()
        wait_until(lambda: world_sizes() == [4, 2, 4], host)
        wait_until(lambda: newest_step(tmp_path) > journal()[-1]["step"] + 2 * 1536, host)
        three_trainers = newest_checkpoint(tmp_path)
    finally:
        for job in (host, other, joiner):
            if job is not None:
                kill_node(job)
        stderr = "".join(job.stderr.read() for job in (host, joiner) if job is not None)
    assert (one_trainer["world_size"], one_trainer["config"]["per_rank_batch_size"]) == (2, 3 * 64)
    assert (three_trainers["world_size"], three_trainers["config"]["per_rank_batch_size"]) == (4, 64)
    assert "fresh resets" not in stderr, stderr[-3000:]
    lost = [entry for entry in journal() if entry["event"] == "fault"]
    assert lost and all(entry["step"] > 3 * 1536 for entry in lost)  # where the round was, trainers' faults too
    # The join stopped the round of two as a Ctrl-C does: it checkpointed where it was, and none of its steps
    # were redone (the count starts again after a round that ended cleanly).
    assert [entry["how"] for entry in journal() if entry["event"] == "end"] == ["interrupted"]
    assert [entry["redone"] for entry in journal() if entry["event"] == "start"][2] == 0


@pytest.mark.slow
def test_a_run_that_resumes_on_fewer_ranks_from_fresh_resets_still_learns(tmp_path):
    # Not exact: the checkpoint's two ranks of envs become one rank's envs, restarted from fresh resets.
    # The learning test's config (65,536 steps to 475), stopped after a quarter and finished on one rank.
    args = ["--total-timesteps", "65536", "--seed", "1", "--checkpoint-every", "16384", "--run-name", "shrinks"]
    two_ranks = start(torchrun(SCRIPTS["fabric"], args, max_restarts=0), tmp_path)
    try:
        wait_for_new_checkpoint(two_ranks, tmp_path, seen=-1)
    finally:
        kill_node(two_ranks)  # the whole job, at once: the newest checkpoint is the first
    one_rank = run_to_the_end(torchrun(SCRIPTS["fabric"], args, nproc=1), tmp_path, timeout=300)
    assert one_rank.returncode == 0, one_rank.stderr[-3000:]
    assert (
        "warning: the checkpoint of 2 ranks resumes on 1: every rank's envs restart from fresh resets (4 per rank)"
        in one_rank.stderr
    ), one_rank.stderr[-3000:]
    assert "resumes from step 16384" in one_rank.stderr, one_rank.stderr[-3000:]
    ((_, greedy_return),) = read_scalars(run_dir(tmp_path, "fabric"))["Test/return_mean"]
    assert greedy_return >= 475, greedy_return


def newest_checkpoint(cwd: Path) -> dict:
    """The newest training checkpoint of a run that is writing more (and pruning the oldest meanwhile)."""
    for _ in range(20):
        with contextlib.suppress(OSError, RuntimeError, EOFError):
            return torch.load(max(cwd.glob("logs/*/*/checkpoints/step_*.ckpt")), weights_only=True)
    raise AssertionError("no checkpoint could be read")


def kill_node(job: subprocess.Popen) -> None:
    """`kill -9` an agent and its workers (torchrun starts each worker in a session of its own)."""
    for pid in [*child_pids(job.pid), job.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait()


def wait_for_new_checkpoint(job: subprocess.Popen, cwd: Path, seen: int, seconds: float = 240) -> None:
    wait_until(lambda: newest_step(cwd) > seen, job, seconds)


def wait_until_listening(port: int, job: subprocess.Popen) -> None:
    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    wait_until(listening, job)


def wait_until(predicate, job: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_round_whose_collective_timed_out_names_the_wait_not_the_process_lost_after_it():
    late = {"role": "rank 1", "kind": "timeout", "what": "another rank: Timed out waiting 300000ms", "step": 512}
    lost = {"role": "rank 0", "kind": "lost", "what": "rank 1: its process ended", "step": 512}
    record = RoundRecord(0, 512, [lost, late], 0)
    assert describe_end(record) == (
        "rank 1 waited longer than --collective-timeout for another rank: Timed out waiting 300000ms"
    )


def test_a_round_that_a_hung_env_held_names_the_env_call_not_the_wait_it_caused():
    late = {"role": "rank 0", "kind": "timeout", "what": "another rank: Timed out waiting 300000ms", "step": 512}
    stalled = {"role": "rank 1", "kind": "stalled", "what": "the env's step had not returned after 300 s", "step": 512}
    record = RoundRecord(0, 512, [late, stalled], 0)
    assert describe_end(record) == "rank 1: the env's step had not returned after 300 s"
