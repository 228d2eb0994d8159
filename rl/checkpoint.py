"""A run's saved state: the typed, versioned schema of its files, the run folder's layout, and how
files are written, found, read and checked.

A saved agent (`RUN/agent.ckpt`, `SavedAgent`) holds what evaluation and export need: the
algorithm, the policy's weights, the observation normalizer's statistics, the config and the env.
A training checkpoint (`RUN/checkpoints/step_N.ckpt`, `TrainingCheckpoint`) adds everything an
uninterrupted run would still have in memory, so that a resumed run continues exactly: the
learner's state (optimizers, target networks), the counters, and every acting rank's own state
(its envs, their last observations, its random streams, a replay buffer with --save-buffer).

On disk a file is a dict of tensors and plain Python values, so `torch.load(path,
weights_only=True)` reads it and runs none of its code; the envs travel as cloudpickle bytes
inside a uint8 tensor (envs that cannot be restored from a pickle, such as Box2D ones, restart
from fresh seeded resets on resume, which is then not bit-exact). Each file carries its schema
version; files of an older version are migrated when read (`migrate`).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rl.algos.base import Algorithm, Learner
from rl.config import MODE_COMMANDS, RunConfig, flag, iteration_name
from rl.config_files import CHECKPOINT_DIR, newest_checkpoint
from rl.errors import FOLDER_GONE, RunStopped, UsageError, counted, print_error, refused_writes
from rl.experience import ExperienceSource
from rl.normalization import ObservationNormalizer
from rl.precision import float32_state
from rl.seeds import env_seeds

AGENT_FILENAME = "agent.ckpt"
BEST_FILENAME = "best.ckpt"
FORMAT = "fabric-rl"
VERSION = 2
FORMAT_V1 = "fabric-rl/1"  # version 1 named its version in its format string


@dataclass(kw_only=True)
class SavedAgent:
    """A trained policy and what acting with it needs."""

    algorithm: str  # the name it is registered under (rl.registry.ALGORITHMS)
    policy: dict[str, Tensor]  # the policy's weights, in float32 whatever the run's precision
    obs_normalizer: dict[str, Any]  # its statistics (empty where observations are not normalized)
    config: dict[str, Any]  # the run's config, as `RunConfig.to_dict()` gives it
    env_id: str
    reward_scaler: dict[str, Any] | None = None  # training's reward scaling, which a resumed run continues
    eval_return: float | None = None  # a best agent's (best.ckpt): the mean greedy return that made it the best
    eval_step: int | None = None  # and the env step it was evaluated at

    def to_file(self) -> dict[str, Any]:
        """The dict that `torch.save` writes."""
        return {"format": FORMAT, "version": VERSION, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass
class Counters:
    global_step: int  # env steps of every process together
    iteration: int  # the last finished iteration (a rollout and its update)


@dataclass
class WorkerState:
    """A Hogwild worker's own: its learner's state (its optimizer), its iteration and its env steps."""

    learner: dict[str, Any]
    iteration: int
    frames: int


@dataclass(kw_only=True)
class TrainingCheckpoint(SavedAgent):
    """A saved agent and what resuming its run needs."""

    learner: dict[str, Any]  # the algorithm's learner state: optimizers, target networks, its own counters
    counters: Counters
    mode: str  # coupled, decoupled or hogwild
    world_size: int  # the processes that wrote it (Hogwild: its workers)
    rank_states: list[dict[str, Any]]  # one per rank that runs envs, in rank order
    workers: list[WorkerState] | None = None  # Hogwild's per-worker learner states

    def to_file(self) -> dict[str, Any]:
        state = super().to_file()
        state["counters"] = asdict(self.counters)
        state["workers"] = None if self.workers is None else [asdict(worker) for worker in self.workers]
        return state

    def saved_agent(self) -> SavedAgent:
        return SavedAgent(**{f.name: getattr(self, f.name) for f in fields(SavedAgent)})


def saved_agent(algorithm: Algorithm, policy: nn.Module, obs_normalizer_state: dict[str, Any]) -> SavedAgent:
    """The policy as a saved agent, loadable by `rl.load_agent` and `python -m rl.evaluate`."""
    return SavedAgent(
        algorithm=algorithm.name,
        policy=float32_state(policy.state_dict()),
        obs_normalizer=obs_normalizer_state,
        config=algorithm.cfg.to_dict(),
        env_id=algorithm.spaces.env_id,
    )


def agent_of(algorithm: Algorithm, policy: nn.Module, source: ExperienceSource) -> SavedAgent:
    """The saved agent of a rank that runs envs, with its reward scaling."""
    agent = saved_agent(algorithm, policy, source.obs_normalizer.state_dict())
    agent.reward_scaler = source.reward_scaler.state_dict()
    return agent


def training_checkpoint(
    agent: SavedAgent,
    learner_state: dict[str, Any],
    counters: Counters,
    rank_states: list[dict[str, Any]],
    mode: str,
    world_size: int,
    workers: list[WorkerState] | None = None,
) -> TrainingCheckpoint:
    """`rank_states` holds one entry per rank that runs envs: every rank when coupled, the players when decoupled."""
    saved = {f.name: getattr(agent, f.name) for f in fields(SavedAgent)}
    return TrainingCheckpoint(
        **saved,
        learner=float32_state(learner_state),
        counters=counters,
        mode=mode,
        world_size=world_size,
        rank_states=rank_states,
        workers=workers,
    )


def restored_agent(algorithm: Algorithm, agent: SavedAgent) -> tuple[nn.Module, ObservationNormalizer]:
    """The policy and observation normalizer of a saved agent of this algorithm, on the CPU."""
    policy = algorithm.build_policy(torch.device("cpu"))
    policy.load_state_dict(agent.policy)
    normalizer = algorithm.obs_normalizer(torch.device("cpu"))
    normalizer.load_state_dict(agent.obs_normalizer)
    return policy, normalizer


def restore_run_state(
    resume: TrainingCheckpoint,
    rank: int,
    policy: nn.Module,
    learner: Learner | None,
    source: ExperienceSource | None,
    env_ranks: int | None = None,
    role: str = "rank",
) -> None:
    """Put what this rank holds back as the checkpoint left it.

    After a change of world size (`env_ranks` ranks now run envs, not the checkpoint's), the
    per-rank states no longer match any rank: every rank's envs restart from fresh resets,
    reseeded from the iteration and the new world size, so no two ranks nor rounds share a seed,
    and each rank takes its share of what the saved ranks held in common (SAC's replay buffers).
    `role`: what the ranks that run envs are called in this mode's lines (coupled ranks, decoupled players).
    """
    policy.load_state_dict(resume.policy)
    if learner is not None:
        learner.load_state_dict(resume.learner)
    if source is None:
        return
    source.obs_normalizer.load_state_dict(resume.obs_normalizer)
    source.reward_scaler.load_state_dict(resume.reward_scaler)
    iteration, saved_ranks = resume.counters.iteration + 1, len(resume.rank_states)
    if env_ranks is not None and env_ranks != saved_ranks:
        source.reset_envs(env_seeds(resume.config["seed"], rank, source.num_envs, iteration, env_ranks))
        shared = source.take_share(resume.rank_states, rank, env_ranks)
        if rank == 0:
            print_error(
                f"warning: the checkpoint of {counted(saved_ranks, role)} resumes on {env_ranks}: every {role}'s envs "
                f"restart from fresh resets ({source.num_envs} per {role}){shared}"
            )
        return
    fresh_seeds = env_seeds(resume.config["seed"], rank, source.num_envs, iteration)
    if not source.restore_state(resume.rank_states[rank], fresh_seeds):
        print_error(f"warning: {role} {rank}: these envs cannot be saved; they restart from fresh resets")


def migrate(state: dict[str, Any]) -> dict[str, Any]:
    """A file's dict in the current schema; a file of an older version is converted step by step."""
    if state.get("format") == FORMAT_V1:
        state = migrate_v1(state)
    return state


def migrate_v1(state: dict[str, Any]) -> dict[str, Any]:
    """Version 1 named the policy's weights `agent` and the last iteration `update`, left out the algorithm
    in files written before SAC existed (PPO's), and kept an evaluator's best score as `step` and `eval_return`."""
    migrated = {key: value for key, value in state.items() if key not in ("agent", "step")}
    migrated |= {"format": FORMAT, "version": 2, "policy": state["agent"], "algorithm": state.get("algorithm", "ppo")}
    if "step" in state:
        migrated["eval_step"] = state["step"]
    if "counters" in state:
        counters = state["counters"]
        migrated["counters"] = {"global_step": counters["global_step"], "iteration": counters["update"]}
    return migrated


def from_file(state: dict[str, Any]) -> SavedAgent:
    """The typed contents of a file's dict of the current version."""
    values = {key: value for key, value in state.items() if key not in ("format", "version")}
    if "rank_states" not in values:
        return SavedAgent(**values)
    values["counters"] = Counters(**values["counters"])
    if values.get("workers") is not None:
        values["workers"] = [WorkerState(**worker) for worker in values["workers"]]
    return TrainingCheckpoint(**values)


def agent_path(run_dir: str) -> str:
    return os.path.join(run_dir, AGENT_FILENAME)


def checkpoint_path(run_dir: str, global_step: int) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, f"step_{global_step:012d}.ckpt")


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
    """`torch.save` to a temporary file, then rename, so that no reader ever sees half a file. A write the system
    refuses (no space left, a quota, a lost mount) removes its partial file and raises `RunStopped`, whose
    message names the file, the system's reason, and the newest checkpoint kept."""
    temporary = f"{path}.tmp"
    with refused_writes(lambda reason: RunStopped(unwritten(path, reason))):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # Through a Python file, whose failed write raises the system's reason (torch's own writer does not).
            with open(temporary, "wb") as file:
                torch.save(state, file)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temporary)  # the space it took may be what the next write needs
            raise


