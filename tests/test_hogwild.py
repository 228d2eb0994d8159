"""Hogwild! mode: worker processes that share one set of networks, shared (lock-free) or synced."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from conftest import (
    ENVS_STEPPED,
    SCRIPTS,
    all_scalars,
    child_env,
    kill_outright,
    kill_process_group,
    launch,
    load_agent,
    refusal_line,
    run_dir,
    run_ranks,
    running,
    start,
)

import rl
from rl.loop import summary_line
from rl.modes.hogwild import MergedWeights, SharedState
from rl.spawned import ByValue, env_registration

PPO_SHORT = ["--total-timesteps", "4096", "--no-progress-bar", "--eval-episodes", "0"]
SAC_SHORT = [
    "sac",
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    "600",
    "--learning-starts",
    "300",
    "--no-progress-bar",
    "--eval-episodes",
    "0",
]


def agent_weights(folder) -> dict[str, torch.Tensor]:
    return load_agent(folder)["policy"]


@pytest.mark.parametrize("args", [PPO_SHORT, pytest.param(SAC_SHORT, marks=pytest.mark.slow)], ids=["ppo", "sac"])
def test_synced_with_one_worker_equals_a_one_process_run(tmp_path, args):
    (tmp_path / "hogwild").mkdir(), (tmp_path / "coupled").mkdir()
    synced = [*args, "--workers", "1", "--sync", "synced", "--sync-every", "3"]
    hogwild = run_ranks("python", SCRIPTS["hogwild"], synced, tmp_path / "hogwild")
    coupled = run_ranks("python", SCRIPTS["fabric"], args, tmp_path / "coupled")
    assert hogwild.returncode == 0, hogwild.stderr[-3000:]
    assert coupled.returncode == 0, coupled.stderr[-3000:]
    assert "hogwild: 1 worker (synced), process ids " in hogwild.stdout
    merged, alone = (
        agent_weights(run_dir(tmp_path / "hogwild", "hogwild")),
        agent_weights(run_dir(tmp_path / "coupled", "fabric")),
    )
    assert merged.keys() == alone.keys()
    assert all(torch.equal(merged[name], alone[name]) for name in merged)


def test_shared_workers_step_one_optimizer_and_count_their_frames(tmp_path):
    finished = run_ranks("python", SCRIPTS["hogwild"], [*PPO_SHORT, "--workers", "2", "--sync", "shared"], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert ENVS_STEPPED.search(finished.stdout), finished.stdout[-2000:]
    folder = run_dir(tmp_path, "hogwild")
    (checkpoint,) = (folder / "checkpoints").glob("step_*.ckpt")
    state = torch.load(checkpoint, weights_only=True)
    assert [worker["frames"] for worker in state["workers"]] == [2048, 2048]
    assert state["counters"]["global_step"] == 4096 and state["world_size"] == 2
    # 2 workers x 8 rollouts of 2 envs x 128 steps x 10 epochs x 4 minibatches of 64, all on one
    # shared Adam state. Lock-free increments of its step counter may (rarely) collide: allow a few lost.
    steps = float(state["learner"]["optimizer"]["state"][0]["step"])
    assert 2 * 8 * 10 * 4 - 8 <= steps <= 2 * 8 * 10 * 4
    frames = all_scalars(folder, "Frames/global")
    assert max(frames) == 4096 and all(step == value for step, value in frames.items())
    per_worker = [all_scalars(folder, f"Frames/worker_{k}") for k in (0, 1)]
    assert all(max(counts.values()) == 2048 for counts in per_worker)


def test_synced_merges_add_every_workers_change():
    class Copy:  # a learner's weights, as the mode sees them
        def __init__(self, value: float) -> None:
            self.weight = torch.full((3,), value)

        def weight_tensors(self) -> list[torch.Tensor]:
            return [self.weight]

    shared = SharedState([torch.zeros(3)], [], torch.zeros(2, dtype=torch.int64))
    lock = threading.Lock()
    first, second = Copy(5.0), Copy(5.0)
    a, b = MergedWeights(first, shared, lock, every=1), MergedWeights(second, shared, lock, every=2)
    assert first.weight.tolist() == second.weight.tolist() == [0.0] * 3  # both start from the global weights
    first.weight += 1.0
    second.weight += 2.0
    a.after_update()  # every=1: publishes
    assert shared.weights[0].tolist() == [1.0] * 3
    b.after_update()  # every=2: not yet
    assert shared.weights[0].tolist() == [1.0] * 3
    b.after_update()
    assert shared.weights[0].tolist() == second.weight.tolist() == [3.0] * 3
    a.take_published()
    assert first.weight.tolist() == [3.0] * 3


@pytest.mark.slow
def test_resume_continues_exactly_with_one_synced_worker(tmp_path):
    args = [*PPO_SHORT, "--total-timesteps", "8192", "--workers", "1", "--sync", "synced", "--checkpoint-every", "4096"]
    whole = run_ranks("python", SCRIPTS["hogwild"], args, tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    folder = run_dir(tmp_path, "hogwild")
    halfway = folder / "checkpoints" / "step_000000004096.ckpt"
    whole_weights = agent_weights(folder)
    (folder / "agent.ckpt").unlink()
    resumed = run_ranks("python", SCRIPTS["hogwild"], [*args, "--resume-from", str(halfway)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "training loop: 4096 steps in" in resumed.stdout  # this run's steps, not the checkpoint's too
    assert ENVS_STEPPED.search(resumed.stdout)  # each worker's, on average
    assert all(torch.equal(whole_weights[name], value) for name, value in agent_weights(folder).items())


@pytest.mark.parametrize(
    "workers, last_step",
    [(3, 3840), pytest.param(1, 4096, marks=pytest.mark.slow)],  # 3 workers: whole rounds of 3 x 256 steps
)
def test_more_or_fewer_workers_resume_a_checkpoint_sharing_out_its_steps_and_end_together(tmp_path, workers, last_step):
    args = [*PPO_SHORT, "--checkpoint-every", "1024"]  # 2 envs x 128 steps per worker iteration
    first = run_ranks("python", SCRIPTS["hogwild"], [*args, "--workers", "2"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_dir(tmp_path, "hogwild")
    halfway = folder / "checkpoints" / "step_000000002048.ckpt"  # 4 iterations of each of 2 workers
    resumed_args = [*args, "--workers", str(workers), "--resume-from", str(halfway)]
    resumed = run_ranks("python", SCRIPTS["hogwild"], resumed_args, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        f"warning: the checkpoint of 2 workers resumes on {workers}: every worker's envs restart from fresh resets"
        in resumed.stderr
    )
    assert f"training loop: {last_step - 2048} steps in" in resumed.stdout
    final = torch.load(folder / "checkpoints" / f"step_{last_step:012d}.ckpt", weights_only=True)
    assert final["world_size"] == workers
    iterations = last_step // (256 * workers)
    assert [(worker["iteration"], worker["frames"]) for worker in final["workers"]] == [
        (iterations, iterations * 256)
    ] * workers


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [7, 8], ids=["one-iteration-left", "none-left"])
def test_workers_resumed_at_different_iterations_finish_together(tmp_path, ahead):
    """After Ctrl-C the workers may have stopped at different iterations; a resumed worker that
    finishes first (or has no iteration left to run) keeps taking part in the others' checkpoints
    instead of leaving them waiting."""
    args = [*PPO_SHORT, "--workers", "2", "--checkpoint-every", "512"]
    first = run_ranks("python", SCRIPTS["hogwild"], args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_dir(tmp_path, "hogwild")
    state = torch.load(folder / "checkpoints" / "step_000000003072.ckpt", weights_only=True)
    assert [worker["iteration"] for worker in state["workers"]] == [6, 6]
    state["workers"][1] |= {"iteration": ahead, "frames": ahead * 256}  # worker 1 ahead, of 8 iterations
    uneven = tmp_path / "uneven.ckpt"
    torch.save(state, uneven)
    resumed = run_ranks("python", SCRIPTS["hogwild"], [*args, "--resume-from", str(uneven)], tmp_path, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = torch.load(folder / "checkpoints" / "step_000000004096.ckpt", weights_only=True)
    assert [worker["iteration"] for worker in final["workers"]] == [8, 8]
    assert [worker["frames"] for worker in final["workers"]] == [2048, 2048]


def worker_pids(job: subprocess.Popen) -> list[int]:
    """The workers' process ids, from the supervisor's line that starts them (after any lines on its flags)."""
    printed = []
    for line in job.stdout:
        printed.append(line)
        match = re.search(r"process ids ([\d, ]+);", line)
        if match:
            return [int(pid) for pid in match.group(1).split(",")]
    raise AssertionError(f"the supervisor ended without naming its workers: {printed}")


def long_run(tmp_path, sync: str = "shared") -> subprocess.Popen:
    args = [
        "--total-timesteps",
        "10000000",
        "--workers",
        "2",
        "--sync",
        sync,
        "--no-progress-bar",
        "--checkpoint-every",
        "4096",
    ]
    return start("python", SCRIPTS["hogwild"], args, tmp_path, nproc=1)


def wait_for_checkpoint(tmp_path, job: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not list((tmp_path / "logs").glob("*/*/checkpoints/step_*.ckpt")):
        assert job.poll() is None and time.monotonic() < deadline, job.stderr.read()[-3000:]
        time.sleep(0.2)


def test_a_killed_worker_ends_the_job_with_a_line_naming_it(tmp_path):
    job = long_run(tmp_path)
    try:
        pids = worker_pids(job)
        wait_for_checkpoint(tmp_path, job)
        os.kill(pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert time.monotonic() - killed_at < 15
    assert job.returncode == 1
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith("error: hogwild worker 1 was killed by SIGKILL; the others were stopped")
    assert not any(running(pid) for pid in pids)
    checkpoints = list((run_dir(tmp_path, "hogwild") / "checkpoints").glob("step_*.ckpt"))
    assert checkpoints and all(torch.load(path, weights_only=True)["workers"] for path in checkpoints)


def hogwild_with_hanging_envs(tmp_path: Path, fault: str = "hang") -> subprocess.Popen:
    """A two-worker Hogwild run, returned once its envs' steps have hung long enough to count as stalled."""
    marker = tmp_path / "hanging"
    args = ["--env-id", "envs_for_tests:Misbehaves-v0", "--env-kwargs", f'{{"after": 100, "fault": "{fault}"}}']
    args += ["--workers", "2", "--collective-timeout", "2", *PPO_SHORT]
    job = start("python", SCRIPTS["hogwild"], args, tmp_path, 1, {"HANG_MARKER": str(marker)})
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.stderr.read()[-3000:]
        time.sleep(0.1)
    time.sleep(1.5)  # past half the collective timeout, from which an env call counts as stalled
    return job


