"""Decoupled mode: ranks 0..K-1 are Players (envs, acting, batches), the next ranks Trainers.

The players feed every update with the union of their batches; the trainers send each update's
weights and statistics back, each to its share of the players (`rl.modes.decoupled_links`). How far the
weights a player acts with may trail the learners' is the lag bound: 0 by default (the players
wait for each update), exactly 1 with --pipeline, at most --max-policy-lag with --async (the
players take the newest weights sent so far). The trainers measure the lag of every batch they
train on, and the lead player (rank 0) logs it with the update's statistics.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor

from rl.algos.base import Algorithm
from rl.checkpoint import (
    BestAgent,
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
from rl.config import RunConfig, local_gpu_index, uses_gpu
from rl.elastic import init_default_process_group, reached, record_end
from rl.errors import progress_line
from rl.evaluation import report_evaluation
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import (
    EPISODE_COUNT,
    EPISODE_LENGTH,
    EPISODE_RETURN,
    EPISODE_STATISTICS,
    FabricSink,
    MeanOverRanks,
    ProgressBar,
    TrainingMetrics,
)
from rl.loop import (
    Callback,
    LoopClock,
    LoopState,
    Requests,
    TrainingLoop,
    loop_figures,
    next_check,
    own_peak_rss_mb,
    peak_rss_figure,
    report_compile_time,
    report_due,
    stop_check_interval,
    summary_line,
)
from rl.modes.decoupled_links import (
    FINISH,
    INTERRUPT,
    LEAD_PLAYER,
    ClockCheckpoints,
    Command,
    LagBound,
    PlayerOutbox,
    StopAgreement,
    StopAsker,
    Topology,
    TrainerInbox,
    WeightsInbox,
    WeightsOutbox,
    receive_state,
    send_state,
    trainer_shard,
)
from rl.modes.evaluator import Evaluator, EvaluatorLink
from rl.normalization import AllReduceSum
from rl.optim import load_flat_parameters, num_parameters
from rl.run import (
    ClosedIfItFails,
    Run,
    RunFolderLock,
    TrainingResult,
    open_run,
    take_run_folder,
    training_video_folder,
)
from rl.runtime import (
    FabricRuntime,
    broadcast_from_rank_0,
    close_process_group,
    collective_timeout,
    joining_the_job,
    write_on_rank_0,
)
from rl.signals import ctrl_c_only_noted, sigterm_left_to_peers
from rl.uploads import to_device

LOG_SUBDIR = "fabric_decoupled_logs"
MODE = "decoupled"
# Measured by the trainers and logged with the algorithm's statistics: the policy lag, and their compile time
# (--compile), which the players leave out of their env steps/s as they leave out their own.
TRAINER_TAGS = {"policy_lag": "Info/policy_lag", "compile_seconds": "Time/trainer_compile_seconds"}


class StatsMessage:
    """The statistics block at the head of each trainer -> player message; NaN marks one not computed."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def pack(self, stats: dict[str, Tensor | float], device: torch.device) -> Tensor:
        values = torch.full((len(self.names),), math.nan, device=device)
        for index, name in enumerate(self.names):
            if name in stats:
                values[index] = stats[name]
        return values

    def value(self, values: Tensor, name: str) -> Tensor:
        """One statistic of a block, where the block is (a view: read it before the next message)."""
        return values[self.names.index(name)]


def stat_tags(algorithm: Algorithm) -> dict[str, str]:
    return dict(algorithm.stat_tags) | TRAINER_TAGS


def rows_per_player(algorithm: Algorithm, topology: Topology) -> list[int]:
    learners_fed = 1 if algorithm.cfg.share_data else topology.num_trainers
    return algorithm.rows_per_source(learners_fed, topology.num_players)


def message_size(algorithm: Algorithm) -> int:
    return len(stat_tags(algorithm)) + num_parameters(algorithm.build_policy(torch.device("cpu")))