def unwritten(path: str, reason: str) -> str:
    """What could not be written and why, and what of the run is kept."""
    folder = Path(path).parent
    run_folder = folder.parent if folder.name == CHECKPOINT_DIR else folder
    if not run_folder.is_dir():
        return f"could not write {path}: the run's {FOLDER_GONE}; the run stopped"
    newest = newest_checkpoint(str(run_folder))
    kept = f"its newest checkpoint is kept: --resume-from {newest} resumes it" if newest else "it had no checkpoint yet"
    return f"could not write {path}: {reason}; the run stopped, and {kept}"


def assert_finite(*modules: nn.Module) -> None:
    """Refuse to save weights that are not finite: a checkpoint must always be worth resuming."""
    if not all(torch.isfinite(p).all() for module in modules for p in module.parameters()):
        raise FloatingPointError("the agent's weights are not finite; nothing was saved")


def load_checkpoint(path: str, flag: str = "--resume-from") -> SavedAgent:
    """Read a saved agent or a training checkpoint (of any version); a missing, truncated or foreign file raises
    `UsageError`."""
    if os.path.isdir(path):
        raise UsageError(flag, instead_of_folder(path, takes_agent=flag != "--resume-from"))
    if not os.path.isfile(path):
        raise UsageError(flag, f"no checkpoint at {path}")
    try:
        with warnings.catch_warnings():  # torch's warning of a pickle protocol it did not write: another program's file
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many kinds for a file it cannot read; each is told as what it is
        raise UsageError(flag, unreadable(path, error)) from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, FORMAT_V1):
        raise UsageError(flag, f"{path} is not a checkpoint of this program")
    state = migrate(state)
    if state.get("version", 0) > VERSION:
        raise UsageError(
            flag,
            f"{path} was written by a newer version of this program (checkpoint version "
            f"{state['version']}; this one reads up to {VERSION})",
        )
    return from_file(state)


