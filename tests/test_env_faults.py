"""An env that raises, or returns a NaN or infinite value, in the middle of a run stops it with one line naming the
env's call and what it did; one that raised shows its own frames above that line (the vector env's are left out)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import multiprocessing
import os
import re
import select
import signal
import subprocess
import sys
import time
import traceback
import warnings

import envs_for_tests
import gymnasium as gym
import numpy as np
import pytest
from conftest import (
    SCRIPTS,
    child_env,
    child_pids,
    kill_outright,
    kill_process_group,
    launch_command,
    run_dir,
    start,
    start_as_foreground_job,
)

import rl
import rl.env_faults
import rl.envs
import rl.faults
import rl.signals
from rl import gil_watch
from rl.env_faults import ENV_STEP, INSTALLED, is_env_code, traceback_frames
from rl.envs import make_vector_env
from rl.gil_watch import envs_step_here, watching_env_calls

MISBEHAVES = ["--env-id", "envs_for_tests:Misbehaves-v0"]
# One env, 64 steps an iteration: its 300th step falls in the iteration after the checkpoint at step 256.
QUICK = ["--num-envs", "1", "--num-steps", "64", "--per-rank-batch-size", "32", "--update-epochs", "2"]
QUICK += ["--total-timesteps", "1024", "--eval-episodes", "0", "--no-progress-bar"]
RAISED = (
    "error: --env-id: the env's step raised RuntimeError: lost contact with the simulator; the run stopped, "
    "and the checkpoints written so far are kept"
)


def run(command: list[str], cwd, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = child_env() | (extra_env or {})
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_an_env_that_raises_shows_its_frames_then_one_line_and_keeps_the_checkpoints(tmp_path):
    done = run(
        launch_command("python", SCRIPTS["fabric"], [*MISBEHAVES, *QUICK, "--checkpoint-every", "128"], 1), tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == RAISED
    frames = lines[lines.index("the env raised in these frames:") + 1 : -1]
    # From the env's step down to where it raised: none of the vector env's or this project's frames (Python 3.13
    # adds a line of carets under a call).
    functions = [line.rsplit(", in ", 1)[1] for line in frames if line.startswith('  File "')]
    assert functions == ["step", "lose_contact"], frames
    assert "envs_for_tests.py" in frames[0], frames
    assert frames[-1].strip().startswith('raise RuntimeError("lost contact'), frames
    checkpoints = sorted(path.name for path in (run_dir(tmp_path, "fabric") / "checkpoints").iterdir())
    assert checkpoints == ["step_000000000128.ckpt", "step_000000000256.ckpt"]


def misbehaving(tmp_path, fault: str, env: str = "Misbehaves-v0", after: int = 45, **overrides) -> rl.PPOConfig:
    """A short run of `env` whose `fault` comes at its `after`th step: mid-episode by default (episodes last 20
    steps)."""
    fields = {"num_envs": 2, "num_steps": 32, "total_timesteps": 512, "eval_episodes": 0, "progress_bar": False}
    fields |= {"log_dir": str(tmp_path / "logs")} | overrides
    return rl.PPOConfig(env_id=f"envs_for_tests:{env}", env_kwargs={"after": after, "fault": fault}, **fields)


@pytest.mark.parametrize(
    ("env", "fault", "what"),
    [
        ("Misbehaves-v0", "nan_observation", "nan in an observation (env 0)"),
        ("Misbehaves-v0", "inf_reward", "inf in a reward (env 0)"),
        ("Misbehaves-v0", "none_reward", "nan in a reward (env 0; or None, which the vector env stores as nan)"),
        # Gymnasium's vector envs put an episode's last observation in `info` (a reset's follows it).
        ("Misbehaves-v0", "nan_last_observation", "nan in an episode's last observation (env 0)"),
        # A Dict with an image travels as bytes: its vectors are read back to be checked.
        ("MisbehavesWithImage-v0", "nan_observation", "nan in an observation's 'state' (env 0)"),
    ],
)
def test_a_non_finite_value_from_the_env_is_named_before_it_reaches_the_learner(tmp_path, env, fault, what):
    with pytest.raises(rl.RunStopped) as stopped:
        rl.train(misbehaving(tmp_path, fault, env))
    assert str(stopped.value) == (
        f"--env-id: the env's step returned {what}; the run stopped, and the checkpoints written so far are kept"
    )


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
def test_an_env_that_raises_is_named_in_one_line_under_its_own_frames_wherever_it_steps(tmp_path, vector_mode):
    """An async env raises in its worker's process: the run names it as where it steps in the training process,
    with the env's frames from the worker's traceback, and gymnasium's log of that traceback says nothing."""
    with warnings.catch_warnings(record=True) as shown, pytest.raises(rl.RunStopped) as stopped:
        warnings.simplefilter("always")
        rl.train(misbehaving(tmp_path, "raise", vector_mode=vector_mode))
    assert f"error: {stopped.value}" == RAISED
    frames = stopped.value.context.splitlines()
    assert frames[0] == "the env raised in these frames:", frames
    functions = [line.rsplit(", in ", 1)[1] for line in frames if line.startswith('  File "')]
    assert functions == ["step", "lose_contact"], frames
    assert not [warning for warning in shown if "ERROR" in str(warning.message)]


