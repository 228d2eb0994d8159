"""Hogwild! training: worker processes on one machine train one set of networks in shared memory.

python train_hogwild.py --workers 2 --sync synced --sync-every 4            # PPO on CartPole-v1
python train_hogwild.py sac --env-id Pendulum-v1 --workers 2 --sync shared
"""

from rl.errors import ctrl_c_ends_start_up

ctrl_c_ends_start_up()  # first: the imports below take seconds

from rl.cli import prepare, run_main
from rl.modes.hogwild import train_hogwild
from rl.run import TrainingResult
from rl.runtime import LocalRuntime


def main(argv: list[str]) -> TrainingResult | None:
    algorithm, _, resume = prepare(argv, LocalRuntime.log_subdir, mode="hogwild")
    return train_hogwild(algorithm, resume)


if __name__ == "__main__":
    run_main(main)
