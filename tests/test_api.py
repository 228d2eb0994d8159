"""The library: `rl.train` in this process or in each rank of a launched script, `rl.preset`, `rl.load_config`,
`rl.load_agent`."""

import copy
import dataclasses
import json
import pickle
import re
import subprocess
import sys
import warnings
from datetime import datetime
from pathlib import Path

import envs_for_tests  # noqa: F401  (registers the tests' envs)
import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from conftest import (
    SCRIPTS,
    all_scalars,
    child_env,
    launch_together,
    load_agent,
    refusal_line,
    run_dir,
    run_ranks,
    scalars_per_file,
)

import rl
from rl.api import completed
from rl.cli import parse_config

SCRIPT = """
import sys
import rl

config = rl.preset("cartpole", total_timesteps=2048, update_epochs=2, eval_episodes=0, progress_bar=False, seed=7)
result = rl.train(config)
sys.stdout.write(f"agent: {result.agent_path}\\n")  # one write: ranks share the pipe
"""


def test_a_script_that_calls_train_in_each_rank_trains_as_the_command_line_does(tmp_path):
    script = tmp_path / "train_from_python.py"
    script.write_text(SCRIPT)
    flags = [
        "--preset",
        "cartpole",
        "--total-timesteps",
        "2048",
        "--update-epochs",
        "2",
        "--eval-episodes",
        "0",
        "--no-progress-bar",
        "--seed",
        "7",
    ]
    (tmp_path / "api").mkdir()
    (tmp_path / "cli").mkdir()
    from_python, from_command_line = launch_together(
        ("fabric run", script, [], tmp_path / "api", 2),
        ("fabric run", SCRIPTS["fabric"], flags, tmp_path / "cli", 2),
        via=run_ranks,
    )
    assert from_python.returncode == 0, from_python.stderr[-3000:]
    assert from_command_line.returncode == 0, from_command_line.stderr[-3000:]
    assert from_python.stdout.count("agent: ") == 2  # every rank's train() returned
    api, cli = (load_agent(run_dir(tmp_path / name, "fabric"))["policy"] for name in ("api", "cli"))
    assert all(torch.equal(api[name], cli[name]) for name in cli)


IN_ONE_PROCESS = """
import json
import signal
import threading
import rl

if __name__ == "__main__":  # Hogwild's workers import this file again
    ctrl_c = signal.getsignal(signal.SIGINT)
    sac = rl.train(rl.SACConfig(total_timesteps=300, learning_starts=100, batch_size=32, eval_episodes=2,
                                progress_bar=False, torch_threads=1))
    recurrent = rl.train(rl.PPOConfig(recurrent=True, total_timesteps=256, eval_episodes=0, progress_bar=False))
    rl.train(rl.PPOConfig(total_timesteps=1024, workers=2, eval_episodes=0, progress_bar=False), mode="hogwild")
    ctrl_c_kept = signal.getsignal(signal.SIGINT) is ctrl_c  # a notebook's Ctrl-C interrupts its cells again
    in_a_thread = []  # where no signal handler can be set
    config = rl.PPOConfig(total_timesteps=256, eval_episodes=0, progress_bar=False)
    thread = threading.Thread(target=lambda: in_a_thread.append(rl.train(config).global_step))
    thread.start()
    thread.join()
    print(json.dumps({"sac": sac.__dict__, "recurrent": recurrent.__dict__, "ctrl_c_kept": ctrl_c_kept,
                      "in_a_thread": in_a_thread}))
"""


