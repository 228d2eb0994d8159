"""The algorithms a user can pick, by subcommand name; PPO when none is named."""

from __future__ import annotations

from rl.algos.base import Algorithm
from rl.algos.ppo.algorithm import PPO
from rl.algos.sac.algorithm import SAC
from rl.config import RunConfig

ALGORITHMS: dict[str, type[Algorithm]] = {algorithm.name: algorithm for algorithm in (PPO, SAC)}
DEFAULT_ALGORITHM = PPO.name


def algorithm_type(cfg: RunConfig) -> type[Algorithm]:
    return next(algorithm for algorithm in ALGORITHMS.values() if type(cfg) is algorithm.config_type)
