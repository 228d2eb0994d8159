"""Who is who in decoupled mode, and the messages between players and trainers.

Ranks 0..K-1 are players, the next ranks trainers, and with --evaluator the last rank the
evaluator. Every message is a tensor in a buffer allocated once, sent point to point:

- player -> every trainer, per iteration: a header (command, iteration, weights version acted
  with), then, for `Command.BATCH`, the trainer's shard of the player's rows (or all of them
  with --share-data);
- trainer -> its players (the trainers split the players between them), per update: the
  update's statistics and the policy's weights, which every trainer holds.

A gloo send completes only once its receiver has posted the matching receive, so both sides
post sends (`isend`) into a ring of buffers and wait on a slot only before refilling it. The
ring is as deep as the policy lag allows messages to be in flight: nobody waits on a peer that
is allowed to be behind. Receivers post their next receive (`irecv`) as soon as they know it
will come, before they compute: a message then travels while its receiver works, instead of
after a round trip that starts when the receiver asks for it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.distributed as dist
from torch import Tensor

from rl.batch import DataShard, shard_sizes
from rl.checkpoint import to_cpu
from rl.config import RunConfig, trainer_count
from rl.elastic import job_store_client
from rl.faults import peer
from rl.loop import Requests
from rl.seeds import SCATTER_STREAM, derive_seed

LEAD_PLAYER = 0  # the player that logs, checkpoints and feeds the evaluator
PUBLISHED_KEY = "rl/decoupled/weights_published/{}"  # per trainer: updates whose weights it has sent
STOP_KEY = "rl/decoupled/stop_at"  # the iteration at which an interrupted run stops, once agreed
STOP_ASKED_KEY = "rl/decoupled/stop_asked"  # a trainer or the evaluator got SIGTERM: the players checkpoint and stop
CHECKPOINT_KEY = "rl/decoupled/checkpoint_at/{}"  # the iteration of the players' Nth checkpoint by the lead's clock


class Command(IntEnum):
    BATCH = 1  # rows follow; train on them and send the weights back
    SAVE = 2  # the lead player writes a checkpoint: the first trainer sends its learner state
    STOP = 3  # training is over; leave the loop


@dataclass
class Topology:
    """Ranks 0..K-1 play, the next ones train, and with --evaluator the last rank evaluates."""

    rank: int
    world_size: int
    device: torch.device  # this role's device
    comm_device: torch.device  # where message buffers live (CPU for gloo)
    num_players: int = 1
    has_evaluator: bool = False

    @property
    def num_trainers(self) -> int:
        return trainer_count(self.world_size, self.num_players, self.has_evaluator)

    @property
    def first_trainer(self) -> int:
        return self.num_players

    @property
    def players(self) -> range:
        return range(self.num_players)

    @property
    def trainers(self) -> range:
        return range(self.first_trainer, self.first_trainer + self.num_trainers)

    @property
    def evaluator_rank(self) -> int:
        return self.world_size - 1

    @property
    def is_player(self) -> bool:
        return self.rank < self.num_players

    @property
    def is_evaluator(self) -> bool:
        return self.has_evaluator and self.rank == self.evaluator_rank

    @property
    def trainer_index(self) -> int:
        return self.rank - self.first_trainer

    def weights_sender(self, player: int) -> int:
        """The trainer that sends `player` each update's weights: every trainer holds them, so
        the fan-out to K players is split over the trainers."""
        return self.first_trainer + player % self.num_trainers

    def weights_receivers(self, trainer: int) -> list[int]:
        return [player for player in self.players if self.weights_sender(player) == trainer]

    def role_name(self, rank: int) -> str:
        if rank < self.num_players:
            return "the player" if self.num_players == 1 else f"player {rank}"
        return "the evaluator" if self.has_evaluator and rank == self.evaluator_rank else f"trainer {rank}"


@dataclass(frozen=True)
class LagBound:
    """How many updates the weights a player acts with may trail the learners' when they train on its data.

    Synchronous: 0. --pipeline: exactly 1 (the player always takes the update one behind).
    --async: at most --max-policy-lag, and the player takes the newest weights it has been sent.
    """

    updates: int
    take_newest: bool

    @classmethod
    def of(cls, cfg: RunConfig) -> LagBound:
        if cfg.asynchronous:
            return cls(cfg.max_policy_lag, take_newest=True)
        return cls(1 if cfg.pipeline else 0, take_newest=False)

    def required_version(self, batches_sent: int) -> int:
        """The oldest weights a player may act with, having sent `batches_sent` batches."""
        return max(0, batches_sent - self.updates)

    def check_none_passed(self, iteration: int, next_check: Callable[[int], int]) -> int:
        """A stop check that no player can have passed while one is at `iteration`: a player runs at most
        `updates + 1` iterations ahead of the slowest, whose batches it needs."""
        return next_check(iteration + self.updates + 2)

    @property
    def ring_depth(self) -> int:
        """Messages one side may have in flight to one peer, plus the one being filled."""
        return self.updates + 2


class Ring:
    """`depth` slots of buffers, each refilled only after the sends posted from it have completed."""

    def __init__(self, depth: int, make_slot: Callable[[], list[Tensor]]) -> None:
        self.slots = [make_slot() for _ in range(depth)]
        self.pending: list[list[dist.Work]] = [[] for _ in range(depth)]
        self.next = 0

    def take(self, peer_name: str) -> tuple[list[Tensor], list[dist.Work]]:
        """The next slot's buffers, free to fill, and the list its new sends go to."""
        index = self.next
        self.next = (index + 1) % len(self.slots)
        with peer(peer_name):
            for work in self.pending[index]:
                work.wait()
        self.pending[index] = []
        return self.slots[index], self.pending[index]

    def drain(self, peer_name: str) -> None:
        with peer(peer_name):
            for works in self.pending:
                for work in works:
                    work.wait()
                works.clear()