WORKER_ERROR = r"error: hogwild worker \d: "
STALL = r"the env's step had not returned after \d+ s; "


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hang", "hang_in_native_code"])
def test_sigterm_stops_the_workers_with_a_line_naming_an_env_step_that_hung(tmp_path, fault):
    # What a kill or scancel does to a run whose envs hang: its workers cannot meet for the checkpoint it asks for,
    # so every process ends after 20 s, and says what held it (in native code, where no handler runs: a thread).
    job = hogwild_with_hanging_envs(tmp_path, fault)
    try:
        pids = worker_pids(job)
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=60)
    finally:
        kill_process_group(job)  # workers left behind would hang on in their envs
    assert job.returncode == 1
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors[:-1] and all(
        re.fullmatch(WORKER_ERROR + STALL + "stopped by SIGTERM", line) for line in errors[:-1]
    ), stderr
    folder = f"logs/hogwild_logs/{run_dir(tmp_path, 'hogwild').name}"
    assert errors[-1] == (
        "error: hogwild: stopped by SIGTERM before its checkpoint: the workers did not agree on a stop within 20 s; "
        f"they were stopped, and the checkpoints written so far are in {folder}"
    )
    assert "leaked" not in stderr  # the channel's semaphores are freed before the process ends
    assert not any(running(pid) for pid in pids)


