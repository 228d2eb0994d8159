"""The distributed runtime a training loop runs on: Lightning Fabric or raw torch.distributed.

Both expose the same small surface (set-up, backward, a few collectives, saving and a
TensorBoard sink), so every mode's loop and every algorithm's update step are written once.
Buffers are synced once, at set-up, and not before every forward, as DDP would by default:
they are constants (SAC's action bounds).
"""

from __future__ import annotations

import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor

from rl.config import RunConfig, local_world_size_from_env
from rl.elastic import init_default_process_group, this_process, under_torchelastic
from rl.errors import RunStopped, UsageError, counted, did_not_join, print_error
from rl.logger import FabricSink, MetricsSink, SummaryWriterSink
from rl.precision import grad_scaler

T = TypeVar("T")


JOIN_NOTICE_SECONDS = 30.0  # a rank that waits this long for its peers to start says so (or half its timeout)


@contextmanager
def joining_the_job(timeout: timedelta) -> Iterator[None]:
    """Joining the job's process group: a rank that waits long for its peers says so, one that gives up says who
    did not join, and a rendezvous port that another job holds is named.

    Launchers that host the rendezvous themselves (`fabric run`, torchrun) fail on a taken port
    before any rank starts; ranks started otherwise (SLURM's srun, a hand-set environment) fail
    here on rank 0.
    """
    seconds = timeout.total_seconds()
    waiting = f"{this_process()}: waiting for the job's other processes to join (--collective-timeout {seconds:g} s)"
    notice = threading.Timer(min(JOIN_NOTICE_SECONDS, seconds / 2), print_error, [waiting])
    notice.daemon = True
    notice.start()
    try:
        yield
    except (dist.DistNetworkError, dist.DistStoreError) as error:
        raise joining_failed(error, seconds) from None
    finally:
        notice.cancel()


