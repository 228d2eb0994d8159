"""`--cuda-graphs`: a learner's step captured as a CUDA graph, so that the GPU runs it without the host
launching each of its hundreds of small kernels.

A step of a small network is bound by the host: the GPU finishes each kernel before the host has
launched the next. A captured graph launches them all at once. The step must take tensors of
fixed shapes, read nothing on the host and draw no random numbers (its caller draws them and
passes them in), and its optimizers must be capturable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rl.batch import joined
from rl.errors import UsageError

if TYPE_CHECKING:
    from rl.config import RunConfig

Step = Callable[..., dict[str, Tensor]]  # step(kind, *inputs) -> named outputs


class PackedOutputs:
    """Named tensors laid end to end in one flat tensor per dtype, and read back as views of it.

    A graph's outputs are static buffers that its next replay overwrites, so each replay copies them
    out: packed inside the graph, they come out in one copy per dtype instead of one per output.
    """

    def __init__(self, outputs: dict[str, Tensor]) -> None:
        self.shapes = {name: output.shape for name, output in outputs.items()}
        self.groups: dict[torch.dtype, list[str]] = {}
        for name, output in outputs.items():
            self.groups.setdefault(output.dtype, []).append(name)

    def pack(self, outputs: dict[str, Tensor]) -> list[Tensor]:
        return [joined([outputs[name].reshape(-1) for name in names]) for names in self.groups.values()]

    def unpack(self, flats: list[Tensor]) -> dict[str, Tensor]:
        """The outputs, in their order, as views of `flats`."""
        views: dict[str, Tensor] = {}
        for names, flat in zip(self.groups.values(), flats, strict=True):
            sizes = [self.shapes[name].numel() for name in names]
            views |= {name: part.view(self.shapes[name]) for name, part in zip(names, flat.split(sizes), strict=True)}
        return {name: views[name] for name in self.shapes}


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    inputs: list[Tensor]  # the static buffers the graph reads
    outputs: PackedOutputs  # how to read the outputs from the static buffers the graph writes
    packed: list[Tensor]


class CapturedSteps:
    """Runs `step(kind, *inputs)` as one CUDA graph per kind of step (a learner's step with or without its
    actor, say).

    The first `warm_up` calls of each kind run as they are, on a side stream (lazily made state, the
    optimizers' moments and cuBLAS's workspace, must exist before a capture); the next call is
    captured and replayed; every later one copies its inputs into the graph's buffers and replays
    it. Every call is a real step, so a run takes the same steps as without graphs. The outputs
    are copies (views of one copy per dtype): the graph overwrites its own at the next replay.
    """

    def __init__(self, step: Step, warm_up: int = 2) -> None:
        self.step, self.warm_up = step, warm_up
        self.graphs: dict[Hashable, CapturedGraph] = {}
        self.calls: Counter[Hashable] = Counter()

    def __call__(self, kind: Hashable, *inputs: Tensor) -> dict[str, Tensor]:
        captured = self.graphs.get(kind)
        if captured is None:
            self.calls[kind] += 1
            if self.calls[kind] <= self.warm_up:
                return self.on_side_stream(kind, inputs)
            captured = self.graphs[kind] = self.capture(kind, inputs)
        else:
            torch._foreach_copy_(captured.inputs, list(inputs))
        captured.graph.replay()
        return captured.outputs.unpack([packed.clone() for packed in captured.packed])

    def on_side_stream(self, kind: Hashable, inputs: tuple[Tensor, ...]) -> dict[str, Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            outputs = self.step(kind, *inputs)
        torch.cuda.current_stream().wait_stream(side)
        return outputs

    def capture(self, kind: Hashable, inputs: tuple[Tensor, ...]) -> CapturedGraph:
        """Record the step on the buffers that hold this call's inputs (the replay that follows runs it)."""
        static = [value.clone() for value in inputs]
        graph = torch.cuda.CUDAGraph()
        # A pool of its own: another kind's replay could otherwise write over memory this graph's outputs hold.
        with torch.cuda.graph(graph):
            outputs = self.step(kind, *static)
            layout = PackedOutputs(outputs)
            packed = layout.pack(outputs)
        return CapturedGraph(graph, static, layout, packed)


def captured_function(function: Callable[..., tuple[Tensor, ...]]) -> Callable[..., tuple[Tensor, ...]]:
    """`function(*inputs)`, which returns a tuple of tensors, replayed as one CUDA graph per number of rows
    of its first input (the same rules as `CapturedSteps`: fixed shapes, no host reads, no random draws)."""

    def step(rows: int, *inputs: Tensor) -> dict[str, Tensor]:
        return {str(index): output for index, output in enumerate(function(*inputs))}

    steps = CapturedSteps(step)

    def replay(*inputs: Tensor) -> tuple[Tensor, ...]:
        return tuple(steps(inputs[0].shape[0], *inputs).values())

    return replay


def make_capturable(optimizers: list[torch.optim.Optimizer]) -> None:
    """Let these optimizers' steps be captured (the same arithmetic; their step counts already live on the
    device: they are fused)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["capturable"] = True


def learner_captured(cfg: RunConfig, learners: int) -> bool:
    """Whether a learner's step runs as a CUDA graph. A captured step holds no collective, so it serves a single
    learner: among several, a learner steps aside where capture was the default and refuses where it was asked for."""
    if not cfg.cuda_graphs or (learners > 1 and cfg.cuda_graphs_by_default):
        return False
    if learners > 1:
        raise UsageError(
            "--cuda-graphs",
            f"captures the step of a single learner, and this job has {learners} learners: "
            "train on one GPU, or without --cuda-graphs",
        )
    return True
