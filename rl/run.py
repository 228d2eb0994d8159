"""What every mode does around training, whatever the algorithm: the run folder and its logs,
Ctrl-C, checkpoint timing and contents, the closing evaluation and the resource summary."""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import torch
from torch import nn

from rl import PROCESS_STARTED
from rl.algos.base import Algorithm, Learner
from rl.checkpoint import FORMAT, resumed_step, run_dir_of
from rl.compiling import compile_seconds
from rl.config import CONFIG_FILENAME, RunConfig, write_config_file
from rl.elastic import job_id, start_logged, under_torchelastic
from rl.envs import video_folder
from rl.errors import print_error
from rl.evaluation import evaluate_greedy
from rl.experience import ExperienceSource
from rl.logger import MetricsSink, hparams_table, open_sinks
from rl.normalization import ObservationNormalizer
from rl.precision import float32_state
from rl.runtime import Runtime
from rl.seeds import env_seeds


@dataclass
class Run:
    dir: str
    sink: MetricsSink


def run_name(cfg: RunConfig, env_id: str, suffix: str | None = None) -> str:
    """One folder name, ending with the start time unless `suffix`: namespaced ids (ALE/Pong-v5) lose their slash."""
    return f"{cfg.exp_name}_{env_id.replace('/', '-')}_{cfg.seed}_{suffix or f'{datetime.now():%Y%m%d_%H%M%S}'}"


def fixed_run_dir(cfg: RunConfig, log_subdir: str) -> str | None:
    """The folder of a run whose name does not depend on when it started (a resumed run's, a named run's,
    a torchrun job's: the same in every restart), or None for a run named at its start."""
    if cfg.resume_from is not None:
        return run_dir_of(cfg.resume_from)
    name = cfg.run_name or (run_name(cfg, cfg.env_id, suffix=job_id()) if under_torchelastic() else None)
    return None if name is None else os.path.join(cfg.log_dir, log_subdir, name)


def open_run(
    cfg: RunConfig, run_dir: str, make_sink: Callable[[str, str, int | None], MetricsSink],
    resume: dict[str, Any] | None, world_size: int, is_main: bool = True,
) -> Run:  # fmt: skip
    """Open the run folder's loggers (--logger), log the hyperparameters and, on rank 0, a restart's scalars.

    A resumed run writes on into its folder's TensorBoard run, which hides what the run before
    logged past the checkpoint (the steps now done again), so no step is logged twice.
    """
    resume_step = resume["counters"]["global_step"] if resume else None
    sink = open_sinks(
        cfg.logger, run_dir, is_main, resume_step, lambda: make_sink(*os.path.split(run_dir), resume_step)
    )
    sink.log_hparams(cfg.to_dict())
    sink.log_text("hyperparameters", hparams_table(cfg.to_dict()))
    if is_main:
        write_config_file(cfg, os.path.join(run_dir, CONFIG_FILENAME))  # what --config takes back
        sink.log_scalars(start_logged(world_size), resume_step or 0)
    return Run(sink.log_dir, sink)


def start_run(cfg: RunConfig, runtime: Runtime, resume: dict[str, Any] | None) -> Run:
    """Open the run folder; a run named at its start is named on rank 0, so that all ranks agree."""
    run_dir = fixed_run_dir(cfg, runtime.log_subdir)
    if run_dir is None:
        run_dir = os.path.join(cfg.log_dir, runtime.log_subdir, runtime.broadcast_object(run_name(cfg, cfg.env_id)))
    return open_run(cfg, run_dir, runtime.make_sink, resume, runtime.world_size, runtime.is_main)


def checkpoint_due(every: int, global_step: int, steps_since_last_check: int) -> bool:
    """Whether the steps since the last check crossed a multiple of `every` env steps (0: never)."""
    return every > 0 and global_step // every > (global_step - steps_since_last_check) // every


def report_due(iteration: int, every: int, last_iteration: int) -> bool:
    """Iterations that log (and check for Ctrl-C and checkpoints): every `every`-th, and the last."""
    return iteration % every == 0 or iteration == last_iteration


class LoopClock:
    """The training loop's seconds, less what this process spent compiling (--compile): the env steps/s
    measure training, and the compile time is reported on its own line."""

    def __init__(self) -> None:
        self.start, self.compiled_before = time.perf_counter(), compile_seconds()

    def compile_seconds(self) -> float:
        return compile_seconds() - self.compiled_before

    def seconds(self, also_left_out: float = 0.0) -> float:
        """Since the loop began, less the compile time and `also_left_out` (a peer's compile time waited for)."""
        return time.perf_counter() - self.start - self.compile_seconds() - also_left_out


def report_compile_time(cfg: RunConfig, seconds: float, who: str = "this process") -> None:
    if cfg.compile:
        print(f"torch.compile: {seconds:.1f} s compiling in {who} (left out of the env steps/s)", flush=True)


