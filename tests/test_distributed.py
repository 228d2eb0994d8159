"""Real 2-process runs over gloo: Fabric and the torchrun baseline agree, and log what they should."""

import itertools
import re

import pytest
import torch
from conftest import (
    ENVS_STEPPED,
    SCRIPTS,
    launch,
    launch_together,
    load_agent,
    read_scalars,
    read_text_tags,
    run_dir,
    run_ranks,
)

from rl.cli import parse_config

SHORT_RUN = ["--total-timesteps", "2048", "--update-epochs", "2", "--eval-episodes", "2"]
VARIANTS = {
    "pendulum-shared-normalized": [
        "--env-id",
        "Pendulum-v1",
        "--share-data",
        "--normalize-observations",
        "--normalize-rewards",
        "--normalize-advantages",
        "--anneal-lr",
        "--clip-vloss",
        "--ortho-init",
        "--activation-function",
        "tanh",
        "--ent-coef",
        "0.01",
        "--per-rank-batch-size",
        "32",
    ],
    # CartPole through the CNN: a discrete policy, uint8 frames, each rank on its own data
    "pixels": ["--env-id", "rl/PixelCartPole-v1", "--resize", "0", "--frame-stack", "2", "--no-share-data"],
    # bf16 autocast in the trunks, through Fabric's precision and through the baseline's own
    "bf16-mixed": ["--precision", "bf16-mixed", "--ent-coef", "0.01"],
}
EXPECTED_SCALARS = {
    "Rewards/rew_avg",
    "Game/ep_len_avg",
    "Loss/policy_loss",
    "Loss/value_loss",
    "Loss/entropy",
    "Loss/approx_kl",
    "Loss/clip_fraction",
    "Loss/explained_variance",
    "Info/learning_rate",
    "Time/steps_per_second",
    "Test/return_mean",
    "Test/return_std",
    "Test/length_mean",
    "Perf/loop_steps_per_second",
    "Perf/env_step_share",
    "Perf/peak_rss_mb_max",
}


LAUNCHED_BY_THE_LAUNCHERS = "pendulum-shared-normalized"  # the other variants' ranks are forked (conftest.run_ranks)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def fabric_and_torch_runs(request, tmp_path_factory):
    args = SHORT_RUN + VARIANTS[request.param]
    jobs = {
        mode: (launcher, SCRIPTS[mode], args, tmp_path_factory.mktemp(f"{request.param}-{mode}"), 2)
        for mode, launcher in (("fabric", "fabric run"), ("torch", "torchrun"))
    }
    via = launch if request.param == LAUNCHED_BY_THE_LAUNCHERS else run_ranks
    runs = {}
    for (mode, job), finished in zip(jobs.items(), launch_together(*jobs.values(), via=via), strict=True):
        assert finished.returncode == 0, finished.stderr[-3000:]
        runs[mode] = (job[3], finished)
    return request.param, runs


def test_fabric_and_torchrun_give_identical_losses_and_parameters(fabric_and_torch_runs):
    _, runs = fabric_and_torch_runs
    fabric_dir, torch_dir = run_dir(runs["fabric"][0], "fabric"), run_dir(runs["torch"][0], "torch")
    fabric_agent, torch_agent = load_agent(fabric_dir), load_agent(torch_dir)
    assert fabric_agent["policy"].keys() == torch_agent["policy"].keys()
    for name, tensor in fabric_agent["policy"].items():
        assert torch.equal(tensor, torch_agent["policy"][name]), name
    fabric_scalars, torch_scalars = read_scalars(fabric_dir), read_scalars(torch_dir)
    for tag in ("Loss/policy_loss", "Loss/value_loss", "Loss/entropy", "Loss/approx_kl", "Rewards/rew_avg"):
        assert fabric_scalars[tag] == torch_scalars[tag], tag
    assert [step for step, _ in fabric_scalars["Loss/policy_loss"]] == [512, 1024, 1536, 2048]


def test_runs_log_every_expected_scalar_and_the_hyperparameters(fabric_and_torch_runs):
    _, runs = fabric_and_torch_runs
    for mode, (cwd, _) in runs.items():
        directory = run_dir(cwd, mode)
        assert set(read_scalars(directory)) >= EXPECTED_SCALARS, mode
        assert any("hyperparameters" in tag for tag in read_text_tags(directory)), mode
        saved = load_agent(directory)["config"]
        again = parse_config(["--config", str(directory / "config.yaml")]).to_dict()  # the folder's flags, taken back
        assert all(again[key] == saved[key] for key in saved if key not in ("config", "write_config")), mode


