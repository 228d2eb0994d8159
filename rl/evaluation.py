"""Greedy evaluation on fresh environments."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from rl.envs import ATARI_PREPROCESSING, Preprocessing, is_image_space, make_vector_env, observations_tensor
from rl.experience import Policy
from rl.normalization import ObservationNormalizer
from rl.seeds import EVAL_STREAM, derive_seed


@torch.no_grad()
def evaluate_greedy(
    agent: Policy,
    env_id: str,
    episodes: int,
    seed: int,
    obs_normalizer: ObservationNormalizer,
    device: torch.device,
    video_dir: str | None = None,
    deterministic: bool = True,
    preprocessing: Preprocessing = ATARI_PREPROCESSING,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of `episodes` episodes, one per env, all run side by side.

    Greedy (the distribution's mode) unless `deterministic` is False; then actions are sampled
    from a generator seeded by `seed`. With `video_dir`, the first env's episode is recorded (the
    env's own frames). The envs are the game as it is: no episodic life, no clipped rewards.
    """
    generator = torch.Generator(device=device).manual_seed(derive_seed(seed, EVAL_STREAM, episodes))
    envs = make_vector_env(env_id, episodes, video_dir, preprocessing=preprocessing)
    pixels = is_image_space(envs.single_observation_space)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
    finished = np.zeros(episodes, dtype=bool)
    act = _stepper(agent, episodes, device, deterministic, generator)
    try:
        obs, _ = envs.reset(seed=[derive_seed(seed, EVAL_STREAM, i) for i in range(episodes)])
        starts = np.ones(episodes, dtype=bool)
        while not finished.all():
            obs_t = observations_tensor(obs, pixels, device)
            action = act(obs_normalizer(obs_t), torch.as_tensor(starts, device=device)).cpu().numpy()
            obs, _, terminated, truncated, info = envs.step(action)
            starts = terminated | truncated
            if "_episode" in info:  # only an env's first episode counts
                ended = info["_episode"] & ~finished
                returns[ended] = info["episode"]["r"][ended]
                lengths[ended] = info["episode"]["l"][ended]
                finished |= ended
    finally:
        envs.close()
    return returns, lengths


def _stepper(
    agent: Policy, num_envs: int, device: torch.device, deterministic: bool, generator: torch.Generator
) -> Callable[[Tensor, Tensor], Tensor]:
    """`(obs, starts) -> actions` for `num_envs` envs; a recurrent policy's state is carried from call to call."""
    # gSDE's noise matrices, one per env for the whole evaluation (stochastic play only)
    exploration = None if deterministic else agent.exploration_matrices(num_envs, generator)
    if not agent.recurrent:
        return lambda obs, _: agent.greedy_action(obs) if deterministic else agent.act(obs, generator, exploration)[0]
    memory = agent.initial_memory(num_envs, device)

    def act(obs: Tensor, starts: Tensor) -> Tensor:
        nonlocal memory
        if deterministic:
            action, memory = agent.greedy_action(obs, memory, starts)
        else:
            action, _, _, memory = agent.act(obs, generator, memory, starts, exploration)
        return action

    return act
