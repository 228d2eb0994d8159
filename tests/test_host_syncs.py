"""The steady-state loop dispatches no op that makes the host wait for the device.

On a GPU each such op (`.item()`, `bool(t)`, a boolean index, `nonzero`, `multinomial`'s checks)
empties the stream. They are the same ops on the CPU, so `benchmarks/host_overhead.py`'s counter
finds them here: every op of the iterations after a warm-up, in one process. The acting side's
copy of each step's actions to the envs is a plain copy, not counted: it is the one wait a step
needs. The recurrent policy's replay cuts its sequences at episode starts, data-dependent shapes
that need the host, and is left out.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_overhead


@pytest.mark.parametrize("config", ["ppo/cartpole", "ppo/cnn", "sac/pendulum"])
def test_the_steady_state_loop_never_makes_the_host_wait(tmp_path, monkeypatch, config):
    monkeypatch.chdir(tmp_path)  # the runs write their folders under ./logs
    per_step = host_overhead.ops_per_step(host_overhead.CONFIGS[config], iterations=2)
    assert sum(per_step.values()) > 10  # the window saw the loop's work
    waiting = {op: count for op, count in per_step.items() if op in host_overhead.HOST_WAITING}
    assert not waiting, f"ops that wait for the device, per env step: {waiting}"