def test_an_observation_that_an_async_envs_worker_cannot_store_is_named_as_what_the_env_returned(tmp_path):
    with pytest.raises(rl.RunStopped) as stopped:
        rl.train(misbehaving(tmp_path, "wrong_shape", vector_mode="async"))
    assert str(stopped.value) == (
        "--env-id: the env's step returned an observation its space does not hold (storing it raised ValueError: "
        "could not broadcast input array from shape (4,) into shape (3,)); the run stopped, and the checkpoints "
        "written so far are kept"
    )
    assert stopped.value.context == ""


def test_a_workers_traceback_is_read_back_as_its_last_exceptions_frames():
    def fails() -> None:
        try:
            {}["key"]
        except KeyError:
            raise RuntimeError("while handling it") from None

    try:
        fails()
    except RuntimeError:
        trace = traceback.format_exc()
    chained = "Traceback (most recent call last):\n  File \"elsewhere.py\", line 1, in earlier\nKeyError: 'x'\n\n"
    chained += "During handling of the above exception, another exception occurred:\n\n"
    for text in (trace, chained + trace):
        frames = traceback_frames(text)
        assert [os.path.basename(filename) for filename, _ in frames] == ["test_env_faults.py"] * 2
        assert frames[0][1].splitlines()[1].strip() == "fails()"
        assert frames[1][1].splitlines()[1].strip() == 'raise RuntimeError("while handling it") from None'


def test_an_observation_its_space_does_not_hold_is_named_as_what_the_env_returned_not_as_an_error_it_raised(tmp_path):
    """The vector env fails to batch it, in gymnasium's frames alone: the env returned it, and raised nothing."""
    with pytest.raises(rl.RunStopped) as stopped:
        rl.train(misbehaving(tmp_path, "wrong_shape"))
    assert str(stopped.value) == (
        "--env-id: the env's step returned an observation its space does not hold (batching it raised ValueError: "
        "Output array is the wrong shape); the run stopped, and the checkpoints written so far are kept"
    )
    assert stopped.value.context == ""  # no frames of the env's to show


def numpy_stores_a_one_value_array_as_a_number() -> bool:
    """Whether numpy puts an array of one value where a number goes, as gymnasium's sync vector env stores each
    env's reward: numpy 2.2 (Python 3.10's) does, with a DeprecationWarning; numpy 2.4 refuses."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            np.zeros(1)[0] = np.ones(1)
        except (TypeError, ValueError):
            return False
    return True


ONE_VALUE_REWARD_STORED = numpy_stores_a_one_value_array_as_a_number()


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
@pytest.mark.parametrize("fault", ["reward_array", "terminated_array", "terminated_pair"])
def test_a_reward_or_flag_given_as_an_array_is_taken_or_named_alike_in_sync_and_async_envs(
    tmp_path, fault, vector_mode
):
    """Where numpy puts an array of one value where one value goes (a flag; a reward, on numpy 2.2), the run takes
    it, as gymnasium's sync vector env stores it; otherwise the run stops naming what the env returned."""
    after = 45 if fault == "terminated_pair" else 1  # the run's first look at the env would refuse a pair
    config = misbehaving(tmp_path, fault, after=after, vector_mode=vector_mode, eval_episodes=2)
    with warnings.catch_warnings():  # gymnasium's env checker warns of the type at the first step
        warnings.simplefilter("ignore")
        if fault == "terminated_array" or (fault == "reward_array" and ONE_VALUE_REWARD_STORED):
            result = rl.train(config)
            episode_length = 10 if fault == "terminated_array" else 20  # the flag's one value ends the episodes
            assert result.evaluation["Test/length_mean"] == episode_length, result.evaluation
            return
        with pytest.raises(rl.RunStopped) as stopped:
            rl.train(config)
    what = "a reward that is not one number" if fault == "reward_array" else "a terminated flag that is not one bool"
    how = {
        "sync": "storing it raised ValueError: setting an array element with a sequence",
        "async": f"of shape ({1 if fault == 'reward_array' else 2},) in each env",
    }[vector_mode]
    if fault == "terminated_pair" and vector_mode == "async":  # its worker tests both flags before it returns them
        what, how = "a terminated or truncated flag that is not one bool", "testing it raised ValueError: The truth"
    assert str(stopped.value).startswith(f"--env-id: the env's step returned {what} ({how}"), str(stopped.value)
    assert stopped.value.context == ""


