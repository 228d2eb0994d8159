"""Decoupled PPO: rank 0 is the Player (envs, acting, GAE); ranks 1..N-1 are Trainers (DDP).

Every message between the roles is a tensor in a buffer allocated once, sent over the world
group: a command header (`Command.ROLLOUT` or `Command.STOP`), the rollout rows (broadcast with
--share-data, else scattered in disjoint shards), and the first trainer's weights and loss
statistics back to the player. With --pipeline the player collects the next rollout while the
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

from rl.checkpoint import (
    agent_path,
    agent_state,
    assert_finite,
    capture_rank_state,
    checkpoint_path,
    prune_checkpoints,
    run_dir_of,
    save_file_atomically,
    to_cpu,
    training_state,
)
from rl.config import PPOConfig
from rl.coupled import (
    InterruptFlag,
    annealed_lr,
    build_agent,
    checkpoint_due,
    hyperparameters,
    make_collector,
    make_optimizer,
    open_run,
    report_evaluation,
    restore_collector,
    run_name,
)
from rl.envs import EnvSpaces, derive_seed, video_folder
from rl.faults import gather_process_ids, peer, report_lost_peers
from rl.logger import EPISODE_RETURN, FabricSink, ProgressBar, TrainingMetrics
from rl.policy import ActorCritic, action_shape_and_dtype
from rl.ppo import UPDATE_STATS, MinibatchSchedule, explained_variance, ppo_update
from rl.rollout import Batch, rollout_to_batch
from rl.runtime import FabricRuntime, close_process_group, collective_timeout

PLAYER_RANK = 0
FIRST_TRAINER_RANK = 1
SCATTER_STREAM = 2  # seed stream of the player's shard shuffling
LOG_SUBDIR = "fabric_decoupled_logs"


def role_name(rank: int) -> str:
    return "the player" if rank == PLAYER_RANK else f"trainer {rank}"


class Command(IntEnum):
    ROLLOUT = 1  # a rollout follows; train on it and send the weights back
    SAVE = 2  # the player writes a checkpoint: the first trainer sends its optimizer state
    STOP = 3  # training is over; leave the loop


class BatchCodec:
    """A `Batch` as one float32 matrix, a row per transition, so it moves in one collective."""

    FIELDS = ("obs", "actions", "logprobs", "values", "advantages", "returns")

    def __init__(self, spaces: EnvSpaces) -> None:
        self.action_shape, self.action_dtype = action_shape_and_dtype(spaces.action_space)
        widths = [spaces.obs_dim, math.prod(self.action_shape), 1, 1, 1, 1]
        self.slices = {}
        start = 0
        for name, width in zip(self.FIELDS, widths, strict=True):
            self.slices[name] = slice(start, start + width)
            start += width
        self.width = start

    def pack(self, batch: Batch, out: Tensor) -> None:
        for name in self.FIELDS:
            out[:, self.slices[name]] = getattr(batch, name).reshape(len(batch), -1)

    def unpack(self, rows: Tensor) -> Batch:
        # contiguous copies: strided views would take other kernel paths and round differently
        columns = {name: rows[:, cut].contiguous() for name, cut in self.slices.items()}
        actions = columns["actions"].reshape(len(rows), *self.action_shape).to(self.action_dtype)
        return Batch(
            obs=columns["obs"],
            actions=actions,
            **{name: columns[name].reshape(-1) for name in ("logprobs", "values", "advantages", "returns")},
        )


def shard_sizes(rows: int, num_trainers: int) -> list[int]:
    """Near-equal shard sizes; the first `rows % num_trainers` shards hold one row more."""
    return [rows // num_trainers + (index < rows % num_trainers) for index in range(num_trainers)]


def num_parameters(agent: ActorCritic) -> int:
    return sum(p.numel() for p in agent.parameters())


@dataclass
class Topology:
    """Who is who, on which device, and the world group's buffer device."""

    rank: int
    world_size: int
    device: torch.device  # this role's device
    comm_device: torch.device  # where world-group buffers live (CPU for gloo)

    @property
    def num_trainers(self) -> int:
        return self.world_size - 1

    @property
    def is_player(self) -> bool:
        return self.rank == PLAYER_RANK

    @property
    def role(self) -> str:
        return role_name(self.rank)


