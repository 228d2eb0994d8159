"""User callbacks on the training loop's events, in every mode: a request to stop from any one process ends the
run at the next report on all of them, as a finished run (its agent saved and evaluated)."""

import json
import re
from pathlib import Path

import pytest
from conftest import launch, read_scalars, run_dir, run_ranks

SCRIPT = """
import sys

import rl
from callbacks_for_tests import StopAtReport

if __name__ == "__main__":
    config = rl.preset("cartpole", total_timesteps=TOTAL, num_envs=2, num_steps=64, update_epochs=1, eval_episodes=2,
                       progress_bar=False, seed=3, MODE_FLAGS)
    result = rl.train(config, callbacks=[StopAtReport(rank=1, report=2)], mode="MODE")
    if result is not None:
        sys.stdout.write(f"result: {result.agent_path} {result.global_step}\\n")  # one write: ranks share the pipe
"""
TOTAL = 65_536  # far more than the runs take: they stop at the callback's request


def script(tmp_path: Path, mode: str, mode_flags: str) -> Path:
    path = tmp_path / f"train_{mode}.py"
    path.write_text(SCRIPT.replace("TOTAL", str(TOTAL)).replace("MODE_FLAGS", mode_flags).replace("MODE", mode))
    return path


def events(folder: Path, rank: int) -> dict:
    return json.loads((folder / f"events-{rank}.json").read_text())


def finished_early_and_saved(stdout: str) -> int:
    """The step the run ended at, from the result line, after checking it ended finished."""
    results = set(re.findall(r"result: (\S+agent\.ckpt) (\d+)", stdout))  # ranks' lines may interleave
    assert len(results) == 1  # every process that returns a result returns the same
    agent_path, step = results.pop()
    assert Path(agent_path).is_file() and "evaluation over 2 greedy episodes" in stdout
    assert int(step) < TOTAL
    return int(step)


def logged_once_per_report_by_the_main_process(folder: Path, mode: str, main: dict) -> None:
    """The callbacks' own scalars (`state.log`) are in the run's TensorBoard logs, from the process that logs alone,
    at its reports' steps."""
    scalars = read_scalars(run_dir(folder, mode))
    reports = [event["step"] for event in main["events"] if event["event"] == "report"]
    assert scalars["Custom/reports"] == [(step, float(count)) for count, step in enumerate(reports, 1)]
    assert {value for _, value in scalars["Custom/rank"]} == {0.0}


def test_coupled_ranks_all_stop_at_the_report_where_one_asked_and_save_their_agent(tmp_path):
    finished = run_ranks("fabric run", script(tmp_path, "coupled", ""), [], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    step = finished_early_and_saved(finished.stdout)
    ranks = [events(tmp_path, rank) for rank in (0, 1)]
    for rank in ranks:
        assert not rank["interrupted"]
        reports = [event for event in rank["events"] if event["event"] == "report"]
        assert len(reports) == 2 and reports[-1]["step"] == step  # both stopped at rank 1's second report
        assert rank["events"][-2] == {"event": "checkpoint", "iteration": reports[-1]["iteration"], "step": step}
        assert rank["iterations"] == reports[-1]["iteration"]
    assert (run_dir(tmp_path, "fabric") / "checkpoints" / f"step_{step:012d}.ckpt").is_file()
    logged_once_per_report_by_the_main_process(tmp_path, "fabric", ranks[0])


@pytest.mark.slow
def test_decoupled_players_all_stop_where_one_asked(tmp_path):
    finished = launch("fabric run", script(tmp_path, "decoupled", "num_players=2"), [], tmp_path, nproc=3)
    assert finished.returncode == 0, finished.stderr[-3000:]
    step = finished_early_and_saved(finished.stdout)
    players = [events(tmp_path, rank) for rank in (0, 1)]
    assert [player["events"][-1]["step"] for player in players] == [step, step]
    assert not any(player["interrupted"] for player in players)
    logged_once_per_report_by_the_main_process(tmp_path, "decoupled", players[0])


@pytest.mark.slow  # 30 s; the coupled and decoupled tests above take the fast suite's place
def test_hogwild_workers_all_stop_where_one_asked(tmp_path):
    finished = launch("python", script(tmp_path, "hogwild", "workers=2"), [], tmp_path, nproc=1)
    assert finished.returncode == 0, finished.stderr[-3000:]
    finished_early_and_saved(finished.stdout)
    workers = [events(tmp_path, rank) for rank in (0, 1)]
    assert not any(worker["interrupted"] for worker in workers)
    assert all(worker["events"][-1]["event"] == "finish" for worker in workers)
    assert [event["event"] for event in workers[1]["events"]].count("report") >= 2
    logged_once_per_report_by_the_main_process(tmp_path, "hogwild", workers[0])
