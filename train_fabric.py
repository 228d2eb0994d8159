"""Coupled PPO on Lightning Fabric.

fabric run --accelerator=cpu --devices=2 train_fabric.py --env-id CartPole-v1
python train_fabric.py            # one process
"""

from rl.cli import prepare, run_main
from rl.coupled import train_coupled
from rl.runtime import FabricRuntime


def main(argv: list[str]) -> None:
    cfg, spaces, world_size, resume = prepare(argv)
    train_coupled(cfg, spaces, FabricRuntime(cfg, world_size), resume)


if __name__ == "__main__":
    run_main(main)
