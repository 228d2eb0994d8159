"""Learning parity and speed of --precision and --compile, side by side in one study.

    python benchmarks/precision.py learning [--configs ppo/cartpole ...] [--variants 32-true bf16-mixed ...]
                                            [--seeds 1 2 3] [--out OUT]
    python benchmarks/precision.py pong [--variants 32-true bf16-mixed] [--out OUT]
    python benchmarks/precision.py speed [--rounds 2]

`learning` trains each config at every variant (a precision, optionally `+compile`) and seed with
`fabric run --devices=2` (one torch thread per rank) and prints, per config and variant, the
greedy return (10 episodes, mean ± std over seeds), the loop's env steps/s, the compile time and
the wall time, and whether each lower precision stays within the float32 seeds' spread (the rule
for adopting it in a preset). `pong` is the same for ALE/Pong-v5 with `--preset atari-ppo`,
1M steps, one seed, and draws both return curves in one figure (`pip install -e ".[plots]"`).

Every run is named (`--run-name`) and checkpoints every 5 minutes under OUT/runs (default
benchmarks/results/precision), so a study that is stopped, or a session that ends, picks each
run up from its newest checkpoint when started again; a finished run's row is kept in OUT/rows
and its curve in OUT/curves, it is not run again, and its checkpoints are deleted. Each launch's
wall time and loop figures are appended to OUT/segments, and a row sums them.

`speed` times, alternating the commands round by round: the Nature CNN's floor at each
precision (one rank's network alone on one thread, as `benchmarks/atari.py` measures it), the
Atari loop per vector backend at 2 ranks at each precision, and PPO CartPole and SAC Pendulum at
each lever, with the compile time left out as the runs report it.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

from launch import RESULTS, fabric_run, loop_steps_per_second
from resumable import Run, curve, resumable_flags, run_all

REPO = Path(__file__).resolve().parents[1]

PIXEL_CARTPOLE = (
    "--env-id rl/PixelCartPole-v1 --resize 0 --frame-stack 2 --total-timesteps 30000 --num-envs 4 --num-steps 128 "
    "--update-epochs 4 --per-rank-batch-size 128 --learning-rate 1e-3"
).split()
CONFIGS: dict[str, list[str]] = {
    "ppo/cartpole": ["--preset", "cartpole"],
    "ppo/pixelcartpole": PIXEL_CARTPOLE,
    "ppo/lunarlander": ["--preset", "lunarlander"],
    "sac/pendulum": ["sac", "--preset", "pendulum"],
    "ppo/pong": ["--preset", "atari-ppo", "--env-id", "ALE/Pong-v5", "--total-timesteps", "1000000"],
}
LEARNING_CONFIGS = ["ppo/cartpole", "ppo/pixelcartpole", "ppo/lunarlander", "sac/pendulum"]  # cheapest first
VARIANTS = ["32-true", "bf16-mixed", "bf16-true", "32-true+compile"]


def run_name(config: str, variant: str, seed: int) -> str:
    return f"{config.replace('/', '-')}-{variant.replace('+', '-')}-seed{seed}"


def variant_flags(variant: str) -> list[str]:
    """`bf16-mixed+compile` as flags."""
    precision, _, compile_ = variant.partition("+")
    return ["--precision", precision, *(["--compile"] if compile_ else [])]


def command(config: str, variant: str, seed: int, out: Path) -> list[str]:
    flags = [*CONFIGS[config], "--seed", str(seed), *variant_flags(variant)]
    flags += resumable_flags(run_name(config, variant, seed), out)
    return fabric_run(flags)


def plan(configs: list[str], variants: list[str], seeds: list[int], out: Path) -> list[Run]:
    """Every (config, variant, seed), the variants alternating seed by seed."""
    return [
        Run(run_name(c, v, s), functools.partial(command, c, v, s, out), {"config": c, "variant": v, "seed": s})
        for c in configs
        for s in seeds
        for v in variants
    ]


def markdown(rows: list[dict], configs: list[str], variants: list[str]) -> str:
    """A row per config and variant; lower precisions are judged against the float32 seeds' spread."""
    lines = [
        "| config | variant | greedy return | seeds | env steps/s | compile s | wall time per run | "
        "within float32's spread |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in configs:
        reference = [row["eval_return"] for row in rows if row["config"] == config and row["variant"] == "32-true"]
        for variant in variants:
            members = [row for row in rows if row["config"] == config and row["variant"] == variant]
            if not members:
                continue
            returns = [row["eval_return"] for row in members]
            mean = statistics.mean(returns)
            verdict = "—" if variant == "32-true" or not reference else ("yes" if mean >= min(reference) else "no")
            speeds = [row["env_steps_per_s"] for row in members if row["env_steps_per_s"]]
            lines.append(
                f"| {config} | {variant} | {mean:.1f} ± {statistics.pstdev(returns):.1f} "
                f"({', '.join(f'{r:.1f}' for r in returns)}) | {len(members)} | "
                f"{statistics.mean(speeds):,.0f} | {statistics.mean(row['compile_s'] for row in members):.0f} | "
                f"{statistics.mean(row['wall_time_s'] for row in members):.0f} s | {verdict} |"
            )
    return "\n".join(lines)


def pong_figure(out: Path, variants: list[str]) -> None:
    """Both runs' training returns against env steps, in one figure."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for variant in variants:
        steps, _, returns = curve(out, run_name("ppo/pong", variant, 1))
        axes.plot(steps, returns, label=variant)
    axes.set_xlabel("env steps")
    axes.set_ylabel("training episode return")
    axes.set_title("ALE/Pong-v5, --preset atari-ppo, 2 ranks, seed 1")
    axes.legend()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "figures" / "pong_return_vs_steps.png", dpi=120, bbox_inches="tight")


def speed(rounds: int) -> None:
    """The levers' speed, each command alternating with the others round by round."""
    sys.path.insert(0, str(Path(__file__).parent))
    from atari import floor, whole_loop

    for round_ in range(1, rounds + 1):
        for lever in ("baseline", "bf16_autocast"):
            result = floor(lever, repeats=2)
            print(
                f"round {round_}: Nature CNN floor [{lever}]: {result['train_step_ms']:.0f} ms per minibatch of "
                f"256, {result['steps_per_s']:.0f} env steps/s per rank",
                flush=True,
            )
        for precision in ("32-true", "bf16-mixed"):
            for mode in ("sync", "native"):
                steps = whole_loop("ALE/Pong-v5", mode, 2, 2, ["--precision", precision])
                print(
                    f"round {round_}: Pong loop, {mode}, 2 ranks, {precision}: {steps or 0:,.0f} env steps/s",
                    flush=True,
                )
        for config, total in (("ppo/cartpole", "32768"), ("sac/pendulum", "3000")):
            for variant in VARIANTS:
                flags = [
                    *CONFIGS[config],
                    "--total-timesteps",
                    total,
                    *variant_flags(variant),
                    "--torch-threads",
                    "1",
                    "--eval-episodes",
                    "0",
                    "--no-progress-bar",
                ]
                steps = loop_steps_per_second(fabric_run(flags))
                print(f"round {round_}: {config}, 2 ranks, {variant}: {steps:,.0f} env steps/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", choices=["learning", "pong", "speed"])
    parser.add_argument("--configs", nargs="+", default=LEARNING_CONFIGS, choices=list(CONFIGS))
    parser.add_argument(
        "--variants", nargs="+", default=None, help=f"default: {' '.join(VARIANTS)} (pong: 32-true bf16-mixed)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "precision")
    args = parser.parse_args()
    if args.study == "speed":
        speed(args.rounds)
        return
    pong = args.study == "pong"
    configs, seeds = (["ppo/pong"], [1]) if pong else (args.configs, args.seeds)
    variants = args.variants or (["32-true", "bf16-mixed"] if pong else VARIANTS)
    rows = run_all(plan(configs, variants, seeds, args.out), args.out)
    (args.out / f"results-{args.study}.json").write_text(json.dumps(rows, indent=2))
    print(markdown(rows, configs, variants))
    if pong:
        pong_figure(args.out, variants)


if __name__ == "__main__":
    main()
