"""Coupled PPO: every rank collects its own rollouts and trains a DDP replica of the agent."""

from __future__ import annotations

import os
import resource
import signal
import time
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import torch

from rl import PROCESS_STARTED
from rl.checkpoint import (
    agent_path,
    agent_state,
    assert_finite,
    capture_rank_state,
    checkpoint_path,
    prune_checkpoints,
    restore_rank_state,
    run_dir_of,
    training_state,
)
from rl.config import PPOConfig
from rl.envs import EnvSpaces, derive_seed, make_vector_env, video_folder
from rl.errors import print_error
from rl.evaluation import evaluate_greedy
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import (
    EPISODE_RETURN,
    MetricsSink,
    ProgressBar,
    TrainingMetrics,
    hparams_table,
)
from rl.normalization import ObservationNormalizer, RewardScaler
from rl.policy import ActorCritic
from rl.ppo import MinibatchSchedule, PPOHyperparameters, explained_variance, ppo_update
from rl.rollout import RolloutCollector, rollout_to_batch
from rl.runtime import Runtime

# Seed streams: each source of randomness derives its own seed from (--seed, stream, ...).
ENV_STREAM = 0
ACTION_STREAM = 1
ADAM_EPS = 1e-4


def build_agent(cfg: PPOConfig, spaces: EnvSpaces, device: torch.device) -> ActorCritic:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every mode
    agent = ActorCritic(spaces.obs_dim, spaces.action_space, cfg.activation_function, cfg.ortho_init)
    return agent.to(device)


def make_collector(
    cfg: PPOConfig, spaces: EnvSpaces, rank: int, device: torch.device, video_dir: str | None
) -> RolloutCollector:
    """This rank's envs, seeded for (seed, rank), with its normalizers and action generator."""
    return RolloutCollector(
        make_vector_env(spaces.env_id, cfg.num_envs, video_dir),
        cfg.num_steps,
        spaces.obs_dim,
        device,
        ObservationNormalizer(spaces.obs_dim, cfg.normalize_observations, device),
        RewardScaler(cfg.num_envs, cfg.gamma, cfg.normalize_rewards),
        env_seeds(cfg, rank),
        action_generator(cfg, rank, device),
    )


def restore_collector(collector: RolloutCollector, resume: dict, cfg: PPOConfig, rank: int, state: dict) -> None:
    """Put a rank's collector back as the checkpoint left it."""
    collector.obs_normalizer.load_state_dict(resume["obs_normalizer"])
    collector.reward_scaler.load_state_dict(resume["reward_scaler"])
    next_update = resume["counters"]["update"] + 1
    fresh_seeds = [derive_seed(cfg.seed, ENV_STREAM, rank, index, next_update) for index in range(cfg.num_envs)]
    if not restore_rank_state(collector, state, fresh_seeds):
        print_error(f"warning: rank {rank}: these envs cannot be saved; they restart from fresh resets")


def make_optimizer(agent: ActorCritic, cfg: PPOConfig) -> torch.optim.Optimizer:
    # The fused kernel is several times faster than the per-tensor loop on CPU for these small nets.
    return torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=ADAM_EPS, fused=True)


def action_generator(cfg: PPOConfig, rank: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(cfg.seed, ACTION_STREAM, rank))
    return generator


def env_seeds(cfg: PPOConfig, rank: int) -> list[int]:
    return [derive_seed(cfg.seed, ENV_STREAM, rank, index) for index in range(cfg.num_envs)]


def hyperparameters(cfg: PPOConfig) -> PPOHyperparameters:
    return PPOHyperparameters(
        clip_coef=cfg.clip_coef,
        clip_vloss=cfg.clip_vloss,
        ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        update_epochs=cfg.update_epochs,
        minibatch_size=cfg.per_rank_batch_size,
        normalize_advantages=cfg.normalize_advantages,
    )


def annealed_lr(cfg: PPOConfig, update: int, num_updates: int) -> float:
    """Linear decay from the initial rate at update 1 towards zero after the last."""
    if not cfg.anneal_lr:
        return cfg.learning_rate
    return cfg.learning_rate * (1.0 - (update - 1) / num_updates)


@dataclass
class Run:
    dir: str
    sink: MetricsSink


def run_name(cfg: PPOConfig, env_id: str) -> str:
    return f"{cfg.exp_name}_{env_id}_{cfg.seed}_{datetime.now():%Y%m%d_%H%M%S}"


def open_run(cfg: PPOConfig, sink: MetricsSink) -> Run:
    """Log the hyperparameters into a new run folder."""
    sink.log_hparams(cfg.to_dict())
    sink.log_text("hyperparameters", hparams_table(cfg.to_dict()))
    return Run(sink.log_dir, sink)


def start_run(cfg: PPOConfig, runtime: Runtime, env_id: str, resumed_dir: str | None = None) -> Run:
    """Name the run on rank 0, so that all ranks agree, and open it; a resumed run keeps its folder."""
    if resumed_dir is not None:
        root, name = os.path.split(resumed_dir)
    else:
        root, name = os.path.join(cfg.log_dir, runtime.log_subdir), runtime.broadcast_object(run_name(cfg, env_id))
    return open_run(cfg, runtime.make_sink(root, name))


def checkpoint_due(every: int, global_step: int, steps_per_update: int) -> bool:
    """Whether the last update crossed a multiple of `every` env steps (0: never)."""
    return every > 0 and global_step // every > (global_step - steps_per_update) // every


def rank_name(rank: int) -> str:
    return f"rank {rank}"


