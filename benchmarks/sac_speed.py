"""SAC env steps/s: ours against Stable-Baselines3's side by side, and 2 coupled ranks against 1.

    python benchmarks/sac_speed.py [--steps 4000] [--threads 1 2] [--rounds 1] [--sb3-python .venv-sb3/bin/python]

Pendulum-v1 with rl-zoo's settings for both: learning rate 1e-3, batch 256, a 1e6 buffer, 100
random steps, one gradient step per env step, a tuned temperature, 256x256 MLPs. For each
thread count it prints the training loop's env steps/s of ours (`python train_fabric.py sac`)
and of SB3's `SAC.learn` (in its own environment: SB3 is never a dependency of this project),
and their ratio (target >= 1.25). Then 2 coupled ranks under `fabric run`, one thread each,
against 1 rank with one thread and the same per-rank settings (target >= 1.7x).

Set up SB3 once: python3 -m venv .venv-sb3 && .venv-sb3/bin/pip install torch==2.13.0 \\
    stable-baselines3==2.9.2 gymnasium==1.4.0
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from launch import loop_steps_per_second

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OURS = "sac --env-id Pendulum-v1 --policy-lr 1e-3 --q-lr 1e-3 --eval-episodes 0 --no-progress-bar".split()
SB3_RUN = """
import sys, time, gymnasium as gym, torch
from stable_baselines3 import SAC
steps, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
model = SAC("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=1e-3, seed=0, device="cpu")
start = time.perf_counter()
model.learn(total_timesteps=steps)
print(steps / (time.perf_counter() - start))
"""


def ours(steps: int, threads: int, ranks: int = 1) -> float:
    if ranks == 1:
        command = [sys.executable, str(REPO / "train_fabric.py")]
    else:
        command = [str(BIN / "fabric"), "run", "--accelerator=cpu", f"--devices={ranks}", str(REPO / "train_fabric.py")]
    return loop_steps_per_second(
        [*command, *OURS, "--total-timesteps", str(steps * ranks), "--torch-threads", str(threads)]
    )


def stable_baselines3(python: str, steps: int, threads: int) -> float:
    done = subprocess.run([python, "-c", SB3_RUN, str(steps), str(threads)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"Stable-Baselines3 failed (is it installed in {python}?):\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4000, help="env steps per rank and run")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="torch threads of the 1-rank runs")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every run, interleaved")
    parser.add_argument("--sb3-python", default=str(REPO / ".venv-sb3" / "bin" / "python"))
    parser.add_argument("--skip-sb3", action="store_true", help="only ours, 1 rank against 2")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {}
    for round_ in range(1, args.rounds + 1):
        print(f"round {round_}", flush=True)
        for threads in args.threads:
            speed = ours(args.steps, threads)
            line = f"  1 rank, {threads} thread(s): ours {speed:6.1f} env steps/s"
            if not args.skip_sb3:
                baseline = stable_baselines3(args.sb3_python, args.steps, threads)
                ratios.setdefault(f"ours / SB3, {threads} thread(s)", []).append(speed / baseline)
                line += f", SB3 {baseline:6.1f}, ratio {speed / baseline:.2f}x"
            print(line, flush=True)
        one, two = ours(args.steps, 1), ours(args.steps, 1, ranks=2)
        ratios.setdefault("2 ranks / 1 rank", []).append(two / one)
        print(
            f"  coupled, 1 thread per rank: 1 rank {one:6.1f}, 2 ranks {two:6.1f} env steps/s, {two / one:.2f}x",
            flush=True,
        )
    for name, values in ratios.items():
        print(f"median {name}: {statistics.median(values):.2f}x over {len(values)} round(s)")


if __name__ == "__main__":
    main()
