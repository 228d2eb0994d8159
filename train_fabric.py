"""Coupled training on Lightning Fabric: PPO by default, or `sac`.

fabric run --accelerator=cpu --devices=2 train_fabric.py --env-id CartPole-v1
fabric run --accelerator=cpu --devices=2 train_fabric.py sac --env-id Pendulum-v1
python train_fabric.py [sac] ...   # one process
"""

from rl.errors import ctrl_c_ends_start_up

ctrl_c_ends_start_up()  # first: the imports below take seconds

from rl.cli import prepare, run_main
from rl.modes.coupled import train_coupled
from rl.run import TrainingResult
from rl.runtime import FabricRuntime


def main(argv: list[str]) -> TrainingResult | None:
    algorithm, world_size, resume = prepare(argv, FabricRuntime.log_subdir)
    return train_coupled(algorithm, FabricRuntime(algorithm.cfg, world_size), resume)


if __name__ == "__main__":
    run_main(main)
