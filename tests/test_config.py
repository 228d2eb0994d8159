"""Config parsing and validation: each bad input names its flag."""

import dataclasses
import os
import re
import sys
import typing
import warnings
from pathlib import Path

import envs_for_tests  # noqa: F401  (registers the tests' envs)
import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import needs_envpool

import rl.env_faults
import rl.envs
from rl.algos.ppo.config import PPOConfig
from rl.algos.sac.config import SACConfig
from rl.cli import check_mode_flags, check_values_for_job, flags_of, parse_config
from rl.config import (
    ProcessCount,
    RunConfig,
    flag,
    local_gpu_index,
    uses_gpu,
    validate,
    validate_decoupled,
    validate_values,
)
from rl.config_files import named_runs_newest_checkpoint, run_dir_of
from rl.envs import inspect_env
from rl.errors import UsageError
from rl.flag_parsing import field_docstrings, parse_dataclass, stated_default
from rl.peer_flags import PEER_FLAGS, alternatives
from rl.registry import ALGORITHMS
from rl.seeds import derive_seed


def check(cfg, world_size=1, gpu_count=0):
    validate(cfg, world_size, gpu_count)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"num_envs": 0}, "--num-envs"),
        ({"num_steps": -3}, "--num-steps"),
        ({"per_rank_batch_size": 0}, "--per-rank-batch-size"),
        ({"update_epochs": 0}, "--update-epochs"),
        ({"total_timesteps": 0}, "--total-timesteps"),
        ({"learning_rate": 0.0}, "--learning-rate"),
        ({"clip_coef": -0.1}, "--clip-coef"),
        ({"ent_coef": -1.0}, "--ent-coef"),
        ({"vf_coef": -1.0}, "--vf-coef"),
        ({"max_grad_norm": -1.0}, "--max-grad-norm"),
        ({"eval_episodes": -1}, "--eval-episodes"),
        ({"eval_every": -1}, "--eval-every"),
        ({"eval_every": 1000, "eval_episodes": 0}, "--eval-every"),
        ({"stop_at_return": 100.0}, "--stop-at-return"),
        ({"gamma": 1.5}, "--gamma"),
        ({"gae_lambda": -0.5}, "--gae-lambda"),
        ({"seed": -1}, "--seed"),
        ({"collective_timeout": 0.0}, "--collective-timeout"),
        ({"checkpoint_every": -1}, "--checkpoint-every"),
        ({"keep_last": 0}, "--keep-last"),
        ({"torch_threads": -1}, "--torch-threads"),
        ({"per_rank_batch_size": 257}, "--per-rank-batch-size"),
        ({"total_timesteps": 255}, "--total-timesteps"),
        ({"cuda": True}, "--cuda"),
        ({"player_on_gpu": True}, "--player-on-gpu"),
        ({"frame_stack": 0}, "--frame-stack"),
        ({"frame_skip": 0}, "--frame-skip"),
        ({"resize": -1}, "--resize"),
        ({"noop_max": -1}, "--noop-max"),
        ({"run_name": "a/b"}, "--run-name"),
        ({"run_name": " "}, "--run-name"),
        # NaN passes no comparison, so a sign check alone lets it through; infinity passes "positive"
        ({"vf_coef": float("nan")}, "--vf-coef"),
        ({"stop_at_return": float("nan"), "eval_every": 1000}, "--stop-at-return"),
        ({"learning_rate": float("inf")}, "--learning-rate"),
        ({"collective_timeout": float("inf")}, "--collective-timeout"),
        ({"log_std_init": float("inf")}, "--log-std-init"),
        ({"collective_timeout": 1e300}, "--collective-timeout"),  # past what a timedelta holds
        ({"seed": 2**63}, "--seed"),  # past torch's 64-bit seed
    ],
)
def test_bad_values_name_their_flag(changes, flag):
    with pytest.raises(UsageError) as error:
        check(dataclasses.replace(PPOConfig(), **changes))
    assert error.value.flag == flag
    assert str(error.value).startswith(flag)


def test_defaults_are_valid_and_the_global_rollout_counts_every_rank():
    check(PPOConfig())
    with pytest.raises(UsageError, match="4 ranks x 2 envs x 128 steps = 1024"):
        check(PPOConfig(total_timesteps=1000), world_size=4)
    with pytest.raises(UsageError, match=r"\(1 rank x 1 env x 128 steps = 128\)"):
        check(PPOConfig(total_timesteps=100, num_envs=1), world_size=1)
    check(PPOConfig(cuda=True), gpu_count=1)


def test_lightning_example_flags_parse_unchanged():
    example_readme = (
        "--capture-video --env-id LunarLander-v2 --total-timesteps 500000 --ortho-init --num-envs 2 "
        "--num-steps 2048 --seed 1"
    )
    every_other_flag = (
        "--share-data --anneal-lr --normalize-advantages --clip-vloss --activation-function tanh "
        "--per-rank-batch-size 32 --learning-rate 3e-4 --gamma 0.98 --gae-lambda 0.9 --update-epochs 4 "
        "--clip-coef 0.1 --ent-coef 0.01 --vf-coef 0.5 --max-grad-norm 1.0 --exp-name x --torch-deterministic "
        "--cuda --player-on-gpu"
    )
    cfg = parse_config(f"{example_readme} {every_other_flag}".split())
    assert (cfg.num_steps, cfg.seed, cfg.activation_function, cfg.vf_coef) == (2048, 1, "tanh", 0.5)
    assert cfg.capture_video and cfg.ortho_init and cfg.share_data and cfg.cuda and cfg.player_on_gpu


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--bogus", "1"], "--bogus"),
        (["--num-envs", "abc"], "--num-envs"),
        (["--activation-function", "gelu"], "--activation-function"),
        (["--num-steps"], "--num-steps"),
    ],
)
def test_parse_errors_become_one_line_usage_errors(argv, flag):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert error.value.flag == flag
    assert "\n" not in str(error.value)


def test_help_lists_every_field_with_its_docstring(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for field in dataclasses.fields(PPOConfig):
        assert flag(field.name) in help_text
    assert "the number of parallel environments per rank" in help_text


def test_help_prints_each_flags_meaning_as_one_paragraph(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: a line break would be the docstring's own
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    lines = capsys.readouterr().out.splitlines()
    meaning = next(line for line in lines if "keyword arguments for the env's gym.make" in line)
    assert meaning.strip().endswith("evaluation makes its envs with them again (default: '{}')")


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("NoSuchEnv-v0", "cannot make 'NoSuchEnv-v0'"),
        ("envs_for_tests:TextObservations-v0", "observation space Text(1, 8"),
        (
            "envs_for_tests:WholeNumberActions-v0",
            "action space Box(-3, 3, (2,), int64) holds integers, which a policy does not give: use a float Box",
        ),
        (
            "HalfCheetah-v3",
            "gymnasium-robotics). (this env's newest version is HalfCheetah-v5)",
        ),
    ],
)
def test_bad_envs_are_refused_with_the_env_flag(env_id, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        inspect_env(env_id)
    assert error.value.flag == "--env-id"


def test_an_old_version_that_gymnasium_names_the_successor_of_gets_no_second_hint():
    with pytest.raises(UsageError) as error:
        inspect_env("Pendulum-v0")
    assert str(error.value).endswith("Please use `Pendulum-v1` instead.")


@pytest.mark.parametrize("env_id", ["Pendulum-v0", "HalfCheetah-v3"])
def test_an_old_version_refused_is_one_line_without_gymnasiums_warning_that_it_is_out_of_date(env_id):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UsageError):
            inspect_env(env_id)
    assert not caught, [str(each.message) for each in caught]


def test_an_old_version_that_can_be_made_is_still_warned_of(monkeypatch):
    monkeypatch.setattr(rl.env_faults, "SHOWN_WARNINGS", set())  # as in a process that has not shown it yet
    with pytest.warns(DeprecationWarning, match="CartPole-v0 is out of date"):
        inspect_env("CartPole-v0")


def test_choices_and_tuples_of_them_are_observed_one_hot():
    assert inspect_env("Taxi-v4").obs_dim == 500  # Discrete(500)
    assert inspect_env("Blackjack-v1").obs_dim == 32 + 11 + 2  # Tuple(Discrete(32), Discrete(11), Discrete(2))


def test_lunar_lander_v2_maps_to_v3_with_a_warning():
    with pytest.warns(UserWarning, match="LunarLander-v2 was removed in gymnasium 1.x; using LunarLander-v3"):
        spaces = inspect_env("LunarLander-v2")
    assert spaces.env_id == "LunarLander-v3"
    assert spaces.obs_dim == 8 and isinstance(spaces.action_space, gym.spaces.Discrete)


def test_supported_spaces_are_flattened():
    assert inspect_env("Pendulum-v1").obs_dim == 3
    assert isinstance(inspect_env("Pendulum-v1").action_space, gym.spaces.Box)


def test_derived_seeds_differ_per_rank_and_env():
    seeds = {derive_seed(42, 0, rank, env) for rank in range(4) for env in range(8)}
    assert len(seeds) == 32
    assert derive_seed(42, 0, 1, 2) == derive_seed(42, 0, 1, 2)
    assert all(0 <= seed < 2**32 for seed in seeds) and np.unique(list(seeds)).size == 32


