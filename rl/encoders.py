"""Observation encoders chosen by the observation space: image Boxes get the Nature-DQN CNN.

Images arrive as uint8, in any of the layouts envs and frame stacks produce, and become float
in [0, 1], channels first, inside the encoder: on the device that trains, never before, so
rollouts, replay buffers and messages carry one byte a pixel.
"""

from __future__ import annotations

from typing import Literal

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl.envs import is_image_space
from rl.errors import UsageError

EncoderKind = Literal["auto", "mlp", "cnn"]
NATURE_FEATURES = 512
NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels out, kernel, stride) of each convolution
NATURE_MIN_SIDE = 36  # the smallest image its three convolutions reduce to one pixel


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


def uses_cnn(kind: EncoderKind, observation_space: gym.Space) -> bool:
    """Whether `--encoder kind` means the CNN for these observations; raises `UsageError` where it cannot."""
    image = is_image_space(observation_space)
    if kind == "cnn" and not image:
        raise UsageError("--encoder", f"cnn needs image observations (uint8 H x W [x C]), got {observation_space}")
    if kind == "mlp" or not image:
        return False
    side = min(ImageLayout(observation_space.shape).chw[1:])
    if side < NATURE_MIN_SIDE:
        raise UsageError(
            "--resize",
            f"the CNN needs images of at least {NATURE_MIN_SIDE}x{NATURE_MIN_SIDE} pixels, "
            f"got {observation_space.shape}; resize them (--resize 84) or use --encoder mlp",
        )
    return True


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
