"""Optimization helpers every algorithm shares: a lean gradient clip that also stops divergence,
and gradients kept in one flat buffer for a single collective."""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import Tensor, nn


class TrainingDiverged(Exception):
    """A loss or gradient stopped being finite; the step that would spread it was not taken."""


@torch.no_grad()
def clip_grad_norm(parameters: list[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients so their global norm is at most `max_norm` (0: no clipping); return the norm.

    The same arithmetic as `torch.nn.utils.clip_grad_norm_`, without its per-call grouping of
    tensors by device and dtype, which costs as much as the clipping itself for these small nets.
    The gradients are the learners' averages, identical on every rank, so a non-finite norm stops
    every rank at the same step, before the optimizer spreads it into the weights.
    """
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if not torch.isfinite(total_norm):
        raise TrainingDiverged("the gradient norm is not finite (a loss became NaN or infinite)")
    if max_norm > 0:
        torch._foreach_mul_(grads, (max_norm / (total_norm + 1e-6)).clamp_(max=1.0))
    return total_norm


class FlatGradients:
    """The gradients of consecutive parameter groups as views into one buffer.

    Backward passes write (accumulate) into the views, so a run of consecutive groups is one
    contiguous tensor (`span`) that a single collective averages across learners, and zeroing
    is one call. Optimizers must not reset these gradients to None.
    """

    def __init__(self, *groups: list[Tensor]) -> None:
        parameters = [parameter for group in groups for parameter in group]
        group_sizes = [sum(parameter.numel() for parameter in group) for group in groups]
        self.buffer = torch.zeros(sum(group_sizes), dtype=parameters[0].dtype, device=parameters[0].device)
        self.starts = list(accumulate(group_sizes, initial=0))
        views = self.buffer.split([parameter.numel() for parameter in parameters])
        for parameter, view in zip(parameters, views, strict=True):
            parameter.grad = view.view_as(parameter)

    def span(self, first: int, last: int) -> Tensor:
        """The gradients of groups `first` to `last` (inclusive), as one view."""
        return self.buffer[self.starts[first] : self.starts[last + 1]]


def flat_parameters(module: nn.Module) -> Tensor:
    """Every parameter of `module` in one detached vector (the weights a mode ships to players)."""
    return torch.nn.utils.parameters_to_vector(module.parameters()).detach()


def load_flat_parameters(module: nn.Module, flat: Tensor) -> None:
    """Copy into the existing parameters (`vector_to_parameters` would make them views of `flat`,
    whose different alignment takes other CPU kernel paths and rounds differently)."""
    params = list(module.parameters())
    chunks = flat.to(params[0].device).split([p.numel() for p in params])
    with torch.no_grad():
        for param, chunk in zip(params, chunks, strict=True):
            param.copy_(chunk.view_as(param))


def num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
