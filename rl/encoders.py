"""Observation encoders chosen by the observation space: image Boxes get the Nature-DQN CNN, Dict
observations with images a CNN per image key beside an MLP for the vectors.

Images arrive as uint8, in any of the layouts envs and frame stacks produce, and become float
in [0, 1], channels first, inside the encoder: on the device that trains, never before, so
rollouts, replay buffers and messages carry one byte a pixel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl.errors import UsageError
from rl.multi_input import MultiInputLayout, is_image_space, packed_layout

EncoderKind = Literal["auto", "mlp", "cnn"]
NATURE_FEATURES = 512
NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels out, kernel, stride) of each convolution
NATURE_MIN_SIDE = 36  # the smallest image its three convolutions reduce to one pixel
VECTOR_FEATURES = 64  # the units of the MLP that encodes a Dict observation's vector keys


class ImageLayout:
    """Where an image observation keeps its channels, and how to put them first.

    - (H, W): one channel;
    - (C, H, W) or (H, W, C): channels are the shorter end (frame stacks come first, colour last);
    - (S, H, W, C): S stacked colour frames, S x C channels.
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        if not 2 <= len(shape) <= 4:
            raise ValueError(f"an image observation has 2 to 4 dimensions, got shape {shape}")
        self.shape = tuple(shape)
        self.channels_last = len(shape) == 4 or (len(shape) == 3 and shape[-1] < shape[0])

    @property
    def chw(self) -> tuple[int, int, int]:
        shape = self.shape
        if len(shape) == 2:
            return 1, shape[0], shape[1]
        if len(shape) == 4:
            return shape[0] * shape[3], shape[1], shape[2]
        return (shape[2], shape[0], shape[1]) if self.channels_last else (shape[0], shape[1], shape[2])

    def to_float_chw(self, images: Tensor) -> Tensor:
        """A batch of uint8 images [B, *shape] as float [B, C, H, W] in [0, 1]."""
        images = images.reshape(images.shape[0], *self.shape)
        if len(self.shape) == 4:
            images = images.permute(0, 1, 4, 2, 3)
        elif self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return images.reshape(images.shape[0], *self.chw).float().div_(255.0)


class NatureCNN(nn.Module):
    """Mnih et al. (2015): 32 8x8/4, 64 4x4/2, 64 3x3/1 convolutions, then 512 units, all ReLU."""

    def __init__(self, obs_shape: tuple[int, ...], features: int = NATURE_FEATURES) -> None:
        super().__init__()
        self.layout = ImageLayout(obs_shape)
        channels, height, width = self.layout.chw
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in NATURE_CONVS:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride=stride), nn.ReLU()]
            channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        self.linear = nn.Linear(channels * _conv_side(height) * _conv_side(width), features)
        self.features = features

    def forward(self, obs: Tensor) -> Tensor:
        # Channels-last input takes faster convolution kernels on CPU: a PPO minibatch step of 256
        # frames took 221 ms instead of 259 (benchmarks/atari.py, one thread).
        images = self.layout.to_float_chw(obs).to(self.linear.weight.dtype)  # bf16 weights take bf16 (bf16-true)
        images = images.contiguous(memory_format=torch.channels_last)
        return torch.relu(self.linear(self.convs(images)))


def _conv_side(side: int, layers: int = len(NATURE_CONVS)) -> int:
    """An image side after the first `layers` convolutions."""
    for _, kernel, stride in NATURE_CONVS[:layers]:
        side = (side - kernel) // stride + 1
    return side


class FlatPixels(nn.Module):
    """uint8 images flattened into float vectors in [0, 1], for an MLP (--encoder mlp on images)."""

    def forward(self, obs: Tensor) -> Tensor:
        return obs.reshape(obs.shape[0], -1).float().div_(255.0)