class Player:
    """One player: collect, send the batch, take the weights its lag bound allows, repeat.

    The lead player (rank 0) also logs, checkpoints and feeds the evaluator. Every player
    reaches the same report iterations, where they pool their episode statistics and decide
    together whether to checkpoint or stop.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        topology: Topology,
        players_sum: AllReduceSum,
        resume: TrainingCheckpoint | None,
        run: Run | None,
    ) -> None:
        cfg = self.cfg = algorithm.cfg
        self.algorithm, self.topology, self.players_sum = algorithm, topology, players_sum
        self.is_lead = topology.rank == LEAD_PLAYER
        lag = LagBound.of(cfg)
        self.policy = algorithm.build_policy(topology.device)
        self.run = run  # the lead's
        self.evaluator = self._link_evaluator() if self.is_lead and topology.has_evaluator else None
        self.codec = algorithm.batch_codec()
        tags = stat_tags(algorithm)
        self.stats_message = StatsMessage(list(tags))
        num_rows = rows_per_player(algorithm, topology)[topology.rank]
        video_dir = training_video_folder(self.run.dir, resume) if cfg.capture_video and self.run else None
        self.source = algorithm.make_source(
            topology.rank, topology.device, video_dir, env_ranks=topology.num_players, batch_rows=num_rows
        )
        self.outbox = PlayerOutbox(cfg, topology, num_rows, self.codec.width, lag)
        self.inbox = WeightsInbox(topology, message_size(algorithm), lag, cfg.collective_timeout)
        self.stop = StopAgreement(topology, lag, cfg.collective_timeout)
        by_the_leads_clock = cfg.checkpoint_seconds and topology.num_players > 1
        self.clock_checkpoints = ClockCheckpoints(topology, lag, self.stop.store) if by_the_leads_clock else None
        self.first_iteration = 1
        self.closing_step: int | None = None  # the step of the saved agent that the closing evaluation scores
        self.final_step = 0  # where the loop ended
        self.trained_steps = 0  # by this launch: none where a relaunch finds its run finished
        if resume:
            self._restore(resume)
        self.rows = self.codec.empty_rows(num_rows, topology.device)
        self.metrics = TrainingMetrics(topology.device, lambda tensor: tensor, tags)  # the lead's updates
        self.episodes = MeanOverRanks(
            EPISODE_STATISTICS, topology.device, players_sum, counted={EPISODE_RETURN: EPISODE_COUNT}
        )
        self.num_iterations = cfg.num_iterations(topology.num_players)
        self.steps_per_iteration = cfg.steps_per_iteration * topology.num_players  # every player's steps
        self.report_every = algorithm.iterations_per_report(topology.num_players)
        rows_per_update = sum(rows_per_player(algorithm, topology))
        self.replay_ratio = algorithm.passes_per_batch * rows_per_update * cfg.steps_per_row / self.steps_per_iteration
        self.start_step = self.reported_step = (self.first_iteration - 1) * self.steps_per_iteration
        self.progress = ProgressBar(
            self.num_iterations * self.steps_per_iteration,
            cfg.progress_bar and self.is_lead,
            initial=self.start_step,
            drawn_by_job=cfg.progress_bar,
        )
        self.batches_sent = 0
        self.every_player_sent = False  # the players meet at each stop check until they all send batches
        # The iterations of the batches whose updates may not have come back yet (at most the lag bound's).
        self.sent_at: deque[int] = deque(maxlen=lag.updates + 1)
        # The updates' statistics stay where their messages arrive until a report reads them: the largest policy
        # lag since the last report, and the trainers' compile time so far.
        self.lag_max: Tensor | None = None
        self.trainer_compile: Tensor | float = 0.0
        self.reports_waiting: dict[int, tuple[int, dict[str, float]]] = {}  # update -> (iteration, episode means)
        self.loop_clock = LoopClock()

    def close_if_it_fails(self, opened: ClosedIfItFails) -> None:
        opened.add(self.source.abandon)
        opened.add(self.progress.close)

    def _link_evaluator(self) -> EvaluatorLink:
        return EvaluatorLink(self.policy, self.algorithm.spaces.obs_dim, self.topology.evaluator_rank)

    def _restore(self, resume: TrainingCheckpoint) -> None:
        players = self.topology.num_players
        restore_run_state(resume, self.topology.rank, self.policy, None, self.source, env_ranks=players, role="player")
        self.first_iteration = resume.counters.iteration + 1
        if len(resume.rank_states) != players:
            return  # other players wrote it: each starts afresh (restore_run_state said so)
        own = resume.rank_states[self.topology.rank]
        if "shuffle" in own:
            self.outbox.shuffle.set_state(own["shuffle"])

    def train(self, callbacks: Sequence[Callback] = ()) -> TrainingResult | None:
        """The players' loop; the run's result on the lead player."""
        topology = self.topology
        state = LoopState(
            self.first_iteration - 1,
            self.start_step,
            self.num_iterations,
            topology.rank,
            self.is_lead,
            self.run.dir if self.run else None,
            self.run.sink if self.run else None,
        )
        # --checkpoint-every in steps falls at the same iterations for every player; a time, by the lead's clock.
        loop = TrainingLoop(
            self.cfg,
            self,
            state,
            self.first_iteration,
            self.report_every,
            self.steps_per_iteration,
            keeps_clock=self.is_lead,
            callbacks=callbacks,
        )
        state = loop.run()
        self.outbox.send_command(Command.STOP, state.iteration)
        self.outbox.drain()
        self.progress.close()
        self.source.close()
        return self.finish(state) if self.run is not None else None

    def iterate(self, iteration: int) -> None:
        self.collect_and_send(iteration)
        self.inbox.catch_up(self.batches_sent, self.on_update)  # the weights the next iteration may act with
        reached(self.delivered_iteration(iteration) * self.steps_per_iteration, self.is_lead)

    def delivered_iteration(self, iteration: int) -> int:
        """The last iteration every player has finished: an update needs every player's share of its batch, so all
        iterations before the oldest batch whose update has not come back (this one, in lock step) were delivered.
        A player that fails in its rollout then leaves the round at the iteration before, not at this one."""
        unanswered = self.batches_sent - self.inbox.version
        return self.sent_at[-unanswered] - 1 if unanswered else iteration

    def collect_and_send(self, iteration: int) -> None:
        acted_with = self.inbox.version
        episodes = self.source.collect(self.policy, (iteration - 1) * self.steps_per_iteration)
        self.episodes.update(EPISODE_RETURN, episodes.returns)
        self.episodes.update(EPISODE_LENGTH, episodes.lengths)
        batch = self.source.next_batch(iteration * self.steps_per_iteration, self.players_sum)
        if batch is None:
            return
        self.codec.pack(batch, self.rows)
        self.outbox.send_batch(iteration, acted_with, self.rows)
        self.batches_sent += 1
        self.sent_at.append(iteration)
        if self.is_lead:  # off the trainers' critical path: they are training meanwhile
            self.metrics.record(self.source.batch_stats(batch))

    def report(self, iteration: int) -> dict[str, float]:
        """The lead logs now, or once the update of this iteration's batch has arrived; the players' pooled
        episode statistics."""
        episode_means = self.episodes.compute()  # pooled over the players, who all report here
        if self.is_lead:
            self.schedule_report(iteration, episode_means)
        return episode_means

    def agree(self, iteration: int, wanted: Requests) -> Requests:
        """Checkpoints fall at the same iterations for every player; a stop is agreed through the job's store."""
        if not self.every_player_sent:
            self.every_player_sent = self.meet_the_other_players()
        stop = self.stop.check(iteration, wanted, self.next_check)
        checkpoint = wanted.checkpoint
        if self.clock_checkpoints is not None:
            checkpoint = self.clock_checkpoints.check(iteration, wanted.checkpoint, self.next_check)
        return Requests(interrupt=stop == INTERRUPT, checkpoint=checkpoint, finish=stop == FINISH)

    def meet_the_other_players(self) -> bool:
        """Wait here for every player; whether each has sent a batch. Until then (SAC's --learning-starts) no lag
        bound holds a player near the others, so they meet at each stop check: none can pass a stop that one of them
        proposed at the check before."""
        not_yet_sent = torch.tensor([float(self.batches_sent == 0)], device=self.topology.device)
        return self.players_sum(not_yet_sent).item() == 0

    def ended(self, iteration: int) -> None:
        return

    def next_check(self, iteration: int) -> int:
        """The first iteration from `iteration` on at which every player's loop checks for a stop."""
        stop_check_every = stop_check_interval(self.report_every, self.steps_per_iteration)
        return next_check(iteration, self.report_every, stop_check_every, self.num_iterations)

    @property
    def trainer_compile_seconds(self) -> float:
        return float(self.trainer_compile)

    def schedule_report(self, iteration: int, episode_means: dict[str, float]) -> None:
        if self.inbox.version == self.batches_sent:
            self.log_report(iteration, episode_means)
        else:  # logged once the update of this iteration's batch has arrived
            self.reports_waiting[self.batches_sent] = (iteration, episode_means)

    def log_report(self, iteration: int, episode_means: dict[str, float]) -> None:
        assert self.run is not None
        step = iteration * self.steps_per_iteration
        steps_per_second = (step - self.start_step) / self.loop_clock.seconds(self.trainer_compile_seconds)
        scalars = self.metrics.compute() | episode_means
        scalars |= {"Time/steps_per_second": steps_per_second, "Info/replay_ratio": self.replay_ratio}
        if self.lag_max is not None:  # the mean hides a bound's breach: the largest lag since the last report too
            scalars["Info/policy_lag_max"] = float(self.lag_max)
            self.lag_max = None
        self.run.sink.log_scalars(scalars, step)
        self.progress.advance(step - self.reported_step, steps_per_second, scalars.get(EPISODE_RETURN))
        self.reported_step = step
        if self.evaluator is not None:
            self.evaluator.offer(step, self.policy, self.source.obs_normalizer)

    def on_update(self, version: int, message: Tensor) -> None:
        """An update's weights (acted with from now on) and, on the lead player, its statistics."""
        head = len(self.stats_message.names)
        load_flat_parameters(self.policy, message[head:])
        if not self.is_lead:
            return
        stats = message[:head]
        self.metrics.record_present(self.stats_message.names, stats)
        lag = self.stats_message.value(stats, "policy_lag")
        self.lag_max = lag.clone() if self.lag_max is None else torch.maximum(self.lag_max, lag)
        self.trainer_compile = self.stats_message.value(stats, "compile_seconds").clone()
        if version in self.reports_waiting:
            self.log_report(*self.reports_waiting.pop(version))

    def checkpoint(self, iteration: int) -> None:
        """Every player at once: the checkpoint holds the weights of every batch sent, and every player's state."""
        self.outbox.send_command(Command.SAVE, iteration)
        self.inbox.catch_up(self.batches_sent, self.on_update, everything=True)
        player_state = self.source.capture_state() | {"shuffle": self.outbox.shuffle.get_state()}
        topology = self.topology
        if not self.is_lead:
            send_state(player_state, LEAD_PLAYER, topology.role_name(LEAD_PLAYER))
            return
        assert self.run is not None
        assert_finite(self.policy)
        learner_state = receive_state(topology.first_trainer, topology.role_name(topology.first_trainer))
        others = [receive_state(other, topology.role_name(other)) for other in topology.players[1:]]
        step = iteration * self.steps_per_iteration
        agent = agent_of(self.algorithm, self.policy, self.source)
        checkpoint = training_checkpoint(
            agent, learner_state, Counters(step, iteration), [player_state, *others], MODE, topology.world_size
        )
        keep_checkpoint(self.run.dir, step, checkpoint, self.cfg.keep_last)

    def finish(self, state: LoopState) -> TrainingResult:
        """The lead player's end of the run: the evaluator's last weights, then the saved agent and its evaluation."""
        run, policy, source = self.run, self.policy, self.source
        assert run is not None
        global_step = state.global_step
        if self.evaluator is not None:
            self.evaluator.finish(global_step, policy, source.obs_normalizer)
        loop_seconds = self.loop_clock.seconds(self.trainer_compile_seconds)
        steps = self.trained_steps = global_step - self.start_step
        if steps:  # a relaunch of a finished run trains none, and has no speed to report
            waited = self.inbox.wait_seconds
            line = summary_line(steps, loop_seconds, env_seconds=source.env_seconds, update_wait_seconds=waited)
            print(line, flush=True)
            run.sink.log_scalars(loop_figures(steps, loop_seconds, source.env_seconds), global_step)  # its own
        self.final_step = global_step
        if state.interrupted:
            print(f"interrupted at step {global_step}: checkpoint written to {run.dir}", flush=True)
            record_end(global_step, interrupted=True)
            return TrainingResult(os.path.abspath(run.dir), None, None, global_step)
        report_compile_time(self.cfg, self.loop_clock.compile_seconds(), "the lead player")
        report_compile_time(self.cfg, self.trainer_compile_seconds, "each trainer (mean)")
        assert_finite(policy)
        write_file(agent_path(run.dir), agent_of(self.algorithm, policy, source))
        self.closing_step = global_step
        return TrainingResult(os.path.abspath(run.dir), os.path.abspath(agent_path(run.dir)), None, global_step)

    def close_run(self, result: TrainingResult, peak_rss_mb: list[float]) -> TrainingResult:
        """The lead's end of the run once the job's process group is closed (no process waits for it then): every
        rank's peak memory, the saved agent's closing evaluation, and the run's logs closed."""
        assert self.run is not None
        if self.trained_steps:  # a relaunch of a finished run trains none: no figures of its own
            roles = (f"{self.topology.role_name(rank)}: {mb:.0f}" for rank, mb in enumerate(peak_rss_mb))
            print(f"peak RSS per rank (MB): {', '.join(roles)}", flush=True)
            self.run.sink.log_scalars(peak_rss_figure(peak_rss_mb), self.final_step)
        if self.closing_step is None:
            self.run.close()
            return result
        evaluation = report_evaluation(
            self.cfg, self.algorithm.spaces.env_id, self.policy, self.source.obs_normalizer, self.run, self.closing_step
        )
        record_end(self.closing_step, interrupted=False)
        self.run.close()
        return replace(result, evaluation=evaluation)


