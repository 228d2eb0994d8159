"""The steady-state loop dispatches no op that makes the host wait for the device.

On a GPU each such op (`.item()`, `bool(t)`, a boolean index, `nonzero`, `multinomial`'s checks)
empties the stream. They are the same ops on the CPU, so `benchmarks/host_overhead.py`'s counter
finds them here: every op of the iterations after a warm-up, in one process. The acting side's
copy of each step's actions to the envs is a plain copy, not counted: it is the one wait a step
needs. The recurrent policy's replay cuts its sequences at episode starts into segments whose
shapes depend on the data: it plans them from the starts that the host keeps (numpy, which the
counter does not see), and the device only gathers by the planned indices.

With more processes (real ones, over gloo), each coupled rank is held to the same, and a
decoupled lead player and trainer too, counted over its whole run at two lengths: the difference is its steady
state. The trainer reads the players' message headers, host buffers under gloo, with `tolist`,
which the counter does not see and which waits for no GPU.
"""

import json
import sys
from pathlib import Path

import pytest
from conftest import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_overhead

OPS_SCRIPT = Path(__file__).resolve().parent / "ops_for_tests.py"


def host_waiting(counts: dict[str, float]) -> dict[str, float]:
    return {op: count for op, count in counts.items() if op in host_overhead.HOST_WAITING and count}


def rank_ops(tmp_path: Path, mode: str, config: str, amount: int) -> list[dict[str, float]]:
    """Each rank's ops (ops_for_tests.py) in a 2-process job."""
    folder = tmp_path / f"{mode}-{amount}"
    folder.mkdir()
    finished = run_ranks("fabric run", OPS_SCRIPT, [mode, config, str(amount)], folder)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return [json.loads((folder / f"ops-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("config", host_overhead.STEADY_STATE_CONFIGS)
def test_the_steady_state_loop_never_makes_the_host_wait(tmp_path, monkeypatch, config):
    monkeypatch.chdir(tmp_path)  # the runs write their folders under ./logs
    per_step = host_overhead.ops_per_step(host_overhead.CONFIGS[config], iterations=2)
    assert sum(per_step.values()) > 10  # the window saw the loop's work
    waiting = {op: count for op, count in per_step.items() if op in host_overhead.HOST_WAITING}
    assert not waiting, f"ops that wait for the device, per env step: {waiting}"


@pytest.mark.parametrize("config", ["ppo/cartpole", "ppo/recurrent", "sac/pendulum"])
def test_two_coupled_ranks_never_make_the_host_wait_in_the_steady_state(tmp_path, config):
    for rank, per_step in enumerate(rank_ops(tmp_path, "coupled", config, 2)):
        assert sum(per_step.values()) > 10, rank
        assert not host_waiting(per_step), f"rank {rank}, per env step: {host_waiting(per_step)}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "config, steps", [("sac/pendulum", (1024, 1536)), ("ppo/cartpole", (1024, 2048)), ("ppo/recurrent", (1024, 2048))]
)
def test_a_decoupled_player_and_trainer_make_the_host_wait_only_at_their_reports(tmp_path, config, steps):
    short, long = (rank_ops(tmp_path, "decoupled", config, amount) for amount in steps)
    # SAC reports once per run here; PPO at every iteration, where the trainer reads its divergence flag and the
    # lead player the largest policy lag and the trainers' compile time.
    iterations = (steps[1] - steps[0]) // host_overhead.CONFIGS[config].config(1, False).steps_per_iteration
    reports = 0 if config.startswith("sac/") else iterations
    for rank, reads_per_report in ((0, 2), (1, 1)):  # the lead player, the trainer
        steady = {op: long[rank].get(op, 0) - short[rank].get(op, 0) for op in set(short[rank]) | set(long[rank])}
        assert sum(steady.values()) > 10 * (steps[1] - steps[0]), rank
        expected = {"aten._local_scalar_dense": reads_per_report * reports} if reports else {}
        assert host_waiting(steady) == expected, f"rank {rank}: {host_waiting(steady)}"


def test_the_counter_tells_views_from_ops_that_launch_kernels():
    views = ["aten.view", "aten.detach", "aten.t", "aten.expand", "aten.slice", "aten.lift_fresh"]
    kernels = ["aten.mean", "aten.add_", "aten.copy_", "aten.index", "aten.index_put_ (boolean mask)", "aten.randn"]
    assert [host_overhead.is_view(op) for op in views + kernels] == [True] * len(views) + [False] * len(kernels)
