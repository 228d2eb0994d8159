"""The host's work per env step in the steady state: aten ops dispatched, and ops that make the host wait.

    python benchmarks/host_overhead.py [--configs ppo/cartpole sac/pendulum ...] [--iterations 8]
    python benchmarks/host_overhead.py --against REV [--rounds 3]

On a GPU every op is a kernel launch the host pays for, and an op that needs a value on the
host (`.item()`, `float(t)`, `bool(t)`, a boolean mask index, `nonzero`, `multinomial`'s checks)
empties the stream, so the host's launch time and the GPU's work add up instead of overlapping.
Both are counted here on CPU, where they are the same ops: a `TorchDispatchMode` counts every
aten op inside the loop's iterations (collecting and learning: `rl.Callback`'s
`on_iteration_start` to `on_iteration_end`), leaving out reports, checkpoints and evaluations,
after a warm-up (SAC: after its learning starts). Each config trains in this process (coupled,
one rank) and prints, per env step, the aten ops (and those of them that are not views, which on a
GPU each launch a kernel) and the host-waiting ops by name, and the
loop's env steps/s (in runs without the counter) with the preset's networks and with tiny MLPs
(16 units), where the networks' compute is negligible and the rate is the host's overhead per
step. Run it in a scratch folder: each run writes its folder under ./logs.

With `--against REV` it times each config (preset and tiny networks) here and at git revision
REV instead, each run in a fresh process, alternating which tree goes first, and prints the
ratios. On a GPU, `sync_sites` finds where the loop waits for the GPU, by file and line
(`tests/test_gpu.py` holds it to none: each step's wait for its actions is on an event recorded after
their copy, which torch's sync debug mode does not count).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from launch import REPO, alternated_ratios, checkout
from torch.utils._python_dispatch import TorchDispatchMode

import rl

# Ops that need a value on the host: on a GPU each one waits for the stream to empty.
HOST_WAITING = {
    "aten._local_scalar_dense",  # .item(), float(t), int(t), bool(t)
    "aten.is_nonzero",
    "aten.nonzero",
    "aten.masked_select",
    "aten.multinomial",  # its input checks read the probabilities
    "aten.unique",
    "aten._unique2",
    "aten.repeat_interleave",
    "aten.equal",
}
# Indexing by a boolean mask finds the mask's true entries on the host first (its nonzero runs inside the
# kernel, where the dispatch does not see it): counted under its own name.
MASKABLE = ("aten.index", "aten.index_put", "aten.index_put_")
BY_MASK = " (boolean mask)"
HOST_WAITING |= {name + BY_MASK for name in MASKABLE}
TINY = {"hidden_size": 16}


@dataclass(frozen=True)
class Config:
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    warm_up_steps: int = 0  # env steps before the window: SAC's learning_starts and more
    timed_iterations: int = 8  # after the warm-up, in the runs that time the loop

    def config(self, steps: int, tiny: bool, cuda: bool = False) -> Any:
        values = {"total_timesteps": steps, "eval_episodes": 0, "progress_bar": False, "torch_threads": 1, "cuda": cuda}
        values |= self.overrides | (self.tiny if tiny else {})
        return rl.preset(self.preset, **values)

    @property
    def tiny(self) -> dict[str, Any]:
        return {"net_arch": (16, 16)} if self.preset.startswith("sac/") else TINY


SAC_WARM_UP = {"learning_starts": 256}
CONFIGS = {
    "ppo/cartpole": Config("cartpole", timed_iterations=160),
    "ppo/cartpole-native": Config("cartpole", {"vector_mode": "native"}),  # its envs reset a step late
    "ppo/cnn": Config("cartpole", {"env_id": "rl/PixelCartPole-v1", "num_steps": 32}),
    "ppo/normalized": Config("pendulum", {"num_steps": 64, "update_epochs": 2}),  # observations and rewards
    "ppo/recurrent": Config("masked-cartpole", timed_iterations=40),
    "sac/pendulum": Config("sac/pendulum", SAC_WARM_UP, warm_up_steps=512, timed_iterations=3000),
    "sac/pendulum-while-stepping": Config(
        "sac/pendulum", SAC_WARM_UP | {"update_while_stepping": True}, warm_up_steps=512, timed_iterations=3000
    ),
    "sac/pendulum-actor-after-critics": Config(
        "sac/pendulum", SAC_WARM_UP | {"actor_after_critics": True}, warm_up_steps=512, timed_iterations=3000
    ),
    "ppo/atari": Config("atari-ppo", timed_iterations=4),
    # LeanRL's continuous PPO (CleanRL's settings: 1 env x 2,048 steps, 10 epochs of 32 minibatches).
    "ppo/mujoco": Config("cleanrl-mujoco", {"env_id": "HalfCheetah-v5"}, timed_iterations=2),
}
# The configs whose steady state the tests check for waits, on the CPU and on a GPU.
STEADY_STATE_CONFIGS = [
    "ppo/cartpole",
    "ppo/cartpole-native",
    "ppo/cnn",
    "ppo/normalized",
    "ppo/recurrent",
    "sac/pendulum",
    "sac/pendulum-actor-after-critics",
]


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket._qualified_op_name).replace("::", ".")
        if name in MASKABLE and any(is_mask(index) for index in args[1]):
            name += BY_MASK
        self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def is_view(name: str) -> bool:
    """Whether the op named so returns a view of its input (metadata only: on a GPU it launches no kernel)."""
    namespace, _, op_name = name.removesuffix(BY_MASK).partition(".")
    packet = getattr(getattr(torch.ops, namespace), op_name)
    returns = getattr(packet, packet.overloads()[0])._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def is_mask(index: object) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


class SyncSites:
    """Where the host waited for the GPU, by file and line (torch's sync debug mode warns at each wait);
    entered once per iteration of the window, the counts add up."""

    def __init__(self) -> None:
        self.sites: collections.Counter[str] = collections.Counter()
        self.caught: contextlib.AbstractContextManager | None = None
        self.warned: list[warnings.WarningMessage] = []

    def __enter__(self) -> SyncSites:
        if torch.cuda.is_available():  # switched before recording: the switch itself once warns of a sync
            torch.cuda.set_sync_debug_mode("warn")
        self.caught = warnings.catch_warnings(record=True)
        self.warned = self.caught.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.caught is not None
        self.caught.__exit__(*exc_info)  # recording ends before the switch back
        if torch.cuda.is_available():  # elsewhere nothing waits: no site is found
            torch.cuda.set_sync_debug_mode("default")
        for warning in self.warned:
            if "synchroniz" in str(warning.message):
                self.sites[f"{os.path.relpath(warning.filename, REPO)}:{warning.lineno}"] += 1


class SteadyStateWindow(rl.Callback):
    """Watch every iteration after `warm_up_steps` with `watch` (by default: count its ops), and count the
    env steps they took."""

    def __init__(
        self,
        warm_up_steps: int,
        steps_per_iteration: int,
        watch: contextlib.AbstractContextManager | None = None,
    ) -> None:
        self.warm_up_steps, self.steps_per_iteration = warm_up_steps, steps_per_iteration
        self.counter, self.steps = OpCounter(), 0
        self.watch = watch or self.counter
        self.active: contextlib.AbstractContextManager | None = None

    def on_iteration_start(self, state: rl.LoopState) -> None:
        if state.global_step - self.steps_per_iteration >= self.warm_up_steps:
            self.active = self.watch
            self.active.__enter__()

    def on_iteration_end(self, state: rl.LoopState) -> None:
        if self.active is not None:
            self.active.__exit__(None, None, None)
            self.active = None
            self.steps += self.steps_per_iteration


SUMMARY = re.compile(r"training loop: (\d+) steps in ([\d.]+) s")


def train(config: Config, iterations: int, tiny: bool, callbacks: list[rl.Callback], cuda: bool = False) -> float:
    """Train the warm-up and `iterations` more; the loop's env steps/s (NaN on a rank that does not report it)."""
    steps_per_iteration = config.config(1, tiny).steps_per_iteration
    total = config.warm_up_steps + (iterations + 1) * steps_per_iteration
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rl.train(config.config(total, tiny, cuda), callbacks=callbacks)
    summary = SUMMARY.search(printed.getvalue())
    if summary is None:  # a rank that does not print the run's summary
        return float("nan")
    steps, seconds = map(float, summary.groups())
    return steps / seconds


def ops_per_step(config: Config, iterations: int) -> dict[str, float]:
    """Ops per env step, by name, in the steady-state window (counting slows the loop: no rate from this run)."""
    window = SteadyStateWindow(config.warm_up_steps, config.config(1, False).steps_per_iteration)
    train(config, iterations, False, [window])
    return {name: count / window.steps for name, count in window.counter.counts.items()}


def sync_sites(config: Config, iterations: int) -> dict[str, int]:
    """On a GPU: where the steady-state loop made the host wait for the GPU (file:line -> times)."""
    sites = SyncSites()
    window = SteadyStateWindow(config.warm_up_steps, config.config(1, False).steps_per_iteration, sites)
    train(config, iterations, False, [window], cuda=True)
    return dict(sites.sites)


def rate_with(tree: Path, name: str, tiny: bool) -> float:
    """The loop's env steps/s of config `name` trained by the `rl` package of `tree`, in a fresh process."""
    command = [sys.executable, __file__, "--rate-of", name]
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [*command, *(["--tiny"] if tiny else [])],
            cwd=scratch,
            env=os.environ | {"PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=True,
        )
    return float(done.stdout.split()[-1])


def against(revision: str, names: list[str], rounds: int) -> None:
    """Each config's env steps/s in this tree and in `revision`, alternated run by run (which goes first too)."""
    runs = {
        f"{name} ({'tiny' if tiny else 'preset'} networks)": (name, tiny) for name in names for tiny in (False, True)
    }
    with checkout(revision) as baseline:
        ratios = alternated_ratios(
            list(runs), lambda run, tree: rate_with(tree, *runs[run]), baseline, revision, rounds
        )
    print(f"\n| config | networks | this tree / {revision} (median of {rounds} rounds) |")
    print("| --- | --- | --- |")
    for run, values in ratios.items():
        name, tiny = runs[run]
        print(f"| {name} | {'tiny' if tiny else 'preset'} | {statistics.median(values):.3f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--iterations", type=int, default=8, help="iterations counted, after the warm-up")
    parser.add_argument("--against", metavar="REV", help="time each config here and at git revision REV, alternated")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: runs of each config in each tree")
    parser.add_argument("--rate-of", choices=list(CONFIGS), help=argparse.SUPPRESS)  # one timed run, for --against
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rate_of:
        config = CONFIGS[args.rate_of]
        print(train(config, config.timed_iterations, args.tiny, []))
        return
    if args.against:
        against(args.against, args.configs, args.rounds)
        return
    print(
        "| config | aten ops per env step | of which not views | host-waiting ops per env step | which "
        "| env steps/s | tiny: env steps/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.configs:
        per_step = ops_per_step(CONFIGS[name], args.iterations)
        config = CONFIGS[name]
        rate = train(config, config.timed_iterations, False, [])
        tiny_rate = train(config, config.timed_iterations, True, [])
        waiting = {op: count for op, count in per_step.items() if op in HOST_WAITING}
        which = ", ".join(f"{op.removeprefix('aten.')} {count:.2f}" for op, count in sorted(waiting.items()))
        launching = sum(count for op, count in per_step.items() if not is_view(op))
        print(
            f"| {name} | {sum(per_step.values()):.1f} | {launching:.1f} | {sum(waiting.values()):.2f} | "
            f"{which or 'none'} | {rate:,.0f} | {tiny_rate:,.0f} |",
            flush=True,
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