def test_train_in_one_process_returns_its_runs_and_the_agents_they_saved(tmp_path):
    script = tmp_path / "in_one_process.py"
    script.write_text(IN_ONE_PROCESS)
    finished = run_ranks("python", script, [], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    results = json.loads(finished.stdout.strip().splitlines()[-1])
    sac, recurrent = results["sac"], results["recurrent"]
    assert sac["global_step"] == 300 and sac["agent_path"].startswith(sac["run_dir"])
    assert set(sac["evaluation"]) == {"Test/return_mean", "Test/return_std", "Test/length_mean"}
    agent = rl.load_agent(sac["agent_path"])
    action, state = agent.predict(np.zeros(3, dtype=np.float32))
    assert action.shape == (1,) and state is None
    returns, lengths = agent.evaluate(episodes=2, seed=42)  # the run's own final evaluation (its seed: 42)
    assert returns.mean() == sac["evaluation"]["Test/return_mean"] and lengths.tolist() == [200, 200]
    for episodes in (0, 1.5, True):
        with pytest.raises(ValueError, match=f"episodes must be a positive whole number, got {episodes}"):
            agent.evaluate(episodes=episodes)
    with pytest.raises(ValueError, match=r"seed must be a whole number from 0 to 2\*\*63 - 1, got -1"):
        agent.evaluate(episodes=1, seed=-1)  # numpy's own error did not name it
    with pytest.raises(ValueError, match="is a file: give a folder to record the first episode in"):
        agent.evaluate(episodes=1, video_dir=__file__)
    assert rl.load_agent(recurrent["agent_path"]).recurrent  # its minibatch defaulted to one sequence, as on the CLI
    # what a notebook shows of an agent: not its networks
    shown = "policy for Pendulum-v1: observes a Box of shape (3,), acts in a Box of shape (1,), on cpu"
    assert repr(agent) == f"Agent({shown})"
    shown = "recurrent policy for CartPole-v1: observes a Box of shape (4,), acts in Discrete(2), on cpu"
    assert repr(rl.load_agent(recurrent["agent_path"])) == f"Agent({shown})"
    assert results["ctrl_c_kept"]  # training listens for Ctrl-C only while it runs
    assert results["in_a_thread"] == [256]


def test_a_resumed_config_takes_the_runs_own_values_where_it_leaves_the_defaults(tmp_path):
    logs = str(tmp_path / "logs")
    quick = {"eval_episodes": 0, "progress_bar": False, "log_dir": logs}
    first = rl.train(rl.PPOConfig(num_envs=2, num_steps=64, hidden_size=32, total_timesteps=256, **quick))
    (checkpoint,) = sorted(Path(first.run_dir, "checkpoints").glob("step_*.ckpt"))
    assert first.checkpoint_path == str(checkpoint)  # the checkpoint it wrote as it ended
    # Its envs and network, which cannot change, come from the run; the steps given here stand.
    resumed = rl.train(rl.PPOConfig(resume_from=first.checkpoint_path, total_timesteps=512, **quick))
    assert resumed.global_step == 512 and resumed.run_dir == first.run_dir
    assert resumed.checkpoint_path.endswith("step_000000000512.ckpt")


def test_a_named_run_resumed_by_its_name_takes_its_own_values_where_the_config_leaves_the_defaults(tmp_path):
    quick = {"eval_episodes": 0, "progress_bar": False, "log_dir": str(tmp_path / "logs"), "run_name": "mine"}
    rl.train(rl.PPOConfig(num_envs=2, num_steps=64, gamma=0.95, total_timesteps=256, **quick))
    resumed = rl.train(rl.PPOConfig(total_timesteps=512, learning_rate=1e-3, **quick))
    assert resumed.global_step == 512 and Path(resumed.run_dir).name == "mine"
    config = torch.load(resumed.checkpoint_path, weights_only=True)["config"]
    assert (config["num_envs"], config["num_steps"], config["gamma"]) == (2, 64, 0.95)  # the run's own
    assert config["learning_rate"] == 1e-3  # given here


def test_a_config_built_by_hand_keeps_the_fields_its_builder_named_at_their_default_values(tmp_path):
    """`rl.SACConfig(cuda=True, cuda_graphs=False)` trains without graphs, as `--cuda --no-cuda-graphs` does, also
    once copied; a field it leaves unnamed follows `cuda`. On resume, a field named at its default value stands
    where the run's own value would fill an unnamed one."""
    named = rl.SACConfig(cuda=True, cuda_graphs=False, update_while_stepping=False)
    copies = [dataclasses.replace(named, seed=3), copy.deepcopy(named), pickle.loads(pickle.dumps(named))]
    for config in [named, *copies]:
        done = completed(config, "coupled")
        assert not done.cuda_graphs and not done.came_by_default("cuda_graphs")
        assert not done.update_while_stepping and not done.came_by_default("update_while_stepping")
    unnamed = completed(rl.SACConfig(cuda=True, update_while_stepping=False), "coupled")
    assert unnamed.cuda_graphs and unnamed.came_by_default("cuda_graphs")
    assigned = rl.SACConfig(cuda=True)
    assigned.cuda_graphs = False  # as if built with it
    assert not completed(assigned, "coupled").cuda_graphs
    quick = {"num_envs": 2, "num_steps": 64, "eval_episodes": 0, "progress_bar": False, "log_dir": str(tmp_path)}
    default_rate = rl.PPOConfig().learning_rate
    first = rl.train(rl.PPOConfig(total_timesteps=128, learning_rate=default_rate / 10, **quick))
    resumed = {"resume_from": first.checkpoint_path, "total_timesteps": 256, **quick}
    assert completed(rl.PPOConfig(**resumed), "coupled").learning_rate == default_rate / 10
    assert completed(rl.PPOConfig(learning_rate=default_rate, **resumed), "coupled").learning_rate == default_rate


def test_a_run_after_a_named_one_in_the_same_process_leaves_that_runs_journal_alone(tmp_path):
    quick = {"num_envs": 2, "num_steps": 64, "eval_episodes": 0, "progress_bar": False, "log_dir": str(tmp_path)}
    named = rl.train(rl.PPOConfig(total_timesteps=256, run_name="named", **quick))
    journal = [Path(named.run_dir, name) for name in ("elastic.jsonl", "elastic.step")]
    before = [path.read_text() for path in journal]
    other = rl.train(rl.PPOConfig(total_timesteps=512, **quick))  # a folder named at its start keeps no journal
    assert other.run_dir != named.run_dir
    assert [path.read_text() for path in journal] == before


@pytest.mark.parametrize("mode", ["coupled", "hogwild"])
def test_a_named_run_launched_again_after_it_finished_says_it_trains_nothing(tmp_path, capfd, mode):
    config = rl.PPOConfig(
        num_envs=2, num_steps=64, total_timesteps=256, eval_episodes=1, progress_bar=False, run_name="same"
    )
    config.log_dir = str(tmp_path / "logs")
    first = rl.train(config, mode=mode)
    assert "training loop: 256 steps in" in capfd.readouterr().out
    # Launched again, say with another learning rate: it only evaluates again, and says so; with no step trained,
    # it has no loop speed to print or log.
    again = rl.train(dataclasses.replace(config, learning_rate=0.1), mode=mode)
    assert again.global_step == first.global_step == 256
    printed = [line for line in capfd.readouterr().out.splitlines() if not line.startswith("hogwild: ")]
    assert printed[0] == (
        "this run already trained to step 256: nothing is left to train but its closing evaluation "
        "(a larger --total-timesteps trains on)"
    )
    assert len(printed) == 2 and printed[1].startswith("evaluation over 1 greedy episode")
    speeds = [points for points in scalars_per_file(Path(first.run_dir), "Perf/loop_steps_per_second") if points]
    assert [[step for step, _ in points] for points in speeds] == [[256]]  # the first launch's alone


def test_a_named_run_that_stopped_at_its_target_return_launched_again_trains_nothing_unless_the_target_rises(
    tmp_path, capsys
):
    config = rl.PPOConfig(num_envs=2, num_steps=64, total_timesteps=4096, eval_episodes=1, progress_bar=False)
    config.eval_every, config.stop_at_return, config.run_name = 256, -1.0, "target"  # reached at the first
    config.log_dir = str(tmp_path / "logs")
    first = rl.train(config)
    assert first.global_step == 256
    capsys.readouterr()
    again = rl.train(config)
    assert again.global_step == 256
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("this run already reached")]
    assert said == [
        "this run already reached --stop-at-return -1 at step 256 (a greedy return of "
        f"{torch.load(first.best_agent_path, weights_only=True)['eval_return']:.2f}): nothing is left to train but "
        "its closing evaluation (a higher --stop-at-return trains on)"
    ]
    assert rl.train(dataclasses.replace(config, stop_at_return=1e9)).global_step == 4096  # out of reach: trains on


