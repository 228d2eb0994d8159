"""Saved agents and training checkpoints: what they hold, how they are written and read back.

A training checkpoint holds everything an uninterrupted run would still have in memory, so a
resumed run continues exactly: weights and optimizer state, normalization statistics, the
step and update counters, the minibatch schedule's epoch, the config, and every rank's own
state (its envs, their last observations, its action generator, torch's RNG). Every value is
a tensor or a plain Python value, so `torch.load(path, weights_only=True)` reads it; the envs
travel as cloudpickle bytes inside a uint8 tensor (envs that cannot be restored from a pickle,
such as Box2D ones, restart from fresh seeded resets on resume, which is then not bit-exact).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import torch
from torch import Tensor, nn

from rl.config import PPOConfig
from rl.errors import UsageError
from rl.normalization import ObservationNormalizer, RewardScaler
from rl.rollout import RolloutCollector

AGENT_FILENAME = "agent.ckpt"
CHECKPOINT_DIR = "checkpoints"
FORMAT = "fabric-rl/1"
# Fields a resumed run must share with the checkpoint: they shape the envs or the network.
IMMUTABLE_FIELDS = ("env_id", "num_envs", "activation_function")


def agent_state(
    agent: nn.Module, obs_normalizer: ObservationNormalizer, reward_scaler: RewardScaler, cfg: PPOConfig, env_id: str
) -> dict[str, Any]:
    """What evaluation needs: weights, normalization statistics and the config."""
    return {
        "format": FORMAT,
        "agent": agent.state_dict(),
        "obs_normalizer": obs_normalizer.state_dict(),
        "reward_scaler": reward_scaler.state_dict(),
        "config": cfg.to_dict(),
        "env_id": env_id,
    }


def agent_path(run_dir: str) -> str:
    return os.path.join(run_dir, AGENT_FILENAME)


def checkpoint_path(run_dir: str, global_step: int) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, f"step_{global_step:012d}.ckpt")


def run_dir_of(checkpoint: str) -> str:
    """The run folder a checkpoint was written into (…/<run>/checkpoints/step_*.ckpt)."""
    return str(Path(checkpoint).resolve().parent.parent)


def _bytes_tensor(blob: bytes) -> Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


# Box2D worlds pickle without error but unpickle broken (the first step fails an assertion).
UNPICKLABLE_ENV_PACKAGES = ("gymnasium.envs.box2d",)


def _restorable_from_pickle(envs: gym.vector.VectorEnv) -> bool:
    modules = [type(env.unwrapped).__module__ for env in envs.unwrapped.envs]
    return not any(module.startswith(UNPICKLABLE_ENV_PACKAGES) for module in modules)


def capture_rank_state(collector: RolloutCollector) -> dict[str, Any]:
    """This rank's own state: its envs mid-episode, what they last showed, its random streams."""
    envs = None  # these envs restart from fresh resets on resume
    if _restorable_from_pickle(collector.envs):
        with contextlib.suppress(TypeError, AttributeError, pickle.PicklingError):
            envs = _bytes_tensor(cloudpickle.dumps(collector.envs))
    return {
        "envs": envs,
        "raw_obs": collector.raw_obs.cpu(),
        "discounted_returns": torch.from_numpy(collector.reward_scaler.discounted_returns.copy()),
        "action_generator": collector.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def restore_rank_state(collector: RolloutCollector, state: dict[str, Any], fresh_seeds: list[int]) -> bool:
    """Put a rank back where it was; returns False when its envs had to restart from a reset."""
    collector.generator.set_state(state["action_generator"])
    torch.set_rng_state(state["torch_rng"])
    collector.reward_scaler.discounted_returns = state["discounted_returns"].double().numpy()
    if state["envs"] is None:
        collector.reset_envs(fresh_seeds)
        return False
    collector.envs.close()
    collector.envs = pickle.loads(state["envs"].numpy().tobytes())  # the user's own checkpoint
    collector.raw_obs = state["raw_obs"].to(collector.device)
    return True


def training_state(
    agent: nn.Module,
    optimizer_state: dict[str, Any],
    obs_normalizer: ObservationNormalizer,
    reward_scaler: RewardScaler,
    cfg: PPOConfig,
    env_id: str,
    counters: dict[str, int],
    rank_states: list[dict[str, Any]],
    mode: str,
    world_size: int,
) -> dict[str, Any]:
    """`rank_states` holds one entry per rank that runs envs: every rank when coupled, the player when decoupled."""
    return agent_state(agent, obs_normalizer, reward_scaler, cfg, env_id) | {
        "optimizer": optimizer_state,
        "counters": counters,  # global_step, update, epoch (of the minibatch schedule)
        "mode": mode,
        "world_size": world_size,
        "rank_states": rank_states,
    }


def to_cpu(value: Any) -> Any:
    """A copy of nested dicts, lists and tuples with every tensor on the CPU."""
    if isinstance(value, Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(item) for item in value)
    return value


def save_file_atomically(path: str, state: dict[str, Any]) -> None:
    """`torch.save` to a temporary file, then rename: for a single writer such as the player."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def assert_finite(agent: nn.Module) -> None:
    """Refuse to save weights that are not finite: a checkpoint must always be worth resuming."""
    if not all(torch.isfinite(p).all() for p in agent.parameters()):
        raise FloatingPointError("the agent's weights are not finite; nothing was saved")


def load_checkpoint(path: str, flag: str = "--resume-from") -> dict[str, Any]:
    """Read a checkpoint or saved agent; a missing, truncated or foreign file raises `UsageError`."""
    if not os.path.isfile(path):
        raise UsageError(flag, f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as error:
        raise UsageError(flag, f"cannot read {path} (truncated or corrupt?): {str(error).splitlines()[0]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(flag, f"{path} is not a {FORMAT} checkpoint")
    return state


def check_resumable(state: dict[str, Any], cfg: PPOConfig, world_size: int, env_id: str, mode: str) -> None:
    """A resumed run must keep what shapes its envs, network and per-rank state."""
    if "rank_states" not in state:
        raise UsageError("--resume-from", "this file holds a saved agent, not a training checkpoint")
    if state["mode"] != mode:
        raise UsageError("--resume-from", f"this checkpoint was written in {state['mode']} mode, not {mode} mode")
    saved = state["config"] | {"env_id": state["env_id"]}
    current = cfg.to_dict() | {"env_id": env_id}
    for field in IMMUTABLE_FIELDS:
        if saved[field] != current[field]:
            flag = "--" + field.replace("_", "-")
            raise UsageError(flag, f"the checkpoint was trained with {saved[field]!r}; it cannot change on resume")
    if state["world_size"] != world_size:
        raise UsageError(
            "--devices", f"the checkpoint was written by {state['world_size']} processes, not {world_size}"
        )
    if state["counters"]["global_step"] >= cfg.total_timesteps:
        raise UsageError(
            "--total-timesteps",
            f"the checkpoint is already at step {state['counters']['global_step']}; ask for more to resume",
        )


def prune_checkpoints(run_dir: str, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints of a run."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    for old in sorted(folder.glob("step_*.ckpt"))[:-keep_last]:
        old.unlink(missing_ok=True)