def test_capture_video_without_moviepy_names_the_flag(monkeypatch):
    import importlib.util

    from rl import cli

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "moviepy" else real_find_spec(name))
    with pytest.raises(UsageError, match="needs moviepy") as error:
        cli.check_video_support()
    assert error.value.flag == "--capture-video"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--env-kwarg", "render_mode=human"], "--env-kwarg"),
        (["--env-kwargs", '{"render_mode": "human"}'], "--env-kwargs"),
    ],
)
def test_envs_that_open_windows_are_refused_without_a_display(monkeypatch, argv, flag):
    from rl import cli

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(UsageError, match="'human' opens a window per env, and there is no display here") as error:
        cli.check_windows_can_open(parse_config(argv))
    assert error.value.flag == flag
    cli.check_windows_can_open(parse_config(["--env-kwarg", "render_mode=rgb_array"]))
    monkeypatch.setenv("DISPLAY", ":0")
    cli.check_windows_can_open(parse_config(argv))  # a window opens there


def test_decoupled_needs_a_trainer_and_a_row_per_trainer():
    with pytest.raises(UsageError, match="at least 2 processes") as error:
        validate_decoupled(PPOConfig(), world_size=1)
    assert error.value.flag == "--devices"
    with pytest.raises(UsageError, match="a rollout of 4 rows cannot feed 5 trainers") as error:
        validate_decoupled(PPOConfig(num_envs=2, num_steps=2), world_size=6)
    assert error.value.flag == "--num-steps"
    with pytest.raises(UsageError, match="sequences: 1 env cannot feed 2 trainers") as error:
        validate_decoupled(PPOConfig(recurrent=True, num_envs=1), world_size=3)
    assert error.value.flag == "--num-envs"
    validate_decoupled(PPOConfig(), world_size=3)
    with pytest.raises(UsageError, match="a rollout of 1 row cannot feed 2 trainers"):
        validate_decoupled(PPOConfig(num_envs=1, num_steps=1, per_rank_batch_size=1), world_size=3)


@pytest.mark.parametrize(
    ("launcher_env", "flag", "more"),
    [
        ({"LT_CLI_USED": "1", "WORLD_SIZE": "1"}, "--devices", "launch more processes (fabric run --devices)"),
        ({"WORLD_SIZE": "1"}, "--nproc-per-node", "launch more processes (torchrun --nproc-per-node)"),
    ],
)
def test_too_few_processes_are_answered_with_the_flag_of_the_launcher_that_started_them(
    monkeypatch, launcher_env, flag, more
):
    monkeypatch.delenv("LT_CLI_USED", raising=False)
    for name, value in launcher_env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError) as error:
        validate_decoupled(PPOConfig(), world_size=1)
    assert (error.value.flag, str(error.value).rpartition(": ")[2]) == (flag, more)


def test_a_process_that_runs_no_script_of_its_own_is_told_to_launch_a_script(monkeypatch, tmp_path):
    monkeypatch.delenv("LT_CLI_USED", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    script = tmp_path / "train.py"
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)
    assert ProcessCount.here().more == f"launch it with fabric run --accelerator=cpu --devices=2 {script}"
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "ipykernel_launcher.py"), "-f", "kernel.json"])
    monkeypatch.delattr(sys.modules["__main__"], "__file__")  # a notebook's: its cells are no file's
    assert ProcessCount.here().more == "launch it with fabric run --accelerator=cpu --devices=2 SCRIPT"


@pytest.mark.parametrize(
    ("fields", "world_size", "flag", "says"),
    [
        ({"num_players": 3}, 3, "--num-players", "3 processes leave no trainer beside 3 players:"),
        (
            {"num_players": 2, "evaluator": True},
            3,
            "--num-players",
            "3 processes leave no trainer beside 2 players and the evaluator:",
        ),
        ({"asynchronous": True, "pipeline": True}, 3, "--pipeline", "is --async with a lag of exactly 1"),
        ({"max_policy_lag": 4}, 3, "--max-policy-lag", "add --async"),
    ],
    ids=["no-trainer-left", "no-trainer-beside-the-evaluator", "async-and-pipeline", "lag-without-async"],
)
def test_decoupled_topology_flags_are_checked(fields, world_size, flag, says):
    with pytest.raises(UsageError, match=re.escape(says)) as error:
        validate_decoupled(PPOConfig(**fields), world_size=world_size)
    assert error.value.flag == flag
    validate_decoupled(PPOConfig(num_players=2, asynchronous=True, max_policy_lag=0), world_size=3)


def test_decoupled_topology_flags_are_refused_in_other_modes():
    from rl.cli import check_mode_flags

    for argv, refused in [
        (["--num-players", "2"], "--num-players"),
        (["--async"], "--async"),
        (["--max-policy-lag", "0"], "--max-policy-lag"),
    ]:
        for mode in ("coupled", "hogwild"):
            with pytest.raises(UsageError, match="belongs to decoupled mode") as error:
                check_mode_flags(parse_config(argv), mode)
            assert error.value.flag == refused


def test_periodic_evaluation_flags_are_refused_outside_coupled_mode():
    from rl.cli import check_mode_flags

    for argv, refused in [
        (["--eval-every", "1000"], "--eval-every"),
        (["--eval-every", "1000", "--stop-at-return", "5"], "--eval-every"),
    ]:
        for mode in ("decoupled", "hogwild"):
            with pytest.raises(UsageError, match="belongs to coupled mode") as error:
                check_mode_flags(parse_config(argv), mode)
            assert error.value.flag == refused
    check_mode_flags(parse_config(["--eval-every", "1000", "--stop-at-return", "5"]), "coupled")


def test_a_leading_algorithm_name_picks_its_config_and_ppo_is_the_default():
    from rl.algos.sac.config import SACConfig

    assert type(parse_config(["--env-id", "Acrobot-v1"])) is PPOConfig
    assert type(parse_config(["ppo", "--num-steps", "64"])) is PPOConfig
    sac = parse_config(["sac", "--batch-size", "32", "--ent-coef", "0.1", "--scale-lr", "--save-buffer"])
    assert type(sac) is SACConfig and sac.batch_size == 32 and sac.ent_coef == "0.1" and sac.scale_lr
    assert sac.env_id == "Pendulum-v1" and sac.num_envs == 1  # SAC's own defaults
    with pytest.raises(UsageError) as error:
        parse_config(["sac", "--per-rank-batch-size", "8"])  # a PPO flag
    assert error.value.flag == "--per-rank-batch-size"


def test_help_at_each_level_shows_that_levels_flags(capsys):
    from rl.algos.sac.config import SACConfig

    for argv, config_type in ((["--help"], PPOConfig), (["sac", "--help"], SACConfig)):
        with pytest.raises(SystemExit) as exit_:
            parse_config(argv)
        assert exit_.value.code == 0
        help_text = " ".join(capsys.readouterr().out.split())
        for field in dataclasses.fields(config_type):
            assert flag(field.name) in help_text, (argv, field.name)
        other = SACConfig if config_type is PPOConfig else PPOConfig
        assert ("--buffer-size" in help_text) == (config_type is SACConfig)
        assert ("--per-rank-batch-size" in help_text) == (other is SACConfig)
    # the default level says where the other algorithm's flags are
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    assert "sac --help" in " ".join(capsys.readouterr().out.split())