def test_total_timesteps_between_two_rollouts_trains_the_whole_ones_says_so_and_resumes_only_past_them(
    tmp_path, capsys
):
    config = rl.PPOConfig(
        num_envs=2, num_steps=64, total_timesteps=300, eval_episodes=0, progress_bar=False, run_name="between"
    )
    config.log_dir = str(tmp_path / "logs")
    first = rl.train(config)  # rollouts of 128 steps: two fit in 300
    assert first.global_step == 256
    rounded = (
        "--total-timesteps 300 is not a whole number of global rollouts (128 env steps each): the run trains 256 steps"
    )
    assert rounded in capsys.readouterr().out.splitlines()
    # Launched again: the third rollout would pass 300, so nothing is left to train, and it says so.
    again = rl.train(config)
    assert again.global_step == 256
    assert capsys.readouterr().out.splitlines()[0].startswith("this run already trained to step 256: nothing is left")
    # Resumed by hand with a total that still ends inside the third rollout: refused, naming the total that trains on.
    by_hand = dataclasses.replace(config, run_name=None, resume_from=first.checkpoint_path, total_timesteps=380)
    with pytest.raises(rl.UsageError) as refused:
        rl.train(by_hand)
    assert str(refused.value) == (
        "total_timesteps (--total-timesteps): the checkpoint is already at step 256, the last whole global rollout "
        "(128 steps) within 380; ask for 384 or more to resume"
    )
    assert rl.train(dataclasses.replace(by_hand, total_timesteps=384)).global_step == 384


def test_periodic_evaluations_keep_the_best_agent_which_a_resumed_run_replaces_only_with_a_better_one(tmp_path):
    quick = {"num_envs": 2, "num_steps": 64, "eval_every": 128, "eval_episodes": 2, "progress_bar": False}
    config = rl.PPOConfig(total_timesteps=512, run_name="best", log_dir=str(tmp_path / "logs"), **quick)
    first = rl.train(config)
    kept = torch.load(first.best_agent_path, weights_only=True)
    means = all_scalars(Path(first.run_dir), "Eval/return_mean")
    assert kept["eval_return"] == pytest.approx(max(means.values()), rel=1e-6) and means[kept["eval_step"]] == max(
        means.values()
    )
    # The kept agent replays to its score: it is the policy as it was at that evaluation.
    returns, _ = rl.load_agent(first.best_agent_path).evaluate(episodes=2, seed=config.seed)
    assert returns.mean() == kept["eval_return"]

    def resumed_with_kept_score(score: float, total_timesteps: int) -> None:
        kept["eval_return"] = score
        torch.save(kept, first.best_agent_path)
        rl.train(dataclasses.replace(config, total_timesteps=total_timesteps))  # evaluates at total - 128

    resumed_with_kept_score(1e9, 768)  # out of reach: the file stays as it is
    assert torch.load(first.best_agent_path, weights_only=True)["eval_return"] == 1e9
    assert all_scalars(Path(first.run_dir), "Eval/best_return")[640] == 1e9
    resumed_with_kept_score(-1e9, 1024)  # beaten by the resumed run's first evaluation
    replaced = torch.load(first.best_agent_path, weights_only=True)
    assert replaced["eval_step"] == 896 and replaced["eval_return"] > -1e9


def test_runs_of_one_config_started_within_the_same_second_keep_folders_and_agents_of_their_own(tmp_path, monkeypatch):
    same_second = datetime(2026, 1, 1, 12, 0, 0)  # a run named at its start is named by the second
    monkeypatch.setattr("rl.run.datetime", type("FrozenClock", (), {"now": staticmethod(lambda: same_second)}))
    config = rl.PPOConfig(num_envs=2, num_steps=64, total_timesteps=256, eval_episodes=0, progress_bar=False)
    config.log_dir = str(tmp_path / "logs")
    first, second = rl.train(config), rl.train(dataclasses.replace(config, learning_rate=0.1))
    assert Path(second.run_dir).name == f"{Path(first.run_dir).name}_2"
    assert load_agent(Path(first.run_dir))["config"]["learning_rate"] != 0.1  # not overwritten by the second
    assert load_agent(Path(second.run_dir))["config"]["learning_rate"] == 0.1


