"""--logger: Lightning's TensorBoard and CSV loggers, alone or together, in every mode, and across a resume."""

import csv
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SCRIPTS, child_env, in_wandb_run, read_scalars, run_dir, run_ranks, wandb_record

RUN = ["--total-timesteps", "2048", "--eval-episodes", "0", "--no-progress-bar"]
SHORT = [*RUN, "--update-epochs", "2"]


def csv_rows(directory: Path, folder: str = "csv") -> list[dict[str, str]]:
    with (directory / folder / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def policy_losses(directory: Path) -> dict[int, str]:
    """The CSV's `Loss/policy_loss` by step."""
    return {int(row["step"]): row["Loss/policy_loss"] for row in csv_rows(directory) if row["Loss/policy_loss"]}


def resume_to(launcher: str, script: str, args: list[str], checkpoint: Path, total: int, cwd: Path, nproc: int):
    resume = ["--total-timesteps", str(total), "--resume-from", str(checkpoint)]
    return run_ranks(launcher, SCRIPTS[script], [*args, *resume], cwd, nproc=nproc)


@pytest.mark.parametrize(
    ("launcher", "script", "args", "nproc"),
    [
        ("fabric run", "fabric", [], 2),
        pytest.param(
            "torchrun",
            "torch",
            ["sac", "--total-timesteps", "1024", "--log-every", "256", "--learning-starts", "128"],
            2,
            marks=pytest.mark.slow,
        ),
        ("fabric run", "decoupled", [], 2),
        pytest.param("python", "hogwild", ["--workers", "2"], 1, marks=pytest.mark.slow),
    ],
    ids=["fabric", "torchrun-sac", "decoupled", "hogwild"],
)
def test_csv_alone_logs_every_scalar_to_a_csv_and_writes_no_event_file(tmp_path, launcher, script, args, nproc):
    common = RUN if args[:1] == ["sac"] else SHORT
    finished = run_ranks(launcher, SCRIPTS[script], [*args, *common, "--logger", "csv"], tmp_path, nproc=nproc)
    assert finished.returncode == 0, finished.stderr[-3000:]
    directory = run_dir(tmp_path, script)
    rows = csv_rows(directory)
    logged = {key for row in rows for key, value in row.items() if value}
    assert {"Rewards/rew_avg", "Game/episodes", "Time/steps_per_second"} <= logged, logged
    assert any(key.startswith("Loss/") for key in logged)
    assert not list(directory.glob("events.out.tfevents.*"))
    steps = [int(row["step"]) for row in rows]
    assert steps == sorted(steps) and len(set(steps)) > 1


def test_logger_alone_logs_no_scalars_and_still_saves_the_run(tmp_path):
    finished = run_ranks("python", SCRIPTS["fabric"], [*SHORT, "--logger"], tmp_path, nproc=1)
    assert finished.returncode == 0, finished.stderr[-3000:]
    directory = run_dir(tmp_path, "fabric")
    assert (directory / "agent.ckpt").is_file() and (directory / "config.yaml").is_file()
    assert not list(directory.rglob("events.out.tfevents.*")) and not (directory / "csv").exists()


def test_csv_and_tensorboard_log_the_same_points_and_a_resume_keeps_the_rows_before_its_checkpoint(tmp_path):
    args = [*SHORT, "--logger", "tensorboard", "csv", "--checkpoint-every", "1024"]
    first = run_ranks("fabric run", SCRIPTS["fabric"], args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    directory = run_dir(tmp_path, "fabric")
    before = policy_losses(directory)
    assert sorted(before) == [step for step, _ in read_scalars(directory)["Loss/policy_loss"]]
    checkpoint = directory / "checkpoints" / "step_000000001024.ckpt"
    resumed = resume_to("fabric run", "fabric", args, checkpoint, 3072, tmp_path, 2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "will be deleted" not in resumed.stderr  # Lightning's warning: the rows before the checkpoint are kept
    after = policy_losses(directory)
    assert sorted(after) == [512 * k for k in range(1, 7)]  # each step once: 512 and 1024 kept, the rest logged anew
    assert all(after[step] == before[step] for step in (512, 1024))
    assert [step for step, _ in read_scalars(directory)["Loss/policy_loss"]] == sorted(after)  # TensorBoard's too
    # The closing figures of each launch at its last step: the first launch's, past the checkpoint, are dropped.
    assert [int(row["step"]) for row in csv_rows(directory) if row["Perf/loop_steps_per_second"]] == [3072]
    assert [step for step, _ in read_scalars(directory)["Perf/loop_steps_per_second"]] == [3072]


def test_a_relaunch_within_the_second_its_run_started_still_hides_what_it_logged_past_the_checkpoint(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from rl.logger import mark_resumed_in_tensorboard

    time.sleep(1 - time.time() % 1)  # the start of a second: all below happens within it, but for the wait
    before = SummaryWriter(str(tmp_path))  # the first launch, which logged past its checkpoint at step 2
    for step in (1, 2, 3, 4):
        before.add_scalar("Loss/x", float(step), step)
    before.close()
    mark_resumed_in_tensorboard(str(tmp_path), resumed_step=2)
    after = SummaryWriter(str(tmp_path))  # the relaunch, from the checkpoint on
    for step in (3, 4):
        after.add_scalar("Loss/x", 10.0 * step, step)
    after.close()
    assert read_scalars(tmp_path)["Loss/x"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


@pytest.mark.slow
def test_a_resumed_decoupled_runs_evaluator_keeps_what_it_logged_before_the_checkpoint(tmp_path):
    args = ["--no-progress-bar", "--evaluator", "--eval-episodes", "2", "--logger", "tensorboard", "csv"]
    args = [*args, "--total-timesteps", "8192", "--checkpoint-every", "4096"]
    first = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=3)
    assert first.returncode == 0, first.stderr[-3000:]
    directory = run_dir(tmp_path, "decoupled")

    def evaluations() -> dict[int, str]:
        return {int(row["step"]): row["Eval/return_mean"] for row in csv_rows(directory, "csv-evaluator")}

    before = evaluations()
    kept = {step: score for step, score in before.items() if step <= 4096}
    assert kept and max(before) == 8192  # evaluations before the checkpoint, and the final one after it
    resumed = resume_to(
        "fabric run", "decoupled", args, directory / "checkpoints" / "step_000000004096.ckpt", 8192, tmp_path, 3
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = evaluations()
    assert {step: score for step, score in after.items() if step <= 4096} == kept
    assert max(after) == 8192 and len(csv_rows(directory, "csv-evaluator")) == len(after)  # each step once
    scalars = read_scalars(directory)  # the lead's and the evaluator's files, each hiding none of the other's points
    assert [step for step, _ in scalars["Eval/return_mean"]] == sorted(after)  # TensorBoard's too
    assert [step for step, _ in scalars["Loss/policy_loss"]] == sorted(policy_losses(directory))
    assert max(policy_losses(directory)) == 8192
    assert [step for step, _ in scalars["Perf/loop_steps_per_second"]] == [8192]  # the lead's
    assert [step for step, _ in scalars["Perf/peak_rss_mb_max"]] == [8192]  # over every rank


@pytest.mark.slow
@pytest.mark.parametrize(
    "loggers", [["tensorboard", "csv"], ["tensorboard", "csv", "wandb"]], ids=["tensorboard-csv", "and-wandb"]
)
def test_a_resumed_hogwild_run_keeps_what_it_logged_before_its_checkpoint_and_logs_to_every_logger(tmp_path, loggers):
    """Worker 0 writes the training's scalars, the supervisor the closing evaluation's, each to every logger."""
    args = [*RUN[:2], "--update-epochs", "2", "--no-progress-bar", "--workers", "2", "--logger", *loggers]
    args += ["--checkpoint-every", "1024", "--eval-episodes", "2"]
    first = run_ranks("python", SCRIPTS["hogwild"], args, tmp_path, nproc=1)
    assert first.returncode == 0, first.stderr[-3000:]
    directory = run_dir(tmp_path, "hogwild")
    before = policy_losses(directory)
    checkpoint = sorted((directory / "checkpoints").glob("step_*.ckpt"))[0]
    resumed_at = int(checkpoint.stem.removeprefix("step_"))
    assert max(before) > resumed_at  # rows the resumed run must not keep
    resumed = resume_to("python", "hogwild", args, checkpoint, 4096, tmp_path, 1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows, after = csv_rows(directory), policy_losses(directory)
    assert {step: loss for step, loss in after.items() if step <= resumed_at} == {
        step: loss for step, loss in before.items() if step <= resumed_at
    }
    steps = sorted(after)
    assert steps[-1] > 3072 and [step for step, _ in read_scalars(directory)["Loss/policy_loss"]] == steps
    assert rows[-1]["Test/return_mean"] and int(rows[-1]["step"]) == 4096  # the supervisor's, after the workers'
    scalars = read_scalars(directory)  # the supervisor's closing points, hidden by none of worker 0's files
    assert [step for step, _ in scalars["Test/return_mean"]] == [4096]
    assert [step for step, _ in scalars["Perf/peak_rss_mb_max"]] == [4096]  # over the workers
    if "wandb" in loggers:
        logged = wandb_record(directory)
        assert b"Rewards/rew_avg" in logged and b"Test/return_mean" in logged and b"num_envs" in logged


@pytest.mark.slow
def test_wandb_offline_keeps_the_metrics_the_config_and_the_videos_and_a_resume_continues_its_run(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("WANDB_RUN_GROUP", "sweep-7")  # W&B's own variable, which the run's name does not override
    args = [*SHORT, "--logger", "wandb", "--checkpoint-every", "1024", "--capture-video", "--eval-episodes", "1"]
    first = run_ranks("python", SCRIPTS["fabric"], [*args, "--run-name", "tracked"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "anonymous setting" not in first.stdout + first.stderr  # a W&B setting the user never gave
    directory = run_dir(tmp_path, "fabric")
    run_id = (directory / "wandb_id").read_text().strip()
    (offline,) = (directory / "wandb").glob(f"offline-run-*-{run_id}")
    logged = wandb_record(directory)
    assert b"Rewards/rew_avg" in logged and b"Loss/policy_loss" in logged and b"num_envs" in logged
    assert in_wandb_run(logged, display_name="tracked", run_group="sweep-7", job_type="train")
    assert list((offline / "files" / "media" / "videos").rglob("*.mp4"))
    checkpoint = directory / "checkpoints" / "step_000000001024.ckpt"
    resumed = run_ranks(
        "python",
        SCRIPTS["fabric"],
        [*args, "--run-name", "tracked", "--total-timesteps", "3072", "--resume-from", str(checkpoint)],
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    launches = sorted((directory / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(launches) == 2  # the same W&B run, continued
    recorded = [len(list((launch / "files" / "media" / "videos").rglob("*.mp4"))) for launch in launches]
    # each launch logs the videos it recorded, not the earlier launch's again: training's episodes 0, 1, 8 and 27,
    # and its evaluation's one episode
    assert recorded == [4 + 1, 4 + 1]
    evaluate = [sys.executable, "-m", "rl.evaluate", str(directory / "agent.ckpt"), "--episodes", "2"]
    evaluated = subprocess.run(
        [*evaluate, "--logger", "wandb", "--capture-video"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    *_, evaluation = sorted((directory / "wandb").glob(f"offline-run-*-{run_id}"))  # the run's W&B run again
    assert b"Eval/return_mean" in (evaluation / f"run-{run_id}.wandb").read_bytes()
    (video,) = (evaluation / "files" / "media" / "videos").rglob("*.mp4")  # its own, not the training's again
    assert video.parent.name == "Eval", video


@pytest.mark.slow
def test_the_evaluation_command_logs_its_scores_to_the_loggers_it_is_given_and_keeps_earlier_ones(tmp_path):
    trained = run_ranks("python", SCRIPTS["fabric"], [*SHORT, "--total-timesteps", "512"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    directory = run_dir(tmp_path, "fabric")
    command = [sys.executable, "-m", "rl.evaluate", str(directory / "agent.ckpt"), "--logger", "csv"]
    for episodes in ("2", "3"):
        done = subprocess.run(
            [*command, "--episodes", episodes], env=child_env(), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "will be deleted" not in done.stderr
    first, second = csv_rows(directory, "evaluation-csv")  # the second evaluation's row after the first's
    assert float(first["Eval/return_mean"]) > 0 and float(second["Eval/return_mean"]) > 0
    assert not (directory / "evaluation").exists()  # no TensorBoard asked


def test_training_metrics_pool_host_values_and_tensors_into_the_same_means():
    import torch

    from rl.logger import EPISODE_COUNT, EPISODE_RETURN, TrainingMetrics

    metrics = TrainingMetrics(torch.device("cpu"), lambda sums: sums, {"loss": "Loss/loss", "lr": "Info/lr"})
    metrics.record_episodes([1.0, 2.0], [10, 20])  # host lists: summed on the host until the report
    metrics.record_episodes([6.0], [30])
    metrics.record({"loss": torch.tensor(4.0), "lr": torch.tensor(0.5)})
    metrics.record({"loss": torch.tensor([2.0, 0.0]), "lr": 0.25})
    scalars = metrics.compute()
    assert scalars[EPISODE_RETURN] == 3.0 and scalars[EPISODE_COUNT] == 3
    assert scalars["Loss/loss"] == 2.0 and scalars["Info/lr"] == 0.375
    assert metrics.compute() == {}  # each report starts afresh
