"""The one typed configuration shared by every entry point.

Flag names and meanings follow Lightning's fabric RL example so its README commands run
unchanged; the extra fields (evaluation, normalization, logging) are ours.
"""

from __future__ import annotations

import io
import os
import re
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from typing import Any, Literal

import tyro

from rl.errors import UsageError


@dataclass
class PPOConfig:
    """Proximal Policy Optimization trained across processes."""

    exp_name: str = "default"
    """the name of this experiment; part of the run folder's name"""
    seed: int = 42
    """seed of the experiment; envs, action sampling and shuffling derive their seeds from it"""
    cuda: bool = False
    """train on the GPU (NCCL between GPU ranks, gloo otherwise)"""
    player_on_gpu: bool = False
    """with --cuda, run the player on the GPU too (decoupled mode only)"""
    torch_deterministic: bool = True
    """use deterministic torch algorithms (cudnn.deterministic)"""

    num_envs: int = 2
    """the number of parallel environments per rank"""
    share_data: bool = False
    """all-gather the rollouts so each rank trains on a shard of everyone's data"""
    per_rank_batch_size: int = 64
    """the minibatch size on each rank"""

    env_id: str = "CartPole-v1"
    """the id of the gymnasium environment"""
    num_steps: int = 128
    """the number of steps each environment runs per rollout"""
    capture_video: bool = False
    """record videos of rank 0's first environment into the run folder"""

    total_timesteps: int = 2**16
    """total environment steps, counted across all ranks"""
    learning_rate: float = 1e-3
    """the learning rate of the Adam optimizer"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to zero over the run"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    update_epochs: int = 10
    """the number of passes over the rollout per update"""
    activation_function: Literal["relu", "tanh"] = "relu"
    """the activation function of the actor and critic networks"""
    ortho_init: bool = False
    """initialize the layers orthogonally"""
    normalize_advantages: bool = False
    """normalize the advantages of each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = False
    """clip the value loss, as in the PPO paper"""
    ent_coef: float = 0.0
    """the coefficient of the entropy bonus"""
    vf_coef: float = 1.0
    """the coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum global gradient norm, applied after DDP averaging (0 disables clipping)"""

    normalize_observations: bool = False
    """normalize observations with running statistics synchronized across ranks"""
    normalize_rewards: bool = False
    """scale rewards by the running std of the discounted return, synchronized across ranks"""
    eval_episodes: int = 10
    """greedy evaluation episodes at the end of training (0 skips the evaluation)"""
    log_dir: str = "logs"
    """root folder of the TensorBoard logs and run folders"""
    progress_bar: bool = True
    """show a progress bar on rank 0"""
    checkpoint_every: int = 0
    """write a training checkpoint every this many env steps (0: only at the end)"""
    keep_last: int = 3
    """how many of the newest training checkpoints to keep"""
    resume_from: str | None = None
    """continue the run saved in this training checkpoint (same envs, network and process count)"""
    torch_threads: int = 0
    """torch threads per process; 0 takes the machine's cores divided by the local processes"""
    collective_timeout: float = 300.0
    """seconds a collective may wait for a peer before the job fails (instead of gloo's 30 minutes)"""
    pipeline: bool = False
    """decoupled mode: the player collects the next rollout while the trainers train on this one"""

    @property
    def rollout_steps_per_rank(self) -> int:
        return self.num_envs * self.num_steps

    def num_updates(self, world_size: int) -> int:
        return self.total_timesteps // (self.rollout_steps_per_rank * world_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def flag(field_name: str) -> str:
    """The command-line spelling of a config field."""
    return "--" + field_name.replace("_", "-")


POSITIVE_INTS = ("num_envs", "num_steps", "per_rank_batch_size", "total_timesteps", "update_epochs", "keep_last")
POSITIVE_FLOATS = ("learning_rate", "clip_coef", "collective_timeout")
NON_NEGATIVE = ("ent_coef", "vf_coef", "max_grad_norm", "eval_episodes", "torch_threads", "checkpoint_every")


