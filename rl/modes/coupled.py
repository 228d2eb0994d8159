"""Coupled mode: every rank collects its own experience and trains a replica of the learner, averaging gradients.

A rank's part of the loop (`CoupledRank`) is to collect, learn and log; `rl/loop.py` runs the
loop, and the algorithm behind `Algorithm` knows what an iteration collects and learns.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from rl.algos.base import Algorithm
from rl.batch import DataShard
from rl.checkpoint import (
    Counters,
    TrainingCheckpoint,
    agent_of,
    agent_path,
    assert_finite,
    keep_checkpoint,
    restore_run_state,
    training_checkpoint,
    write_file,
)
from rl.elastic import reached, record_end
from rl.evaluation import PeriodicEvaluation, report_evaluation
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import EPISODE_RETURN, ProgressBar, TrainingMetrics
from rl.loop import (
    Callback,
    Evaluation,
    LoopClock,
    LoopState,
    Requests,
    TrainingLoop,
    agreed,
    report_compile_time,
    report_resources,
)
from rl.run import ClosedIfItFails, Run, TrainingResult, start_run, training_video_folder
from rl.runtime import Runtime

MODE = "coupled"


def rank_name(rank: int) -> str:
    return f"rank {rank}"


def train_coupled(
    algorithm: Algorithm, runtime: Runtime, resume: TrainingCheckpoint | None = None, callbacks: Sequence[Callback] = ()
) -> TrainingResult:
    with (
        report_lost_peers(
            runtime.rank, rank_name, gather_process_ids(runtime.device), algorithm.cfg.collective_timeout
        ),
        peer("another rank"),
        ClosedIfItFails() as opened,
    ):
        return _train_coupled(algorithm, runtime, resume, callbacks, opened)


def learner_shard(batch_rows: int, share_data: bool, rank: int, world_size: int) -> DataShard:
    """With --share-data every rank trains on its shard of everyone's gathered batches."""
    return DataShard(batch_rows * world_size, world_size, rank) if share_data else DataShard(batch_rows)


class CoupledRank:
    """One rank: collect with its own envs, learn with the others (gradients averaged), log on rank 0."""

    def __init__(self, algorithm: Algorithm, runtime: Runtime, run: Run, resume: TrainingCheckpoint | None) -> None:
        cfg = self.cfg = algorithm.cfg
        self.algorithm, self.runtime, self.run = algorithm, runtime, run
        rank, world_size = runtime.rank, runtime.world_size
        self.policy = algorithm.build_policy(runtime.device)
        batch_rows = algorithm.batch_rows(1)
        shard = learner_shard(batch_rows, cfg.share_data, rank, world_size)
        self.learner = algorithm.make_learner(self.policy, runtime, shard, env_ranks=world_size)
        video_dir = training_video_folder(run.dir, resume) if cfg.capture_video and runtime.is_main else None
        self.source = algorithm.make_source(
            rank, runtime.device, video_dir, env_ranks=world_size, batch_rows=batch_rows
        )
        self.first_iteration, self.global_step = 1, 0
        if resume:
            restore_run_state(resume, rank, self.policy, self.learner, self.source, env_ranks=world_size)
            self.first_iteration, self.global_step = resume.counters.iteration + 1, resume.counters.global_step
        self.metrics = TrainingMetrics(runtime.device, runtime.all_reduce_sum, algorithm.stat_tags)
        self.evaluation = PeriodicEvaluation(cfg, algorithm.spaces.env_id, run, runtime.is_main, self.global_step)
        self.num_iterations = cfg.num_iterations(world_size)
        # Rank 0's best.ckpt decides, which the other ranks' nodes may not have.
        if resume and runtime.broadcast_object(self.evaluation.reached_target_by(self.global_step)):
            self.num_iterations = resume.counters.iteration
        self.steps_per_iteration = cfg.steps_per_iteration * world_size
        self.replay_ratio = algorithm.passes_per_batch * batch_rows * cfg.steps_per_row / cfg.steps_per_iteration
        drawn = runtime.is_main and cfg.progress_bar
        total = self.num_iterations * self.steps_per_iteration
        self.progress = ProgressBar(total, drawn, initial=self.global_step, drawn_by_job=cfg.progress_bar)
        self.start_step = self.reported_step = self.global_step
        self.loop_clock, self.loop_seconds = LoopClock(), 0.0

    def iterate(self, iteration: int) -> None:
        stepped_to = self.global_step + self.steps_per_iteration
        learn = functools.partial(self.learn, iteration, stepped_to)
        episodes = self.source.collect_and_learn(self.policy, self.global_step, learn)
        self.global_step = stepped_to
        reached(self.global_step, self.runtime.is_main)
        self.metrics.record_episodes(episodes.returns, episodes.lengths)

    def learn(self, iteration: int, global_step: int) -> None:
        """The iteration's update, with the other ranks, once the source has a batch (`global_step`: after the
        iteration's steps)."""
        batch = self.source.next_batch(global_step, self.runtime.all_reduce_sum)
        if batch is None:
            return
        if self.cfg.share_data:
            batch = batch.map(self.runtime.all_gather_rows)
        self.metrics.record(self.source.batch_stats(batch))
        self.metrics.record(self.learner.update(batch, iteration))

    def report(self, iteration: int) -> dict[str, float]:
        self.learner.raise_if_diverged()
        steps_per_second = (self.global_step - self.start_step) / self.loop_clock.seconds(self.evaluation.seconds)
        scalars = self.metrics.compute() | {
            "Time/steps_per_second": steps_per_second,
            "Info/replay_ratio": self.replay_ratio,
        }
        self.run.sink.log_scalars(scalars, self.global_step)
        self.progress.advance(self.global_step - self.reported_step, steps_per_second, scalars.get(EPISODE_RETURN))
        self.reported_step = self.global_step
        return scalars

    def evaluate(self, step: int) -> dict[str, float] | None:
        """Rank 0's periodic evaluation, where one is due; the others learn its outcome in the agreement."""
        agent = functools.partial(agent_of, self.algorithm, self.policy, self.source)
        return self.evaluation.evaluate(self.policy, self.source.obs_normalizer, step, agent)

    def agree(self, iteration: int, wanted: Requests) -> Requests:
        return agreed(self.runtime, wanted)

    def ended(self, iteration: int) -> None:
        self.loop_seconds = self.loop_clock.seconds(self.evaluation.seconds)
        self.progress.close()

    def checkpoint(self, iteration: int) -> None:
        self.learner.raise_if_diverged()
        assert_finite(self.policy)
        rank_states = self.runtime.all_gather_object(self.source.capture_state())
        agent = agent_of(self.algorithm, self.policy, self.source)
        counters = Counters(self.global_step, iteration)
        checkpoint = training_checkpoint(
            agent, self.learner.state_dict(), counters, rank_states, MODE, self.runtime.world_size
        )
        self.runtime.write_on_main(
            lambda: keep_checkpoint(self.run.dir, self.global_step, checkpoint, self.cfg.keep_last)
        )