def test_a_flag_of_more_than_one_value_at_the_first_step_is_named_by_the_env_check(tmp_path):
    with pytest.raises(rl.UsageError) as refused:
        rl.train(misbehaving(tmp_path, "terminated_pair", after=1))
    assert str(refused.value).startswith(
        "env_id (--env-id): envs_for_tests:Misbehaves-v0 breaks the gymnasium API: step() returned a terminated or "
        "truncated flag that is not one bool (testing it raised ValueError: The truth value"
    ), str(refused.value)


@pytest.mark.parametrize(
    ("fault", "warned"),
    [("reward_array", int(ONE_VALUE_REWARD_STORED)), ("wrong_shape", 0), ("outside_the_space", 1), ("none_reward", 1)],
)
def test_the_env_checkers_warnings_at_the_first_step_are_shown_once_unless_that_step_stops_the_run(
    tmp_path, monkeypatch, fault, warned
):
    """A fault at the env's first step stops the run in one line: gymnasium's checker, which warns of the value
    that step returned, says nothing above it. A value the run takes is warned of once, as gymnasium does; so is
    a None reward, which the run then finds stored as nan: the warning names what the env returned."""
    monkeypatch.setattr(rl.env_faults, "SHOWN_WARNINGS", set())  # as in a process that has not shown it yet
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # each warning once where it is raised, as Python shows them
        with contextlib.suppress(rl.RunStopped):
            rl.train(misbehaving(tmp_path, fault, after=1, eval_episodes=2))
    checker = [str(each.message) for each in shown if "passive_env_checker" in each.filename]
    assert len(checker) == warned, checker


@pytest.mark.parametrize(("fault", "warned"), [("wrong_shape", False), ("outside_the_space", True)])
def test_async_envs_show_the_checkers_warnings_of_a_first_step_only_where_the_run_takes_it(tmp_path, fault, warned):
    """An async env's worker holds the warnings of its env's first calls, which the training process fetches once it
    has taken what the call returned: a first step that stops the run is told in one line, and a warning that each
    worker raised is shown once, as where the training process steps its envs."""
    faulty = {"after": 1, "fault": fault}
    shape = ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "128", "--vector-mode", "async"]
    args = [*MISBEHAVES, "--env-kwargs", json.dumps(faulty), *shape, "--eval-episodes", "0", "--no-progress-bar"]
    done = run(launch_command("python", SCRIPTS["fabric"], args, 1), tmp_path)
    assert done.returncode == (0 if warned else 1), done.stderr
    assert done.stderr.count("WARN: The obs returned by the `step()` method is not within") == int(warned), done.stderr
    if not warned:
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error: --env-id: the env's step returned an observation its space does not hold"), line