class CheckpointClock:
    """`--checkpoint-every` as a time: due once that long has passed since the last checkpoint."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds

    def restart(self) -> None:
        self.last = time.monotonic()


def agreed(runtime: Runtime, *flags: bool) -> list[bool]:
    """Each flag, true where any rank raised it: one all-reduce for all of them."""
    summed = runtime.all_reduce_sum(torch.tensor([float(flag) for flag in flags], device=runtime.device))
    return [value > 0 for value in summed.tolist()]


class InterruptFlag:
    """Ctrl-C (SIGINT, which the launchers pass on to every rank) asks for a checkpoint and a clean
    stop at the end of the current update, agreed by all ranks, rather than a KeyboardInterrupt
    in the middle of a collective."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True


def agent_state(algorithm: Algorithm, policy: nn.Module, source: ExperienceSource) -> dict[str, Any]:
    """What evaluation needs: the algorithm, the policy's weights, normalization statistics and the config."""
    agent = saved_agent(algorithm, policy, source.obs_normalizer.state_dict())
    return agent | {"reward_scaler": source.reward_scaler.state_dict()}


def saved_agent(algorithm: Algorithm, policy: nn.Module, obs_normalizer_state: dict[str, Any]) -> dict[str, Any]:
    """A saved agent, loadable by `python -m rl.evaluate`."""
    return {
        "format": FORMAT,
        "algorithm": algorithm.name,
        "agent": float32_state(policy.state_dict()),
        "obs_normalizer": obs_normalizer_state,
        "config": algorithm.cfg.to_dict(),
        "env_id": algorithm.spaces.env_id,
    }


def restored_agent(algorithm: Algorithm, agent: dict[str, Any]) -> tuple[nn.Module, ObservationNormalizer]:
    """The policy and observation normalizer of a saved agent of this algorithm, on the CPU."""
    policy = algorithm.build_policy(torch.device("cpu"))
    policy.load_state_dict(agent["agent"])
    normalizer = algorithm.obs_normalizer(torch.device("cpu"))
    normalizer.load_state_dict(agent["obs_normalizer"])
    return policy, normalizer


def training_state(
    algorithm: Algorithm,
    policy: nn.Module,
    source: ExperienceSource,
    learner_state: dict[str, Any],
    counters: dict[str, int],
    rank_states: list[dict[str, Any]],
    mode: str,
    world_size: int,
) -> dict[str, Any]:
    """`rank_states` holds one entry per rank that runs envs: every rank when coupled, the player when decoupled."""
    return agent_state(algorithm, policy, source) | run_state(learner_state, counters, rank_states, mode, world_size)


def run_state(
    learner_state: dict[str, Any], counters: dict[str, int], rank_states: list[dict[str, Any]], mode: str,
    world_size: int,
) -> dict[str, Any]:  # fmt: skip
    """What a training checkpoint holds beyond the saved agent."""
    return {
        "learner": float32_state(learner_state),
        "counters": counters,  # global_step, update (the last finished iteration)
        "mode": mode,
        "world_size": world_size,
        "rank_states": rank_states,
    }


def restore_run_state(
    resume: dict[str, Any], rank: int, policy: nn.Module, learner: Learner | None, source: ExperienceSource | None,
    env_ranks: int | None = None,
) -> None:  # fmt: skip
    """Put what this rank holds back as the checkpoint left it.

    After a change of world size (`env_ranks` ranks now run envs, not the checkpoint's), the
    per-rank states no longer match any rank: every rank's envs restart from fresh resets,
    reseeded from the iteration and the new world size, so no two ranks nor rounds share a seed.
    """
    policy.load_state_dict(resume["agent"])
    if learner is not None:
        learner.load_state_dict(resume["learner"])
    if source is None:
        return
    source.obs_normalizer.load_state_dict(resume["obs_normalizer"])
    source.reward_scaler.load_state_dict(resume["reward_scaler"])
    iteration, saved_ranks = resume["counters"]["update"] + 1, len(resume["rank_states"])
    if env_ranks is not None and env_ranks != saved_ranks:
        source.reset_envs(env_seeds(resume["config"]["seed"], rank, source.envs.num_envs, iteration, env_ranks))
        if rank == 0:
            print_error(f"warning: the checkpoint's {saved_ranks} ranks now run as {env_ranks}: every rank's envs "
                        f"restart from fresh resets ({source.envs.num_envs} per rank), and no rank's own state "
                        "(replay buffer, episode in progress) is restored")  # fmt: skip
        return
    fresh_seeds = env_seeds(resume["config"]["seed"], rank, source.envs.num_envs, iteration)
    if not source.restore_state(resume["rank_states"][rank], fresh_seeds):
        print_error(f"warning: rank {rank}: these envs cannot be saved; they restart from fresh resets")


