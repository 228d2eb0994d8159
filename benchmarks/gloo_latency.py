"""What one gloo all-gather costs between 2 local processes once both have arrived, here.

    python benchmarks/gloo_latency.py [--steps 150]

Each process works for about 10 ms (one SAC gradient step's worth of matrix products, or a
sleep), then joins an all-gather of 1 float or of SAC's flat gradient (about 202,000 floats,
as `SACLearner` averages once per step). Printed: the median and mean time from the later
process's arrival to the first one's return (the collective's own cost, waits for the other
process excluded), and the mean arrival skew (what a process waits for the slower one).
These bound what synchronous data parallelism can scale to on this machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl.runtime import all_gather_single

SAC_GRADIENT_FLOATS = 202_000


def _worker(rank: int, port: int, work: str, floats: int, steps: int, folder: str) -> None:
    torch.set_num_threads(1)
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    flat, gathered = torch.randn(floats), torch.empty(2 * floats)
    marks = []
    for _ in range(steps):
        if work == "compute":
            for _ in range(30):
                a.mm(b)
        else:
            time.sleep(0.01)
        arrived = time.perf_counter()
        all_gather_single(gathered, flat)
        marks.append((arrived, time.perf_counter()))
    torch.save(marks, os.path.join(folder, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(work: str, floats: int, steps: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(free_port(), work, floats, steps, folder), nprocs=2, join=True)
        first, second = (torch.load(os.path.join(folder, f"{rank}.pt")) for rank in range(2))
    warm = range(10, steps)
    cost = [min(first[i][1], second[i][1]) - max(first[i][0], second[i][0]) for i in warm]
    skew = [abs(first[i][0] - second[i][0]) for i in warm]
    return 1000 * statistics.median(cost), 1000 * statistics.mean(cost), 1000 * statistics.mean(skew)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    for work in ("compute", "sleep"):
        for floats in (1, SAC_GRADIENT_FLOATS):
            median, mean, skew = measure(work, floats, args.steps)
            print(
                f"after ~10 ms of {work:7s}, all-gather of {floats:7,d} floats: {median:.2f} ms median, "
                f"{mean:.2f} ms mean once both arrived; arrival skew {skew:.2f} ms mean",
                flush=True,
            )


if __name__ == "__main__":
    main()
