"""Greedy evaluation on fresh environments."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rl.checkpoint import saved_algorithm
from rl.envs import inspect_env, make_vector_env
from rl.errors import UsageError
from rl.experience import Policy
from rl.normalization import ObservationNormalizer
from rl.registry import ALGORITHMS
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
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of `episodes` episodes, one per env, all run side by side.

    Greedy (the distribution's mode) unless `deterministic` is False; then actions are sampled
    from a generator seeded by `seed`. With `video_dir`, the first env's episode is recorded.
    """
    generator = torch.Generator(device=device).manual_seed(derive_seed(seed, EVAL_STREAM, episodes))
    envs = make_vector_env(env_id, episodes, video_dir)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
    finished = np.zeros(episodes, dtype=bool)
    try:
        obs, _ = envs.reset(seed=[derive_seed(seed, EVAL_STREAM, i) for i in range(episodes)])
        while not finished.all():
            obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device).reshape(episodes, -1)
            obs_t = obs_normalizer(obs_t)
            action = agent.greedy_action(obs_t) if deterministic else agent.act(obs_t, generator)[0]
            action = action.cpu().numpy()
            obs, _, _, _, info = envs.step(action)
            if "_episode" in info:  # only an env's first episode counts
                ended = info["_episode"] & ~finished
                returns[ended] = info["episode"]["r"][ended]
                lengths[ended] = info["episode"]["l"][ended]
                finished |= ended
    finally:
        envs.close()
    return returns, lengths


def restore_agent(state: dict, env_id: str) -> tuple[nn.Module, ObservationNormalizer]:
    """The trained policy, rebuilt by the algorithm that trained it, and its observation normalizer."""
    kind = ALGORITHMS[saved_algorithm(state)]
    fields = kind.config_type.__dataclass_fields__
    trained = kind.config_type(**{key: value for key, value in state["config"].items() if key in fields})
    spaces = inspect_env(env_id)
    kind.check_spaces(spaces)
    policy = kind(trained, spaces).build_policy(torch.device("cpu"))
    try:
        policy.load_state_dict(state["agent"])
    except RuntimeError as error:
        raise UsageError("--env-id", f"{env_id} does not fit this agent: {str(error).splitlines()[0]}") from None
    normalizer = ObservationNormalizer(spaces.obs_dim, state["config"].get("normalize_observations", False),
                                      torch.device("cpu"))  # fmt: skip
    normalizer.load_state_dict(state["obs_normalizer"])
    return policy, normalizer
