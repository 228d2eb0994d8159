"""Checkpoints, exact resume, faults and the evaluation CLI, with real processes on CPU."""

import collections
import dataclasses
import io
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    BIN,
    SCRIPTS,
    all_scalars,
    child_env,
    child_pids,
    kill_process_group,
    launch_together,
    load_agent,
    rank_pid,
    reached_step,
    refusal_line,
    run_dir,
    run_ranks,
    start,
    start_as_foreground_job,
    wait_until_the_run_opens,
)

import rl.checkpoint
from rl.algos.ppo.config import PPOConfig
from rl.algos.sac.config import SACConfig
from rl.checkpoint import Counters, TrainingCheckpoint, load_checkpoint, newest_checkpoint, save_file_atomically
from rl.cli import keep_global_batch, parse_config, shares_out
from rl.errors import UsageError
from rl.loop import STOP_CHECK_STEPS

QUICK = ["--update-epochs", "2", "--eval-episodes", "0", "--no-progress-bar"]


def checkpoints(cwd: Path, mode: str = "fabric") -> list[Path]:
    return sorted((run_dir(cwd, mode) / "checkpoints").glob("step_*.ckpt"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """4,096 steps in one go (checkpointing every 1,024, keeping 2), and 2,048 + 2,048 resumed.

    Maps each name to its run folder; a resumed run continues in the folder of its checkpoint.
    """
    folders = {}

    def run(name, launcher, script, args, mode="fabric"):
        cwd = tmp_path_factory.mktemp(name)
        finished = run_ranks(launcher, script, QUICK + args, cwd)
        assert finished.returncode == 0, finished.stderr[-3000:]
        folders[name] = run_dir(cwd, mode)
        return folders[name]

    def last_checkpoint(folder):
        return str(sorted((folder / "checkpoints").glob("step_*.ckpt"))[-1])

    def copy_of(folder, name):
        return Path(shutil.copytree(folder, tmp_path_factory.mktemp(name) / folder.name))

    every = ["--checkpoint-every", "1024", "--keep-last", "2"]
    run("full", "fabric run", SCRIPTS["fabric"], ["--total-timesteps", "4096", *every])
    fabric_half = run("fabric-half", "fabric run", SCRIPTS["fabric"], ["--total-timesteps", "2048"])
    torch_half = run("torch-half", "torchrun", SCRIPTS["torch"], ["--total-timesteps", "2048"], mode="torch")
    folders["fabric-to-torch"] = copy_of(fabric_half, "fabric-to-torch")
    folders["fabric-resumed"] = copy_of(fabric_half, "fabric-resumed")
    folders["torch-resumed"] = copy_of(torch_half, "torch-resumed")
    resume = [*QUICK, "--total-timesteps", "4096", "--resume-from"]
    for name, launcher, mode, flags in (
        # Without QUICK's flags: the run's own (its --update-epochs 2 among them) are taken from its folder.
        ("fabric-resumed", "fabric run", "fabric", ["--total-timesteps", "4096", "--resume-from"]),
        ("torch-resumed", "torchrun", "torch", resume),
        ("fabric-to-torch", "torchrun", "torch", resume),
    ):
        finished = run_ranks(launcher, SCRIPTS[mode], [*flags, last_checkpoint(folders[name])], folders[name])
        assert finished.returncode == 0, finished.stderr[-3000:]
    folders["fabric_half_checkpoint"] = Path(last_checkpoint(fabric_half))
    return folders


@pytest.mark.parametrize("resumed", ["fabric-resumed", "torch-resumed", "fabric-to-torch"])
def test_resuming_equals_an_uninterrupted_run(runs, resumed):
    full = load_agent(runs["full"])["policy"]
    continued = load_agent(runs[resumed])["policy"]
    assert all(torch.equal(full[name], continued[name]) for name in full)
    full_losses = all_scalars(runs["full"], "Loss/policy_loss")
    assert sorted(full_losses) == [512 * k for k in range(1, 9)]
    assert all_scalars(runs[resumed], "Loss/policy_loss") == full_losses  # 512..2048 before the stop, the rest after


def test_a_checkpoint_moved_out_of_its_run_resumes_exactly_into_a_run_folder_of_its_own(runs, tmp_path):
    (downloads := tmp_path / "downloads").mkdir()
    loose = shutil.copy(runs["fabric_half_checkpoint"], downloads)
    # Without the run's own --update-epochs 2: the checkpoint, away from its folder's config file, holds it.
    flags = ["--eval-episodes", "0", "--no-progress-bar", "--total-timesteps", "4096", "--resume-from", loose]
    finished = run_ranks("fabric run", SCRIPTS["fabric"], flags, tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["downloads", "logs"]  # nothing beside either
    assert [path.name for path in downloads.iterdir()] == [Path(loose).name]
    full, resumed = load_agent(runs["full"])["policy"], load_agent(run_dir(tmp_path, "fabric"))["policy"]
    assert all(torch.equal(full[name], resumed[name]) for name in full)


def test_a_resumed_runs_config_file_repeats_the_run_rather_than_resuming_it_again(runs):
    again = parse_config(["--config", str(runs["fabric-resumed"] / "config.yaml")])
    assert again.resume_from is None and again.total_timesteps == 4096 and again.update_epochs == 2


def test_checkpoints_are_written_every_n_steps_and_the_last_ones_kept(runs):
    saved = sorted((runs["full"] / "checkpoints").glob("step_*.ckpt"))
    assert [path.name for path in saved] == ["step_000000003072.ckpt", "step_000000004096.ckpt"]
    state = torch.load(saved[-1], weights_only=True)
    assert state["counters"] == {"global_step": 4096, "iteration": 8}
    assert state["learner"]["epoch"] == 16 and state["learner"]["optimizer"]["state"]  # the schedule, Adam's moments
    assert state["world_size"] == 2 and len(state["rank_states"]) == 2 and state["algorithm"] == "ppo"
    assert {"policy", "learner", "obs_normalizer", "reward_scaler", "config", "version"} <= set(state)
    assert all(rank["envs"] is not None for rank in state["rank_states"])


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--env-id", "Acrobot-v1"], "--env-id"),
        (["--num-envs", "3"], "--num-envs"),
        (["--activation-function", "tanh"], "--activation-function"),
        (["--vector-mode", "native"], "--vector-mode"),  # envs that reset a step late
        (["--normalize-observations"], "--normalize-observations"),  # inputs the network was not trained on
        (["--seed", "2"], "--seed"),  # its random streams come back from the checkpoint: the new seed would mix in
        (["--total-timesteps", "2048"], "--total-timesteps"),
    ],
)
def test_a_field_that_cannot_change_is_named(runs, tmp_path, args, flag):
    # One process, resuming the 2 ranks' checkpoint, names a field as both ranks would. --num-envs needs both (one
    # process takes both ranks' envs, whatever it is given), and two more are launched to see both ranks say so.
    base = ["--total-timesteps", "4096", "--resume-from", str(runs["fabric_half_checkpoint"])]
    if flag not in ("--env-id", "--num-envs", "--total-timesteps"):
        assert refusal_line("fabric", [*base, *args], tmp_path).startswith(f"error: {flag}: ")
        return
    finished = run_ranks("fabric run", SCRIPTS["fabric"], [*base, *args], tmp_path)
    lines = [line for line in finished.stderr.splitlines() if line.startswith("error: ")]
    assert finished.returncode != 0 and len(lines) == 2
    assert all(line.startswith(f"error: {flag}: ") for line in lines), lines


def test_a_resume_names_the_flag_that_found_the_checkpoint_and_a_switch_by_its_flag(runs, tmp_path):
    named_run = tmp_path / "saved" / "fabric_logs" / "mine" / "checkpoints"
    named_run.mkdir(parents=True)
    shutil.copy(runs["fabric_half_checkpoint"], named_run)
    sac = ["sac", "--env-id", "Pendulum-v1", "--total-timesteps", "4096"]
    assert refusal_line("fabric", [*sac, "--log-dir", "saved", "--run-name", "mine"], tmp_path) == (
        "error: --run-name: run mine's newest checkpoint was trained with PPO, not SAC: name this run otherwise"
    )
    given = ["--resume-from", str(runs["fabric_half_checkpoint"])]
    assert refusal_line("fabric", [*sac, *given], tmp_path) == (
        "error: --resume-from: this checkpoint was trained with PPO, not SAC"
    )
    assert refusal_line("fabric", ["--total-timesteps", "4096", "--normalize-observations", *given], tmp_path) == (
        "error: --normalize-observations: the checkpoint was trained without --normalize-observations; it cannot "
        "change on resume"
    )
    assert refusal_line("fabric", ["--total-timesteps", "4096", "--seed", "2", *given], tmp_path) == (
        "error: --seed: the checkpoint was trained with --seed 42; it cannot change on resume"
    )


def test_a_named_run_resumed_by_its_name_takes_its_own_flags_where_the_command_line_gives_none(tmp_path):
    named = [*QUICK, "--run-name", "mine"]
    first = run_ranks(
        "python", SCRIPTS["fabric"], [*named, "--gamma", "0.95", "--total-timesteps", "1024"], tmp_path, 1
    )
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_ranks("python", SCRIPTS["fabric"], [*named, "--total-timesteps", "2048"], tmp_path, 1)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from run mine's newest checkpoint, step 1,024" in again.stdout
    newest = torch.load(checkpoints(tmp_path)[-1], weights_only=True)
    assert newest["counters"]["global_step"] == 2048 and newest["config"]["gamma"] == 0.95


def test_a_run_folder_is_held_for_its_runs_life_and_let_go_after(tmp_path):
    from rl.run import RunFolderLock, check_run_folder_free

    folder = str(tmp_path / "mine")
    held = RunFolderLock()
    assert held.take(folder, "--run-name") == folder
    for other in (lambda: check_run_folder_free(folder, "--run-name"), lambda: RunFolderLock().take(folder, "--x")):
        with pytest.raises(UsageError, match=r"is the folder of a run still going \(pid \d+ on "):
            other()
    held.release()
    assert not os.path.exists(os.path.join(folder, "run.lock"))  # a folder let go keeps no lock file
    check_run_folder_free(folder, "--run-name")
    again = RunFolderLock()
    again.take(folder, "--run-name")
    with pytest.raises(UsageError, match="is the folder of a run still going"):
        RunFolderLock().take(folder, "--run-name")
    again.release()


def test_a_lock_file_opened_as_the_run_before_removed_it_is_told_from_the_folders_new_one(tmp_path):
    # A run that opened the file just before the one ending removed it locks a file no longer in the folder: it
    # must see that and take the one that is, or a third run could take that one too, and two would write into one
    # folder.
    from rl.run import RunFolderLock, same_file

    folder = str(tmp_path / "mine")
    ending = RunFolderLock()
    ending.take(folder, "--run-name")
    path = os.path.join(folder, "run.lock")
    with open(path, "a+") as opened_before_removal:
        assert same_file(opened_before_removal, path)
        ending.release()
        assert not same_file(opened_before_removal, path)  # removed
        taking = RunFolderLock()
        taking.take(folder, "--run-name")
        assert not same_file(opened_before_removal, path)  # the folder's new lock file
        taking.release()


def test_a_held_folder_is_refused_naming_the_flag_that_chose_it(tmp_path):
    from rl.run import RunFolderLock

    held = RunFolderLock()
    held.take(str(tmp_path / "held" / "fabric_logs" / "theirs"), "--run-name")
    checkpoint = str(tmp_path / "held" / "fabric_logs" / "theirs" / "checkpoints" / "step_000000000512.ckpt")
    try:
        for args, flag in (
            (["--run-name", "mine", "--resume-from", checkpoint], "--resume-from"),  # their folder, by the checkpoint
            (["--run-name", "theirs"], "--run-name"),
        ):
            line = refusal_line("fabric", ["--log-dir", "held", *args], tmp_path)
            assert line.startswith(f"error: {flag}: ") and "is the folder of a run still going" in line, line
    finally:
        held.release()


def test_a_second_run_into_the_folder_of_a_run_still_going_is_refused_and_the_first_trains_on(tmp_path):
    args = ["--total-timesteps", "1000000", "--run-name", "mine", "--log-dir", "held", "--no-progress-bar"]
    args += ["--checkpoint-every", "512"]
    first = start_as_foreground_job([str(BIN / "python"), str(SCRIPTS["fabric"]), *args], tmp_path)
    try:
        lock = tmp_path / "held" / "fabric_logs" / "mine" / "run.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text()):
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the run did not take its folder within 120 s"
            time.sleep(0.2)
        line = refusal_line("fabric", args, tmp_path)
        assert line == (
            f"error: --run-name: held/fabric_logs/mine is the folder of a run still going (pid {first.pid} on "
            f"{lock.read_text().split(' on ', 1)[1].strip()}): two runs would write over each other's checkpoints "
            "and logs; give another --run-name, or wait for that run to end"
        )
        assert first.poll() is None  # untouched
        wait_for(lambda: list(lock.parent.glob("checkpoints/step_*.ckpt")), 120)  # in training, where Ctrl-C stops
    finally:
        os.killpg(first.pid, signal.SIGINT)
        _, stderr = first.communicate(timeout=60)
    assert first.returncode == 0, stderr[-3000:]  # Ctrl-C during training: a checkpoint and a clean end
    assert not lock.exists()


WITHOUT_WANDB = """import runpy, sys
sys.modules["wandb"] = None  # as where the tracking extra is not installed
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.parametrize("refused", ["buffer-too-small", pytest.param("wandb-missing", marks=pytest.mark.slow)])
def test_a_refused_resume_leaves_the_run_folder_as_it_was(tmp_path, refused):
    """Refused once the checkpoint is read, before its folder opens: the config file, the logs and the journal
    stay the earlier launch's."""
    args = ["sac", "--learning-starts", "100", "--log-every", "200", "--eval-episodes", "0", "--no-progress-bar"]
    first = run_ranks("python", SCRIPTS["fabric"], [*args, "--total-timesteps", "600", "--save-buffer"], tmp_path, 1)
    assert first.returncode == 0, first.stderr[-3000:]
    directory = run_dir(tmp_path, "fabric")
    before = {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()}
    script, flag, extra = SCRIPTS["fabric"], "--buffer-size", ["--buffer-size", "300"]  # it saved 600 transitions
    if refused == "wandb-missing":
        script, flag, extra = tmp_path / "without_wandb.py", "--logger", ["--logger", "tensorboard", "wandb"]
        script.write_text(WITHOUT_WANDB.format(script=str(SCRIPTS["fabric"])))
    resume = ["--total-timesteps", "1000", "--resume-from", str(directory / "checkpoints" / "step_000000000600.ckpt")]
    refused_run = run_ranks("python", script, [*args, *resume, *extra], tmp_path, 1)
    assert refused_run.returncode == 2, refused_run.stderr[-3000:]
    (line,) = refused_run.stderr.strip().splitlines()
    assert line.startswith(f"error: {flag}: "), line
    assert {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()} == before


def test_coupled_ranks_resume_at_another_process_count_with_the_same_global_envs_and_batch(runs, tmp_path):
    """A checkpoint of 2 ranks resumes in 1 process, which runs both ranks' envs and batch from fresh resets."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    loose = shutil.copy(runs["fabric_half_checkpoint"], downloads)
    saved = torch.load(loose, weights_only=True)
    assert saved["world_size"] == 2
    flags = [*QUICK, "--total-timesteps", "4096", "--resume-from", loose]
    finished = run_ranks("python", SCRIPTS["fabric"], flags, tmp_path, 1)
    assert finished.returncode == 0, finished.stderr[-3000:]
    envs = 2 * saved["config"]["num_envs"]
    assert (
        f"warning: the checkpoint of 2 ranks resumes on 1: every rank's envs restart from fresh resets ({envs} per "
        "rank)" in finished.stderr
    )
    (last,) = sorted((run_dir(tmp_path, "fabric") / "checkpoints").glob("step_*.ckpt"))[-1:]
    resumed = torch.load(last, weights_only=True)
    assert resumed["world_size"] == 1 and resumed["counters"] == {"global_step": 4096, "iteration": 8}  # as 2 ranks
    assert resumed["config"]["num_envs"] == envs
    assert resumed["config"]["per_rank_batch_size"] == 2 * saved["config"]["per_rank_batch_size"]


def test_a_share_of_the_checkpoints_envs_that_is_not_whole_is_refused_by_every_rank(runs, tmp_path):
    resume = ["--total-timesteps", "4096", "--resume-from", str(runs["fabric_half_checkpoint"])]
    refused = run_ranks("fabric run", SCRIPTS["fabric"], resume, tmp_path, 3)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert refused.returncode != 0 and len(lines) == 3, refused.stderr[-3000:]
    assert len(set(lines)) == 1 and re.fullmatch(
        r"error: --num-envs: the checkpoint's 2 ranks ran \d+ envs in all, which 3 ranks cannot share evenly", lines[0]
    )


def test_a_recurrent_minibatch_is_shared_out_in_whole_sequences(tmp_path):
    """One rank's minibatch of one sequence cannot be split between 2 ranks: the line says so, not that the share
    of half a sequence (a value nobody gave) is no multiple of --num-steps."""
    one_rank = run_ranks("python", SCRIPTS["fabric"], [*QUICK, "--recurrent", "--total-timesteps", "512"], tmp_path, 1)
    assert one_rank.returncode == 0, one_rank.stderr[-3000:]
    resume = ["--total-timesteps", "1024", "--resume-from", str(checkpoints(tmp_path)[-1])]
    refused = run_ranks("fabric run", SCRIPTS["fabric"], resume, tmp_path, 2)
    lines = {line for line in refused.stderr.splitlines() if line.startswith("error: ")}
    assert refused.returncode != 0 and lines == {
        "error: --per-rank-batch-size: the checkpoint's 1 rank took batches of 128 in all, which 2 ranks cannot share "
        "evenly in "
        "whole sequences of --num-steps 128"
    }, refused.stderr[-3000:]


def test_a_per_rank_value_given_at_another_process_count_is_refused_unless_it_is_the_share(runs, tmp_path):
    """The shares keep the checkpoint's global envs: a --num-envs that is neither the share nor the run's own
    value is refused, not replaced by the share without a word."""
    saved = torch.load(runs["fabric_half_checkpoint"], weights_only=True)
    envs = 2 * saved["config"]["num_envs"]
    resume = [*QUICK, "--total-timesteps", "4096", "--resume-from", str(runs["fabric_half_checkpoint"])]
    refused = run_ranks("python", SCRIPTS["fabric"], [*resume, "--num-envs", str(envs + 1)], tmp_path, 1)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = refused.stderr.strip().splitlines()
    assert line == (
        f"error: --num-envs: the checkpoint's 2 ranks ran {envs} envs in all: {envs} per rank on 1, not {envs + 1}; "
        f"give --num-envs {envs}"
    )


def bad_files(runs, folder: Path) -> dict[str, Path]:
    good = runs["fabric_half_checkpoint"].read_bytes()
    (folder / "garbage.ckpt").write_bytes(b"not a checkpoint at all" * 100)
    (folder / "truncated.ckpt").write_bytes(good[: len(good) // 2])
    (folder / "truncated-early.ckpt").write_bytes(good[:5000])  # torch.load raises OSError (EINVAL) on it
    torch.save({"weights": torch.zeros(3)}, folder / "foreign.ckpt")
    torch.save({"format": "fabric-rl/1", "code": collections.OrderedDict, "callback": print}, folder / "code.ckpt")
    torch.save({"format": "fabric-rl", "version": 99, "policy": {}}, folder / "newer.ckpt")
    return {
        "garbage": folder / "garbage.ckpt",
        "truncated": folder / "truncated.ckpt",
        "truncated early": folder / "truncated-early.ckpt",
        "foreign": folder / "foreign.ckpt",
        "holds code": folder / "code.ckpt",
        "newer": folder / "newer.ckpt",
        "saved agent": runs["fabric-half"] / "agent.ckpt",
        "missing": folder / "nothing-here.ckpt",
        "run folder": runs["fabric-half"],
    }


BAD_FILE_LINES = {
    "garbage": "is not a checkpoint: torch.save did not write it",
    "truncated": "it is cut short or corrupt",
    "truncated early": "it is cut short or corrupt",  # not "Invalid argument", which reads as a disk's fault
    "foreign": "is not a checkpoint of this program",
    "holds code": "holds Python objects (classes or code) that a weights-only read refuses to run",
    "newer": "was written by a newer version of this program (checkpoint version 99; this one reads up to 2)",
    "saved agent": "a saved agent, not a training checkpoint: give its run's newest, ",  # the step_*.ckpt beside it
    "missing": "no checkpoint at",
    "run folder": "is a folder: give a file, such as ",  # its newest checkpoint (a saved agent resumes nothing)
}


@pytest.mark.parametrize("kind", list(BAD_FILE_LINES))
def test_bad_checkpoints_end_with_one_line_that_says_what_the_file_is_and_exit_2(runs, tmp_path, kind):
    path = bad_files(runs, tmp_path)[kind]
    finished = run_ranks("python", SCRIPTS["fabric"], ["--resume-from", str(path)], tmp_path)
    assert finished.returncode == 2, finished.stderr[-2000:]
    (line,) = finished.stderr.strip().splitlines()
    assert line.startswith("error: --resume-from: ") and BAD_FILE_LINES[kind] in line, line


def write_stable_baselines3_model(path: Path) -> None:
    """A zip archive with a Stable-Baselines3 model's records (its weights saved by torch.save inside)."""
    weights = io.BytesIO()
    torch.save({"weights": torch.zeros(3)}, weights)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data", '{"policy_class": "ActorCriticPolicy"}')
        archive.writestr("policy.pth", weights.getvalue())
        archive.writestr("_stable_baselines3_version", "2.4.0")


def write_legacy_torch_file(path: Path, state: dict) -> None:
    torch.save(state, path, _use_new_zipfile_serialization=False)


def write_other_zip_archive(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights.json", "[0.0, 1.0]")


def write_legacy_torch_file_cut_short(path: Path) -> None:
    write_legacy_torch_file(path, {"weights": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:200])


NOT_BY_TORCH_SAVE = "{path} is not a checkpoint: torch.save did not write it"
FOREIGN_FILES = {
    "a Stable-Baselines3 model": (
        write_stable_baselines3_model,
        NOT_BY_TORCH_SAVE + " (a Stable-Baselines3 model, which this program cannot load)",
    ),
    "another zip archive": (write_other_zip_archive, NOT_BY_TORCH_SAVE + " (a zip archive of another program)"),
    "a pickle of plain data": (  # protocol 4: torch's weights-only reader warns of it, and fails on its framing
        lambda path: path.write_bytes(pickle.dumps({"weights": [0.0, 1.0]}, protocol=4)),
        NOT_BY_TORCH_SAVE + " (a pickle of another program)",
    ),
    "torch's legacy format, holding code": (
        lambda path: write_legacy_torch_file(path, {"callback": print}),
        "{path} holds Python objects (classes or code) that a weights-only read refuses to run",
    ),
    "torch's legacy format, cut short": (write_legacy_torch_file_cut_short, "cannot read {path}: it is cut short"),
    "torch's legacy format, of another program": (
        lambda path: write_legacy_torch_file(path, {"weights": torch.zeros(3)}),
        "{path} is not a checkpoint of this program",
    ),
}


@pytest.mark.parametrize("kind", list(FOREIGN_FILES))
def test_a_file_another_program_wrote_is_named_for_what_it_is_not_taken_for_a_damaged_one(tmp_path, kind):
    write, told = FOREIGN_FILES[kind]
    path = tmp_path / "model.zip"
    write(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and without torch's warnings before the line
        with pytest.raises(UsageError) as refused:
            load_checkpoint(str(path))
    assert str(refused.value).startswith("--resume-from: " + told.format(path=path)), str(refused.value)


@pytest.mark.parametrize("mode", ["fabric", "decoupled"])
def test_a_non_finite_loss_stops_training_without_a_nan_checkpoint(tmp_path, mode):
    """Coupled ranks check at each report, and so does a decoupled trainer (not at every update)."""
    args = ["--learning-rate", "1e30", "--total-timesteps", "16384", "--checkpoint-every", "512", "--keep-last", "100"]
    with_progress_bar = [arg for arg in QUICK if arg != "--no-progress-bar"]
    finished = run_ranks("fabric run", SCRIPTS[mode], with_progress_bar + args, tmp_path)
    assert finished.returncode != 0
    lines = finished.stderr.split("\n")  # not splitlines(): a bar's carriage return must not count as a new line
    assert any(line.startswith("error: training stopped: the gradient norm is not finite") for line in lines)
    assert not (run_dir(tmp_path, mode) / "agent.ckpt").exists()
    for path in checkpoints(tmp_path, mode):
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(tensor).all() for tensor in state["policy"].values()), path


def wait_for(predicate, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


JOURNALED = ["--run-name", "ctrl-c"]  # a run in a fixed folder journals the step it has reached


def wait_until_every_rank_trains(job: subprocess.Popen, tmp_path: Path) -> None:
    """Wait for a `JOURNALED` run's rank 0 to pass a stop check, which every rank joins from its training loop. Its
    first iteration is not enough: before SAC's learning starts no update joins the ranks, and a rank still starting
    (making its envs, say) ends at Ctrl-C at once, with nothing to checkpoint."""
    wait_until_the_run_opens(tmp_path, [job])
    deadline = time.monotonic() + 240  # start-up can take a minute where CI runs three tests at once

    def wait_past(step: int) -> int:
        while (reached := reached_step(tmp_path)) <= step:
            assert job.poll() is None and time.monotonic() < deadline, "training did not begin"
            time.sleep(0.05)
        return reached

    # A stop check comes at every iteration, or within the first STOP_CHECK_STEPS; rank 0 journals the next one.
    wait_past(max(wait_past(0), STOP_CHECK_STEPS))


def ctrl_c_once_training(job: subprocess.Popen, tmp_path: Path) -> tuple[str, str, list[int]]:
    """Send SIGINT to the launcher of a `JOURNALED` run once every rank trains; its output, and its ranks."""
    ranks = []
    try:
        wait_until_every_rank_trains(job, tmp_path)
        ranks = child_pids(job.pid)
        job.send_signal(signal.SIGINT)
        stdout, stderr = job.communicate(timeout=60)
    finally:
        for pid in child_pids(job.pid):
            os.kill(pid, signal.SIGKILL)
    return stdout, stderr, ranks


def test_ctrl_c_on_the_launcher_writes_a_checkpoint_and_exits_cleanly(tmp_path):
    args = [*QUICK, *JOURNALED, "--total-timesteps", "100000000"]
    job = start("fabric run", SCRIPTS["fabric"], args, tmp_path, nproc=2)
    stdout, stderr, ranks = ctrl_c_once_training(job, tmp_path)
    assert "interrupted at step" in stdout, stderr[-3000:]
    assert not [line for line in stderr.splitlines() if line.startswith("[rank")]  # no rank traceback
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks)
    (saved,) = checkpoints(tmp_path)
    step = torch.load(saved, weights_only=True)["counters"]["global_step"]
    assert f"training loop: {step} steps in" in stdout  # the launch's own figures, for a study that sums them
    resumed = run_ranks(
        "fabric run",
        SCRIPTS["fabric"],
        [*QUICK, "--total-timesteps", str(step + 1024), "--resume-from", str(saved)],
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]


@pytest.mark.parametrize(
    "algorithm", [[], pytest.param(["sac", "--env-id", "Pendulum-v1"], marks=pytest.mark.slow)], ids=["ppo", "sac"]
)
def test_ctrl_c_in_a_terminal_checkpoints_a_run_whose_envs_step_in_processes_of_their_own(tmp_path, algorithm):
    # The terminal sends SIGINT to the env workers too: they step on while the run checkpoints, and stop after.
    args = [*algorithm, "--vector-mode", "async", "--num-envs", "2", "--total-timesteps", "100000000", *JOURNALED]
    job = start_as_foreground_job([sys.executable, str(SCRIPTS["fabric"]), *args, "--no-progress-bar"], tmp_path)
    try:
        wait_until_every_rank_trains(job, tmp_path)  # its envs made, and stepping
        os.killpg(job.pid, signal.SIGINT)
        stdout, stderr = job.communicate(timeout=60)
    finally:
        kill_process_group(job)
    assert job.returncode == 0, stderr[-3000:]
    assert "interrupted at step" in stdout, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("victim", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_killed_rank_ends_the_job_and_the_last_checkpoint_resumes(tmp_path, victim):
    # A checkpoint after every update, so kills often land in the middle of a save.
    args = [*QUICK, "--total-timesteps", "100000000", "--checkpoint-every", "512", "--keep-last", "100"]
    job = start("fabric run", SCRIPTS["fabric"], args, tmp_path, nproc=2)
    try:
        wait_for(lambda: len(list(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt"))) >= 3, 240)
        killed_at = time.monotonic()
        os.kill(rank_pid(job.pid, victim), signal.SIGKILL)
        _, stderr = job.communicate(timeout=60)
    finally:
        for pid in child_pids(job.pid):
            os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - killed_at < 60 and job.returncode != 0
    survivor = [line for line in stderr.splitlines() if line.startswith(f"error: rank {1 - victim}: ")]
    assert survivor and f"lost rank {victim}" in survivor[0], stderr[-3000:]
    assert "finite" not in stderr  # a lost peer is named as lost, never as a divergence it did not have
    saved = checkpoints(tmp_path)
    for path in saved:  # written atomically: none is partial
        torch.load(path, weights_only=True)
    step = torch.load(saved[-1], weights_only=True)["counters"]["global_step"]
    resumed = run_ranks(
        "fabric run",
        SCRIPTS["fabric"],
        [*QUICK, "--total-timesteps", str(step + 512), "--resume-from", str(saved[-1])],
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def sigterm_once_training(job: subprocess.Popen, tmp_path: Path, victim: int | None) -> tuple[str, str, list[int]]:
    """SIGTERM to the whole job (`victim` None: scancel, a SLURM time limit) or to one rank, once its first
    checkpoint shows it training; its outputs, and the ranks it had."""
    try:
        wait_for(lambda: len(list(tmp_path.glob("logs/*/*/checkpoints/step_*.ckpt"))) >= 1, 240)
        ranks = child_pids(job.pid)
        if victim is None:
            os.killpg(job.pid, signal.SIGTERM)
        else:
            os.kill(rank_pid(job.pid, victim), signal.SIGTERM)
        stdout, stderr = job.communicate(timeout=60)
    finally:
        kill_process_group(job)
    return stdout, stderr, ranks


@pytest.mark.parametrize(
    ("script", "nproc", "extra", "roles", "victim"),
    [
        ("fabric", 2, [], ["rank 0", "rank 1"], None),
        pytest.param("fabric", 2, [], ["rank 1"], 1, marks=pytest.mark.slow),
        pytest.param(
            "decoupled",
            3,
            ["--evaluator", "--eval-episodes", "2"],
            ["the player", "trainer 1", "the evaluator"],
            None,
            marks=pytest.mark.slow,
        ),
        # A role that runs no training loop, alone: it asks the players for the stop.
        pytest.param("decoupled", 3, ["--evaluator", "--eval-episodes", "2"], ["trainer 1"], 1, marks=pytest.mark.slow),
        pytest.param(
            "decoupled", 3, ["--evaluator", "--eval-episodes", "2"], ["the evaluator"], 2, marks=pytest.mark.slow
        ),
    ],
    ids=["whole-job", "one-rank", "decoupled-whole-job", "decoupled-trainer", "decoupled-evaluator"],
)
def test_sigterm_while_training_checkpoints_every_rank_then_stops(tmp_path, script, nproc, extra, roles, victim):
    """As Ctrl-C does: every process agrees on a last checkpoint, and none reads a peer that stopped as lost."""
    args = [*QUICK, *extra, "--total-timesteps", "100000000", "--checkpoint-every", "1024", "--keep-last", "100"]
    job = start("fabric run", SCRIPTS[script], args, tmp_path, nproc=nproc)
    stdout, stderr, ranks = sigterm_once_training(job, tmp_path, victim)
    for role in roles:
        assert f"{role}: SIGTERM: checkpointing, then stopping" in stderr, stderr[-3000:]
    assert not [line for line in stderr.splitlines() if line.startswith(("[rank", "error: "))], stderr[-3000:]
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks)
    saved = checkpoints(tmp_path, script)[-1]
    step = torch.load(saved, weights_only=True)["counters"]["global_step"]
    assert f"interrupted at step {step}: checkpoint written" in stdout, stdout[-3000:]


def evaluate(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rl.evaluate", *args]
    return subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


def test_evaluation_cli_prints_scores_and_writes_a_video(runs):
    folder = runs["fabric-half"]
    done = evaluate([str(folder / "agent.ckpt"), "--episodes", "3", "--capture-video"], folder)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CartPole-v1, 3 deterministic episodes: return " in done.stdout and " ± " in done.stdout
    videos = list((folder / "eval_videos" / "agent").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000  # the first episode, and no other
    recorded = {video: video.read_bytes() for video in videos}
    again = evaluate([str(folder / "agent.ckpt"), "--episodes", "1", "--capture-video"], folder)
    assert again.returncode == 0, again.stderr[-2000:]
    assert list((folder / "eval_videos" / "agent_2").glob("*.mp4")), "a second evaluation records into a new folder"
    assert {video: video.read_bytes() for video in videos} == recorded, "and keeps the first's videos"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "evaluation"))
    events.Reload()
    assert "Eval/video" in events.Tags()["images"] and "Eval/return_mean" in events.Tags()["scalars"]


def test_a_long_episodes_tensorboard_gif_plays_all_of_it_sped_up_in_few_frames(tmp_path):
    import io

    from moviepy import ImageSequenceClip
    from PIL import Image

    from rl.evaluate import GIF_FRAMES, video_summary

    steps, fps = 2 * GIF_FRAMES + 300, 30
    frames = [np.full((16, 16, 3), (step % 250, step // 250 * 40, 0), dtype=np.uint8) for step in range(steps)]
    ImageSequenceClip(frames, fps=fps).write_videofile(str(tmp_path / "episode.mp4"), logger=None)
    summary = video_summary("Eval/video", str(tmp_path / "episode.mp4"))
    gif = Image.open(io.BytesIO(summary.value[0].image.encoded_image_string))
    durations = []
    for index in range(gif.n_frames):
        gif.seek(index)
        durations.append(gif.info["duration"])
    assert GIF_FRAMES // 2 < gif.n_frames <= GIF_FRAMES
    assert sum(durations) / 1000 == pytest.approx(steps / fps, rel=0.05)  # the whole episode, sped up


@pytest.mark.slow
def test_evaluation_cli_takes_training_checkpoints_stochastic_play_and_another_env(runs):
    checkpoint = str(runs["fabric_half_checkpoint"])
    done = evaluate([checkpoint, "--episodes", "2", "--stochastic"], runs["fabric-half"])
    assert done.returncode == 0 and "2 stochastic episodes" in done.stdout, done.stderr[-2000:]
    wrong_env = evaluate([checkpoint, "--env-id", "Pendulum-v1"], runs["fabric-half"])
    assert wrong_env.returncode == 2 and wrong_env.stderr.strip() == (
        "error: --env-id: Pendulum-v1 does not fit this agent, trained on CartPole-v1: "
        "it observes a Box of shape (3,) and acts in a Box of shape (1,)"
    )
    missing = evaluate(["nothing.ckpt"], runs["fabric-half"])
    assert missing.returncode == 2 and missing.stderr.strip().startswith("error: CHECKPOINT: no checkpoint at")
    folder = evaluate([str(runs["fabric-half"])], runs["fabric-half"])
    assert folder.returncode == 2 and folder.stderr.strip() == (
        f"error: CHECKPOINT: {runs['fabric-half']} is a folder: give a file, such as "
        f"{runs['fabric-half'] / 'agent.ckpt'} or {newest_checkpoint(str(runs['fabric-half']))}"
    )
    bad_seed = evaluate([checkpoint, "--seed", "-1"], runs["fabric-half"])
    assert bad_seed.returncode == 2 and bad_seed.stderr.strip() == "error: --seed: must not be negative, got -1"


def test_decoupled_resume_equals_an_uninterrupted_run(tmp_path):
    args = [*QUICK, "--num-envs", "2"]
    (tmp_path / "full").mkdir()
    (tmp_path / "part").mkdir()
    full, half = launch_together(
        (
            "fabric run",
            SCRIPTS["decoupled"],
            [*args, "--total-timesteps", "2048", "--checkpoint-every", "512"],
            tmp_path / "full",
            3,
        ),
        ("fabric run", SCRIPTS["decoupled"], [*args, "--total-timesteps", "1024"], tmp_path / "part", 3),
        via=run_ranks,
    )
    assert full.returncode == 0 and half.returncode == 0, (full.stderr + half.stderr)[-3000:]
    saved = checkpoints(tmp_path / "part", "decoupled")
    assert [path.name for path in saved] == ["step_000000001024.ckpt"]  # one file, written once, by the player
    state = torch.load(saved[-1], weights_only=True)
    assert state["mode"] == "decoupled" and state["learner"]["optimizer"]["state"]  # the trainers' Adam moments
    resumed = run_ranks(
        "fabric run",
        SCRIPTS["decoupled"],
        [*args, "--total-timesteps", "2048", "--resume-from", str(saved[-1])],
        tmp_path / "part",
        nproc=3,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = load_agent(run_dir(tmp_path / "full", "decoupled"))["policy"]
    continued = load_agent(run_dir(tmp_path / "part", "decoupled"))["policy"]
    assert all(torch.equal(whole[name], continued[name]) for name in whole)


def test_decoupled_players_and_trainers_resume_in_other_numbers_with_the_same_global_envs_and_batch(tmp_path):
    """A player and 2 trainers resume as 2 players and a trainer: each player runs half the envs, the trainer both
    trainers' minibatch."""
    args = [*QUICK, "--num-envs", "2"]
    part = run_ranks("fabric run", SCRIPTS["decoupled"], [*args, "--total-timesteps", "1024"], tmp_path, 3)
    assert part.returncode == 0, part.stderr[-3000:]
    (saved,) = checkpoints(tmp_path, "decoupled")
    # An evaluator in a trainer's place halves the trainers; one in a process of its own leaves them as they were.
    found = load_checkpoint(str(saved))
    for world_size, trainers, batch_size in ((3, 1, 128), (4, 2, 64)):
        cfg = PPOConfig(num_envs=2, evaluator=True, eval_episodes=1)
        assert shares_out(found, cfg, "decoupled", world_size) == (trainers != 2)
        keep_global_batch(cfg, found, "decoupled", world_size)
        assert (cfg.num_envs, cfg.per_rank_batch_size) == (2, batch_size)
    resume = ["--total-timesteps", "2048", "--resume-from", str(saved)]
    no_trainer = run_ranks("fabric run", SCRIPTS["decoupled"], [*resume, "--num-players", "2"], tmp_path, 2)
    lines = {line for line in no_trainer.stderr.splitlines() if line.startswith("error: ")}
    assert no_trainer.returncode != 0 and lines == {
        "error: --num-players: 2 processes leave no trainer beside 2 players: launch more processes (fabric run "
        "--devices)"
    }, no_trainer.stderr[-3000:]
    resumed = run_ranks("fabric run", SCRIPTS["decoupled"], [*resume, "--num-players", "2"], tmp_path, 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        "warning: the checkpoint of 1 player resumes on 2: every player's envs restart from fresh resets (1 per "
        "player)\n" in resumed.stderr
    )
    state = torch.load(checkpoints(tmp_path, "decoupled")[-1], weights_only=True)
    assert state["counters"] == {"global_step": 2048, "iteration": 8} and state["world_size"] == 3
    assert len(state["rank_states"]) == 2
    assert (state["config"]["num_players"], state["config"]["num_envs"], state["config"]["per_rank_batch_size"]) == (
        2,
        1,
        128,
    )


def decoupled_sac_checkpoint(trained: SACConfig, world_size: int) -> TrainingCheckpoint:
    return TrainingCheckpoint(
        algorithm="sac",
        policy={},
        obs_normalizer={},
        config=trained.to_dict(),
        env_id=trained.env_id,
        learner={},
        counters=Counters(0, 0),
        mode="decoupled",
        world_size=world_size,
        rank_states=[{}] * trained.num_players,
    )


@pytest.mark.parametrize(("share_data", "saved_world_size", "batch_size"), [(True, 3, 256), (False, 4, 512)])
def test_decoupled_sac_trainers_share_the_batch_unless_they_split_one_already(share_data, saved_world_size, batch_size):
    """2 players (and 1 or 2 trainers) resume as 1 player and 1 trainer. With --share-data the trainers split one
    batch of --batch-size, which stays; without it each trained its own, which the one trainer now trains together.
    The players' envs are always shared out."""
    trained = SACConfig(num_players=2, num_envs=1, batch_size=256, share_data=share_data)
    checkpoint = decoupled_sac_checkpoint(trained, saved_world_size)
    cfg = dataclasses.replace(trained, num_players=1)
    assert shares_out(checkpoint, cfg, "decoupled", 2)
    keep_global_batch(cfg, checkpoint, "decoupled", 2)
    assert (cfg.num_envs, cfg.batch_size) == (2, batch_size)


@pytest.mark.parametrize(("share_data", "saved_batch", "batch_size"), [(False, 256, 512), (True, 512, 256)])
def test_decoupled_sac_that_switches_share_data_on_resume_keeps_its_global_batch(share_data, saved_batch, batch_size):
    """A player and 2 trainers either way: without --share-data each trainer draws a batch of its own (256, 512 in
    all); with it the trainers split one batch of --batch-size (512)."""
    trained = SACConfig(num_envs=1, batch_size=saved_batch, share_data=share_data)
    checkpoint = decoupled_sac_checkpoint(trained, world_size=3)
    cfg = dataclasses.replace(trained, share_data=not share_data)
    assert shares_out(checkpoint, cfg, "decoupled", 3)
    keep_global_batch(cfg, checkpoint, "decoupled", 3)
    assert cfg.batch_size == batch_size
    other = dataclasses.replace(trained, share_data=not share_data, batch_size=100)
    with pytest.raises(UsageError) as refused:
        keep_global_batch(other, checkpoint, "decoupled", 3)
    said = {
        False: "the checkpoint's 2 trainers took batches of 512 in all: 512 in one shared batch, not 100; give "
        "--batch-size 512",
        True: "the checkpoint's shared batch held 512: 256 per trainer on 2, not 100; give --batch-size 256",
    }
    assert str(refused.value) == f"--batch-size: {said[share_data]}"


def test_a_checkpoint_resumes_only_in_its_own_mode(runs, tmp_path):
    args = ["--total-timesteps", "4096", "--resume-from", str(runs["fabric_half_checkpoint"])]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=2)
    lines = [line for line in finished.stderr.splitlines() if line.startswith("error: ")]
    assert finished.returncode != 0 and len(lines) == 2
    said = "written in coupled mode, not decoupled mode: resume it in coupled mode: fabric run ... train_fabric.py"
    assert all(said in line for line in lines)


@pytest.mark.slow
def test_a_hogwild_checkpoint_resumed_elsewhere_names_its_mode_not_its_flags(tmp_path):
    trained = run_ranks("python", SCRIPTS["hogwild"], [*QUICK, "--workers", "2", "--total-timesteps", "512"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (saved,) = checkpoints(tmp_path, "hogwild")
    # Its folder's config sets --workers 2, a flag the coupled scripts do not take: the mode is what differs.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    line = refusal_line("fabric", ["--total-timesteps", "1024", "--resume-from", str(saved)], elsewhere)
    assert line == (
        "error: --resume-from: this checkpoint was written in hogwild mode, not coupled mode: "
        "resume it in Hogwild mode: python train_hogwild.py ..."
    )


TWO_PLAYERS = ["--num-players", "2"]


def ctrl_c_when(job: subprocess.Popen, stream, said: str) -> tuple[str, str]:
    """A terminal's Ctrl-C (the whole process group) once the job's `stream` says `said`; its outputs."""
    try:
        while said not in (line := stream.readline()):
            assert line, "ended before it said so"
        os.killpg(job.pid, signal.SIGINT)
        stdout, stderr = job.communicate(timeout=90)  # a loaded machine: workers still importing, then a checkpoint
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return stdout, stderr


def test_ctrl_c_while_a_run_starts_ends_it_with_one_line(tmp_path):
    args = ["--env-id", "envs_for_tests:SlowToMake-v0", "--no-progress-bar"]
    job = start("python", SCRIPTS["fabric"], args, tmp_path, nproc=1)
    _, stderr = ctrl_c_when(job, job.stderr, "making an env")
    assert job.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines() == ["interrupted (Ctrl-C) before training began"]


SLOW_TORCH_IMPORT = """import runpy, sys, time
class SlowTorchImport:  # says when torch's import begins, then holds it there: a Ctrl-C lands inside the import
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("importing torch", file=sys.stderr, flush=True)
            time.sleep(120)
sys.meta_path.insert(0, SlowTorchImport())
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.parametrize("script", ["fabric", "torch", "decoupled", "hogwild"])
def test_ctrl_c_while_an_entry_script_imports_ends_it_with_one_line(tmp_path, script):
    entry = tmp_path / "slow_import.py"
    entry.write_text(SLOW_TORCH_IMPORT.format(script=str(SCRIPTS[script])))
    job = start("python", entry, ["--no-progress-bar"], tmp_path, nproc=1)
    _, stderr = ctrl_c_when(job, job.stderr, "importing torch")
    assert job.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines() == ["interrupted (Ctrl-C) before training began"]


@pytest.mark.slow
def test_ctrl_c_as_one_player_trains_and_another_starts_calls_no_end_a_fault(tmp_path):
    """Player 1 trains while player 0 still makes its envs: Ctrl-C ends player 0 at once, and the processes that lose
    it say that they had Ctrl-C, rather than an error line that reads as the cause."""
    slow_lead = ["--env-id", "envs_for_tests:SlowToMakeForTraining-v0", "--env-kwargs", '{"on_rank": 0}']
    job = start("fabric run", SCRIPTS["decoupled"], [*slow_lead, *TWO_PLAYERS, "--no-progress-bar"], tmp_path, nproc=3)
    _, stderr = ctrl_c_when(job, job.stderr, "rank 1 took its first step")
    lines = [line for line in stderr.splitlines() if line.startswith(("interrupted", "error"))]
    assert "interrupted (Ctrl-C) before training began" in lines, stderr[-3000:]  # player 0's
    assert any(line.startswith("interrupted (Ctrl-C): player 1 then lost player 0") for line in lines), lines
    assert not [line for line in lines if line.startswith("error")], lines


def test_sigterm_while_ranks_start_names_the_rank_that_ended_without_calling_it_the_cause(tmp_path):
    """A starting rank ends at SIGTERM at once. Where the whole job had the signal, one ends first and another finds
    it gone, so a lost rank is not what stopped the others: their line says that they had the signal."""
    args = ["--env-id", "envs_for_tests:SlowToMakeForTraining-v0", "--no-progress-bar"]
    job = start("fabric run", SCRIPTS["fabric"], args, tmp_path, nproc=2)
    try:
        making = set()
        while making != {"rank 0", "rank 1"}:  # each rank listens for SIGTERM, and makes its envs
            line = job.stderr.readline()
            assert line, "ended before each rank made its envs"
            if line.endswith("is making an env to train on\n"):
                making.add(line.split(" is ")[0])
        os.kill(rank_pid(job.pid, 0), signal.SIGTERM)  # the launcher then sends rank 1 its own
        _, stderr = job.communicate(timeout=90)
    finally:
        kill_process_group(job)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: rank 0: stopped by SIGTERM (a kill, scancel or shutdown); its checkpoints are kept",
        "error: rank 1: stopped by SIGTERM, from the launcher or sent to the job; while it started, it had lost "
        "rank 0: its process ended",
    ], stderr[-3000:]


def test_ctrl_c_in_the_closing_evaluation_ends_the_run_with_one_line(tmp_path):
    args = [*QUICK, "--total-timesteps", "1024", "--eval-episodes", "100000"]  # an evaluation of hours
    job = start("python", SCRIPTS["fabric"], args, tmp_path, nproc=1)
    _, stderr = ctrl_c_when(job, job.stdout, "training loop: 1024 steps")
    assert job.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines() == ["interrupted (Ctrl-C) after training: its final checkpoint is written"]
    assert [path.name for path in checkpoints(tmp_path)] == ["step_000000001024.ckpt"]


def test_a_ctrl_c_in_the_middle_of_a_write_is_raised_as_itself_and_keeps_the_file_before(tmp_path, monkeypatch):
    """torch.save's zip writer, interrupted within a record, raises a RuntimeError of its own as it closes."""
    path = tmp_path / "agent.ckpt"
    save_file_atomically(str(path), {"weights": torch.zeros(3)})

    class InterruptedFile(io.FileIO):
        writes = 0

        def write(self, data) -> int:
            InterruptedFile.writes += 1
            if InterruptedFile.writes == 3:  # within the first tensor's record
                raise KeyboardInterrupt
            return super().write(data)

    monkeypatch.setattr(rl.checkpoint, "open", InterruptedFile, raising=False)
    with pytest.raises(KeyboardInterrupt):
        save_file_atomically(str(path), {"weights": torch.ones(1000), "more": torch.ones(1000)})
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.zeros(3))
    assert [file.name for file in tmp_path.iterdir()] == ["agent.ckpt"]


@pytest.mark.slow
def test_ctrl_c_while_hogwild_workers_start_checkpoints_once_they_have(tmp_path):
    """The workers are born deaf to Ctrl-C (left to the supervisor), so one still importing does not die of it."""
    job = start("python", SCRIPTS["hogwild"], [*QUICK, "--workers", "2"], tmp_path, nproc=1)
    stdout, stderr = ctrl_c_when(job, job.stdout, "hogwild: 2 workers")  # each still importing torch
    assert job.returncode == 0, stderr[-3000:]
    assert "interrupted at step " in stdout, stdout[-3000:]
    assert checkpoints(tmp_path, "hogwild")


@pytest.mark.slow
def test_ctrl_c_on_asynchronous_decoupled_players_checkpoints_and_stops(tmp_path):
    """Two players that run ahead of the trainers agree on where to stop, and the run resumes."""
    args = [*QUICK, *JOURNALED, "--total-timesteps", "100000000", *TWO_PLAYERS, "--async", "--max-policy-lag", "2"]
    job = start("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=3)
    stdout, stderr, ranks = ctrl_c_once_training(job, tmp_path)
    assert "interrupted at step" in stdout, stderr[-3000:]
    assert not [line for line in stderr.splitlines() if line.startswith(("[rank", "error: "))], stderr[-3000:]
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks)
    (saved,) = checkpoints(tmp_path, "decoupled")
    step = torch.load(saved, weights_only=True)["counters"]["global_step"]
    assert f"training loop: {step} steps in" in stdout
    assert len(torch.load(saved, weights_only=True)["rank_states"]) == 2  # each player's envs and streams
    resumed = run_ranks(
        "fabric run",
        SCRIPTS["decoupled"],
        [*QUICK, *TWO_PLAYERS, "--total-timesteps", str(step + 1024), "--resume-from", str(saved)],
        tmp_path,
        nproc=3,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]


@pytest.mark.parametrize(
    ("script", "nproc", "extra"),
    [
        ("fabric", 2, ["--learning-starts", "100"]),
        pytest.param("decoupled", 4, [*TWO_PLAYERS, "--learning-starts", "100"], marks=pytest.mark.slow),
        pytest.param("decoupled", 4, [*TWO_PLAYERS, "--learning-starts", "10000000"], marks=pytest.mark.slow),
    ],
    ids=["coupled", "decoupled-two-players", "decoupled-two-players-before-learning-starts"],
)
def test_ctrl_c_stops_sac_between_two_reports(tmp_path, script, nproc, extra):
    """A report a million steps away: the stop comes at a check between reports, long before the launcher's
    30 s are up, which SAC's 1,000 steps between reports can exceed where steps are slow. Decoupled players that
    have sent no batch yet (before learning starts) are held together by no lag bound, yet stop there too."""
    args = ["sac", "--env-id", "Pendulum-v1", "--batch-size", "64", *extra]
    args += ["--log-every", "1000000", "--total-timesteps", "100000000", "--eval-episodes", "0", "--no-progress-bar"]
    job = start("fabric run", SCRIPTS[script], [*args, *JOURNALED], tmp_path, nproc=nproc)
    stdout, stderr, ranks = ctrl_c_once_training(job, tmp_path)
    assert "interrupted at step" in stdout, stderr[-3000:]
    assert not [line for line in stderr.splitlines() if line.startswith(("[rank", "error: "))], stderr[-3000:]
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks)
    (saved,) = checkpoints(tmp_path, script)
    assert 0 < torch.load(saved, weights_only=True)["counters"]["global_step"] < 1_000_000


def test_capture_video_records_rank_zeros_first_env_and_a_resumed_run_keeps_the_earlier_videos(tmp_path):
    args = [*QUICK, "--capture-video", "--eval-episodes", "1", "--run-name", "filmed"]
    finished = run_ranks("fabric run", SCRIPTS["fabric"], [*args, "--total-timesteps", "1024"], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    folder = run_dir(tmp_path, "fabric")
    assert list((folder / "train_videos" / "from_step_0").glob("*.mp4")), "rank 0's first env records its episodes"
    assert list((folder / "test_videos" / "step_1024").glob("*.mp4")), "the final evaluation records its first episode"
    first_videos = {path: path.read_bytes() for path in folder.glob("*_videos/*/*.mp4")}
    # Trained on from its final checkpoint: gymnasium numbers the new episodes from 0 again, in folders of their own.
    resumed = run_ranks("fabric run", SCRIPTS["fabric"], [*args, "--total-timesteps", "2048"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Overwriting existing videos" not in resumed.stderr
    assert list((folder / "train_videos" / "from_step_1024").glob("*.mp4"))
    assert list((folder / "test_videos" / "step_2048").glob("*.mp4"))
    assert {path: path.read_bytes() for path in first_videos} == first_videos


def test_a_file_that_cannot_be_opened_is_not_called_corrupt(tmp_path):
    from rl.checkpoint import unreadable

    path = str(tmp_path / "step_1.ckpt")
    told = unreadable(path, PermissionError(13, "Permission denied"))
    assert told == f"cannot read {path}: Permission denied"  # the file was never read, so nothing is said of it


# Written by the program before checkpoints had a schema version (version 1): PPO on CartPole-v1, 2 envs x 64 steps,
# seed 3, stopped at step 512, and its saved agent.
VERSION_1 = Path(__file__).parent / "data" / "checkpoint-v1"


def test_a_version_1_checkpoint_is_migrated_as_it_is_read():
    from rl.checkpoint import VERSION, TrainingCheckpoint, load_checkpoint

    path = VERSION_1 / "checkpoints" / "step_000000000512.ckpt"
    raw = torch.load(path, weights_only=True)
    loaded = load_checkpoint(str(path))
    assert isinstance(loaded, TrainingCheckpoint) and raw["format"] == "fabric-rl/1" and VERSION == 2
    assert (loaded.algorithm, loaded.mode, loaded.world_size, loaded.env_id) == ("ppo", "coupled", 1, "CartPole-v1")
    assert (loaded.counters.global_step, loaded.counters.iteration) == (512, raw["counters"]["update"])
    assert loaded.policy.keys() == raw["agent"].keys()
    assert all(torch.equal(loaded.policy[name], tensor) for name, tensor in raw["agent"].items())
    assert loaded.learner.keys() == raw["learner"].keys() and len(loaded.rank_states) == 1


def test_a_version_1_checkpoint_resumes_and_its_run_goes_on_in_the_current_version(tmp_path):
    run = tmp_path / "v1"
    shutil.copytree(VERSION_1, run)
    flags = [
        "--num-envs",
        "2",
        "--num-steps",
        "64",
        "--seed",
        "3",
        "--total-timesteps",
        "1024",
        "--no-progress-bar",
        "--eval-episodes",
        "1",
        "--resume-from",
        str(run / "checkpoints" / "step_000000000512.ckpt"),
    ]
    finished = run_ranks("python", SCRIPTS["fabric"], flags, tmp_path)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "training loop: 512 steps" in finished.stdout  # from step 512 on
    written = torch.load(run / "checkpoints" / "step_000000001024.ckpt", weights_only=True)
    assert (written["format"], written["version"], written["counters"]) == (
        "fabric-rl",
        2,
        {"global_step": 1024, "iteration": 8},
    )


def test_a_version_1_saved_agent_acts():
    import rl

    agent = rl.load_agent(str(VERSION_1 / "agent.ckpt"))
    action, state = agent.predict(np.zeros(4, dtype=np.float32))
    assert action.shape == () and int(action) in (0, 1) and state is None
