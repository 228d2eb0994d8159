"""Numeric precision: which parts of a network compute in which dtype, and the gradient scaling fp16 needs.

`--precision` takes Lightning Fabric's names. The networks' *trunks* (MLP bodies, the CNN,
SAC's hidden layers and critics' hidden layers: almost all of the FLOPs) compute at the chosen
precision; their *heads* (logits, Gaussian means and log-stds, values, Q-values) always compute
in float32, because the log-probs, the PPO ratio, GAE, the losses and SAC's temperature are
differences of nearby numbers that bf16's 8-bit mantissa would bias. So does everything
outside the networks: observation and reward statistics, rollouts and replay buffers (frames
stay uint8), and checkpoints.

- `32-true`: everything in float32.
- `bf16-mixed` / `16-mixed`: float32 weights; the trunks run under `torch.autocast` in bf16 or
  fp16 (Fabric's `MixedPrecision` plugin uses the same autocast). fp16 also scales the loss
  (a `GradScaler`), and needs a CUDA GPU.
- `bf16-true`: the trunks' weights, gradients and optimizer state are bf16 themselves; the
  heads' stay float32.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

from rl.errors import UsageError, print_error

PrecisionName = Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"]
DEFAULT_PRECISION: PrecisionName = "32-true"
# The short names Fabric's `precision` and `fabric run --precision` still take, for the names above
PRECISION_SHORT_NAMES: dict[str, PrecisionName] = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
_LOW_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "bf16-true": torch.bfloat16}

Output = TypeVar("Output")


def full_precision_name(value: Any) -> Any:
    """A precision by its full name where `value` is a short one (`bf16`, or YAML's number 16); else `value`."""
    return value if isinstance(value, bool) else PRECISION_SHORT_NAMES.get(str(value), value)


def check_precision_device(name: str, cuda: bool) -> None:
    """Refuse a precision that the chosen device (`cuda` or the CPU) cannot run, naming `--precision`."""
    if name == "16-mixed" and not cuda:
        raise UsageError(
            "--precision",
            "16-mixed needs a CUDA GPU (--cuda): a CPU has no fast fp16 kernels, and Fabric would "
            "quietly run bf16-mixed instead; on a CPU give --precision bf16-mixed",
        )


def gpu_computes_in_bf16() -> bool:
    """Whether this machine's GPUs compute in bf16 (Ampere or newer, or AMD's), asked of their properties, which
    opens no context on a GPU. `torch.cuda.is_bf16_supported()` says yes to older GPUs as well, where a bf16 tensor
    can be made but not every product computed, and learns it by allocating one on GPU 0."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(0)[0] >= 8


def check_precision_on_this_gpu(name: str, cuda: bool) -> None:
    """Refuse a bf16 precision that this machine's GPU cannot run, naming `--precision`."""
    if name.startswith("bf16") and cuda and not gpu_computes_in_bf16():
        raise UsageError("--precision", f"{name} needs a GPU with bf16 support (Ampere or newer); use 16-mixed")


def x86_cpu_without_bf16_instructions() -> bool:
    """An x86 CPU with neither AVX512-BF16 nor AMX: torch emulates bf16 there, converting around every product.
    Other CPUs (ARM's among them) are not judged."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if platform.machine().lower() not in ("x86_64", "amd64") or None in probes:  # a torch without the probes
        return False
    return not any(probe() for probe in probes)


def warn_of_emulated_bf16(name: str, cuda: bool) -> None:
    """One warning per machine where bf16 would run on a CPU that emulates it: a run at a small fraction of
    32-true's speed (0.15x for SAC in `benchmarks/precision.py`) is otherwise never explained."""
    emulated = name.startswith("bf16") and not cuda and x86_cpu_without_bf16_instructions()
    if emulated and os.environ.get("LOCAL_RANK", "0") == "0":
        print_error(
            f"warning: --precision {name} on a CPU without bf16 instructions (AVX512-BF16 or AMX): torch "
            "emulates bf16 here, and training runs several times slower than at 32-true"
        )


@dataclass(frozen=True)
class Precision:
    """How a network on `device_type` computes at precision `name` (see the module's docstring)."""

    name: PrecisionName = DEFAULT_PRECISION
    device_type: str = "cpu"

    @classmethod
    def on(cls, name: PrecisionName, device: torch.device) -> Precision:
        """`name` on `device`; 16-mixed on a CPU role (a player or evaluator beside GPU trainers) acts in float32."""
        if name == "16-mixed" and device.type != "cuda":
            return cls(DEFAULT_PRECISION, device.type)
        return cls(name, device.type)

    @property
    def mixed(self) -> bool:
        return self.name.endswith("-mixed")

    @property
    def trunk_dtype(self) -> torch.dtype:
        """The dtype of the trunks' weights."""
        return torch.bfloat16 if self.name == "bf16-true" else torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the trunks' matrix products run in."""
        return _LOW_DTYPES.get(self.name, torch.float32)

    def autocast(self) -> Any:
        """The trunks' context: torch.autocast for the mixed precisions (as Fabric's `MixedPrecision`), else none."""
        if self.mixed:
            # A CUDA graph must not keep autocast's cached casts of the weights: they would be stale at replay.
            capturing = self.device_type == "cuda" and torch.cuda.is_current_stream_capturing()
            return torch.autocast(self.device_type, dtype=self.compute_dtype, cache_enabled=not capturing)
        return nullcontext()

    def convert_trunk(self, *modules: nn.Module | None) -> None:
        """Put trunk modules' weights in the trunk dtype (bf16-true), in place."""
        for module in modules:
            if module is not None:
                module.to(self.trunk_dtype)

    def trunk(self, function: Callable[..., Output], *inputs: Tensor) -> Output:
        """Run a trunk (it casts its inputs to its weights' dtype); its tensors come back as float32, for the heads."""
        if self.name == DEFAULT_PRECISION:
            return function(*inputs)
        with self.autocast():
            output = function(*inputs)
        return _to_float32(output)


FLOAT32 = Precision()


def _to_float32(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.float()
    if isinstance(value, tuple):
        return tuple(_to_float32(item) for item in value)
    return value


def grad_scaler(name: str, device: torch.device) -> torch.amp.GradScaler | None:
    """The loss scaler fp16 needs against gradients that underflow; None for every other precision."""
    return torch.amp.GradScaler(device.type) if name == "16-mixed" else None


def float32_state(value: Any) -> Any:
    """A copy of nested dicts, lists and tuples with every bf16 or fp16 tensor as float32: checkpoints
    are float32 whatever the precision, so any precision can resume them."""
    if isinstance(value, Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, dict):
        return {key: float32_state(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(float32_state(item) for item in value)
    return value
