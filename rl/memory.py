"""Storage a run allocates whole at its start (SAC's replay buffer, PPO's rollout), checked against the memory it
goes into before any of it is allocated: a run that cannot hold it stops with one line naming the flag to lower,
instead of the allocator's traceback, or the out-of-memory killer, later."""

from __future__ import annotations

import os

import torch

from rl.batch import Column
from rl.errors import UsageError, counted

GIB = 2**30


def storage_bytes(rows: int, columns: dict[str, Column]) -> int:
    """The bytes of `rows` rows of `columns`."""
    return rows * sum(column.bytes for column in columns.values())


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
    return pages * os.sysconf("SC_PAGE_SIZE") if pages else None


def check_storage_fits(
    bytes_each: int, processes_here: int, gpu: int | None, flag: str, storage: tuple[str, str], fix: str
) -> None:
    """Refuse storage of `bytes_each` per process that its memory cannot hold. `storage`: what it is, as a noun and
    what follows it ("replay buffer", "of 1,000 transitions"); `fix`: what to do ("lower --buffer-size").

    On a GPU (`gpu`, this machine's index of it) each process has a device of its own; on the CPU (None) the
    `processes_here` share this machine's memory.
    """
    if gpu is not None:
        available, holders, where = torch.cuda.mem_get_info(gpu)[0], 1, "its GPU has"
    else:
        available, holders, where = available_memory_bytes(), processes_here, "this machine has"
    needed, (noun, detail) = bytes_each * holders, storage
    if available is not None and needed > available:
        raise UsageError(
            flag,
            f"{counted(holders, noun)} {detail} need{'s' if holders == 1 else ''} {needed / GIB:.1f} GiB, but {where} "
            f"{available / GIB:.1f} GiB available; {fix}",
        )