def test_sac_help_explains_its_flags(capsys):
    with pytest.raises(SystemExit):
        parse_config(["sac", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for meaning in ("replay buffer capacity", "Polyak", "'auto' to tune it", "gradient steps in each learning phase"):
        assert meaning in help_text


def preset_cases():
    from rl.registry import ALGORITHMS

    return [(name, preset) for name, kind in ALGORITHMS.items() for preset in kind.config_type.PRESETS]


def test_each_config_offers_exactly_its_algorithms_presets():
    from rl.registry import ALGORITHMS

    for kind in ALGORITHMS.values():
        preset_type = typing.get_type_hints(kind.config_type)["preset"]
        offered = [arg for arg in typing.get_args(preset_type) if arg is not type(None)]
        choices = [choice for arg in offered for choice in typing.get_args(arg)]
        assert choices == list(kind.config_type.PRESETS), kind.name


@pytest.mark.parametrize(("algorithm", "preset"), preset_cases())
def test_every_preset_is_a_valid_two_process_run_on_an_env_its_algorithm_accepts(algorithm, preset):
    from rl.registry import ALGORITHMS

    cfg = parse_config([algorithm, "--preset", preset])
    assert cfg.preset == preset
    for field, value in type(cfg).PRESETS[preset].items():
        assert getattr(cfg, field) == value, field
    check(cfg, world_size=2)
    ALGORITHMS[algorithm].check_spaces(inspect_env(cfg.env_id))


@pytest.mark.parametrize("order", ["preset first", "preset last"])
def test_flags_given_with_a_preset_override_it_in_any_order(order):
    preset, flags = ["--preset", "cartpole"], ["--seed", "7", "--num-envs", "3", "--no-anneal-lr"]
    cfg = parse_config(preset + flags if order == "preset first" else flags + preset)
    assert (cfg.env_id, cfg.gamma, cfg.activation_function) == ("CartPole-v1", 0.98, "tanh")  # from the preset
    assert (cfg.seed, cfg.num_envs, cfg.anneal_lr) == (7, 3, False)  # from the flags
    assert parse_config(["--preset=cartpole"]).anneal_lr


@pytest.mark.parametrize("argv", [["--preset", "humanoid"], ["sac", "--preset", "cartpole"]])
def test_an_unknown_preset_is_named_with_the_choices(argv):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert error.value.flag == "--preset"
    assert "choose from" in str(error.value) and argv[-1] in str(error.value)


@needs_envpool
def test_envpool_envs_are_made_without_warnings_the_user_cannot_act_on():
    """envpool gives its float32 spaces float64 bounds, which gymnasium warns of when the spaces are first made."""
    from rl.envs import make_vector_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        envs = make_vector_env("CartPole-v1", 2, mode="envpool")
        assert envs.single_observation_space.shape == (4,)
        envs.close()


def test_mujoco_envs_are_made_without_advice_about_gymnasiums_models_but_warn_of_an_unstable_simulation(capfd):
    from rl.envs import ATARI_PREPROCESSING, make_env

    env = make_env("HalfCheetah-v5", None, ATARI_PREPROCESSING)
    env.reset(seed=0)
    env.unwrapped.data.qvel[:] = 1e30
    env.step(np.zeros(6, dtype=np.float32))
    env.close()
    err = capfd.readouterr().err
    assert "settotalmass" not in err
    assert "WARNING: Nan, Inf or huge value in QVEL at DOF 0. The simulation is unstable." in err


def test_auto_vector_mode_is_native_only_where_the_env_algorithm_and_video_allow_it():
    from rl.envs import choose_vector_mode

    assert choose_vector_mode("auto", "CartPole-v1", capture_video=False, late_resets_refused_by=None) == "native"
    assert choose_vector_mode("auto", "Acrobot-v1", capture_video=False, late_resets_refused_by=None) == "sync"
    assert choose_vector_mode("auto", "CartPole-v1", capture_video=True, late_resets_refused_by=None) == "sync"
    assert choose_vector_mode("auto", "CartPole-v1", capture_video=False, late_resets_refused_by="SAC") == "sync"
    assert choose_vector_mode("async", "Acrobot-v1", capture_video=True, late_resets_refused_by="SAC") == "async"
    for env_id, video, refused_by in (
        ("Acrobot-v1", False, None),
        ("CartPole-v1", True, None),
        ("CartPole-v1", False, "SAC"),
    ):
        with pytest.raises(UsageError) as error:
            choose_vector_mode("native", env_id, capture_video=video, late_resets_refused_by=refused_by)
        assert error.value.flag == "--vector-mode"


def test_the_time_feature_appends_the_elapsed_fraction_of_the_time_limit_and_needs_envs_made_one_by_one():
    from rl.envs import Preprocessing, choose_vector_mode, make_env

    timed = Preprocessing(time_feature=True)
    assert inspect_env("Pendulum-v1", timed).obs_dim == 3 + 1
    env = make_env("Pendulum-v1", None, timed)
    obs, _ = env.reset(seed=0)
    fractions = [obs[-1]]
    for _ in range(200):  # Pendulum's time limit
        obs, _, _, truncated, _ = env.step(env.action_space.sample())
        fractions.append(obs[-1])
    assert truncated and fractions == pytest.approx([step / 200 for step in range(201)])
    assert choose_vector_mode("auto", "CartPole-v1", False, None, timed.single_env_flag()) == "sync"
    with pytest.raises(UsageError, match="without --time-feature"):
        choose_vector_mode("native", "CartPole-v1", False, None, timed.single_env_flag())


def test_sac_is_refused_native_envs_with_the_modes_it_takes():
    from rl.algos.sac.algorithm import SAC
    from rl.algos.sac.config import SACConfig

    spaces = inspect_env("MountainCarContinuous-v0")
    assert SAC(SACConfig(env_id=spaces.env_id, vector_mode="auto"), spaces).vector_mode == "sync"
    with pytest.raises(UsageError) as refused:
        SAC(SACConfig(env_id="CartPole-v1", vector_mode="native"), inspect_env("CartPole-v1"))
    assert str(refused.value) == (
        "--vector-mode: native envs reset a step after an episode ends, and SAC stores every step as a transition: "
        "use sync or async"
    )


def test_the_configs_initvars_are_annotated_with_objects_as_python_3_10_needs():
    # Python 3.10's typing.get_type_hints, which tyro calls on every config, refuses a string naming an InitVar:
    # under `from __future__ import annotations` such a field stops every run there.
    for config_type in (PPOConfig, SACConfig):
        for cls in config_type.__mro__:
            annotations = vars(cls).get("__annotations__", {})
            named = [name for name, hint in annotations.items() if isinstance(hint, str) and "InitVar" in hint]
            assert named == [], cls
        assert {"followed", "chosen_defaults", "named_when_built"} <= set(typing.get_type_hints(config_type))


def test_envpool_without_its_extra_names_the_extra(monkeypatch):
    import sys

    from rl.envs import choose_vector_mode

    monkeypatch.setitem(sys.modules, "envpool", None)  # as where the envpool extra is not installed
    with pytest.raises(UsageError) as refused:
        choose_vector_mode("envpool", "CartPole-v1", False, None)
    assert str(refused.value) == (
        "--vector-mode: envpool needs the envpool extra (Python 3.11+): pip install -e '.[envpool]'"
    )


@needs_envpool
def test_envpool_asked_for_an_env_it_lacks_names_what_it_holds():
    from rl.envs import choose_vector_mode

    with pytest.raises(UsageError) as refused:
        choose_vector_mode("envpool", "envs_for_tests:FixedLength-v0", False, None)
    assert str(refused.value).startswith("--vector-mode: envpool has no ")
    assert "Atari, MuJoCo and classic control" in str(refused.value) and "pip install" not in str(refused.value)


@pytest.mark.parametrize(
    ("values", "world_size", "refused"),
    [
        # One trainer learns from every player's rollout: a minibatch may outgrow one player's.
        ({"num_players": 4, "num_envs": 1, "per_rank_batch_size": 256}, 5, None),
        # Two trainers split one player's rollout: a minibatch of the whole of it is more than either holds.
        (
            {"num_envs": 2, "per_rank_batch_size": 256},
            3,
            "256 is larger than each trainer's share of the rollouts (1 player x --num-envs 2 x --num-steps 128, "
            "shared by 2 trainers: 128)",
        ),
        # Recurrent rows are whole sequences: 3 envs' sequences give each of 2 trainers one at least.
        (
            {"num_envs": 3, "recurrent": True, "per_rank_batch_size": 256},
            3,
            "256 is larger than each trainer's share of the rollouts (1 player x --num-envs 3 x --num-steps 128, "
            "shared by 2 trainers: 128)",
        ),
    ],
    ids=["many-players", "two-trainers", "recurrent"],
)
def test_a_decoupled_minibatch_is_checked_against_a_trainers_share_of_the_players_rollouts(values, world_size, refused):
    cfg = PPOConfig(**values)
    if refused is None:
        check_values_for_job(cfg, "decoupled", world_size)
        with pytest.raises(UsageError, match="larger than the per-rank rollout"):
            check_values_for_job(cfg, "coupled", world_size)  # a coupled rank's minibatch comes from its own
        return
    with pytest.raises(UsageError) as error:
        check_values_for_job(cfg, "decoupled", world_size)
    assert (error.value.flag, str(error.value)) == ("--per-rank-batch-size", f"--per-rank-batch-size: {refused}")


@pytest.mark.parametrize(
    ("argv", "flag_name", "says"),
    [
        (["--lstm-hidden-size", "32"], "--lstm-hidden-size", "shapes the LSTM of --recurrent; add --recurrent"),
        (["--lstm-layers", "2"], "--lstm-layers", "shapes the LSTM of --recurrent; add --recurrent"),
        (["--env-id", "Pendulum-v1", "--sde-sample-freq", "8"], "--sde-sample-freq", "redraws its noise; add"),
        (["sac", "--log-std-init", "-2"], "--log-std-init", "starts the noise of --use-sde; add --use-sde"),
        (["sac", "--ent-coef", "0.1", "--target-entropy", "-3"], "--target-entropy", "add --ent-coef auto"),
    ],
)
def test_a_flag_that_refines_one_the_run_goes_without_is_refused(argv, flag_name, says):
    """It would do nothing."""
    with pytest.raises(UsageError) as error:
        check(parse_config(argv))
    assert error.value.flag == flag_name and says in str(error.value)


def test_a_presets_refinement_stays_when_the_run_goes_without_what_it_refines():
    """The published row `pendulum-gsde --no-use-sde`: the preset's --sde-sample-freq, left unused."""
    check(parse_config(["--preset", "pendulum-gsde", "--no-use-sde"]))
    check(parse_config(["sac", "--ent-coef", "auto_0.1", "--target-entropy", "-3"]))


@pytest.mark.parametrize(
    ("argv", "flag_name", "owner"),
    [(["sac", "--recurrent"], "--recurrent", "PPO's"), (["--tau", "0.1"], "--tau", "SAC's")],
)
def test_another_algorithms_flag_is_named_as_that_algorithms(argv, flag_name, owner):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert error.value.flag == flag_name
    assert str(error.value).endswith(f"does not take it: it is {owner}")


@pytest.mark.parametrize("argv", [["--num-envs", "1", "sac", "--batch-size", "8"], ["--num-envs", "1", "ppo"]])
def test_an_algorithm_named_after_flags_is_told_to_go_first(argv):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert error.value.flag == "command line" and "the algorithm goes first" in str(error.value)


@pytest.mark.parametrize(
    ("argv", "word", "says"),
    [
        (["--num-minibatches", "4"], "--num-minibatches", "CleanRL's flag, not this program's: give the minibatch's"),
        (["--track"], "--track", "CleanRL's flag, not this program's: --logger tensorboard wandb"),
        (["--norm-adv=True"], "--norm-adv", "CleanRL's flag, not this program's: --normalize-advantages"),
        (["sac", "--autotune"], "--autotune", "CleanRL's flag, not this program's: --ent-coef auto"),
        (["--cudagraphs"], "--cudagraphs", "LeanRL's flag, not this program's: --cuda-graphs"),
        (["-n", "1000"], "-n", "rl-zoo's flag, not this program's: --total-timesteps"),
        (["--num-threads", "1"], "--num-threads", "rl-zoo's flag, not this program's: --torch-threads"),
        (["--eval-freq", "1000"], "--eval-freq", "--eval-every, in env steps across all processes (keeping the best"),
        (["--n-trials", "10"], "--n-trials", "rl-zoo's flag, not this program's: python -m rl.tune --trials N -- TRAI"),
        (["--n-epochs", "4"], "--n-epochs", "Stable-Baselines3's flag, not this program's: --update-epochs"),
        (["--num-envs", "2", "--env", "Hopper-v5"], "--env", "rl-zoo's flag, not this program's: --env-id"),
        (["env.id=Hopper-v5"], "env.id=Hopper-v5", "sheeprl's Hydra override, not this program's: give flags"),
        (["--mask-vel", "True"], "--mask-vel", "the Lightning example's flag, not this program's: --env-id rl/Masked"),
        (["--batch-size", "64"], "--batch-size", "Stable-Baselines3's flag, not PPO's: --per-rank-batch-size is PPO"),
        (["sac", "--learning-rate=1e-3"], "--learning-rate", "Stable-Baselines3's flag, not SAC's: give SAC's two"),
    ],
)
def test_another_programs_flag_is_answered_with_this_ones(argv, word, says):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert error.value.flag == word
    assert says in str(error.value)


def test_stable_baselines3s_gradient_steps_of_minus_one_is_answered_with_the_count_it_means():
    cfg = parse_config(["sac", "--gradient-steps", "-1", "--train-freq", "2", "--num-envs", "4"])
    with pytest.raises(UsageError) as error:
        cfg.validate_algorithm()
    assert str(error.value) == (
        "--gradient-steps: takes a count: Stable-Baselines3's -1, a step per env step, is --gradient-steps 8 here "
        "(--train-freq 2 x 4 envs)"
    )
    with pytest.raises(UsageError, match=re.escape("(--train-freq 1 x 1 env)")):
        parse_config(["sac", "--gradient-steps", "-1"]).validate_algorithm()


@pytest.mark.parametrize("argv", [["--alpha", "0.2"], ["sac", "--norm-adv"], ["sac", "--normalize"]])
def test_another_programs_flag_gets_no_advice_that_does_not_hold_for_the_algorithm(argv):
    """PPO's --ent-coef is no temperature, and SAC normalizes no advantages."""
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert "Unrecognized options" in str(error.value)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_each_flag_another_programs_flag_is_answered_with_is_a_flag_of_the_algorithm(algorithm):
    flags_here = flags_of(ALGORITHMS[algorithm].config_type)
    every_flag = set().union(*(flags_of(kind.config_type) for kind in ALGORITHMS.values()))
    for name, entry in PEER_FLAGS.items():
        for peer in alternatives(entry):
            assert peer.flag_here in every_flag | {None}, name
            if peer.algorithm == algorithm:
                assert peer.flag_here in flags_here | {None}, name
            if peer.algorithm in (None, algorithm) and peer.flag_here in flags_here | {None}:  # advice given here
                assert name not in flags_here  # a flag the algorithm takes is never answered as another program's


@pytest.mark.parametrize(
    ("argv", "mode", "told"),
    [
        (["--num-envz", "4"], "coupled", "--num-envz: Unrecognized options: --num-envz, 4; did you mean --num-envs?"),
        (
            ["sac", "--no-use-sdee"],
            None,
            "--no-use-sdee: Unrecognized options: --no-use-sdee; did you mean --no-use-sde?",
        ),
        (
            ["--updat-epochs=3"],
            None,
            "--updat-epochs: Unrecognized options: --updat-epochs=3; did you mean --update-epochs?",
        ),
        (["--workerz", "2"], "hogwild", "--workerz: Unrecognized options: --workerz, 2; did you mean --workers?"),
        # the last words of one flag's name
        (["--video"], None, "--video: Unrecognized options: --video; did you mean --capture-video?"),
        (["--epochs", "3"], None, "--epochs: Unrecognized options: --epochs, 3; did you mean --update-epochs?"),
        (["--lr", "3"], None, "--lr: Unrecognized options: --lr, 3"),  # too short to tell: --anneal-lr is another
        (["--workerz", "2"], "coupled", "--workerz: Unrecognized options: --workerz, 2"),  # another mode's flag
        (["--no-such-flag"], None, "--no-such-flag: Unrecognized options: --no-such-flag"),
        (
            ["sak", "--seed", "3"],
            None,
            "command line: there is no algorithm 'sak' (did you mean sac?); name one of ppo, sac",
        ),
        (["ppo2"], "coupled", "command line: there is no algorithm 'ppo2' (did you mean ppo?); name one of ppo, sac"),
        (["xyz"], None, "command line: Unrecognized options: xyz"),  # no slip of an algorithm's name
    ],
)
def test_a_slip_of_a_flags_name_is_answered_with_the_flag_of_this_algorithm_and_mode(argv, mode, told):
    with pytest.raises(UsageError) as error:
        parse_config(argv, mode)
    assert str(error.value) == told


@pytest.mark.parametrize(
    ("argv", "told"),
    [(["--preset", "sac/hopper"], "sac --preset hopper"), (["sac", "--preset=ppo/cartpole"], "ppo --preset cartpole")],
)
def test_a_preset_named_as_python_names_another_algorithms_is_answered_with_the_command_line_spelling(argv, told):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    script = os.path.basename(sys.argv[0])
    assert str(error.value) == f"--preset: the command line names the algorithm first, on its own: {script} {told}"


def test_a_slip_of_a_presets_name_is_answered_with_the_preset_and_every_choice():
    with pytest.raises(UsageError) as error:
        parse_config(["sac", "--preset", "hoper"])
    choices = ", ".join(ALGORITHMS["sac"].config_type.PRESETS)
    slip = "there is no preset 'hoper' for this algorithm (did you mean hopper?)"
    assert str(error.value) == f"--preset: {slip}; choose from {choices}"
    with pytest.raises(UsageError, match=r"there is no preset 'zzz' for this algorithm; choose from"):
        parse_config(["--preset", "zzz"])


@pytest.mark.parametrize(
    ("argv", "values"),
    [
        (["--anneal-lr", "True", "--share-data=false"], {"anneal_lr": True, "share_data": False}),
        (["--normalize-advantages", "1", "--num-envs", "2"], {"normalize_advantages": True, "num_envs": 2}),
        (["--clip-vloss=yes", "--torch_deterministic", "off"], {"clip_vloss": True, "torch_deterministic": False}),
        (["sac", "--use-sde", "false", "--capture-video"], {"use_sde": False, "capture_video": True}),
        (["--total-timesteps", "1e5", "--num-envs=4"], {"total_timesteps": 100_000, "num_envs": 4}),
        (["sac", "--buffer-size=2.5E4", "--learning-starts", "1e3"], {"buffer_size": 25_000, "learning_starts": 1000}),
    ],
)
def test_switches_and_whole_numbers_take_the_values_other_programs_and_config_files_give(argv, values):
    """A switch takes a true or false value, as the Lightning example's argparse does; a whole number its
    exponent form, as a config file does."""
    cfg = parse_config(argv)
    assert {name: getattr(cfg, name) for name in values} == values


@pytest.mark.parametrize("argv", [["--anneal-lr", "maybe"], ["--num-envs", "2", "--anneal-lr=maybe"]])
def test_a_switch_given_a_word_that_is_no_truth_value_is_refused_naming_it(argv):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert str(error.value) == (
        "--anneal-lr: a switch takes no value, or true or false; got 'maybe': give --anneal-lr or --no-anneal-lr"
    )


@pytest.mark.parametrize(
    ("argv", "told"),
    [
        (["--total-timesteps", "1.5e0"], "--total-timesteps: '1.5e0' is not a whole number"),
        (["--num-envs", "2.0"], "--num-envs: '2.0' is not a whole number"),
        (["--learning-rate", "1/2"], "--learning-rate: '1/2' is not a number"),
        (["--target-kl", "abc"], "--target-kl: 'abc' is not a number"),  # an optional value
        (["--seed"], "--seed: needs a value"),
        (["sac", "--net-arch", "64"], "--net-arch: needs 2 values"),
        (["sac", "--net-arch", "64", "x"], "--net-arch: '64 x' is not a list of 2, each a whole number"),
        (["--vector-mode", "fast"], "--vector-mode: 'fast' is not one of auto, sync, async, native, envpool"),
        (
            ["--vector-mode", "asynch"],
            "--vector-mode: 'asynch' is not one of auto, sync, async, native, envpool; did you mean async?",
        ),
        (
            ["--logger", "csv", "wandbb"],
            "--logger: 'wandbb' is not one of tensorboard, csv, wandb; did you mean wandb?",
        ),
        (["--num-envs", "2", "maybe"], "command line: Unrecognized options: maybe"),  # after no switch: no value
    ],
)
def test_a_value_the_parser_cannot_take_is_named_in_the_users_words_as_a_config_files_is(argv, told):
    with pytest.raises(UsageError) as error:
        parse_config(argv)
    assert str(error.value) == told


def test_an_algorithms_name_as_a_flags_value_is_no_misplaced_algorithm():
    with pytest.raises(UsageError) as error:
        parse_config(["--exp-name", "sac", "--no-such-flag"])
    assert error.value.flag == "--no-such-flag"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--env-id", "ALE/Pong-v5"], "hint: --preset atari-ppo is tuned for Atari envs like ALE/Pong-v5"),
        (["--env-id", "rl/PixelCartPole-v1"], "hint: --preset atari-ppo is tuned for image envs"),
        (
            ["--env-id", "Hopper-v5"],
            "hint: --preset hopper is tuned for Hopper-v5; this run takes the defaults, tuned for CartPole-v1",
        ),
        (
            ["--env-id", "Acrobot-v1"],
            "hint: --preset acrobot is tuned for Acrobot-v1; this run takes the defaults, tuned for CartPole-v1",
        ),
        (
            ["--env-id", "Pendulum-v1"],
            "hint: --preset pendulum is tuned for Pendulum-v1; this run takes the defaults, tuned for CartPole-v1",
        ),
        (
            ["sac", "--env-id", "Humanoid-v5"],
            "hint: --preset halfcheetah, --preset hopper, --preset walker2d are tuned for MuJoCo envs like Humanoid-v5",
        ),
    ],
)
def test_an_env_with_a_preset_or_a_mujoco_atari_or_image_env_without_one_gets_one_line_naming_it(argv, says):
    from rl.cli import preset_hint

    cfg = parse_config(argv)
    assert preset_hint(cfg, inspect_env(cfg.env_id, cfg.preprocessing())).startswith(says)


