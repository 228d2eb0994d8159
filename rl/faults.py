"""When a process of the job dies: name it, and end the survivors instead of leaving them waiting.

The launcher stops the survivors with SIGTERM as soon as one process ends, often before any
collective notices; otherwise a collective fails with a lost connection. Either way each
survivor prints one line naming the ranks or roles whose processes have ended, and exits 1.
"""

from __future__ import annotations

import os
import signal
import socket
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from rl.errors import print_error
from rl.optim import TrainingDiverged

LOST_CONNECTION = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out")


class PeerLost(Exception):
    """A collective failed because the process on the other side is gone."""

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(peer)
        self.peer = peer
        self.detail = detail.splitlines()[0] if detail else "no detail"


@contextmanager
def peer(name: str) -> Iterator[None]:
    """Turn the failure of a collective whose other side is gone into `PeerLost(name)`."""
    try:
        yield
    except RuntimeError as error:  # gloo raises DistBackendError, or a plain RuntimeError from a DDP hook
        if isinstance(error, dist.DistError) or any(sign in str(error) for sign in LOST_CONNECTION):
            raise PeerLost(name, str(error)) from None
        raise


def _host_id() -> int:
    return zlib.crc32(socket.gethostname().encode())


def gather_process_ids(device: torch.device) -> Tensor:
    """(host id, pid) of every rank, so a survivor can tell whose process has ended."""
    own = torch.tensor([_host_id(), os.getpid()], dtype=torch.long, device=device)
    if not dist.is_initialized():
        return own.unsqueeze(0).cpu()
    every = [torch.zeros_like(own) for _ in range(dist.get_world_size())]
    dist.all_gather(every, own)
    return torch.stack(every).cpu()


def _process_ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie has ended, whether or not its parent has reaped it yet


def ended_ranks(process_ids: Tensor, own_rank: int) -> list[int]:
    """Ranks on this host whose processes have ended (other hosts cannot be checked from here)."""
    host = _host_id()
    return [
        rank
        for rank, (rank_host, pid) in enumerate(process_ids.tolist())
        if rank != own_rank and rank_host == host and _process_ended(pid)
    ]


@contextmanager
def report_lost_peers(own_rank: int, name: Callable[[int], str], process_ids: Tensor) -> Iterator[None]:
    """End this process with a line naming what failed, instead of hanging or a traceback."""
    role = name(own_rank)

    def ended() -> str:
        return " and ".join(name(rank) for rank in ended_ranks(process_ids, own_rank))

    def stopped_by_launcher(signum: int, frame: object) -> None:
        print_error(f"error: {role}: stopped by the launcher because {ended() or 'another process'} ended")
        os._exit(1)

    previous = signal.signal(signal.SIGTERM, stopped_by_launcher)
    try:
        yield
    except TrainingDiverged:
        raise  # every rank finds it at the same step, whether or not a peer has already exited over it
    except Exception as error:
        # Once a peer is gone, whatever failed here follows from that: name the lost peer, never
        # this process's symptom as if it were the cause.
        gone = ended()
        if gone:  # seen on this host: the peer's process is gone
            print_error(f"error: {role}: lost {gone}: its process ended")
        elif isinstance(error, PeerLost):  # on another host, or already reaped: what the collective saw
            print_error(f"error: {role}: lost {error.peer}: {error.detail}")
        else:
            raise
        os._exit(1)  # the process group is broken: skip its teardown, which could block
    finally:
        signal.signal(signal.SIGTERM, previous)
