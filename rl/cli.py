"""What every entry script does before training: parse, validate, inspect the env."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Literal

import torch

from rl.algos.base import Algorithm
from rl.checkpoint import check_resumable, load_checkpoint
from rl.config import (
    RunConfig,
    local_world_size_from_env,
    parse_config_flags,
    validate,
    validate_decoupled,
    world_size_from_env,
)
from rl.envs import inspect_env
from rl.errors import UsageError, exit_on_usage_error, print_error
from rl.optim import TrainingDiverged
from rl.registry import ALGORITHMS, DEFAULT_ALGORITHM, algorithm_type
from rl.runtime import configure_torch_threads

Mode = Literal["coupled", "decoupled", "hogwild"]


def parse_config(argv: list[str]) -> RunConfig:
    """`[ALGORITHM] [FLAGS]`: a leading algorithm name (`ppo`, `sac`) picks its config; PPO by default.

    Without a name the whole command line is PPO's, so the Lightning example's commands run
    unchanged, and `--help` shows PPO's flags (its description names the other algorithms).
    """
    name, flags = (argv[0], argv[1:]) if argv and argv[0] in ALGORITHMS else (DEFAULT_ALGORITHM, argv)
    program = f"{os.path.basename(sys.argv[0])} {name}"
    return parse_config_flags(ALGORITHMS[name].config_type, flags, prog=program)


def prepare(argv: list[str], mode: Mode = "coupled") -> tuple[Algorithm, int, dict | None]:
    """The algorithm (config and env spaces), world size and checkpoint, all checked before any process group.

    Every rank runs this on the same input, so bad input stops every rank here, with the
    same one-line error, before a collective could leave one of them waiting.
    """
    cfg = parse_config(argv)
    world_size = cfg.workers if mode == "hogwild" else world_size_from_env()
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    decoupled = mode == "decoupled"
    if decoupled:
        validate_decoupled(cfg, world_size)
        validate(cfg, world_size, gpu_count, env_ranks=cfg.num_players)
    else:
        validate(cfg, world_size, gpu_count)
    check_mode_flags(cfg, mode)
    if cfg.capture_video:
        check_video_support()
    spaces = inspect_env(cfg.env_id, cfg.preprocessing())
    kind = algorithm_type(cfg)
    kind.check_spaces(spaces)
    algorithm = kind(cfg, spaces)
    env_ranks = cfg.num_players if decoupled else world_size
    env_processes_here = {"decoupled": cfg.num_players, "hogwild": world_size}.get(mode, local_world_size_from_env())
    acting_on_gpu = cfg.cuda and (not decoupled or cfg.player_on_gpu)
    algorithm.check_memory(env_ranks, env_processes_here, acting_on_gpu)
    resume = None
    if cfg.resume_from is not None:  # read on every rank now, so a bad file stops all before any collective
        resume = load_checkpoint(cfg.resume_from)
        processes_flag = "--workers" if mode == "hogwild" else "--devices"
        check_resumable(resume, cfg, world_size, spaces.env_id, mode, algorithm.name, processes_flag)
    configure_torch_threads(cfg.torch_threads)
    torch.backends.cudnn.deterministic = cfg.torch_deterministic
    return algorithm, world_size, resume


def check_mode_flags(cfg: RunConfig, mode: Mode) -> None:
    """Refuse a flag that the chosen mode would silently ignore."""
    hogwild_flags = {"--workers": cfg.workers != 1, "--sync": cfg.sync != "shared", "--sync-every": cfg.sync_every != 1}
    decoupled_flags = {"--evaluator": cfg.evaluator, "--num-players": cfg.num_players != 1,
                       "--async": cfg.asynchronous, "--max-policy-lag": cfg.max_policy_lag != 1}  # fmt: skip
    if mode != "decoupled":
        for flag, given in decoupled_flags.items():
            if given:
                raise UsageError(flag, "belongs to decoupled mode: fabric run ... train_fabric_decoupled.py ...")
    if mode != "hogwild":
        for flag, given in hogwild_flags.items():
            if given:
                raise UsageError(flag, "belongs to Hogwild mode: python train_hogwild.py ...")
        return
    if cfg.cuda:
        raise UsageError("--cuda", "Hogwild workers share their networks in CPU memory; train without --cuda")
    if cfg.share_data:
        raise UsageError("--share-data", "Hogwild workers train on their own data; drop --share-data")
    if cfg.pipeline:
        raise UsageError("--pipeline", "belongs to decoupled mode; Hogwild workers never wait for a trainer")


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
    exit_without_teardown()


def exit_without_teardown() -> None:
    """End a finished run at once. Its files are written and closed, its envs and process group shut
    down; what is left is the interpreter freeing torch's and Lightning's modules one by one, which
    took about 1 s of every run here (`benchmarks/coupled_speed.py`, with and without this)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
