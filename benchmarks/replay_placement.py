"""Where decoupled SAC's replay storage should live: the costs that decide it, measured.

    python benchmarks/replay_placement.py [--rows 1 64 256 1024] [--repeats 400]

Each update, the trainers need a batch of B rows sampled from the replay data. Three places
for that data:
- with the players (what decoupled mode does): each of K players samples B/K rows from its own
  buffer and sends each trainer its share: K messages per trainer per update;
- sharded over the trainers: each player sends its new transitions (train_freq x num_envs rows
  per iteration) and each trainer samples from its shard: also K messages per trainer per update;
- a dedicated replay rank: it receives K players' transitions and sends T trainers' batches per
  update, every message of the job passing through one process.

This prints what separates them on this machine: a gloo point-to-point message's one-way time
by size (SAC Pendulum rows: 9 floats), and the time to sample rows from a replay buffer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.algos.sac.replay import ReplayBuffer
from rl.batch import Column

ROW_WIDTH = 9  # Pendulum: obs 3, action 1, reward, next obs 3, terminated


def ping_pong(rank: int, port: int, rows_list: list[int], repeats: int, out: str) -> None:
    """Half the round-trip time of a message of each size, between two gloo processes."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    for rows in rows_list:
        message = torch.zeros(rows, ROW_WIDTH)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            if rank == 0:
                dist.send(message, 1)
                dist.recv(message, 1)
            else:
                dist.recv(message, 0)
                dist.send(message, 0)
            times.append((time.perf_counter() - start) / 2)
        results[rows] = statistics.median(times) * 1e3
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def sampling_ms(rows: int, capacity: int, repeats: int) -> float:
    columns = {
        "obs": Column((3,)),
        "actions": Column((1,)),
        "rewards": Column(()),
        "next_obs": Column((3,)),
        "terminated": Column(()),
    }
    buffer = ReplayBuffer(capacity, columns, torch.device("cpu"))
    buffer.size = capacity
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(repeats):
        buffer.sample(rows, generator)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 128, 256, 1024])
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "pingpong.pt")
        port = 29000 + os.getpid() % 1000
        mp.spawn(ping_pong, args=(port, args.rows, args.repeats, out), nprocs=2, join=True)
        one_way = torch.load(out)
    print(f"{'rows':>6} {'KiB':>7} {'gloo one-way ms':>16} {'sample ms':>10}")
    for rows in args.rows:
        kib = rows * ROW_WIDTH * 4 / 1024
        print(f"{rows:>6} {kib:>7.1f} {one_way[rows]:>16.3f} {sampling_ms(rows, args.capacity, 200):>10.3f}")


if __name__ == "__main__":
    main()
