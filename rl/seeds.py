"""Seed streams: each source of randomness derives its own seed from (--seed, stream, ...).

Every rank and every mode derives them the same way, so the same seed and config give the
same run, and no two streams (nor two ranks) share one.
"""

from __future__ import annotations

import numpy as np
import torch

ENV_STREAM = 0  # (seed, stream, rank, env index[, iteration of a fresh reset on resume])
ACTION_STREAM = 1  # (seed, stream, rank): a rank's action sampling
SCATTER_STREAM = 2  # the decoupled player's shard shuffling
EVAL_STREAM = 3  # evaluation envs and sampled evaluation actions
REPLAY_STREAM = 4  # (seed, stream, rank): which transitions a replay buffer samples
LEARNER_STREAM = 5  # (seed, stream, learner): noise a learner draws in its update (SAC's actor loss)
CRITIC_STREAM = 6  # (seed, stream): the critics' initial weights, the same on every learner


def derive_seed(seed: int, *stream: int) -> int:
    """A 32-bit seed unique to (seed, *stream), e.g. (seed, rank, env index)."""
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1)[0])


def seeded_generator(device: torch.device, seed: int, *stream: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derive_seed(seed, *stream))


def env_seeds(seed: int, rank: int, num_envs: int, *extra: int) -> list[int]:
    """The reset seeds of a rank's envs; `extra` (an iteration) gives fresh ones for a restart."""
    return [derive_seed(seed, ENV_STREAM, rank, index, *extra) for index in range(num_envs)]