def training_video_folder(run_dir: str, resume: dict | None) -> str:
    """Where a launch records its training episodes: a folder of its own, named by the step it starts from."""
    return video_folder(run_dir, "train", f"from_step_{resumed_step(resume)}")


def report_resources(runtime: Runtime, run: Run, loop_seconds: float, global_step: int) -> None:
    """Loop speed, and each rank's process time and peak memory, printed and logged by rank 0."""
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    process_seconds = time.monotonic() - PROCESS_STARTED
    per_rank = runtime.all_gather_rows(torch.tensor([[peak_rss_mb, process_seconds]], dtype=torch.float64))
    run.sink.log_scalars(
        {"Perf/loop_steps_per_second": global_step / loop_seconds, "Perf/peak_rss_mb_max": float(per_rank[:, 0].max())},
        global_step,
    )
    if runtime.is_main:
        rss = ", ".join(f"{mb:.0f}" for mb in per_rank[:, 0].tolist())
        print(
            f"training loop: {global_step} steps in {loop_seconds:.2f} s ({global_step / loop_seconds:,.0f} steps/s); "
            f"peak RSS per rank (MB): {rss}; rank 0 process time so far: {per_rank[0, 1]:.2f} s",
            flush=True,
        )


def greedy_returns(
    cfg: RunConfig, env_id: str, policy: nn.Module, obs_normalizer: ObservationNormalizer, video_dir: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of --eval-episodes greedy episodes, on the policy's device."""
    device = next(policy.parameters()).device
    return evaluate_greedy(policy, env_id, cfg.eval_episodes, cfg.seed, obs_normalizer, device, video_dir,
                           preprocessing=cfg.preprocessing())  # fmt: skip


def report_evaluation(
    cfg: RunConfig,
    env_id: str,
    policy: nn.Module,
    obs_normalizer: ObservationNormalizer,
    run: Run,
    global_step: int,
) -> dict[str, float] | None:
    """The closing evaluation's `Test/` scalars, logged and printed (None with --eval-episodes 0)."""
    if cfg.eval_episodes == 0:
        return None
    video_dir = video_folder(run.dir, "test", f"step_{global_step}") if cfg.capture_video else None
    returns, lengths = greedy_returns(cfg, env_id, policy, obs_normalizer, video_dir)
    summary = {
        "Test/return_mean": float(np.mean(returns)),
        "Test/return_std": float(np.std(returns)),
        "Test/length_mean": float(np.mean(lengths)),
    }
    run.sink.log_scalars(summary, global_step)
    print(
        f"evaluation over {cfg.eval_episodes} greedy episodes: return "
        f"{summary['Test/return_mean']:.2f} ± {summary['Test/return_std']:.2f}, "
        f"length {summary['Test/length_mean']:.1f}",
        flush=True,
    )
    return summary


@dataclass(frozen=True)
class TrainingResult:
    """What a finished (or interrupted) run left: its folder and its saved agent (absolute paths), and its
    closing evaluation."""

    run_dir: str
    agent_path: str | None  # None: interrupted before it saved the agent (its checkpoint resumes it)
    evaluation: dict[str, float] | None  # the Test/ scalars, on the main process (None elsewhere, or without one)
    global_step: int


class PeriodicEvaluation:
    """`--eval-every`: greedy episodes during training, on the main process, logged as Eval/ scalars;
    with `--stop-at-return`, whether the newest evaluation reached that return.

    The time it takes is kept apart (`seconds`), so that the loop's env steps/s measure training.
    """

    def __init__(self, cfg: RunConfig, env_id: str, run: Run, is_main: bool, start_step: int) -> None:
        self.cfg, self.env_id, self.run, self.is_main = cfg, env_id, run, is_main
        self.last_step, self.seconds = start_step, 0.0

    def reached_target(self, policy: nn.Module, obs_normalizer: ObservationNormalizer, global_step: int) -> bool:
        """Evaluate if an --eval-every boundary has passed since the last call (main process only); whether the
        mean return reached --stop-at-return."""
        due = checkpoint_due(self.cfg.eval_every, global_step, global_step - self.last_step)
        self.last_step = global_step
        if not (due and self.is_main):
            return False
        started = time.perf_counter()
        returns, lengths = greedy_returns(self.cfg, self.env_id, policy, obs_normalizer)
        self.seconds += time.perf_counter() - started
        mean, target = float(np.mean(returns)), self.cfg.stop_at_return
        self.run.sink.log_scalars({"Eval/return_mean": mean, "Eval/return_std": float(np.std(returns)),
                                   "Eval/length_mean": float(np.mean(lengths))}, global_step)  # fmt: skip
        print(f"step {global_step}: greedy return {mean:.2f} ± {np.std(returns):.2f} over {len(returns)} episodes",
              flush=True)  # fmt: skip
        if target is None or mean < target:
            return False
        print(f"step {global_step}: the greedy return reached --stop-at-return {target:g}; training ends here",
              flush=True)  # fmt: skip
        return True
