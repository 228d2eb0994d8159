"""The learning benchmark's harness: its commands are valid runs of the published configurations, a
stopped run resumes from its checkpoint, and the table reports every row."""

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SCRIPTS, run_ranks

from rl.cli import parse_config
from rl.config import validate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import resumable
import sb3
import sb3_reference
import suite


def row_config(row: str, tmp_path: Path):
    """The config a row's run trains with, whether it runs as one process or under `fabric run`."""
    command = suite.plan([row], [1], tmp_path)[0].command()
    script = next(i for i, part in enumerate(command) if part.endswith("train_fabric.py"))
    return parse_config(command[script + 1 :]), command[:script]


@pytest.mark.parametrize("row", list(suite.ROWS))
def test_each_row_runs_its_preset_on_the_published_env_for_the_published_steps(row, tmp_path):
    cfg, launcher = row_config(row, tmp_path)
    devices = suite.ROWS[row].devices
    assert launcher == [sys.executable] if devices == 1 else f"--devices={devices}" in launcher
    assert (cfg.env_id, cfg.total_timesteps, cfg.seed) == (suite.ROWS[row].env_id, suite.ROWS[row].steps, 1)
    assert cfg.run_name == suite.run_name(row, 1)
    validate(cfg, world_size=devices, gpu_count=0)
    assert cfg.checkpoint_seconds > 0  # checkpoints by time: a stopped session costs one interval at most


def test_sac_rows_keep_the_published_replay_ratio_of_one_gradient_step_of_256_per_env_step(tmp_path):
    for row in [name for name, row in suite.ROWS.items() if row.group == "SAC MuJoCo"]:
        cfg, _ = row_config(row, tmp_path)
        assert (cfg.num_envs, cfg.train_freq, cfg.gradient_steps, cfg.batch_size) == (1, 1, 1, 256)
        assert cfg.save_buffer  # a resumed run trains on at once, on its whole buffer, as an uninterrupted one


def test_the_gsde_rows_train_rl_zoos_entries_and_differ_from_their_baselines_in_gsde_alone(tmp_path):
    walker, _ = row_config("sac/bipedalwalker-gsde", tmp_path)
    values = (
        walker.policy_lr,
        walker.q_lr,
        walker.buffer_size,
        walker.batch_size,
        walker.gamma,
        walker.tau,
        walker.train_freq,
        walker.gradient_steps,
        walker.learning_starts,
        walker.net_arch,
        walker.log_std_init,
    )
    assert values == (7.3e-4, 7.3e-4, 300_000, 256, 0.98, 0.02, 64, 64, 10_000, (400, 300), -3.0)
    pendulum, _ = row_config("ppo/pendulum-gsde", tmp_path)
    rollout = (pendulum.num_envs, pendulum.num_steps, pendulum.gamma, pendulum.learning_rate, pendulum.update_epochs)
    assert rollout == (4, 1024, 0.9, 1e-3, 10) and (pendulum.use_sde, pendulum.sde_sample_freq) == (True, 4)
    for with_gsde, without in (
        ("ppo/pendulum-gsde", "ppo/pendulum-no-gsde"),
        ("sac/bipedalwalker-gsde", "sac/bipedalwalker-no-gsde"),
    ):
        one, other = (row_config(name, tmp_path)[0].to_dict() for name in (with_gsde, without))
        differ = {key for key in one if one[key] != other[key]}
        assert differ == {"use_sde", "run_name"}, differ


def test_pong_splits_cleanrls_rollout_over_its_ranks_and_stops_at_its_target(tmp_path):
    cfg, _ = row_config("ppo/pong", tmp_path)
    devices = suite.ROWS["ppo/pong"].devices
    rollout, minibatch = devices * cfg.num_envs * cfg.num_steps, devices * cfg.per_rank_batch_size
    assert (rollout, minibatch, cfg.update_epochs) == (1024, 256, 4)  # ppo_atari.py: 8 envs x 128, 4 minibatches
    assert (cfg.stop_at_return, cfg.eval_every) == (18.0, 250_000)


