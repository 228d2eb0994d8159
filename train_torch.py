"""Coupled PPO on raw torch.distributed, the baseline for the Fabric path.

torchrun --nproc_per_node=2 --standalone train_torch.py --env-id CartPole-v1
"""

from rl.cli import prepare, run_main
from rl.coupled import train_coupled
from rl.runtime import TorchRuntime


def main(argv: list[str]) -> None:
    cfg, spaces, world_size, resume = prepare(argv)
    train_coupled(cfg, spaces, TorchRuntime(cfg, world_size), resume)


if __name__ == "__main__":
    run_main(main)