def run_trainer(
    algorithm: Algorithm, topology: Topology, trainer_group: dist.ProcessGroup, resume: TrainingCheckpoint | None
) -> None:
    ctrl_c_only_noted()  # Ctrl-C is the players' to handle: they checkpoint and stop us
    cfg = algorithm.cfg
    runtime = FabricRuntime(cfg, topology.world_size, process_group=trainer_group, device=topology.device)
    policy = algorithm.build_policy(runtime.device)
    codec = algorithm.batch_codec()
    from_players = rows_per_player(algorithm, topology)
    inbox = TrainerInbox(topology, from_players, codec.width, cfg.share_data)
    shard = trainer_shard(topology, from_players, cfg.share_data)
    learner = algorithm.make_learner(policy, runtime, shard, env_ranks=topology.num_players)
    if resume:
        restore_run_state(resume, topology.rank, policy, learner, None)
    stats_message = StatsMessage(list(stat_tags(algorithm)))
    is_first = topology.rank == topology.first_trainer
    outbox = WeightsOutbox(topology, message_size(algorithm), LagBound.of(cfg), cfg.collective_timeout)
    progress_line(cfg.progress_bar)  # the lead player's bar shares our stderr: error lines start on their own
    updates_done, loop_clock = 0, LoopClock()
    report_every = algorithm.iterations_per_report(topology.num_players)
    last_iteration = cfg.num_iterations(topology.num_players)
    steps_per_iteration = cfg.steps_per_iteration * topology.num_players
    while True:
        command, iteration, policy_lag = inbox.receive(updates_done)
        if command is Command.STOP:
            break
        if command is Command.SAVE:
            if is_first:
                send_state(learner.state_dict(), LEAD_PLAYER, topology.role_name(LEAD_PLAYER))
            continue
        # The players' rows, one player after another; the columns the learner reads on the host stay there.
        batch = codec.unpack(to_device(inbox.rows, runtime.device), host_rows=inbox.rows)
        with peer("another trainer"):
            stats = learner.update(batch, iteration)
            if report_due(iteration, report_every, last_iteration):
                learner.raise_if_diverged()  # a read from the device where the players log, not at every update
            stats |= {
                "policy_lag": float(policy_lag),
                "compile_seconds": loop_clock.compile_seconds(),
            }
            # Statistics not computed by every trainer stay NaN in the mean, and the player drops them.
            mean_stats = runtime.all_reduce_sum(stats_message.pack(stats, runtime.device)) / runtime.world_size
        updates_done += 1
        reached(iteration * steps_per_iteration, is_main=False)  # the step a fault of ours is journaled at
        if outbox.receivers:  # every trainer holds the new weights; each sends them to its share of the players
            outbox.send(torch.cat([mean_stats, learner.policy_weights()]).to(topology.comm_device))
    outbox.drain()