@pytest.mark.parametrize(
    "argv",
    [
        ["--env-id", "CartPole-v1"],
        ["--preset", "hopper"],
        ["sac"],
        ["--env-id", "MountainCar-v0"],
        ["--env-id", "ALE/Breakout-v5", "--env-kwarg", "obs_type=ram"],  # the Atari presets train on frames
    ],
)
def test_no_hint_where_a_preset_is_given_the_defaults_are_tuned_for_the_env_or_none_is(argv):
    from rl.cli import preset_hint

    cfg = parse_config(argv)
    assert preset_hint(cfg, inspect_env(cfg.env_id, cfg.preprocessing())) is None


@pytest.mark.parametrize(
    ("players", "evaluator", "player_on_gpu", "gpus_needed", "trainer_gpus"),
    [
        (1, False, False, 2, [0, 1]),  # a CPU player before the trainers leaves them GPUs 0 and 1
        (1, True, False, 2, [0, 1]),  # and the evaluator, last, takes none
        (2, True, False, 2, [0, 1]),
        (1, False, True, 3, [1, 2]),  # players on GPUs take the first ones
    ],
)
def test_decoupled_roles_on_the_cpu_take_no_gpu(
    monkeypatch, players, evaluator, player_on_gpu, gpus_needed, trainer_gpus
):
    world_size = players + 2 + int(evaluator)  # two trainers
    cfg = PPOConfig(
        cuda=True, num_players=players, evaluator=evaluator, player_on_gpu=player_on_gpu, total_timesteps=4096
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world_size))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    trainers = range(players, players + 2)
    assert [local_gpu_index(cfg, rank, world_size, True) for rank in trainers] == trainer_gpus
    assert uses_gpu(cfg, world_size - 1, world_size, True) is not evaluator  # the last rank: trainer or evaluator
    validate(cfg, world_size, gpus_needed, env_ranks=players, decoupled=True)
    with pytest.raises(UsageError, match=f"each of the {gpus_needed} processes here that compute on one"):
        validate(cfg, world_size, gpus_needed - 1, env_ranks=players, decoupled=True)


