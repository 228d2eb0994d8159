"""How torch's OpenMP threads wait for work, on a quiet machine and on one that other processes share.

    python benchmarks/omp_wait.py [--rounds 2] [--busy 0 1] [--load spin|training] [--cases ...] [--timeout 120]
    python benchmarks/omp_wait.py --envs [--rounds 2]
    python benchmarks/omp_wait.py --threads [--rounds 2] [--cases ...]

Each case is one process with a torch thread per core (`--torch-threads`; a CNN's default), run with
libgomp's own default wait (spin about 300,000 times, then sleep: `GOMP_SPINCOUNT=300000`) and with
`OMP_WAIT_POLICY=PASSIVE` (sleep at once), alternating, `--rounds` times each. `--busy N` adds N
processes that keep one core each busy for the whole measurement, as other jobs on a shared machine
would: `--load spin`, a Python loop that only spins, or `--load training`, a SAC HalfCheetah-v5 run on
one thread, as runs side by side are. It prints the training loop's env steps/s of each run and the
medians' ratio. A run that does not finish within `--timeout` seconds counts as its steps over that time
(an upper bound).

Coupled ranks of one thread each form no OpenMP team, so the wait does not apply to them.

`--envs` times threads against threads instead: ale-py's threaded vector env (8 Breakout envs,
random actions) stepped alone and with one torch copy of each step's observations (the host's part
of a GPU run's upload), in a fresh process for each wait: libgomp's default, passive, and spinning
for as long as they wait (`OMP_WAIT_POLICY=ACTIVE`, what benchmarks/launch.py sets).

`--threads` times thread counts against each other on the quiet machine, per network: each case (an
MLP or a CNN) at one torch thread, and at one per core with the threads sleeping and spinning while
they wait, alternating, `--rounds` times each. It prints every run's env steps/s and a table of the
medians, with one thread's ratio to a thread per core sleeping (the entry points' wait).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from launch import REPO, SUMMARY

QUIET = "--eval-episodes 0 --no-progress-bar".split()
CASES: dict[str, list[str]] = {
    "ppo-cartpole": ["--total-timesteps", "8192", *QUIET],
    "sac-halfcheetah": [
        "sac",
        "--preset",
        "halfcheetah",
        "--total-timesteps",
        "1500",
        "--learning-starts",
        "1000",
        *QUIET,
    ],
    "ppo-pixels": [
        "--env-id",
        "rl/PixelCartPole-v1",
        "--resize",
        "0",
        "--frame-stack",
        "2",
        "--num-envs",
        "4",
        "--total-timesteps",
        "4096",
        *QUIET,
    ],
    "ppo-recurrent": ["--preset", "masked-cartpole", "--total-timesteps", "8192", *QUIET],
    "ppo-atari": ["--preset", "atari-ppo", "--env-id", "ALE/Pong-v5", "--total-timesteps", "3072", *QUIET],
}
NETWORKS = {  # what each case trains: the thread count that pays depends on it
    "ppo-cartpole": "MLP 64x64",
    "sac-halfcheetah": "MLPs 256x256, batch 256",
    "ppo-pixels": "small CNN, 40x40 pixels",
    "ppo-recurrent": "LSTM 64, MLP 64x64",
    "ppo-atari": "Nature CNN, 4x84x84",
}
WAIT_CASES = ["ppo-cartpole", "sac-halfcheetah", "ppo-pixels"]  # the cases that the wait comparison runs
WAITS: dict[str, dict[str, str]] = {
    "libgomp default": {"GOMP_SPINCOUNT": "300000"},  # what libgomp does when neither variable is set
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}


ENV_WAITS = WAITS | {"spin": {"OMP_WAIT_POLICY": "ACTIVE"}}
ENVS_CHILD = "--envs-child"  # how --envs runs each measurement in a process of its own


def environment(wait: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return inherited | ENV_WAITS[wait]


def compare_envs(rounds: int) -> None:
    """The threaded envs' env steps/s under each wait, alone and with a torch copy per step, alternating."""
    for round_ in range(1, rounds + 1):
        for wait in ENV_WAITS:
            speeds = []
            for copying in ("alone", "copy"):
                command = [sys.executable, __file__, ENVS_CHILD, copying]
                done = subprocess.run(command, env=environment(wait), capture_output=True, text=True, check=True)
                speeds.append(float(done.stdout.split()[-1]))
            print(
                f"round {round_}: {wait}: envs alone {speeds[0]:,.0f}, with a copy per step {speeds[1]:,.0f} "
                f"env steps/s ({speeds[1] / speeds[0]:.2f}x)",
                flush=True,
            )