def test_rank_zero_shows_progress_and_the_evaluation(fabric_and_torch_runs):
    _, runs = fabric_and_torch_runs
    for _, (_, finished) in runs.items():
        assert "sps=" in finished.stderr and "2048/2048" in finished.stderr
        assert finished.stdout.count("evaluation over 2 greedy episodes: return") == 1


def test_saved_agent_holds_weights_statistics_and_config(fabric_and_torch_runs):
    variant, runs = fabric_and_torch_runs
    state = load_agent(run_dir(runs["fabric"][0], "fabric"))
    assert state["config"]["total_timesteps"] == 2048
    normalized = variant == "pendulum-shared-normalized"
    # Statistics from 4 rollouts of 2 ranks x 2 envs x 128 steps, plus gymnasium's epsilon count.
    expected_count = 4 * 2 * 2 * 128 + 1e-4 if normalized else 1e-4
    assert state["obs_normalizer"]["count"] == pytest.approx(expected_count)
    assert state["reward_scaler"]["count"] == pytest.approx(expected_count)


def test_same_seed_same_result_on_cpu(tmp_path):
    args = [*SHORT_RUN, "--eval-episodes", "0"]
    agents, losses = [], []
    for attempt in ("first", "second"):
        cwd = tmp_path / attempt
        cwd.mkdir()
        finished = run_ranks("python", SCRIPTS["fabric"], args, cwd)
        assert finished.returncode == 0, finished.stderr[-3000:]
        agents.append(load_agent(run_dir(cwd, "fabric"))["policy"])
        losses.append(read_scalars(run_dir(cwd, "fabric"))["Loss/policy_loss"])
    assert losses[0] == losses[1]
    assert all(torch.equal(agents[0][name], agents[1][name]) for name in agents[0])


