"""`--env-groups`: a rank's envs in groups whose steps overlap, each group collecting in a thread of its own."""

import dataclasses
import itertools
import subprocess
import sys
import threading

import envs_for_tests
import pytest
import torch
from conftest import SCRIPTS, child_env, run_dir

import rl
from rl.algos.ppo.algorithm import PPO
from rl.checkpoint import load_checkpoint
from rl.envs import inspect_env
from rl.experience import ExperienceSource

QUICK = {"update_epochs": 2, "num_steps": 32, "eval_episodes": 0, "progress_bar": False}


def trained_policy(run_dir: str) -> dict[str, torch.Tensor]:
    return load_checkpoint(f"{run_dir}/agent.ckpt").policy


def test_the_groups_envs_step_at_the_same_time_in_threads_of_their_own(tmp_path):
    envs_for_tests.STEPS_TIMED.clear()
    timed = {"env_id": "envs_for_tests:TimedCartPole-v0", "env_kwargs": {"seconds": 0.005}}
    config = rl.PPOConfig(num_envs=4, env_groups=2, total_timesteps=512, log_dir=str(tmp_path), **QUICK, **timed)
    rl.train(config)
    by_thread: dict[int, list[tuple[float, float]]] = {}
    for thread, start, end in envs_for_tests.STEPS_TIMED:
        by_thread.setdefault(thread, []).append((start, end))
    # The first rollout's groups take turns in this thread (CUDA graphs are captured there); later rollouts' groups
    # collect in two threads of their own, whose env steps overlap.
    assert len(by_thread.pop(threading.main_thread().ident)) >= 128  # and the steps that checked the env's API
    assert len(by_thread) == 2
    first, second = by_thread.values()
    overlaps = sum(a < d and c < b for (a, b), (c, d) in itertools.product(first, second))
    assert overlaps >= len(first) // 2, f"{overlaps} of {len(first)} steps overlapped"


@pytest.mark.parametrize("recurrent", [False, True], ids=["mlp", "recurrent"])
def test_a_run_of_env_groups_is_reproducible_and_resumes_as_if_uninterrupted(tmp_path, recurrent):
    config = rl.PPOConfig(num_envs=4, env_groups=2, recurrent=recurrent, total_timesteps=1024, seed=3, **QUICK)
    full = rl.train(dataclasses.replace(config, log_dir=str(tmp_path / "full")))
    again = rl.train(dataclasses.replace(config, log_dir=str(tmp_path / "again")))
    half = rl.train(dataclasses.replace(config, total_timesteps=512, log_dir=str(tmp_path / "half")))
    resumed = rl.train(dataclasses.replace(config, resume_from=half.checkpoint_path, log_dir=str(tmp_path / "half")))
    weights = trained_policy(full.run_dir)
    for other in (again, resumed):
        assert all(torch.equal(weights[name], tensor) for name, tensor in trained_policy(other.run_dir).items())


@pytest.mark.parametrize("groups", [1, 2])
def test_the_source_of_envs_in_groups_or_not_has_all_that_a_mode_asks_of_one(groups):
    config = rl.PPOConfig(num_envs=4, env_groups=groups, num_steps=8)
    source = PPO(config, inspect_env(config.env_id)).make_source(0, torch.device("cpu"), None, 1, batch_rows=32)
    try:
        assert isinstance(source, ExperienceSource)
    finally:
        source.close()


def test_groups_that_split_the_envs_unevenly_are_refused_naming_the_flag():
    refusal = r"^env_groups \(--env-groups\): --num-envs 6 cannot be split into 4 equal groups$"
    with pytest.raises(rl.UsageError, match=refusal):
        rl.train(rl.PPOConfig(num_envs=6, env_groups=4))


def test_an_env_that_raises_in_a_groups_thread_stops_the_run_with_its_line_and_keeps_the_checkpoints(tmp_path):
    # 4 envs in 2 groups, 64 steps a rollout: every env's 300th step falls in the fifth rollout, collected in threads.
    args = ["--env-id", "envs_for_tests:Misbehaves-v0", "--num-envs", "4", "--env-groups", "2", "--num-steps", "64"]
    args += ["--update-epochs", "2", "--total-timesteps", "4096", "--checkpoint-every", "512", "--eval-episodes", "0"]
    done = subprocess.run(
        [sys.executable, str(SCRIPTS["fabric"]), *args, "--no-progress-bar"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --env-id: the env's step raised RuntimeError: lost contact with the simulator; the run stopped, "
        "and the checkpoints written so far are kept"
    )
    checkpoints = sorted(path.name for path in (run_dir(tmp_path, "fabric") / "checkpoints").iterdir())
    assert checkpoints == ["step_000000000512.ckpt", "step_000000001024.ckpt"]
