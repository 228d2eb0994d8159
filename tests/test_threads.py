"""A CNN's rank takes its share of the cores, whichever launcher started it, an MLP's one thread, and their
threads do not spin on the cores."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, child_env

import rl
from rl.evaluate import main as evaluate_main
from rl.modes.hogwild import worker_threads
from rl.runtime import configure_torch_threads


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("local_ranks", [1, 2, 64])
def test_a_cnn_takes_the_cores_divided_by_the_local_ranks(monkeypatch, local_ranks):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    cores = len(os.sched_getaffinity(0))
    expected = max(1, cores // local_ranks)
    assert configure_torch_threads(0, cnn=True) == expected
    assert torch.get_num_threads() == expected


def test_a_cnn_in_a_plain_script_uses_every_core(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert configure_torch_threads(0, cnn=True) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("local_ranks", [None, "1", "2"])
def test_an_mlp_takes_one_thread_however_many_cores(monkeypatch, local_ranks):
    """Its ops are too small to share out: more threads only wake up, or spin, between them."""
    torch.set_num_threads(len(os.sched_getaffinity(0)) + 1)
    if local_ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
    assert configure_torch_threads(0, cnn=False) == 1
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("cnn", [False, True])
def test_torch_threads_given_are_taken_for_any_network(cnn):
    assert configure_torch_threads(3, cnn) == 3
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("local_ranks", [1, 2])
def test_more_threads_than_the_cores_hold_are_taken_with_a_warning(monkeypatch, capfd, local_ranks):
    """Threads past the cores wait on each other: 2 processes of 2 threads ran at 0.7x of 1 thread on 2 cores."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // local_ranks)
    assert configure_torch_threads(share) == share
    assert capfd.readouterr().err == ""
    assert configure_torch_threads(share + 1) == share + 1
    assert capfd.readouterr().err == (
        f"warning: --torch-threads {share + 1} x {local_ranks} process{'es' if local_ranks > 1 else ''} here is more "
        f"threads than this machine's {cores} cores: they wait on each other and slow training\n"
    )
    monkeypatch.setenv("LOCAL_RANK", "1")  # once per machine
    configure_torch_threads(share + 1)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(("workers", "cnn", "requested"), [(1, False, 0), (1, True, 0), (2, True, 0), (1, False, 64)])
def test_hogwild_workers_take_their_networks_threads_within_the_cores(workers, cnn, requested):
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // workers)
    expected = min(requested, share) if requested else (share if cnn else 1)
    assert worker_threads(rl.PPOConfig(workers=workers, torch_threads=requested), cnn) == expected


class ThreadsSeen(rl.Callback):
    def __init__(self) -> None:
        self.threads: set[int] = set()

    def on_iteration_start(self, state: rl.LoopState) -> None:
        self.threads.add(torch.get_num_threads())


@pytest.mark.parametrize(
    ("env", "cnn"),
    [({}, False), ({"env_id": "rl/PixelCartPole-v1", "resize": 0, "frame_stack": 2}, True)],
    ids=["mlp", "cnn"],
)
def test_a_run_trains_and_evaluates_with_its_networks_thread_count(tmp_path, monkeypatch, env, cnn):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    torch.set_num_threads(len(os.sched_getaffinity(0)) + 1)  # neither default: the run must set its own
    seen = ThreadsSeen()
    quick = {"num_envs": 2, "num_steps": 32, "total_timesteps": 128, "eval_episodes": 0, "progress_bar": False}
    result = rl.train(rl.PPOConfig(log_dir=str(tmp_path), **quick, **env), callbacks=[seen])
    expected = len(os.sched_getaffinity(0)) if cnn else 1
    assert seen.threads == {expected}
    torch.set_num_threads(expected + 1)
    evaluate_main([result.agent_path, "--episodes", "1"])  # evaluating it takes the same count
    assert torch.get_num_threads() == expected


GNU_OPENMP = any(Path(torch.__file__).parent.glob("lib/libgomp*"))


@pytest.mark.skipif(not GNU_OPENMP, reason="this torch does not load GNU OpenMP, whose settings the test reads")
@pytest.mark.parametrize(
    ("chosen", "spin_count"),
    [({}, "0"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"), ({"GOMP_SPINCOUNT": "300000"}, "300000")],
    ids=["unset", "active", "spin-count"],
)
def test_openmp_threads_sleep_while_they_wait_unless_the_user_chose_a_wait(tmp_path, chosen, spin_count):
    """A spinning thread holds a core that other processes need: an entry point starts torch with sleeping ones."""
    inherited = {k: v for k, v in child_env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env = inherited | chosen | {"OMP_DISPLAY_ENV": "VERBOSE"}  # OpenMP prints its settings as it loads
    done = subprocess.run(
        [sys.executable, str(SCRIPTS["fabric"]), "--env-id", "NoSuchEnv-v0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"GOMP_SPINCOUNT = '{spin_count}'" in done.stderr, done.stderr[-2000:]