@pytest.mark.parametrize(
    ("launcher", "ranks", "flags"),
    [("python", 1, ["--vector-mode", "async"]), ("fabric run", 2, ["--share-data", "--eval-every", "256"])],
)
def test_an_envs_warning_at_every_step_is_shown_once_a_process(tmp_path, launcher, ranks, flags):
    """As Python shows a warning: an async env's workers' first, fetched and shown here, counts as this process's,
    whose evaluation env warns it again; and a gather of every rank's batch (`--share-data`) each iteration leaves
    what Python has shown as it was."""
    faulty = {"after": 1, "fault": "warn"}
    shape = ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "1024", *flags]
    args = [*MISBEHAVES, "--env-kwargs", json.dumps(faulty), *shape, "--eval-episodes", "1", "--no-progress-bar"]
    done = run(launch_command(launcher, SCRIPTS["fabric"], args, ranks), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("UserWarning: the simulator's clock drifts") == ranks, done.stderr


def test_frames_of_pythons_own_modules_and_of_the_plumbing_are_not_the_envs_but_an_installed_packages_are():
    assert not is_env_code(functools.__file__)  # gymnasium dispatches on a space's type through it
    assert not is_env_code(gym.vector.utils.__file__) and not is_env_code(rl.__file__)
    assert is_env_code(gym.envs.classic_control.cartpole.__file__)
    assert is_env_code(envs_for_tests.__file__)
    assert is_env_code(os.path.join(INSTALLED[0], "some_package", "env.py"))


def test_an_async_env_whose_process_dies_is_named_with_how_and_the_other_workers_are_stopped(tmp_path, monkeypatch):
    # What a crash in an env's native code, or the out-of-memory killer, does to an async env's worker.
    monkeypatch.setenv("DIE_MARKER", str(tmp_path / "died"))
    with pytest.raises(rl.RunStopped) as stopped:
        rl.train(misbehaving(tmp_path, "die_once", num_envs=3, vector_mode="async"))
    assert re.fullmatch(
        r"--env-id: the env's process \(env \d\) was killed by SIGKILL during a step; the run stopped, and the "
        r"checkpoints written so far are kept",
        str(stopped.value),
    ), stopped.value
    assert not multiprocessing.active_children()  # the two workers still running were stopped, not left behind


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
def test_an_env_whose_close_raises_after_training_is_named_and_the_run_keeps_its_result(tmp_path, capfd, vector_mode):
    """Named once, under the env's frames, wherever the envs step: an async env's workers close their envs as the
    training process asks, and report it, where each would print its own traceback."""
    result = rl.train(misbehaving(tmp_path, "raise_on_close", total_timesteps=128, vector_mode=vector_mode))
    assert os.path.isfile(result.agent_path)
    err = capfd.readouterr().err  # a worker's too: it writes to the same file
    lines = err.splitlines()
    warned = "warning: --env-id: the env's close raised RuntimeError: lost contact with the simulator; the run goes on"
    assert lines.count(warned) == 1, err
    assert lines.count("the env raised in these frames:") == 1, err
    assert "Traceback" not in err


TRAINER_LOST_THE_PLAYER = re.compile(r"(error: trainer \d): (?:stopped by the launcher because it )?lost the player")


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    ["fabric run", "decoupled", "hogwild"],
)
def test_every_process_ends_and_names_what_happened(tmp_path, mode):
    if mode == "hogwild":
        command = launch_command("python", SCRIPTS["hogwild"], [*MISBEHAVES, *QUICK, "--workers", "2"], 1)
    else:
        script = SCRIPTS["decoupled" if mode == "decoupled" else "fabric"]
        command = launch_command("fabric run", script, [*MISBEHAVES, *QUICK], 3 if mode == "decoupled" else 2)
    done = run(command, tmp_path)
    assert done.returncode != 0
    lines = error_lines(done.stderr)
    if mode == "fabric run":  # both ranks' envs step alike: each raises and says so
        assert lines == [RAISED, RAISED], done.stderr
    elif mode == "decoupled":
        assert lines[0] == RAISED, done.stderr
        # Each trainer sees the player's process end, or the launcher stops it first, after which it says so;
        # either may also name the other trainer's process.
        lost = [TRAINER_LOST_THE_PLAYER.match(line) for line in lines[1:]]
        assert all(lost), done.stderr
        assert sorted(match[1] for match in lost) == ["error: trainer 1", "error: trainer 2"], done.stderr
    else:
        assert (
            RAISED.replace("error: ", "error: hogwild worker 0: ") in lines
            or RAISED.replace("error: ", "error: hogwild worker 1: ") in lines
        ), done.stderr
        assert lines[-1].endswith(
            "the checkpoints written so far are in logs/hogwild_logs/" + run_dir(tmp_path, "hogwild").name
        )
    ours = done.stderr.split("torch/distributed/elastic")[0]  # the launcher's own report follows
    assert "Traceback" not in ours, done.stderr


def hangs(on_rank: int | None = None, fault: str = "hang") -> list[str]:
    """Flags of a run whose env's 100th step never returns (in the process of `on_rank` only, where given)."""
    kwargs = f'{{"after": 100, "fault": "{fault}", "on_rank": {"null" if on_rank is None else on_rank}}}'
    return [*MISBEHAVES, "--env-kwargs", kwargs, *QUICK]


