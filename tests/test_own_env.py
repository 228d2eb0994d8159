"""Your own env: `--env-id module:Env-v0`, its keyword arguments (`--env-kwargs`, `--env-kwarg`), and the API check."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import SCRIPTS, child_env, load_agent, refusal_line, run_dir, run_ranks, start_as_foreground_job

import rl
from rl import PPOConfig
from rl.cli import parse_config
from rl.config_files import check_field_types
from rl.envs import inspect_env
from rl.export import greedy_policy

OWN_ENV = [
    "--env-id",
    "envs_for_tests:FixedLength-v0",
    "--num-steps",
    "64",
    "--total-timesteps",
    "256",
    "--no-progress-bar",
    "--eval-episodes",
    "2",
]


def test_keyword_arguments_merge_json_and_key_value_pairs_read_as_json_where_they_parse():
    cfg = parse_config(
        [
            "--env-kwargs",
            '{"a": 1, "b": "x"}',
            "--env-kwarg",
            "b=true",
            "--env-kwarg",
            "c=0.5",
            "--env-kwarg",
            "d=some text",
        ]
    )
    assert cfg.make_kwargs() == {"a": 1, "b": True, "c": 0.5, "d": "some text"}
    assert dict(cfg.preprocessing().env_kwargs) == cfg.make_kwargs()


def test_keyword_arguments_may_be_a_dict_in_python_and_in_a_config_file(tmp_path):
    cfg = PPOConfig(env_kwargs={"length": 7, "name": "x"})
    check_field_types(cfg)
    assert cfg.make_kwargs() == {"length": 7, "name": "x"}
    config = tmp_path / "run.yaml"
    config.write_text("env_kwargs:\n  length: 5\n")
    assert parse_config(["--config", str(config), "--env-kwarg", "name=y"]).make_kwargs() == {"length": 5, "name": "y"}


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        (["--env-kwargs", "{length: 3}"], "--env-kwargs", "is not JSON"),
        (["--env-kwargs", "[3]"], "--env-kwargs", "must be a JSON object"),
        (["--env-kwarg", "length"], "--env-kwarg", "takes key=value"),
        ([*OWN_ENV, "--env-kwarg", "width=3"], "--env-kwarg", "takes no keyword 'width': it takes length"),  # as given
        ([*OWN_ENV, "--env-kwargs", '{"width": 3}'], "--env-kwargs", "takes no keyword 'width': it takes length"),
        (
            ["--env-kwarg", "sutton_barto_reward=true", "--vector-mode", "native"],
            "--vector-mode",
            "without --env-kwargs",
        ),
    ],
    ids=["json", "object", "key-value", "unknown-keyword", "unknown-keyword-in-json", "native"],
)
def test_bad_keyword_arguments_end_with_one_line_naming_the_flag(tmp_path, args, flag, says):
    line = refusal_line("fabric", args, tmp_path)
    assert line.startswith(f"error: {flag}: ") and says in line


class TakesAnyKeyword(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, **options: object) -> None:
        if options:
            raise TypeError(f"no options, got {sorted(options)}")


@pytest.mark.parametrize(
    ("env_id", "kwargs", "told"),
    [
        (
            "rl/TwoCues-v0",
            {"kes": "image"},
            "rl/TwoCues-v0 takes no keyword 'kes' (did you mean keys?): it takes continuous, keys and size",
        ),
        (
            "CartPole-v1",
            {"max_episode_step": 9},
            "takes no keyword 'max_episode_step' (did you mean max_episode_steps?)",
        ),
        # a keyword it takes, of a value it refuses: the env's own error
        ("rl/TwoCues-v0", {"size": "abc"}, "rl/TwoCues-v0 does not take {'size': 'abc'}: Expected all Box shape"),
        # a creator that takes any keyword: its signature tells nothing, its error tells it all
        (
            "TakesAnyKeyword-v0",
            {"width": 3},
            "TakesAnyKeyword-v0 does not take {'width': 3}: no options, got ['width']",
        ),
        # a value the constructor refuses with an error of another kind
        (
            "LunarLander-v3",
            {"gravity": 5},
            "LunarLander-v3 does not take {'gravity': 5}: AssertionError: gravity (current value: 5) must be between",
        ),
        (
            "HalfCheetah-v5",
            {"xml_file": "no_such_model.xml"},
            "does not take {'xml_file': 'no_such_model.xml'}: OSError",
        ),
    ],
)
def test_a_keyword_the_env_does_not_take_is_named_with_those_it_takes(env_id, kwargs, told):
    gym.register("TakesAnyKeyword-v0", TakesAnyKeyword)
    try:
        with pytest.raises(rl.UsageError) as error:
            inspect_env(env_id, PPOConfig(env_id=env_id, env_kwargs=json.dumps(kwargs)).preprocessing())
    finally:
        del gym.envs.registry["TakesAnyKeyword-v0"]
    assert error.value.flag == "--env-kwargs"
    assert told in str(error.value)


class FailsWhenMade(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.MultiBinary(0)  # gymnasium refuses it


def test_an_env_whose_constructor_raises_is_named_in_one_line_under_its_frames(capsys):
    gym.register("FailsWhenMade-v0", FailsWhenMade)
    try:
        with pytest.raises(rl.UsageError) as error:
            inspect_env("FailsWhenMade-v0", PPOConfig(env_id="FailsWhenMade-v0").preprocessing())
    finally:
        del gym.envs.registry["FailsWhenMade-v0"]
    assert error.value.flag == "--env-id"
    assert str(error.value) == (
        "--env-id: FailsWhenMade-v0's __init__ raised ValueError: n (counts) have to be positive, got 0"
    )
    frames = capsys.readouterr().err
    assert frames.startswith("the env raised in these frames:") and "in __init__" in frames, frames


def test_an_env_of_your_own_trains_with_its_keyword_arguments_and_evaluates_with_them_again(tmp_path):
    finished = run_ranks("python", SCRIPTS["fabric"], [*OWN_ENV, "--env-kwarg", "length=7"], tmp_path)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "evaluation over 2 greedy episodes: return 7.00 ± 0.00, length 7.0" in finished.stdout
    agent = run_dir(tmp_path, "fabric") / "agent.ckpt"
    assert load_agent(agent.parent)["config"]["env_kwarg"] == ["length=7"]
    command = [sys.executable, "-m", "rl.evaluate", str(agent), "--episodes", "3"]
    done = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 deterministic episodes: return 7.00 ± 0.00, length 7.0 ± 0.0" in done.stdout
    # Another env made with the run's keywords, which it does not take: named by the flag this tool has.
    elsewhere = subprocess.run(
        [*command, "--env-id", "CartPole-v1"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert elsewhere.returncode == 2 and elsewhere.stderr.strip() == (
        "error: --env-id: --env-kwargs of the agent's training run: CartPole-v1 takes no keyword 'length': it takes "
        "render_mode and sutton_barto_reward"
    )


def test_a_run_with_the_time_feature_evaluates_with_it_again(tmp_path):
    args = [
        "--env-id",
        "Pendulum-v1",
        "--time-feature",
        "--num-steps",
        "64",
        "--total-timesteps",
        "256",
        "--no-progress-bar",
        "--eval-episodes",
        "1",
    ]
    finished = run_ranks("python", SCRIPTS["fabric"], args, tmp_path)
    assert finished.returncode == 0, finished.stderr[-2000:]
    agent = run_dir(tmp_path, "fabric") / "agent.ckpt"
    assert load_agent(agent.parent)["config"]["time_feature"]
    command = [sys.executable, "-m", "rl.evaluate", str(agent), "--episodes", "1"]
    done = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 deterministic episode: return" in done.stdout and "length 200.0" in done.stdout
    pixels = subprocess.run(
        [*command, "--env-id", "rl/PixelCartPole-v1"], cwd=tmp_path, env=child_env(), capture_output=True, text=True
    )
    assert pixels.returncode == 2 and pixels.stderr.strip().startswith(
        "error: --env-id: --time-feature of the agent's training run: needs vector observations; rl/PixelCartPole-v1 "
        "gives Box("
    ), pixels.stderr[-2000:]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ("StepReturnsFourValues-v0", "step() must return (obs, reward, terminated, truncated, info)"),
        ("ResetTakesNoSeed-v0", "does not provide a `seed`"),
        ("ObservationsOutsideTheSpace-v0", "not within the observation space"),
    ],
)
def test_an_env_that_breaks_the_gymnasium_api_ends_with_one_line_naming_it_and_the_rule(tmp_path, env, says):
    line = refusal_line("fabric", ["--env-id", f"envs_for_tests:{env}"], tmp_path)
    assert line.startswith(f"error: --env-id: envs_for_tests:{env} breaks the gymnasium API: ") and says in line


def test_an_env_whose_close_raises_in_the_check_ends_with_one_line_naming_the_call(tmp_path):
    # The checker closes it, and so does the check's own cleanup, which must not raise it a second time.
    args = ["--env-id", "envs_for_tests:Misbehaves-v0", "--env-kwargs", '{"after": 0, "fault": "raise_on_close"}']
    line = refusal_line("fabric", args, tmp_path)
    assert line == (
        "error: --env-id: envs_for_tests:Misbehaves-v0's close raised RuntimeError: lost contact with the simulator"
    )


def docs_example(project: Path) -> list[str]:
    """Write own-env.md's example package into `project`; its command's flags."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "own-env.md").read_text()
    code = re.search(r"```python\n# my_package/my_module.py\n(.*?)```", page, re.S).group(1)
    command = re.search(r"```bash\n(python train_fabric.py --env-id my_package.my_module:MyEnv-v0[^\n]*)\n```", page)
    (project / "my_package").mkdir()
    (project / "my_package" / "__init__.py").write_text("")
    (project / "my_package" / "my_module.py").write_text(code)
    return [*command.group(1).split()[2:], "--total-timesteps", "512", "--eval-episodes", "1", "--no-progress-bar"]


