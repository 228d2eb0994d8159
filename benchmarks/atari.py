"""Atari PPO on CPU: the compute floor of the Nature CNN, the levers tried on it, and the whole
training loop under every vector-env backend at 1 and 2 ranks.

    python benchmarks/atari.py [--env-id ALE/Pong-v5] [--modes sync async native envpool] [--ranks 1 2]
                               [--iterations 4] [--levers] [--envs-alone]

The config is `--preset atari-ppo` (CleanRL's: 8 envs x 128 steps per rank, 4 minibatches of
256, 4 epochs). The floor is what one rank's core can do if nothing but the network ran: its
forward passes while acting (8 observations a step) and its forward and backward passes while
training (4 epochs x 4 minibatches of 256), timed on one thread, as each rank trains. With R
ranks on R cores the floor is R times one rank's. The whole loop is `fabric run` (or one
process) timing its training loop, as it prints at the end; its share of the floor is the figure
the issue sets at >= 70%. `--envs-alone` first times each backend stepping 8 envs with random
actions and no network, for the Atari game and for CartPole-v1 (envpool's classic control).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from launch import BIN, REPO

sys.path.insert(0, str(REPO))

from rl.algos.ppo.policy import CNNActorCritic
from rl.encoders import NatureCNN, nature_flops_per_sample

OBS_SHAPE = (4, 84, 84)
NUM_ENVS, NUM_STEPS, MINIBATCH, EPOCHS = 8, 128, 256, 4
LOOP = re.compile(r"training loop: \d+ steps in ([\d.]+) s \(([\d,]+) steps/s\)")


def seconds_per_call(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocations, kernel choice, compilation
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def make_agent(channels_last: bool = False) -> CNNActorCritic:
    import gymnasium as gym

    torch.manual_seed(0)
    agent = CNNActorCritic(NatureCNN(OBS_SHAPE), gym.spaces.Discrete(6), ortho_init=True)
    return agent.to(memory_format=torch.channels_last) if channels_last else agent


def train_step(agent: CNNActorCritic, optimizer: torch.optim.Optimizer, obs: torch.Tensor, autocast: bool) -> None:
    actions = torch.zeros(obs.shape[0], dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logprob, entropy, value = agent(obs, actions)
        loss = logprob.mean() + entropy.mean() + value.pow(2).mean()
    optimizer.zero_grad(set_to_none=False)
    loss.float().backward()
    optimizer.step()


def floor(lever: str = "baseline", repeats: int = 5) -> dict[str, float]:
    """One rank's network-only seconds per rollout of 8 x 128 steps, and the env steps/s it allows."""
    torch.set_num_threads(1)
    agent = make_agent(channels_last=lever == "channels_last_weights")
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    autocast = lever == "bf16_autocast"
    act: Callable[[torch.Tensor], object] = lambda obs: agent.act(obs, None)  # noqa: E731
    learn = lambda obs: train_step(agent, optimizer, obs, autocast)  # noqa: E731
    if lever == "compile":
        act, learn = torch.compile(act), torch.compile(learn)
    acting_obs = torch.randint(0, 256, (NUM_ENVS, *OBS_SHAPE), dtype=torch.uint8)
    training_obs = torch.randint(0, 256, (MINIBATCH, *OBS_SHAPE), dtype=torch.uint8)
    act_seconds = seconds_per_call(lambda: act(acting_obs), repeats * 20)
    train_seconds = seconds_per_call(lambda: learn(training_obs), repeats)
    rows = NUM_ENVS * NUM_STEPS
    per_rollout = NUM_STEPS * act_seconds + EPOCHS * (rows // MINIBATCH) * train_seconds
    return {
        "act_ms": 1000 * act_seconds,
        "train_step_ms": 1000 * train_seconds,
        "rollout_s": per_rollout,
        "steps_per_s": rows / per_rollout,
    }


def whole_loop(env_id: str, mode: str, ranks: int, iterations: int, extra_flags: list[str] = ()) -> float | None:
    """Env steps/s of the training loop as the run prints it (None if it failed)."""
    steps = iterations * ranks * NUM_ENVS * NUM_STEPS
    flags = [
        "--preset",
        "atari-ppo",
        "--env-id",
        env_id,
        "--vector-mode",
        mode,
        "--total-timesteps",
        str(steps),
        "--eval-episodes",
        "0",
        "--no-progress-bar",
        *extra_flags,
    ]
    script = str(REPO / "train_fabric.py")
    command = (
        [str(BIN / "fabric"), "run", "--accelerator=cpu", f"--devices={ranks}", script]
        if ranks > 1
        else [sys.executable, script]
    )
    with tempfile.TemporaryDirectory() as cwd:
        finished = subprocess.run([*command, *flags], cwd=cwd, capture_output=True, text=True, timeout=1800)
    match = LOOP.search(finished.stdout)
    if finished.returncode != 0 or match is None:
        print(f"  {mode} x {ranks}: failed: {finished.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return float(match.group(2).replace(",", ""))


def envs_alone(env_id: str, mode: str, steps: int = 300, copy_observations: bool = False) -> float:
    """Env steps/s of 8 envs stepped with random actions, nothing else running; with `copy_observations`, each
    step's observations are copied into a torch tensor, as a GPU run's upload does on the host (a copy this size
    is one parallel region of torch's threads)."""
    import numpy as np

    from rl.envs import inspect_env, make_vector_env, reset_vector_env

    spaces = inspect_env(env_id)
    envs = make_vector_env(env_id, NUM_ENVS, mode=mode, preprocessing=spaces.preprocessing, seed=1)
    reset_vector_env(envs, list(range(NUM_ENVS)))
    actions = [np.array([envs.single_action_space.sample() for _ in range(NUM_ENVS)]) for _ in range(steps)]
    start = time.perf_counter()
    for action in actions:
        observations = envs.step(action)[0]
        if copy_observations:
            torch.as_tensor(observations).clone()
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * NUM_ENVS / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="ALE/Pong-v5")
    parser.add_argument("--modes", nargs="+", default=["sync", "async", "native", "envpool"])
    parser.add_argument("--ranks", nargs="*", type=int, default=[1, 2], help="none: no whole-loop runs")
    parser.add_argument("--iterations", type=int, default=4, help="rollouts per rank in each timed run")
    parser.add_argument("--levers", action="store_true", help="also time channels-last, bf16 autocast, compile")
    parser.add_argument("--envs-alone", action="store_true", help="time each backend's envs without a network")
    args = parser.parse_args()

    if args.envs_alone:
        for env_id, modes in ((args.env_id, args.modes), ("CartPole-v1", ["sync", "native", "envpool"])):
            speeds = ", ".join(f"{mode} {envs_alone(env_id, mode):,.0f}" for mode in modes)
            print(f"{env_id}, {NUM_ENVS} envs alone, env steps/s: {speeds}", flush=True)

    mflops = nature_flops_per_sample(OBS_SHAPE) / 1e6
    print(f"Nature CNN on {OBS_SHAPE}: {mflops:.1f} MFLOP per forward pass per sample")
    # The baseline already feeds the convolutions channels-last frames (rl/encoders.py); the levers
    # add channels-last weights, bf16 autocast or torch.compile to it.
    levers = ["baseline", "channels_last_weights", "bf16_autocast", "compile"] if args.levers else ["baseline"]
    floors = {}
    for lever in levers:
        try:
            floors[lever] = floor(lever)
        except Exception as error:  # a lever that does not run here is reported, not fatal
            print(f"floor [{lever}]: does not run here: {type(error).__name__}: {str(error).splitlines()[0]}")
            continue
        f = floors[lever]
        print(
            f"floor [{lever}], one thread: act {f['act_ms']:.2f} ms per step of {NUM_ENVS} envs, "
            f"train {f['train_step_ms']:.1f} ms per minibatch of {MINIBATCH}: {f['rollout_s']:.2f} s per rollout, "
            f"{f['steps_per_s']:.0f} env steps/s per rank",
            flush=True,
        )
    base = floors["baseline"]["steps_per_s"]
    print(
        f"\n{args.env_id}, preset atari-ppo, {args.iterations} rollouts per rank; share of the floor "
        f"({base:.0f} env steps/s per rank, on its own core):"
    )
    print("| vector mode | ranks | env steps/s | share of floor |\n| --- | --- | --- | --- |")
    for ranks in args.ranks:
        for mode in args.modes:
            speed = whole_loop(args.env_id, mode, ranks, args.iterations)
            if speed is not None:
                print(f"| {mode} | {ranks} | {speed:,.0f} | {speed / (base * ranks):.0%} |", flush=True)


if __name__ == "__main__":
    main()
