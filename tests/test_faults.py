"""Faults around the process group: a peer lost mid-average, a rendezvous port another job holds, a launcher
killed."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import (
    SCRIPTS,
    Finished,
    child_env,
    child_pids,
    free_port,
    join_as_rank,
    kill_outright,
    kill_process_group,
    launch,
    rank_pid,
    start,
    wait_until_the_run_opens,
)
from torch import nn

import rl.faults
import rl.signals
from rl.algos.sac.config import SACConfig
from rl.errors import listed
from rl.faults import (
    PeerLost,
    PeerWatch,
    ctrl_c_stop_record,
    gather_process_ids,
    process_ended,
    sigterm_stop_record,
    watched_signals,
)
from rl.optim import FlatGradients
from rl.runtime import TorchRuntime
from rl.signals import STOP_SECONDS, HeldSigterm


def _average_after_peer_exits(rank: int, port: int, folder: str, path: str) -> None:
    join_as_rank(rank, port)
    runtime = TorchRuntime(SACConfig(), 2)
    torch.distributed.barrier()
    if rank == 1:
        os._exit(0)  # the peer is lost without a word
    time.sleep(1.0)
    model = nn.Linear(4, 1)
    gradients = FlatGradients(list(model.parameters())).buffer
    try:
        if path == "backward_and_average":
            runtime.backward_and_average(model(torch.ones(2, 4)).sum(), gradients)
        else:
            runtime.start_mean(gradients)()
        outcome = f"returned {gradients.tolist()}"
    except RuntimeError as error:
        outcome = f"raised {type(error).__name__}: {str(error).splitlines()[0]}"
    with open(os.path.join(folder, "outcome.txt"), "w") as file:
        file.write(outcome)
    os._exit(0)  # the process group is broken: no teardown


@pytest.mark.parametrize("path", ["backward_and_average", pytest.param("start_mean", marks=pytest.mark.slow)])
def test_a_gradient_average_whose_peer_is_lost_raises_instead_of_returning_gradients(tmp_path, path):
    mp.spawn(_average_after_peer_exits, args=(free_port(), str(tmp_path), path), nprocs=2, join=True)
    outcome = (tmp_path / "outcome.txt").read_text()
    assert outcome.startswith("raised"), outcome


def hand_started_rank(rank: int, port: int) -> dict[str, str]:
    """The environment of one process of a two-process job started without a launcher, as srun starts one."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


@pytest.mark.parametrize("script", ["fabric", "torch", pytest.param("decoupled", marks=pytest.mark.slow)])
def test_a_rendezvous_port_taken_by_another_job_is_named_with_the_flag_that_frees_it(tmp_path, script):
    # Rank 0 of a job started without a launcher's rendezvous (as srun does) hosts the store itself.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = subprocess.run(
            [sys.executable, str(SCRIPTS[script]), "--no-progress-bar"],
            cwd=tmp_path,
            env=child_env() | hand_started_rank(0, port),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert finished.returncode == 2, finished.stderr[-3000:]
    lines = finished.stderr.strip().split("\n")
    assert (
        lines[-1] == f"error: --main-port: port {port} is taken, most likely by another job on this machine; "
        "start with a free one: fabric run --main-port=N, or torchrun --master-port=N (MASTER_PORT=N)"
    ), lines