def instead_of_folder(path: str, takes_agent: bool) -> str:
    """What to give in place of a run folder (or its checkpoints folder): its files that the flag takes."""
    run_dir = Path(path).parent if Path(path).name == CHECKPOINT_DIR else Path(path)
    agent = agent_path(str(run_dir)) if takes_agent and os.path.isfile(agent_path(str(run_dir))) else None
    files = [file for file in (agent, newest_checkpoint(str(run_dir))) if file is not None]
    if not files:
        return f"{path} is a folder, and holds no checkpoint"
    return f"{path} is a folder: give a file, such as {' or '.join(files)}"


def write_file(path: str, saved: SavedAgent) -> None:
    """Write a saved agent or checkpoint atomically, for a single writer such as the player."""
    save_file_atomically(path, saved.to_file())


class BestAgent:
    """A run's `best.ckpt`: the agent of its best evaluation during training, with that mean greedy return. A
    resumed run reads the score to beat from the file, so that only a better agent replaces it."""

    def __init__(self, run_dir: str, flag: str) -> None:
        self.path = os.path.join(run_dir, BEST_FILENAME)
        kept = load_checkpoint(self.path, flag) if os.path.isfile(self.path) else None
        self.score = -math.inf if kept is None or kept.eval_return is None else kept.eval_return
        self.step = None if kept is None else kept.eval_step  # the env step it was evaluated at

    def offer(self, score: float, step: int, agent: Callable[[], SavedAgent]) -> None:
        """Keep `agent()`, evaluated at `step` to `score`, if it beats the best so far."""
        if score <= self.score:
            return
        best = agent()
        best.eval_return, best.eval_step = score, step
        write_file(self.path, best)
        self.score, self.step = score, step


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format: a zip archive, its records in one folder with the pickle data.pkl
PICKLE_MAGIC = b"\x80"  # a pickle (protocol 2 or later): torch's legacy format, or another program's file
# torch's legacy format starts with its magic number, pickled alone at the protocol the file was written with
LEGACY_TORCH_STARTS = tuple(
    pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=each) for each in range(2, pickle.HIGHEST_PROTOCOL + 1)
)
NOT_WRITTEN_BY_TORCH = "is not a checkpoint: torch.save did not write it"