def header_buffer(device: torch.device) -> Tensor:
    return torch.zeros(3, dtype=torch.long, device=device)  # (command, iteration, weights version acted with)


class PlayerOutbox:
    """A player's messages to the trainers, one per iteration: a header, then each trainer's shard of the rows
    (or, with --share-data, all rows). A command without rows (save, stop) sends the slot's rows as they are,
    so that every slot has the same two messages and a trainer can post its receives for the next one early."""

    def __init__(self, cfg: RunConfig, topology: Topology, rows: int, width: int, lag: LagBound) -> None:
        self.topology, self.rows, self.share_data = topology, rows, cfg.share_data
        device = topology.comm_device
        self.shards = [rows] * topology.num_trainers if cfg.share_data else shard_sizes(rows, topology.num_trainers)
        self.shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, SCATTER_STREAM, topology.rank))

        def slot() -> list[Tensor]:
            return [
                header_buffer(device),
                *(torch.zeros(size, width, dtype=torch.uint8, device=device) for size in self.shards),
            ]

        self.ring = Ring(lag.ring_depth, slot)

    def send_batch(self, iteration: int, acted_with: int, rows: Tensor) -> None:
        if self.share_data:
            parts = [rows] * len(self.shards)
        else:  # each trainer a random, disjoint shard
            parts = rows[torch.randperm(self.rows, generator=self.shuffle).to(rows.device)].split(self.shards)
        self._send(Command.BATCH, iteration, acted_with, parts)

    def send_command(self, command: Command, iteration: int) -> None:
        self._send(command, iteration, 0)

    def _send(self, command: Command, iteration: int, acted_with: int, parts: list[Tensor] | None = None) -> None:
        (header, *buffers), pending = self.ring.take("a trainer")
        header[0], header[1], header[2] = int(command), iteration, acted_with
        pending.extend(dist.isend(header, trainer) for trainer in self.topology.trainers)
        for index, (buffer, trainer) in enumerate(zip(buffers, self.topology.trainers, strict=True)):
            if parts is not None:
                buffer.copy_(parts[index])
            pending.append(dist.isend(buffer, trainer))

    def drain(self) -> None:
        self.ring.drain("a trainer")