def run_in_project(project: Path, args: list[str], pythonpath: str | None) -> subprocess.CompletedProcess:
    """`train_fabric.py` run from `project`, the folder a user keeps their env in, with `pythonpath`."""
    env = {**child_env(), "PYTHONPATH": pythonpath or ""}
    command = [sys.executable, str(SCRIPTS["fabric"]), *args]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=120, env=env)


def test_the_docs_example_env_trains_with_the_docs_command(tmp_path):
    done = run_in_project(tmp_path, docs_example(tmp_path), pythonpath=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "evaluation over 1 greedy episode:" in done.stdout and "length 100.0" in done.stdout


def test_an_env_module_in_the_folder_run_from_but_not_on_the_path_is_refused_saying_where_python_looks(tmp_path):
    done = run_in_project(tmp_path, docs_example(tmp_path), pythonpath=None)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --env-id: cannot import my_package (for my_package.my_module:MyEnv-v0): Python looks for it in the "
        f"entry script's folder and on PYTHONPATH, not in the current folder, which holds my_package: run with "
        f"PYTHONPATH={tmp_path}"
    )


def test_a_package_that_an_env_module_imports_is_named_as_missing(tmp_path, monkeypatch):
    (tmp_path / "needs_a_package.py").write_text("import a_package_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = refusal_line("fabric", ["--env-id", "needs_a_package:Any-v0"], tmp_path)
    assert line.startswith("error: --env-id: 'needs_a_package:Any-v0' needs a missing package: No module named ")


def test_multibinary_actions_learn_to_copy_the_bits_with_a_player_apart_from_the_trainer(tmp_path):
    """The bits travel from the player to the trainer as the rollout's actions; guessing scores 4, copying 8."""
    args = ["--env-id", "envs_for_tests:CopyBits-v0", "--total-timesteps", "8192", "--no-progress-bar"]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path)
    assert finished.returncode == 0, finished.stderr[-2000:]
    greedy = float(re.search(r"evaluation over 10 greedy episodes: return ([\d.]+)", finished.stdout).group(1))
    assert greedy > 7.5