class MultiInputEncoder(nn.Module):
    """A Dict observation's keys encoded apart, then together: a Nature CNN per image key and one MLP for
    the vector keys, concatenated, then a layer of 512 ReLU units over them all (as SB3's
    `MultiInputPolicy` and sheeprl's multi-encoder follow their concatenation with an MLP).

    It takes the packed rows the experience carries, or (for export) the keys themselves, in the
    Dict's order."""

    def __init__(self, layout: MultiInputLayout, vector_hidden: int = VECTOR_FEATURES) -> None:
        super().__init__()
        self.layout = layout
        self.cnns = nn.ModuleList(NatureCNN(key.shape) for key in layout.images)
        values = sum(key.shape[0] for key in layout.vectors)
        self.mlp = vector_mlp(values, vector_hidden) if values else None
        concatenated = sum(cnn.features for cnn in self.cnns) + (vector_hidden if values else 0)
        # One layer over the keys together: features that depend on several keys at once (an image's cue
        # and a vector's), which the heads, linear in the features, could not form from each key's apart.
        self.joint = nn.Sequential(nn.Linear(concatenated, NATURE_FEATURES), nn.ReLU())
        self.features = NATURE_FEATURES

    def forward(self, obs: Tensor | Sequence[Tensor]) -> Tensor:
        parts = self.layout.unpack(obs) if isinstance(obs, Tensor) else list(obs)
        images = [part for key, part in zip(self.layout.keys, parts, strict=True) if key.image]
        features = [cnn(image) for cnn, image in zip(self.cnns, images, strict=True)]
        if self.mlp is not None:
            vectors = torch.cat([part for key, part in zip(self.layout.keys, parts, strict=True) if not key.image], 1)
            features.append(self.mlp(vectors.to(self.mlp[0].weight.dtype)))
        return self.joint(torch.cat(features, dim=1))


def vector_mlp(values: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(values, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())


def image_encoder(observation_space: gym.Space) -> nn.Module:
    """The CNN encoder of image observations: the Nature CNN, or one per image key of a Dict."""
    layout = packed_layout(observation_space)
    return NatureCNN(observation_space.shape) if layout is None else MultiInputEncoder(layout)


def uses_cnn(kind: EncoderKind, observation_space: gym.Space) -> bool:
    """Whether `--encoder kind` means the CNN for these observations; raises `UsageError` where it cannot."""
    layout = packed_layout(observation_space)
    if layout is not None:
        if kind == "mlp":
            raise UsageError("--encoder", "a Dict observation with images takes a CNN per image key; drop --encoder")
        for key in layout.images:  # as the env gives them: no flag resizes a Dict's images
            too_small = f"the image key {key.name!r} of shape {key.shape}; make the env's images larger"
            check_cnn_side(key.shape, too_small, "--env-id")
        return True
    image = is_image_space(observation_space)
    if kind == "cnn" and not image:
        raise UsageError("--encoder", f"cnn needs image observations (uint8 H x W [x C]), got {observation_space}")
    if kind == "mlp" or not image:
        return False
    shape = observation_space.shape
    check_cnn_side(shape, f"{shape}; resize them (--resize 84) or use --encoder mlp", "--resize")
    return True


def check_cnn_side(shape: tuple[int, ...], what: str, flag: str) -> None:
    if min(ImageLayout(shape).chw[1:]) < NATURE_MIN_SIDE:
        raise UsageError(
            flag, f"the CNN needs images of at least {NATURE_MIN_SIDE}x{NATURE_MIN_SIDE} pixels, got {what}"
        )


def orthogonal_init(module: nn.Module, gain: float) -> None:
    """Orthogonal weights and zero biases for every linear and convolutional layer in `module`."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.Conv2d):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


def nature_flops_per_sample(obs_shape: tuple[int, ...]) -> int:
    """Multiply-adds x 2 of one forward pass through `NatureCNN` (the compute floor's unit)."""
    channels, height, width = ImageLayout(obs_shape).chw
    flops = 0
    for layer, (out_channels, kernel, _) in enumerate(NATURE_CONVS, start=1):
        flops += 2 * _conv_side(height, layer) * _conv_side(width, layer) * out_channels * kernel * kernel * channels
        channels = out_channels
    return flops + 2 * _conv_side(height) * _conv_side(width) * channels * NATURE_FEATURES
