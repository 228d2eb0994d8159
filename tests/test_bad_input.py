"""Bad input ends every rank with one line naming the flag and exit code 2, before any collective."""

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, free_port, launch, refusal_line
from torch.distributed import TCPStore

from rl.algos.ppo.config import PPOConfig
from rl.cli import check_run_folder_name_fits
from rl.config import flag
from rl.errors import PEER_GRACE_SECONDS, UsageError
from rl.evaluate import EvalConfig
from rl.evaluate import parse as parse_evaluation
from rl.export import ExportConfig
from rl.export import main as export_main
from rl.flag_parsing import parse_dataclass
from rl.peer_flags import EVALUATION_PEER_FLAGS
from rl.slurm import main as slurm_main
from rl.tune import parse as tune_parse

BAD_INPUTS = [
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--env-id", "envs_for_tests:TextObservations-v0"], "--env-id"),  # a Text observation space
    (["--per-rank-batch-size", "512"], "--per-rank-batch-size"),
    (["--env-groups", "3"], "--env-groups"),  # 2 envs
    (["--num-steps", "0"], "--num-steps"),
    (["--learning-rate", "-0.001"], "--learning-rate"),
    (["--total-timesteps", "200"], "--total-timesteps"),  # one rollout is 2 envs x 128 steps per rank
    (["--no-such-flag"], "--no-such-flag"),
    (["--env-id", "Acrobot-v1", "--vector-mode", "native"], "--vector-mode"),  # no native Acrobot
    (["--preset", "humanoid"], "--preset"),
    (["--precision", "16-mixed"], "--precision"),  # fp16 needs a GPU
    (["--precision", "fp8"], "--precision"),
    (["--precision", "16-true"], "--precision"),  # a Fabric precision this project does not train at
    (["--compile-mode", "max-autotune"], "--compile-mode"),  # without --compile
    (["--env-id", "envs_for_tests:FixedLength-v0", "--time-feature"], "--time-feature"),  # no time limit
    (["--env-id", "rl/PixelCartPole-v1", "--time-feature"], "--time-feature"),  # image observations
    (["sac", "--cuda-graphs"], "--cuda-graphs"),  # captured on a GPU only
    (["--frame-stack", "2"], "--frame-stack"),  # CartPole's vectors pass by the image wrappers
    (["--no-clip-rewards"], "--clip-rewards"),  # CartPole is no Atari game
    (["--env-id", "rl/PixelCartPole-v1", "--frame-skip", "2"], "--frame-skip"),  # images, not an Atari game's
]
if not torch.cuda.is_available():
    BAD_INPUTS.append((["--cuda"], "--cuda"))


def test_a_run_name_longer_than_a_folder_name_can_be_is_refused_before_the_folder_of_runs_is_searched(tmp_path):
    """Where the folder of runs exists, looking for that run's checkpoints would raise the file system's error."""
    (tmp_path / "runs" / "fabric_logs").mkdir(parents=True)
    line = refusal_line("fabric", ["--run-name", "x" * 256, "--log-dir", str(tmp_path / "runs")], tmp_path)
    assert line == "error: --run-name: must be a folder name, at most 255 bytes long; got 256"


def test_an_experiment_name_too_long_for_its_run_folders_is_refused_before_the_run_starts(tmp_path):
    """_CartPole-v1_42_ and the start time (20261207_065216) add 31 bytes."""
    line = refusal_line("fabric", ["--exp-name", "x" * 225], tmp_path)
    told = "must leave run folder names at most 255 bytes long, got 256 (with the env and seed)"
    assert line == f"error: --exp-name: {told}"
    check_run_folder_name_fits(PPOConfig(exp_name="x" * 224))  # 255 bytes: taken


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize(("args", "flag"), BAD_INPUTS, ids=[flag for _, flag in BAD_INPUTS])
def test_bad_input_stops_before_training_with_one_line_naming_the_flag(tmp_path, args, flag):
    assert refusal_line("fabric", args, tmp_path).startswith(f"error: {flag}: ")


def test_a_single_process_exits_2_with_one_line_and_writes_nothing(tmp_path):
    finished = launch("python", SCRIPTS["fabric"], ["--env-id", "NoSuchEnv-v0"], tmp_path)
    assert finished.returncode == 2
    (line,) = error_lines(finished.stderr)
    assert line.startswith("error: --env-id: ")
    assert "Traceback" not in finished.stderr
    assert not (tmp_path / "logs").exists()


