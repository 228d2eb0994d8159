"""What every entry script does before training: parse, validate, inspect the env."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable

import torch

from rl.checkpoint import check_resumable, load_checkpoint
from rl.config import PPOConfig, parse_config, validate, validate_decoupled, world_size_from_env
from rl.envs import EnvSpaces, inspect_env
from rl.errors import UsageError, exit_on_usage_error, print_error
from rl.ppo import TrainingDiverged
from rl.runtime import configure_torch_threads


def prepare(argv: list[str], decoupled: bool = False) -> tuple[PPOConfig, EnvSpaces, int, dict | None]:
    """Config, env spaces and world size, all checked before any process group exists.

    Every rank runs this on the same input, so bad input stops every rank here, with the
    same one-line error, before a collective could leave one of them waiting.
    """
    cfg = parse_config(argv)
    world_size = world_size_from_env()
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if decoupled:
        validate_decoupled(cfg, world_size)
        validate(cfg, world_size, gpu_count, env_ranks=1)
    else:
        validate(cfg, world_size, gpu_count)
    if cfg.capture_video:
        check_video_support()
    spaces = inspect_env(cfg.env_id)
    resume = None
    if cfg.resume_from is not None:  # read on every rank now, so a bad file stops all before any collective
        resume = load_checkpoint(cfg.resume_from)
        check_resumable(resume, cfg, world_size, spaces.env_id, "decoupled" if decoupled else "coupled")
    configure_torch_threads(cfg.torch_threads)
    torch.backends.cudnn.deterministic = cfg.torch_deterministic
    return cfg, spaces, world_size, resume


def check_video_support() -> None:
    """gymnasium's RecordVideo writes mp4 files through moviepy, an optional dependency."""
    if importlib.util.find_spec("moviepy") is None:
        raise UsageError("--capture-video", "needs moviepy: pip install -e '.[video]'")


def run_main(main: Callable[[list[str]], None]) -> None:
    with exit_on_usage_error():
        try:
            main(sys.argv[1:])
        except (TrainingDiverged, FloatingPointError) as error:
            print_error(f"error: training stopped: {error}; the checkpoints written so far hold finite weights")
            sys.stderr.flush()
            os._exit(1)  # every rank stops here at the same step; a process group teardown could block
