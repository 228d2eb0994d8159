"""Coupled training on raw torch.distributed, the baseline for the Fabric path: PPO by default, or `sac`.

torchrun --nproc_per_node=2 --standalone train_torch.py --env-id CartPole-v1
torchrun --nproc_per_node=2 --standalone train_torch.py sac --env-id Pendulum-v1
"""

from rl.errors import ctrl_c_ends_start_up

ctrl_c_ends_start_up()  # first: the imports below take seconds

from rl.cli import prepare, run_main
from rl.modes.coupled import train_coupled
from rl.run import TrainingResult
from rl.runtime import TorchRuntime


def main(argv: list[str]) -> TrainingResult | None:
    algorithm, world_size, resume = prepare(argv, TorchRuntime.log_subdir)
    return train_coupled(algorithm, TorchRuntime(algorithm.cfg, world_size), resume)


if __name__ == "__main__":
    run_main(main)