@pytest.mark.parametrize(
    "rank, who",
    [
        (0, "1 of the job's 2 processes"),
        pytest.param(1, "rank 0, which hosts the job's store at 127.0.0.1:{port},", marks=pytest.mark.slow),
    ],
)
def test_a_process_whose_peer_never_starts_says_it_waits_then_names_who_did_not_join(tmp_path, rank, who):
    port = free_port()
    finished = subprocess.run(
        [sys.executable, str(SCRIPTS["fabric"]), "--no-progress-bar", "--collective-timeout", "4"],
        cwd=tmp_path,
        env=child_env() | hand_started_rank(rank, port),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 1, finished.stderr[-3000:]
    lines = finished.stderr.strip().split("\n")
    assert f"rank {rank}: waiting for the job's other processes to join (--collective-timeout 4 s)" in lines, lines
    assert lines[-1] == (
        f"error: rank {rank}: {who.format(port=port)} did not join within --collective-timeout 4 s; "
        "a process that ends while starting says why in its own output"
    ), lines


def test_a_rank_that_cannot_reach_torchruns_store_names_the_store(tmp_path):
    # As torchrun starts a rank (its job id, its agent's store), on a node whose agent no longer answers.
    port = free_port()
    under_torchrun = hand_started_rank(1, port) | {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    finished = subprocess.run(
        [sys.executable, str(SCRIPTS["torch"]), "--no-progress-bar", "--collective-timeout", "3"],
        cwd=tmp_path,
        env=child_env() | under_torchrun,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 1, finished.stderr[-3000:]
    lines = finished.stderr.strip().split("\n")
    assert lines[-1] == f"error: rank 1: the job's store at 127.0.0.1:{port} (torchrun's) could not be reached", lines


# A peer that holds its end of a connection at its highest descriptor, above thousands of open
# files: the kernel closes a dying process's files newest first, so the connection drops long
# before the process is a zombie.
PEER = """
import os, resource, sys, time
connection = int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
count = min(hard, 8192) - 16
resource.setrlimit(resource.RLIMIT_NOFILE, (count + 16, hard))
files = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
os.dup2(connection, count + 8)
os.close(connection)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_processes_lost_are_listed_as_a_sentence_lists_them():
    lost = (["the player"], ["rank 1", "rank 2"], ["player 0", "player 1", "trainer 3"])
    assert [listed(names) for names in lost] == [
        "the player",
        "rank 1 and rank 2",
        "player 0, player 1 and trainer 3",
    ]


def test_a_lost_peers_detail_is_what_happened_without_gloos_source_line_or_advice():
    closed = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:932. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
        "before reporting an error. GLHF! \U0001f3d6\ufe0f\nmore lines"
    )
    assert PeerLost("trainer 1", closed).detail == "Connection closed by peer [127.0.0.1]:932"
    waited = "Timed out waiting 300000ms for recv operation to complete"
    lost = PeerLost("rank 1", f"[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] {waited}")
    assert lost.detail == waited and lost.timed_out
    assert PeerLost("rank 1", "").detail == "no detail"


def test_a_killed_peer_counts_as_ended_as_soon_as_its_connection_drops():
    # The survivor sees the connection drop while the peer is still exiting: it must already name
    # the peer's process as ended (a race first seen in CI).
    for _ in range(5):
        ours, theirs = socket.socketpair()
        peer = subprocess.Popen(
            [sys.executable, "-c", PEER, str(theirs.fileno())], pass_fds=[theirs.fileno()], stdout=subprocess.PIPE
        )
        theirs.close()
        assert peer.stdout.readline() == b"ready\n"
        assert not process_ended(peer.pid)
        os.kill(peer.pid, signal.SIGKILL)
        assert ours.recv(1) == b""  # the peer's end closed
        ended = process_ended(peer.pid)
        peer.wait()
        peer.stdout.close()
        ours.close()
        assert ended


@pytest.mark.slow
@pytest.mark.parametrize(("script", "nproc", "flags"), [("fabric", 2, []), ("decoupled", 3, ["--evaluator"])])
def test_a_closing_evaluation_longer_than_the_collective_timeout_ends_the_run_normally(tmp_path, script, nproc, flags):
    # No process waits in a collective, which would give up after --collective-timeout, for the closing evaluations
    # (the run's own, and the evaluator's of the final weights), nor for the evaluator's evaluation in progress.
    # The timeout leaves room for the processes' start, which it also bounds, on a loaded machine.
    timeout, evaluation_seconds = 15, 20
    args = [str(evaluation_seconds), str(SCRIPTS[script]), "--total-timesteps", "1024", "--update-epochs", "1"]
    args += ["--eval-episodes", "2", "--collective-timeout", str(timeout), "--no-progress-bar", *flags]
    finished = launch("fabric run", Path(__file__).parent / "slow_closing_evaluation.py", args, tmp_path, nproc)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "evaluation over 2 greedy episodes" in finished.stdout
    assert finished.seconds > evaluation_seconds


@pytest.mark.slow
def test_a_rank_that_waits_longer_than_the_collective_timeout_says_so_rather_than_that_a_rank_was_lost(tmp_path):
    # Rank 0's periodic evaluation (--eval-every), which the others wait for, takes longer than the timeout.
    timeout, evaluation_seconds = 15, 25
    args = [str(evaluation_seconds), str(SCRIPTS["fabric"]), "--total-timesteps", "2048", "--update-epochs", "1"]
    args += ["--eval-every", "512", "--eval-episodes", "1", "--collective-timeout", str(timeout), "--no-progress-bar"]
    finished = launch("fabric run", Path(__file__).parent / "slow_closing_evaluation.py", args, tmp_path)
    assert finished.returncode != 0
    lines = finished.stderr.splitlines()
    waited = [line for line in lines if line.startswith("error: rank 1: ")]
    assert waited and waited[0].startswith(
        "error: rank 1: another rank did not reach a collective within --collective-timeout, and no process of the "
        "job is known to have ended: "
    ), lines[-20:]
    assert "Timed out" in waited[0]


def sigterm_once(command: list[str], folder: Path, ready: str) -> Finished:
    """Run `command`, and SIGTERM it once a file matching `ready` is in `folder` (`seconds`: from the signal on)."""
    run = subprocess.Popen(command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list(folder.glob(ready)):
        assert run.poll() is None and time.monotonic() < deadline, f"no {ready} came"
        time.sleep(0.2)
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=60)
    return Finished(run.returncode, stdout, stderr, time.monotonic() - signalled)


@pytest.mark.slow
def test_sigterm_checkpoints_a_run_and_then_ends_it_by_the_signal(tmp_path):
    """A kill, SLURM's scancel or time limit, a shutdown: the run stops as Ctrl-C stops it, with a checkpoint, and
    its process still ends by the signal, as whoever sent it expects."""
    command = [sys.executable, str(SCRIPTS["fabric"]), "--total-timesteps", "10000000", "--log-dir", str(tmp_path)]
    command += ["--no-progress-bar", "--checkpoint-every", "2048", "--keep-last", "100"]
    run = sigterm_once(command, tmp_path, "fabric_logs/*/checkpoints/step_*.ckpt")
    assert run.returncode == -signal.SIGTERM, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == "rank 0: SIGTERM: checkpointing, then stopping", run.stderr[-3000:]
    newest = sorted(tmp_path.glob("fabric_logs/*/checkpoints/step_*.ckpt"))[-1]
    step = torch.load(newest, weights_only=True)["counters"]["global_step"]
    assert f"interrupted at step {step}: checkpoint written" in run.stdout, run.stdout[-3000:]


# A caller with a SIGTERM handler of its own, which reports when the signal reached it.
CALLER_WITH_A_HANDLER = """
import signal, sys
import rl

heard = []
signal.signal(signal.SIGTERM, lambda *_: heard.append("SIGTERM"))
config = rl.PPOConfig(
    total_timesteps=10_000_000, eval_episodes=0, progress_bar=False, log_dir=sys.argv[1], checkpoint_every="2048"
)
result = rl.train(config)
print("returned", heard, result.agent_path, flush=True)
"""


def test_sigterm_in_python_checkpoints_and_then_reaches_the_callers_own_handler(tmp_path):
    command = [sys.executable, "-c", CALLER_WITH_A_HANDLER, str(tmp_path)]
    run = sigterm_once(command, tmp_path, "fabric_logs/*/checkpoints/step_*.ckpt")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "interrupted at step" in run.stdout and "returned ['SIGTERM'] None" in run.stdout, run.stdout[-3000:]


# A SIGTERM after the loop's last stop check, as its final checkpoint is written.
SIGTERM_AT_THE_LAST_ITERATION = """
import os, signal, sys
import rl

class Terminates(rl.Callback):
    def on_checkpoint(self, state):
        if state.iteration == state.num_iterations:
            os.kill(os.getpid(), signal.SIGTERM)

config = rl.PPOConfig(total_timesteps=2048, eval_episodes=5, progress_bar=False, log_dir=sys.argv[1])
rl.train(config, callbacks=[Terminates()])
"""


@pytest.mark.slow
def test_sigterm_that_comes_too_late_for_a_stop_ends_the_run_after_its_final_checkpoint(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", SIGTERM_AT_THE_LAST_ITERATION, str(tmp_path)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "error: rank 0: stopped by SIGTERM (a kill, scancel or shutdown); its checkpoints are kept"
    ), run.stderr[-3000:]
    assert [path.name for path in tmp_path.glob("fabric_logs/*/checkpoints/*")] == ["step_000000002048.ckpt"]


# A callback that stops returning at the third iteration: no stop can be agreed after it.
BLOCKED_RUN = """
import pathlib, sys, time
import rl

class Blocks(rl.Callback):
    def on_iteration_end(self, state):
        if state.iteration == 3:
            pathlib.Path(sys.argv[1], "blocked").touch()
            time.sleep(600)

config = rl.PPOConfig(total_timesteps=10_000_000, eval_episodes=0, progress_bar=False, log_dir=sys.argv[1])
rl.train(config, callbacks=[Blocks()])
"""


@pytest.mark.slow
def test_sigterm_that_brings_no_checkpoint_in_time_ends_the_run_with_a_line_that_says_so(tmp_path):
    run = sigterm_once([sys.executable, "-c", BLOCKED_RUN, str(tmp_path)], tmp_path, "blocked")
    assert run.returncode == 1
    assert run.seconds >= STOP_SECONDS
    assert run.stderr.strip().splitlines()[-1] == (
        "error: rank 0: stopped by SIGTERM before its checkpoint: the processes did not agree on a stop within "
        f"{STOP_SECONDS:.0f} s; the earlier checkpoints are kept"
    ), run.stderr[-3000:]


STOPPED_WHILE_HELD = {
    "sigterm": "error: rank 0: stopped by SIGTERM before its checkpoint: its main thread was held in ",
    "ctrl-c": "interrupted (Ctrl-C): rank 0: its main thread was held in ",
}
CHECKPOINTS_KEPT = {
    "sigterm": "the earlier checkpoints are kept",
    "ctrl-c": "stopped before its checkpoint; the checkpoints written before are kept",
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_a_stop_to_a_rank_whose_peer_no_longer_answers_ends_it_with_a_line_that_says_where_it_waited(tmp_path, stop):
    # Its main thread waits in a collective, where Python runs no signal handler: its stop cannot even be asked for.
    # SIGTERM comes to the rank itself; Ctrl-C to the launcher, which passes it on, and kills the ranks 30 s later.
    args = ["--total-timesteps", "10000000", "--no-progress-bar", "--eval-episodes", "0"]
    job = start("fabric run", SCRIPTS["fabric"], args, tmp_path, 2, stdout=subprocess.DEVNULL)
    ranks: list[int | None] = []
    try:
        wait_until_the_run_opens(tmp_path, [job])
        rank_0, rank_1 = ranks = [rank_pid(job.pid, 0), rank_pid(job.pid, 1)]
        assert rank_0 is not None and rank_1 is not None
        os.kill(rank_1, signal.SIGSTOP)  # a peer that no longer answers: stopped, not ended
        time.sleep(2)  # rank 0 into a collective that waits for it
        signalled = time.monotonic()
        os.kill(rank_0, signal.SIGTERM) if stop == "sigterm" else job.send_signal(signal.SIGINT)
        while not process_ended(rank_0):
            assert time.monotonic() - signalled < 60, f"rank 0 did not end within 60 s of its {stop}"
            time.sleep(0.2)
        stopped_after = time.monotonic() - signalled
        os.kill(rank_1, signal.SIGCONT)  # to the launcher's signal, which it has by now
        _, stderr = job.communicate(timeout=60)
    finally:
        kill_process_group(job)
        for rank in filter(None, ranks):  # each in a session of its own; a stopped one cannot see its launcher end
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
    assert STOP_SECONDS <= stopped_after < 30  # before the launcher's kill, which says nothing
    (line,) = [line for line in stderr.splitlines() if line.startswith(STOPPED_WHILE_HELD[stop])]
    assert line.endswith(f" for 20 s, where no signal is handled; {CHECKPOINTS_KEPT[stop]}"), line


@pytest.mark.parametrize(
    ("launcher", "script", "roles"),
    [
        ("fabric run", "fabric", ["rank 0", "rank 1"]),
        pytest.param("torchrun", "torch", ["rank 0", "rank 1"], marks=pytest.mark.slow),
        pytest.param("fabric run", "decoupled", ["the player", "trainer 1"], marks=pytest.mark.slow),
    ],
)
def test_ranks_stop_with_a_line_once_their_launcher_is_killed_outright(tmp_path, launcher, script, roles):
    # SIGKILL (kill -9, the out-of-memory killer) leaves a launcher no time to stop its ranks: they stop themselves
    # instead of training on alone.
    args = ["--total-timesteps", "10000000", "--no-progress-bar", "--eval-episodes", "0"]
    job = start(launcher, SCRIPTS[script], args, tmp_path, 2, stdout=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        wait_until_the_run_opens(tmp_path, [job])
        ranks = child_pids(job.pid)
        stderr, left = kill_outright(job, ranks)
    finally:
        kill_process_group(job)
        for rank in ranks:  # torchrun starts each in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
    assert len(ranks) == 2 and not left
    lost = "stopped because it lost the launcher (fabric run or torchrun): its process ended; its checkpoints are kept"
    errors = sorted(line for line in stderr.splitlines() if line.startswith("error: "))
    assert errors == sorted(f"error: {role}: {lost}" for role in roles), stderr[-3000:]


CHILD_STOPPED_WITH_ITS_PARENT = """
import ctypes, os, socket, sys
from rl.signals import stopped_with_parent


def lost():
    os.write(2, b"its parent ended\\n")
    os._exit(3)
"""

BLOCKED_IN_NATIVE_CODE = (
    CHILD_STOPPED_WITH_ITS_PARENT
    + """
mutex = ctypes.create_string_buffer(64)  # zeroed: an unlocked mutex of the default kind
lock = ctypes.CDLL(None).pthread_mutex_lock
with stopped_with_parent(lost):
    print("waiting", flush=True)
    lock(mutex)
    lock(mutex)  # it waits for itself: a wait in native code that no signal ends
"""
)

STARTS_A_CHILD = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1]])
time.sleep(600)
"""


def parent_and_child(parent: str, child: str) -> subprocess.Popen:
    """A process running the code `parent`, which starts one running `child` (its first argument) on its own pipes."""
    return subprocess.Popen(
        [sys.executable, "-c", parent, child],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_a_process_blocked_in_native_code_stops_once_its_parent_is_killed_outright():
    # What a rank or Hogwild worker must do when its launcher or supervisor gets SIGKILL while it waits in native code
    # (an env's step in a simulator, a collective), where Python's signal handlers cannot run.
    parent = parent_and_child(STARTS_A_CHILD, BLOCKED_IN_NATIVE_CODE)
    try:
        assert parent.stdout.readline() == "waiting\n"  # the child's line, on the pipe it shares with its parent
        (child,) = child_pids(parent.pid)
        time.sleep(0.5)  # into its wait
        stderr, left = kill_outright(parent, [child])
    finally:
        kill_process_group(parent)
    assert stderr == "its parent ended\n" and not left


SIGNALS_SEEN_WHILE_BLOCKED = """
import ctypes, os, signal, subprocess, sys, warnings
from rl.signals import signals_seen_on_a_thread

warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+ on a fork beside threads, as the watcher is


def seen():
    os.write(2, b"seen\\n")
    os._exit(3)


signal.signal(signal.SIGTERM, lambda *_: os.write(2, b"handled\\n"))
signal.signal(signal.SIGINT, lambda *_: os.write(2, b"ctrl-c handled\\n"))
with signals_seen_on_a_thread({signal.SIGTERM: seen, signal.SIGINT: lambda: os.write(2, b"ctrl-c seen\\n")}):
    # A fork's own SIGTERM (an async env's worker, before it takes the default back) is not this process's.
    if os.fork() == 0:
        signal.raise_signal(signal.SIGTERM)
        os._exit(0)
    os.wait()
    print("waiting", flush=True)
    mutex = ctypes.create_string_buffer(64)
    ctypes.CDLL(None).pthread_mutex_lock(mutex)
    ctypes.CDLL(None).pthread_mutex_lock(mutex)  # a wait in native code that no signal ends
"""


def test_signals_are_seen_from_a_thread_while_the_main_thread_is_blocked_in_native_code():
    # Where a collective waits for a peer that no longer answers, no signal's handler can run.
    run = subprocess.Popen(
        [sys.executable, "-c", SIGNALS_SEEN_WHILE_BLOCKED],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout.readline() == "waiting\n"
        time.sleep(0.5)  # into its wait
        run.send_signal(signal.SIGINT)
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    # The fork's SIGTERM, handled in the fork alone; then each signal, seen by its own callback.
    assert (run.returncode, stderr) == (3, "handled\nctrl-c seen\nseen\n")


LOSES_ITS_PARENTS_CONNECTION = (
    CHILD_STOPPED_WITH_ITS_PARENT
    + """
connection = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
with stopped_with_parent(lost):
    print("waiting", flush=True)
    if not connection.recv(1):
        raise ConnectionError("its parent closed the connection")
"""
)

CLOSES_A_CONNECTION_AND_THEN_ENDS = """
import os, socket, subprocess, sys, time
server = socket.create_server(("127.0.0.1", 0))
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(server.getsockname()[1])])
connection, _ = server.accept()
sys.stdin.readline()
connection.close()
time.sleep(0.05)  # as an ending process closes its sockets (a launcher, the store it hosts) before its children hear
os._exit(0)
"""


def test_an_error_from_a_connection_the_parent_closed_as_it_ended_is_taken_for_its_end():
    parent = parent_and_child(CLOSES_A_CONNECTION_AND_THEN_ENDS, LOSES_ITS_PARENTS_CONNECTION)
    try:
        assert parent.stdout.readline() == "waiting\n"
        _, stderr = parent.communicate("go\n", timeout=60)
    finally:
        kill_process_group(parent)
    assert stderr == "its parent ended\n"  # not the ConnectionError's traceback


def test_a_sigterm_that_ends_a_process_at_once_names_the_most_telling_cause_it_knows(monkeypatch):
    """A stalled env call first (what the others waited for), then a lost peer, then a stop not agreed in time, then
    the signal alone, which torchrun's jobs are told may come from the launcher."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    training, starting, timed_out = HeldSigterm("rank 1"), HeldSigterm("rank 1"), HeldSigterm("rank 1")
    training.started = timed_out.started = True
    timed_out.heard = True
    lost = "rank 0: its process ended"
    kinds = [
        sigterm_stop_record("rank 1", "env 0's step has not returned for 30 s", lost, training)[0],
        sigterm_stop_record("rank 1", "", lost, starting)[0],
        sigterm_stop_record("rank 1", "", lost, training)[0],
        sigterm_stop_record("rank 1", "", "", timed_out)[0],
    ]
    assert kinds == ["stalled", "stopped", "lost", "stopped"]
    blocked = sigterm_stop_record("rank 1", "", "", training, "rl.runtime.wait (line 202)")[2]
    assert blocked == (
        "error: rank 1: stopped by SIGTERM before its checkpoint: its main thread was held in rl.runtime.wait "
        "(line 202) for 20 s, where no signal is handled; the earlier checkpoints are kept"
    )
    assert "while it started, it had lost rank 0" in sigterm_stop_record("rank 1", "", lost, starting)[2]
    assert "did not agree on a stop within" in sigterm_stop_record("rank 1", "", "", timed_out)[2]
    alone = sigterm_stop_record("rank 1", "", "", training)[2]
    assert alone == "error: rank 1: stopped by SIGTERM (a kill, scancel or shutdown); its checkpoints are kept"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    launched = sigterm_stop_record("rank 1", "", "", training)[2]
    assert launched.endswith("from the launcher or sent to the job; no process of the job is known to be lost")


def test_ctrl_c_is_watched_from_a_thread_under_a_launcher_and_in_a_command_line_process_on_its_own(monkeypatch):
    """Not in a caller's process (a notebook's kernel), which a thread must not end; SIGTERM everywhere."""
    own = gather_process_ids(torch.device("cpu"))
    lone, ranks = PeerWatch(0, str, own, 300.0), PeerWatch(0, str, own.repeat(2, 1), 300.0)
    monkeypatch.setattr(rl.signals, "_command_line", False)
    assert watched_signals(lone, launched=False) == {signal.SIGTERM: lone.sigterm_seen}
    assert watched_signals(lone, launched=True)[signal.SIGINT] == lone.ctrl_c_seen
    monkeypatch.setattr(rl.signals, "_command_line", True)
    assert watched_signals(lone, launched=False)[signal.SIGINT] == lone.lone_ctrl_c_seen
    assert signal.SIGINT not in watched_signals(ranks, launched=False)  # ranks that no launcher started


def test_a_ctrl_c_that_ends_a_process_before_its_checkpoint_names_the_most_telling_cause_it_knows():
    """As SIGTERM's: a stalled env call, a lost peer, a main thread held where no handler runs, a stop not agreed."""
    stall, lost, held = "the env's step had not returned after 12 s", "rank 0: its process ended", "rl.runtime.wait"
    causes = [
        ctrl_c_stop_record("rank 1", stall, lost, held)[2],
        ctrl_c_stop_record("rank 1", "", lost, held)[2],
        ctrl_c_stop_record("rank 1", "", "", held)[2],
        ctrl_c_stop_record("rank 1", "", "", "")[2],
    ]
    kept = "stopped before its checkpoint; the checkpoints written before are kept"
    assert causes == [
        f"interrupted (Ctrl-C): rank 1: the env's step had not returned after 12 s; {kept}",
        f"interrupted (Ctrl-C): rank 1: it had lost rank 0: its process ended; {kept}",
        f"interrupted (Ctrl-C): rank 1: its main thread was held in rl.runtime.wait for 20 s, where no signal is "
        f"handled; {kept}",
        f"interrupted (Ctrl-C): rank 1: the processes did not agree on a stop within 20 s; {kept}",
    ]