class Channel:
    """Player <-> trainer messages on the world group, in buffers allocated once."""

    def __init__(self, cfg: PPOConfig, topology: Topology, codec: BatchCodec, weights_size: int) -> None:
        self.topology = topology
        self.share_data = cfg.share_data
        device = topology.comm_device
        self.rows = cfg.rollout_steps_per_rank
        self.shards = shard_sizes(self.rows, topology.num_trainers)
        self.header = torch.zeros(2, dtype=torch.long, device=device)  # (command, update)
        self.message = torch.zeros(len(UPDATE_STATS) + weights_size, device=device)
        if self.share_data:
            self.rollout = torch.zeros(self.rows, codec.width, device=device)
        else:
            # The player fills one padded shard per rank (its own slot unused); a trainer needs its own only.
            count = topology.world_size if topology.is_player else 1
            self.scatter_buffers = [torch.zeros(max(self.shards), codec.width, device=device) for _ in range(count)]
            self.shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, SCATTER_STREAM))

    # The player's side.
    def send_rollout(self, update: int, rows: Tensor) -> None:
        with peer("a trainer"):
            self._send_header(Command.ROLLOUT, update)
            if self.share_data:
                self.rollout.copy_(rows)
                dist.broadcast(self.rollout, PLAYER_RANK)
                return
            order = torch.randperm(self.rows, generator=self.shuffle).to(rows.device)
            for buffer, shard in zip(self.scatter_buffers[1:], order.split(self.shards), strict=True):
                buffer[: len(shard)] = rows[shard]
            dist.scatter(self.scatter_buffers[PLAYER_RANK], self.scatter_buffers, src=PLAYER_RANK)

    def send_stop(self) -> None:
        with peer("a trainer"):
            self._send_header(Command.STOP, 0)

    def request_optimizer_state(self, update: int) -> dict:
        """The trainers' optimizer state, which only they hold (a rare message: pickled)."""
        received: list = [None]
        with peer("a trainer"):
            self._send_header(Command.SAVE, update)
            dist.recv_object_list(received, src=FIRST_TRAINER_RANK)
        return received[0]

    def receive_weights(self) -> tuple[Tensor, dict[str, Tensor]]:
        with peer("a trainer"):
            dist.recv(self.message, src=FIRST_TRAINER_RANK)
        stats = dict(zip(UPDATE_STATS, self.message[: len(UPDATE_STATS)], strict=True))
        return self.message[len(UPDATE_STATS) :], stats

    def send_initial_weights(self, flat: Tensor) -> None:
        with peer("a trainer"):
            dist.broadcast(flat.to(self.topology.comm_device), PLAYER_RANK)

    def _send_header(self, command: Command, update: int) -> None:
        self.header[0], self.header[1] = int(command), update
        dist.broadcast(self.header, PLAYER_RANK)

    # A trainer's side.
    def receive_command(self) -> tuple[Command, int]:
        with peer("the player"):
            dist.broadcast(self.header, PLAYER_RANK)
        return Command(int(self.header[0])), int(self.header[1])

    def receive_rollout(self) -> Tensor:
        with peer("the player"):
            if self.share_data:
                dist.broadcast(self.rollout, PLAYER_RANK)
                return self.rollout
            (own,) = self.scatter_buffers
            dist.scatter(own, src=PLAYER_RANK)
            return own[: self.shards[self.topology.rank - 1]]

    def receive_initial_weights(self, size: int) -> Tensor:
        flat = torch.zeros(size, device=self.topology.comm_device)
        with peer("the player"):
            dist.broadcast(flat, PLAYER_RANK)
        return flat

    def send_optimizer_state(self, state: dict) -> None:
        with peer("the player"):
            dist.send_object_list([to_cpu(state)], dst=PLAYER_RANK)

    def send_weights(self, flat: Tensor, stats: dict[str, Tensor]) -> None:
        self.message[: len(UPDATE_STATS)] = torch.stack([stats[name] for name in UPDATE_STATS])
        self.message[len(UPDATE_STATS) :] = flat
        with peer("the player"):
            dist.send(self.message, dst=PLAYER_RANK)


def flat_weights(agent: ActorCritic) -> Tensor:
    return torch.nn.utils.parameters_to_vector(agent.parameters()).detach()


def load_flat_weights(agent: ActorCritic, flat: Tensor) -> None:
    """Copy into the existing parameters (`vector_to_parameters` would make them views of `flat`,
    whose different alignment takes other CPU kernel paths and rounds differently)."""
    params = list(agent.parameters())
    chunks = flat.to(params[0].device).split([p.numel() for p in params])
    with torch.no_grad():
        for param, chunk in zip(params, chunks, strict=True):
            param.copy_(chunk.view_as(param))


