"""Decoupled mode: ranks 0..K-1 are Players (envs, acting, batches), the next ranks Trainers.

The players feed every update with the union of their batches; the first trainer sends each
update's weights and statistics back to every player (`rl.modes.decoupled_links`). How far the
weights a player acts with may trail the learners' is the lag bound: 0 by default (the players
wait for each update), exactly 1 with --pipeline, at most --max-policy-lag with --async (the
players take the newest weights sent so far). The trainers measure the lag of every batch they
train on, and the lead player (rank 0) logs it with the update's statistics.
"""

from __future__ import annotations

import math
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import Tensor

from rl.algos.base import Algorithm
from rl.batch import shard_sizes
from rl.checkpoint import (
    agent_path,
    assert_finite,
    checkpoint_path,
    prune_checkpoints,
    run_dir_of,
    save_file_atomically,
)
from rl.config import RunConfig
from rl.envs import video_folder
from rl.errors import progress_line
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import EPISODE_RETURN, FabricSink, ProgressBar, TrainingMetrics
from rl.modes.decoupled_links import (
    LEAD_PLAYER,
    Command,
    LagBound,
    PlayerOutbox,
    StopAgreement,
    Topology,
    TrainerInbox,
    WeightsInbox,
    WeightsOutbox,
    receive_state,
    send_state,
    trainer_shard,
)
from rl.modes.evaluator import EvaluatorLink, run_evaluator, send_run_dir
from rl.normalization import AllReduceSum
from rl.optim import load_flat_parameters, num_parameters
from rl.run import (
    InterruptFlag,
    agent_state,
    checkpoint_due,
    open_run,
    report_due,
    report_evaluation,
    restore_run_state,
    run_name,
    training_state,
)
from rl.runtime import FabricRuntime, close_process_group, collective_timeout, naming_a_taken_port

LOG_SUBDIR = "fabric_decoupled_logs"
MODE = "decoupled"
LAG_TAGS = {"policy_lag": "Info/policy_lag"}  # measured by the trainers, logged with the algorithm's statistics


