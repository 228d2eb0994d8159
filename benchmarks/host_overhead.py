"""The host's work per env step in the steady state: aten ops dispatched, and ops that make the host wait.

    python benchmarks/host_overhead.py [--configs ppo/cartpole sac/pendulum ...] [--iterations 8]

On a GPU every op is a kernel launch the host pays for, and an op that needs a value on the
host (`.item()`, `float(t)`, `bool(t)`, a boolean index, `nonzero`, `multinomial`'s checks)
empties the stream, so the host's launch time and the GPU's work add up instead of overlapping.
Both are counted here on CPU, where they are the same ops: a `TorchDispatchMode` counts every
aten op inside the loop's iterations (collecting and learning: `rl.Callback`'s
`on_iteration_start` to `on_iteration_end`), leaving out reports, checkpoints and evaluations,
after a warm-up (SAC: after its learning starts). Each config trains in this process (coupled,
one rank) and prints, per env step, the aten ops and the host-waiting ops by name, and the
loop's env steps/s (in runs without the counter) with the preset's networks and with tiny MLPs
(16 units), where the networks' compute is negligible and the rate is the host's overhead per
step. Run it in a scratch folder: each run writes its folder under ./logs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
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
TINY = {"hidden_size": 16}


@dataclass(frozen=True)
class Config:
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    warm_up_steps: int = 0  # env steps before the window: SAC's learning_starts and more

    def config(self, steps: int, tiny: bool) -> Any:
        values = {"total_timesteps": steps, "eval_episodes": 0, "progress_bar": False, "torch_threads": 1}
        values |= self.overrides | (self.tiny if tiny else {})
        return rl.preset(self.preset, **values)

    @property
    def tiny(self) -> dict[str, Any]:
        return {"net_arch": (16, 16)} if self.preset.startswith("sac/") else TINY


CONFIGS = {
    "ppo/cartpole": Config("cartpole"),
    "ppo/cnn": Config("cartpole", {"env_id": "rl/PixelCartPole-v1", "num_steps": 32}),
    "ppo/recurrent": Config("masked-cartpole"),
    "sac/pendulum": Config("sac/pendulum", {"learning_starts": 256}, warm_up_steps=512),
}


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket._qualified_op_name).replace("::", ".")
        self.counts[name] += 1
        return func(*args, **(kwargs or {}))


class SteadyStateWindow(rl.Callback):
    """Count the ops of every iteration after `warm_up_steps`, and the env steps they took."""

    def __init__(self, warm_up_steps: int, steps_per_iteration: int) -> None:
        self.warm_up_steps, self.steps_per_iteration = warm_up_steps, steps_per_iteration
        self.counter, self.steps = OpCounter(), 0
        self.active: contextlib.AbstractContextManager | None = None

    def on_iteration_start(self, state: rl.LoopState) -> None:
        if state.global_step - self.steps_per_iteration >= self.warm_up_steps:
            self.active = self.counter
            self.active.__enter__()

    def on_iteration_end(self, state: rl.LoopState) -> None:
        if self.active is not None:
            self.active.__exit__(None, None, None)
            self.active = None
            self.steps += self.steps_per_iteration


SUMMARY = re.compile(r"training loop: (\d+) steps in ([\d.]+) s")


def train(config: Config, iterations: int, tiny: bool, callbacks: list[rl.Callback]) -> float:
    """Train the warm-up and `iterations` more; the loop's env steps/s."""
    steps_per_iteration = config.config(1, tiny).steps_per_iteration
    total = config.warm_up_steps + (iterations + 1) * steps_per_iteration
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rl.train(config.config(total, tiny), callbacks=callbacks)
    steps, seconds = map(float, SUMMARY.search(printed.getvalue()).groups())
    return steps / seconds


def ops_per_step(config: Config, iterations: int) -> dict[str, float]:
    """Ops per env step, by name, in the steady-state window (counting slows the loop: no rate from this run)."""
    window = SteadyStateWindow(config.warm_up_steps, config.config(1, False).steps_per_iteration)
    train(config, iterations, False, [window])
    return {name: count / window.steps for name, count in window.counter.counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--iterations", type=int, default=8, help="iterations counted, after the warm-up")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| config | aten ops per env step | host-waiting ops per env step | which | env steps/s | tiny: env steps/s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.configs:
        per_step = ops_per_step(CONFIGS[name], args.iterations)
        rate = train(CONFIGS[name], args.iterations, False, [])
        tiny_rate = train(CONFIGS[name], args.iterations, True, [])
        waiting = {op: count for op, count in per_step.items() if op in HOST_WAITING}
        which = ", ".join(f"{op.removeprefix('aten.')} {count:.2f}" for op, count in sorted(waiting.items()))
        print(
            f"| {name} | {sum(per_step.values()):.1f} | {sum(waiting.values()):.2f} | {which or 'none'} | "
            f"{rate:,.0f} | {tiny_rate:,.0f} |",
            flush=True,
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