@pytest.mark.slow
def test_workers_whose_envs_hang_end_with_a_supervisor_killed_outright(tmp_path):
    # SIGKILL (kill -9, the out-of-memory killer) leaves the supervisor no time to stop its workers: they stop
    # themselves the moment it ends, instead of hanging on in their envs.
    job = hogwild_with_hanging_envs(tmp_path)
    try:
        pids = worker_pids(job)
        stderr, left = kill_outright(job, pids)
    finally:
        kill_process_group(job)
    assert job.returncode == -signal.SIGKILL
    assert not left
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    lost = f"{WORKER_ERROR}({STALL})?the supervising process was lost; stopping"
    assert len(errors) == 2 and all(re.fullmatch(lost, line) for line in errors), stderr
    assert any(re.match(WORKER_ERROR + STALL, line) for line in errors)  # the one whose env hung first says so


LOSES_A_WORKER_IN_PYTHON = """
import os
import signal
import rl


class KillsWorker1(rl.Callback):
    def on_iteration_end(self, state):
        if state.rank == 1 and state.iteration == 2:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":  # the workers import this file again
    config = rl.PPOConfig(total_timesteps=1_000_000, workers=2, eval_episodes=0, progress_bar=False)
    try:
        rl.train(config, callbacks=[KillsWorker1()], mode="hogwild")
    except rl.RunStopped as error:
        print(f"raised: {error}")
    print("the interpreter goes on")
"""