class TrainerInbox:
    """A trainer's side of the players' messages: one header from each player per slot, then the rows.

    The rows of all players land in one buffer (the union of their batches), in player order. Two
    slots of buffers take turns: once a slot's messages are in, the next slot's receives are posted
    into the other (every slot up to the players' stop has its messages), so they arrive while this
    trainer trains on the rows just received.
    """

    def __init__(self, topology: Topology, rows_per_player: list[int], width: int, share_data: bool) -> None:
        self.topology = topology
        index, trainers = topology.trainer_index, topology.num_trainers
        self.from_player = [rows if share_data else shard_sizes(rows, trainers)[index] for rows in rows_per_player]
        self.slots = [self._slot(width) for _ in range(2)]
        self.current = 0  # the slot whose messages were received last
        self.posted: list[tuple[int, dist.Work]] | None = None  # (player, receive) of the next slot

    def _slot(self, width: int) -> tuple[list[Tensor], Tensor]:
        rows = torch.zeros(sum(self.from_player), width, dtype=torch.uint8, device=self.topology.comm_device)
        return [header_buffer(self.topology.comm_device) for _ in self.topology.players], rows

    @property
    def rows(self) -> Tensor:
        """The rows of the slot received last."""
        return self.slots[self.current][1]

    def post(self, slot: int) -> None:
        """Post the receives of the next slot's messages into `slot`'s buffers."""
        headers, rows = self.slots[slot]
        players = self.topology.players
        # In the order each player sends them: its header, then its rows.
        messages = [*zip(players, headers, strict=True), *zip(players, rows.split(self.from_player), strict=True)]
        self.posted = [(player, dist.irecv(buffer, player)) for player, buffer in messages]

    def receive(self, updates_done: int) -> tuple[Command, int, int]:
        """The next slot: (command, iteration, policy lag: the most any player's weights trail `updates_done`)."""
        slot = 1 - self.current
        if self.posted is None:
            self.post(slot)
        assert self.posted is not None
        for player, work in self.posted:
            with peer(self.topology.role_name(player)):
                work.wait()
        self.current, self.posted = slot, None
        headers = [header.tolist() for header in self.slots[slot][0]]  # each read once, as a whole
        commands = {(command, iteration) for command, iteration, _ in headers}
        if len(commands) != 1:
            raise RuntimeError(f"the players sent different commands in one slot: {sorted(commands)}")
        ((command, iteration),) = commands
        if command != Command.STOP:  # the players send on until they stop
            self.post(1 - slot)
        lag = max(updates_done - acted_with for _, _, acted_with in headers)
        return Command(command), iteration, lag


def trainer_shard(topology: Topology, rows_per_player: list[int], share_data: bool) -> DataShard:
    """What a trainer trains on: its part of the shared union, or the shards it is sent (which may
    differ by a row between trainers; the largest sets every trainer's number of steps)."""
    trainers, index = topology.num_trainers, topology.trainer_index
    if share_data:  # every trainer holds the whole union and trains on its part of it
        return DataShard(sum(rows_per_player), trainers, index)
    received = [sum(shard_sizes(rows, trainers)[trainer] for rows in rows_per_player) for trainer in range(trainers)]
    return DataShard(received[index], largest_rows=max(received))


class WeightsOutbox:
    """A trainer's side: each update's statistics and weights to the players it serves."""

    def __init__(self, topology: Topology, message_size: int, lag: LagBound, timeout_seconds: float) -> None:
        self.receivers = topology.weights_receivers(topology.rank)
        self.ring = Ring(lag.ring_depth, lambda: [torch.zeros(message_size, device=topology.comm_device)])
        self.store = job_store_client(timeout_seconds) if lag.take_newest and self.receivers else None
        self.published_key = PUBLISHED_KEY.format(topology.rank)

    def send(self, message: Tensor) -> None:
        (buffer,), pending = self.ring.take("a player")
        buffer.copy_(message)
        pending.extend(dist.isend(buffer, player) for player in self.receivers)
        if self.store is not None:  # players that take the newest weights read how many are on their way
            self.store.add(self.published_key, 1)

    def drain(self) -> None:
        self.ring.drain("a player")


class WeightsInbox:
    """A player's side: receive updates in order, at least up to the version its lag bound requires.

    The receive of the next update is posted as soon as a batch whose update has not arrived has
    been sent: the update then travels while the player collects.
    """

    def __init__(self, topology: Topology, message_size: int, lag: LagBound, timeout_seconds: float) -> None:
        self.lag = lag
        self.sender = topology.weights_sender(topology.rank)
        self.sender_name = topology.role_name(self.sender)
        self.message = torch.zeros(message_size, device=topology.comm_device)
        self.store = job_store_client(timeout_seconds) if lag.take_newest else None
        self.published_key = PUBLISHED_KEY.format(self.sender)
        self.version = 0  # updates received
        self.posted: dist.Work | None = None  # the receive of update `version + 1`
        self.wait_seconds = 0.0  # spent waiting for updates: a player that waits long is bound by the trainers

    def catch_up(self, batches_sent: int, on_update: Callable[[int, Tensor], None], everything: bool = False) -> None:
        """Receive the updates this player must (or, taking the newest, may) act with, calling
        `on_update(version, message)` for each; `everything`: the updates of every batch sent."""
        target = batches_sent if everything else self.lag.required_version(batches_sent)
        if self.store is not None and target < batches_sent:  # a store round trip, never a wait
            target = max(target, min(batches_sent, self.store.add(self.published_key, 0)))
        while self.version < target:
            self.post_next(batches_sent)
            assert self.posted is not None
            waiting_since = time.perf_counter()
            with peer(self.sender_name):
                self.posted.wait()
            self.wait_seconds += time.perf_counter() - waiting_since
            self.posted = None
            self.version += 1
            on_update(self.version, self.message)
        self.post_next(batches_sent)

    def post_next(self, batches_sent: int) -> None:
        """Post the receive of the next update, if its batch has been sent (so it will come) and none is posted."""
        if self.posted is None and self.version < batches_sent:
            self.posted = dist.irecv(self.message, self.sender)


