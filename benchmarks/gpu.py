"""Env steps/s on one CUDA GPU at each precision, eager, captured and compiled, beside LeanRL's H100 figures.

    python benchmarks/gpu.py [--configs atari ppo-mujoco sac] [--variants 32-true+eager 32-true ...] [--rounds 1]
                             [--baseline DIR]

Each config runs as one process (`fabric run --devices=1 ... --cuda`) at every variant, the variants
alternating round by round; a row gives the loop's env steps/s as the run prints it (compile time
left out, as the run reports it), the compile seconds, and the ratio to the first variant's row. A
variant is a precision and what follows it: `+eager` (--no-cuda-graphs), `+cuda-graphs`, `+compile`,
`+reduce-overhead` (--compile with that mode); a precision alone is the run's default, which with
--cuda captures CUDA graphs where they serve. With `--baseline DIR` (a checkout of another revision)
each variant (or each of `--baseline-variants`) also runs from there, in the same rounds: a
before-and-after on the same GPU.
The configs are LeanRL's: PPO on ALE/Breakout-v5 with CleanRL's Atari settings (8 envs x 128
steps, 4 epochs of 4 minibatches; here ale-py's threaded vector env, LeanRL's runs use envpool),
PPO on HalfCheetah with CleanRL's continuous settings (1 env x 2,048 steps, 10 epochs of 32
minibatches), and SAC on HalfCheetah (1 env, a batch of 256, one gradient step per env step; -v5
here, -v4 in LeanRL). LeanRL's published H100 figures, with torch.compile and CUDA graphs: Atari
PPO 6,809, continuous PPO 1,774 and SAC 725 env steps/s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time

from launch import SUMMARY, fabric_run

COMPILE = re.compile(r"torch\.compile: ([\d.]+) s")

CONFIGS: dict[str, list[str]] = {
    "atari": ["--preset", "atari-ppo", "--env-id", "ALE/Breakout-v5", "--total-timesteps", "61440"],
    "ppo-mujoco": ["--preset", "cleanrl-mujoco", "--env-id", "HalfCheetah-v5", "--total-timesteps", "20480"],
    "sac": ["sac", "--preset", "halfcheetah", "--learning-starts", "1000", "--total-timesteps", "8000"],
}
LEANRL_H100 = {"atari": 6809, "ppo-mujoco": 1774, "sac": 725}
VARIANTS = [
    "32-true+eager",
    "32-true",
    "bf16-mixed",
    "16-mixed",
    "32-true+compile",
    "32-true+compile+cuda-graphs",
    "bf16-mixed+reduce-overhead",
]
OPTIONS = {
    "eager": ["--no-cuda-graphs"],
    "compile": ["--compile"],
    "reduce-overhead": ["--compile", "--compile-mode", "reduce-overhead"],
    "cuda-graphs": ["--cuda-graphs"],
}
BASELINE = "baseline "  # the label's prefix of a run from the --baseline checkout


def variant_flags(variant: str) -> list[str]:
    """`bf16-mixed+cuda-graphs` as flags: the precision, then each option's flags."""
    precision, *options = variant.removeprefix(BASELINE).split("+")
    return ["--precision", precision, *(flag for option in options for flag in OPTIONS[option])]


def run(config: str, variant: str, baseline: str | None, steps: int | None) -> tuple[float | None, float, str]:
    """(loop env steps/s, compile seconds, the last line of stderr if it failed) of one run."""
    flags = [*CONFIGS[config], *variant_flags(variant), "--cuda", "--eval-episodes", "0", "--no-progress-bar"]
    if steps is not None:
        flags[flags.index("--total-timesteps") + 1] = str(steps)
    command = fabric_run(flags, devices=1, accelerator="cuda")
    if variant.startswith(BASELINE):
        assert baseline is not None
        command[-len(flags) - 1] = os.path.join(os.path.abspath(baseline), "train_fabric.py")
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    loop, compiled = SUMMARY.search(done.stdout), COMPILE.search(done.stdout)
    if done.returncode != 0 or loop is None:
        return None, 0.0, (done.stderr.strip().splitlines() or ["no output"])[-1]
    return int(loop.group(1)) / float(loop.group(2)), float(compiled.group(1)) if compiled else 0.0, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, help="each run's length (default: the config's)")
    parser.add_argument("--baseline", help="a checkout of another revision, run beside this one")
    parser.add_argument("--baseline-variants", nargs="+", help="the variants it runs (default: every variant)")
    args = parser.parse_args()
    if args.baseline:
        before = args.baseline_variants or args.variants
        args.variants = [BASELINE + variant for variant in before] + args.variants
    import torch

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    speeds: dict[tuple[str, str], list[float]] = {}
    compile_s: dict[tuple[str, str], list[float]] = {}
    for round_ in range(1, args.rounds + 1):
        for config in args.configs:
            for variant in args.variants:
                started = time.perf_counter()
                steps, seconds, failure = run(config, variant, args.baseline, args.total_timesteps)
                wall = time.perf_counter() - started
                print(
                    f"round {round_}: {config} {variant}: "
                    f"{f'{steps:,.0f} env steps/s' if steps else f'failed: {failure}'}, "
                    f"compile {seconds:.0f} s, wall {wall:.0f} s",
                    flush=True,
                )
                if steps:
                    speeds.setdefault((config, variant), []).append(steps)
                    compile_s.setdefault((config, variant), []).append(seconds)
    print(f"\n| config | variant | env steps/s (median) | x {args.variants[0]} | x LeanRL H100 | compile s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for config in args.configs:
        base = statistics.median(speeds.get((config, args.variants[0]), [0])) or None
        for variant in args.variants:
            if (config, variant) not in speeds:
                print(f"| {config} | {variant} | failed | | | |")
                continue
            median = statistics.median(speeds[(config, variant)])
            ratio = f"{median / base:.2f}" if base else ""
            print(
                f"| {config} | {variant} | {median:,.0f} | {ratio} | {median / LEANRL_H100[config]:.2f} | "
                f"{statistics.median(compile_s[(config, variant)]):.0f} |"
            )


if __name__ == "__main__":
    main()