def role_devices(cfg: RunConfig, rank: int, world_size: int) -> tuple[torch.device, torch.device, str, str]:
    """(this role's device, message-buffer device, world backend, trainer-group backend).

    NCCL only where every rank of a group is on a GPU; gloo wherever a CPU rank takes part.
    """
    on_gpu = uses_gpu(cfg, rank, world_size, decoupled=True)
    device = torch.device(f"cuda:{local_gpu_index(cfg, rank, world_size, True)}") if on_gpu else torch.device("cpu")
    world_backend = "nccl" if cfg.cuda and cfg.player_on_gpu and not cfg.evaluator else "gloo"  # the evaluator: CPU
    comm_device = device if world_backend == "nccl" else torch.device("cpu")
    return device, comm_device, world_backend, "nccl" if cfg.cuda else "gloo"


def sum_over(group: dist.ProcessGroup | None) -> AllReduceSum:
    """Pool the players' normalization statistics (nothing to pool for one player)."""
    if group is None:
        return lambda tensor: tensor

    def all_reduce_sum(tensor: Tensor) -> Tensor:
        with peer("another player"):
            dist.all_reduce(tensor, group=group)
        return tensor

    return all_reduce_sum


def gather_peak_rss(comm_device: torch.device) -> list[float]:
    """Every rank's peak memory in MB, in rank order."""
    mine = torch.tensor([own_peak_rss_mb()], dtype=torch.float64, device=comm_device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [float(mb) for mb in every]


def open_run_on_lead(cfg: RunConfig, topology: Topology, resume: TrainingCheckpoint | None) -> tuple[Run | None, str]:
    """The lead player opens the run folder and journals the round's start while every rank waits: a rank whose env
    fails at once would otherwise end the round before its start is on record, and a config file the disk refuses
    stops every rank with its line. The lead's run (None elsewhere), and its folder, which every rank learns."""
    is_lead = topology.rank == LEAD_PLAYER
    on_lead = partial(
        write_on_rank_0, is_main=is_lead, world_size=topology.world_size, broadcast_object=broadcast_from_rank_0
    )
    lock = RunFolderLock()  # held by the lead
    run_dir = on_lead(lambda: take_run_folder(cfg, LOG_SUBDIR, lock))
    if not is_lead:
        on_lead(lambda: None)  # while the lead writes the run's start
        return None, run_dir
    run = open_run(cfg, run_dir, FabricSink, resume, topology.world_size, on_main=on_lead)
    run.lock = lock
    return run, run_dir


def train_decoupled(
    algorithm: Algorithm, world_size: int, resume: TrainingCheckpoint | None = None, callbacks: Sequence[Callback] = ()
) -> TrainingResult | None:
    """This process's role in a decoupled run; the run's result on the lead player (rank 0), None elsewhere."""
    result = None
    from lightning.fabric.plugins.collectives import TorchCollective

    cfg = algorithm.cfg
    rank = int(os.environ.get("RANK", "0"))
    device, comm_device, world_backend, trainer_backend = role_devices(cfg, rank, world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = collective_timeout(cfg)
    with joining_the_job(timeout):
        init_default_process_group(world_backend, timeout)
        world = TorchCollective().setup(backend=world_backend, timeout=timeout)  # the group just made
    topology = Topology(world.rank, world_size, device, comm_device, cfg.num_players, cfg.evaluator)
    # Every rank creates every group, in the same order.
    trainers = TorchCollective().create_group(ranks=list(topology.trainers), backend=trainer_backend, timeout=timeout)
    players = (
        TorchCollective().create_group(ranks=list(topology.players), backend=world_backend, timeout=timeout)
        if topology.num_players > 1
        else None
    )
    player, evaluator = None, None
    opened = ClosedIfItFails()
    with report_lost_peers(topology.rank, topology.role_name, gather_process_ids(comm_device), cfg.collective_timeout):
        with opened:
            run, run_dir = open_run_on_lead(cfg, topology, resume)
            if run is not None:
                opened.add(run.close)
            # Read on every rank, so that a broken file stops each with its line (the evaluator keeps it).
            best = BestAgent(run_dir, "--evaluator") if cfg.evaluator else None
        if topology.is_player:
            with opened:
                player = Player(algorithm, topology, sum_over(players.group if players else None), resume, run)
                player.close_if_it_fails(opened)
                result = player.train(callbacks)
        elif topology.is_evaluator:
            resumed_step = resume.counters.global_step if resume else None
            evaluator = Evaluator(algorithm, LEAD_PLAYER, run_dir, best, resumed_step)
            with sigterm_left_to_peers(StopAsker(cfg.collective_timeout)):  # the players stop the other roles
                evaluator.serve()
        else:
            with sigterm_left_to_peers(StopAsker(cfg.collective_timeout)):
                run_trainer(algorithm, topology, trainers.group, resume)
        with opened:
            peak_rss = gather_peak_rss(comm_device)  # every role has left its loop
        close_process_group()
    # The last evaluations, which no process waits for: in a collective it would give up after
    # --collective-timeout, which a long evaluation (a greedy Atari game, say) outlasts.
    if evaluator is not None:
        evaluator.evaluate_final_weights()
    if player is not None and result is not None:
        with opened:
            result = player.close_run(result, peak_rss)
    return result
