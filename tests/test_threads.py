"""Each rank takes its share of the cores, whichever launcher started it."""

import os

import pytest
import torch

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