@pytest.mark.parametrize(
    ("mode", "fields", "rank", "local_rank", "expected"),
    [
        ("coupled", {"cuda": False}, 0, 0, None),  # the host's memory
        ("coupled", {}, 2, 2, 2),  # each rank its own GPU, not GPU 0 for all
        ("coupled", {}, 6, 2, 2),  # the second node's third rank
        ("decoupled", {"num_players": 2}, 0, 0, None),  # CPU players' storage is in the host's memory
        ("decoupled", {"num_players": 2, "player_on_gpu": True, "evaluator": True}, 1, 1, 1),
        ("decoupled", {"num_players": 2, "player_on_gpu": True, "evaluator": True}, 3, 3, 0),  # the evaluator: none
    ],
    ids=["cpu", "coupled-rank", "second-node", "cpu-players", "gpu-player", "evaluator"],
)
def test_the_storage_check_reads_the_memory_of_the_gpu_a_rank_computes_on(
    monkeypatch, mode, fields, rank, local_rank, expected
):
    """A rank that asked GPU 0 for its free memory would hold a context on it for its whole life, and check the
    wrong card: each rank asks its own, and one that computes on none (the evaluator) the first player's."""
    from rl.cli import storage_gpu

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    cfg = PPOConfig(**{"cuda": True, "total_timesteps": 4096, **fields})
    assert storage_gpu(cfg, mode, world_size=8 if rank > 3 else 4) == expected


def test_fabric_run_on_gpus_without_cuda_is_refused_and_the_script_flag_chooses_the_device(monkeypatch):
    monkeypatch.setenv("LT_ACCELERATOR", "cuda")
    with pytest.raises(UsageError, match="fabric run --accelerator=cuda was given, but without --cuda") as error:
        check(PPOConfig())
    assert error.value.flag == "--cuda"
    check(PPOConfig(cuda=True), gpu_count=1)
    monkeypatch.setenv("LT_ACCELERATOR", "cpu")  # the launcher only starts the processes; --cuda places them
    check(PPOConfig(cuda=True), gpu_count=1)


def test_torchrun_nodes_that_start_unequal_numbers_of_processes_are_refused_on_every_rank(monkeypatch):
    # A node of 2 and a node of 1: Fabric's own check would fail on the first node's ranks only.
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    for local_world_size, processes in (("2", "2 processes"), ("1", "1 process")):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
        with pytest.raises(UsageError, match=f"this node runs {processes}, but the job.s 2 nodes run 3") as error:
            check(PPOConfig(), world_size=3)
        assert error.value.flag == "--nproc-per-node"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    check(PPOConfig(), world_size=4)


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "deepspeed_stage_2"])
def test_fabric_run_with_a_strategy_that_wraps_a_module_is_refused_and_ddp_is_taken(monkeypatch, strategy):
    monkeypatch.setenv("LT_STRATEGY", strategy)
    with pytest.raises(UsageError, match=f"fabric run --strategy={strategy}: every process here keeps whole") as error:
        check(PPOConfig())
    assert error.value.flag == "--strategy" and str(error.value).endswith("give --strategy=ddp, or leave it out")
    for taken in ("ddp", "ddp_find_unused_parameters_true", "auto"):
        monkeypatch.setenv("LT_STRATEGY", taken)
        check(PPOConfig())


def test_fabric_run_with_a_list_of_gpus_is_refused_and_a_count_is_taken(monkeypatch):
    monkeypatch.setenv("LT_DEVICES", "1,3")
    with pytest.raises(
        UsageError, match="fabric run --devices=1,3: each process here takes its GPU by its place"
    ) as error:
        check(PPOConfig())
    assert error.value.flag == "--devices" and str(error.value).endswith("choose the GPUs with CUDA_VISIBLE_DEVICES")
    for taken in ("2", "auto", "-1"):
        monkeypatch.setenv("LT_DEVICES", taken)
        check(PPOConfig())


