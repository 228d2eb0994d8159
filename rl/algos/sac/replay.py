"""A replay buffer of preallocated tensors: a ring of transitions, sampled uniformly."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from rl.batch import Column
from rl.errors import UsageError


class ReplayBuffer:
    """`capacity` transitions in one tensor per column; the oldest are overwritten first."""

    def __init__(self, capacity: int, columns: dict[str, Column], device: torch.device) -> None:
        self.capacity = capacity
        self.columns = columns
        self.storage = {
            name: torch.zeros((capacity, *column.shape), dtype=column.dtype, device=device)
            for name, column in columns.items()
        }
        self.position = 0  # where the next transition goes
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, **rows: Tensor) -> None:
        """Append one row per env (every column with the same number of rows), wrapping around."""
        count = next(iter(rows.values())).shape[0]
        end = self.position + count
        if end <= self.capacity:
            for name, values in rows.items():
                self.storage[name][self.position : end] = values
        else:  # the rows straddle the end of the ring
            index = torch.arange(self.position, end, device=self.device) % self.capacity
            for name, values in rows.items():
                self.storage[name][index] = values
        self.position = end % self.capacity
        self.size = min(self.size + count, self.capacity)

    @property
    def device(self) -> torch.device:
        return next(iter(self.storage.values())).device

    def sample(self, rows: int, generator: torch.Generator) -> dict[str, Tensor]:
        """`rows` transitions drawn uniformly, with replacement, from what the buffer holds."""
        index = torch.randint(self.size, (rows,), generator=generator, device=self.device)
        return {name: values[index] for name, values in self.storage.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "size": self.size,
            # A copy of the rows held: torch.save writes a view's whole storage, the empty rows included.
            "storage": {name: values[: self.size].to("cpu", copy=True) for name, values in self.storage.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_buffer_holds(state["size"], self.capacity)
        for name, values in state["storage"].items():
            self.storage[name][: len(values)] = values.to(self.device)
        self.position, self.size = state["position"], state["size"]


def check_buffer_holds(saved_rows: int, capacity: int) -> None:
    """Refuse a checkpoint's buffer of more transitions than a rank's buffer here holds."""
    if saved_rows > capacity:
        message = f"the checkpoint's buffer holds {saved_rows} transitions, more than {capacity}"
        raise UsageError("--buffer-size", message)


def buffer_bytes(capacity: int, columns: dict[str, Column]) -> int:
    row = sum(column.width * torch.empty((), dtype=column.dtype).element_size() for column in columns.values())
    return capacity * row


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


def check_buffer_fits(capacity: int, columns: dict[str, Column], processes_here: int, on_gpu: bool = False) -> None:
    """Refuse, before anything is allocated, a buffer that this machine's memory cannot hold.

    On the GPU each process has a device of its own; on the CPU the processes here share the memory.
    """
    if on_gpu:
        available, holders, where = torch.cuda.mem_get_info()[0], 1, "its GPU has"
    else:
        available, holders, where = available_memory_bytes(), processes_here, "this machine has"
    needed = buffer_bytes(capacity, columns) * holders
    if available is not None and needed > available:
        gib = 2**30
        raise UsageError(
            "--buffer-size",
            f"{holders} replay buffer(s) of {capacity:,} transitions need {needed / gib:.1f} GiB, "
            f"but {where} {available / gib:.1f} GiB available; lower --buffer-size",
        )