# Under a launcher, an input refused where the env is checked, one refused by the parser, and the precisions
# that fabric run takes as its own option and hands to the ranks: how every rank stops does not depend on
# which flag was bad, and each message is checked above.
ONE_OF_EACH_KIND = ("NoSuchEnv-v0", "--no-such-flag", "16-mixed", "16-true")
IN_THE_SLOW_TIER = ("--no-such-flag", "16-true")  # they stop as the other two do
LAUNCHED = [case for case in BAD_INPUTS if case[0][-1] in ONE_OF_EACH_KIND]
LAUNCHED_BAD_INPUTS = [
    pytest.param(*case, marks=pytest.mark.slow) if case[0][-1] in IN_THE_SLOW_TIER else case for case in LAUNCHED
]


@pytest.mark.parametrize(("args", "flag"), LAUNCHED_BAD_INPUTS, ids=[flag for _, flag in LAUNCHED])
def test_every_fabric_rank_exits_2_with_one_line(tmp_path, args, flag):
    finished = launch("fabric run", SCRIPTS["fabric"], args, tmp_path, timeout=60)
    assert finished.returncode != 0
    lines = error_lines(finished.stderr)
    assert len(lines) == 2 and all(line.startswith(f"error: {flag}: ") for line in lines)
    assert finished.stderr.count("exitcode  : 2") == 2  # the launcher's report of each failed rank
    assert finished.stderr.count(f"traceback : error: {flag}: ") == 2  # in it, each rank's line, not a link
    assert "[rank" not in finished.stderr  # no rank printed a traceback
    assert finished.seconds < 45


def test_every_torchrun_rank_exits_2_with_one_line(tmp_path):
    finished = launch("torchrun", SCRIPTS["torch"], ["--env-id", "NoSuchEnv-v0"], tmp_path, timeout=60)
    assert finished.returncode != 0
    lines = error_lines(finished.stderr)
    assert len(lines) == 2 and all(line.startswith("error: --env-id: ") for line in lines)
    assert finished.stderr.count("traceback : error: --env-id: ") == 2
    assert "[rank" not in finished.stderr


def test_a_rank_that_finds_bad_input_waits_for_a_peer_that_starts_seconds_later(tmp_path):
    """Under load one rank can reach the check seconds after another; the launcher stops every rank once the
    first exits, so the first must wait for the late one's report rather than for a fixed grace."""
    port = free_port()
    agent_store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    first = subprocess.Popen(
        [sys.executable, "-c", "from rl.errors import exit_after_peers_report as e; e()"], cwd=tmp_path, env=env
    )
    try:
        time.sleep(PEER_GRACE_SECONDS + 3)
        assert first.poll() is None, "the first rank left before its peer reported"
        agent_store.add("rl/error_reports/0", 1)  # the late rank's report
        assert first.wait(timeout=10) == 2
    finally:
        first.kill()