INTERRUPT, FINISH = "interrupt", "finish"  # why the players stop: Ctrl-C, or a request to end the run finished


class StopAgreement:
    """The iteration at which every player stops after Ctrl-C or a request to finish, and why, agreed through
    the job's store.

    The first player to see a stop proposes an iteration no player can have passed yet (`LagBound.check_none_passed`;
    before every player sends batches, none runs past the next stop check, where they meet). Ctrl-C wins over a
    request to finish.
    A SIGTERM that reached a trainer or the evaluator alone (`StopAsker`) asks the players for the stop that
    Ctrl-C asks for, as their own does: they find it in the store at their stop checks.
    """

    def __init__(self, topology: Topology, lag: LagBound, timeout_seconds: float) -> None:
        self.alone = topology.num_players == 1
        self.lag = lag
        self.store = job_store_client(timeout_seconds)
        self.stop_at: int | None = None
        self.reason = ""

    def check(self, iteration: int, wanted: Requests, next_check: Callable[[int], int]) -> str | None:
        """At an iteration where the players check for a stop (`next_check` finds the next one): why they stop here
        (INTERRUPT or FINISH), or None to go on."""
        if self.stop_at is None:
            interrupt = wanted.interrupt or self.store.check([STOP_ASKED_KEY])
            reason = INTERRUPT if interrupt else FINISH if wanted.finish else ""
            if self.alone:
                self.stop_at, self.reason = (iteration, reason) if reason else (None, "")
            else:
                if reason:
                    proposal = f"{self.lag.check_none_passed(iteration, next_check)} {reason}"
                    agreed = self.store.compare_set(STOP_KEY, "", proposal)
                elif self.store.check([STOP_KEY]):
                    agreed = self.store.get(STOP_KEY)
                else:
                    return None
                stop_at, self.reason = agreed.decode().split()
                self.stop_at = int(stop_at)
        return self.reason if self.stop_at is not None and iteration >= self.stop_at else None


class ClockCheckpoints:
    """`--checkpoint-every TIME` among several players: the lead keeps the clock, and when it is due proposes
    through the job's store (on `store`, the stop agreement's connection) an iteration no player can have passed
    yet, as a stop is proposed; every player checkpoints there."""

    def __init__(self, topology: Topology, lag: LagBound, store: dist.Store) -> None:
        self.is_lead = topology.rank == LEAD_PLAYER
        self.lag = lag
        self.store = store
        self.taken = 0  # checkpoints by the clock so far
        self.at: int | None = None  # the iteration of the next one, once proposed

    def check(self, iteration: int, due: bool, next_check: Callable[[int], int]) -> bool:
        """At an iteration where the players check for a stop: whether they checkpoint here. `due`: the lead's
        clock says a checkpoint is due (the other players' clocks are not asked)."""
        key = CHECKPOINT_KEY.format(self.taken)
        if self.at is None:
            if self.is_lead and due:
                self.at = self.lag.check_none_passed(iteration, next_check)
                self.store.set(key, str(self.at))
            elif not self.is_lead and self.store.check([key]):
                self.at = int(self.store.get(key))
        if self.at is None or iteration < self.at:
            return False
        self.taken, self.at = self.taken + 1, None
        return True


class StopAsker:
    """A trainer's or the evaluator's SIGTERM, passed on to the players (`StopAgreement`) through the job's store;
    called from the signal handler, on a store connection made beforehand."""

    def __init__(self, timeout_seconds: float) -> None:
        self.store = job_store_client(timeout_seconds)

    def __call__(self) -> None:
        # Where the store cannot be reached the players never hear of it, and the held SIGTERM gives up in time.
        with contextlib.suppress(RuntimeError, OSError):
            self.store.set(STOP_ASKED_KEY, "1")


def send_state(state: dict, destination: int, peer_name: str) -> None:
    """A rare, irregular message (a learner's or a player's checkpoint state): pickled."""
    with peer(peer_name):
        dist.send_object_list([to_cpu(state)], dst=destination)


def receive_state(source: int, peer_name: str) -> dict:
    received: list = [None]
    with peer(peer_name):
        dist.recv_object_list(received, src=source)
    return received[0]