def trained_agent(tmp_path: Path, args: list[str]) -> rl.Agent:
    finished = run_ranks("python", SCRIPTS["fabric"], [*args, "--no-progress-bar"], tmp_path, nproc=1)
    assert finished.returncode == 0, finished.stderr[-2000:]  # its evaluation stepped the env with its own actions
    return rl.load_agent(run_dir(tmp_path, "fabric") / "agent.ckpt")


def played_return(agent: rl.Agent, env: gym.Env) -> float:
    obs, _ = env.reset(seed=0)
    total, ended = 0.0, False
    while not ended:
        action, _ = agent.predict(obs)
        obs, reward, terminated, truncated, _ = env.step(action)  # the env raises on an action of another shape
        total, ended = total + reward, terminated or truncated
    return total


def test_a_matrix_of_continuous_actions_is_learned_as_one_vector_and_predicted_in_the_envs_own_shape(tmp_path):
    """Training flattens the actions and each env takes its own back; so do `predict` and the exported policy.
    Acting 0 scores -3.84, the target 0."""
    agent = trained_agent(tmp_path, ["--env-id", "envs_for_tests:ReachTheTarget-v0", "--total-timesteps", "8192"])
    assert agent.env_actions.shape == (2, 3)
    assert played_return(agent, gym.make("envs_for_tests:ReachTheTarget-v0")) > -2.0
    batch, _ = agent.predict(np.zeros((5, 1), np.float32))
    assert batch.shape == (5, 2, 3)
    assert agent.predict(np.zeros((0, 1), np.float32))[0].shape == (0, 2, 3)  # an empty batch: no actions
    exported = torch.jit.trace(greedy_policy(agent)[0], torch.zeros(2, 1))
    np.testing.assert_allclose(exported(torch.zeros(5, 1)).numpy(), batch, atol=1e-6)