@pytest.mark.parametrize("tool", ["rl.evaluate", "rl.export", "rl.slurm"])
def test_the_tools_refuse_a_bad_flag_in_one_line(tmp_path, tool):
    args = ["CHECKPOINT", "--out", "policy.onnx"] if tool == "rl.export" else ["CHECKPOINT"]
    done = subprocess.run(
        [sys.executable, "-m", tool, *args, "--bogus"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --bogus: Unrecognized options: --bogus"


@pytest.mark.parametrize(
    ("main", "argv", "told"),
    [
        (
            parse_evaluation,
            ["run/agent.ckpt", "--episdes", "3"],
            "--episdes: Unrecognized options: --episdes, 3; did you mean --episodes?",
        ),
        (
            parse_evaluation,
            ["run/agent.ckpt", "--no-deterministc"],
            "--no-deterministc; did you mean --no-deterministic?",
        ),
        (
            export_main,
            ["run/agent.ckpt", "--out", "p.onnx", "--formt", "onnx"],
            "--formt, onnx; did you mean --format?",
        ),
        (slurm_main, ["--nodez", "2"], "--nodez: Unrecognized options: --nodez, 2; did you mean --nodes?"),
        (tune_parse, ["--trails", "3"], "--trails: Unrecognized options: --trails, 3; did you mean --trials?"),
        (tune_parse, ["--num-envs", "3"], "--num-envs: a training flag: give it after --"),  # not taken for a slip
    ],
)
def test_the_tools_answer_a_slip_of_a_flags_name_with_the_flag(main, argv, told):
    with pytest.raises(UsageError) as error:
        main(argv)
    assert told in str(error.value)


def parse_export(argv: list[str]) -> ExportConfig:
    return parse_dataclass(ExportConfig, argv)


@pytest.mark.parametrize(
    ("parse", "argv"),
    [
        (parse_evaluation, ["--bogus", "run/agent.ckpt"]),
        (parse_evaluation, ["--seed", "-1", "--bogus=2", "run/agent.ckpt"]),
        (parse_export, ["--bogus", "run/agent.ckpt", "--out", "policy.onnx"]),
    ],
)
def test_an_unknown_flag_before_the_checkpoint_is_named_not_the_checkpoint_it_swallowed(parse, argv):
    """The parser takes the file as the unknown flag's value, and would report no file given."""
    with pytest.raises(UsageError) as error:
        parse(argv)
    assert (error.value.flag, str(error.value)) == ("--bogus", "--bogus: Unrecognized options: --bogus")


def test_tunings_folders_that_start_with_a_tilde_after_an_equals_sign_are_in_the_users_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg, _ = tune_parse(["--out=~/tuning", "--space=~/space.yaml"])
    assert (cfg.out, cfg.space) == (str(tmp_path / "tuning"), str(tmp_path / "space.yaml"))


def test_an_evaluations_switches_take_true_or_false_as_training_flags_do():
    assert not parse_evaluation(["run/agent.ckpt", "--deterministic", "false", "--render=no"]).deterministic
    assert parse_evaluation(["run/agent.ckpt", "--capture-video", "True"]).capture_video
    with pytest.raises(UsageError, match=r"^--render: a switch takes no value, or true or false; got 'maybe'"):
        parse_evaluation(["run/agent.ckpt", "--render", "maybe"])


@pytest.mark.parametrize(
    ("argv", "word", "says"),
    [
        (["--algo", "ppo", "--env", "CartPole-v1", "-f", "logs/"], "--algo", "give the agent's file first"),
        (["-n", "5000", "run/agent.ckpt"], "-n", "rl-zoo's flag, not this program's: --episodes N counts episodes"),
        (["run/agent.ckpt", "--load-best"], "--load-best", "rl-zoo's flag, not this program's: give the best agent's"),
        (["run/agent.ckpt", "--env", "Hopper-v5"], "--env", "the agent's own env by default; --env-id evaluates"),
        (["run/agent.ckpt", "--n-eval-episodes=5"], "--n-eval-episodes", "Stable-Baselines3's flag, not this"),
    ],
)
def test_rl_zoos_evaluation_flags_are_answered_with_this_programs(argv, word, says):
    with pytest.raises(UsageError) as error:
        parse_evaluation(argv)
    assert error.value.flag == word
    assert says in str(error.value)


def test_each_flag_an_evaluation_peer_flag_is_answered_with_is_a_flag_of_rl_evaluate():
    flags_here = {flag(member.name) for member in dataclasses.fields(EvalConfig)}
    assert {peer.flag_here for peer in EVALUATION_PEER_FLAGS.values()} - {None} <= flags_here
    assert not set(EVALUATION_PEER_FLAGS) & (flags_here | {"--no-render", "--no-deterministic", "--stochastic"})


def test_a_missing_checkpoint_argument_is_named_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rl.evaluate"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line == "error: CHECKPOINT: missing: python -m rl.evaluate needs CHECKPOINT (the file to evaluate)"


EVALUATE_WITHOUT_WANDB = (  # as where the tracking extra is not installed
    "import runpy, sys; sys.modules['wandb'] = None; "
    "runpy.run_module('rl.evaluate', run_name='__main__', alter_sys=True)"
)


def test_an_evaluation_to_log_to_wandb_without_it_is_refused_before_it_plays(tmp_path):
    """At once, not after the episodes (a million here) whose scores it would log."""
    agent = Path(__file__).parent / "data" / "checkpoint-v1" / "agent.ckpt"
    command = [sys.executable, "-c", EVALUATE_WITHOUT_WANDB, str(agent), "--episodes", "1000000", "--logger", "wandb"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line == "error: --logger: wandb needs the tracking extra: pip install -e '.[tracking]'"


def test_a_tool_names_itself_as_it_was_run_not_by_its_files_path(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rl.export", "CHECKPOINT"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --out: missing: python -m rl.export needs --out (the file to write)"


def test_every_missing_required_argument_is_named_with_what_it_is():
    from rl.export import ExportConfig
    from rl.flag_parsing import parse_dataclass

    with pytest.raises(UsageError) as refused:
        parse_dataclass(ExportConfig, ["--format", "onnx"], prog="python -m rl.export")
    assert (refused.value.flag, refused.value.message) == (
        "CHECKPOINT",
        "missing: python -m rl.export needs CHECKPOINT (the file to export) and --out (the file to write)",
    )
