"""Env steps/s on one CUDA GPU: eager, captured and compiled, in each topology, beside LeanRL.

    python benchmarks/gpu.py [--configs atari ppo-mujoco sac] [--variants 32-true+eager 32-true ...]
                             [--topologies coupled decoupled evaluator pipelined] [--rounds 1]
                             [--envs-alone] [--baseline DIR] [--leanrl DIR] [--run-limit 300]

Each config runs at every variant and topology, one run after another and round after round, so
that the settings alternate; a row gives the loop's env steps/s as the run prints it (compile time
left out, as the run reports it), the compile seconds, the ratio to the first setting's row, and
the part of the loop's time its envs took to step (where that part is large, the envs bound it).
A variant is a precision and what follows it: `+eager` (--no-cuda-graphs), `+cuda-graphs`,
`+compile`, `+reduce-overhead` (--compile with that mode), `+1-thread` (--torch-threads 1: torch's
own CPU work on one thread, the other cores left to the envs' threads), `+spin` (torch's OpenMP
threads spin while they wait, `OMP_WAIT_POLICY=ACTIVE`; without it they sleep, the entry points'
default), `+while-stepping` and `+after-stepping` (SAC only: --update-while-stepping, the default
with --cuda, and --no-update-while-stepping), `+4-step-phases` (SAC only: --train-freq 4
--gradient-steps 4, one round trip between a decoupled player and trainer per 4 env steps),
`+2-groups` (Atari only: --env-groups 2, half the envs stepping while the policy acts on the other
half); a precision alone is the run's default,
which with --cuda captures CUDA graphs where they serve. The topologies: `coupled` (one
process on the GPU), `decoupled` (a CPU player feeding a GPU trainer), `evaluator` (the same with
an evaluator process beside them) and `pipelined` (decoupled with `--pipeline`: the player acts
with weights one update old, so that its envs step while the trainer trains). A run past
`--run-limit` seconds is stopped and its row fails, so that one run cannot spend a GPU session.

The configs are LeanRL's: PPO on ALE/Breakout-v5 with CleanRL's Atari settings (8 envs x 128
steps, 4 epochs of 4 minibatches; here ale-py's threaded vector env, LeanRL's runs use envpool),
PPO on HalfCheetah with CleanRL's continuous settings (1 env x 2,048 steps, 10 epochs of 32
minibatches), and SAC on HalfCheetah (1 env, a batch of 256, one gradient step per env step; -v5
here, -v4 in LeanRL). LeanRL's published H100 figures, with torch.compile and CUDA graphs: Atari
PPO 6,809, continuous PPO 1,774 and SAC 725 env steps/s. Not run by default: `--configs
atari-envpool`, the Atari config on envpool's envs as LeanRL's runs step them, and
`atari-recurrent`, the Atari config with an LSTM: `32-true` replays its sequences through cuDNN,
`32-true+cuda-graphs` step by step as captured graphs.

`--envs-alone` first times the Atari configs' vector envs (ale-py's and, where it can be imported,
envpool's) stepped with random actions and nothing else, the bound the Atari loop cannot pass.
`--baseline DIR` (a checkout of another revision) runs each variant (or each of
`--baseline-variants`) from there too, in the same rounds: a before and after on the same GPU.
`--leanrl DIR` runs LeanRL's own scripts in the same rounds, with `--compile --cudagraphs` (their
fastest), where DIR holds them and `wheels/` their dependencies for the GPU machine's Python, which
has no package index:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        --platform manylinux1_x86_64 --platform manylinux2014_x86_64 -d DIR/wheels tensordict==0.6.2 \
        torchrl==0.6.0 gymnasium==0.29.1 tqdm orjson cloudpickle pyvers

(the tensordict and torchrl of their time: later ones refuse their TensorDictModule; gymnasium 0.29,
whose `final_observation` their SAC reads). They run through `leanrl_shim/`: its `wandb` prints the
speed they log, and `run_script.py` makes gymnasium 0.29's episode statistics readable under
NumPy 2.4 and later. Their Atari script is not run: it reads old gym's four-part step, which
envpool 1.2.5 no longer returns. `--configs atari-envpool` runs this project's Atari config on
envpool's envs instead, which a GPU command carries in the Atari-only folder that
benchmarks/envpool_kit.py makes (envpool's wheels are past its 64 MiB).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from launch import SUMMARY, fabric_run

COMPILE = re.compile(r"torch\.compile: ([\d.]+) s")
LEANRL_SPEED = re.compile(r"leanrl speed: ([\d.]+)")
ENVS_SHARE = re.compile(r"stepping the envs: [\d.]+ s \((\d+)%\)")
UPDATE_WAIT_SHARE = re.compile(r"waiting for updates: [\d.]+ s \((\d+)%\)")

BREAKOUT = ["--preset", "atari-ppo", "--env-id", "ALE/Breakout-v5", "--total-timesteps", "61440"]
CONFIGS: dict[str, list[str]] = {
    "atari": BREAKOUT,
    "ppo-mujoco": ["--preset", "cleanrl-mujoco", "--env-id", "HalfCheetah-v5", "--total-timesteps", "20480"],
    "sac": ["sac", "--preset", "halfcheetah", "--learning-starts", "1000", "--total-timesteps", "8000"],
    # Run only when named: the Atari config with envpool's envs, as LeanRL steps them (on a GPU machine, from the
    # folder benchmarks/envpool_kit.py makes), and with an LSTM (2 whole sequences per minibatch), to measure its
    # captured step-by-step replay against cuDNN's (`32-true+cuda-graphs` against `32-true`).
    "atari-envpool": [*BREAKOUT, "--vector-mode", "envpool"],
    "atari-recurrent": [*BREAKOUT, "--recurrent"],
}
LEANRL_H100 = {"atari": 6809, "atari-envpool": 6809, "ppo-mujoco": 1774, "sac": 725}
DEFAULT_CONFIGS = ["atari", "ppo-mujoco", "sac"]
# LeanRL's script for each config and its flags for the same run length (HalfCheetah-v4, their default env).
LEANRL_SCRIPTS: dict[str, list[str]] = {
    "ppo-mujoco": ["ppo_continuous_action_torchcompile.py", "--total-timesteps", "20480"],
    "sac": ["sac_continuous_action_torchcompile.py", "--learning-starts", "1000", "--total-timesteps", "8000"],
}
LEANRL_FASTEST = "LeanRL compile+cudagraphs"
VARIANTS = [
    "32-true+eager",
    "32-true",
    "32-true+after-stepping",
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
    "1-thread": ["--torch-threads", "1"],  # torch's CPU ops on one thread, the other cores left to the envs
    "spin": [],  # an environment, not a flag: WAITS
    "while-stepping": ["--update-while-stepping"],  # SAC's update runs on the GPU while the CPU steps the envs
    "after-stepping": ["--no-update-while-stepping"],  # SAC's update waits for the envs' step (its CPU default)
    # SAC: 4 env steps, then 4 gradient steps: a decoupled player and trainer exchange one batch and one weights message
    # per 4 env steps instead of per step
    "4-step-phases": ["--train-freq", "4", "--gradient-steps", "4"],
    "2-groups": ["--env-groups", "2"],  # PPO: half the envs step while the policy acts on the other half
}
# Options that other configs' runs refuse: those configs skip the variant.
ONLY_FOR = {
    "while-stepping": {"sac"},
    "after-stepping": {"sac"},
    "4-step-phases": {"sac"},
    "2-groups": {"atari", "atari-envpool", "atari-recurrent"},  # the others step one env
}
# How torch's OpenMP threads wait between parallel regions. Each run starts with no wait chosen, as a user's would:
# this project's entry points then make the threads sleep, and LeanRL's scripts get libgomp's default. `+spin`
# makes them spin for as long as they wait, as benchmarks/launch.py chooses for the CPU benchmarks: beside ale-py's
# env threads, with as many torch threads as cores, spinning threads take the cores the envs need.
WAITS = {"spin": {"OMP_WAIT_POLICY": "ACTIVE"}}
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
BASELINE = "baseline "  # the label's prefix of a run from the --baseline checkout


class Stopped(Exception):
    """SIGTERM arrived (a time limit, such as gpu_check.sh's BUDGET): the table keeps the runs that finished."""


def stop(signum: int, frame: object) -> None:
    raise Stopped


@dataclass(frozen=True)
class Topology:
    processes: int
    script: str
    accelerator: str  # fabric run's: decoupled roles pick their own devices, so it only starts the processes
    flags: tuple[str, ...] = ()


TOPOLOGIES = {
    "coupled": Topology(1, "train_fabric.py", "cuda"),
    "decoupled": Topology(2, "train_fabric_decoupled.py", "cpu"),
    "evaluator": Topology(3, "train_fabric_decoupled.py", "cpu", ("--evaluator",)),
    "pipelined": Topology(2, "train_fabric_decoupled.py", "cpu", ("--pipeline",)),
}


@dataclass(frozen=True)
class Result:
    steps_per_second: float | None
    compile_seconds: float = 0.0
    failure: str = ""
    envs_share: float | None = None  # of the loop's time, in the process that steps the envs
    update_wait_share: float | None = None  # of a decoupled player's loop, waiting for the trainer's updates


def variant_flags(variant: str) -> list[str]:
    """`bf16-mixed+cuda-graphs` as flags: the precision, then each option's flags."""
    precision, *options = variant.removeprefix(BASELINE).split("+")
    return ["--precision", precision, *(flag for option in options for flag in OPTIONS[option])]


def no_wait_chosen() -> dict[str, str]:
    """This process's environment without a choice of how OpenMP threads wait."""
    return {name: value for name, value in os.environ.items() if name not in WAIT_VARIABLES}


def variant_environment(variant: str) -> dict[str, str]:
    """The environment a run of `variant` starts with: no wait chosen, unless the variant chooses one."""
    _, *options = variant.removeprefix(BASELINE).split("+")
    return no_wait_chosen() | {name: value for option in options for name, value in WAITS.get(option, {}).items()}


def runs_with(config: str, variant: str) -> bool:
    """Whether `config` takes every option of `variant` (the others' rows say "not run")."""
    _, *options = variant.removeprefix(BASELINE).split("+")
    return all(config in ONLY_FOR.get(option, {config}) for option in options)


def setting_label(topology: str, variant: str) -> str:
    return variant if topology == "coupled" else f"{variant} ({topology})"


def run_setting(config: str, topology: str, variant: str, args: argparse.Namespace) -> Result:
    """One run of this project (or of the baseline checkout) at a variant and topology."""
    shape = TOPOLOGIES[topology]
    evaluation = ["--eval-episodes", "2" if "--evaluator" in shape.flags else "0"]
    flags = [*CONFIGS[config], *variant_flags(variant), *shape.flags, "--cuda", *evaluation, "--no-progress-bar"]
    if args.total_timesteps is not None:
        flags[flags.index("--total-timesteps") + 1] = str(args.total_timesteps)
    command = fabric_run(flags, shape.processes, shape.script, shape.accelerator)
    if variant.startswith(BASELINE):
        command[-len(flags) - 1] = os.path.join(os.path.abspath(args.baseline), shape.script)
    done = run_in_scratch(command, variant_environment(variant), args.run_limit)
    loop, compiled = SUMMARY.search(done.stdout), COMPILE.search(done.stdout)
    if done.returncode != 0 or loop is None:
        return Result(None, failure=last_line(done.stderr))
    speed, compile_seconds = int(loop.group(1)) / float(loop.group(2)), float(compiled.group(1)) if compiled else 0.0
    return Result(
        speed,
        compile_seconds,
        envs_share=share(ENVS_SHARE, done.stdout),
        update_wait_share=share(UPDATE_WAIT_SHARE, done.stdout),
    )


def share(pattern: re.Pattern[str], summary: str) -> float | None:
    """A part of the loop's time that the run's closing line gives as a percentage, if it gives it."""
    found = pattern.search(summary)
    return int(found.group(1)) / 100 if found else None


def run_leanrl(config: str, leanrl: Path, site: Path, run_limit: float) -> Result:
    """One run of LeanRL's own script for `config`, at its fastest setting; its last logged speed."""
    script, *flags = LEANRL_SCRIPTS[config]
    shim = Path(__file__).resolve().parent / "leanrl_shim"
    env = no_wait_chosen() | {"PYTHONPATH": os.pathsep.join([str(site), str(shim), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(shim / "run_script.py"), str(leanrl / script), *flags, "--compile", "--cudagraphs"]
    done = run_in_scratch(command, env, run_limit)
    speeds = LEANRL_SPEED.findall(done.stdout)
    if done.returncode != 0 or not speeds:
        return Result(None, failure=last_line(done.stderr))
    return Result(float(speeds[-1]))


def run_in_scratch(command: list[str], env: dict[str, str], limit_seconds: float) -> subprocess.CompletedProcess:
    """`command` run in a folder of its own; past `limit_seconds` it is killed with the processes it started,
    so that one run cannot spend a GPU session's budget (its row then says so)."""
    with tempfile.TemporaryDirectory() as cwd:
        # A process group of its own to kill, in gpu.py's session, so that what ends the session ends the run too.
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=os.setpgrp
        )
        try:
            stdout, stderr = process.communicate(timeout=limit_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\nran past --run-limit ({limit_seconds:.0f} s) and was stopped"
        except BaseException:  # gpu.py's own SIGTERM: the run goes with it
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


def install_leanrl_wheels(leanrl: Path) -> Path:
    """LeanRL's dependencies, apart from this project's, in a folder of their own."""
    site = Path(tempfile.mkdtemp(prefix="leanrl-site-"))
    wheels = sorted(str(wheel) for wheel in (leanrl / "wheels").glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, *wheels], check=True)
    return site


def envs_alone() -> dict[str, float]:
    """Env steps/s of the Atari configs' vector envs stepped alone with random actions: ale-py's threaded envs
    (the atari-ppo preset's choice) and, where it can be imported, envpool's."""
    from atari import envs_alone as step_envs_alone

    backends = ["native", *(["envpool"] if importlib.util.find_spec("envpool") else [])]
    return {backend: step_envs_alone("ALE/Breakout-v5", backend) for backend in backends}


@dataclass
class Measured:
    """Each setting's figures over the rounds, keyed by (config, setting label)."""

    speeds: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    compile_s: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    envs_shares: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # of the loop's time

    def add(self, key: tuple[str, str], result: Result) -> None:
        if result.steps_per_second:
            self.speeds.setdefault(key, []).append(result.steps_per_second)
            self.compile_s.setdefault(key, []).append(result.compile_seconds)
        if result.envs_share is not None:
            self.envs_shares.setdefault(key, []).append(result.envs_share)


def describe(result: Result) -> str:
    speed = f"{result.steps_per_second:,.0f} env steps/s" if result.steps_per_second else f"failed: {result.failure}"
    envs = f", stepping the envs {result.envs_share:.0%} of it" if result.envs_share is not None else ""
    if result.update_wait_share is not None:
        envs += f", waiting for updates {result.update_wait_share:.0%}"
    return f"{speed}, compile {result.compile_seconds:.0f} s{envs}"


def run_rounds(
    args: argparse.Namespace, settings: list[tuple[str, str]], site: Path | None, measured: Measured
) -> None:
    """Every setting of every config, round after round, so that the settings alternate."""
    for round_ in range(1, args.rounds + 1):
        for config in args.configs:
            runs = [(setting_label(*setting), setting) for setting in settings if runs_with(config, setting[1])]
            if site is not None and config in LEANRL_SCRIPTS:
                runs.append((LEANRL_FASTEST, None))
            for label, setting in runs:
                started = time.perf_counter()
                result = (
                    run_setting(config, *setting, args)
                    if setting
                    else run_leanrl(config, args.leanrl, site, args.run_limit)
                )
                wall = time.perf_counter() - started
                print(f"round {round_}: {config} {label}: {describe(result)}, wall {wall:.0f} s", flush=True)
                measured.add((config, label), result)


def print_table(measured: Measured, configs: list[str], labels: list[str]) -> None:
    """The medians of each setting's rounds, with the part of the loop's time spent stepping the envs."""
    print(f"\n| config | setting | env steps/s (median) | x {labels[0]} | x LeanRL H100 | compile s | envs' share |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for config in configs:
        base = statistics.median(measured.speeds.get((config, labels[0]), [0])) or None
        for label in labels:
            key = (config, label)
            if key not in measured.speeds:
                print(f"| {config} | {label} | failed or not run | | | | |")
                continue
            median = statistics.median(measured.speeds[key])
            ratio = f"{median / base:.2f}" if base else ""
            shares = measured.envs_shares.get(key)
            print(
                f"| {config} | {label} | {median:,.0f} | {ratio} | {leanrl_ratio(config, median)} | "
                f"{statistics.median(measured.compile_s[key]):.0f} | "
                f"{f'{statistics.median(shares):.0%}' if shares else ''} |"
            )


def leanrl_ratio(config: str, speed: float) -> str:
    """`speed` over LeanRL's published H100 figure for `config`; blank for a config LeanRL has not."""
    return f"{speed / LEANRL_H100[config]:.2f}" if config in LEANRL_H100 else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument("--topologies", nargs="+", default=["coupled"], choices=list(TOPOLOGIES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, help="each run's length (default: the config's)")
    parser.add_argument("--envs-alone", action="store_true", help="first time the Atari vector env alone")
    parser.add_argument("--baseline", help="a checkout of another revision, run beside this one")
    parser.add_argument("--baseline-variants", nargs="+", help="the variants it runs (default: every variant)")
    parser.add_argument(
        "--leanrl",
        type=lambda folder: Path(folder).resolve(),  # each run starts in a scratch folder of its own
        help="a folder of LeanRL's scripts and wheels/, run beside this one",
    )
    parser.add_argument(
        "--run-limit", type=float, default=300.0, help="seconds after which a run is stopped and its row failed"
    )
    args = parser.parse_args()
    before = [BASELINE + variant for variant in args.baseline_variants or args.variants] if args.baseline else []
    settings = [(topology, variant) for topology in args.topologies for variant in before + args.variants]
    signal.signal(signal.SIGTERM, stop)
    measured = Measured()
    try:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (every run will fail)"
        print(f"GPU: {device}, torch {torch.__version__}", flush=True)
        if args.envs_alone:
            for backend, speed in envs_alone().items():
                print(f"Atari vector env alone ({backend}): {speed:,.0f} env steps/s", flush=True)
        site = install_leanrl_wheels(args.leanrl) if args.leanrl else None
        run_rounds(args, settings, site, measured)
    except Stopped:
        print("stopped by SIGTERM: the table holds the runs that finished", flush=True)
    labels = [setting_label(*setting) for setting in settings] + ([LEANRL_FASTEST] if args.leanrl else [])
    print_table(measured, args.configs, labels)


if __name__ == "__main__":
    main()