def test_a_single_number_as_the_action_is_learned_as_a_vector_of_one_and_predicted_as_a_number(tmp_path):
    args = ["sac", "--env-id", "envs_for_tests:ReachTheTarget-v0", "--env-kwargs", '{"shape": []}']
    agent = trained_agent(tmp_path, [*args, "--total-timesteps", "300", "--learning-starts", "100"])
    assert agent.action_space.shape == (1,) and agent.env_actions.shape == ()
    assert agent.predict(np.zeros(1, np.float32))[0].shape == ()
    exported = torch.jit.trace(greedy_policy(agent)[0], torch.zeros(2, 1))
    assert exported(torch.zeros(3, 1)).shape == (3,)  # a number per observation, as the env takes it
    played_return(agent, agent.make_env())  # made with the run's --env-kwargs


def test_multibinary_actions_of_more_than_one_dimension_are_learned_as_one_vector_of_bits(tmp_path):
    env_args = ["--env-id", "envs_for_tests:CopyBits-v0", "--env-kwargs", '{"shape": [2, 2]}']
    agent = trained_agent(tmp_path, [*env_args, "--total-timesteps", "512"])
    assert agent.action_space.shape == (4,) and agent.env_actions.shape == (2, 2)
    bits, _ = agent.predict(np.ones((3, 2, 2), np.float32))
    assert bits.shape == (3, 2, 2) and set(np.unique(bits)) <= {0, 1}
    played_return(agent, gym.make("envs_for_tests:CopyBits-v0", shape=(2, 2)))


def test_choices_counted_from_minus_1_are_learned_from_0_and_predicted_as_the_env_counts_them(tmp_path):
    """The env raises on a choice outside its own space: training, evaluation and `predict` all step it."""
    agent = trained_agent(tmp_path, ["--env-id", "envs_for_tests:FollowTheCue-v0", "--total-timesteps", "8192"])
    assert agent.action_space == gym.spaces.Discrete(3) and agent.env_actions.start.tolist() == [-1]
    assert played_return(agent, gym.make("envs_for_tests:FollowTheCue-v0")) > 8.0  # guessing scores about 3.3
    assert played_return(agent, agent.make_env()) > 8.0  # the agent's env takes the env's own choices
    choices, _ = agent.predict(np.eye(3, dtype=np.float32))  # the cues left, stay and right
    assert choices.tolist() == [-1, 0, 1]
    assert agent.predict(np.zeros((0, 3), np.float32))[0].shape == (0,)
    exported = torch.jit.trace(greedy_policy(agent)[0], torch.zeros(2, 3))
    assert exported(torch.eye(3)).tolist() == [-1, 0, 1]


def test_many_evaluation_episodes_are_played_in_groups_each_scored_as_if_all_were_played_at_once(monkeypatch):
    from envs_for_tests import CountsItsCopies

    from rl.algos.ppo.algorithm import PPO
    from rl.envs import inspect_env
    from rl.evaluation import MAX_EVALUATION_ENVS, evaluate_greedy
    from rl.normalization import ObservationNormalizer

    env_id = "envs_for_tests:CountsItsCopies-v0"
    spaces = inspect_env(env_id, PPOConfig().preprocessing())
    torch.manual_seed(0)
    policy = PPO(PPOConfig(env_id=env_id), spaces).build_policy(torch.device("cpu"))  # untrained: short games
    normalizer = ObservationNormalizer(spaces.obs_dim, False, torch.device("cpu"))
    episodes = MAX_EVALUATION_ENVS + 6

    def play() -> tuple[np.ndarray, int]:
        CountsItsCopies.most_at_once = 0
        returns, lengths = evaluate_greedy(policy, env_id, episodes, 3, normalizer, torch.device("cpu"))
        assert len(returns) == len(lengths) == episodes
        return returns, CountsItsCopies.most_at_once

    in_groups, most_in_groups = play()
    monkeypatch.setattr("rl.evaluation.MAX_EVALUATION_ENVS", episodes)
    at_once, most_at_once = play()
    assert (most_in_groups, most_at_once) == (MAX_EVALUATION_ENVS, episodes)
    np.testing.assert_array_equal(in_groups, at_once)
    assert len(set(in_groups)) > 1  # each episode its own game