class StatsMessage:
    """The statistics block at the head of each trainer -> player message; NaN marks one not computed."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def pack(self, stats: dict[str, Tensor], device: torch.device) -> Tensor:
        values = torch.full((len(self.names),), math.nan, device=device)
        for index, name in enumerate(self.names):
            if name in stats:
                values[index] = stats[name]
        return values

    def unpack(self, values: Tensor) -> dict[str, Tensor]:
        return {name: value for name, value in zip(self.names, values, strict=True) if not value.isnan()}


def stat_tags(algorithm: Algorithm) -> dict[str, str]:
    return dict(algorithm.stat_tags) | LAG_TAGS


def rows_per_player(algorithm: Algorithm, topology: Topology) -> list[int]:
    learners_fed = 1 if algorithm.cfg.share_data else topology.num_trainers
    return algorithm.rows_per_source(learners_fed, topology.num_players)


def message_size(algorithm: Algorithm) -> int:
    return len(stat_tags(algorithm)) + num_parameters(algorithm.build_policy(torch.device("cpu")))


def run_player(algorithm: Algorithm, topology: Topology, players_sum: AllReduceSum, resume: dict | None) -> None:
    cfg, env_id, player = algorithm.cfg, algorithm.spaces.env_id, topology.rank
    is_lead = player == LEAD_PLAYER
    lag, timeout = LagBound.of(cfg), cfg.collective_timeout
    device = topology.device
    policy = algorithm.build_policy(device)
    run = None
    if is_lead:
        if resume:
            root, name = os.path.split(run_dir_of(cfg.resume_from))
        else:
            root, name = os.path.join(cfg.log_dir, LOG_SUBDIR), run_name(cfg, env_id)
        run = open_run(cfg, FabricSink(root, name))
    evaluator = None
    if is_lead and topology.has_evaluator:
        send_run_dir(run.dir, topology.evaluator_rank)
        evaluator = EvaluatorLink(policy, algorithm.spaces.obs_dim, topology.evaluator_rank)
    codec = algorithm.batch_codec()
    tags = stat_tags(algorithm)
    stats_message = StatsMessage(list(tags))
    video_dir = video_folder(run.dir, "train") if cfg.capture_video and run else None
    num_rows = rows_per_player(algorithm, topology)[player]
    num_players = topology.num_players
    source = algorithm.make_source(player, device, video_dir, env_ranks=num_players, batch_rows=num_rows)
    outbox = PlayerOutbox(cfg, topology, num_rows, codec.width, lag)
    inbox = WeightsInbox(topology, message_size(algorithm), lag, timeout)
    stop = StopAgreement(topology, lag, timeout)
    first_iteration = 1
    if resume:
        restore_run_state(resume, player, policy, None, source)
        first_iteration = resume["counters"]["update"] + 1
        if "shuffle" in resume["rank_states"][player]:
            outbox.shuffle.set_state(resume["rank_states"][player]["shuffle"])
    rows = torch.zeros(num_rows, codec.width, device=device)
    metrics = TrainingMetrics(device, lambda tensor: tensor, tags)  # the lead player alone logs them
    num_iterations = cfg.num_iterations(num_players)
    steps_per_iteration = cfg.steps_per_iteration * num_players  # every player's steps
    report_every = algorithm.iterations_per_report(num_players)
    replay_ratio = algorithm.passes_per_batch * sum(rows_per_player(algorithm, topology)) / steps_per_iteration
    start_step = (first_iteration - 1) * steps_per_iteration
    progress = ProgressBar(num_iterations * steps_per_iteration, cfg.progress_bar and is_lead, initial=start_step,
                           drawn_by_job=cfg.progress_bar)  # fmt: skip
    interrupt = InterruptFlag()
    batches_sent = 0
    lag_window: list[float] = []  # the policy lags of the updates since the last report
    reports_waiting: dict[int, int] = {}  # update number -> the report iteration whose last batch it trains
    start, reported_step = time.perf_counter(), start_step

    def report(iteration: int) -> None:
        nonlocal reported_step
        assert run is not None
        step = iteration * steps_per_iteration
        steps_per_second = (step - start_step) / (time.perf_counter() - start)
        scalars = metrics.compute() | {"Time/steps_per_second": steps_per_second, "Info/replay_ratio": replay_ratio}
        if lag_window:  # the mean hides a bound's breach: the largest lag since the last report too
            scalars["Info/policy_lag_max"] = max(lag_window)
            lag_window.clear()
        run.sink.log_scalars(scalars, step)
        progress.advance(step - reported_step, steps_per_second, scalars.get(EPISODE_RETURN))
        reported_step = step
        if evaluator is not None:
            evaluator.offer(step, policy, source.obs_normalizer)

    def on_update(version: int, message: Tensor) -> None:
        """An update's weights (acted with from now on) and, on the lead player, its statistics."""
        head = len(stats_message.names)
        load_flat_parameters(policy, message[head:])
        if is_lead:
            stats = stats_message.unpack(message[:head])
            metrics.record(stats)
            lag_window.append(float(stats["policy_lag"]))
            if version in reports_waiting:
                report(reports_waiting.pop(version))

    def schedule_report(iteration: int) -> None:
        if inbox.version == batches_sent:
            report(iteration)
        else:  # logged once the update of this iteration's batch has arrived
            reports_waiting[batches_sent] = iteration

    saved_at = -1

    def save_checkpoint(iteration: int) -> None:
        """Every player at once: the checkpoint holds the weights of every batch sent, and every player's state."""
        nonlocal saved_at
        saved_at = iteration
        outbox.send_command(Command.SAVE, iteration)
        inbox.catch_up(batches_sent, on_update, everything=True)
        player_state = source.capture_state() | {"shuffle": outbox.shuffle.get_state()}
        if not is_lead:
            send_state(player_state, LEAD_PLAYER, topology.role_name(LEAD_PLAYER))
            return
        assert run is not None
        assert_finite(policy)
        learner_state = receive_state(topology.first_trainer, topology.role_name(topology.first_trainer))
        others = [receive_state(other, topology.role_name(other)) for other in topology.players[1:]]
        counters = {"global_step": iteration * steps_per_iteration, "update": iteration}
        state = training_state(algorithm, policy, source, learner_state, counters, [player_state, *others], MODE,
                               topology.world_size)  # fmt: skip
        save_file_atomically(checkpoint_path(run.dir, iteration * steps_per_iteration), state)
        prune_checkpoints(run.dir, cfg.keep_last)

    def next_report(iteration: int) -> int:
        return min(math.ceil(iteration / report_every) * report_every, num_iterations)

    iteration = first_iteration - 1
    checked_step = start_step
    for iteration in range(first_iteration, num_iterations + 1):
        acted_with = inbox.version
        episodes = source.collect(policy, (iteration - 1) * steps_per_iteration)
        batch = source.next_batch(iteration * steps_per_iteration, players_sum)
        if batch is not None:
            codec.pack(batch, rows)
            outbox.send_batch(iteration, acted_with, rows)
            batches_sent += 1
            if is_lead:  # off the trainers' critical path: they are training meanwhile
                metrics.record(source.batch_stats(batch))
        if is_lead:
            metrics.record_episodes(episodes.returns, episodes.lengths)
        inbox.catch_up(batches_sent, on_update)  # the weights the next iteration may act with
        if not report_due(iteration, report_every, num_iterations):
            continue
        if is_lead:
            schedule_report(iteration)
        step = iteration * steps_per_iteration
        stopping = stop.check(iteration, interrupt.requested, next_report)
        if stopping or checkpoint_due(cfg.checkpoint_every, step, step - checked_step):
            save_checkpoint(iteration)
        checked_step = step
        if stopping:
            break
    if saved_at != iteration:
        save_checkpoint(iteration)
    outbox.send_command(Command.STOP, iteration)
    outbox.drain()
    progress.close()
    source.close()
    if run is None:
        return
    global_step = iteration * steps_per_iteration
    if evaluator is not None:
        evaluator.finish(global_step, policy, source.obs_normalizer)
    if stop.stop_at is not None:
        print(f"interrupted at step {global_step}: checkpoint written to {run.dir}", flush=True)
        run.sink.close()
        return

    loop_seconds = time.perf_counter() - start
    steps = global_step - start_step
    print(f"training loop: {steps} steps in {loop_seconds:.2f} s ({steps / loop_seconds:,.0f} steps/s)", flush=True)
    assert_finite(policy)
    save_file_atomically(agent_path(run.dir), agent_state(algorithm, policy, source))
    report_evaluation(cfg, env_id, policy, source.obs_normalizer, run, global_step)
    run.sink.close()


