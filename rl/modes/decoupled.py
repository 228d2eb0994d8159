"""Decoupled mode: rank 0 is the Player (envs, acting, batches); ranks 1..N-1 are Trainers.

Every message between the roles is a tensor in a buffer allocated once, sent over the world
group: a command header (`Command.BATCH`, `SAVE` or `STOP`), the batch rows (broadcast with
--share-data, else scattered in disjoint shards), and the first trainer's policy weights and
statistics back to the player. With --pipeline the player collects the next batch while the
trainers train on the last one, so it acts with weights one update old.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.distributed as dist
from torch import Tensor

from rl.algos.base import Algorithm
from rl.batch import DataShard, shard_sizes
from rl.checkpoint import (
    agent_path,
    assert_finite,
    checkpoint_path,
    prune_checkpoints,
    run_dir_of,
    save_file_atomically,
    to_cpu,
)
from rl.config import RunConfig
from rl.envs import video_folder
from rl.errors import progress_line
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import EPISODE_RETURN, FabricSink, ProgressBar, TrainingMetrics
from rl.modes.evaluator import EvaluatorLink, run_evaluator, send_run_dir
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
from rl.seeds import SCATTER_STREAM, derive_seed

PLAYER_RANK = 0
FIRST_TRAINER_RANK = 1
LOG_SUBDIR = "fabric_decoupled_logs"
MODE = "decoupled"


class Command(IntEnum):
    BATCH = 1  # a batch follows; train on it and send the weights back
    SAVE = 2  # the player writes a checkpoint: the first trainer sends its learner state
    STOP = 3  # training is over; leave the loop


@dataclass
class Topology:
    """Who is who, on which device, and the world group's buffer device.

    Rank 0 is the player, ranks 1.. the trainers, and with --evaluator the last rank the evaluator.
    """

    rank: int
    world_size: int
    device: torch.device  # this role's device
    comm_device: torch.device  # where world-group buffers live (CPU for gloo)
    has_evaluator: bool = False

    @property
    def num_trainers(self) -> int:
        return self.world_size - 1 - int(self.has_evaluator)

    @property
    def evaluator_rank(self) -> int:
        return self.world_size - 1

    @property
    def is_player(self) -> bool:
        return self.rank == PLAYER_RANK

    @property
    def is_evaluator(self) -> bool:
        return self.has_evaluator and self.rank == self.evaluator_rank

    def role_name(self, rank: int) -> str:
        if rank == PLAYER_RANK:
            return "the player"
        return "the evaluator" if self.has_evaluator and rank == self.evaluator_rank else f"trainer {rank}"

    @property
    def trainer_index(self) -> int:
        return self.rank - FIRST_TRAINER_RANK


class Channel:
    """Player <-> trainer messages on `group` (the world, or all but the evaluator), in buffers allocated once."""

    def __init__(
        self, cfg: RunConfig, topology: Topology, group: dist.ProcessGroup | None, rows: int, width: int,
        message_size: int,
    ) -> None:  # fmt: skip
        self.topology, self.group = topology, group
        self.share_data = cfg.share_data
        device = topology.comm_device
        self.rows = rows
        self.shards = shard_sizes(rows, topology.num_trainers)
        self.header = torch.zeros(2, dtype=torch.long, device=device)  # (command, iteration)
        self.message = torch.zeros(message_size, device=device)  # statistics, then the policy's weights
        if self.share_data:
            self.batch = torch.zeros(rows, width, device=device)
        else:
            # The player fills one padded shard per rank (its own slot unused); a trainer needs its own only.
            count = topology.num_trainers + 1 if topology.is_player else 1
            self.scatter_buffers = [torch.zeros(max(self.shards), width, device=device) for _ in range(count)]
            self.shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, SCATTER_STREAM))

    # The player's side.
    def send_batch(self, iteration: int, rows: Tensor) -> None:
        with peer("a trainer"):
            self._send_header(Command.BATCH, iteration)
            if self.share_data:
                self.batch.copy_(rows)
                dist.broadcast(self.batch, PLAYER_RANK, group=self.group)
                return
            order = torch.randperm(self.rows, generator=self.shuffle).to(rows.device)
            for buffer, shard in zip(self.scatter_buffers[1:], order.split(self.shards), strict=True):
                buffer[: len(shard)] = rows[shard]
            dist.scatter(self.scatter_buffers[PLAYER_RANK], self.scatter_buffers, src=PLAYER_RANK, group=self.group)

    def send_stop(self) -> None:
        with peer("a trainer"):
            self._send_header(Command.STOP, 0)

    def request_learner_state(self, iteration: int) -> dict:
        """The trainers' learner state (optimizers, targets), which only they hold (a rare message: pickled)."""
        received: list = [None]
        with peer("a trainer"):
            self._send_header(Command.SAVE, iteration)
            dist.recv_object_list(received, src=FIRST_TRAINER_RANK)
        return received[0]

    def receive_message(self) -> Tensor:
        with peer("a trainer"):
            dist.recv(self.message, src=FIRST_TRAINER_RANK)
        return self.message

    def _send_header(self, command: Command, iteration: int) -> None:
        self.header[0], self.header[1] = int(command), iteration
        dist.broadcast(self.header, PLAYER_RANK, group=self.group)

    # A trainer's side.
    def receive_command(self) -> tuple[Command, int]:
        with peer("the player"):
            dist.broadcast(self.header, PLAYER_RANK, group=self.group)
        return Command(int(self.header[0])), int(self.header[1])

    def receive_batch(self) -> Tensor:
        with peer("the player"):
            if self.share_data:
                dist.broadcast(self.batch, PLAYER_RANK, group=self.group)
                return self.batch
            (own,) = self.scatter_buffers
            dist.scatter(own, src=PLAYER_RANK, group=self.group)
            return own[: self.shards[self.topology.trainer_index]]

    def send_learner_state(self, state: dict) -> None:
        with peer("the player"):
            dist.send_object_list([to_cpu(state)], dst=PLAYER_RANK)

    def send_message(self, message: Tensor) -> None:
        self.message.copy_(message)
        with peer("the player"):
            dist.send(self.message, dst=PLAYER_RANK)


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


