"""Coupled mode: every rank collects its own experience and trains a replica of the learner, averaging gradients.

The loop knows iterations (collect, then one learning phase), ranks, logging, checkpoints and
Ctrl-C; the algorithm behind `Algorithm` knows what an iteration collects and learns.
"""

from __future__ import annotations

import os

from rl.algos.base import Algorithm
from rl.batch import DataShard
from rl.checkpoint import agent_path, assert_finite, checkpoint_path, prune_checkpoints
from rl.elastic import reached
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import EPISODE_RETURN, ProgressBar, TrainingMetrics
from rl.run import (
    CheckpointClock,
    InterruptFlag,
    LoopClock,
    PeriodicEvaluation,
    TrainingResult,
    agent_state,
    agreed,
    checkpoint_due,
    report_compile_time,
    report_due,
    report_evaluation,
    report_resources,
    restore_run_state,
    start_run,
    training_state,
    training_video_folder,
)
from rl.runtime import Runtime

MODE = "coupled"


def rank_name(rank: int) -> str:
    return f"rank {rank}"


def train_coupled(algorithm: Algorithm, runtime: Runtime, resume: dict | None = None) -> TrainingResult:
    with report_lost_peers(runtime.rank, rank_name, gather_process_ids(runtime.device)), peer("another rank"):
        return _train_coupled(algorithm, runtime, resume)


def learner_shard(batch_rows: int, share_data: bool, rank: int, world_size: int) -> DataShard:
    """With --share-data every rank trains on its shard of everyone's gathered batches."""
    return DataShard(batch_rows * world_size, world_size, rank) if share_data else DataShard(batch_rows)


def _train_coupled(algorithm: Algorithm, runtime: Runtime, resume: dict | None) -> TrainingResult:
    cfg, env_id = algorithm.cfg, algorithm.spaces.env_id
    run = start_run(cfg, runtime, resume)
    device, rank, world_size = runtime.device, runtime.rank, runtime.world_size

    policy = algorithm.build_policy(device)
    batch_rows = algorithm.batch_rows(1)
    learner = algorithm.make_learner(policy, runtime, learner_shard(batch_rows, cfg.share_data, rank, world_size),
                                     env_ranks=world_size)  # fmt: skip
    record_video = cfg.capture_video and runtime.is_main
    video_dir = training_video_folder(run.dir, resume) if record_video else None
    source = algorithm.make_source(rank, device, video_dir, env_ranks=world_size, batch_rows=batch_rows)
    first_iteration, global_step = 1, 0
    if resume:
        restore_run_state(resume, rank, policy, learner, source, env_ranks=world_size)
        first_iteration, global_step = resume["counters"]["update"] + 1, resume["counters"]["global_step"]

    metrics = TrainingMetrics(device, runtime.all_reduce_sum, algorithm.stat_tags)
    num_iterations = cfg.num_iterations(world_size)
    steps_per_iteration = cfg.steps_per_iteration * world_size
    report_every = algorithm.iterations_per_report(world_size)
    replay_ratio = algorithm.passes_per_batch * batch_rows * cfg.steps_per_row / cfg.steps_per_iteration
    progress = ProgressBar(num_iterations * steps_per_iteration, runtime.is_main and cfg.progress_bar,
                           initial=global_step, drawn_by_job=cfg.progress_bar)  # fmt: skip
    interrupt, clock = InterruptFlag(), CheckpointClock(cfg.checkpoint_seconds)

    saved_at = -1  # the step of the last checkpoint: every rank must agree, so no file-system check

    def save_checkpoint(iteration: int) -> None:
        nonlocal saved_at
        saved_at = global_step
        clock.restart()
        assert_finite(policy)
        counters = {"global_step": global_step, "update": iteration}
        rank_states = runtime.all_gather_object(source.capture_state())
        state = training_state(algorithm, policy, source, learner.state_dict(), counters, rank_states, MODE,
                               world_size)  # fmt: skip
        runtime.save_atomically(checkpoint_path(run.dir, global_step), state)
        if runtime.is_main:
            prune_checkpoints(run.dir, cfg.keep_last)

    start_step, loop_clock, iteration = global_step, LoopClock(), first_iteration - 1
    evaluation = PeriodicEvaluation(cfg, env_id, run, runtime.is_main, global_step)
    reported_step = global_step
    for iteration in range(first_iteration, num_iterations + 1):
        episodes = source.collect(policy, global_step)
        global_step += steps_per_iteration
        reached(global_step, runtime.is_main)
        batch = source.next_batch(global_step, runtime.all_reduce_sum)
        if batch is not None:
            if cfg.share_data:
                batch = batch.map(runtime.all_gather_rows)
            metrics.record(source.batch_stats(batch))
            metrics.record(learner.update(batch, iteration))
        metrics.record_episodes(episodes.returns, episodes.lengths)
        if not report_due(iteration, report_every, num_iterations):
            continue

        steps_per_second = (global_step - start_step) / loop_clock.seconds(evaluation.seconds)
        scalars = metrics.compute() | {"Time/steps_per_second": steps_per_second, "Info/replay_ratio": replay_ratio}
        run.sink.log_scalars(scalars, global_step)
        progress.advance(global_step - reported_step, steps_per_second, scalars.get(EPISODE_RETURN))
        # Rank 0 evaluates (but not at the last step: the closing evaluation does) and keeps the checkpoint
        # clock; the others learn both in the all-reduce.
        last = iteration == num_iterations
        target_reached = not last and evaluation.reached_target(policy, source.obs_normalizer, global_step)
        interrupted, time_due, target_reached = agreed(runtime, interrupt.requested,
                                                       runtime.is_main and clock.due(), target_reached)  # fmt: skip
        if interrupted or target_reached:
            break
        if time_due or checkpoint_due(cfg.checkpoint_steps, global_step, global_step - reported_step):
            save_checkpoint(iteration)
        reported_step = global_step
    loop_seconds = loop_clock.seconds(evaluation.seconds)
    progress.close()
    if saved_at != global_step:
        save_checkpoint(iteration)
    source.close()
    report_resources(runtime, run, loop_seconds, global_step - start_step)
    if interrupt.requested:
        if runtime.is_main:
            print(f"interrupted at step {global_step}: checkpoint written to {run.dir}", flush=True)
        run.sink.close()
        runtime.shutdown()
        return TrainingResult(os.path.abspath(run.dir), None, None, global_step)

    if runtime.is_main:
        report_compile_time(cfg, loop_clock.compile_seconds(), "rank 0")
    assert_finite(policy)
    runtime.save_atomically(agent_path(run.dir), agent_state(algorithm, policy, source))
    evaluation = None
    if runtime.is_main:
        evaluation = report_evaluation(cfg, env_id, policy, source.obs_normalizer, run, global_step)
    run.sink.close()
    runtime.shutdown()
    return TrainingResult(os.path.abspath(run.dir), os.path.abspath(agent_path(run.dir)), evaluation, global_step)