def test_recurrent_runs_train_with_every_other_flag_at_its_default():
    cfg = parse_config(["--recurrent"])
    assert cfg.per_rank_batch_size == cfg.num_steps  # one env sequence per minibatch
    validate(cfg, world_size=1, gpu_count=0)
    assert parse_config(["--recurrent", "--num-steps", "32"]).per_rank_batch_size == 32


def test_a_recurrent_batch_size_the_user_gave_is_kept_and_still_refused_when_it_cannot_work():
    given = parse_config(["--recurrent", "--per-rank-batch-size", "64"])
    assert given.per_rank_batch_size == 64
    with pytest.raises(UsageError, match="give a multiple of 128"):
        validate(given, world_size=1, gpu_count=0)
    assert parse_config(["--preset", "masked-cartpole"]).per_rank_batch_size == 128  # the preset's own
    assert parse_config(["--per-rank-batch-size=256", "--recurrent"]).per_rank_batch_size == 256


@pytest.mark.parametrize(
    ("args", "report"),
    [(["sac", "--checkpoint-every", "500"], 1000), (["--num-envs", "4", "--checkpoint-every", "256"], 512)],
)
def test_a_checkpoint_interval_finer_than_the_reports_is_refused(args, report):
    with pytest.raises(UsageError, match=f"finer than the run's reports, every {report} env steps"):
        validate(parse_config(args), world_size=1, gpu_count=0)
    validate(parse_config([*args[:-1], str(report)]), world_size=1, gpu_count=0)
    with pytest.raises(UsageError, match=r"^--checkpoint-every: 1 step is finer than the run's reports"):
        validate(parse_config([*args[:-1], "1"]), world_size=1, gpu_count=0)


def test_a_config_file_sets_flags_that_the_command_line_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: hopper\nnum-steps: 256\nupdate_epochs: 3\nseed: 5\n")
    cfg = parse_config(["--config", str(path), "--seed", "9"])
    assert (cfg.env_id, cfg.learning_rate) == ("Hopper-v5", 9.80828e-05)  # the preset the file names
    assert (cfg.num_steps, cfg.update_epochs, cfg.seed) == (256, 3, 9)  # the file's, then the command line's
    sac = tmp_path / "sac.json"
    sac.write_text('{"net_arch": [32, 16], "use_sde": true}')
    assert (parse_config(["sac", "--config", str(sac)]).net_arch) == (32, 16)


def test_a_preset_beside_flags_written_with_another_preset_or_none_is_refused(tmp_path):
    """Those flags come on top of the preset's and would override all of them: a run labelled with a preset it
    does not follow. A file of a few flags, or of the same preset, takes a preset beneath it."""
    from rl.config_files import write_config_file

    written = tmp_path / "hopper.yaml"
    write_config_file(parse_config(["--preset", "hopper"]), str(written))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    write_config_file(parse_config([]), str(run / "config.yaml"))
    checkpoint = str(run / "checkpoints" / "step_000000002048.ckpt")
    for argv, told in (
        (["--config", str(written), "--preset", "cartpole"], "hopper.yaml holds the flags of a run with preset hopper"),
        (
            ["--config", str(run / "config.yaml"), "--preset", "cartpole"],
            "config.yaml holds the flags of a run without",
        ),
        (
            ["--resume-from", checkpoint, "--preset", "cartpole"],
            "config.yaml holds the flags of a run without a preset",
        ),
    ):
        with pytest.raises(UsageError, match=re.escape(told)) as refused:
            parse_config(argv)
        assert refused.value.flag == "--preset" and str(refused.value).endswith("give one or the other")
    assert parse_config(["--config", str(written), "--preset", "hopper"]).env_id == "Hopper-v5"
    few = tmp_path / "few.yaml"
    few.write_text("num_steps: 64\n")
    cfg = parse_config(["--config", str(few), "--preset", "cartpole"])
    assert (cfg.num_steps, cfg.num_envs, cfg.preset) == (64, 4, "cartpole")


def test_a_checkpoint_away_from_its_run_folder_gives_its_own_flags_but_its_folder(tmp_path):
    """Copied elsewhere, a checkpoint has no config file beside it: the config it holds gives the run's flags where
    the command line gives none, but the run's name and log folder (it takes a folder of its own here), and a
    following default at the value it followed (it follows this run's flags)."""
    trained = parse_config(["sac", "--preset", "pendulum", "--seed", "3", "--run-name", "theirs", "--log-dir", "/gone"])
    trained.update_while_stepping = True  # chosen, against --cuda's default: it carries over
    loose = tmp_path / "step_000000002048.ckpt"
    torch.save({"algorithm": "sac", "config": trained.to_dict()}, loose)
    resumed = parse_config(["sac", "--resume-from", str(loose), "--gamma", "0.9"])
    assert (resumed.env_id, resumed.seed, resumed.preset, resumed.gamma) == ("Pendulum-v1", 3, "pendulum", 0.9)
    assert (resumed.run_name, resumed.log_dir, resumed.update_while_stepping) == (None, "logs", True)
    trained.update_while_stepping = False  # as --cuda's default left it on a CPU: it follows this run's --cuda
    torch.save({"algorithm": "sac", "config": trained.to_dict()}, loose)
    assert parse_config(["sac", "--resume-from", str(loose), "--cuda"]).update_while_stepping
    with pytest.raises(
        UsageError, match=re.escape("step_000000002048.ckpt holds the flags of a run with preset pendulum")
    ):
        parse_config(["sac", "--resume-from", str(loose), "--preset", "hopper"])
    assert parse_config(["--resume-from", str(loose)]).env_id == "CartPole-v1"  # another algorithm's: not its flags


def pipelined_run(tmp_path) -> Path:
    """A decoupled run's folder whose flags say --pipeline; the path of a checkpoint in it (not read here)."""
    from rl.config_files import write_config_file

    run = tmp_path / "logs" / "fabric_decoupled_logs" / "pipelined"
    (run / "checkpoints").mkdir(parents=True)
    write_config_file(PPOConfig(pipeline=True), str(run / "config.yaml"))
    return run / "checkpoints" / "step_000000000512.ckpt"


@pytest.mark.parametrize(
    ("given", "schedule"),
    [
        (["--async"], (True, False)),  # the file's --pipeline gives way
        (["--no-async"], (False, True)),  # turning one off leaves the other
        ([], (False, True)),
    ],
)
def test_a_decoupled_schedule_on_the_command_line_replaces_the_one_a_config_file_or_resumed_run_gives(
    tmp_path, given, schedule
):
    checkpoint = pipelined_run(tmp_path)
    for argv in (["--config", str(checkpoint.parent.parent / "config.yaml")], ["--resume-from", str(checkpoint)]):
        cfg = parse_config([*argv, *given], "decoupled")
        assert (cfg.asynchronous, cfg.pipeline) == schedule, argv


def test_a_decoupled_schedule_built_in_python_replaces_the_one_a_resumed_run_gives(tmp_path):
    from rl.api import completed

    checkpoint = str(pipelined_run(tmp_path))
    asynchronous = completed(PPOConfig(resume_from=checkpoint, asynchronous=True), "decoupled")
    assert (asynchronous.asynchronous, asynchronous.pipeline) == (True, False)
    resumed = completed(PPOConfig(resume_from=checkpoint), "decoupled")
    assert (resumed.asynchronous, resumed.pipeline) == (False, True)


def test_a_config_file_takes_numbers_yaml_leaves_as_text_and_a_lone_value_for_a_list(tmp_path):
    """PyYAML reads 3e-4 and 1e6 as text (YAML 1.1 wants 3.0e-4): they are numbers all the same."""
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 3e-4\ntotal_timesteps: 1e6\nnum_envs: 4.0\nlogger: csv\ntarget_kl: null\n")
    cfg = parse_config(["--config", str(path)])
    assert (cfg.learning_rate, cfg.total_timesteps, cfg.num_envs) == (3e-4, 1_000_000, 4)
    assert type(cfg.total_timesteps) is int and cfg.logger == ("csv",) and cfg.target_kl is None


@pytest.mark.parametrize(
    "argv",
    [
        ["sac", "--preset", "bipedalwalker", "--seed", "3", "--no-use-sde"],
        ["--preset", "masked-cartpole", "--logger", "csv", "tensorboard", "--target-kl", "0.02", "--async"],
        ["--preset", "atari-ppo", "--env-kwarg", "mode=1", "--run-name", "7"],
    ],
)
def test_the_resolved_config_written_out_is_taken_back_whole(tmp_path, argv):
    from rl.config_files import write_config_file

    original = parse_config(argv)
    for name in ("resolved.yaml", "resolved.json"):
        write_config_file(original, str(tmp_path / name))
        again = parse_config(["--config", str(tmp_path / name)])  # the file names its algorithm
        assert again.to_dict() | {"config": None} == original.to_dict()


