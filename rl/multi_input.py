"""Dict observations with images and vectors: each key in its own dtype, carried as one row of bytes.

An env whose observation is a Dict of uint8 images (H x W, with channels first or last, possibly
stacked) and vectors (Boxes, choices one-hot, as gymnasium flattens them) is trained on with a
CNN per image key and an MLP for the vectors (`rl.encoders.MultiInputEncoder`), as
Stable-Baselines3's `MultiInputPolicy` and sheeprl's `cnn_keys`/`mlp_keys` do.

Between the env and the encoder an observation is one uint8 row: the vectors' float32 bytes
first, then each image's bytes. Rollouts, replay buffers, checkpoints and the messages between
processes carry that row like any other observation, so images stay one byte a pixel, vectors
stay float32 bit for bit, and no mode or buffer needs a case of its own. The encoder reads the
row back into its keys on the device that trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

FLOAT_BYTES = 4


def is_image_space(space: gym.Space) -> bool:
    """A uint8 Box of 2 to 4 dimensions: H x W, with channels first or last, possibly stacked frames."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and 2 <= len(space.shape) <= 4


def is_vector_leaf(space: gym.Space) -> bool:
    """A Box that is not an image, a number or a choice: gymnasium flattens it into float32 values."""
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        children = space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces
        return all(is_vector_leaf(child) for child in children)
    vectors = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    return isinstance(space, vectors) and not is_image_space(space)


def is_multi_input_space(space: gym.Space) -> bool:
    """A Dict with at least one image key, whose other keys are vectors, numbers or choices."""
    if not isinstance(space, gym.spaces.Dict):
        return False
    keys = space.spaces.values()
    return any(is_image_space(key) for key in keys) and all(is_image_space(key) or is_vector_leaf(key) for key in keys)


@dataclass(frozen=True)
class KeyInput:
    """One key of the observation: where its bytes lie in the row, and what it is."""

    name: str
    shape: tuple[int, ...]  # an image's own shape, or (values,) for a vector key
    image: bool
    start: int  # byte offset in the row
    size: int  # bytes

    @property
    def dtype_name(self) -> str:
        return "uint8" if self.image else "float32"


class MultiInputLayout:
    """Where each key of a Dict observation lies in its row of bytes: the vectors' float32 values first,
    then the images."""

    def __init__(self, space: gym.spaces.Dict) -> None:
        self.space = space
        keys: list[KeyInput] = []
        start = 0
        for name, key in space.spaces.items():
            if not is_image_space(key):
                values = gym.spaces.flatdim(key)
                keys.append(KeyInput(name, (values,), False, start, values * FLOAT_BYTES))
                start += values * FLOAT_BYTES
        self.vector_bytes = start
        for name, key in space.spaces.items():
            if is_image_space(key):
                keys.append(KeyInput(name, tuple(key.shape), True, start, int(np.prod(key.shape))))
                start += keys[-1].size
        self.row_bytes = start
        order = list(space.spaces)
        self.keys = sorted(keys, key=lambda key: order.index(key.name))  # the Dict's own order

    @property
    def images(self) -> list[KeyInput]:
        return [key for key in self.keys if key.image]

    @property
    def vectors(self) -> list[KeyInput]:
        return [key for key in self.keys if not key.image]

    def pack(self, obs: dict[str, Any]) -> np.ndarray:
        """One observation of the Dict as its row of bytes."""
        row = np.zeros(self.row_bytes, dtype=np.uint8)
        for key in self.keys:
            value = obs[key.name]
            if key.image:
                row[key.start : key.start + key.size] = np.asarray(value, dtype=np.uint8).reshape(-1)
            else:
                flat = gym.spaces.flatten(self.space.spaces[key.name], value).astype(np.float32)
                row[key.start : key.start + key.size] = flat.view(np.uint8)
        return row

    def vector_values(self, rows: np.ndarray) -> np.ndarray:
        """The vectors' float32 values of rows of bytes [B, row_bytes], as [B, values] (a copy)."""
        return np.ascontiguousarray(rows[:, : self.vector_bytes]).view(np.float32)

    def vector_key_at(self, column: int) -> str:
        """The vector key that holds `column` of `vector_values`."""
        start = column * FLOAT_BYTES
        return next(key.name for key in self.vectors if key.start <= start < key.start + key.size)

    def unpack(self, rows: Tensor) -> list[Tensor]:
        """A batch of rows [B, row_bytes] as its keys, in the Dict's order: uint8 images [B, *shape] and
        float32 vectors [B, values]."""
        values = None
        if self.vector_bytes:  # a fresh copy of the vectors' bytes: aligned for float32 wherever the rows lie
            vector_bytes = rows[:, : self.vector_bytes].clone(memory_format=torch.contiguous_format)
            values = vector_bytes.view(torch.float32)
        keys = []
        for key in self.keys:
            if key.image:
                keys.append(rows[:, key.start : key.start + key.size].reshape(rows.shape[0], *key.shape))
            else:
                assert values is not None
                first = key.start // FLOAT_BYTES
                keys.append(values[:, first : first + key.shape[0]])
        return keys

    def example_inputs(self, rows: int) -> list[Tensor]:
        """A batch of `rows` sampled observations, as the keys that `unpack` gives."""
        packed = np.stack([self.pack(self.space.sample()) for _ in range(rows)])
        return [key.clone() for key in self.unpack(torch.from_numpy(packed))]


class PackedSpace(gym.spaces.Box):
    """The rows of bytes that a Dict observation with images is carried as, with the layout to read them."""

    def __init__(self, layout: MultiInputLayout) -> None:
        super().__init__(0, 255, shape=(layout.row_bytes,), dtype=np.uint8)
        self.layout = layout

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackedSpace) and other.layout.space == self.layout.space

    def __hash__(self) -> int:
        return hash((PackedSpace, self.shape))

    def __repr__(self) -> str:  # named in messages as the env's own space, which it stands for
        return repr(self.layout.space)


class PackObservations(gym.ObservationWrapper):
    """The env's Dict observations, each as the row of bytes of its layout."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.layout = MultiInputLayout(env.observation_space)
        self.observation_space = PackedSpace(self.layout)

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        return self.layout.pack(observation)


def packed_layout(space: gym.Space) -> MultiInputLayout | None:
    """The layout of a space of packed Dict observations; None for any other space."""
    return space.layout if isinstance(space, PackedSpace) else None


def pack_each(layout: MultiInputLayout, obs: dict[str, Any] | Sequence[dict[str, Any]]) -> np.ndarray:
    """One Dict observation as its row, or a list of them as rows (none for an empty list)."""
    if isinstance(obs, dict):
        return layout.pack(obs)
    rows = [layout.pack(one) for one in obs]
    return np.stack(rows) if rows else np.empty((0, layout.row_bytes), np.uint8)