def run_trainer(
    algorithm: Algorithm, topology: Topology, trainer_group: dist.ProcessGroup, resume: dict | None
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the players' to handle: they checkpoint and stop us
    cfg = algorithm.cfg
    runtime = FabricRuntime(cfg, topology.world_size, process_group=trainer_group)
    policy = algorithm.build_policy(runtime.device)
    codec = algorithm.batch_codec()
    from_players = rows_per_player(algorithm, topology)
    inbox = TrainerInbox(topology, from_players, codec.width, cfg.share_data)
    every_trainer = [[shard_sizes(rows, topology.num_trainers)[index] for rows in from_players]
                     for index in range(topology.num_trainers)]  # fmt: skip
    shard = trainer_shard(cfg.share_data, inbox, every_trainer, topology)
    learner = algorithm.make_learner(policy, runtime, shard, env_ranks=topology.num_players)
    if resume:
        restore_run_state(resume, topology.rank, policy, learner, None)
    stats_message = StatsMessage(list(stat_tags(algorithm)))
    is_first = topology.rank == topology.first_trainer
    lag = LagBound.of(cfg)
    outbox = WeightsOutbox(topology, message_size(algorithm), lag, cfg.collective_timeout) if is_first else None
    progress_line(cfg.progress_bar)  # the lead player's bar shares our stderr: error lines start on their own
    updates_done = 0
    while True:
        command, iteration, policy_lag = inbox.receive(updates_done)
        if command is Command.STOP:
            break
        if command is Command.SAVE:
            if is_first:
                send_state(learner.state_dict(), LEAD_PLAYER, topology.role_name(LEAD_PLAYER))
            continue
        batch = codec.unpack(inbox.rows.to(runtime.device))  # the players' rows, one player after another
        with peer("another trainer"):
            stats = learner.update(batch, iteration) | {"policy_lag": torch.tensor(float(policy_lag))}
            # Statistics not computed by every trainer stay NaN in the mean, and the player drops them.
            mean_stats = runtime.all_reduce_sum(stats_message.pack(stats, runtime.device)) / runtime.world_size
        updates_done += 1
        if outbox is not None:
            outbox.send(torch.cat([mean_stats, learner.policy_weights()]).to(topology.comm_device))
    if outbox is not None:
        outbox.drain()


def role_devices(cfg: RunConfig, rank: int) -> tuple[torch.device, torch.device, str, str]:
    """(this role's device, message-buffer device, world backend, trainer-group backend).

    NCCL only where every rank of a group is on a GPU; gloo wherever a CPU rank takes part.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = cfg.cuda and (rank >= cfg.num_players or cfg.player_on_gpu)
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
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


def train_decoupled(algorithm: Algorithm, world_size: int, resume: dict | None = None) -> None:
    from lightning.fabric.plugins.collectives import TorchCollective

    cfg = algorithm.cfg
    rank = int(os.environ.get("RANK", "0"))
    device, comm_device, world_backend, trainer_backend = role_devices(cfg, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = collective_timeout(cfg)
    with naming_a_taken_port():
        world = TorchCollective().setup(backend=world_backend, timeout=timeout)
    topology = Topology(world.rank, world_size, device, comm_device, cfg.num_players, cfg.evaluator)
    # Every rank creates every group, in the same order.
    trainers = TorchCollective().create_group(ranks=list(topology.trainers), backend=trainer_backend, timeout=timeout)
    players = TorchCollective().create_group(ranks=list(topology.players), backend=world_backend,
                                             timeout=timeout) if topology.num_players > 1 else None  # fmt: skip
    with report_lost_peers(topology.rank, topology.role_name, gather_process_ids(comm_device)):
        if topology.is_player:
            run_player(algorithm, topology, sum_over(players.group if players else None), resume)
        elif topology.is_evaluator:
            run_evaluator(algorithm, LEAD_PLAYER)
        else:
            run_trainer(algorithm, topology, trainers.group, resume)
        close_process_group()