def test_log_dir_moves_the_run_folder(tmp_path):
    args = [*SHORT_RUN, "--eval-episodes", "0", "--log-dir", "elsewhere", "--exp-name", "named"]
    finished = run_ranks("python", SCRIPTS["fabric"], args, tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    (folder,) = (tmp_path / "elsewhere" / "fabric_logs").iterdir()
    assert folder.name.startswith("named_CartPole-v1_42_") and (folder / "agent.ckpt").exists()
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("launcher", "mode", "extra"),
    [
        ("fabric run", "fabric", ["--eval-every", "1024"]),
        ("fabric run", "decoupled", []),
        ("python", "hogwild", ["--workers", "2"]),
    ],
)
def test_a_finished_run_names_its_saved_agent_once_below_the_working_folder(tmp_path, launcher, mode, extra):
    finished = run_ranks(launcher, SCRIPTS[mode], [*SHORT_RUN, "--num-envs", "2", *extra], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    agent = run_dir(tmp_path, mode).relative_to(tmp_path) / "agent.ckpt"
    named = [line for line in finished.stdout.splitlines() if line.startswith("agent saved to ")]
    best = " (and its best evaluation's, best.ckpt, beside it)" if "--eval-every" in extra else ""
    assert named == [f"agent saved to {agent}{best}"]
    assert finished.stdout.splitlines()[-1] == named[0]


def test_a_run_ends_at_the_first_periodic_evaluation_that_reaches_the_target(tmp_path):
    """--stop-at-return: rank 0's evaluation ends every rank's loop, which then closes as at its last step."""
    args = [
        "--total-timesteps",
        "8192",
        "--update-epochs",
        "2",
        "--eval-episodes",
        "1",
        "--eval-every",
        "1024",
        "--stop-at-return",
        "-1e9",
    ]
    finished = run_ranks("python", SCRIPTS["fabric"], args, tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "step 1024: the greedy return reached --stop-at-return -1e+09; training ends here" in finished.stdout
    assert "training loop: 1024 steps" in finished.stdout and "evaluation over 1 greedy episode:" in finished.stdout
    assert re.search(r"^step 1024: greedy return [\d.]+ ± 0\.00 over 1 episode$", finished.stdout, re.MULTILINE)
    assert ENVS_STEPPED.search(finished.stdout)
    directory = run_dir(tmp_path, "fabric")
    assert [step for step, _ in read_scalars(directory)["Eval/return_mean"]] == [1024]
    assert (directory / "agent.ckpt").exists() and (directory / "checkpoints" / "step_000000001024.ckpt").exists()


def test_periodic_evaluations_leave_the_training_unchanged(tmp_path):
    """Evaluating every 512 steps neither consumes the training's randomness nor moves its losses."""
    losses = []
    for eval_every in ("0", "512"):
        cwd = tmp_path / eval_every
        cwd.mkdir()
        finished = run_ranks("python", SCRIPTS["fabric"], [*SHORT_RUN, "--eval-every", eval_every], cwd)
        assert finished.returncode == 0, finished.stderr[-3000:]
        scalars = read_scalars(run_dir(cwd, "fabric"))
        losses.append(scalars["Loss/policy_loss"])
        if eval_every != "0":
            means = scalars["Eval/return_mean"]
            assert [step for step, _ in means] == [512, 1024, 1536]  # 2048: the closing one
            # The best agent so far is kept: the first evaluation of the highest mean, and its score.
            running_best = list(itertools.accumulate((mean for _, mean in means), max))
            assert [best for _, best in scalars["Eval/best_return"]] == running_best
            best = torch.load(run_dir(cwd, "fabric") / "best.ckpt", weights_only=True)
            best_step, best_mean = max(means, key=lambda evaluation: evaluation[1])
            assert best["eval_step"] == best_step and best["eval_return"] == pytest.approx(best_mean, rel=1e-6)
    assert losses[0] == losses[1]


def test_a_run_folders_broken_best_agent_stops_every_rank_with_its_line_before_training(tmp_path):
    best = tmp_path / "logs" / "fabric_logs" / "kept" / "best.ckpt"
    best.parent.mkdir(parents=True)
    best.write_bytes(b"not a checkpoint")
    args = [*SHORT_RUN, "--eval-every", "512", "--run-name", "kept"]
    finished = run_ranks("fabric run", SCRIPTS["fabric"], args, tmp_path)
    assert finished.returncode != 0
    refused = "error: --eval-every: logs/fabric_logs/kept/best.ckpt is not a checkpoint: torch.save did not write it"
    assert [line for line in finished.stderr.splitlines() if line.startswith("error:")] == [refused, refused]
    assert best.read_bytes() == b"not a checkpoint" and not list(best.parent.glob("checkpoints/*.ckpt"))


def test_a_target_kl_stops_every_rank_at_the_same_minibatch_and_fabric_and_torchrun_agree(tmp_path):
    """Each rank trains on its own data, so its own KL would stop it elsewhere: the decision is the average's."""
    args = [
        *SHORT_RUN,
        "--env-id",
        "Pendulum-v1",
        "--no-share-data",
        "--per-rank-batch-size",
        "32",
        "--target-kl",
        "0.002",
        "--eval-episodes",
        "0",
    ]
    jobs = [
        (launcher, SCRIPTS[mode], args, tmp_path / mode, 2)
        for mode, launcher in (("fabric", "fabric run"), ("torch", "torchrun"))
    ]
    for job in jobs:
        job[3].mkdir()
    finished = launch_together(*jobs, via=run_ranks)
    assert all(done.returncode == 0 for done in finished), [done.stderr[-2000:] for done in finished]
    scalars = {mode: read_scalars(run_dir(tmp_path / mode, mode)) for mode in ("fabric", "torch")}
    stops = scalars["fabric"]["Info/kl_stop_minibatch"]
    assert len(stops) == 4  # each of the 4 updates stopped early at this target
    # a mean over the ranks: a whole number only where both stopped at the same minibatch
    assert all(value == int(value) for _, value in stops + scalars["fabric"]["Info/kl_stop_epoch"])
    for tag in ("Info/kl_stop_epoch", "Info/kl_stop_minibatch", "Loss/policy_loss", "Loss/approx_kl"):
        assert scalars["fabric"][tag] == scalars["torch"][tag], tag
    fabric_agent, torch_agent = (load_agent(run_dir(tmp_path / mode, mode))["policy"] for mode in ("fabric", "torch"))
    assert all(torch.equal(fabric_agent[name], torch_agent[name]) for name in fabric_agent)
