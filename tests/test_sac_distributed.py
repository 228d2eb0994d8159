"""SAC across real processes over gloo: gradient sync, Fabric vs torchrun, decoupled roles, resume, bad input."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import (
    SCRIPTS,
    all_scalars,
    child_env,
    free_port,
    join_as_rank,
    launch,
    launch_together,
    load_agent,
    read_scalars,
    refusal_line,
    run_dir,
    run_ranks,
)
from test_sac import random_transitions

from rl.algos.sac.algorithm import SAC
from rl.algos.sac.config import SACConfig
from rl.batch import DataShard
from rl.envs import inspect_env
from rl.runtime import TorchRuntime

SAC_TAGS = {
    "Loss/critic_loss",
    "Loss/actor_loss",
    "Loss/alpha_loss",
    "Loss/entropy",
    "Info/q_values",
    "Info/alpha",
    "Info/replay_ratio",
    "Time/gradient_step_ms",
    "Time/steps_per_second",
    "Rewards/rew_avg",
    "Game/ep_len_avg",
    "Test/return_mean",
    "Perf/loop_steps_per_second",
}
# 2 ranks x 1 env: 600 steps per rank, learning from global step 400 on, a point logged every 400 steps.
SHORT = [
    "sac",
    "--total-timesteps",
    "1200",
    "--learning-starts",
    "400",
    "--batch-size",
    "64",
    "--log-every",
    "400",
    "--eval-episodes",
    "2",
    "--no-progress-bar",
]


class CountingRuntime(TorchRuntime):
    """The torchrun runtime, recording the size of every tensor it averages across ranks."""

    def __init__(self, cfg: SACConfig, world_size: int) -> None:
        super().__init__(cfg, world_size)
        self.averaged_sizes: list[int] = []

    def start_mean(self, tensor: torch.Tensor):
        self.averaged_sizes.append(tensor.numel())
        return super().start_mean(tensor)


def _sync_worker(rank: int, port: int, folder: str, actor_after_critics: bool = False) -> None:
    join_as_rank(rank, port)
    cfg = SACConfig(
        batch_size=16,
        gradient_steps=3,
        policy_frequency=1,
        tau=0.1,
        scale_lr=True,
        actor_after_critics=actor_after_critics,
    )
    algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
    runtime = CountingRuntime(cfg, 2)
    policy = algorithm.build_policy(runtime.device)
    learner = algorithm.make_learner(policy, runtime, DataShard(algorithm.batch_rows(1)), env_ranks=2)
    for iteration in range(1, 5):  # each rank trains on its own data, as coupled ranks do
        learner.update(random_transitions(algorithm.batch_rows(1), seed=10 * rank + iteration), iteration)
    state = {
        "actor": [p.detach().clone() for p in learner.policy.parameters()],
        "critic": [p.detach().clone() for p in learner.critic.parameters()],
        "critic_grad": [p.grad.clone() for p in learner.critic.parameters()],
        "target": [p.detach().clone() for p in learner.critic_target.parameters()],
        "log_alpha": learner.log_alpha.detach().clone(),
        "averaged_sizes": runtime.averaged_sizes,
        "gradient_size": learner.gradients.buffer.numel(),
        "critic_gradient_size": learner.gradients.span(learner.CRITIC, learner.CRITIC).numel(),
        "learning_rates": [
            optimizer.param_groups[0]["lr"]
            for optimizer in (learner.actor_optimizer, learner.critic_optimizer, learner.alpha_optimizer)
        ],
    }
    torch.save(state, os.path.join(folder, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def synced_states(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sync")
    mp.spawn(_sync_worker, args=(free_port(), str(folder)), nprocs=2, join=True)
    return [torch.load(folder / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


@pytest.mark.parametrize("part", ["actor", "critic", "target", "log_alpha"])
def test_weights_targets_and_temperature_stay_identical_on_every_rank(synced_states, part):
    first, second = (state[part] for state in synced_states)
    if part == "log_alpha":
        assert torch.equal(first, second) and first.item() != 0.0
    else:
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_one_collective_per_gradient_step_averages_every_gradient_and_none_is_left_local(synced_states):
    # 4 updates x 3 gradient steps: 12 collectives, each over the critics', the actor's and the temperature's.
    assert all(state["averaged_sizes"] == [state["gradient_size"]] * 12 for state in synced_states)
    # A local critic gradient (from the actor's loss, say) would differ between ranks, whose data differ;
    # what is left must be the averaged gradient of the last step, the same on both.
    first, second = (state["critic_grad"] for state in synced_states)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.slow
def test_with_the_actor_after_the_critics_each_gradient_step_averages_the_critics_then_the_actor(tmp_path):
    mp.spawn(_sync_worker, args=(free_port(), str(tmp_path), True), nprocs=2, join=True)
    states = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    for state in states:
        critics, everything = state["critic_gradient_size"], state["gradient_size"]
        assert state["averaged_sizes"] == [critics, everything - critics] * 12  # 4 updates x 3 gradient steps
    for part in ("actor", "critic", "target"):
        assert all(torch.equal(a, b) for a, b in zip(states[0][part], states[1][part], strict=True)), part
    assert torch.equal(states[0]["log_alpha"], states[1]["log_alpha"])


def test_scale_lr_multiplies_every_learning_rate_by_the_number_of_learners(synced_states):
    assert all(state["learning_rates"] == [2 * 3e-4, 2 * 1e-3, 2 * 1e-3] for state in synced_states)


@pytest.fixture(scope="module")
def fabric_and_torch_sac_runs(tmp_path_factory):
    folders = {mode: tmp_path_factory.mktemp(f"sac-{mode}") for mode in ("fabric", "torch")}
    # Forked ranks (conftest.run_ranks): what the launchers themselves do is checked with PPO's runs.
    fabric, torchrun = launch_together(
        ("fabric run", SCRIPTS["fabric"], SHORT, folders["fabric"], 2),
        ("torchrun", SCRIPTS["torch"], SHORT, folders["torch"], 2),
        via=run_ranks,
    )
    for finished in (fabric, torchrun):
        assert finished.returncode == 0, finished.stderr[-3000:]
    return {mode: run_dir(cwd, mode) for mode, cwd in folders.items()}


def test_fabric_and_torchrun_sac_give_identical_losses_and_weights(fabric_and_torch_sac_runs):
    fabric_dir, torch_dir = fabric_and_torch_sac_runs["fabric"], fabric_and_torch_sac_runs["torch"]
    fabric_agent, torch_agent = load_agent(fabric_dir), load_agent(torch_dir)
    assert fabric_agent["algorithm"] == "sac" and fabric_agent["policy"].keys() == torch_agent["policy"].keys()
    assert all(torch.equal(tensor, torch_agent["policy"][name]) for name, tensor in fabric_agent["policy"].items())
    fabric_scalars, torch_scalars = read_scalars(fabric_dir), read_scalars(torch_dir)
    for tag in ("Loss/critic_loss", "Loss/actor_loss", "Info/alpha", "Info/q_values", "Rewards/rew_avg"):
        assert fabric_scalars[tag] == torch_scalars[tag], tag
    assert [step for step, _ in fabric_scalars["Loss/critic_loss"]] == [800, 1200]


def test_sac_runs_log_every_expected_scalar(fabric_and_torch_sac_runs):
    for mode, directory in fabric_and_torch_sac_runs.items():
        scalars = read_scalars(directory)
        assert set(scalars) >= SAC_TAGS, (mode, SAC_TAGS - set(scalars))
        # one gradient step of 64 rows per env step on each rank
        assert scalars["Info/replay_ratio"][-1][1] == 64.0


@pytest.mark.parametrize(
    ("nproc", "args"),
    # the shared batch: one trainer against one coupled process, below
    [(3, []), pytest.param(3, ["--pipeline"], marks=pytest.mark.slow)],
    ids=["scatter", "pipeline"],
)
def test_decoupled_sac_runs_every_data_path(tmp_path, nproc, args):
    decoupled_short = [*SHORT, "--total-timesteps", "800", "--learning-starts", "200", "--log-every", "200"]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], decoupled_short + args, tmp_path, nproc=nproc)
    assert finished.returncode == 0, finished.stderr[-3000:]
    scalars = read_scalars(run_dir(tmp_path, "decoupled"))
    assert [step for step, _ in scalars["Loss/critic_loss"]] == [400, 600, 800]
    # Pipelined, every batch trains on weights one update newer than it was collected with, but the first.
    assert [lag for _, lag in scalars["Info/policy_lag_max"]] == [1.0 if "--pipeline" in args else 0.0] * 3
    assert [lag for _, lag in scalars["Info/policy_lag"]][1:] == [1.0 if "--pipeline" in args else 0.0] * 2
    # rows trained per env step: one batch per trainer, or one shared batch
    assert scalars["Info/replay_ratio"][-1][1] == (64.0 if "--share-data" in args else 128.0)
    assert "evaluation over 2 greedy episodes" in finished.stdout


@pytest.mark.parametrize(
    "args",
    [[], pytest.param(["--update-while-stepping"], marks=pytest.mark.slow)],
    ids=["learning after the steps", "learning while the envs step"],
)
def test_resuming_with_the_buffer_equals_an_uninterrupted_run(tmp_path, args):
    base = [*SHORT, *args, "--eval-episodes", "0", "--save-buffer", "--checkpoint-every", "400"]
    (tmp_path / "full").mkdir()
    (tmp_path / "part").mkdir()
    full, part = launch_together(
        ("fabric run", SCRIPTS["fabric"], base, tmp_path / "full", 2),
        ("fabric run", SCRIPTS["fabric"], [*base, "--total-timesteps", "800"], tmp_path / "part", 2),
        via=run_ranks,
    )
    assert full.returncode == 0 and part.returncode == 0, (full.stderr + part.stderr)[-3000:]
    part_dir = run_dir(tmp_path / "part", "fabric")
    saved = sorted((part_dir / "checkpoints").glob("step_*.ckpt"))[-1]
    state = torch.load(saved, weights_only=True)
    assert state["counters"]["global_step"] == 800 and len(state["rank_states"]) == 2
    assert state["rank_states"][1]["buffer"]["size"] == 400  # each rank's own transitions
    assert {"critic", "critic_target", "log_alpha", "critic_optimizer"} <= set(state["learner"])
    resumed = run_ranks("fabric run", SCRIPTS["fabric"], [*base, "--resume-from", str(saved)], tmp_path / "part")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole, continued = load_agent(run_dir(tmp_path / "full", "fabric")), load_agent(part_dir)
    assert all(torch.equal(whole["policy"][name], continued["policy"][name]) for name in whole["policy"])
    full_dir = run_dir(tmp_path / "full", "fabric")
    for tag in ("Loss/critic_loss", "Loss/actor_loss", "Info/alpha"):
        assert all_scalars(part_dir, tag) == all_scalars(full_dir, tag), tag


@pytest.mark.parametrize("save_buffer", [True, False], ids=["buffers saved", "buffers not saved"])
def test_two_ranks_resumed_on_one_share_out_their_replay_buffers_or_refill_before_training(tmp_path, save_buffer):
    base = [*SHORT, "--eval-episodes", "0", "--checkpoint-every", "400", *(["--save-buffer"] * save_buffer)]
    part = run_ranks("fabric run", SCRIPTS["fabric"], [*base, "--total-timesteps", "800"], tmp_path, 2)
    assert part.returncode == 0, part.stderr[-3000:]
    folder = run_dir(tmp_path, "fabric")
    saved = folder / "checkpoints" / "step_000000000800.ckpt"
    # 300 steps more on one rank, which runs both ranks' envs: fewer than --learning-starts 400
    more = [*base, "--total-timesteps", "1100", "--resume-from", str(saved)]
    resumed = run_ranks("python", SCRIPTS["fabric"], more, tmp_path, 1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    changed = (
        "warning: the checkpoint of 2 ranks resumes on 1: every rank's envs restart from fresh resets (2 per rank)"
    )
    final = torch.load(folder / "checkpoints" / "step_000000001100.ckpt", weights_only=True)
    if save_buffer:
        assert f"{changed}; the replay buffers' 800 transitions are shared out\n" in resumed.stderr
        assert final["rank_states"][0]["buffer"]["size"] == 1100  # both ranks' and the new ones
        return
    assert (
        f"{changed}; the replay buffers were not saved (--save-buffer): each refills its share of --learning-starts "
        "400 transitions before training again\n" in resumed.stderr
    )
    before = torch.load(saved, weights_only=True)["policy"]
    assert all(torch.equal(before[name], value) for name, value in final["policy"].items())  # not trained since


def test_evaluation_cli_on_a_sac_checkpoint_with_video(fabric_and_torch_sac_runs):
    folder = fabric_and_torch_sac_runs["fabric"]
    command = [sys.executable, "-m", "rl.evaluate", str(folder / "agent.ckpt"), "--episodes", "2", "--capture-video"]
    done = subprocess.run(command, cwd=folder, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Pendulum-v1, 2 deterministic episodes: return " in done.stdout
    assert list((folder / "eval_videos" / "agent").glob("*.mp4"))


SAC_BAD_INPUTS = [
    (["sac", "--env-id", "CartPole-v1"], "--env-id", "SAC needs continuous (Box) actions"),
    (["sac", "--env-id", "CarRacing-v3"], "--buffer-size", "lower --buffer-size"),  # 1M pixel transitions: 53 GiB
    (["sac", "--env-id", "envs_for_tests:UnboundedActions-v0"], "--env-id", "not finite"),
    (["sac", "--tau", "2"], "--tau", "must be in (0, 1]"),
    (["sac", "--buffer-size", "100000000000"], "--buffer-size", "lower --buffer-size"),
    (["sac", "--no-such-flag"], "--no-such-flag", ""),
]


@pytest.mark.parametrize(
    ("args", "flag", "says"), SAC_BAD_INPUTS, ids=[" ".join(args[1:3]) for args, _, _ in SAC_BAD_INPUTS]
)
def test_bad_sac_input_exits_2_with_one_line(tmp_path, args, flag, says):
    line = refusal_line("fabric", args, tmp_path)
    assert line.startswith(f"error: {flag}: ") and says in line


@pytest.mark.parametrize(
    ("launcher", "script"),
    [
        pytest.param("fabric run", "fabric", marks=pytest.mark.slow),
        ("torchrun", "torch"),
        pytest.param("fabric run", "decoupled", marks=pytest.mark.slow),
    ],
)
def test_every_rank_of_every_launcher_refuses_a_discrete_env_for_sac(tmp_path, launcher, script):
    finished = launch(launcher, SCRIPTS[script], ["sac", "--env-id", "CartPole-v1"], tmp_path, timeout=60)
    assert finished.returncode != 0
    lines = [line for line in finished.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 2 and all(line.startswith("error: --env-id: SAC needs continuous") for line in lines)
    assert "[rank" not in finished.stderr
