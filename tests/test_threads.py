"""Each rank takes its share of the cores, whichever launcher started it, and its threads do not spin on them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, child_env

from rl.runtime import configure_torch_threads


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("local_ranks", [1, 2, 64])
def test_threads_are_the_cores_divided_by_the_local_ranks(monkeypatch, local_ranks):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    cores = len(os.sched_getaffinity(0))
    expected = max(1, cores // local_ranks)
    assert configure_torch_threads() == expected
    assert torch.get_num_threads() == expected


def test_a_plain_script_uses_every_core(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert configure_torch_threads() == len(os.sched_getaffinity(0))


GNU_OPENMP = any(Path(torch.__file__).parent.glob("lib/libgomp*"))


@pytest.mark.skipif(not GNU_OPENMP, reason="this torch does not load GNU OpenMP, whose settings the test reads")
@pytest.mark.parametrize(
    ("chosen", "spin_count"),
    [({}, "0"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"), ({"GOMP_SPINCOUNT": "300000"}, "300000")],
    ids=["unset", "active", "spin-count"],
)
def test_openmp_threads_sleep_while_they_wait_unless_the_user_chose_a_wait(tmp_path, chosen, spin_count):
    """A spinning thread holds a core that other processes need: an entry point starts torch with sleeping ones."""
    inherited = {k: v for k, v in child_env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env = inherited | chosen | {"OMP_DISPLAY_ENV": "VERBOSE"}  # OpenMP prints its settings as it loads
    done = subprocess.run(
        [sys.executable, str(SCRIPTS["fabric"]), "--env-id", "NoSuchEnv-v0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"GOMP_SPINCOUNT = '{spin_count}'" in done.stderr, done.stderr[-2000:]
