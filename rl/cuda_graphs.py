"""`--cuda-graphs`: a learner's step captured as a CUDA graph, so that the GPU runs it without the host
launching each of its hundreds of small kernels.

A step of a small network is bound by the host: the GPU finishes each kernel before the host has
launched the next. A captured graph launches them all at once. The step must take tensors of
fixed shapes, read nothing on the host and draw no random numbers (its caller draws them and
passes them in), and its optimizers must be capturable. Among several learners the step's
gradient averages run between graphs: a graph records kernels, never a collective.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from itertools import zip_longest
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rl.batch import joined

if TYPE_CHECKING:
    from rl.config import RunConfig
    from rl.runtime import Runtime

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


class GraphSequence:
    """A step's kernels recorded as CUDA graphs, cut wherever a collective must run between two of them;
    replayed graph, collective, graph, and so on. Without a cut, one graph.

    Recording opens on entry and closes on exit. The graphs share one memory pool, of their own: a
    later graph reads what an earlier one left, and another step's replay cannot write over either.
    """

    def __init__(self) -> None:
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.collectives: list[Callable[[], None]] = []  # the one after each graph but the last
        self.recording: torch.cuda.graph | None = None

    def __enter__(self) -> GraphSequence:
        graph = torch.cuda.CUDAGraph()
        pool = self.graphs[0].pool() if self.graphs else None
        self.recording = torch.cuda.graph(graph, pool=pool)
        self.recording.__enter__()
        self.graphs.append(graph)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        assert self.recording is not None
        self.recording.__exit__(kind, error, traceback)
        self.recording = None

    def cut(self, collective: Callable[[], None]) -> None:
        """End the graph being recorded, run `collective` after it at each replay, and record the next."""
        self.__exit__(None, None, None)
        self.collectives.append(collective)
        self.__enter__()

    def replay(self) -> None:
        for graph, collective in zip_longest(self.graphs, self.collectives):
            graph.replay()
            if collective is not None:
                collective()


@dataclass
class CapturedGraph:
    graphs: GraphSequence
    inputs: list[Tensor]  # the static buffers the graphs read
    outputs: PackedOutputs  # how to read the outputs from the static buffers the graphs write
    packed: list[Tensor]


WARM_UP_CALLS = 2  # of each kind of step, run as they are before its capture
CAPTURED_BY_CALL = WARM_UP_CALLS + 1  # the call that captures it


class CapturedSteps:
    """Runs `step(kind, *inputs)` as one CUDA graph per kind of step (a learner's step with or without its
    actor, say).

    The first `warm_up` calls of each kind run as they are, on a side stream (lazily made state, the
    optimizers' moments and cuBLAS's workspace, must exist before a capture); the next call is
    captured and replayed; every later one copies its inputs into the graph's buffers and replays
    it. Every call is a real step, so a run takes the same steps as without graphs. The outputs
    are copies (views of one copy per dtype): the graph overwrites its own at the next replay.

    Given the learners' `runtime`, the step's gradient averages (`Runtime.backward_and_average`) cut
    it into graphs, with each average run between two of them.
    """

    def __init__(self, step: Step, warm_up: int = WARM_UP_CALLS, runtime: Runtime | None = None) -> None:
        self.step, self.warm_up, self.runtime = step, warm_up, runtime
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
        captured.graphs.replay()
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
        with GraphSequence() as graphs, self.collectives_between(graphs):
            outputs = self.step(kind, *static)
            layout = PackedOutputs(outputs)
            packed = layout.pack(outputs)
        return CapturedGraph(graphs, static, layout, packed)

    def collectives_between(self, graphs: GraphSequence) -> AbstractContextManager[None]:
        """While recording: each of the step's gradient averages cuts `graphs` (with one learner there is none)."""
        if self.runtime is None:
            return nullcontext()
        return self.runtime.collectives_deferred(graphs.cut)


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
    """Whether a learner's step runs as CUDA graphs. Among several learners, where each step's gradient
    average runs between two graphs, only when asked for: by default they step aside, as that is not yet
    measured on several GPUs."""
    return cfg.cuda_graphs and (learners == 1 or not cfg.came_by_default("cuda_graphs"))