def joining_failed(error: dist.DistError, timeout_seconds: float) -> Exception:
    """What the user reads of a process group that could not be joined: a taken port, or who did not join."""
    text = str(error)
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        port = os.environ.get("MASTER_PORT", "the rendezvous port")
        return UsageError(
            "--main-port",
            f"port {port} is taken, most likely by another job on this machine; start with "
            "a free one: fabric run --main-port=N, or torchrun --master-port=N (MASTER_PORT=N)",
        )
    clients = re.search(r"(\d+)/(\d+) clients joined", text)  # the store's host, which waited for the others
    if clients is not None:
        joined, world_size = int(clients[1]), int(clients[2])
        who = f"{world_size - joined} of the job's {counted(world_size, 'process', 'processes')}"
        return RunStopped(f"{this_process()}: {did_not_join(who, timeout_seconds)}")
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    if under_torchelastic() and isinstance(error, dist.DistNetworkError):  # the agent that started it hosts it
        return RunStopped(f"{this_process()}: the job's store at {address} (torchrun's) could not be reached")
    if "timed out" not in text.lower():
        return error
    who = f"rank 0, which hosts the job's store at {address},"  # not reached: it has not started
    return RunStopped(f"{this_process()}: {did_not_join(who, timeout_seconds)}")


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def core_share(processes: int) -> int:
    """The threads each of `processes` processes on this machine can run without waiting for a core."""
    return max(1, available_cores() // processes)


def default_torch_threads(cnn: bool) -> int:
    """A CNN's convolutions pay for more threads: each local rank takes its share of the cores (launchers hand
    every rank all of them). An MLP's ops are too small to share out: one thread, which spends nothing on
    waking or spinning threads between ops (`benchmarks/omp_wait.py --threads`)."""
    return core_share(local_world_size_from_env()) if cnn else 1


@contextmanager
def process_torch_settings_restored() -> Iterator[None]:
    """Torch's settings for the whole process that a run changes (its threads, cuDNN's determinism), put back
    when the run returns or raises: a caller's own work after `rl.train` runs as it did before."""
    threads, deterministic = torch.get_num_threads(), torch.backends.cudnn.deterministic
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.cudnn.deterministic = deterministic


def configure_torch_threads(requested: int, cnn: bool = False) -> int:
    """`requested` torch threads, or with 0 the default for the network (`default_torch_threads`); more than this
    process's share of the cores are taken, with a warning (once per machine)."""
    threads = requested or default_torch_threads(cnn)
    torch.set_num_threads(threads)
    processes = local_world_size_from_env()
    if threads > core_share(processes) and os.environ.get("LOCAL_RANK", "0") == "0":
        here = counted(processes, "process", "processes")
        print_error(
            f"warning: --torch-threads {threads} x {here} here is more threads than this machine's "
            f"{available_cores()} cores: they wait on each other and slow training"
        )
    return threads


class Runtime(ABC):
    rank: int
    world_size: int
    device: torch.device
    log_subdir: str  # logs/<log_subdir>/<run>/
    group: dist.ProcessGroup | None = None  # the learners' group; None: every process
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaler (16-mixed); `backward` scales by it
    # While a learner's step is captured as CUDA graphs: takes each collective, to run between two graphs.
    defer_collective: Callable[[Callable[[], None]], None] | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def backward(self, loss: Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def backward_and_average(
        self, loss: Tensor, gradients: list[Tensor], before_average: Callable[[], None] | None = None
    ) -> None:
        """Write the gradient of `loss` into `gradients` (`FlatGradients` spans that the parameters'
        `.grad` view) and average them over the learners, in one collective per span (per dtype).

        `before_average` runs between the backward pass and the collective: what it writes into the
        spans (a statistic riding along with the gradients) is averaged with them, at no extra message."""
        for span in gradients:
            span.zero_()
        self.backward(loss)
        if before_average is not None:
            before_average()
        if self.defer_collective is not None and self.world_size > 1:
            self.defer_collective(lambda: self.average(gradients))
        else:
            self.average(gradients)

    def average(self, tensors: list[Tensor]) -> None:
        """Average each of `tensors` in place over the learners, their collectives in flight together."""
        waits = [self.start_mean(tensor) for tensor in tensors]
        for wait in waits:
            wait()

    @abstractmethod
    def all_reduce_sum(self, tensor: Tensor) -> Tensor: ...

    def all_gather_rows(self, tensor: Tensor) -> Tensor:
        """Concatenate every rank's tensor along dim 0, in rank order, on the tensor's device. The collective
        runs on this runtime's device: a tensor on the host of a GPU learner goes there and back (a wait)."""
        if self.world_size == 1:
            return tensor
        return self.gather_rows(tensor.to(self.device)).to(tensor.device)

    @abstractmethod
    def gather_rows(self, tensor: Tensor) -> Tensor:
        """`all_gather_rows` among more than one rank, of a tensor on this runtime's device."""

    @abstractmethod
    def broadcast_object(self, obj: Any) -> Any: ...

    def write_on_main(self, write: Callable[[], T]) -> T:
        """`write_on_rank_0` among this runtime's ranks."""
        return write_on_rank_0(write, self.is_main, self.world_size, self.broadcast_object)

    def start_mean(self, tensor: Tensor) -> Callable[[], None]:
        """Average `tensor` in place over the ranks, in the background; call the result to wait for it.

        Every learner's gradients are averaged this way, in one flat buffer: on gloo one all-gather
        and a local mean cost 1.24 ms per 2-rank PPO step here, against 1.27 ms for DDP with the same
        all-gather in a communication hook and 1.83 ms for DDP's all-reduce
        (`benchmarks/ddp_step.py`), and the step skips DDP's and Fabric's per-call wrappers.
        """
        if self.world_size == 1:
            return lambda: None
        if dist.get_backend(self.group) == dist.Backend.GLOO:
            gathered = self._gather_buffer(tensor)
            work = start_all_gather(tensor, gathered, self.group)

            def wait() -> None:
                work.wait()
                mean_of_gathered(gathered, self.world_size, out=tensor)

            return wait
        tensor.div_(self.world_size)
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True).wait

    @contextmanager
    def collectives_deferred(self, defer: Callable[[Callable[[], None]], None]) -> Iterator[None]:
        """While open, `backward_and_average` hands its average to `defer` as a call that runs it, instead of
        running it: a CUDA graph records kernels, never a collective, so a captured step is cut at each one."""
        self.defer_collective = defer
        try:
            yield
        finally:
            self.defer_collective = None

    def _gather_buffer(self, tensor: Tensor) -> Tensor:
        """A buffer for every rank's copy of `tensor`, allocated once per shape: a fresh one each step
        costs page faults, which show in the collective's latency."""
        buffers = self.__dict__.setdefault("_gather_buffers", {})
        key = (tensor.numel(), tensor.dtype, tensor.device)
        if key not in buffers:
            buffers[key] = tensor.new_empty(self.world_size * tensor.numel())
        return buffers[key]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (pickled: for small, rare messages only)."""
        if self.world_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    @abstractmethod
    def make_sink(self, root_dir: str, run_name: str) -> MetricsSink:
        """The run's TensorBoard writer."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release the process group."""


# The one-tensor all-gather: `all_gather_single` where torch has it (2.13 does, 2.11 does not), which deprecates
# `all_gather_into_tensor`.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def start_all_gather(flat: Tensor, gathered: Tensor, group: dist.ProcessGroup | None) -> dist.Work:
    """Gather every rank's `flat` into `gathered`, in rank order, in the background.

    Averaging by an all-gather and a local sum (`mean_of_gathered`) beats an all-reduce on gloo:
    for two ranks the all-reduce takes two rounds of messages where the all-gather takes one,
    and for the small gradient buffers of these networks latency is what bounds an update
    (`benchmarks/ddp_step.py`). Every rank sums the rows in rank order, so all get identical averages.
    """
    return all_gather_single(gathered, flat, group=group, async_op=True)


def mean_of_gathered(gathered: Tensor, world_size: int, out: Tensor | None = None) -> Tensor:
    return torch.sum(gathered.view(world_size, -1), 0, out=out).div_(world_size)


def _device(cfg: RunConfig, local_rank: int) -> torch.device:
    return torch.device(f"cuda:{local_rank}") if cfg.cuda else torch.device("cpu")


def _fabric_ddp_strategy(cfg: RunConfig, process_group: dist.ProcessGroup | None, device: torch.device | None) -> Any:
    """Fabric's DDP strategy, for its process group and collectives; no module is wrapped in DDP,
    since the learners average their flat gradient buffers through `Runtime.start_mean`."""
    from lightning.fabric.strategies import DDPStrategy

    ddp_kwargs: dict[str, Any] = {"process_group": process_group} if process_group is not None else {}
    if device is not None:  # Fabric picks entry LOCAL_RANK of this list, which CPU players beside us would skew
        ddp_kwargs["parallel_devices"] = [device] * local_world_size_from_env()
    return DDPStrategy(timeout=collective_timeout(cfg), **ddp_kwargs)


def gathered_rows(tensor: Tensor, world_size: int, group: dist.ProcessGroup | None = None) -> Tensor:
    """Every rank's `tensor` of `group` concatenated along dim 0, in rank order. torch.distributed's own gather:
    Fabric's goes through a deprecated one, whose warning, silenced in a `catch_warnings` block, would reset what
    Python has shown once, and show an env's warning again at every gather."""
    gathered = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    return torch.cat(gathered)


def collective_timeout(cfg: RunConfig) -> timedelta:
    return timedelta(seconds=cfg.collective_timeout)


class FabricRuntime(Runtime):
    """Lightning Fabric's DDP strategy over all processes, or over `process_group` alone (the trainers)."""

    log_subdir = "fabric_logs"

    def __init__(
        self,
        cfg: RunConfig,
        world_size: int,
        process_group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
    ) -> None:
        """`device`: this process's device where the mode chose it (a decoupled trainer); else Fabric's."""
        from lightning.fabric.connector import _is_using_cli

        self.scaler = grad_scaler(cfg.precision, _device(cfg, 0))
        with joining_the_job(collective_timeout(cfg)):
            if under_torchelastic() and process_group is None and world_size > 1:  # before Fabric, which then
                init_default_process_group("nccl" if cfg.cuda else "gloo", collective_timeout(cfg))  # keeps it
            self.fabric = self._make_fabric(cfg, world_size, process_group, self.scaler, device)
            if not _is_using_cli():  # `fabric run` has already created the processes
                self.fabric.launch()
        self.group = process_group
        self.rank = dist.get_rank(process_group) if process_group is not None else self.fabric.global_rank
        self.world_size = dist.get_world_size(process_group) if process_group is not None else self.fabric.world_size
        self.device = self.fabric.device

    @staticmethod
    def _make_fabric(
        cfg: RunConfig,
        world_size: int,
        process_group: dist.ProcessGroup | None,
        scaler: torch.amp.GradScaler | None,
        device: torch.device | None,
    ) -> Any:
        from lightning.fabric import Fabric
        from lightning.fabric.plugins import MixedPrecision

        accelerator = "cuda" if cfg.cuda else "cpu"
        os.environ.pop("LT_PRECISION", None)  # `fabric run --precision`: already the config's (parse_config_flags)
        # --cuda chooses the device (the config refused `fabric run --accelerator=cuda` without it): the
        # launcher's --accelerator only started the processes, and would conflict with a decoupled
        # trainer's GPU beside CPU players.
        os.environ.pop("LT_ACCELERATOR", None)
        # The launcher's --strategy (ddp, as the config checked) names this strategy; Fabric would refuse an object
        # that differs from its string, and take the string where the config chose "auto" (one process).
        os.environ.pop("LT_STRATEGY", None)
        # The launcher's --devices (a count, as the config checked, or auto) started LOCAL_WORLD_SIZE processes, which
        # Fabric is told below; where the mode chose this role's device, that count includes the CPU roles too.
        os.environ.pop("LT_DEVICES", None)
        # fp16's plugin gets our scaler, which the learners' optimizer steps share; the other precisions by name.
        precision: dict[str, Any] = (
            {"plugins": MixedPrecision("16-mixed", accelerator, scaler)} if scaler else {"precision": cfg.precision}
        )
        if process_group is not None and dist.get_world_size(process_group) == 1:
            # A lone trainer has no one to average with: no process group of its own, as in a one-process run.
            from lightning.fabric.strategies import SingleDeviceStrategy

            device = device or _device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
            return Fabric(accelerator=accelerator, strategy=SingleDeviceStrategy(device=device), **precision)
        return Fabric(
            accelerator=accelerator,
            strategy=_fabric_ddp_strategy(cfg, process_group, device) if world_size > 1 else "auto",
            # a GPU the mode chose passes Fabric's check of the GPUs asked for; the strategy places us on it
            devices=[device.index] if device is not None and device.type == "cuda" else local_world_size_from_env(),
            num_nodes=max(1, world_size // local_world_size_from_env()),
            **precision,
        )

    def backward(self, loss: Tensor) -> None:
        self.fabric.backward(loss)  # the precision plugin scales fp16's loss by `scaler`

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return self.fabric.all_reduce(tensor, group=self.group, reduce_op="sum") if self.world_size > 1 else tensor

    def gather_rows(self, tensor: Tensor) -> Tensor:
        return gathered_rows(tensor, self.world_size, self.group)

    def broadcast_object(self, obj: Any) -> Any:
        return self.fabric.broadcast(obj, src=0)

    def make_sink(self, root_dir: str, run_name: str) -> MetricsSink:
        return FabricSink(root_dir, run_name)

    def shutdown(self) -> None:
        close_process_group()


def write_on_rank_0(
    write: Callable[[], T], is_main: bool, world_size: int, broadcast_object: Callable[[Any], Any]
) -> T:
    """Run `write` (a file or folder the job writes once) on rank 0; what it returns, on every rank. Every rank
    returns once it is written, or raises the `RunStopped` or `UsageError` that `write` raised (a full disk, a run
    folder in use), so that no rank waits for a file that will not come and each stops with the same line."""
    written, refused, failure = None, None, None
    if is_main:
        try:
            written = write()
        except UsageError as error:
            refused = (error.flag, error.message)
        except RunStopped as error:
            failure = str(error)
    if world_size > 1:
        written, refused, failure = broadcast_object((written, refused, failure))
    if refused is not None:
        raise UsageError(*refused)
    if failure is not None:
        raise RunStopped(failure, every_rank=world_size > 1)
    return cast(T, written)


def broadcast_from_rank_0(obj: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Rank 0's `obj` on every rank of `group` (the default group if None), pickled."""
    holder = [obj]
    dist.broadcast_object_list(holder, src=0, group=group)
    return holder[0]


def close_process_group() -> None:
    """Leave together: a rank that tears its group down while a peer still works on (rank 0's
    evaluation, say) can abort at exit with "terminate called without an active exception"."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


class TorchRuntime(Runtime):
    """torch.distributed and DistributedDataParallel, as started by `torchrun`; no Fabric."""

    log_subdir = "torch_logs"

    def __init__(self, cfg: RunConfig, world_size: int) -> None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = _device(cfg, local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.scaler = grad_scaler(cfg.precision, self.device)
        self.world_size = world_size
        if world_size > 1:
            with joining_the_job(collective_timeout(cfg)):
                init_default_process_group("nccl" if cfg.cuda else "gloo", collective_timeout(cfg))
        self.rank = dist.get_rank() if world_size > 1 else 0

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        if self.world_size > 1:
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def gather_rows(self, tensor: Tensor) -> Tensor:
        return gathered_rows(tensor, self.world_size)

    def broadcast_object(self, obj: Any) -> Any:
        return obj if self.world_size == 1 else broadcast_from_rank_0(obj)

    def make_sink(self, root_dir: str, run_name: str) -> MetricsSink:
        return SummaryWriterSink(os.path.join(root_dir, run_name), self.is_main)

    def shutdown(self) -> None:
        close_process_group()


class LocalRuntime(Runtime):
    """One process that averages with no one: a Hogwild worker, whose peers meet through shared
    memory rather than collectives. `rank` names the worker (its seeds); only worker 0 logs."""

    log_subdir = "hogwild_logs"

    def __init__(self, rank: int) -> None:
        self.rank, self.world_size, self.device = rank, 1, torch.device("cpu")

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor

    def gather_rows(self, tensor: Tensor) -> Tensor:
        return tensor  # one worker: `all_gather_rows` never gathers

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def make_sink(self, root_dir: str, run_name: str) -> MetricsSink:
        return SummaryWriterSink(os.path.join(root_dir, run_name), self.is_main)

    def shutdown(self) -> None:
        return
