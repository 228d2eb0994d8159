"""Where a coupled PPO minibatch step spends its time on 2 gloo ranks, for each way of averaging gradients.

    python benchmarks/ddp_step.py [--steps 3000] [--rounds 3]

The Lightning example's defaults: CartPole's 64-unit actor-critic, a minibatch of 64 rows per
rank, Adam, gradient clipping at 0.5, one torch thread per rank. Each variant runs the same
step (forward, PPO losses, backward, average, clip, Adam) `--steps` times on 2 spawned ranks,
after 200 warm-up steps; the compute floor is the same step in one process with nothing to
average. Communication = step - floor. Rounds alternate the variants; medians are printed.

- `ddp all-reduce`: DDP as it comes (one bucket, gloo all-reduce).
- `ddp gather-mean`: DDP with a communication hook (`gather_mean_hook` below) that averages by an
  all-gather and a local mean, as the runtime does, which halves gloo's rounds of messages for two
  ranks.
- `ddp gather-mean, bucket view`: the same with `gradient_as_bucket_view=True`, so the
  gradients live in the bucket and nothing is copied in and out.
- `flat gather-mean, no DDP`: the gradients as views into one flat buffer (`rl.optim.FlatGradients`,
  as SAC's learner keeps them), averaged after the backward by one blocking all-gather on the
  calling thread: no reducer, no hook future, no hop to gloo's callback thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.algos.ppo.policy import MLPActorCritic
from rl.algos.ppo.update import policy_loss, value_loss
from rl.envs import inspect_env
from rl.optim import FlatGradients, clip_grad_norm
from rl.runtime import mean_of_gathered, start_all_gather


def gather_mean_hook(process_group, bucket):
    """DDP communication hook: a bucket's average by the runtime's `start_all_gather` and `mean_of_gathered`.

    (Unannotated: DDP checks a hook's annotations against the real classes.)
    """
    flat = bucket.buffer()
    world_size = dist.get_world_size(process_group)
    gathered = flat.new_empty(world_size * flat.numel())

    def average(gather: torch.futures.Future) -> torch.Tensor:
        gather.value()  # re-raises a failed gather: its empty buffer must never become gradients
        return mean_of_gathered(gathered, world_size)

    return start_all_gather(flat, gathered, process_group).get_future().then(average)


VARIANTS = ["ddp all-reduce", "ddp gather-mean", "ddp gather-mean, bucket view", "flat gather-mean, no DDP"]
ROWS, WARMUP = 64, 200


def make_step(model: torch.nn.Module, parameters: list[torch.Tensor], flat: FlatGradients | None = None):
    spaces = inspect_env("CartPole-v1")
    generator = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
    obs = torch.randn(ROWS, spaces.obs_dim, generator=generator)
    actions = torch.randint(0, 2, (ROWS,), generator=generator)
    old_logprobs, advantages, old_values, returns = torch.randn(4, ROWS, generator=generator)
    optimizer = torch.optim.Adam(parameters, lr=1e-3, eps=1e-4, fused=True)
    gathered = None if flat is None else flat.buffer.new_empty(2 * flat.buffer.numel())

    def step() -> None:
        new_logprobs, _, new_values = model(obs, actions)
        loss = policy_loss(new_logprobs, old_logprobs, advantages, 0.2)
        loss = loss + value_loss(new_values, old_values, returns, 0.2, False)
        if flat is None:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        else:
            flat.buffer.zero_()
            loss.backward()
            start_all_gather(flat.buffer, gathered, None).wait()
            mean_of_gathered(gathered, 2, out=flat.buffer)
        clip_grad_norm(parameters, 0.5)
        optimizer.step()

    return step


def agent() -> MLPActorCritic:
    torch.manual_seed(0)
    spaces = inspect_env("CartPole-v1")
    return MLPActorCritic(spaces.obs_dim, spaces.action_space)


def wrapped(variant: str) -> torch.nn.Module:
    model = agent()
    bucket_view = variant.endswith("bucket view")
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
    if "gather-mean" in variant:
        ddp.register_comm_hook(None, gather_mean_hook)
    return ddp


def seconds_per_step(step, steps: int) -> float:
    for _ in range(WARMUP):
        step()
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def rank_main(rank: int, port: int, steps: int, variants: list[str], results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for variant in variants:
        if variant.startswith("flat"):
            model = agent()
            step = make_step(model, list(model.parameters()), FlatGradients(list(model.parameters())))
        else:
            model = wrapped(variant)
            step = make_step(model, list(model.parameters()))
        elapsed = seconds_per_step(step, steps)
        if rank == 0:
            results[variant] = elapsed
    dist.destroy_process_group()


def floor(steps: int) -> float:
    torch.set_num_threads(1)
    model = agent()
    return seconds_per_step(make_step(model, list(model.parameters())), steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from launch import free_port

    samples: dict[str, list[float]] = {name: [] for name in ["compute floor (1 process)", *VARIANTS]}
    for round_index in range(args.rounds):
        order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(rank_main, args=(free_port(), args.steps, order, results), nprocs=2, join=True)
            for name in VARIANTS:
                samples[name].append(results[name] * 1e3)
        samples["compute floor (1 process)"].append(floor(args.steps) * 1e3)
    base = statistics.median(samples["compute floor (1 process)"])
    print(
        f"PPO minibatch step, 2 gloo ranks, {ROWS} rows per rank, medians of {args.rounds} rounds of {args.steps} steps"
    )
    print("| variant | ms per step | communication (ms) | rounds (ms) |")
    print("| --- | --- | --- | --- |")
    for name, values in samples.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{value:.3f}" for value in values)
        communication = "" if name.startswith("compute") else f"{median - base:.3f}"
        print(f"| {name} | {median:.3f} | {communication} | {rounds} |")


if __name__ == "__main__":
    main()