@pytest.mark.parametrize(
    ("text", "told"),
    [
        ("num_envz: 4\n", "sets 'num_envz', which is no flag of PPOConfig: did you mean num_envs?"),
        ("- 1\n", "must map flag names to values"),
        ("a: [1\n", "is not valid YAML"),
        (None, "cannot read"),
        ("num_envs: four\n", "sets num_envs: 'four', which is not a whole number"),
        ("num_envs: 2.5\n", "sets num_envs: 2.5, which is not a whole number"),
        ("anneal_lr: 1\n", "sets anneal_lr: 1, which is not true or false"),
        ("vector_mode: fast\n", "sets vector_mode: 'fast', which is not one of auto, sync, async, native, envpool"),
        ("logger: [csv, tb]\n", "which is not a list, each one of tensorboard, csv, wandb"),
        ("target_kl: high\n", "sets target_kl: 'high', which is not a number or null"),
        ("env_kwargs: [1]\n", "sets env_kwargs: [1], which is not a dict of keyword arguments (or its JSON text)"),
        ("config: other.yaml\n", "sets 'config', which only the command line takes (--config)"),  # not SAC's
        ("num_envs: 2\nseed: 3\nnum_envs: 4\n", "sets 'num_envs' twice (lines 1 and 3): keep one"),  # not 4 in silence
        ("env_kwargs: {g: 9.8, g: 4.0}\n", "sets 'g' twice (line 1): keep one"),
        ("write-config: out.yaml\n", "sets 'write-config', which only the command line takes (--write-config)"),
        # another program's names, answered with this one's
        ("n_steps: 512\n", "sets 'n_steps', Stable-Baselines3's name, not this program's: --num-steps"),
        ("clip-range: 0.1\n", "sets 'clip-range', Stable-Baselines3's name, not this program's: --clip-coef"),
        ("norm_adv: true\n", "sets 'norm_adv', CleanRL's name, not this program's: --normalize-advantages"),
        ("policy: MlpPolicy\n", "sets 'policy', Stable-Baselines3's name, not this program's: --encoder mlp or cnn"),
        ("HalfCheetah-v4:\n  n_envs: 1\n", "sets 'HalfCheetah-v4', an env id, as rl-zoo's files hold an entry per env"),
        # an rl-zoo PPO file sets batch_size, a flag of SAC here, beside names no SAC file has
        ("batch_size: 64\nn_steps: 512\n", "sets 'batch_size', Stable-Baselines3's name, not PPO's: --per-rank-batch"),
        ("batch_size: 64\n", "sets 'batch_size', a flag of SAC, not of PPO: add algorithm: sac to the file, or name"),
        # a file that names its algorithm meant it: no advice to name another
        ("algorithm: sac\nclip_coef: 0.1\n", "sets 'clip_coef', a flag of PPO, not of SAC, the algorithm it names"),
        ("algorithm: sac\nlearning_rate: 3e-4\n", "Stable-Baselines3's name, not SAC's: give SAC's two rates"),
        ("policy_kwargs: dict(ortho_init=False)\n", "Stable-Baselines3's name, not this program's: give its entries"),
        ("env_wrapper: sb3_contrib.common.wrappers.TimeFeatureWrapper\n", "rl-zoo's name, not this program's: --time"),
        (
            "learning_rate: lin_2.5e-4\n",
            "which is not a number: rl-zoo's linear schedule; give learning_rate: 2.5e-4 with anneal_lr: true",
        ),
        ("clip_coef: lin_0.1\n", "rl-zoo's linear schedule, which this key does not take; give clip_coef: 0.1"),
    ],
)
def test_a_bad_config_file_is_named_in_one_line(tmp_path, text, told):
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(told)) as raised:
        parse_config(["--config", str(path)])
    assert raised.value.flag == "--config"


def test_a_path_that_starts_with_a_tilde_where_no_shell_expands_it_is_in_the_users_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "flags.yaml").write_text("log_dir: ~/from-file\nexp_name: ~mine\n")
    assert parse_config(["--log-dir=~/runs"]).log_dir == str(tmp_path / "runs")  # no shell expands it after =
    from_file = parse_config(["--config", "~/flags.yaml"])
    assert (from_file.log_dir, from_file.exp_name) == (str(tmp_path / "from-file"), "~mine")  # a name, not a path


def test_a_json_config_file_that_sets_a_flag_twice_is_refused(tmp_path):
    path = tmp_path / "twice.json"
    path.write_text('{"num_envs": 2, "num_envs": 4}')
    with pytest.raises(UsageError, match=re.escape(f"{path} sets 'num_envs' twice: keep one")):
        parse_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("argv", "algorithm", "told"),
    [
        (
            ["sac", "--buffer-size", "5000"],
            [],
            "sets 'buffer_size', a flag of SAC, not of PPO: add algorithm: sac to the file, or name the algorithm",
        ),
        (["--update-epochs", "3"], ["sac"], "a flag of PPO, not of SAC: add algorithm: ppo to the file, or name"),
    ],
    ids=["sac-file-as-ppo", "ppo-file-as-sac"],
)
def test_a_config_file_of_another_algorithm_without_its_name_is_named_as_that_algorithms(
    tmp_path, argv, algorithm, told
):
    """A file written by hand, or by an earlier version, that leaves out `algorithm:`."""
    from rl.config_files import ALGORITHM_KEY, write_config_file

    path = tmp_path / "config.yaml"
    write_config_file(parse_config(argv), str(path))
    lines = path.read_text().splitlines()
    path.write_text("\n".join(line for line in lines if not line.startswith(f"{ALGORITHM_KEY}:")))
    with pytest.raises(UsageError, match=re.escape(told)) as raised:
        parse_config([*algorithm, "--config", str(path)])
    assert raised.value.flag == "--config" and str(raised.value).endswith(f"--config {path}")


@pytest.mark.parametrize("spelling", ["--config {}", "--config={}"])
def test_a_config_file_names_its_algorithm_which_the_command_line_need_not(tmp_path, spelling):
    from rl.config_files import write_config_file

    sac_file, ppo_file = tmp_path / "sac.yaml", tmp_path / "ppo.json"
    write_config_file(parse_config(["sac", "--buffer-size", "5000"]), str(sac_file))
    write_config_file(parse_config(["--update-epochs", "3"]), str(ppo_file))
    assert sac_file.read_text().startswith("algorithm: sac\n")
    for path, config_type, value in ((sac_file, SACConfig, ("buffer_size", 5000)), (ppo_file, PPOConfig, None)):
        for named in ([], [config_type.ALGORITHM]):
            cfg = parse_config([*named, *spelling.format(path).split()])
            assert type(cfg) is config_type and (value is None or getattr(cfg, value[0]) == value[1])
    with pytest.raises(UsageError, match=re.escape("holds SAC's flags (algorithm: sac), not PPO's: drop ppo")):
        parse_config(["ppo", "--config", str(sac_file)])
    sac_file.write_text(sac_file.read_text().replace("algorithm: sac", "algorithm: td3"))
    with pytest.raises(UsageError, match=re.escape("sets algorithm: td3, which is not ppo or sac")) as raised:
        parse_config(["--config", str(sac_file)])
    assert raised.value.flag == "--config"


MODE_FLAG_EXAMPLES = {
    "eval_every": ["--eval-every", "100"],
    "stop_at_return": ["--stop-at-return", "5"],
    "pipeline": ["--pipeline"],
    "evaluator": ["--evaluator"],
    "num_players": ["--num-players", "2"],
    "asynchronous": ["--async"],
    "max_policy_lag": ["--max-policy-lag", "2"],
    "workers": ["--workers", "2"],
    "sync": ["--sync", "synced"],
    "sync_every": ["--sync-every", "2"],
}


@pytest.mark.parametrize("mode", ["coupled", "decoupled", "hogwild"])
def test_each_entry_script_takes_its_own_modes_flags_and_names_the_mode_of_anothers(mode, capsys):
    from rl.config import MODE_COMMANDS

    assert set(MODE_FLAG_EXAMPLES) == {name for names in RunConfig.MODE_FIELDS.values() for name in names}
    with pytest.raises(SystemExit):
        parse_config(["--help"], mode)
    listed = set(re.findall(r"^\s+(--[a-z0-9-]+)", capsys.readouterr().out, re.MULTILINE))
    for other, names in RunConfig.MODE_FIELDS.items():
        for name in names:
            assert (flag(name) in listed) == (other == mode), name
            if other == mode:
                parse_config(MODE_FLAG_EXAMPLES[name], mode)
                continue
            with pytest.raises(UsageError, match=f"belongs to {re.escape(MODE_COMMANDS[other])}") as error:
                parse_config(MODE_FLAG_EXAMPLES[name], mode)
            assert error.value.flag == flag(name)
    assert {"--seed", "--env-id", "--checkpoint-every"} <= listed  # every mode's