def run_player(algorithm: Algorithm, topology: Topology, channel: Channel, resume: dict | None) -> None:
    cfg, env_id = algorithm.cfg, algorithm.spaces.env_id
    if resume:
        root, name = os.path.split(run_dir_of(cfg.resume_from))
    else:
        root, name = os.path.join(cfg.log_dir, LOG_SUBDIR), run_name(cfg, env_id)
    run = open_run(cfg, FabricSink(root, name))
    device = topology.device
    policy = algorithm.build_policy(device)
    evaluator = None
    if topology.has_evaluator:
        send_run_dir(run.dir, topology.evaluator_rank)
        evaluator = EvaluatorLink(policy, algorithm.spaces.obs_dim, topology.evaluator_rank)
    codec = algorithm.batch_codec()
    stats_message = StatsMessage(list(algorithm.stat_tags))
    video_dir = video_folder(run.dir, "train") if cfg.capture_video else None
    learners_fed = 1 if cfg.share_data else topology.num_trainers
    source = algorithm.make_source(PLAYER_RANK, device, video_dir, env_ranks=1, batch_rows=channel.rows)
    first_iteration = 1
    if resume:
        restore_run_state(resume, PLAYER_RANK, policy, None, source)
        first_iteration = resume["counters"]["update"] + 1
        if not cfg.share_data:
            channel.shuffle.set_state(resume["rank_states"][PLAYER_RANK]["shuffle"])
    rows = torch.zeros(channel.rows, codec.width, device=device)
    metrics = TrainingMetrics(device, lambda tensor: tensor, algorithm.stat_tags)  # the player alone holds them
    num_iterations = cfg.num_iterations(1)
    steps_per_iteration = cfg.steps_per_iteration
    report_every = algorithm.iterations_per_report(1)
    replay_ratio = algorithm.passes_per_batch * algorithm.batch_rows(learners_fed) / steps_per_iteration
    start_step = (first_iteration - 1) * steps_per_iteration
    progress = ProgressBar(num_iterations * steps_per_iteration, cfg.progress_bar, initial=start_step)
    interrupt = InterruptFlag()
    in_flight: int | None = None  # the iteration whose update the trainers are computing
    weights_version = 0  # updates held by the player's weights
    policy_lags: dict[int, int] = {}  # per iteration: how many updates older the acting weights were
    start, reported_step = time.perf_counter(), start_step

    def report(iteration: int) -> None:
        nonlocal reported_step
        step = iteration * steps_per_iteration
        steps_per_second = (step - start_step) / (time.perf_counter() - start)
        scalars = metrics.compute() | {"Time/steps_per_second": steps_per_second, "Info/replay_ratio": replay_ratio}
        if iteration in policy_lags:
            scalars["Info/policy_lag"] = float(policy_lags.pop(iteration))
        run.sink.log_scalars(scalars, step)
        progress.advance(step - reported_step, steps_per_second, scalars.get(EPISODE_RETURN))
        reported_step = step
        if evaluator is not None:
            evaluator.offer(step, policy, source.obs_normalizer)

    def receive_update() -> None:
        """The trainers' update of the iteration in flight: load its weights, record its statistics."""
        nonlocal in_flight, weights_version
        message = channel.receive_message()
        head = len(stats_message.names)
        load_flat_parameters(policy, message[head:])
        weights_version += 1
        metrics.record(stats_message.unpack(message[:head]))
        finished, in_flight = in_flight, None
        if report_due(finished, report_every, num_iterations):
            report(finished)

    saved_at = -1

    def save_checkpoint(iteration: int) -> None:
        nonlocal saved_at
        saved_at = iteration
        assert_finite(policy)
        learner_state = channel.request_learner_state(iteration)
        player_state = source.capture_state()
        if not cfg.share_data:
            player_state["shuffle"] = channel.shuffle.get_state()
        counters = {"global_step": iteration * steps_per_iteration, "update": iteration}
        state = training_state(algorithm, policy, source, learner_state, counters, [player_state], MODE,
                               topology.world_size)  # fmt: skip
        save_file_atomically(checkpoint_path(run.dir, iteration * steps_per_iteration), state)
        prune_checkpoints(run.dir, cfg.keep_last)

    iteration = first_iteration - 1
    for iteration in range(first_iteration, num_iterations + 1):
        acted_with = weights_version
        episodes = source.collect(policy, (iteration - 1) * steps_per_iteration)
        batch = source.next_batch(iteration * steps_per_iteration, lambda tensor: tensor)
        if batch is not None:
            codec.pack(batch, rows)
            if in_flight is not None:  # pipelined: the trainers are done with the previous batch
                receive_update()
            policy_lags[iteration] = weights_version - acted_with
            channel.send_batch(iteration, rows)
            in_flight = iteration
            # Off the trainers' critical path: they are training meanwhile.
            metrics.record(source.batch_stats(batch))
        metrics.record_episodes(episodes.returns, episodes.lengths)
        reporting = report_due(iteration, report_every, num_iterations)
        # A checkpoint waits for this iteration's update, even when pipelined, so none is in flight.
        save = reporting and (
            interrupt.requested or checkpoint_due(cfg.checkpoint_every, iteration * steps_per_iteration,
                                                  iteration * steps_per_iteration - reported_step)
        )  # fmt: skip
        if in_flight is not None and (not cfg.pipeline or save):
            receive_update()
        elif in_flight is None and reporting:
            report(iteration)
        if save:
            save_checkpoint(iteration)
        if interrupt.requested and reporting:
            break
    if in_flight is not None:
        receive_update()
    if saved_at != iteration:
        save_checkpoint(iteration)
    channel.send_stop()
    progress.close()
    source.close()
    global_step = iteration * steps_per_iteration
    if evaluator is not None:
        evaluator.finish(global_step, policy, source.obs_normalizer)
    if interrupt.requested:
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