def test_presets_and_bad_configs_as_the_command_line_has_them():
    assert rl.preset("sac/hopper", seed=3).seed == 3 and isinstance(rl.preset("sac/hopper"), rl.SACConfig)
    assert rl.preset("masked-cartpole").per_rank_batch_size == 128
    with pytest.raises(rl.UsageError, match="there is no preset 'nope'"):
        rl.preset("nope")
    with pytest.raises(rl.UsageError, match=r"^num_envs \(--num-envs\): must be positive, got 0$"):
        rl.train(rl.PPOConfig(num_envs=0))


def test_a_run_whose_loss_stops_being_finite_raises_an_error_the_library_names(tmp_path):
    """rl.TrainingDiverged, which a caller that trains many configs (a search of its own) catches by name."""
    config = rl.PPOConfig(
        env_id="envs_for_tests:Misbehaves-v0",
        env_kwargs={"after": 0, "fault": "huge_reward"},
        total_timesteps=1024,
        eval_episodes=0,
        progress_bar=False,
        log_dir=str(tmp_path),
    )
    with pytest.raises(rl.TrainingDiverged) as diverged:
        rl.train(config)
    assert str(diverged.value) == "the gradient norm is not finite (a loss became NaN or infinite)"


def test_the_librarys_names_are_listed_for_tab_completion_and_a_star_import_though_they_load_on_first_use():
    names = {"train", "preset", "load_config", "load_agent", "PPOConfig", "SACConfig", "Callback", "UsageError"}
    names |= {"RunStopped", "TrainingDiverged", "Agent", "TrainingResult", "LoopState"}
    assert names <= set(dir(rl))
    assert not {"os", "time", "LIBRARY", "PROCESS_STARTED"} & set(dir(rl))  # what the package uses itself
    assert "cli" in dir(rl)  # a submodule, loaded by now
    star: dict = {}
    exec("from rl import *", star)
    assert names <= set(star) and star["train"] is rl.train


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU loads the agent there")
def test_an_agent_asked_onto_a_gpu_this_machine_lacks_is_refused_naming_the_device():
    """Before the file is read, and in place of torch's assertion that it was not compiled with CUDA."""
    agent = Path(__file__).parent / "data" / "checkpoint-v1" / "agent.ckpt"
    with pytest.raises(rl.UsageError, match=r"^device: no CUDA GPU is available on this machine$"):
        rl.load_agent(agent, device="cuda")
    assert rl.load_agent(agent, device="cpu").predict(np.zeros(4, dtype=np.float32))[0] in (0, 1)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="a Mac's torch has the mps device")
@pytest.mark.parametrize(
    ("device", "told"),
    [("gpu", "'gpu' names no device: give cpu or cuda"), ("mps", "no mps device is available on this machine")],
)
def test_an_agent_asked_onto_a_device_torch_cannot_use_here_is_refused_naming_the_device(device, told):
    agent = Path(__file__).parent / "data" / "checkpoint-v1" / "agent.ckpt"
    with pytest.raises(rl.UsageError, match=f"^device: {told}$"):
        rl.load_agent(agent, device=device)


@pytest.mark.parametrize(
    ("name", "changes", "told"),
    [
        ("cartpole", {"num_envs": "four"}, "num_envs (--num-envs): 'four' is not a whole number"),
        (
            "cartpole",
            {"vector_mode": "fast"},
            "vector_mode (--vector-mode): 'fast' is not one of auto, sync, async, native, envpool",
        ),
        ("cartpole", {"num_env": 4}, "num_env: PPOConfig has no such field: did you mean num_envs?"),
        (
            "sac/pendulum",
            {"learning_rate": 1e-3},
            "learning_rate: SACConfig has no such field: Stable-Baselines3's name; give SAC's two rates, policy_lr and "
            "q_lr (the same value for both)",
        ),
        # Another program's name is answered as code spells this one's: fields, not flags.
        (
            "cartpole",
            {"num_minibatches": 4},
            "num_minibatches: PPOConfig has no such field: CleanRL's name; give the minibatch's size instead: "
            "per_rank_batch_size, num_envs x num_steps / num_minibatches",
        ),
        (
            "cartpole",
            {"algo": "sac"},
            'algo: PPOConfig has no such field: rl-zoo\'s name; rl.SACConfig(...), or rl.preset("sac/NAME")',
        ),
        (
            "cartpole",
            {"track": True},
            'track: PPOConfig has no such field: CleanRL\'s name; logger=("tensorboard", "wandb")',
        ),
        ("td3/hopper", {}, "preset (--preset): there is no algorithm 'td3'"),
        # rl-zoo keys its hyperparameters by env id
        ("CartPole-v1", {}, "; CartPole-v1 is an env's id: give --preset cartpole (or --env-id CartPole-v1)"),
        ("Taxi-v3", {}, "; Taxi-v3 is an env's id: give --env-id Taxi-v3"),
        ("ALE/Pong-v5", {}, "; ALE/Pong-v5 is an env's id: give --env-id ALE/Pong-v5"),  # no algorithm "ALE"
        ("sac/ALE/Pong-v5", {}, "for this algorithm; choose from pendulum, halfcheetah"),  # SAC's presets
        ("ale/pong", {}, "preset (--preset): there is no algorithm 'ale'; name one of ppo, sac"),
        ("cartpole", {"env_id": gym.Env}, "is not text: give the env's registered id, such as 'CartPole-v1'"),
    ],
)
def test_a_preset_with_a_value_of_another_type_or_no_such_field_is_refused_naming_it(name, changes, told):
    with pytest.raises(rl.UsageError, match=re.escape(told)):
        rl.preset(name, **changes)