def run_player(
    cfg: PPOConfig, spaces: EnvSpaces, topology: Topology, channel: Channel, codec: BatchCodec, resume: dict | None
) -> None:
    if resume:
        root, name = os.path.split(run_dir_of(cfg.resume_from))
    else:
        root, name = os.path.join(cfg.log_dir, LOG_SUBDIR), run_name(cfg, spaces.env_id)
    run = open_run(cfg, FabricSink(root, name))
    device = topology.device
    agent = build_agent(cfg, spaces, device)
    if resume:
        agent.load_state_dict(resume["agent"])
    channel.send_initial_weights(flat_weights(agent))

    video_dir = video_folder(run.dir, "train") if cfg.capture_video else None
    collector = make_collector(cfg, spaces, PLAYER_RANK, device, video_dir)
    obs_normalizer = collector.obs_normalizer
    steps_per_update = cfg.rollout_steps_per_rank
    weights_version = 0  # how many updates the player's weights hold
    if resume:
        weights_version = resume["counters"]["update"]
        (player_state,) = resume["rank_states"]
        restore_collector(collector, resume, cfg, PLAYER_RANK, player_state)
        if not cfg.share_data:
            channel.shuffle.set_state(player_state["shuffle"])
    rows = torch.zeros(cfg.rollout_steps_per_rank, codec.width, device=device)
    metrics = TrainingMetrics(device, all_reduce_sum=lambda tensor: tensor)  # the player alone holds them
    num_updates = cfg.num_updates(1)
    start_step = weights_version * steps_per_update
    progress = ProgressBar(num_updates * steps_per_update, cfg.progress_bar, initial=start_step)
    interrupt = InterruptFlag()
    policy_lags: dict[int, int] = {}  # per update: how many updates older the acting weights were
    sent, start = weights_version, time.perf_counter()

    def global_step() -> int:
        return weights_version * steps_per_update

    def receive_update() -> None:
        nonlocal weights_version
        flat, stats = channel.receive_weights()
        load_flat_weights(agent, flat)
        weights_version += 1
        metrics.record_update(stats)
        steps_per_second = (global_step() - start_step) / (time.perf_counter() - start)
        scalars = metrics.compute() | {
            "Info/learning_rate": annealed_lr(cfg, weights_version, num_updates),
            "Info/policy_lag": float(policy_lags[weights_version]),
            "Time/steps_per_second": steps_per_second,
        }
        run.sink.log_scalars(scalars, global_step())
        progress.advance(steps_per_update, steps_per_second, scalars.get(EPISODE_RETURN))

    saved_at = -1

    def save_checkpoint() -> None:
        nonlocal saved_at
        saved_at = global_step()
        assert_finite(agent)
        optimizer_state = channel.request_optimizer_state(weights_version)
        player_state = capture_rank_state(collector)
        if not cfg.share_data:
            player_state["shuffle"] = channel.shuffle.get_state()
        counters = {
            "global_step": global_step(),
            "update": weights_version,
            "epoch": weights_version * cfg.update_epochs,
        }
        state = training_state(agent, optimizer_state, obs_normalizer, collector.reward_scaler, cfg, spaces.env_id,
                               counters, [player_state], "decoupled", topology.world_size)  # fmt: skip
        save_file_atomically(checkpoint_path(run.dir, global_step()), state)
        prune_checkpoints(run.dir, cfg.keep_last)

    for update in range(weights_version + 1, num_updates + 1):
        collected_with = weights_version
        rollout, episodes = collector.collect(agent)
        collector.sync_normalizers(rollout, all_reduce_sum=lambda tensor: tensor)
        batch = rollout_to_batch(rollout, cfg.gamma, cfg.gae_lambda)
        codec.pack(batch, rows)
        if sent > weights_version:  # pipelined: the trainers are done with the previous rollout
            receive_update()
        # The trainers will train this rollout on top of `update - 1` updates.
        policy_lags[update] = update - 1 - collected_with
        channel.send_rollout(update, rows)
        sent = update
        # Off the trainers' critical path: they are training meanwhile.
        metrics.record_rollout(episodes.returns, episodes.lengths, explained_variance(batch.values, batch.returns))
        # A checkpoint waits for this rollout's update, even when pipelined, so none is in flight.
        save = interrupt.requested or checkpoint_due(cfg.checkpoint_every, update * steps_per_update, steps_per_update)
        if not cfg.pipeline or save:
            receive_update()
        if save:
            save_checkpoint()
        if interrupt.requested:
            break
    if sent > weights_version:
        receive_update()
    if saved_at != global_step():
        save_checkpoint()
    channel.send_stop()
    progress.close()
    collector.envs.close()
    if interrupt.requested:
        print(f"interrupted at step {global_step()}: checkpoint written to {run.dir}", flush=True)
        run.sink.close()
        return

    loop_seconds = time.perf_counter() - start
    steps = global_step() - start_step
    print(f"training loop: {steps} steps in {loop_seconds:.2f} s ({steps / loop_seconds:,.0f} steps/s)", flush=True)
    assert_finite(agent)
    save_file_atomically(agent_path(run.dir), agent_state(agent, obs_normalizer, collector.reward_scaler, cfg,
                                                          spaces.env_id))  # fmt: skip
    report_evaluation(cfg, spaces, agent, obs_normalizer, run, global_step())
    run.sink.close()