def steps_per_second(case: str, wait: str, timeout: float, flags: tuple[str, ...] = ()) -> tuple[float, bool]:
    """The loop's env steps/s, and whether it finished in time (if not, its steps over `timeout`)."""
    command = [sys.executable, str(REPO / "train_fabric.py"), *CASES[case], *flags]
    with tempfile.TemporaryDirectory() as cwd:
        try:
            done = subprocess.run(
                command, cwd=cwd, env=environment(wait), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return float(CASES[case][CASES[case].index("--total-timesteps") + 1]) / timeout, False
    match = SUMMARY.search(done.stdout)
    if done.returncode != 0 or match is None:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return int(match.group(1)) / float(match.group(2)), True


LOADS = {
    "spin": [sys.executable, "-c", "while True: pass"],
    "training": [
        sys.executable,
        str(REPO / "train_fabric.py"),
        "sac",
        "--preset",
        "halfcheetah",
        "--total-timesteps",
        "100000000",
        "--torch-threads",
        "1",
        *QUIET,
    ],
}
LOAD_STARTUP_SECONDS = 15  # a training load's imports and env checks, before it trains


def measure(case: str, busy: int, load: str, rounds: int, timeout: float) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        loads = [
            subprocess.Popen(LOADS[load], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(busy)
        ]
        try:
            if busy and load == "training":
                time.sleep(LOAD_STARTUP_SECONDS)
            compare(case, f"{busy} busy ({load})" if busy else "quiet", rounds, timeout)
        finally:
            for process in loads:
                process.kill()
                process.wait()


def compare(case: str, condition: str, rounds: int, timeout: float) -> None:
    results: dict[str, list[float]] = {wait: [] for wait in WAITS}
    for _ in range(rounds):
        for wait in WAITS:
            speed, finished = steps_per_second(case, wait, timeout, a_thread_per_core())
            results[wait].append(speed)
            late = "" if finished else f" (at most: did not finish in {timeout:.0f} s)"
            print(f"  {case}, {condition}: {wait}: {speed:,.0f} env steps/s{late}", flush=True)
    medians = {wait: statistics.median(values) for wait, values in results.items()}
    print(
        f"{case}, {condition}: passive / libgomp default = {medians['passive'] / medians['libgomp default']:.2f}x",
        flush=True,
    )


def a_thread_per_core() -> tuple[str, ...]:
    return ("--torch-threads", str(len(os.sched_getaffinity(0))))


def thread_settings() -> dict[str, tuple[tuple[str, ...], str]]:
    """Each setting's flags and wait: one thread, and a thread per core sleeping or spinning while they wait."""
    cores = a_thread_per_core()
    return {
        "1 thread": (("--torch-threads", "1"), "passive"),
        "a thread per core, sleeping": (cores, "passive"),
        "a thread per core, spinning": (cores, "spin"),
    }


def compare_threads(cases: list[str], rounds: int, timeout: float) -> None:
    settings = thread_settings()
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(1, rounds + 1):
        for case in cases:
            for setting, (flags, wait) in settings.items():
                speed, finished = steps_per_second(case, wait, timeout, flags)
                results.setdefault((case, setting), []).append(speed)
                late = "" if finished else f" (at most: did not finish in {timeout:.0f} s)"
                print(f"  round {round_}: {case}, {setting}: {speed:,.0f} env steps/s{late}", flush=True)
    print(f"\n| case | network | {' | '.join(settings)} | 1 thread / sleeping |")
    print(f"| --- | --- | {' | '.join('---' for _ in settings)} | --- |")
    for case in cases:
        medians = [statistics.median(results[(case, setting)]) for setting in settings]
        cells = " | ".join(f"{median:,.0f}" for median in medians)
        print(f"| {case} | {NETWORKS[case]} | {cells} | {medians[0] / medians[1]:.2f}x |")


def main() -> None:
    if sys.argv[1:2] == [ENVS_CHILD]:
        from atari import envs_alone

        print(envs_alone("ALE/Breakout-v5", "native", steps=600, copy_observations=sys.argv[2] == "copy"))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), help="default: all (--threads), or 3")
    parser.add_argument("--busy", nargs="+", type=int, default=[0, 1], help="busy cores to measure beside")
    parser.add_argument("--load", choices=list(LOADS), default="spin", help="what keeps the busy cores busy")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--envs", action="store_true", help="time threaded envs beside torch's threads instead")
    parser.add_argument("--threads", action="store_true", help="time thread counts per network instead")
    args = parser.parse_args()
    if args.envs:
        compare_envs(args.rounds)
        return
    if args.threads:
        print(f"{len(os.sched_getaffinity(0))} cores, nothing else running", flush=True)
        compare_threads(args.cases or list(CASES), args.rounds, args.timeout)
        return
    print(f"{len(os.sched_getaffinity(0))} cores; a thread per core", flush=True)
    for busy in args.busy:
        for case in args.cases or WAIT_CASES:
            measure(case, busy, args.load, args.rounds, args.timeout)


if __name__ == "__main__":
    main()