def test_a_preset_named_by_no_text_is_refused_as_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"^preset takes a preset's name, such as 'cartpole' or 'sac/hopper'; got None"):
        rl.preset(None)


@pytest.mark.parametrize(
    ("preset", "attribute", "told"),
    [
        ("sac/pendulum", "learning_rate", "learning_rate: SACConfig has no such field: Stable-Baselines3's name"),
        ("cartpole", "total_timestep", "total_timestep: PPOConfig has no such field: did you mean total_timesteps?"),
    ],
)
def test_an_attribute_set_on_a_config_that_is_none_of_its_fields_is_refused_not_ignored(preset, attribute, told):
    """A dataclass takes any attribute: without the check, a misspelt or another program's name trains as if unset."""
    config = rl.preset(preset, total_timesteps=256, eval_episodes=1, run_name="stray")
    setattr(config, attribute, 1e-3)
    with pytest.raises(rl.UsageError, match=re.escape(told)):
        rl.train(config)


@pytest.mark.parametrize(
    ("changes", "mode", "told"),
    [
        (
            {"workers": 2},
            "coupled",
            'workers (--workers): belongs to Hogwild mode: rl.train(config, mode="hogwild"); coupled mode takes its '
            "default, 1",
        ),
        (
            {"pipeline": True},
            "hogwild",
            'pipeline (--pipeline): belongs to decoupled mode: rl.train(config, mode="decoupled"); Hogwild mode takes '
            "its default, False",
        ),
    ],
)
def test_a_field_of_another_mode_is_refused_with_the_mode_to_train_it_in(tmp_path, monkeypatch, changes, mode, told):
    monkeypatch.chdir(tmp_path)
    config = rl.preset("cartpole", total_timesteps=512, eval_episodes=0, progress_bar=False, **changes)
    with pytest.raises(rl.UsageError) as error:
        rl.train(config, mode=mode)
    assert str(error.value) == told
    assert not (tmp_path / "logs").exists()