@pytest.mark.slow
def test_a_run_stopped_while_its_env_step_hangs_names_the_step_and_how_long_it_ran(tmp_path):
    # The stop from outside (a kill, scancel) is the only end such a run has: its line names what held it.
    marker = tmp_path / "hanging"
    command = launch_command("python", SCRIPTS["fabric"], [*hangs(), "--collective-timeout", "2"], 1)
    env = child_env() | {"HANG_MARKER": str(marker)}
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.1)
    time.sleep(1.5)  # past half the collective timeout, from which an env call counts as stalled
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=60)
    assert job.returncode == 1
    assert re.fullmatch(
        r"error: rank 0: the env's step had not returned after \d+ s; stopped by SIGTERM \(a kill, scancel or "
        r"shutdown\); its checkpoints are kept",
        stderr.strip().splitlines()[-1],
    ), stderr[-3000:]


@pytest.mark.parametrize("env_steps", ["hang", "go on"])
def test_async_env_workers_end_with_a_training_process_killed_outright(tmp_path, env_steps):
    # SIGKILL (kill -9, the out-of-memory killer) gives the training process no time to stop its envs' workers: they
    # end with it, quietly, instead of running on in a hung step or printing the tracebacks of their lost pipes.
    marker = tmp_path / "hanging"
    env_kwargs = '{"after": 100, "fault": "hang"}' if env_steps == "hang" else '{"after": 1000000, "fault": "hang"}'
    args = [*MISBEHAVES, "--env-kwargs", env_kwargs, *QUICK, "--num-envs", "2", "--vector-mode", "async"]
    args += ["--total-timesteps", "1000000", "--checkpoint-every", "256"]
    job = start("python", SCRIPTS["fabric"], args, tmp_path, 1, {"HANG_MARKER": str(marker)}, subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (marker.exists() or list(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt"))):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.1)
        workers = child_pids(job.pid)
        stderr, left = kill_outright(job, workers)
    finally:
        kill_process_group(job)
    assert len(workers) == 2
    assert not left
    assert "Traceback" not in stderr, stderr[-3000:]


def test_async_env_workers_are_forks_of_the_training_process_whatever_pythons_default_start_method():
    # Python 3.14 made forkserver Linux's default: its workers would be the server's children, not this process's.
    default = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        envs = make_vector_env("CartPole-v1", 2, mode="async")
    finally:
        multiprocessing.set_start_method(default, force=True)
    try:
        workers = [process.pid for process in envs.unwrapped.processes]
        assert set(workers) <= set(child_pids(os.getpid()))
    finally:
        envs.close()


NATIVE_WAIT = (
    r"its main thread is held in envs_for_tests\.wait_forever_holding_the_gil \(line \d+\), from "
    r"rl\.[a-z_.]+ \(line \d+\), where no signal is handled"
)
TWICE = "interrupted (Ctrl-C) twice during training"
STOPPED_AT_ONCE = "stopped at once, and the checkpoints written before are kept"


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hang", "hang_in_native_code"])
def test_a_second_ctrl_c_stops_a_run_whose_env_step_hangs_at_once(tmp_path, fault):
    # The first asks for a checkpoint at the end of the iteration, which a step that never returns cannot reach. Where
    # the step waits in native code no handler runs, and neither Ctrl-C would do anything: a thread takes them.
    marker = tmp_path / "hanging"
    command = launch_command("python", SCRIPTS["fabric"], hangs(fault=fault), 1)
    job = start_as_foreground_job(command, tmp_path, child_env() | {"HANG_MARKER": str(marker)})
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.1)
        os.killpg(job.pid, signal.SIGINT)
        time.sleep(rl.signals.HANDLER_GRACE_SECONDS + 1.0)
        assert job.poll() is None  # waiting for the step, to checkpoint after it; or told that it cannot
        os.killpg(job.pid, signal.SIGINT)
        _, stderr = job.communicate(timeout=60)
    finally:
        kill_process_group(job)
    assert job.returncode == 130, stderr[-3000:]
    told, ended = stderr.strip().splitlines()[-2:]
    if fault == "hang":
        assert told == "Ctrl-C: checkpointing, then stopping (Ctrl-C again stops at once, without it)", stderr[-3000:]
        assert ended == f"{TWICE}: {STOPPED_AT_ONCE}", stderr[-3000:]
    else:
        told_so = f"Ctrl-C: {NATIVE_WAIT}: Ctrl-C again stops at once, without a checkpoint"
        assert re.fullmatch(told_so, told), stderr[-3000:]
        assert re.fullmatch(rf"{re.escape(TWICE)}, as {NATIVE_WAIT}: {STOPPED_AT_ONCE}", ended), stderr[-3000:]


@pytest.mark.slow
def test_ctrl_c_to_a_launcher_whose_rank_hangs_in_its_env_step_ends_every_rank_at_once_with_its_line(tmp_path):
    # The launcher passes Ctrl-C on to every rank, and kills those left 30 s later without a word: a rank whose env
    # step never returns cannot reach its checkpoint, and the rank that waits for it has lost it.
    marker = tmp_path / "hanging"
    command = launch_command("fabric run", SCRIPTS["fabric"], hangs(on_rank=1), 2)
    env = child_env() | {"HANG_MARKER": str(marker)}
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ranks = []
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.1)
        ranks = child_pids(job.pid)
        time.sleep(rl.faults.STALLED_ENV_SECONDS + 0.5)  # from then on the step counts as stalled
        job.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        _, stderr = job.communicate(timeout=60)
        ended_after = time.monotonic() - signalled
    finally:
        kill_process_group(job)
        for rank in ranks:  # each in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
    assert ended_after < rl.signals.STOP_SECONDS, stderr[-3000:]  # not the launcher's kill, 30 s after Ctrl-C
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted (Ctrl-C): rank")]
    assert len(lines) == 2, stderr[-3000:]
    assert re.fullmatch(
        r"interrupted \(Ctrl-C\): rank 1: the env's step had not returned after \d+ s; stopped before its "
        r"checkpoint; the checkpoints written before are kept",
        lines[0],
    ), stderr[-3000:]
    assert lines[1].startswith("interrupted (Ctrl-C): rank 0 then lost rank 1: its process ended, "), stderr[-3000:]


def test_rl_evaluate_names_what_the_env_did(tmp_path):
    # It behaves while it trains; it misbehaves in the evaluation, after the env checker's steps.
    trained = run(
        launch_command(
            "python", SCRIPTS["fabric"], [*MISBEHAVES, "--env-kwargs", '{"after": 10, "fault": "as_asked"}', *QUICK], 1
        ),
        tmp_path,
    )
    assert trained.returncode == 0, trained.stderr
    agent = run_dir(tmp_path, "fabric") / "agent.ckpt"
    evaluate = [sys.executable, "-m", "rl.evaluate", str(agent), "--episodes", "2"]
    raised = run(evaluate, tmp_path, {"MISBEHAVE": "raise"})
    assert raised.returncode == 2
    assert raised.stderr.strip().splitlines()[-1] == (
        "error: --env-id: envs_for_tests:Misbehaves-v0's step raised RuntimeError: lost contact with the simulator"
    )
    assert "the env raised in these frames:" in raised.stderr
    # Not a score of nan: where it came from.
    returned_nan = run(evaluate, tmp_path, {"MISBEHAVE": "inf_reward"})
    assert returned_nan.returncode == 2 and returned_nan.stderr.strip() == (
        "error: --env-id: envs_for_tests:Misbehaves-v0's step returned inf in a reward (env 0)"
    )


def test_the_env_checker_tells_an_env_that_raises_from_one_that_breaks_a_rule(tmp_path):
    done = run(
        launch_command("python", SCRIPTS["fabric"], [*MISBEHAVES, "--env-kwargs", '{"after": 1}', *QUICK], 1),
        tmp_path,
    )
    assert done.returncode == 2
    assert error_lines(done.stderr) == [
        "error: --env-id: envs_for_tests:Misbehaves-v0's step raised RuntimeError: lost contact with the simulator"
    ]
    assert "breaks the gymnasium API" not in done.stderr
    assert not os.path.isdir(tmp_path / "logs")  # refused before the run began


def test_a_call_that_has_not_returned_is_found_while_another_threads_call_returns():
    """`--env-groups` step their envs in threads of their own: one group's call that returns leaves another's, still
    running, to be named."""
    import threading

    from rl.env_faults import ENV_STEP, stalled_env_call

    entered, release = threading.Event(), threading.Event()

    def hung_call() -> None:
        with ENV_STEP:
            entered.set()
            release.wait(10)

    hung = threading.Thread(target=hung_call)
    hung.start()
    try:
        entered.wait(10)
        with ENV_STEP:  # this thread's call, which returns
            pass
        time.sleep(0.2)
        assert stalled_env_call(0.1).startswith("the env's step had not returned after")
    finally:
        release.set()
        hung.join()
    assert stalled_env_call(0.0) == ""


def hold_the_gil(seconds: float) -> None:
    """Native code that keeps Python's interpreter lock for `seconds` (a call through ctypes.PyDLL keeps it)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def step_holding_the_gil(seconds: float) -> None:
    with ENV_STEP:
        hold_the_gil(seconds)


def test_an_env_call_that_holds_pythons_lock_is_named_from_outside_the_lock_and_a_hold_elsewhere_is_not(capfd):
    # No Python thread runs while the lock is held, so no handler or thread of this process can name the call.
    with watching_env_calls("rank 0", 1.5):
        envs_step_here()
        step_holding_the_gil(0.3)  # shorter than the watch's 1.5 s
        hold_the_gil(3.0)  # long, but in no env call: a checkpoint's load, say
        step_holding_the_gil(3.0)  # at once after it, with no moment for the watch to run between
        reporter = gil_watch._watch.reporter
    assert reporter.returncode == 0  # the watch ends with the role
    assert capfd.readouterr().err.splitlines() == [
        "warning: rank 0: an env call has held Python's interpreter lock for 1.5 s, in native code called from "
        f"{__file__}, line {hold_the_gil.__code__.co_firstlineno + 2}, in hold_the_gil: Ctrl-C and SIGTERM wait for "
        "it to return; kill -9 ends it"
    ]


def test_a_watch_that_cannot_start_leaves_the_run_as_it_was(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/no/such/python")  # gone from under a long run
    with watching_env_calls("rank 0", 1.0):
        envs_step_here()
        with ENV_STEP:
            pass
        assert gil_watch._watch is None


def test_a_run_whose_env_step_holds_pythons_lock_names_it_and_leaves_no_watcher_once_killed(tmp_path):
    marker = tmp_path / "hanging"
    kwargs = '{"after": 100, "fault": "hang_holding_the_gil"}'
    args = [*MISBEHAVES, "--env-kwargs", kwargs, *QUICK, "--collective-timeout", "4"]
    job = start("python", SCRIPTS["fabric"], args, tmp_path, 1, {"HANG_MARKER": str(marker)})
    try:
        line = ""  # the run prints nothing else before it
        if select.select([job.stderr], [], [], 60)[0]:
            line = job.stderr.readline()
        watcher = child_pids(job.pid)
        stderr, left = kill_outright(job, watcher)  # Ctrl-C and SIGTERM would wait for the step
    finally:
        kill_process_group(job)
    assert marker.exists()
    assert re.fullmatch(
        r"warning: rank 0: an env call has held Python's interpreter lock for 2 s, in native code called from "
        r".*envs_for_tests\.py, line \d+, in wait_forever_holding_the_gil: Ctrl-C and SIGTERM wait for it to "
        r"return; kill -9 ends it",
        line.strip(),
    ), line + stderr[-3000:]
    assert len(watcher) == 1 and not left


STEPS_FOR_7_SECONDS = """
import ctypes
from rl.env_faults import ENV_STEP
from rl.gil_watch import envs_step_here, watching_env_calls
with watching_env_calls("rank 0", 2.0):
    envs_step_here()
    with ENV_STEP:
        print("stepping", flush=True)
        for _ in range(70):  # a simulator's steps: 0.1 s each in native code that keeps the lock
            ctypes.PyDLL(None).usleep(100_000)
print("done", flush=True)
"""


def test_a_process_stopped_in_an_env_call_and_resumed_is_not_taken_for_one_holding_pythons_lock(tmp_path):
    # Ctrl-Z, a debugger, a machine too busy to run it: faulthandler's timer fires as soon as the process runs again,
    # before the thread that re-arms it can take the lock from the step that held it when it stopped.
    job = subprocess.Popen(
        [sys.executable, "-c", STEPS_FOR_7_SECONDS], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert job.stdout.readline() == b"stepping\n"
        job.send_signal(signal.SIGSTOP)
        time.sleep(4.5)  # past the watch's 2 s, and its timer's 0.5 s more
        job.send_signal(signal.SIGCONT)
        stdout, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
    assert (stdout, stderr) == (b"done\n", b"")