class InterruptFlag:
    """Ctrl-C (SIGINT, which the launchers pass on to every rank) asks for a checkpoint and a clean
    stop at the end of the current update, agreed by all ranks, rather than a KeyboardInterrupt
    in the middle of a collective."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True

    def agreed(self, runtime: Runtime) -> bool:
        return bool(runtime.all_reduce_sum(torch.tensor([float(self.requested)], device=runtime.device)).item() > 0)


def train_coupled(cfg: PPOConfig, spaces: EnvSpaces, runtime: Runtime, resume: dict | None = None) -> None:
    with report_lost_peers(runtime.rank, rank_name, gather_process_ids(runtime.device)), peer("another rank"):
        _train_coupled(cfg, spaces, runtime, resume)


def _train_coupled(cfg: PPOConfig, spaces: EnvSpaces, runtime: Runtime, resume: dict | None) -> None:
    run = start_run(cfg, runtime, spaces.env_id, run_dir_of(cfg.resume_from) if resume else None)
    device, rank, world_size = runtime.device, runtime.rank, runtime.world_size

    agent = build_agent(cfg, spaces, device)
    if resume:
        agent.load_state_dict(resume["agent"])
    model, optimizer = runtime.setup(agent, make_optimizer(agent, cfg))

    record_video = cfg.capture_video and runtime.is_main
    collector = make_collector(cfg, spaces, rank, device, video_folder(run.dir, "train") if record_video else None)
    obs_normalizer = collector.obs_normalizer
    # With --share-data every rank trains on its shard of the gathered rollouts.
    shards = world_size if cfg.share_data else 1
    schedule = MinibatchSchedule(
        cfg.rollout_steps_per_rank * shards, cfg.per_rank_batch_size, shards, rank if cfg.share_data else 0, cfg.seed
    )
    first_update, global_step = 1, 0
    if resume:
        optimizer.load_state_dict(resume["optimizer"])
        counters = resume["counters"]
        first_update, global_step, schedule.epoch = counters["update"] + 1, counters["global_step"], counters["epoch"]
        restore_collector(collector, resume, cfg, rank, resume["rank_states"][rank])

    metrics = TrainingMetrics(device, runtime.all_reduce_sum)
    hp = hyperparameters(cfg)
    num_updates = cfg.num_updates(world_size)
    steps_per_update = cfg.rollout_steps_per_rank * world_size
    progress = ProgressBar(num_updates * steps_per_update, runtime.is_main and cfg.progress_bar, initial=global_step)
    interrupt = InterruptFlag()

    saved_at = -1  # the step of the last checkpoint: every rank must agree, so no file-system check

    def save_checkpoint(update: int) -> None:
        nonlocal saved_at
        saved_at = global_step
        assert_finite(agent)
        counters = {"global_step": global_step, "update": update, "epoch": schedule.epoch}
        rank_states = runtime.all_gather_object(capture_rank_state(collector))
        state = training_state(
            agent,
            optimizer.state_dict(),
            obs_normalizer,
            collector.reward_scaler,
            cfg,
            spaces.env_id,
            counters,
            rank_states,
            "coupled",
            world_size,
        )
        runtime.save_atomically(checkpoint_path(run.dir, global_step), state)
        if runtime.is_main:
            prune_checkpoints(run.dir, cfg.keep_last)

    start_step, start, update = global_step, time.perf_counter(), first_update - 1
    for update in range(first_update, num_updates + 1):
        lr = annealed_lr(cfg, update, num_updates)
        for group in optimizer.param_groups:
            group["lr"] = lr

        rollout, episodes = collector.collect(agent)
        collector.sync_normalizers(rollout, runtime.all_reduce_sum)
        batch = rollout_to_batch(rollout, cfg.gamma, cfg.gae_lambda)
        if cfg.share_data:
            batch = batch.map(runtime.all_gather_rows)
        metrics.record_rollout(episodes.returns, episodes.lengths, explained_variance(batch.values, batch.returns))

        update_stats = ppo_update(
            model,
            optimizer,
            batch,
            schedule,
            hp,
            runtime.backward,
        )
        metrics.record_update(update_stats)

        global_step += steps_per_update
        steps_per_second = (global_step - start_step) / (time.perf_counter() - start)
        scalars = metrics.compute()
        scalars |= {"Info/learning_rate": lr, "Time/steps_per_second": steps_per_second}
        run.sink.log_scalars(scalars, global_step)
        progress.advance(steps_per_update, steps_per_second, scalars.get(EPISODE_RETURN))
        if interrupt.agreed(runtime):
            break
        if checkpoint_due(cfg.checkpoint_every, global_step, steps_per_update):
            save_checkpoint(update)
    loop_seconds = time.perf_counter() - start
    progress.close()
    if saved_at != global_step:
        save_checkpoint(update)
    collector.envs.close()
    if interrupt.requested:
        if runtime.is_main:
            print(f"interrupted at step {global_step}: checkpoint written to {run.dir}", flush=True)
        run.sink.close()
        runtime.shutdown()
        return

    report_resources(runtime, run, loop_seconds, global_step - start_step)
    assert_finite(agent)
    final_agent = agent_state(agent, obs_normalizer, collector.reward_scaler, cfg, spaces.env_id)
    runtime.save_atomically(agent_path(run.dir), final_agent)
    if runtime.is_main:
        report_evaluation(cfg, spaces, agent, obs_normalizer, run, global_step)
    run.sink.close()
    runtime.shutdown()


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


def report_evaluation(
    cfg: PPOConfig,
    spaces: EnvSpaces,
    agent: ActorCritic,
    obs_normalizer: ObservationNormalizer,
    run: Run,
    global_step: int,
) -> None:
    if cfg.eval_episodes == 0:
        return
    video_dir = video_folder(run.dir, "test") if cfg.capture_video else None
    returns, lengths = evaluate_greedy(
        agent, spaces.env_id, cfg.eval_episodes, cfg.seed, obs_normalizer, next(agent.parameters()).device, video_dir
    )
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
