"""Optimization helpers every algorithm shares: a lean gradient clip, a divergence check that never
waits for the GPU, and gradients kept in one flat buffer for a single collective."""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import Tensor, nn


class TrainingDiverged(Exception):
    """A loss or gradient stopped being finite; the steps that would have spread it were not taken."""


class DivergenceGuard:
    """Skips, on the device, every optimizer step from the first whose gradients are not finite, and says so
    at the next check.

    Reading a norm on the host at each step would make the host wait for the GPU at each step.
    Instead one kernel per step marks `found_inf` where a gradient is not finite (the check of
    AMP's loss scaler, with a scale of 1); fused Adam reads it and leaves the weights and its
    moments as they were. The mark stays, so the weights stay those of the last finite step, and
    `raise_if_diverged`, where the host reads its statistics anyway, turns it into
    `TrainingDiverged`. The gradients are the learners' averages, the same on every rank, so every
    rank stops at the same check.
    """

    def __init__(self, device: torch.device) -> None:
        self.found_inf = torch.zeros((), device=device)  # as fused Adam reads it: 1.0 skips the step
        self.unit_scale = torch.ones((), device=device)

    def guard(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Have these (fused) optimizers skip the steps this guard finds non-finite."""
        for optimizer in optimizers:
            optimizer.found_inf = self.found_inf  # type: ignore[attr-defined]

    @torch.no_grad()
    def check(self, tensors: list[Tensor]) -> None:
        """Judge the coming step by its gradients, or by their norm (no host sync)."""
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, self.found_inf, self.unit_scale)

    def raise_if_diverged(self) -> None:
        if self.found_inf.item():
            raise TrainingDiverged("the gradient norm is not finite (a loss became NaN or infinite)")


@torch.no_grad()
def clip_grad_norm(parameters: list[Tensor], max_norm: float, guard: DivergenceGuard | None = None) -> Tensor:
    """Scale the gradients so their global norm is at most `max_norm` (0: no clipping); return the norm.

    The same arithmetic as `torch.nn.utils.clip_grad_norm_`, without its per-call grouping of
    tensors by device and dtype, which costs as much as the clipping itself for these small nets.
    A `guard` judges the norm: a non-finite one makes the guarded optimizers skip this step. (With
    a loss scaler there is none: the scaler skips an overflowed step itself.)
    """
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    norms = torch._foreach_norm(grads)
    if any(norm.dtype != torch.float32 for norm in norms):  # bf16 trunks beside float32 heads (bf16-true)
        norms = [norm.float() for norm in norms]
    total_norm = torch.linalg.vector_norm(torch.stack(norms))
    if guard is not None:
        guard.check([total_norm])
    if max_norm > 0:
        scale = (max_norm / (total_norm + 1e-6)).clamp_(max=1.0)
        for dtype_grads in _by_dtype(grads):
            torch._foreach_mul_(dtype_grads, scale.to(dtype_grads[0].dtype))
    return total_norm


def _by_dtype(tensors: list[Tensor]) -> list[list[Tensor]]:
    groups: dict[torch.dtype, list[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    return list(groups.values())


def clip_and_step(
    optimizers: list[torch.optim.Optimizer],
    parameters: list[Tensor],
    max_norm: float,
    scaler: torch.amp.GradScaler | None,
    guard: DivergenceGuard,
) -> None:
    """Clip the gradients of `parameters` (0: only check them) and step every optimizer.

    A step with a non-finite gradient norm is skipped: by the `guard` (which stops the run at its
    next report), or with fp16's loss `scaler`, by the scaler, which then lowers the scale and
    trains on. The scaler's gradients are unscaled first.
    """
    if scaler is not None:
        for optimizer in optimizers:
            scaler.unscale_(optimizer)
    clip_grad_norm(parameters, max_norm, guard if scaler is None else None)
    optimizer_steps(optimizers, scaler)


def optimizer_steps(optimizers: list[torch.optim.Optimizer], scaler: torch.amp.GradScaler | None) -> None:
    """Step every optimizer on the gradients of one backward pass, through fp16's loss scaler where there is one."""
    if scaler is None:
        for optimizer in optimizers:
            optimizer.step()
        return
    for optimizer in optimizers:
        scaler.step(optimizer)
    scaler.update()


class FlatGradients:
    """The gradients of consecutive parameter groups as views into one buffer (one per dtype).

    Backward passes write (accumulate) into the views, so a run of consecutive groups is one
    contiguous tensor per dtype (`spans`) that a single collective averages across learners, and
    zeroing is one call. Every precision but bf16-true has one dtype, so one collective. Optimizers
    must not reset these gradients to None.
    """

    def __init__(self, *groups: list[Tensor]) -> None:
        parameters = [parameter for group in groups for parameter in group]
        self.buffers: dict[torch.dtype, Tensor] = {}
        self.starts: dict[torch.dtype, list[int]] = {}
        for dtype in dict.fromkeys(parameter.dtype for parameter in parameters):
            members = [parameter for parameter in parameters if parameter.dtype == dtype]
            group_sizes = [sum(p.numel() for p in group if p.dtype == dtype) for group in groups]
            buffer = torch.zeros(sum(group_sizes), dtype=dtype, device=members[0].device)
            for parameter, view in zip(members, buffer.split([p.numel() for p in members]), strict=True):
                parameter.grad = view.view_as(parameter)
            self.buffers[dtype], self.starts[dtype] = buffer, list(accumulate(group_sizes, initial=0))

    @property
    def buffer(self) -> Tensor:
        """The one buffer of parameters that share a dtype."""
        (buffer,) = self.buffers.values()
        return buffer

    def spans(self, first: int, last: int) -> list[Tensor]:
        """The gradients of groups `first` to `last` (inclusive), as one view per dtype."""
        spans = [
            buffer[self.starts[dtype][first] : self.starts[dtype][last + 1]] for dtype, buffer in self.buffers.items()
        ]
        return [span for span in spans if span.numel()]

    def span(self, first: int, last: int) -> Tensor:
        (span,) = self.spans(first, last)
        return span


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
