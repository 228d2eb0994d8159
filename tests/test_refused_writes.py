"""A write the system refuses (a full disk, a quota, a lost mount) stops the run with one line that names the
file and the system's reason, keeps every file written before it, and leaves no partial file.

The refusal is made by a file size limit (`RLIMIT_FSIZE`): a write past it fails with EFBIG, "File too large",
as a full disk fails with ENOSPC, and it needs no privilege to set up. Python ignores the SIGXFSZ that would
otherwise end the process.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, child_env, launch_command, run_dir

REFUSED = "File too large"
PPO_QUICK = ["--update-epochs", "2", "--eval-episodes", "0", "--no-progress-bar"]
# Tiny SAC that keeps its replay buffer in its checkpoints: each checkpoint is larger than the one before.
SAC_GROWING = [
    "sac",
    "--env-id",
    "Pendulum-v1",
    "--net-arch",
    "16",
    "16",
    "--learning-starts",
    "100",
    "--log-every",
    "200",
    "--checkpoint-every",
    "200",
    "--save-buffer",
    "--eval-episodes",
    "0",
    "--no-progress-bar",
]
SAC_SECOND_CHECKPOINT_REFUSED = 60_000  # bytes: its checkpoint at step 200 is about 49 kB, at step 400 about 78 kB


def run_with_file_limit(command: list[str], cwd: Path, limit: int | None) -> subprocess.CompletedProcess:
    """`command` (and every process it starts) unable to write a file past `limit` bytes (None: no limit)."""
    return subprocess.run(
        command,
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=None if limit is None else lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def partial_files(cwd: Path) -> list[Path]:
    return list(cwd.rglob("*.tmp"))


@pytest.mark.slow
def test_a_refused_checkpoint_stops_the_run_in_one_line_and_the_one_before_resumes(tmp_path):
    refused = run_with_file_limit(
        launch_command("python", SCRIPTS["fabric"], [*SAC_GROWING, "--total-timesteps", "600"], 1),
        tmp_path,
        SAC_SECOND_CHECKPOINT_REFUSED,
    )
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr
    kept = run_dir(tmp_path, "fabric") / "checkpoints" / "step_000000000200.ckpt"
    assert error_lines(refused.stderr) == [
        f"error: could not write {Path('logs/fabric_logs', kept.parent.parent.name, 'checkpoints')}/"
        f"step_000000000400.ckpt: {REFUSED}; the run stopped, and its newest checkpoint is kept: --resume-from "
        f"{Path('logs/fabric_logs', kept.parent.parent.name, 'checkpoints', kept.name)} resumes it"
    ]
    assert sorted(path.name for path in kept.parent.iterdir()) == [kept.name]  # no partial file left
    assert torch.load(kept, weights_only=True)["counters"]["global_step"] == 200

    resumed = run_with_file_limit(
        launch_command(
            "python", SCRIPTS["fabric"], [*SAC_GROWING, "--total-timesteps", "400", "--resume-from", str(kept)], 1
        ),
        tmp_path,
        limit=None,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (kept.parent / "step_000000000400.ckpt").is_file()


@pytest.mark.parametrize("launcher", [pytest.param("fabric run", marks=pytest.mark.slow), "torchrun"])
def test_every_coupled_rank_stops_with_the_line_of_the_checkpoint_rank_0_could_not_write(tmp_path, launcher):
    """Rank 0 writes; the others learn of its failure instead of waiting for the file, or naming rank 0 as lost."""
    script = SCRIPTS["fabric" if launcher == "fabric run" else "torch"]
    refused = run_with_file_limit(
        launch_command(launcher, script, [*PPO_QUICK, "--total-timesteps", "1024", "--num-envs", "2"], 2),
        tmp_path,
        limit=100_000,  # the first checkpoint is about 150 kB
    )
    assert refused.returncode != 0
    lines = error_lines(refused.stderr)
    assert len(lines) == 2 and lines[0] == lines[1], refused.stderr
    assert lines[0].endswith(f"step_000000001024.ckpt: {REFUSED}; the run stopped, and it had no checkpoint yet")
    assert not partial_files(tmp_path)


@pytest.mark.slow
def test_a_decoupled_player_that_cannot_write_its_checkpoint_says_so_and_its_trainer_stops(tmp_path):
    refused = run_with_file_limit(
        launch_command("fabric run", SCRIPTS["decoupled"], [*PPO_QUICK, "--total-timesteps", "1024"], 2),
        tmp_path,
        limit=100_000,
    )
    assert refused.returncode != 0
    player, trainer = error_lines(refused.stderr)
    assert player.endswith(f"step_000000001024.ckpt: {REFUSED}; the run stopped, and it had no checkpoint yet")
    # The trainer says it lost the player, whether it notices first or the launcher's stop reaches it first
    lost = "lost the player: its process ended"
    assert trainer in {f"error: trainer 1: {lost}", f"error: trainer 1: stopped by the launcher because it {lost}"}
    assert not partial_files(tmp_path)


@pytest.mark.slow
def test_every_decoupled_rank_stops_with_the_line_of_the_config_file_the_lead_could_not_write(tmp_path):
    run_folder = tmp_path / "logs" / "fabric_decoupled_logs" / "refused"
    (run_folder / "config.yaml").mkdir(parents=True)  # refused as a full disk is, with an OSError
    args = [*PPO_QUICK, "--run-name", "refused", "--total-timesteps", "1024", "--evaluator", "--eval-episodes", "1"]
    refused = run_with_file_limit(launch_command("fabric run", SCRIPTS["decoupled"], args, 3), tmp_path, limit=None)
    assert refused.returncode != 0
    line = "error: could not write the run's files in logs/fabric_decoupled_logs/refused: Is a directory; the run "
    assert error_lines(refused.stderr) == [f"{line}stopped, and the checkpoints written before it are kept"] * 3


@pytest.mark.slow
def test_a_hogwild_checkpoint_the_system_refuses_stops_the_workers_in_one_line(tmp_path):
    refused = run_with_file_limit(
        launch_command(
            "python",
            SCRIPTS["hogwild"],
            [*PPO_QUICK, "--workers", "2", "--total-timesteps", "16384", "--checkpoint-every", "1024"],
            1,
        ),
        tmp_path,
        limit=100_000,
    )
    assert refused.returncode == 1
    (line,) = error_lines(refused.stderr)
    assert line.endswith(f"step_000000001024.ckpt: {REFUSED}; the run stopped, and it had no checkpoint yet")
    # The workers, stopped mid-run, leave nothing for the resource tracker to warn of.
    assert "leaked" not in refused.stderr, refused.stderr
    assert not partial_files(tmp_path)


def test_logs_the_system_refuses_stop_the_run_in_one_line_rather_than_as_a_value_lightning_cannot_log(tmp_path):
    refused = run_with_file_limit(
        launch_command("python", SCRIPTS["fabric"], [*PPO_QUICK, "--total-timesteps", "8192"], 1),
        tmp_path,
        limit=6_000,  # the event file passes it within the first reports; the config file stays under it
    )
    assert refused.returncode == 1
    assert error_lines(refused.stderr) == [
        f"error: could not write the run's files in logs/fabric_logs/{run_dir(tmp_path, 'fabric').name}: "
        f"{REFUSED}; the run stopped, and the checkpoints written before it are kept"
    ]
    assert "Traceback" not in refused.stderr, refused.stderr  # tensorboard's writer thread prints none either


@pytest.fixture(scope="module")
def saved_agent(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("agent")
    done = run_with_file_limit(
        launch_command("python", SCRIPTS["fabric"], [*PPO_QUICK, "--total-timesteps", "512"], 1), cwd, limit=None
    )
    assert done.returncode == 0, done.stderr
    return run_dir(cwd, "fabric") / "agent.ckpt"


@pytest.mark.parametrize("format", ["torchscript", "onnx"])
def test_an_export_the_system_refuses_is_told_in_one_line_and_leaves_no_file(tmp_path, saved_agent, format):
    out = tmp_path / "policy.out"
    refused = run_with_file_limit(
        [sys.executable, "-m", "rl.export", str(saved_agent), "--format", format, "--out", str(out)], tmp_path, 1_000
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"error: --out: cannot write {out}: {REFUSED}"
    assert not out.exists()


def test_an_evaluation_whose_logs_the_system_refuses_prints_its_scores_and_says_so(tmp_path, saved_agent):
    refused = run_with_file_limit(
        [sys.executable, "-m", "rl.evaluate", str(saved_agent), "--episodes", "1"], tmp_path, limit=100
    )
    assert refused.returncode == 2
    assert "CartPole-v1, 1 deterministic episode: return" in refused.stdout
    assert refused.stderr.strip() == (
        f"error: CHECKPOINT: cannot log the scores above into the checkpoint's run folder, {saved_agent.parent}: "
        f"{REFUSED}"
    )


@pytest.mark.parametrize("named", [True, False], ids=["named run", "run named at its start"])
def test_a_run_whose_folder_is_removed_says_so_and_claims_no_checkpoint_kept(tmp_path, named):
    import rl

    class RemovesTheRunFolder(rl.Callback):
        """What `rm -rf logs` beside a run does, at its second iteration."""

        def on_iteration_end(self, state) -> None:
            if state.iteration == 2 and state.run_dir is not None:
                shutil.rmtree(state.run_dir)

    config = rl.PPOConfig(
        num_envs=2,
        num_steps=64,
        total_timesteps=8192,
        eval_episodes=0,
        progress_bar=False,
        checkpoint_every="256",
        log_dir=str(tmp_path / "logs"),
        run_name="removed" if named else None,
    )
    with pytest.raises(rl.RunStopped) as stopped:
        rl.train(config, callbacks=[RemovesTheRunFolder()])
    assert re.fullmatch(
        r"could not write (the run's files in )?\S+: the (run's )?folder is gone \(removed or moved while the run "
        r"wrote into it\); the run stopped",
        str(stopped.value),
    ), str(stopped.value)