def trainer_shard(cfg: RunConfig, channel: Channel, trainer_index: int, num_trainers: int) -> DataShard:
    if cfg.share_data:  # every trainer holds the whole batch and trains on its shard of it
        return DataShard(channel.rows, num_trainers, trainer_index)
    # Scattered shards may differ by a row; the largest sets every trainer's number of steps.
    return DataShard(channel.shards[trainer_index], largest_rows=max(channel.shards))


def run_trainer(
    algorithm: Algorithm, topology: Topology, channel: Channel, trainer_group: dist.ProcessGroup, resume: dict | None
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the player's to handle: it checkpoints and stops us
    cfg = algorithm.cfg
    runtime = FabricRuntime(cfg, topology.world_size, process_group=trainer_group)
    policy = algorithm.build_policy(runtime.device)
    shard = trainer_shard(cfg, channel, runtime.rank, runtime.world_size)
    learner = algorithm.make_learner(policy, runtime, shard, env_ranks=1)
    if resume:
        restore_run_state(resume, topology.rank, policy, learner, None)
    codec = algorithm.batch_codec()
    stats_message = StatsMessage(list(algorithm.stat_tags))
    is_first = topology.rank == FIRST_TRAINER_RANK
    progress_line(cfg.progress_bar)  # the player's bar shares our stderr: error lines start on their own

    while True:
        command, iteration = channel.receive_command()
        if command is Command.STOP:
            break
        if command is Command.SAVE:
            if is_first:
                channel.send_learner_state(learner.state_dict())
            continue
        batch = codec.unpack(channel.receive_batch().to(runtime.device))
        with peer("another trainer"):
            stats = stats_message.pack(learner.update(batch, iteration), runtime.device)
            # Statistics not computed by every trainer stay NaN in the mean, and the player drops them.
            mean_stats = runtime.all_reduce_sum(stats) / runtime.world_size
        if is_first:
            channel.send_message(torch.cat([mean_stats, learner.policy_weights()]).to(topology.comm_device))


def role_devices(cfg: RunConfig, rank: int) -> tuple[torch.device, torch.device, str, str]:
    """(this role's device, world-buffer device, world backend, trainer-group backend).

    NCCL only where every rank of a group is on a GPU; gloo wherever a CPU rank takes part.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = cfg.cuda and (rank != PLAYER_RANK or cfg.player_on_gpu)
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
    world_backend = "nccl" if cfg.cuda and cfg.player_on_gpu and not cfg.evaluator else "gloo"  # the evaluator: CPU
    comm_device = device if world_backend == "nccl" else torch.device("cpu")
    return device, comm_device, world_backend, "nccl" if cfg.cuda else "gloo"


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
    topology = Topology(world.rank, world_size, device, comm_device, cfg.evaluator)
    trainer_ranks = list(range(FIRST_TRAINER_RANK, FIRST_TRAINER_RANK + topology.num_trainers))
    trainers = TorchCollective().create_group(ranks=trainer_ranks, backend=trainer_backend, timeout=timeout)
    # The evaluator stays out of the player's and trainers' collectives: it only ever receives weights.
    acting = TorchCollective().create_group(ranks=[PLAYER_RANK, *trainer_ranks], backend=world_backend,
                                            timeout=timeout) if cfg.evaluator else None  # fmt: skip
    learners_fed = 1 if cfg.share_data else topology.num_trainers
    message_size = len(algorithm.stat_tags) + num_parameters(algorithm.build_policy(torch.device("cpu")))
    channel = Channel(cfg, topology, acting.group if acting else None, algorithm.batch_rows(learners_fed),
                      algorithm.batch_codec().width, message_size)  # fmt: skip
    with report_lost_peers(topology.rank, topology.role_name, gather_process_ids(comm_device)):
        if topology.is_player:
            run_player(algorithm, topology, channel, resume)
        elif topology.is_evaluator:
            run_evaluator(algorithm, PLAYER_RANK)
        else:
            run_trainer(algorithm, topology, channel, trainers.group, resume)
        close_process_group()
