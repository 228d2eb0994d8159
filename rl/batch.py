"""Batches of transitions as named tensors, their wire format, and how learners split them.

Every algorithm's batch is a dataclass of tensors with one row per transition. A mode moves it
between processes as one byte matrix (`RowCodec`), so it travels in a single collective into a
buffer allocated once, never as a pickled object, and each column keeps its dtype on the way
(uint8 images stay one byte a pixel).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import torch
from torch import Tensor

from rl.uploads import to_device

Batch = TypeVar("Batch", bound="TensorBatch")


def joined(values: list[Tensor]) -> Tensor:
    """1-D tensors as one (without a copy where there is one)."""
    return values[0] if len(values) == 1 else torch.cat(values)


@dataclass
class TensorBatch:
    """A dataclass of tensors that share their first dimension."""

    def __len__(self) -> int:
        return getattr(self, fields(self)[0].name).shape[0]

    def map(self: Batch, fn: Callable[[Tensor], Tensor]) -> Batch:
        return type(self)(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def tensors(self) -> list[Tensor]:
        """The fields in their order (`type(batch)(*batch.tensors())` rebuilds it)."""
        return [getattr(self, f.name) for f in fields(self)]


@dataclass(frozen=True)
class Column:
    """One field of a batch: its shape per row, its dtype, and whether it stays on the host (where the
    learner reads it without waiting for the device) when the rest of the batch moves to the device."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    on_host: bool = False

    @property
    def width(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.width * torch.empty((), dtype=self.dtype).element_size()


class RowCodec(Generic[Batch]):
    """A batch as one uint8 matrix, a row per transition, so it moves in one collective.

    Each column's values travel as their own bytes: exact, whatever the dtype.
    """

    def __init__(self, batch_type: type[Batch], columns: dict[str, Column]) -> None:
        if [f.name for f in fields(batch_type)] != list(columns):
            raise ValueError(f"columns {list(columns)} do not match {batch_type.__name__}")
        self.batch_type = batch_type
        self.columns = columns
        self.slices = {}
        start = 0
        for name, column in columns.items():
            self.slices[name] = slice(start, start + column.bytes)
            start += column.bytes
        self.width = start  # bytes per row

    def empty_rows(self, rows: int, device: torch.device | str = "cpu") -> Tensor:
        return torch.zeros(rows, self.width, dtype=torch.uint8, device=device)

    def pack(self, batch: Batch, out: Tensor) -> None:
        for name, column in self.columns.items():
            values = getattr(batch, name).to(column.dtype).reshape(len(batch), -1).contiguous()
            out[:, self.slices[name]] = to_device(values.view(torch.uint8), out.device)  # a host column: not waited for

    def unpack(self, rows: Tensor, host_rows: Tensor | None = None) -> Batch:
        """The batch in `rows`; its columns kept on the host come from `host_rows`, those rows on the host
        (if `rows` are on the device)."""
        return self.batch_type(
            **{
                name: self.column(host_rows if column.on_host and host_rows is not None else rows, name)
                for name, column in self.columns.items()
            }
        )

    def column(self, rows: Tensor, name: str) -> Tensor:
        """Column `name` of `rows` (a copy, unless it is their only column)."""
        column = self.columns[name]
        part = rows[:, self.slices[name]]
        if part.shape[1] != rows.shape[1]:
            # A fresh copy, aligned for the column's dtype: `contiguous()` would keep a single row's
            # stride and offset, which need not be multiples of the dtype's size.
            part = part.clone(memory_format=torch.contiguous_format)
        return part.view(column.dtype).reshape(len(rows), *column.shape)


@dataclass(frozen=True)
class DataShard:
    """Which part of each batch a learner trains on, as the mode lays the data out.

    `rows`: rows in each batch this learner receives. `shards` learners split those rows, and
    this one takes part `index`. `largest_rows`: when learners receive different numbers of rows
    (uneven scattered shards), the largest count, so every learner takes the same number of
    synchronized steps.
    """

    rows: int
    shards: int = 1
    index: int = 0
    largest_rows: int | None = None


def shard_sizes(rows: int, num_shards: int) -> list[int]:
    """Near-equal shard sizes; the first `rows % num_shards` shards hold one row more."""
    return [rows // num_shards + (index < rows % num_shards) for index in range(num_shards)]


def shard_slice(rows: int, num_shards: int, index: int) -> slice:
    """The rows of shard `index` when `rows` rows are split by `shard_sizes`."""
    sizes = shard_sizes(rows, num_shards)
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])
