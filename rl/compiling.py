"""`--compile`: torch.compile for the acting forward and the update's losses, its failures as one
line naming the flag, and the time it takes, which the modes leave out of their env steps/s."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from rl.errors import UsageError

CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
Function = TypeVar("Function", bound=Callable)

# torch's own accounting of compile time: tracing and compiling the forward graphs, and the
# backward graphs, which are compiled at their first backward pass.
_COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def check_compiler(cuda: bool) -> None:
    """Inductor compiles CPU kernels with a C++ compiler (`CXX`, else g++): refuse before training without one."""
    compiler = os.environ.get("CXX", "g++")
    if not cuda and shutil.which(compiler) is None:
        raise UsageError(
            "--compile",
            f"torch.compile needs a C++ compiler for CPU code and found no {compiler!r} "
            "(install g++, or set CXX); or train without --compile",
        )


def compiled(function: Function, mode: CompileMode) -> Function:
    """`function` compiled by torch.compile (lazily, at its first call for each input shape)."""
    import torch

    compiled_function = torch.compile(function, mode=None if mode == "default" else mode)
    if mode != "reduce-overhead":
        return compiled_function  # type: ignore[return-value]

    def replayed(*args, **kwargs):
        # A CUDA graph writes each call's outputs into the same memory: what a caller keeps past the
        # next call (an update's per-minibatch losses) must be a copy.
        torch.compiler.cudagraph_mark_step_begin()
        return _copies(compiled_function(*args, **kwargs))

    return replayed  # type: ignore[return-value]


def _copies(outputs: Any) -> Any:
    import torch

    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    if isinstance(outputs, tuple | list):
        return type(outputs)(_copies(output) for output in outputs)
    return outputs


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far (0 where nothing was compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")  # imported by the first compile; never import it here
    if utils is None:
        return 0.0
    return sum(sum(utils.compilation_time_metrics.get(timer, [])) for timer in _COMPILE_TIMERS)


def compile_failure(error: BaseException) -> UsageError | None:
    """A torch.compile failure (an unsupported op, a kernel that does not build) as one line naming --compile."""
    module = type(error).__module__
    if not module.startswith(("torch._dynamo", "torch._inductor")):
        return None
    cause = str(error).strip().splitlines()
    return UsageError(
        "--compile",
        f"torch.compile failed: {type(error).__name__}: {cause[0] if cause else ''}; train without --compile",
    )
