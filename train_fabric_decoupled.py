"""Decoupled training on Lightning Fabric: rank 0 plays, ranks 1..N-1 train. PPO by default, or `sac`.

fabric run --devices=3 train_fabric_decoupled.py --num-envs 4 [--share-data] [--pipeline]
fabric run --devices=3 train_fabric_decoupled.py sac --env-id Pendulum-v1 [--pipeline]
fabric run --devices=3 train_fabric_decoupled.py --cuda [--player-on-gpu]
"""

from rl.errors import ctrl_c_ends_start_up

ctrl_c_ends_start_up()  # first: the imports below take seconds

from rl.cli import prepare, run_main
from rl.modes.decoupled import LOG_SUBDIR, train_decoupled
from rl.run import TrainingResult


def main(argv: list[str]) -> TrainingResult | None:
    algorithm, world_size, resume = prepare(argv, LOG_SUBDIR, mode="decoupled")
    return train_decoupled(algorithm, world_size, resume)


if __name__ == "__main__":
    run_main(main)