def unreadable(path: str, error: Exception) -> str:
    """Why a weights-only read of `path` failed, told apart: a file that holds Python objects, one cut short, or
    one that is not a checkpoint at all (another program's zip archive or pickle: a Stable-Baselines3 model, say)."""
    try:
        start = read_through(path)
    except OSError as own_error:  # no permission, a disk error: the file itself may be sound
        reason = error if isinstance(error, OSError) else own_error  # torch's, where it was the file system's too
        return f"cannot read {path}: {reason.strerror or reason}"
    if start.startswith(ZIP_MAGIC):
        names = zip_record_names(path)
        if names is None:  # its index, at the end, is missing or broken
            return f"cannot read {path}: it is cut short or corrupt"
        if not any(name.endswith("/data.pkl") for name in names):
            return f"{path} {NOT_WRITTEN_BY_TORCH} ({foreign_zip_kind(names)})"
    elif start.startswith(PICKLE_MAGIC):
        if not start.startswith(LEGACY_TORCH_STARTS):
            return f"{path} {NOT_WRITTEN_BY_TORCH} (a pickle of another program)"
    else:
        return f"{path} {NOT_WRITTEN_BY_TORCH}"
    if isinstance(error, pickle.UnpicklingError) and str(error).startswith("Weights only load failed"):
        return (
            f"{path} holds Python objects (classes or code) that a weights-only read refuses to run; checkpoints "
            "of this program hold tensors and numbers only, so another program wrote it or it was altered: "
            "load only files you trust"
        )
    return f"cannot read {path}: it is cut short or corrupt"


def zip_record_names(path: str) -> list[str] | None:
    """The names of the records of the zip archive at `path`; None where its index cannot be read."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


def foreign_zip_kind(names: list[str]) -> str:
    """What a zip archive that torch.save did not write is, from its records' names."""
    if "_stable_baselines3_version" in names:
        return "a Stable-Baselines3 model, which this program cannot load"
    return "a zip archive of another program"


def read_through(path: str) -> bytes:
    """Read all of `path` (its first bytes back, enough to hold torch's legacy start), so that an `OSError` is the
    file system's. torch.load raises `OSError` (EINVAL) for some files cut short, whose every byte reads."""
    with open(path, "rb") as file:
        start = file.read(max(map(len, LEGACY_TORCH_STARTS)))
        while file.read(1 << 24):
            pass
    return start


def resumed_step(resume: TrainingCheckpoint | None) -> int:
    """The env step a run starts from: its checkpoint's, or 0 for a fresh run."""
    return resume.counters.global_step if resume else 0


def newest_checkpoint_instead(cfg: RunConfig) -> str:
    """Where a saved agent given to --resume-from has its run's newest checkpoint, to give instead."""
    newest = None if cfg.resume_from is None else newest_checkpoint(os.path.dirname(cfg.resume_from) or ".")
    return "" if newest is None else f": give its run's newest, {newest}"