def run_trainer(
    cfg: PPOConfig,
    spaces: EnvSpaces,
    topology: Topology,
    channel: Channel,
    codec: BatchCodec,
    trainer_group: dist.ProcessGroup,
    resume: dict | None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the player's to handle: it checkpoints and stops us
    agent = build_agent(cfg, spaces, torch.device("cpu"))
    load_flat_weights(agent, channel.receive_initial_weights(num_parameters(agent)))
    runtime = FabricRuntime(cfg, topology.world_size, process_group=trainer_group)
    agent.to(runtime.device)
    model, optimizer = runtime.setup(agent, make_optimizer(agent, cfg))
    if resume:
        optimizer.load_state_dict(resume["optimizer"])
    hp = hyperparameters(cfg)
    num_updates = cfg.num_updates(1)
    trainer_index = runtime.rank
    if cfg.share_data:  # every trainer holds the whole rollout and trains on its sampler shard
        schedule = MinibatchSchedule(cfg.rollout_steps_per_rank, cfg.per_rank_batch_size,
                                     runtime.world_size, trainer_index, cfg.seed)  # fmt: skip
    else:  # shards may differ by a row; the same minibatch count keeps DDP's collectives in step
        own_rows = channel.shards[trainer_index]
        minibatches = math.ceil(max(channel.shards) / cfg.per_rank_batch_size)
        schedule = MinibatchSchedule(own_rows, cfg.per_rank_batch_size, 1, 0, cfg.seed, minibatches)
    if resume:
        schedule.epoch = resume["counters"]["epoch"]

    while True:
        command, update = channel.receive_command()
        if command is Command.STOP:
            break
        if command is Command.SAVE:
            if topology.rank == FIRST_TRAINER_RANK:
                channel.send_optimizer_state(optimizer.state_dict())
            continue
        batch = codec.unpack(channel.receive_rollout().to(runtime.device))
        for group in optimizer.param_groups:
            group["lr"] = annealed_lr(cfg, update, num_updates)
        with peer("another trainer"):
            stats = ppo_update(
                model,
                optimizer,
                batch,
                schedule,
                hp,
                runtime.backward,
            )
            mean_stats = runtime.all_reduce_sum(torch.stack(list(stats.values()))) / runtime.world_size
        if topology.rank == FIRST_TRAINER_RANK:
            channel.send_weights(
                flat_weights(agent).to(topology.comm_device),
                dict(zip(UPDATE_STATS, mean_stats.to(topology.comm_device), strict=True)),
            )


def role_devices(cfg: PPOConfig, rank: int) -> tuple[torch.device, torch.device, str, str]:
    """(this role's device, world-buffer device, world backend, trainer-group backend).

    NCCL only where every rank of a group is on a GPU; gloo wherever a CPU rank takes part.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = cfg.cuda and (rank != PLAYER_RANK or cfg.player_on_gpu)
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
    world_backend = "nccl" if cfg.cuda and cfg.player_on_gpu else "gloo"
    comm_device = device if world_backend == "nccl" else torch.device("cpu")
    return device, comm_device, world_backend, "nccl" if cfg.cuda else "gloo"


def train_decoupled(cfg: PPOConfig, spaces: EnvSpaces, world_size: int, resume: dict | None = None) -> None:
    from lightning.fabric.plugins.collectives import TorchCollective

    rank = int(os.environ.get("RANK", "0"))
    device, comm_device, world_backend, trainer_backend = role_devices(cfg, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = collective_timeout(cfg)
    world = TorchCollective().setup(backend=world_backend, timeout=timeout)
    trainers = TorchCollective().create_group(
        ranks=list(range(FIRST_TRAINER_RANK, world_size)), backend=trainer_backend, timeout=timeout
    )
    topology = Topology(world.rank, world_size, device, comm_device)
    codec = BatchCodec(spaces)
    torch.manual_seed(cfg.seed)
    weights_size = num_parameters(ActorCritic(spaces.obs_dim, spaces.action_space))
    channel = Channel(cfg, topology, codec, weights_size)
    with report_lost_peers(topology.rank, role_name, gather_process_ids(comm_device)):
        if topology.is_player:
            run_player(cfg, spaces, topology, channel, codec, resume)
        else:
            run_trainer(cfg, spaces, topology, channel, codec, trainers.group, resume)
        close_process_group()
