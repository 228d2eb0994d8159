"""Batches of transitions as named tensors, their wire format, and how learners split them.

Every algorithm's batch is a dataclass of tensors with one row per transition. A mode moves it
between processes as one float32 matrix (`RowCodec`), so it travels in a single collective into
a buffer allocated once, and never as a pickled object.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import torch
from torch import Tensor

Batch = TypeVar("Batch", bound="TensorBatch")


@dataclass
class TensorBatch:
    """A dataclass of tensors that share their first dimension."""

    def __len__(self) -> int:
        return getattr(self, fields(self)[0].name).shape[0]

    def map(self: Batch, fn: Callable[[Tensor], Tensor]) -> Batch:
        return type(self)(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})


@dataclass(frozen=True)
class Column:
    """One field of a batch: its shape per row and its dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def width(self) -> int:
        return math.prod(self.shape)


class RowCodec(Generic[Batch]):
    """A batch as one float32 matrix, a row per transition, so it moves in one collective.

    Integer actions travel as floats: exact for any index below 2**24.
    """

    def __init__(self, batch_type: type[Batch], columns: dict[str, Column]) -> None:
        if [f.name for f in fields(batch_type)] != list(columns):
            raise ValueError(f"columns {list(columns)} do not match {batch_type.__name__}")
        self.batch_type = batch_type
        self.columns = columns
        self.slices = {}
        start = 0
        for name, column in columns.items():
            self.slices[name] = slice(start, start + column.width)
            start += column.width
        self.width = start

    def pack(self, batch: Batch, out: Tensor) -> None:
        for name in self.columns:
            out[:, self.slices[name]] = getattr(batch, name).reshape(len(batch), -1)

    def unpack(self, rows: Tensor) -> Batch:
        # contiguous copies: strided views would take other kernel paths and round differently
        return self.batch_type(
            **{
                name: rows[:, self.slices[name]].contiguous().reshape(len(rows), *column.shape).to(column.dtype)
                for name, column in self.columns.items()
            }
        )


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
