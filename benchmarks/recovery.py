"""Recovery under torchrun: how long from a `kill -9` to training again, and how many steps are redone.

    python benchmarks/recovery.py [--kills 3] [--seed 0]

For each config, one torchrun job (`--max-restarts`, 2 processes, `--checkpoint-every`) has a
random rank killed at a random moment after each of its first checkpoints. The run's journal
(`<run>/elastic.jsonl`) gives when each restarted round was training again and the steps it
redid; the kill times are this script's. Prints one line per kill and a summary per config.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
CONFIGS = {
    "lightning-defaults": ["--total-timesteps", "65536", "--checkpoint-every", "4096"],
    "larger (8 envs x 512)": "--num-envs 8 --num-steps 512 --total-timesteps 327680 --checkpoint-every 32768".split(),
}
COMMON = ["--eval-episodes", "0", "--no-progress-bar"]


def worker_pids(cwd: Path) -> dict[int, int]:
    """rank -> pid of the torchrun workers running in `cwd`."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if (
                entry.name.isdigit()
                and os.readlink(entry / "cwd") == str(cwd)
                and b"TORCHELASTIC_RUN_ID" in b" ".join(environ)
            ):
                rank = [item for item in environ if item.startswith(b"RANK=")]
                ranks[int(rank[0].split(b"=")[1])] = int(entry.name)
        except (OSError, IndexError, ValueError):
            continue
    return ranks


def newest_step(cwd: Path) -> int:
    return max((int(p.stem.split("_")[1]) for p in cwd.glob("logs/*/*/checkpoints/step_*.ckpt")), default=-1)


def measure(name: str, args: list[str], kills: int, rng: random.Random) -> None:
    cwd = Path(tempfile.mkdtemp(prefix="recovery_")).resolve()
    command = [
        str(TORCHRUN),
        "--nproc-per-node=2",
        "--standalone",
        f"--max-restarts={kills}",
        str(REPO / "train_fabric.py"),
        *args,
        *COMMON,
    ]
    job = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kill_times = []
    for _ in range(kills):
        seen = newest_step(cwd)
        while newest_step(cwd) <= seen and job.poll() is None:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.0))
        victim = rng.randrange(2)
        pid = worker_pids(cwd).get(victim)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            kill_times.append(time.time())
    _, stderr = job.communicate()
    if job.returncode != 0:
        sys.exit(f"{name}: the job failed:\n{stderr[-3000:]}")
    (journal,) = cwd.glob("logs/*/*/elastic.jsonl")
    starts = [entry for entry in map(json.loads, journal.read_text().splitlines()) if entry["event"] == "start"]
    redone = [later["redone"] - earlier["redone"] for earlier, later in itertools.pairwise(starts)]
    downtime = [start["time"] - killed for start, killed in zip(starts[1:], kill_times, strict=True)]
    for index, (seconds, steps) in enumerate(zip(downtime, redone, strict=True), 1):
        print(f"{name}: kill {index}: training again after {seconds:.1f} s; {steps} steps redone", flush=True)
    print(
        f"{name}: mean {sum(downtime) / len(downtime):.1f} s from kill to training, "
        f"{sum(redone) / len(redone):.0f} steps redone per kill ({args[args.index('--checkpoint-every') + 1]} "
        "between checkpoints)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    rng = random.Random(options.seed)
    for name, args in CONFIGS.items():
        measure(name, args, options.kills, rng)


if __name__ == "__main__":
    main()