@pytest.mark.slow
def test_a_worker_lost_under_rl_train_raises_rather_than_ending_the_interpreter(tmp_path):
    script = tmp_path / "loses_a_worker.py"
    script.write_text(LOSES_A_WORKER_IN_PYTHON)
    finished = launch("python", script, [], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "raised: hogwild worker 1 was killed by SIGKILL; the others were stopped" in finished.stdout
    assert finished.stdout.strip().endswith("the interpreter goes on")


def run_python(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """This interpreter run with `args`, as a user runs a script, `python -c` or `python -`."""
    return subprocess.run(
        [sys.executable, *args], input=stdin, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=240
    )


# A session's own env class and callback class, which a spawned worker cannot import by name. The callback reports
# through a queue and a tensor in shared memory, which the workers must share with the session, not copy.
SESSION = """
import os, queue, gymnasium as gym, torch, torch.multiprocessing as mp, rl
from gymnasium.envs.classic_control import CartPoleEnv

class SessionCartPole(CartPoleEnv):
    pass

gym.register("SessionCartPole-v0", entry_point=SessionCartPole, max_episode_steps=100)

class ReportBack(rl.Callback):
    def __init__(self, pids, steps):
        self.pids, self.steps = pids, steps

    def on_report(self, state, scalars):
        self.pids.put(os.getpid())
        self.steps[state.rank] = state.global_step

if __name__ == "__main__":
    pids, steps = mp.get_context("spawn").Queue(), torch.zeros(2, dtype=torch.int64).share_memory_()
    config = rl.preset("cartpole", env_id="SessionCartPole-v0", total_timesteps=2048, num_steps=64, workers=2,
                       eval_episodes=0, progress_bar=False)
    result = rl.train(config, mode="hogwild", callbacks=[ReportBack(pids, steps)])
    reported = set()
    while True:
        try:
            reported.add(pids.get(timeout=5))
        except queue.Empty:
            break
    print("trained", result.global_step, "reports from", len(reported - {os.getpid()}), "workers, last at",
          steps.tolist())
"""


@pytest.mark.parametrize("session", ["script", "-c", pytest.param("stdin", marks=pytest.mark.slow)])
def test_a_sessions_own_env_and_callbacks_reach_the_workers_from_a_script_a_notebook_or_stdin(tmp_path, session):
    """Where no script can be run again in a worker (a notebook, `python -c`, `python -`), the session's own
    classes travel by value; the queues and shared tensors they hold are still the session's."""
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    command = {"script": [str(script)], "-c": ["-c", SESSION], "stdin": ["-"]}[session]
    finished = run_python(command, tmp_path, stdin=SESSION if session == "stdin" else None)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "trained 2048 reports from 2 workers, last at [2048, 2048]" in finished.stdout


def test_an_env_registration_travels_to_the_workers_unless_it_cannot_be_pickled():
    """One that cannot (a lock in its keywords) is left to what the workers' imports register, as a script's is."""
    assert pickle.loads(pickle.dumps(env_registration("CartPole-v1"))).value == gym.spec("CartPole-v1")
    gym.register("LockedCartPole-v0", "gymnasium.envs.classic_control:CartPoleEnv", kwargs={"lock": threading.Lock()})
    try:
        assert env_registration("LockedCartPole-v0").value is None
    finally:
        del gym.envs.registry["LockedCartPole-v0"]


class HoldsALock(rl.Callback):
    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_a_callback_that_cannot_be_pickled_for_the_workers_is_named_before_any_starts_or_a_run_folder_is_made(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    config = rl.preset("cartpole", total_timesteps=2048, workers=2, eval_episodes=0, progress_bar=False)
    cannot = "the callbacks cannot be pickled for a spawned process: cannot pickle '_thread.lock' object"
    with pytest.raises(TypeError, match=re.escape(cannot)):
        rl.train(config, mode="hogwild", callbacks=[HoldsALock()])
    assert not multiprocessing.active_children()
    assert not list((tmp_path / "logs" / "hogwild_logs").iterdir())  # checked writable at the start, and empty


class SharesWithTheCaller(rl.Callback):
    def __init__(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.queue, self.stop, self.count = spawn.Queue(), spawn.Event(), spawn.Value("i", 0)
        self.tensor = torch.zeros(3).share_memory_()


def test_checking_callbacks_for_the_workers_takes_their_queues_and_shared_tensors_and_holds_no_descriptor_open():
    """The check pickles them as sending them would, but shares nothing: a queue pickles only while a process is
    being spawned, and a shared tensor's file descriptor would stay open for a worker that never takes it."""
    callback = SharesWithTheCaller()
    descriptors = len(os.listdir("/proc/self/fd"))
    ByValue([callback], "the callbacks").check()
    assert len(os.listdir("/proc/self/fd")) == descriptors
    assert multiprocessing.context.get_spawning_popen() is None


def test_a_script_that_trains_outside_a_main_guard_is_told_to_add_one_and_its_workers_train_no_run_of_their_own(
    tmp_path,
):
    """A spawned worker runs the starting script again: a call outside the guard would start a run in it."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import rl\n"
        'config = rl.preset("cartpole", total_timesteps=2048, num_steps=64, eval_episodes=0, progress_bar=False)\n'
        'rl.train(config, mode="hogwild")\n'
    )
    finished = run_python([str(script)], tmp_path)
    assert finished.returncode == 1
    assert 'put the script\'s training under `if __name__ == "__main__":`' in finished.stderr
    assert "hogwild worker 0 ended with exit code 1" in finished.stderr
    assert "training loop" not in finished.stdout


@pytest.mark.parametrize(
    ("stop", "returncode"),
    [(signal.SIGINT, 0), pytest.param(signal.SIGTERM, -signal.SIGTERM, marks=pytest.mark.slow)],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_and_sigterm_checkpoint_every_worker_and_stop(tmp_path, stop, returncode):
    job = long_run(tmp_path, "synced")  # synced: the checkpoint merges every copy first
    try:
        worker_pids(job)
        wait_for_checkpoint(tmp_path, job)
        os.killpg(job.pid, stop)  # what a terminal's Ctrl-C or scancel does: the whole process group
        stdout, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == returncode, stderr[-3000:]
    assert not [line for line in stderr.splitlines() if line.startswith("error: ")], stderr[-3000:]
    match = re.search(r"interrupted at step (\d+): checkpoint written", stdout)
    assert match, stdout
    assert f"training loop: {match.group(1)} steps in" in stdout
    folder = run_dir(tmp_path, "hogwild")
    state = torch.load(folder / "checkpoints" / f"step_{int(match.group(1)):012d}.ckpt", weights_only=True)
    assert len(state["workers"]) == 2 and sum(worker["frames"] for worker in state["workers"]) == int(match.group(1))
    assert not (folder / "agent.ckpt").exists()


BAD_HOGWILD_INPUTS = [
    (["--workers", "0"], "--workers"),
    (["--sync", "sometimes"], "--sync"),
    (["--share-data"], "--share-data"),
    (["--pipeline"], "--pipeline"),
    (["--sync-every", "4"], "--sync-every"),  # it sets synced merges: shared workers would ignore it
]


@pytest.mark.parametrize(("args", "flag"), BAD_HOGWILD_INPUTS, ids=[flag for _, flag in BAD_HOGWILD_INPUTS])
def test_bad_input_ends_with_one_line_naming_the_flag(tmp_path, args, flag):
    assert refusal_line("hogwild", args, tmp_path).startswith(f"error: {flag}: ")


def test_a_run_shorter_than_one_rollout_is_refused_counting_the_workers_asked_for(tmp_path):
    line = refusal_line("hogwild", ["--workers", "3", "--total-timesteps", "100"], tmp_path)
    assert line.endswith(": 100 is smaller than one global rollout (3 workers x 2 envs x 128 steps = 768)"), line


@pytest.mark.slow
def test_hogwild_started_as_several_processes_of_a_launcher_is_refused_not_run_once_in_each(tmp_path):
    finished = launch("fabric run", SCRIPTS["hogwild"], ["--workers", "2"], tmp_path, nproc=2, timeout=120)
    assert finished.returncode != 0
    lines = {line for line in finished.stderr.splitlines() if line.startswith("error: ")}
    assert lines == {
        "error: --devices: Hogwild starts its workers itself (--workers N); a launcher's 2 processes would each "
        "train a run of their own: run python train_hogwild.py alone"
    }
    assert not (tmp_path / "logs").exists()


def test_bad_input_ends_a_launched_hogwild_run_with_one_line(tmp_path):
    finished = launch("python", SCRIPTS["hogwild"], ["--workers", "0"], tmp_path, timeout=60)
    assert finished.returncode == 2
    (line,) = [line for line in finished.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith("error: --workers: ") and "Traceback" not in finished.stderr
    assert not (tmp_path / "logs").exists()


def test_hogwild_flags_are_refused_in_the_other_modes(tmp_path):
    line = refusal_line("fabric", ["--workers", "2"], tmp_path)
    assert line == "error: --workers: belongs to Hogwild mode: python train_hogwild.py ..."


def test_the_closing_line_gives_the_peak_memory_of_many_workers_as_a_range():
    assert summary_line(512, 2.0, [412.4, 398.0]).endswith("peak RSS per rank (MB): 412, 398")
    many = summary_line(512, 2.0, [400.0 + worker for worker in range(64)])  # 64 numbers made the line unreadable
    assert many.endswith("peak RSS per rank (MB): 400 to 463 over 64 ranks")