def check_resumable(
    state: SavedAgent,
    cfg: RunConfig,
    env_id: str,
    mode: str,
    algorithm: str,
    env_ranks: int,
    finished_ok: bool = False,
    found_by: str = "--resume-from",
    shared_out: bool = False,
) -> TrainingCheckpoint:
    """The checkpoint, if the run may resume from it: a resumed run must keep what shapes its envs, networks and
    per-rank state.

    `found_by`: the flag that chose the checkpoint, --resume-from or (a named run's newest) --run-name.

    `finished_ok`: a checkpoint at the last step may be resumed (a restart after it was written
    only has the saved agent and the evaluation left to do).

    `env_ranks`: the processes that step envs, whose global iteration --total-timesteps is rounded down to.

    `shared_out`: the per-rank fields hold this run's shares of the checkpoint's global envs and batch, checked as
    such (`keep_global_batch`), and the players may be more or fewer.
    """
    if not isinstance(state, TrainingCheckpoint):
        raise UsageError(
            "--resume-from", "this file holds a saved agent, not a training checkpoint" + newest_checkpoint_instead(cfg)
        )
    if state.algorithm != algorithm:
        trained = f"was trained with {state.algorithm.upper()}, not {algorithm.upper()}"
        if found_by == "--run-name":
            raise UsageError(found_by, f"run {cfg.run_name}'s newest checkpoint {trained}: name this run otherwise")
        raise UsageError(found_by, f"this checkpoint {trained}")
    if state.mode != mode:
        raise UsageError(
            found_by,
            f"this checkpoint was written in {state.mode} mode, not {mode} mode: "
            f"resume it in {MODE_COMMANDS[state.mode]}",
        )
    saved = config_as_trained(state, type(cfg)) | {"env_id": state.env_id}
    current = cfg.to_dict() | {"env_id": env_id}
    for field in cfg.IMMUTABLE:
        if shared_out and field in (*cfg.PER_RANK, "num_players"):
            continue
        if saved[field] != current[field]:
            raise UsageError(
                flag(field), f"the checkpoint was trained {setting(field, saved[field])}; it cannot change on resume"
            )
    if state.counters.global_step >= cfg.trained_timesteps(env_ranks) and not finished_ok:
        raise UsageError("--total-timesteps", nothing_left_message(state.counters.global_step, cfg, env_ranks))
    return state


def config_as_trained(state: TrainingCheckpoint, config_type: type[RunConfig]) -> dict[str, Any]:
    """The config the checkpoint was trained with; a field newer than the checkpoint at its default, which it had
    then."""
    return config_type().to_dict() | state.config


def setting(field: str, value: Any) -> str:
    """How a run was trained as to one field: `with --recurrent`, `without --recurrent`, `with --num-envs 4`."""
    if isinstance(value, bool):
        return f"{'with' if value else 'without'} {flag(field)}"
    return f"with {flag(field)} {value!r}"


def nothing_left_message(step: int, cfg: RunConfig, env_ranks: int) -> str:
    """Why a checkpoint at `step` leaves nothing to train, where --total-timesteps may lie past it."""
    if cfg.trained_timesteps(env_ranks) == cfg.total_timesteps:
        return f"the checkpoint is already at step {step}; ask for more to resume"
    iteration = cfg.global_iteration_steps(env_ranks)
    return (
        f"the checkpoint is already at step {step}, the last whole global {iteration_name(cfg)} ({iteration} steps) "
        f"within {cfg.total_timesteps}; ask for {step + iteration} or more to resume"
    )


def keep_checkpoint(run_dir: str, global_step: int, checkpoint: TrainingCheckpoint, keep_last: int) -> None:
    """Write a run's training checkpoint at `global_step`, then delete all but its newest `keep_last`."""
    write_file(checkpoint_path(run_dir, global_step), checkpoint)
    prune_checkpoints(run_dir, keep_last)


def prune_checkpoints(run_dir: str, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints of a run."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    for old in sorted(folder.glob("step_*.ckpt"))[:-keep_last]:
        old.unlink(missing_ok=True)