def test_breakout_splits_cleanrls_rollout_over_its_ranks_for_the_published_steps(tmp_path):
    cfg, _ = row_config("ppo/breakout", tmp_path)
    devices = suite.ROWS["ppo/breakout"].devices
    rollout, minibatch = devices * cfg.num_envs * cfg.num_steps, devices * cfg.per_rank_batch_size
    assert (rollout, minibatch, cfg.update_epochs, cfg.total_timesteps) == (1024, 256, 4, 10_000_000)
    assert cfg.stop_at_return is None  # judged by its last 100 training games at 10M, as CleanRL's figure


def test_the_cleanrl_hopper_row_trains_with_cleanrls_continuous_defaults(tmp_path):
    cfg, _ = row_config("ppo/hopper-cleanrl", tmp_path)
    rollout = (cfg.num_envs, cfg.num_steps, cfg.num_steps // cfg.per_rank_batch_size, cfg.update_epochs)
    assert rollout == (1, 2048, 32, 10)  # ppo_continuous_action.py: 1 env x 2,048 steps, 32 minibatches, 10 epochs
    optimisation = (
        cfg.learning_rate,
        cfg.anneal_lr,
        cfg.gamma,
        cfg.gae_lambda,
        cfg.clip_coef,
        cfg.clip_vloss,
        cfg.ent_coef,
        cfg.vf_coef,
        cfg.max_grad_norm,
        cfg.normalize_advantages,
    )
    assert optimisation == (3e-4, True, 0.99, 0.95, 0.2, True, 0.0, 0.5, 0.5, True)
    network = (cfg.activation_function, cfg.hidden_size, cfg.ortho_init, cfg.log_std_init)
    assert network == ("tanh", 64, True, 0.0)
    assert (cfg.normalize_observations, cfg.normalize_rewards) == (True, True)  # each clipped to +-10, as CleanRL's


@pytest.mark.parametrize("module", suite.BENCH_MODULES)
def test_the_suite_without_the_bench_extra_stops_at_once_naming_it(monkeypatch, module):
    real_find_spec = suite.importlib.util.find_spec  # None for a module not installed
    monkeypatch.setattr(
        suite.importlib.util, "find_spec", lambda name: None if name == module else real_find_spec(name)
    )
    with pytest.raises(SystemExit) as stopped:
        suite.check_bench_installed()
    assert (
        stopped.value.code == f"error: benchmarks/suite.py needs {module}: pip install -c constraints.txt -e '.[bench]'"
    )
    monkeypatch.undo()
    suite.check_bench_installed()  # all installed here


def test_the_mean_of_the_last_training_episodes_weighs_each_report_by_its_episodes():
    # reports at steps 10, 20, 30: means 0, 10 and 20 over 50, 60 and 40 episodes; the last 100 take 60 from the
    # middle one and all 40 of the last
    assert resumable.mean_of_last_episodes([10, 20, 30], [0.0, 10.0, 20.0], [50, 60, 40], 100) == 14.0
    assert resumable.mean_of_last_episodes([10, 20], [1.0, 3.0], [5, 5], 100) == 2.0  # fewer than 100 in all
    assert resumable.mean_of_last_episodes([], [], [], 100) is None


MUJOCO_ROWS = [name for name, row in suite.ROWS.items() if row.group.endswith("MuJoCo")]


@pytest.mark.slow
@pytest.mark.parametrize("row", MUJOCO_ROWS)
def test_each_mujoco_preset_trains_a_few_hundred_steps_of_its_env(row, tmp_path):
    algorithm, preset = suite.ROWS[row].algorithm, suite.ROWS[row].preset
    steps = 300 if algorithm == "sac" else 256 * suite.row_config(row).num_envs
    short = (
        ["sac", "--total-timesteps", "300", "--learning-starts", "100"]
        if algorithm == "sac"
        else ["--num-steps", "256", "--total-timesteps", str(steps), "--update-epochs", "1"]
    )
    args = [*short, "--preset", preset, "--eval-episodes", "1", "--torch-threads", "1", "--no-progress-bar"]
    finished = run_ranks("python", SCRIPTS["fabric"], args, tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"training loop: {steps} steps" in finished.stdout
    assert "evaluation over 1 greedy episode:" in finished.stdout


# The rows of rl-zoo's configurations, which SB3 runs; CleanRL's continuous PPO anneals its learning rate and
# clips its value loss, which SB3's PPO does not.
SB3_ROWS = [name for name in MUJOCO_ROWS if suite.ROWS[name].preset != "cleanrl-mujoco"]


@pytest.mark.parametrize("row", SB3_ROWS)
def test_stable_baselines3_trains_each_mujoco_row_with_the_values_of_its_preset(row, tmp_path):
    cfg, _ = row_config(row, tmp_path)
    spec = sb3.sb3_spec(row, suite.ROWS[row].steps, 1)
    assert (spec["env_id"], spec["n_envs"], spec["steps"], spec["seed"]) == (
        suite.ROWS[row].env_id,
        cfg.num_envs,
        cfg.total_timesteps,
        1,
    )
    assert (spec["time_feature"], spec["env_kwargs"]) == (cfg.time_feature, cfg.make_kwargs())
    model = spec["model"]
    if row.startswith("ppo/"):
        assert (model["n_steps"], model["batch_size"], model["n_epochs"]) == (
            cfg.num_steps,
            cfg.per_rank_batch_size,
            cfg.update_epochs,
        )
        assert (model["learning_rate"], model["gamma"], model["gae_lambda"], model["clip_range"]) == (
            cfg.learning_rate,
            cfg.gamma,
            cfg.gae_lambda,
            cfg.clip_coef,
        )
        assert model["vf_coef"] * 2 == cfg.vf_coef  # SB3's value loss is the whole squared error, this one's half
        layers = [cfg.hidden_size, cfg.hidden_size]
        network = (cfg.activation_function, cfg.ortho_init, cfg.log_std_init, {"pi": layers, "vf": layers})
        assert (
            tuple(spec["policy"][key] for key in ("activation_fn", "ortho_init", "log_std_init", "net_arch")) == network
        )
        assert spec["normalize"] == {"norm_obs": True, "norm_reward": True, "gamma": cfg.gamma}
    else:
        assert (model["learning_starts"], model["batch_size"], model["train_freq"], model["gradient_steps"]) == (
            cfg.learning_starts,
            cfg.batch_size,
            cfg.train_freq,
            cfg.gradient_steps,
        )
        assert model["learning_rate"] == cfg.policy_lr == cfg.q_lr
        assert spec["normalize"] is None


def test_the_table_reports_rows_without_runs_and_judges_by_the_first_published_figure():
    results = [
        {
            "row": "ppo/hopper",
            "seed": seed,
            "eval_return": value,
            "steps": 999_424,
            "wall_time_s": 3600.0,
            "env_steps_per_s": 300,
        }
        for seed, value in ((1, 2500.0), (2, 2300.0))
    ]
    table = suite.markdown(results, ["ppo/hopper", "ppo/ant"])
    hopper, ant = table.splitlines()[2:]
    assert "2,400.0 ± 100.0" in hopper and "2 of 3" in hopper and "| yes |" in hopper  # 2,400 >= 2,410 - 10
    assert "not yet run" in ant and "0 of 3" in ant
    running = suite.markdown(results, ["ppo/ant"], reached={"ppo/ant": 1_345_536}).splitlines()[2]
    assert "running: 1,345,536 steps so far" in running and "0 of 3" in running
    missed = [{**result, "eval_return": 2000.0} for result in results]
    assert "| no |" in suite.markdown(missed, ["ppo/hopper"])
    pong = {"row": "ppo/pong", "seed": 1, "steps": 4_000_000, "wall_time_s": 9000.0, "env_steps_per_s": 400}
    assert "| yes |" in suite.markdown([{**pong, "eval_return": 18.5}], ["ppo/pong"])  # its target, not 20.99 - 0.11
    assert "| no |" in suite.markdown([{**pong, "eval_return": 17.9}], ["ppo/pong"])


def test_rl_zoos_atari_figures_are_met_by_episodes_with_sampled_actions_played_from_every_seeds_agent(tmp_path):
    """rl-zoo's benchmark samples the actions of its Atari agents: their greedy return is not that figure."""
    assert all(run.keep_agent for run in suite.plan(["ppo/breakout"], [1, 2], tmp_path))
    assert [run.keep_agent for run in suite.plan(["ppo/hopper"], [1, 2], tmp_path)] == [True, False]
    assert not any(run.keep_agent for run in suite.plan(["ppo/hopper"], [2, 3], tmp_path))  # seed 1 keeps it
    breakout = {"row": "ppo/breakout", "seed": 1, "eval_return": 100.0, "training_return_last100": 420.0}
    assert suite.verdicts(suite.ROWS["ppo/breakout"], [breakout]) == "CleanRL: yes; rl-zoo: no"  # no such figure
    sampled = {**breakout, suite.SAMPLED: 370.0}  # 398 - 33.3 = 364.7
    assert suite.verdicts(suite.ROWS["ppo/breakout"], [sampled]) == "CleanRL: yes; rl-zoo: yes (370.0)"
    assert "rl-zoo: 398 ± 33.30 (sampled actions)" in suite.markdown(
        [{**sampled, "steps": 1, "wall_time_s": 1.0, "env_steps_per_s": 1}], ["ppo/breakout"]
    )
    trained = run_ranks("python", SCRIPTS["fabric"], ["--total-timesteps", "512", "--eval-episodes", "1"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    agent = resumable.agent_file(tmp_path, suite.run_name("ppo/breakout", 1))
    agent.parent.mkdir()
    shutil.copyfile(next(tmp_path.glob("logs/*/*/agent.ckpt")), agent)  # any saved agent plays its own env
    resumable.row_file(tmp_path, agent.stem).parent.mkdir()
    resumable.row_file(tmp_path, agent.stem).write_text(json.dumps(breakout))
    (filled,) = suite.with_sampled_returns(tmp_path, [breakout])
    assert json.loads(resumable.row_file(tmp_path, agent.stem).read_text()) == filled  # played once, then kept
    assert (filled[suite.SAMPLED], filled[f"{suite.SAMPLED}_std"]) == suite.sampled_return(agent)  # the same draws
    assert 8.0 <= filled[suite.SAMPLED] <= 500.0  # CartPole's returns


def test_results_csv_holds_every_finished_run_of_every_row(tmp_path):
    (tmp_path / "rows").mkdir()
    for row, seed in (("ppo/pong", 1), ("sac/walker2d", 1), ("ppo/hopper", 2), ("ppo/hopper", 1)):
        result = {"row": row, "seed": seed, "eval_return": 1.0, "steps": 10, "wall_time_s": 1.0, "env_steps_per_s": 10}
        (tmp_path / "rows" / f"{suite.run_name(row, seed)}.json").write_text(json.dumps(result))
    (tmp_path / "rows" / "another-study.json").write_text(json.dumps({"row": "not/a-row", "seed": 1}))
    suite.write_csv(suite.every_finished_run(tmp_path), tmp_path / "results.csv")
    with (tmp_path / "results.csv").open() as file:
        written = [(line["env"], line["seed"]) for line in csv.DictReader(file)]
    assert written == [("Hopper-v5", "1"), ("Hopper-v5", "2"), ("Walker2d-v5", "1"), ("PongNoFrameskip-v4", "1")]


def test_scores_are_normalized_by_the_published_mean_over_the_seeds_every_row_has():
    results = [
        {"row": "ppo/hopper", "seed": 1, "eval_return": 2410.0},
        {"row": "ppo/hopper", "seed": 2, "eval_return": 1205.0},
        {"row": "ppo/swimmer", "seed": 1, "eval_return": 141.0},
    ]
    scores = suite.normalized_scores(results, ["ppo/hopper", "ppo/swimmer", "sac/hopper"])
    assert scores == {"PPO MuJoCo": [[1.0, 0.5]]}


def test_the_aggregate_is_the_same_each_time_the_table_is_written():
    import numpy as np

    matrix = np.random.default_rng(1).uniform(0.5, 1.5, (3, 7))  # 3 seeds x 7 rows: the bootstrap's IQMs vary
    point, interval = suite.iqm_estimates({"g": matrix}, reps=2000)  # the table's 50,000 take 15 s
    np.random.uniform(size=5)  # whatever else drew from NumPy's global generator meanwhile
    state = np.random.get_state()[1]
    again_point, again_interval = suite.iqm_estimates({"g": matrix}, reps=2000)
    assert (np.random.get_state()[1] == state).all()  # and that generator is left as it was
    assert point["g"][0] == again_point["g"][0]
    assert interval["g"].tolist() == again_interval["g"].tolist()  # the bootstrap's draws too
    low, high = interval["g"][:, 0]
    assert matrix.min() < low < point["g"][0] < high < matrix.max()


def test_training_time_leaves_out_the_time_between_launches(tmp_path):
    (tmp_path / "segments").mkdir()
    launches = [{"started": 100.0, "ended": 200.0}, {"started": 1000.0, "ended": 1050.0}]
    (tmp_path / "segments" / "run.jsonl").write_text("\n".join(json.dumps(s) for s in launches))
    assert [resumable.training_seconds(tmp_path, "run", t) for t in (150, 500, 1020, 2000)] == [50, 100, 120, 150]


def test_a_stopped_run_resumes_from_its_checkpoint_and_its_row_sums_the_launches(tmp_path):
    """The first launch stops at a checkpoint (as a session that ends would), the second finishes the run."""

    def command(total: int) -> list[str]:
        return [
            sys.executable,
            str(suite.REPO / "train_fabric.py"),
            "--total-timesteps",
            str(total),
            "--num-steps",
            "64",
            "--eval-episodes",
            "2",
            "--no-progress-bar",
            "--torch-threads",
            "1",
            "--run-name",
            "run",
            "--log-dir",
            str(tmp_path / "runs"),
            "--checkpoint-every",
            "128",
        ]

    segment, _ = resumable.launch_segment(resumable.Run("run", lambda: command(256), {}), tmp_path)
    assert segment["exit"] == 0 and segment["steps"] == 256
    assert not resumable.open_launch_file(tmp_path, "run").exists()  # a launch that ended is closed
    first_launch = resumable.curve(tmp_path, "run")
    assert first_launch[0][-1] == 256 and resumable.curve_file(tmp_path, "run").exists()
    for events in resumable.run_folder(tmp_path, "run").glob("events.*"):
        events.unlink()  # the run goes on elsewhere: only its committed checkpoint and curve came along
    run = resumable.Run("run", lambda: command(512), {"row": "demo"}, keep_agent=True)
    (row,) = resumable.run_all([run], tmp_path)
    assert (row["row"], row["launches"], row["steps"]) == ("demo", 2, 512)
    assert not (resumable.run_folder(tmp_path, "run") / "checkpoints").exists()  # finished: never resumed again
    assert resumable.agent_file(tmp_path, "run").stat().st_size > 0
    shutil.rmtree(resumable.run_folder(tmp_path, "run"))  # run folders are not committed
    steps, _, returns = resumable.curve(tmp_path, "run")
    assert steps[: len(first_launch[0])] == first_launch[0] and steps[-1] == 512 and len(returns) == len(steps)
    assert resumable.run_all([resumable.Run("run", lambda: ["false"], {})], tmp_path) == [row]  # not launched again


def test_a_killed_launch_counts_from_its_start_to_its_newest_checkpoint(tmp_path):
    """A session that ends kills the study outright: the next launch records what the killed one saved."""
    checkpoints = resumable.run_folder(tmp_path, "run") / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "step_000000000128.ckpt").write_bytes(b"")
    marker = resumable.open_launch_file(tmp_path, "run")
    marker.parent.mkdir()
    saved_at = resumable.saved_step(tmp_path, "run")[1]
    marker.write_text(json.dumps({"started": saved_at - 30.0, "from_step": 64}))
    resumable.close_killed_launch(tmp_path, "run")
    (segment,) = resumable.segments(tmp_path, "run")
    assert (segment["exit"], segment["steps"], segment["wall_time_s"]) == ("killed", 64, 30.0)
    assert not marker.exists()
    resumable.close_killed_launch(tmp_path, "run")  # closed once: nothing more to record
    assert len(resumable.segments(tmp_path, "run")) == 1


def test_a_killed_launch_in_a_restored_folder_counts_to_when_its_checkpoint_appeared(tmp_path, monkeypatch):
    """A folder copied into a new checkout carries the copy's file times: the launch's own note dates the checkpoint."""
    monkeypatch.setattr(resumable, "CHECKPOINT_WATCH_S", 0.01)
    checkpoints = resumable.run_folder(tmp_path, "run") / "checkpoints"
    checkpoints.mkdir(parents=True)
    marker = resumable.open_launch_file(tmp_path, "run")
    marker.parent.mkdir()
    # A launch note's time to a tenth of a second, rounded down: the launch began at least 30 s ago.
    opened = {"started": math.floor((time.time() - 30.0) * 10) / 10, "from_step": 0}
    marker.write_text(json.dumps(opened))
    checkpoint = checkpoints / "step_000000000128.ckpt"
    with resumable.checkpoints_watched(tmp_path, "run", opened):
        checkpoint.write_bytes(b"")
        deadline = time.monotonic() + 10
        while "checkpoint_step" not in json.loads(marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
    an_hour_later = time.time() + 3600
    os.utime(checkpoint, (an_hour_later, an_hour_later))  # the checkout was restored an hour after the kill
    resumable.close_killed_launch(tmp_path, "run")
    (segment,) = resumable.segments(tmp_path, "run")
    assert segment["steps"] == 128 and 30.0 <= segment["wall_time_s"] < 35.0


def test_a_runs_curve_is_written_at_each_checkpoint_so_a_new_checkout_keeps_what_was_logged(tmp_path, monkeypatch):
    """A session's end kills the launch, and a new checkout has no event files: the curve must already hold them."""
    from torch.utils.tensorboard import SummaryWriter

    from rl.logger import EPISODE_RETURN

    monkeypatch.setattr(resumable, "CHECKPOINT_WATCH_S", 0.01)
    folder = resumable.run_folder(tmp_path, "run")
    (folder / "checkpoints").mkdir(parents=True)
    with SummaryWriter(str(folder)) as writer:
        writer.add_scalar(EPISODE_RETURN, 12.5, 64)
    opened = {"started": time.time(), "from_step": 0}
    resumable.open_launch_file(tmp_path, "run").parent.mkdir()  # where the launch notes its checkpoints
    with resumable.checkpoints_watched(tmp_path, "run", opened):
        (folder / "checkpoints" / "step_000000000064.ckpt").write_bytes(b"")
        deadline = time.monotonic() + 60  # the first write imports TensorBoard's reader: seconds on a busy machine
        while not resumable.curve_file(tmp_path, "run").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    shutil.rmtree(folder)  # the launch was killed; the next checkout has none of its logs
    steps, _, returns = resumable.curve(tmp_path, "run")
    assert (steps, returns) == ([64], [12.5])
    assert not list(resumable.curve_file(tmp_path, "run").parent.glob("*.tmp"))  # written whole, then renamed


def test_a_run_whose_checkpoints_are_gone_starts_again_and_forgets_its_earlier_launches(tmp_path, capsys):
    """A fresh clone holds a run's logs and launches but not its large checkpoints: the run starts over, clean."""
    folder = resumable.run_folder(tmp_path, "run")
    folder.mkdir(parents=True)
    (folder / "events.out.tfevents.0").write_bytes(b"")
    resumable.append_segment(tmp_path, "run", {"steps": 5000, "wall_time_s": 60.0})
    resumable.write_curve(tmp_path, "run")
    resumable.forget_launches_without_a_checkpoint(tmp_path, "run")
    assert resumable.segments(tmp_path, "run") == [] and not folder.exists()
    assert not resumable.curve_file(tmp_path, "run").exists()
    assert capsys.readouterr().out.startswith("run: no checkpoint of its earlier launches is left; it starts again")
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "step_000000000128.ckpt").write_bytes(b"")
    resumable.append_segment(tmp_path, "run", {"steps": 128, "wall_time_s": 1.0})
    resumable.forget_launches_without_a_checkpoint(tmp_path, "run")  # a checkpoint: the launches stand
    assert len(resumable.segments(tmp_path, "run")) == 1


def test_the_sb3_reference_table_gives_the_sampled_actions_figure_where_it_was_measured(tmp_path):
    measured = {"steps": 1_000_000, "loop_s": 20_000.0, "eval_return": 3_000.0, "eval_std": 900.0}
    results = {
        "sac-walker2d-seed1": {"row": "sac/walker2d", "seed": 1, **measured, "sampled_return": 3_900.5},
        "ppo-hopper-seed1": {"row": "ppo/hopper", "seed": 1, **measured},  # recorded before SB3 sampled too
    }
    results["sac-walker2d-seed1"]["sampled_std"] = 12.25
    table = sb3_reference.markdown(results, tmp_path).splitlines()
    assert "| SB3: greedy return | SB3: sampled actions |" in table[0]
    assert "| 3,000.0 ± 900.0 | 3,900.5 ± 12.2 | not yet run |" in table[3]  # sorted: sac-walker2d second
    assert "| 3,000.0 ± 900.0 | not measured | not yet run |" in table[2]


REPOSITORY = Path(__file__).resolve().parents[1]


def git(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *arguments], cwd=REPOSITORY, capture_output=True, text=True)


# A source archive has no .git, and git refuses a checkout owned by another user: nothing to read then.
IS_A_GIT_CHECKOUT = shutil.which("git") is not None and (
    git("rev-parse", "--show-toplevel").stdout.strip() == str(REPOSITORY)
)


@pytest.mark.skipif(not IS_A_GIT_CHECKOUT, reason="reads the repository's .gitignore and index with git")
def test_a_runs_newest_checkpoint_is_left_in_the_working_tree_and_a_sac_one_is_never_committed():
    """A run in progress goes on from another copy of the working tree only if git does not ignore its checkpoint;
    a SAC checkpoint holds its replay buffer (up to 170 MB), as does an SB3 reference run's save, which must never
    be committed."""
    run = "benchmarks/results/suite/runs/fabric_logs/sac-hopper-seed3"
    checkpoint, sac_checkpoint = f"{run}/checkpoints/step_000000001000.ckpt", r"/fabric_logs/sac-[^/]+/checkpoints/"
    assert git("check-ignore", "-q", checkpoint).returncode == 1 and re.search(sac_checkpoint, checkpoint)
    assert git("check-ignore", "-q", f"{run}/events.out.tfevents.0").returncode == 0  # the run's logs are ignored
    sb3_save, sb3_saves = "benchmarks/results/sb3/checkpoints/sac-walker2d-seed1", "benchmarks/results/sb3/checkpoints/"
    for name in ("model.zip", "replay.pkl", "vecnormalize.pkl", "progress.json"):
        assert git("check-ignore", "-q", f"{sb3_save}/{name}").returncode == 1, name
    assert git("check-ignore", "-q", f"{sb3_save}/replay.tmp.pkl").returncode == 0  # a save being written
    tracked = [path for path in git("ls-files", "-z").stdout.split("\0") if (REPOSITORY / path).is_file()]
    assert not [path for path in tracked if re.search(sac_checkpoint, path) or path.startswith(sb3_saves)]
    sizes = {path: (REPOSITORY / path).stat().st_size for path in tracked}
    assert sizes and max(sizes.values()) < 50 * 2**20, max(sizes, key=sizes.get)  # a PPO Atari checkpoint: ~20 MB


@pytest.mark.skipif(shutil.which("git") is None, reason="builds a git repository")
def test_long_runs_saves_are_kept_from_a_device_call_and_given_back_after(tmp_path):
    """A device call takes the working tree that git does not ignore, at most 64 MiB: a run's save in progress
    (untracked, not ignored) stays behind while device calls run, and goes with the working tree again after."""
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(REPOSITORY / "benchmarks" / "device_tree.sh", tmp_path / "benchmarks")
    shutil.copy(REPOSITORY / ".gitignore", tmp_path)
    saves = {
        "benchmarks/results/suite/runs/fabric_logs/sac-hopper-seed3/checkpoints/step_000000367000.ckpt": 40,
        "benchmarks/results/sb3/checkpoints/sac-walker2d-seed1/replay.pkl": 300,
    }
    for path, mib in saves.items():
        (tmp_path / path).parent.mkdir(parents=True)
        with (tmp_path / path).open("wb") as file:
            file.truncate(mib * 2**20)  # sparse: the size counts, not the disk it takes

    def run(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run(arguments, cwd=tmp_path, capture_output=True, text=True)

    def ignored(path: str) -> bool:
        return run("git", "check-ignore", "-q", path).returncode == 0

    run("git", "init", "-q")
    assert not any(ignored(path) for path in saves)
    excluded = run("bash", "benchmarks/device_tree.sh", "exclude")
    assert excluded.returncode == 0 and "a device call takes 0 MiB of its 64" in excluded.stdout, excluded.stderr
    assert all(ignored(path) for path in saves)
    assert run("bash", "benchmarks/device_tree.sh", "restore").returncode == 0
    assert not any(ignored(path) for path in saves)
    assert not list((tmp_path / "benchmarks" / "results").rglob(".gitignore"))
    with (tmp_path / "big.bin").open("wb") as file:  # anything else that would travel still counts
        file.truncate(65 * 2**20)
    over = run("bash", "benchmarks/device_tree.sh", "exclude")
    assert over.returncode == 1 and "over the limit" in over.stderr and "takes 65 MiB" in over.stdout


def test_an_interrupted_launch_stops_the_study_with_one_line_and_no_row(tmp_path):
    interrupted = [sys.executable, "-c", "print('interrupted at step 64: checkpoint written to runs/run')"]
    with pytest.raises(SystemExit, match="resumes from its newest checkpoint"):
        resumable.run_all([resumable.Run("run", lambda: interrupted, {})], tmp_path)
    assert not resumable.row_file(tmp_path, "run").exists()


def test_the_hyperparameters_page_is_generated_from_the_rows_as_they_are():
    written = suite.HYPERPARAMETERS_PAGE.read_text()
    assert written == suite.hyperparameters_page(), "regenerate: python benchmarks/suite.py --hyperparameters"
    assert (
        "| --use-sde | " in written
        and "| --net-arch | 256 256 | 256 256 | 256 256 | 400 300 | 400 300 | 256 256 |" in written
    )


def test_a_comparison_against_a_revision_alternates_which_tree_runs_first(capsys):
    import launch

    baseline, order = Path("/checkout/of/REV"), []

    def speed_in(run: str, tree: Path) -> float:
        order.append((run, "this" if tree == launch.REPO else "REV"))
        return 300.0 if tree == launch.REPO else 200.0

    ratios = launch.alternated_ratios(["ppo", "sac"], speed_in, baseline, "REV", rounds=2)
    assert ratios == {"ppo": [1.5, 1.5], "sac": [1.5, 1.5]}
    assert order == [
        *[("ppo", "REV"), ("ppo", "this"), ("sac", "REV"), ("sac", "this")],
        *[("ppo", "this"), ("ppo", "REV"), ("sac", "this"), ("sac", "REV")],
    ]
    assert "round 2, sac: REV 200, this tree 300 env steps/s (1.500x)" in capsys.readouterr().out