def _train_coupled(
    algorithm: Algorithm,
    runtime: Runtime,
    resume: TrainingCheckpoint | None,
    callbacks: Sequence[Callback],
    opened: ClosedIfItFails,
) -> TrainingResult:
    cfg = algorithm.cfg
    run = start_run(cfg, runtime, resume)
    opened.add(run.close)
    rank = CoupledRank(algorithm, runtime, run, resume)
    opened.add(rank.source.abandon)
    opened.add(rank.progress.close)
    state = LoopState(
        rank.first_iteration - 1,
        rank.global_step,
        rank.num_iterations,
        runtime.rank,
        runtime.is_main,
        run.dir,
        run.sink,
    )
    # Rank 0 evaluates (but not at the last step: the closing evaluation does) and keeps the checkpoint clock;
    # the others learn both in the agreement.
    loop = TrainingLoop(
        cfg,
        rank,
        state,
        rank.first_iteration,
        algorithm.iterations_per_report(runtime.world_size),
        rank.steps_per_iteration,
        keeps_clock=runtime.is_main,
        evaluation=Evaluation(rank.evaluate, cfg.stop_at_return),
        callbacks=callbacks,
    )
    state = loop.run()
    rank.source.close()
    steps = rank.global_step - rank.start_step
    report_resources(runtime, run, rank.loop_seconds, steps, rank.global_step, rank.source.env_seconds)
    if state.interrupted:
        return end_interrupted(rank)
    return end_finished(rank)


def end_interrupted(rank: CoupledRank) -> TrainingResult:
    """An interrupted run's end: its checkpoint is written; it saves no agent."""
    run, runtime = rank.run, rank.runtime
    if runtime.is_main:
        print(f"interrupted at step {rank.global_step}: checkpoint written to {run.dir}", flush=True)
        record_end(rank.global_step, interrupted=True)
    run.close()
    runtime.shutdown()
    return TrainingResult(os.path.abspath(run.dir), None, None, rank.global_step)


def end_finished(rank: CoupledRank) -> TrainingResult:
    """A finished run's end: its agent saved, then rank 0's closing evaluation."""
    cfg, run, runtime = rank.cfg, rank.run, rank.runtime
    if runtime.is_main:
        report_compile_time(cfg, rank.loop_clock.compile_seconds(), "rank 0")
    rank.learner.raise_if_diverged()
    assert_finite(rank.policy)
    agent = agent_of(rank.algorithm, rank.policy, rank.source)
    runtime.write_on_main(lambda: write_file(agent_path(run.dir), agent))
    # Leave before rank 0's closing evaluation: a rank waiting for it in a collective would give up after
    # --collective-timeout, which a long evaluation (a greedy Atari game, say) outlasts.
    runtime.shutdown()
    evaluation = None
    if runtime.is_main:
        env_id = rank.algorithm.spaces.env_id
        evaluation = report_evaluation(cfg, env_id, rank.policy, rank.source.obs_normalizer, run, rank.global_step)
        record_end(rank.global_step, interrupted=False)
    run.close()
    return TrainingResult(os.path.abspath(run.dir), os.path.abspath(agent_path(run.dir)), evaluation, rank.global_step)
