"""The scaling study end to end on a tiny budget: real launched jobs, results, figures, resume."""

import csv
import subprocess
import sys

import pytest
from conftest import REPO, child_env

STUDY = [
    sys.executable,
    str(REPO / "benchmarks" / "scaling.py"),
    "--modes",
    "coupled",
    "decoupled",
    "hogwild-synced",
    "--world-sizes",
    "1",
    "2",
    "--seeds",
    "1",
    "--total-timesteps",
    "3072",
]


def run_study(out) -> subprocess.CompletedProcess:
    return subprocess.run([*STUDY, "--out", str(out)], env=child_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_study_writes_one_row_per_run_its_figures_and_resumes_without_rerunning(tmp_path):
    first = run_study(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[5/5] hogwild-synced-w2-s1" in first.stdout  # progress, one line per run
    with open(tmp_path / "results.csv") as file:
        rows = list(csv.DictReader(file))
    runs = [(row["mode"], row["world_size"]) for row in rows]
    assert runs == [
        ("coupled", "1"),
        ("hogwild-synced", "1"),
        ("coupled", "2"),
        ("decoupled", "2"),
        ("hogwild-synced", "2"),
    ]
    by_mode = {(row["mode"], row["world_size"]): row for row in rows}
    assert float(by_mode[("coupled", "1")]["speedup"]) == 1.0
    for row in rows:
        assert float(row["env_steps_per_s"]) > 0 and float(row["wall_time_s"]) > 0
        assert float(row["efficiency"]) == round(float(row["speedup"]) / int(row["world_size"]), 3)
        assert row["oversubscribed"] == "False" and row["final_eval_return"] != ""
    with open(tmp_path / "curves" / "decoupled-w2-s1.csv") as file:
        curve = list(csv.DictReader(file))
    assert int(curve[-1]["env_steps"]) == 3072 and all(line["episode_return"] for line in curve)
    for figure in ("return_vs_steps_per_process", "return_vs_total_steps", "return_vs_wall_time", "speedup"):
        assert (tmp_path / "figures" / f"{figure}.png").stat().st_size > 10_000, figure
    again = run_study(tmp_path)
    assert again.returncode == 0 and "5 runs, 5 already done" in again.stdout and "[1/" not in again.stdout
    other = [*STUDY[:-1], "6144", "--out", str(tmp_path)]  # the same folder, another step budget
    refused = subprocess.run(other, env=child_env(), capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "holds a study with other settings" in refused.stderr