def test_a_run_whose_log_dir_starts_with_a_tilde_writes_all_its_files_in_the_users_home(tmp_path, monkeypatch):
    """Python's open() takes ~ as a folder's name, where TensorBoard's writer expands it: the run split in two."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    config = rl.PPOConfig(log_dir="~/runs", run_name="tilde", total_timesteps=256, eval_episodes=0, progress_bar=False)
    result = rl.train(config)
    folder = home / "runs" / "fabric_logs" / "tilde"
    written = {path.name for path in folder.iterdir()}
    assert result.run_dir == str(folder) and {"agent.ckpt", "config.yaml", "checkpoints"} <= written
    assert any(name.startswith("events.out.tfevents") for name in written)  # TensorBoard's, beside them
    assert not any(elsewhere.iterdir())  # no folder named ~ here
    assert rl.load_agent("~/runs/fabric_logs/tilde/agent.ckpt").env_id == "CartPole-v1"


def test_a_config_file_loads_as_its_algorithms_config_with_overrides_as_the_command_line_reads_it(tmp_path):
    from rl.config_files import write_config_file

    path = str(tmp_path / "best.yaml")
    write_config_file(rl.preset("sac/hopper"), path)
    loaded = rl.load_config(path, seed=7, learning_starts=500)
    assert loaded == dataclasses.replace(parse_config(["--config", path]), seed=7, learning_starts=500)
    assert type(loaded) is rl.SACConfig and loaded.env_id == "Hopper-v5" and loaded.seed == 7
    with pytest.raises(rl.UsageError, match="update_epochs: SACConfig has no such field"):
        rl.load_config(path, update_epochs=3)
    with pytest.raises(rl.UsageError, match=r"^seed \(--seed\): 'seven' is not a whole number"):
        rl.load_config(path, seed="seven")
    with pytest.raises(rl.UsageError, match="cannot read"):
        rl.load_config(str(tmp_path / "missing.yaml"))
    assert rl.load_config(Path(path)) == rl.load_config(path)  # a path as pathlib gives it
    (tmp_path / "config.yaml").write_text(Path(path).read_text())  # as a run's folder holds its flags
    with pytest.raises(rl.UsageError, match=f"is a run's folder: give its {re.escape(str(tmp_path / 'config.yaml'))}"):
        rl.load_config(tmp_path)


def test_a_preset_given_to_load_config_goes_beneath_the_file_as_on_the_command_line(tmp_path):
    """Not a label on top: a file of a few flags takes the preset's others, and a file of another preset's flags,
    which would override all of it, is refused."""
    from rl.config_files import write_config_file

    few = tmp_path / "few.yaml"
    few.write_text("num_envs: 2\n")
    config = rl.load_config(str(few), preset="cartpole")
    assert (config.preset, config.num_envs, config.num_steps) == ("cartpole", 2, rl.preset("cartpole").num_steps)
    hopper = tmp_path / "hopper.yaml"
    write_config_file(rl.preset("hopper"), str(hopper))
    with pytest.raises(rl.UsageError, match="holds the flags of a run with preset hopper"):
        rl.load_config(str(hopper), preset="cartpole")


def test_a_config_built_by_hand_takes_its_fields_types_as_a_config_file_does():
    """A lone logger is a one-item tuple (a string would be read letter by letter), numbers as text are numbers."""
    with pytest.raises(rl.UsageError, match=re.escape("logger (--logger): ('nope',) is not a list, each one of")):
        rl.train(rl.PPOConfig(logger=("nope",)))
    config = rl.preset("cartpole", logger="csv", learning_rate="3e-4")
    assert config.logger == ("csv",) and config.learning_rate == 3e-4


def test_the_getting_started_walk_through_runs(tmp_path):
    """The page's notebook-style example, shortened to 4,096 steps, in a process of its own."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "index.md").read_text()
    code = re.search(r"## From Python.*?```python\n(.*?)```", page, re.S).group(1)
    assert "50_000" in code
    script = tmp_path / "walk_through.py"
    script.write_text("import matplotlib\nmatplotlib.use('Agg')\n" + code.replace("50_000", "4_096"))
    finished = run_ranks("python", script, [], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "'Test/return_mean'" in finished.stdout


def test_the_callback_example_stops_the_run_when_asked(tmp_path):
    page = (Path(__file__).resolve().parents[1] / "docs" / "index.md").read_text()
    code = re.search(r"### Callbacks.*?```python\n(.*?)```", page, re.S).group(1)
    assert ">= 475" in code and "50_000" in code
    script = tmp_path / "callback.py"
    script.write_text(code.replace(">= 475", ">= 0"))  # met at the first report that has an episode
    finished = run_ranks("python", script, [], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert int(finished.stdout.strip().splitlines()[-1]) < 50_000


def test_dict_observations_of_vectors_train_flattened_and_the_agent_takes_them_as_the_env_gives_them(tmp_path):
    args = [
        "--env-id",
        "envs_for_tests:DictCartPole-v0",
        "--total-timesteps",
        "1024",
        "--eval-episodes",
        "1",
        "--no-progress-bar",
    ]
    finished = run_ranks("python", SCRIPTS["fabric"], args, tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    agent = rl.load_agent(run_dir(tmp_path, "fabric") / "agent.ckpt")
    assert agent.observation_space.shape == (6,)  # the cart's 2, the pole's 2, a one-hot of 2 sides
    env = gym.make(agent.env_id)
    obs, _ = env.reset(seed=0)
    one, _ = agent.predict(obs)
    batch, _ = agent.predict([obs, obs])
    flat, _ = agent.predict(gym.spaces.flatten(env.observation_space, obs))
    assert batch.tolist() == [one, one] and flat == one
    envs = gym.make_vec(agent.env_id, num_envs=3)
    stacked, _ = envs.reset(seed=0)  # each key's values stacked, the batch first
    each = list(gym.vector.utils.iterate(envs.observation_space, stacked))
    assert agent.predict(stacked)[0].tolist() == agent.predict(each)[0].tolist()
    made, _ = agent.make_env().reset(seed=0)
    assert set(made) == set(obs) and agent.predict(made)[0] == one  # the env's own Dicts, as predict takes them
    empty = {key: values[:0] for key, values in stacked.items()}
    assert agent.predict([])[0].shape == agent.predict(empty)[0].shape == (0,)  # an empty batch: no actions
    for not_its_observation in ({"cart": obs["cart"]}, np.zeros(5), "cart"):
        with pytest.raises(ValueError, match=r"is not an observation of Dict\('cart'"):
            agent.predict(not_its_observation)


def test_the_agents_env_gives_the_observations_its_run_trained_on_with_the_time_feature_and_env_keywords(tmp_path):
    args = ["--env-id", "Pendulum-v1", "--time-feature", "--env-kwarg", "g=4.0", "--total-timesteps", "512"]
    finished = run_ranks("python", SCRIPTS["fabric"], [*args, "--eval-episodes", "2", "--no-progress-bar"], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    agent = rl.load_agent(run_dir(tmp_path, "fabric") / "agent.ckpt")
    env = agent.make_env()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4,) and obs[-1] == 0.0 and env.unwrapped.g == 4.0  # the time elapsed, appended
    for _ in range(3):
        obs, *_ = env.step(agent.predict(obs)[0])
    assert obs[-1] == 3 / 200
    with pytest.raises(ValueError, match=r"shape \(3,\): this agent takes \(4,\), .* as the env that agent.make_env"):
        agent.predict(gym.make("Pendulum-v1").reset(seed=0)[0])  # without the time feature


def test_an_observation_space_it_cannot_take_is_named_in_one_line(tmp_path):
    line = refusal_line("fabric", ["--env-id", "envs_for_tests:TextObservations-v0"], tmp_path)
    assert line.startswith("error: --env-id: observation space Text(") and "a Dict or Tuple of vectors" in line


def test_cuda_graphs_follow_the_fields_until_chosen():
    """As on the command line: on with cuda where they can serve, and a choice given to `rl.preset` is kept when
    `rl.train` fills the defaults again; a default is chosen anew from the fields as they are then."""
    from rl.config import check_cuda_graphs

    chosen = rl.preset("cartpole", cuda=True, cuda_graphs=False)
    by_default = rl.preset("cartpole", cuda=True)
    assert not chosen.cuda_graphs and by_default.cuda_graphs
    by_default.precision = "16-mixed"  # which graphs cannot serve
    for config in (chosen, by_default):
        config = completed(config, "coupled")  # as rl.train takes it
        assert not config.cuda_graphs
        check_cuda_graphs(config)
    later_on_a_gpu = rl.preset("cartpole")
    later_on_a_gpu.cuda = True
    later_on_a_gpu.fill_defaults({"cuda"})
    assert later_on_a_gpu.cuda_graphs


def test_a_loaded_config_with_overrides_keeps_its_defaults_following_the_fields(tmp_path):
    """rl.load_config's overrides are choices; the defaults that followed --cuda still follow it, so a decoupled
    run does not refuse SAC's --update-while-stepping that came with --cuda."""
    from rl.config import validate_decoupled
    from rl.config_files import write_config_file

    path = str(tmp_path / "on_a_gpu.yaml")
    write_config_file(rl.preset("sac/pendulum", cuda=True), path)
    loaded = rl.load_config(path, seed=3)
    assert loaded.update_while_stepping and loaded.came_by_default("update_while_stepping")
    validate_decoupled(loaded, world_size=2)
    chosen = rl.load_config(path, update_while_stepping=False)
    chosen.cuda = True
    chosen.fill_defaults({"cuda"})
    assert not chosen.update_while_stepping and chosen.cuda_graphs


def test_a_copied_or_edited_config_keeps_its_defaults_following_the_fields(tmp_path):
    """`dataclasses.replace` and setting a field keep track of the defaults that followed --cuda, as `rl.load_config`
    does: a copy's defaults still follow (a decoupled run does not refuse SAC's --update-while-stepping that came with
    --cuda, and a file written from the copy leaves them out), and a following field changed is chosen."""
    from rl.config import validate_decoupled
    from rl.config_files import write_config_file

    on_a_gpu = rl.preset("sac/pendulum", cuda=True)
    copy = completed(dataclasses.replace(on_a_gpu, seed=3), "decoupled")
    assert copy.came_by_default("update_while_stepping") and copy.came_by_default("cuda_graphs")
    validate_decoupled(copy, world_size=2)
    path = str(tmp_path / "copy.yaml")
    write_config_file(copy, path)
    assert not {"cuda_graphs", "update_while_stepping"} & set(yaml.safe_load(Path(path).read_text()))
    on_a_cpu = completed(dataclasses.replace(on_a_gpu, cuda=False), "coupled")  # they follow it there
    assert not on_a_cpu.cuda_graphs and not on_a_cpu.update_while_stepping
    without_graphs = completed(dataclasses.replace(on_a_gpu, cuda_graphs=False), "coupled")
    edited = rl.preset("sac/pendulum", cuda=True)
    edited.cuda_graphs = False
    built = rl.SACConfig(env_id="Pendulum-v1", cuda=True)  # built by hand: its defaults follow from the start
    assert built.cuda_graphs and built.update_while_stepping
    assert completed(dataclasses.replace(built, seed=3), "coupled").came_by_default("cuda_graphs")
    built_without_graphs = completed(dataclasses.replace(built, cuda_graphs=False), "coupled")
    for chosen in (without_graphs, completed(edited, "coupled"), built_without_graphs):
        assert not chosen.cuda_graphs and not chosen.came_by_default("cuda_graphs")
        assert chosen.update_while_stepping and chosen.came_by_default("update_while_stepping")


def test_a_resumed_runs_choice_of_a_following_field_stands_over_the_value_it_would_follow(tmp_path):
    """A run that chose SAC's --no-update-while-stepping, resumed by a config built with cuda=True (by hand or from
    a preset), keeps its choice: the value that followed cuda=True was not the caller's."""
    names = {"run_name": "chose", "log_dir": str(tmp_path / "logs"), "progress_bar": False, "eval_episodes": 0}
    short = {"total_timesteps": 64, "learning_starts": 32, "batch_size": 16, "net_arch": (8, 8)}
    rl.train(rl.SACConfig(env_id="Pendulum-v1", update_while_stepping=False, **names, **short))
    for resumed in (
        rl.SACConfig(env_id="Pendulum-v1", cuda=True, **names),
        rl.preset("sac/pendulum", cuda=True, **names),
    ):
        assert resumed.update_while_stepping  # it follows cuda=True until the run's own choice is read
        assert not completed(resumed, "coupled").update_while_stepping


def test_train_puts_back_the_torch_settings_it_changes_for_the_process(tmp_path):
    threads, deterministic = torch.get_num_threads(), torch.backends.cudnn.deterministic
    try:
        torch.set_num_threads(3)
        torch.backends.cudnn.deterministic = False
        config = rl.PPOConfig(total_timesteps=256, num_steps=64, eval_episodes=0, progress_bar=False)
        rl.train(dataclasses.replace(config, torch_threads=1, torch_deterministic=True, log_dir=str(tmp_path)))
        assert (torch.get_num_threads(), torch.backends.cudnn.deterministic) == (3, False)
    finally:
        torch.set_num_threads(threads)
        torch.backends.cudnn.deterministic = deterministic


FAILING_RUN = """
import multiprocessing, sys, threading
import rl

class Raises(rl.Callback):
    def on_iteration_end(self, state):
        raise RuntimeError("the callback's own error")

before = set(threading.enumerate())
config = rl.PPOConfig(total_timesteps=2048, num_steps=64, vector_mode="async", progress_bar=False, log_dir=sys.argv[1])
try:
    rl.train(config, callbacks=[Raises()])
except RuntimeError as error:
    print("raised:", error)
    kept = error  # as a notebook keeps the last error, with its traceback and the run's objects in its frames
print("threads:", sorted(t.name for t in set(threading.enumerate()) - before if t.name != "tqdm_monitor"))
print("env workers:", len(multiprocessing.active_children()))
"""


def test_a_run_that_fails_in_the_callers_process_closes_its_envs_and_logs_there(tmp_path):
    """A notebook's kernel outlives the run: its async env workers end quietly, and its log writer is closed."""
    done = subprocess.run(
        [sys.executable, "-c", FAILING_RUN, str(tmp_path)], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["raised: the callback's own error", "threads: []", "env workers: 0"]
    assert "stopped by" not in done.stderr  # the workers' SIGTERM is not the rank's


@pytest.mark.parametrize(("display", "driver"), [({"DISPLAY": ":0"}, "None"), ({}, "dummy")], ids=["x11", "headless"])
def test_the_library_keeps_pygame_off_the_display_only_where_there_is_none(display, driver):
    """With a display, a user's own `render_mode="human"` env beside a loaded agent opens its window."""
    hidden = ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")
    env = {name: value for name, value in child_env().items() if name not in hidden} | display
    code = "import os, rl; rl.load_agent; print(os.environ.get('SDL_VIDEODRIVER'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [driver]


@pytest.mark.parametrize("shape", [[2, 3], []], ids=["matrix", "scalar"])
def test_a_loaded_agent_takes_the_envs_own_observations_of_a_box_that_training_flattened(tmp_path, shape):
    args = ["--env-id", "envs_for_tests:BoxOfShape-v0", "--env-kwargs", json.dumps({"shape": shape})]
    finished = run_ranks(
        "python",
        SCRIPTS["fabric"],
        [*args, "--total-timesteps", "256", "--eval-episodes", "0", "--no-progress-bar"],
        tmp_path,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    agent = rl.load_agent(run_dir(tmp_path, "fabric") / "agent.ckpt")
    env = gym.make(agent.env_id, shape=shape)
    observations = np.stack([env.observation_space.sample() for _ in range(4)])
    flat = observations.reshape(4, -1)
    batch, _ = agent.predict(observations)
    assert batch.tolist() == agent.predict(flat)[0].tolist()
    assert [agent.predict(one)[0] for one in observations] == batch.tolist()


def test_train_refuses_a_mode_it_does_not_have_and_what_is_no_config_before_training(tmp_path):
    config = rl.PPOConfig(total_timesteps=256, eval_episodes=0, progress_bar=False, log_dir=str(tmp_path))
    with pytest.raises(ValueError, match="mode must be one of coupled, decoupled, hogwild, got 'hogwlid'"):
        rl.train(config, mode="hogwlid")
    for not_a_config in ({"env_id": "CartPole-v1"}, rl.PPOConfig):
        with pytest.raises(TypeError, match=re.escape("train takes a config, such as rl.PPOConfig(), ")):
            rl.train(not_a_config)
    assert not (tmp_path / "fabric_logs").exists()


class CountReports(rl.Callback):
    def __init__(self) -> None:
        self.reports = 0

    def on_report(self, state: rl.LoopState, scalars: dict[str, float]) -> None:
        self.reports += 1


def test_callbacks_that_are_not_rl_callbacks_are_refused_before_training_and_one_may_come_alone(tmp_path):
    config = rl.PPOConfig(total_timesteps=256, num_envs=2, num_steps=64, eval_episodes=0, progress_bar=False)
    config.log_dir = str(tmp_path)
    for not_callbacks in (lambda state: None, [object()], "on_report"):
        with pytest.raises(TypeError, match=re.escape("callbacks are rl.Callback instances (of a subclass that ")):
            rl.train(config, callbacks=not_callbacks)
    assert not (tmp_path / "fabric_logs").exists()
    alone = CountReports()
    rl.train(config, callbacks=alone)
    assert alone.reports == 2  # 256 steps of 2 envs x 64 steps: two iterations, a report each


class Misspelt(rl.Callback):
    def on_reprot(self, state, scalars):  # a slip of on_report
        raise AssertionError("never called")


class FromStableBaselines(Misspelt):
    def _on_step(self) -> bool:  # SB3's event
        return True

    def on_new_best(self) -> None:  # a helper of its own, called from an event: no warning
        pass


def test_a_callback_method_that_looks_meant_for_an_event_but_is_none_is_warned_of_at_its_line(tmp_path):
    """The loop would never call it, in silence; the warning names the event nearest, and points at the method."""
    config = rl.PPOConfig(total_timesteps=128, num_envs=2, num_steps=64, eval_episodes=0, progress_bar=False)
    config.log_dir = str(tmp_path)
    with pytest.warns(UserWarning) as warned:
        rl.train(config, callbacks=FromStableBaselines())
    events = "its events: on_iteration_start, on_iteration_end, on_report, on_evaluation, on_checkpoint, on_finish"
    assert sorted(str(warning.message) for warning in warned) == [
        "FromStableBaselines._on_step is no event of rl.Callback and is never called (Stable-Baselines3's _on_step; "
        f"here the nearest event is on_iteration_end); {events}",
        "FromStableBaselines.on_reprot is no event of rl.Callback and is never called (did you mean on_report?); "
        + events,
    ]
    assert {Path(warning.filename).name for warning in warned} == {"test_api.py"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rl.train(config, callbacks=[CountReports()])  # a callback of events alone: no such warning
    assert not [warning for warning in caught if "is no event of rl.Callback" in str(warning.message)]
