"""Saved agents and training checkpoints as files: where they go, how they are written and checked.

A training checkpoint holds everything an uninterrupted run would still have in memory, so a
resumed run continues exactly: the policy's weights, the learner's state (optimizers, target
networks, counters), normalization statistics, the step and iteration counters, the config,
and every acting rank's own state (its envs, their last observations, its random streams, a
replay buffer with --save-buffer). Every value is a tensor or a plain Python value, so
`torch.load(path, weights_only=True)` reads it; the envs travel as cloudpickle bytes inside a
uint8 tensor (envs that cannot be restored from a pickle, such as Box2D ones, restart from
fresh seeded resets on resume, which is then not bit-exact). `rl/run.py` assembles the contents.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rl.config import RunConfig, flag
from rl.errors import UsageError

AGENT_FILENAME = "agent.ckpt"
CHECKPOINT_DIR = "checkpoints"
FORMAT = "fabric-rl/1"


def agent_path(run_dir: str) -> str:
    return os.path.join(run_dir, AGENT_FILENAME)


def checkpoint_path(run_dir: str, global_step: int) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, f"step_{global_step:012d}.ckpt")


def run_dir_of(checkpoint: str) -> str:
    """The run folder a checkpoint was written into (…/<run>/checkpoints/step_*.ckpt)."""
    return str(Path(checkpoint).resolve().parent.parent)


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


def assert_finite(*modules: nn.Module) -> None:
    """Refuse to save weights that are not finite: a checkpoint must always be worth resuming."""
    if not all(torch.isfinite(p).all() for module in modules for p in module.parameters()):
        raise FloatingPointError("the agent's weights are not finite; nothing was saved")


def load_checkpoint(path: str, flag: str = "--resume-from") -> dict[str, Any]:
    """Read a checkpoint or saved agent; a missing, truncated or foreign file raises `UsageError`."""
    if not os.path.isfile(path):
        raise UsageError(flag, f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many kinds for a file it cannot read; each is told as what it is
        raise UsageError(flag, unreadable(path, error)) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(flag, f"{path} is not a {FORMAT} checkpoint")
    return state


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format: a zip archive
PICKLE_MAGIC = b"\x80"  # a pickle (protocol 2 or later): torch's legacy format, or another program's file


def unreadable(path: str, error: Exception) -> str:
    """Why a weights-only read of `path` failed, told apart: a file that holds Python objects, one cut short, or
    one that is not a checkpoint at all."""
    if isinstance(error, OSError):  # no permission, a disk error: the file itself may be sound
        return f"cannot read {path}: {error.strerror or error}"
    with open(path, "rb") as file:
        start = file.read(4)
    if not (start == ZIP_MAGIC or start.startswith(PICKLE_MAGIC)):
        return f"{path} is not a checkpoint: torch.save did not write it"
    if isinstance(error, pickle.UnpicklingError) and str(error).startswith("Weights only load failed"):
        return (f"{path} holds Python objects (classes or code) that a weights-only read refuses to run; checkpoints "
                "of this program hold tensors and numbers only, so another program wrote it or it was altered: "
                "load only files you trust")  # fmt: skip
    return f"cannot read {path}: it is cut short or corrupt"


def resumed_step(resume: dict[str, Any] | None) -> int:
    """The env step a run starts from: its checkpoint's, or 0 for a fresh run."""
    return resume["counters"]["global_step"] if resume else 0


def saved_algorithm(state: dict[str, Any]) -> str:
    return state.get("algorithm", "ppo")  # files written before SAC existed are PPO's


def check_resumable(
    state: dict[str, Any], cfg: RunConfig, world_size: int | None, env_id: str, mode: str, algorithm: str,
    processes_flag: str = "--devices", finished_ok: bool = False,
) -> None:  # fmt: skip
    """A resumed run must keep what shapes its envs, networks and per-rank state.

    `finished_ok`: a checkpoint at the last step may be resumed (a restart after it was written
    only has the saved agent and the evaluation left to do).

    `world_size` None: any number of processes may resume it (torchrun's changing membership),
    each with its share of the per-rank fields, which are then checked as the shares they are.
    """
    if "rank_states" not in state:
        raise UsageError("--resume-from", "this file holds a saved agent, not a training checkpoint")
    if saved_algorithm(state) != algorithm:
        raise UsageError("--resume-from", f"this checkpoint was trained with {saved_algorithm(state)}, not {algorithm}")
    if state["mode"] != mode:
        raise UsageError("--resume-from", f"this checkpoint was written in {state['mode']} mode, not {mode} mode")
    # a field newer than the checkpoint had its default then
    saved = type(cfg)().to_dict() | state["config"] | {"env_id": state["env_id"]}
    current = cfg.to_dict() | {"env_id": env_id}
    for field in cfg.IMMUTABLE:
        if world_size is None and field in cfg.PER_RANK:
            continue
        if saved[field] != current[field]:
            raise UsageError(
                flag(field), f"the checkpoint was trained with {saved[field]!r}; it cannot change on resume"
            )
    if world_size is not None and state["world_size"] != world_size:
        raise UsageError(
            processes_flag, f"the checkpoint was written by {processes(state['world_size'])}, not {world_size}"
        )
    if state["counters"]["global_step"] >= cfg.total_timesteps and not finished_ok:
        raise UsageError(
            "--total-timesteps",
            f"the checkpoint is already at step {state['counters']['global_step']}; ask for more to resume",
        )


def processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def prune_checkpoints(run_dir: str, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints of a run."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    for old in sorted(folder.glob("step_*.ckpt"))[:-keep_last]:
        old.unlink(missing_ok=True)