def validate(cfg: PPOConfig, world_size: int, gpu_count: int, env_ranks: int | None = None) -> None:
    """Check everything that does not need an environment; raise `UsageError` naming the flag.

    `env_ranks` is how many processes run environments: all of them unless given (decoupled
    mode runs them on the player alone).
    """
    env_ranks = world_size if env_ranks is None else env_ranks
    if cfg.seed < 0:
        raise UsageError("--seed", f"must not be negative, got {cfg.seed}")
    for name in POSITIVE_INTS + POSITIVE_FLOATS:
        if not getattr(cfg, name) > 0:
            raise UsageError(flag(name), f"must be positive, got {getattr(cfg, name)}")
    for name in NON_NEGATIVE:
        if getattr(cfg, name) < 0:
            raise UsageError(flag(name), f"must not be negative, got {getattr(cfg, name)}")
    if not 0.0 < cfg.gamma <= 1.0:
        raise UsageError("--gamma", f"must be in (0, 1], got {cfg.gamma}")
    if not 0.0 <= cfg.gae_lambda <= 1.0:
        raise UsageError("--gae-lambda", f"must be in [0, 1], got {cfg.gae_lambda}")
    if cfg.per_rank_batch_size > cfg.rollout_steps_per_rank:
        raise UsageError(
            "--per-rank-batch-size",
            f"{cfg.per_rank_batch_size} is larger than the per-rank rollout "
            f"(--num-envs {cfg.num_envs} x --num-steps {cfg.num_steps} = {cfg.rollout_steps_per_rank})",
        )
    global_rollout = cfg.rollout_steps_per_rank * env_ranks
    if cfg.total_timesteps < global_rollout:
        raise UsageError(
            "--total-timesteps",
            f"{cfg.total_timesteps} is smaller than one global rollout "
            f"({env_ranks} ranks x {cfg.num_envs} envs x {cfg.num_steps} steps = {global_rollout})",
        )
    if cfg.cuda and gpu_count == 0:
        raise UsageError("--cuda", "no CUDA GPU is available on this machine")
    if cfg.cuda and gpu_count < local_world_size_from_env():
        raise UsageError("--cuda", f"needs a GPU per local process ({local_world_size_from_env()}), found {gpu_count}")
    if cfg.player_on_gpu and not cfg.cuda:
        raise UsageError("--player-on-gpu", "needs --cuda as well")


def validate_decoupled(cfg: PPOConfig, world_size: int) -> None:
    if world_size < 2:
        raise UsageError(
            "--devices", f"decoupled mode needs at least 2 processes (a player and a trainer), got {world_size}"
        )
    if cfg.rollout_steps_per_rank < world_size - 1:
        raise UsageError(
            "--num-steps", f"a rollout of {cfg.rollout_steps_per_rank} rows cannot feed {world_size - 1} trainers"
        )


_RULE = re.compile(r"^[\s╭╮╰╯│─-]*$")


def parse_config(argv: list[str], prog: str | None = None) -> PPOConfig:
    """Parse the command line with tyro, condensing its boxed errors into one line.

    `--help` prints tyro's help as usual; any parse error raises `UsageError`.
    """
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            return tyro.cli(PPOConfig, args=argv, prog=prog)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            print(out.getvalue(), end="")
            raise
        raise UsageError(*_summarize_tyro_error(err.getvalue() + out.getvalue())) from None


def _summarize_tyro_error(text: str) -> tuple[str, str]:
    """The flag and the message of a tyro error box, on one line.

    The box is a title, a rule, the message lines, then another rule and help we drop.
    """
    lines = [line.strip(" │╭╮╰╯") for line in text.splitlines()]
    rules = [i for i, line in enumerate(lines) if line and _RULE.match(line)]
    body = lines[rules[0] + 1 : rules[1]] if len(rules) >= 2 else lines
    message = " ".join(line.strip() for line in body if line.strip()) or "invalid command line"
    named = re.search(r"(--[a-z0-9-]+)", message)
    return (named.group(1) if named else "command line"), message


def world_size_from_env() -> int:
    """The number of processes the launcher started (1 when run as a plain script)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_world_size_from_env() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
