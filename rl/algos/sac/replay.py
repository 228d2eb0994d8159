"""A replay buffer of preallocated tensors: a ring of transitions, sampled uniformly."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor

from rl.batch import Column
from rl.errors import UsageError
from rl.memory import check_storage_fits, storage_bytes


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

    def load_share(self, saved: list[dict[str, Any]], rank: int, ranks: int) -> None:
        """Hold share `rank` of `ranks` of the transitions that the `saved` buffers held (their `state_dict`s),
        in place of its own. Their rows are taken in step by their age within their own buffer and dealt out in
        turn, so that every share holds rows of every age, oldest first; where a share exceeds the capacity, its
        newest rows stay."""
        oldest_first = [ring_order(state["position"], state["size"]) for state in saved]
        ages = torch.cat([(torch.arange(len(rows)) + 0.5) / len(rows) for rows in oldest_first])
        dealt = torch.sort(ages, stable=True).indices[rank::ranks][-self.capacity :].contiguous()
        starts = torch.tensor([0, *itertools.accumulate(len(rows) for rows in oldest_first)])
        buffer_of = torch.searchsorted(starts, dealt, right=True) - 1  # which saved buffer each dealt row is from
        for name, values in self.storage.items():
            share = torch.empty((len(dealt), *values.shape[1:]), dtype=values.dtype)
            for index, state in enumerate(saved):
                places = (buffer_of == index).nonzero().squeeze(1)
                share[places] = state["storage"][name][oldest_first[index][dealt[places] - starts[index]]]
            values[: len(dealt)] = share.to(values.device)
        self.position, self.size = len(dealt) % self.capacity, len(dealt)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_buffer_holds(state["size"], self.capacity)
        for name, values in state["storage"].items():
            self.storage[name][: len(values)] = values.to(self.device)
        self.position, self.size = state["position"], state["size"]


def ring_order(position: int, size: int) -> Tensor:
    """The rows of a ring of `size` rows whose next row goes to `position`, oldest first."""
    return (torch.arange(size) + position) % max(size, 1)


def check_buffer_holds(saved_rows: int, capacity: int) -> None:
    """Refuse a checkpoint's buffer of more transitions than a rank's buffer here holds."""
    if saved_rows > capacity:
        message = f"the checkpoint's buffer holds {saved_rows} transitions, more than {capacity}"
        raise UsageError("--buffer-size", message)


def check_buffer_fits(capacity: int, columns: dict[str, Column], processes_here: int, gpu: int | None = None) -> None:
    """Refuse, before anything is allocated, a buffer that this machine's memory (or a GPU's) cannot hold."""
    storage = ("replay buffer", f"of {capacity:,} transitions")
    check_storage_fits(
        storage_bytes(capacity, columns), processes_here, gpu, "--buffer-size", storage, "lower --buffer-size"
    )
