"""Where a GPU run's steady-state env step goes: host time, GPU time, kernel launches, copies and host syncs.

    python benchmarks/gpu_profile.py [--configs sac atari ppo-mujoco atari-envpool] [--iterations 4] [--python]

Each config trains in this process (coupled, one rank, `--cuda`) and profiles a window of
iterations after its warm-up (`rl.Callback`'s `on_iteration_start` to `on_iteration_end`, so
reports, checkpoints and evaluations stay out). Per env step it prints the wall time, the GPU's
busy time (the kernels' and copies' own time), the kernel launches, the host-to-device and
device-to-host copies, and every place in this project's code where the host waited for the GPU
(`torch.cuda.set_sync_debug_mode("warn")`, by file and line). A loop whose GPU time is a small
part of its wall time is bound by the host's launches and syncs, which CUDA graphs remove. It then
splits both times by phase: stepping the envs, learning (the update, with the kernels it launches,
which may run on after it returns) and the rest (acting, recording, the loop's own work), which
says what overlapping the envs' steps with the GPU's work could save.
`--python` profiles the same window with cProfile in a run of its own instead: where the host's
time goes by Python function (the envs' step, the uploads, the loop's own code), per env step. Run
it in a scratch folder: each run writes its folder under ./logs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import pstats
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rl  # first: it sets how torch's OpenMP threads wait (as a user's run does), which OpenMP reads as torch loads

# isort: split
import torch
from host_overhead import SyncSites
from torch.profiler import ProfilerActivity, profile, record_function

from rl.experience import Collector
from rl.modes.coupled import CoupledRank

ON_GPU = torch.cuda.is_available()  # elsewhere the same window on the CPU: a check of this script


@dataclass(frozen=True)
class Config:
    preset: str
    overrides: dict[str, Any]
    warm_up_steps: int

    def config(self, iterations: int) -> Any:
        probe = rl.preset(self.preset, **self.overrides)
        total = self.warm_up_steps + (iterations + 2) * probe.steps_per_iteration
        values = {"total_timesteps": total, "eval_episodes": 0, "progress_bar": False, "cuda": ON_GPU}
        return rl.preset(self.preset, **(self.overrides | values))


CONFIGS = {
    "sac": Config("sac/halfcheetah", {"learning_starts": 1000}, warm_up_steps=1100),
    "atari": Config("atari-ppo", {"env_id": "ALE/Breakout-v5"}, warm_up_steps=2048),
    # LeanRL's backend (benchmarks/envpool_kit.py carries it to a GPU machine); profiled when named
    "atari-envpool": Config("atari-ppo", {"env_id": "ALE/Breakout-v5", "vector_mode": "envpool"}, warm_up_steps=2048),
    "ppo-mujoco": Config("halfcheetah", {}, warm_up_steps=4096),
}


class ProfiledWindow(rl.Callback):
    """Profile every iteration after `warm_up_steps` (SAC: one env step each), the host's syncs beside."""

    def __init__(self, warm_up_steps: int, iterations: int, python: bool = False) -> None:
        self.warm_up_steps, self.iterations = warm_up_steps, iterations
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if ON_GPU else [])]
        self.profiler: contextlib.AbstractContextManager = PythonProfile() if python else profile(activities=activities)
        self.profiled, self.first_step, self.last_step = 0, 0, 0
        self.watching = False
        self.syncs = SyncSites()

    def on_iteration_start(self, state: rl.LoopState) -> None:
        if state.global_step < self.warm_up_steps or self.profiled >= self.iterations:
            return
        if self.profiled == 0:
            synchronize()
            self.first_step = self.last_step
            self.profiler.__enter__()
        self.watching = True
        self.syncs.__enter__()

    def on_iteration_end(self, state: rl.LoopState) -> None:
        if self.watching:
            self.syncs.__exit__(None, None, None)
            self.watching = False
            self.profiled += 1
            if self.profiled == self.iterations:
                synchronize()
                self.profiler.__exit__(None, None, None)
                self.steps = state.global_step - self.first_step
        self.last_step = state.global_step