@pytest.mark.parametrize(
    ("text", "mode", "told"),
    [
        (
            "workers: 2\n",
            "coupled",
            "sets workers: 2, which belongs to Hogwild mode: python train_hogwild.py ...; drop",
        ),
        ("eval_every: 500\n", "hogwild", "sets eval_every: 500, which belongs to coupled mode: fabric run ... train"),
        ("evaluator: true\n", "coupled", "sets evaluator: True, which belongs to decoupled mode: fabric run ... train"),
    ],
)
def test_a_config_files_key_of_another_mode_is_named_as_the_files_not_as_a_flag(tmp_path, text, mode, told):
    """A run folder's config.yaml holds every mode's flags: another mode's run's file sets its own."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    cfg = parse_config(["--config", str(path)], mode)
    with pytest.raises(UsageError) as error:
        check_mode_flags(cfg, mode)
    assert error.value.flag == "--config"
    assert str(error.value).startswith(f"--config: {path} {told}")
    assert str(error.value).endswith(f"drop it from the file to train in {mode} mode")
    cfg.config = None  # the same value given another way (in Python) is named as the flag it is
    with pytest.raises(UsageError) as error:
        check_mode_flags(cfg, mode)
    assert error.value.flag != "--config"


@pytest.mark.parametrize(
    ("argv", "captured"),
    [
        ([], False),  # on the CPU
        (["--cuda"], True),
        (["sac", "--cuda"], True),
        (["--cuda", "--precision", "bf16-mixed"], True),
        (["--cuda", "--no-cuda-graphs"], False),
        (["sac", "--cuda", "--precision", "16-mixed"], False),  # these two refuse an explicit --cuda-graphs
        (["--cuda", "--target-kl", "0.01"], False),
        (["--cuda", "--recurrent"], False),  # a captured recurrent replay is a choice: not measured faster
        (["--cuda", "--recurrent", "--cuda-graphs"], True),
        (["sac", "--cuda", "--compile"], False),  # compile with graphs is a choice, not the default
        (["sac", "--cuda", "--compile", "--cuda-graphs"], True),
    ],
)
def test_cuda_graphs_are_on_by_default_on_a_gpu_where_they_can_serve(argv, captured):
    from rl.config import check_cuda_graphs

    cfg = parse_config(argv)
    assert cfg.cuda_graphs is captured
    check_cuda_graphs(cfg)  # a default is never one the run refuses


@pytest.mark.parametrize(
    ("written", "then", "captured"),
    [
        ([], ["--cuda"], True),  # written on a CPU, trained on a GPU: captured, as --cuda alone would be
        (["sac", "--cuda"], [], True),
        (["--cuda"], ["--no-cuda"], False),  # the default followed --cuda; a choice would be refused without it
        (["--cuda", "--no-cuda-graphs"], [], False),  # a choice stays
        (["sac", "--cuda", "--compile", "--cuda-graphs"], [], True),
    ],
)
def test_a_written_config_holds_cuda_graphs_only_where_they_were_chosen(tmp_path, written, then, captured):
    from rl.config import check_cuda_graphs
    from rl.config_files import write_config_file

    path = str(tmp_path / "written.yaml")
    write_config_file(parse_config(written), path)
    cfg = parse_config(["--config", path, *then])
    assert cfg.cuda_graphs is captured
    check_cuda_graphs(cfg)


@pytest.mark.parametrize(("argv", "describes"), [(["--help"], "Proximal Policy"), (["sac", "--help"], "Soft Actor")])
def test_an_entry_scripts_help_describes_its_algorithm(argv, describes, capsys):
    with pytest.raises(SystemExit):
        parse_config(argv, mode="hogwild")
    assert describes in capsys.readouterr().out


def test_a_checkpoints_run_folder_is_named_as_a_new_runs_folder_is(tmp_path, monkeypatch):
    """Relative to the working folder where it lies below it, however the checkpoint was named: a relaunch of a named
    run (which resumes from its newest checkpoint) prints the folder its first launch printed."""
    monkeypatch.chdir(tmp_path)
    below = os.path.join("logs", "fabric_logs", "named")
    for checkpoint in (tmp_path / below / "checkpoints" / "step_1.ckpt", f"{below}/checkpoints/step_1.ckpt"):
        assert run_dir_of(str(checkpoint)) == below
    elsewhere = tmp_path.parent / "elsewhere"
    assert run_dir_of(str(elsewhere / "checkpoints" / "step_1.ckpt")) == str(elsewhere)
    assert run_dir_of("../elsewhere/checkpoints/step_1.ckpt") == str(elsewhere)
    assert run_dir_of(str(tmp_path / "step_1.ckpt")) is None  # moved out of its run: resumed in a folder of its own


@pytest.mark.parametrize("command", ["ppo", "sac", "evaluate", "export", "slurm", "tune"])
def test_a_default_stated_in_words_is_the_only_default_help_gives(command, capsys):
    """A flag whose value by default is None, worked out at run time, says in its help what it works out; tyro's own
    "(default: None)" beside it would contradict it. The flags page shows that default in its default column."""
    from rl.evaluate import EvalConfig
    from rl.export import ExportConfig
    from rl.slurm import SlurmConfig
    from rl.tune import TuneConfig

    commands = {"ppo": PPOConfig, "sac": SACConfig, "evaluate": EvalConfig, "export": ExportConfig}
    config_type = {**commands, "slurm": SlurmConfig, "tune": TuneConfig}[command]
    with pytest.raises(SystemExit):
        parse_dataclass(config_type, ["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for doc in field_docstrings(config_type).values():
        meaning, default = stated_default(doc)
        if default is not None:
            assert f"{' '.join(meaning.split())} (default: {default})" in help_text
            assert f"(default: {default}) (default: " not in help_text
    assert "{None}" not in help_text and "(default: None)" not in help_text  # Python's None, not the user's words


def test_an_optional_flags_help_shows_the_value_it_takes_and_none_by_default(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--resume-from STR continue the run saved" in help_text and "--target-kl FLOAT stop" in help_text
    assert "--preset {cartpole,acrobot," in help_text
    assert (
        "(same envs, network and seed; coupled ranks, decoupled players and trainers may change in number) "
        "(default: none)" in help_text
    )


def test_the_flags_page_shows_a_default_stated_in_words_in_its_default_column():
    from rl.reference import reference

    run_name = next(line for line in reference().splitlines() if line.startswith("| `--run-name`"))
    cells = [cell.strip() for cell in run_name.split(" | ")]
    assert cells[2].startswith("experiment, env, seed and start time") and "(default:" not in run_name


def test_a_rollout_that_cannot_fit_is_refused_before_allocation_and_a_refused_run_prints_no_hint(tmp_path, capsys):
    """PPO allocates its rollout whole as the run starts, as SAC does its replay buffer: one this machine cannot hold
    is refused in one line naming --num-steps, not by the allocator's traceback. A refused run prints its error alone,
    without the preset hint that a run which starts prints."""
    from rl.cli import prepare

    acrobot = ["--env-id", "Acrobot-v1", "--log-dir", str(tmp_path), "--torch-threads", str(torch.get_num_threads())]
    too_long = ["--num-steps", str(10**10), "--total-timesteps", str(10**11)]
    with pytest.raises(UsageError, match=r"^--num-steps: 1 rollout of 20,000,000,000 env steps needs \d+\.\d GiB, but"):
        prepare([*acrobot, *too_long], "fabric_logs")
    assert "hint:" not in capsys.readouterr().out
    prepare(acrobot, "fabric_logs")
    assert "hint: --preset acrobot is tuned for Acrobot-v1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "interval"),
    [("8192", (8192, 0.0)), ("1e5", (100_000, 0.0)), ("2.5E4", (25_000, 0.0)), ("90s", (0, 90.0)), ("2h", (0, 7200.0))],
)
def test_a_checkpoint_interval_is_env_steps_in_either_form_the_whole_number_flags_take_or_a_time(text, interval):
    from rl.config import checkpoint_interval

    assert checkpoint_interval(text) == interval


@pytest.mark.parametrize("text", ["1.5", "1.5e0", "-5", "0s", "10x", "10min", "infs", "1e400h", "nanm"])
def test_a_checkpoint_interval_that_is_no_count_of_steps_nor_a_positive_time_is_refused(text):
    from rl.config import checkpoint_interval

    with pytest.raises(UsageError, match=r"^--checkpoint-every: give env steps \(8192\) or a positive time"):
        checkpoint_interval(text)


@pytest.mark.parametrize("name", ["../elsewhere", "a/b", ".", "..", " "])
def test_a_run_name_that_is_no_folder_name_is_refused_and_read_nowhere(tmp_path, name):
    for folder in ("logs/fabric_logs/checkpoints", "logs/checkpoints"):  # what `.` and `..` would find checkpoints in
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "step_000000000512.ckpt").touch()
    assert named_runs_newest_checkpoint(name, str(tmp_path / "logs"), "fabric_logs") is None
    with pytest.raises(UsageError) as refused:
        validate_values(PPOConfig(run_name=name), env_ranks=1)
    assert str(refused.value) == f"--run-name: must be a folder name, without {os.sep}; got {name!r}"


def test_a_run_name_longer_than_a_folder_name_can_be_is_refused_before_any_folder_is_read(tmp_path):
    """The file system would refuse it (Python 3.11's glob raises the error where it looks for checkpoints)."""
    name = "é" * 128  # 256 bytes in UTF-8
    assert named_runs_newest_checkpoint(name, str(tmp_path / "logs"), "fabric_logs") is None
    with pytest.raises(UsageError) as refused:
        validate_values(PPOConfig(run_name=name), env_ranks=1)
    assert str(refused.value) == "--run-name: must be a folder name, at most 255 bytes long; got 256"
    validate_values(PPOConfig(run_name="é" * 127), env_ranks=1)