@pytest.mark.parametrize(
    ("env_kwargs", "length", "cut"),
    [
        ({"length": 1000}, 50, True),  # no time limit: cut at the cap, with a warning
        ({"length": 1000, "max_episode_steps": 80}, 80, False),  # a time limit given to gym.make holds
        ({"length": 20}, 20, False),  # episodes that end by themselves
    ],
)
def test_an_evaluation_episode_of_an_env_without_a_time_limit_is_cut_with_a_warning(
    env_kwargs, length, cut, monkeypatch, capsys
):
    """Else a greedy policy that never reaches an end would keep the evaluation going for ever."""
    import json

    from rl.algos.ppo.algorithm import PPO
    from rl.envs import inspect_env
    from rl.evaluation import evaluate_greedy
    from rl.normalization import ObservationNormalizer

    monkeypatch.setattr("rl.evaluation.UNLIMITED_EPISODE_STEPS", 50)
    cfg = PPOConfig(env_id="envs_for_tests:FixedLength-v0", env_kwargs=json.dumps(env_kwargs))
    spaces = inspect_env(cfg.env_id, cfg.preprocessing())
    policy = PPO(cfg, spaces).build_policy(torch.device("cpu"))
    normalizer = ObservationNormalizer(spaces.obs_dim, False, torch.device("cpu"))
    returns, lengths = evaluate_greedy(
        policy, cfg.env_id, 3, 0, normalizer, torch.device("cpu"), preprocessing=cfg.preprocessing()
    )
    assert lengths.tolist() == [length] * 3 and returns.tolist() == [float(length)] * 3  # it pays 1 a step
    warning = (
        "warning: 3 of 3 evaluation episodes did not end within 50 steps and were cut there: "
        "envs_for_tests:FixedLength-v0 sets no time limit"
    )
    assert (warning in capsys.readouterr().err) == cut


def test_ctrl_c_ends_an_evaluation_in_one_line(tmp_path):
    frames = tmp_path / "frames.txt"  # the first env draws each step here: the evaluation is under way
    env_flags = ["--env-id", "envs_for_tests:ShowsItself-v0", "--env-kwarg", f"frames={frames}"]
    trained = run_ranks("python", SCRIPTS["fabric"], [*env_flags, *OWN_ENV[2:]], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    agent = str(run_dir(tmp_path, "fabric") / "agent.ckpt")
    evaluation = start_as_foreground_job(
        [sys.executable, "-m", "rl.evaluate", agent, "--episodes", "1000000", "--render"],
        tmp_path,
        env=child_env() | {"DISPLAY": ":0"},
    )
    deadline = time.monotonic() + 120
    while not frames.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(evaluation.pid, signal.SIGINT)
    out, err = evaluation.communicate(timeout=60)
    assert (evaluation.returncode, out, err) == (130, "", "interrupted (Ctrl-C)\n")


@pytest.mark.slow
def test_evaluation_shows_the_first_env_in_a_window_where_a_display_and_the_env_allow_it(tmp_path):
    frames = tmp_path / "frames.txt"
    env_flags = ["--env-id", "envs_for_tests:ShowsItself-v0", "--env-kwarg", f"frames={frames}"]
    trained = run_ranks("python", SCRIPTS["fabric"], [*env_flags, *OWN_ENV[2:]], tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    agent = str(run_dir(tmp_path, "fabric") / "agent.ckpt")
    assert not frames.exists(), "training renders nothing"
    headless = {name: value for name, value in child_env().items() if name not in ("DISPLAY", "WAYLAND_DISPLAY")}

    def evaluate(*args: str, display: bool = True) -> subprocess.CompletedProcess:
        env = headless | ({"DISPLAY": ":0"} if display else {})
        command = [sys.executable, "-m", "rl.evaluate", agent, "--episodes", "2", *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    shown = evaluate("--render")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "2 deterministic episodes: return 5.00 ± 0.00" in shown.stdout
    assert frames.read_text().count("frame") == 5, "the first env's 5 steps, and only its"
    refusals = {
        "no display here (no DISPLAY or WAYLAND_DISPLAY)": evaluate("--render", display=False),
        "takes no --capture-video": evaluate("--render", "--capture-video"),
        "envs_for_tests:ShowsNothing-v0 does not render to a window (render_mode 'human')": evaluate(
            "--render", "--env-id", "envs_for_tests:ShowsNothing-v0"
        ),
    }
    for says, refused in refusals.items():
        assert refused.returncode == 2 and refused.stderr.startswith("error: --render: ") and says in refused.stderr