class PythonProfile(contextlib.AbstractContextManager):
    """cProfile over the window, as a context manager like torch's profiler."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()
        self.seconds = 0.0

    def __enter__(self) -> PythonProfile:
        self.started = time.perf_counter()
        self.profile.enable()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.profile.disable()
        self.seconds = time.perf_counter() - self.started


# The phases of an iteration that the profile times apart: the method that runs each, marked as a range of its own.
PHASES: dict[str, tuple[type, str]] = {
    "stepping the envs": (Collector, "step_envs"),
    "learning": (CoupledRank, "learn"),
}
PHASE_LABEL = "phase: {}"


@contextlib.contextmanager
def phases_marked() -> Iterator[None]:
    """Within, each phase's method runs inside a profiler range named after the phase."""
    originals = {(owner, name): getattr(owner, name) for owner, name in PHASES.values()}
    for phase, (owner, name) in PHASES.items():
        setattr(owner, name, in_range(originals[owner, name], PHASE_LABEL.format(phase)))
    try:
        yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)


def in_range(method: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def marked(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return method(*args, **kwargs)

    return marked


def phase_lines(events: Any, steps: int, wall_us: float, gpu_us: float) -> list[str]:
    """Each phase's host and GPU milliseconds per env step, and the rest's."""
    lines, host_left, gpu_left = [], wall_us, gpu_us
    for phase in PHASES:
        found = [event for event in events if event.key == PHASE_LABEL.format(phase)]
        host = sum(event.cpu_time_total for event in found)
        gpu = sum(event.device_time_total for event in found)
        host_left, gpu_left = host_left - host, gpu_left - gpu
        lines.append(f"  - {phase}: host {host / steps / 1000:.3f} ms, GPU {gpu / steps / 1000:.3f} ms")
    rest = f"host {host_left / steps / 1000:.3f} ms, GPU {gpu_left / steps / 1000:.3f} ms"
    return [*lines, f"  - the rest (acting, recording, the loop's own work): {rest}"]


def synchronize() -> None:
    if ON_GPU:
        torch.cuda.synchronize()


def summarize(window: ProfiledWindow, name: str) -> list[str]:
    """Print the window's figures and its busiest ops; the figures' lines."""
    events = window.profiler.key_averages()
    steps = window.steps
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    wall_us = max(e.time_range.end for e in window.profiler.events()) - min(
        e.time_range.start for e in window.profiler.events()
    )
    copies = {e.key: e.count for e in events if "Memcpy" in e.key and e.device_type == torch.autograd.DeviceType.CUDA}
    lines = [
        f"## {name}: {steps} env steps profiled",
        f"- wall {wall_us / steps / 1000:.3f} ms per env step; GPU busy {gpu_us / steps / 1000:.3f} ms per env step",
        f"- {kernels / steps:.1f} GPU kernels and copies per env step; copies: {copies}",
        "- by phase, per env step:",
        *phase_lines(events, steps, wall_us, gpu_us),
        f"- host syncs per env step: {sum(window.syncs.sites.values()) / steps:.2f}",
        *(f"  - {where}: {count / steps:.2f}" for where, count in window.syncs.sites.most_common(15)),
    ]
    print("", *lines, sep="\n")
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    return lines


def summarize_python(window: ProfiledWindow, name: str) -> None:
    assert isinstance(window.profiler, PythonProfile)
    steps, text = window.steps, io.StringIO()
    per_step_ms = 1000 * window.profiler.seconds / steps
    print(f"\n## {name}: {steps} env steps under cProfile, {per_step_ms:.3f} ms per env step")
    stats = pstats.Stats(window.profiler.profile, stream=text)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)
    print(text.getvalue().replace(str(Path(rl.__file__).parents[1]) + "/", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["sac", "atari", "ppo-mujoco"], choices=list(CONFIGS))
    parser.add_argument("--iterations", type=int, default=4, help="iterations profiled (SAC: env steps x 50)")
    parser.add_argument("--python", action="store_true", help="profile the Python functions (cProfile) instead")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name() if ON_GPU else 'CPU'}, torch {torch.__version__}", flush=True)
    figures: list[str] = []
    for name in args.configs:
        config = CONFIGS[name]
        iterations = args.iterations * (50 if name == "sac" else 1)
        window = ProfiledWindow(config.warm_up_steps, iterations, args.python)
        with contextlib.redirect_stdout(io.StringIO()), phases_marked():
            rl.train(config.config(iterations), callbacks=[window])
        if args.python:
            summarize_python(window, name)
        else:
            figures += summarize(window, name)
    if figures:  # again, together, where the last lines of a long output show them
        print("\n# Every config's figures", *figures, sep="\n")


if __name__ == "__main__":
    main()
