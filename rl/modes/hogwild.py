"""Hogwild! mode: worker processes on one machine train one set of networks kept in shared memory.

- shared: every worker applies its own gradients to the global networks and their optimizer
  state, without locks (Recht et al.'s Hogwild!).
- synced: every worker trains a copy with its own optimizer and, every `--sync-every` updates,
  adds its change since its last merge to the global networks and takes the result back,
  under a lock. The copies stay close to one policy, which on-policy PPO needs.

The launching process supervises: it holds the global tensors, writes the checkpoints the
workers hand it, names a worker that dies and stops the others, and evaluates the result.
Workers checkpoint together, at the same iteration (or at their next report after Ctrl-C):
each waits for the others, so that nobody writes the global tensors while they are captured.
The processes are torch.multiprocessing's (spawn). Tensors cross between them as shared
memory; only checkpoint parts, which are rare, travel pickled through a queue.
"""

from __future__ import annotations

import functools
import gc
import io
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.context import SpawnContext, SpawnProcess
from threading import BrokenBarrierError
from typing import Any, NoReturn, Protocol

import torch
import torch.multiprocessing as mp
from gymnasium.envs.registration import EnvSpec
from torch import Tensor
from tqdm import tqdm

from rl.algos.base import Algorithm, Learner
from rl.batch import DataShard
from rl.checkpoint import (
    Counters,
    TrainingCheckpoint,
    WorkerState,
    agent_of,
    agent_path,
    from_file,
    keep_checkpoint,
    restore_run_state,
    restored_agent,
    training_checkpoint,
    write_file,
)
from rl.config import RunConfig
from rl.elastic import reached, record_end
from rl.env_faults import stalled_env_call
from rl.errors import RunStopped, counted, how_it_ended, print_error
from rl.evaluation import report_evaluation
from rl.experience import ExperienceSource
from rl.faults import stall_seconds, stalled_env_named_when_stopped
from rl.logger import EPISODE_RETURN, ProgressBar, TrainingMetrics, open_sinks
from rl.loop import (
    Callback,
    CtrlCAgain,
    InterruptFlag,
    LoopClock,
    LoopState,
    Requests,
    StopRequest,
    TrainingLoop,
    loop_figures,
    own_peak_rss_mb,
    summary_line,
)
from rl.optim import TrainingDiverged
from rl.precision import float32_state
from rl.run import ClosedIfItFails, Run, TrainingResult, start_run, training_video_folder
from rl.runtime import LocalRuntime, configure_torch_threads, core_share, default_torch_threads
from rl.signals import STOP_SECONDS, HeldSigterm, StoppedBySigterm, holding_sigterm, stopped_with_parent
from rl.spawned import ByValue, env_registration, main_module_without_a_missing_file, register_in_this_process

MODE = "hogwild"
POLL_SECONDS = 0.1
INTERRUPTED, FINISHED = 1, 2  # why the workers stop at a meeting


class SupervisorStop(StopRequest):
    """Ctrl-C as a worker hears of it: the supervisor's request in the channel (workers ignore SIGINT)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    @property
    def requested(self) -> bool:
        return self.channel.stop_requested.is_set()


def worker_name(index: int) -> str:
    return f"hogwild worker {index}"


def worker_threads(cfg: RunConfig, cnn: bool) -> int:
    """--torch-threads or the network's default per worker, never more than the cores hold for all workers."""
    return min(cfg.torch_threads or default_torch_threads(cnn), core_share(cfg.workers))


# --- What the workers share -------------------------------------------------------------------


@dataclass
class SharedState:
    """The global weights (`Learner.weight_tensors` order), in shared mode the optimizers' state
    too (per optimizer, per parameter), and each worker's env-step count, written by it alone."""

    weights: list[Tensor]
    optimizer_states: list[list[dict[str, Tensor]]]
    frames: Tensor


def adam_state(optimizer: torch.optim.Optimizer) -> list[dict[str, Tensor]]:
    """Adam's per-parameter state, created now as Adam creates it at its first step, so that it can be shared."""
    if not isinstance(optimizer, torch.optim.Adam) or any(group["amsgrad"] for group in optimizer.param_groups):
        raise TypeError("Hogwild's shared mode shares Adam's state (without amsgrad) only")
    states = []
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=parameter.device)
                state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            states.append(state)
    return states


def share_learner(learner: Learner, sync: str, frames: Tensor) -> SharedState:
    """Copies of the learner's weights (and, in shared mode, its optimizers' state) in shared memory."""

    def shared_copy(tensor: Tensor) -> Tensor:
        return tensor.detach().clone().share_memory_()

    weights = [shared_copy(tensor) for tensor in learner.weight_tensors()]
    optimizer_states = []
    if sync == "shared":
        for optimizer in learner.optimizers():
            optimizer_states.append([{k: shared_copy(v) for k, v in s.items()} for s in adam_state(optimizer)])
    return SharedState(weights, optimizer_states, frames.share_memory_())


class Weights(Protocol):
    """How a worker's learner meets the global weights."""

    def after_update(self) -> None: ...
    def publish(self) -> None: ...
    def take_published(self) -> None: ...


class SharedWeights:
    """Shared mode: the learner's tensors and optimizer state *are* the global ones; nothing to merge."""

    def __init__(self, learner: Learner, shared: SharedState) -> None:
        for local, global_ in zip(learner.weight_tensors(), shared.weights, strict=True):
            # The same Parameter objects, now on shared storage: optimizers and gradients keep them.
            local.data = global_
        for optimizer, states in zip(learner.optimizers(), shared.optimizer_states, strict=True):
            parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
            for parameter, state in zip(parameters, states, strict=True):
                optimizer.state[parameter] = state

    def after_update(self) -> None:
        return

    def publish(self) -> None:
        return

    def take_published(self) -> None:
        return


class MergedWeights:
    """Synced mode: this worker trains its own copy and merges it with the global weights every `every` updates.

    A merge adds the other workers' changes since this worker's last merge (global - base) to
    its copy, then publishes the copy as the new global weights. With one worker the others'
    change is exactly zero, so training equals a one-process run bit for bit.
    """

    def __init__(self, learner: Learner, shared: SharedState, lock: Any, every: int) -> None:
        self.local = [tensor.detach() for tensor in learner.weight_tensors()]
        self.global_, self.lock, self.every = shared.weights, lock, every
        self.base = [tensor.clone() for tensor in self.global_]
        self.updates = 0
        self.take_published()

    def after_update(self) -> None:
        self.updates += 1
        if self.updates % self.every == 0:
            self.publish()

    @torch.no_grad()
    def publish(self) -> None:
        with self.lock:
            torch._foreach_add_(self.local, torch._foreach_sub(self.global_, self.base))
            torch._foreach_copy_(self.global_, self.local)
        torch._foreach_copy_(self.base, self.local)

    @torch.no_grad()
    def take_published(self) -> None:
        with self.lock:
            torch._foreach_copy_(self.local, self.global_)
        torch._foreach_copy_(self.base, self.local)


# --- The channel between the supervisor and the workers ---------------------------------------


class Channel:
    """The supervisor's and workers' meeting points: a barrier for checkpoints, Ctrl-C, the
    decision to stop and the count of finished workers it rests on, the synced merges' lock, and
    the queue that carries checkpoint parts."""

    def __init__(self, context: SpawnContext, workers: int) -> None:
        self.barrier = context.Barrier(workers)
        self.stop_requested = context.Event()  # Ctrl-C or SIGTERM: checkpoint and stop
        self.stop_now = context.Event()  # the supervisor ends the workers at once: a SIGTERM then is that
        self.finish_requested = context.Event()  # a callback's request to end the run finished
        self.checkpoint_requested = context.Event()  # a worker's clock (--checkpoint-every TIME): all meet to save
        self.stopping = context.Value("b", 0)  # what the workers decided at their newest meeting
        self.finished = context.Value("i", 0)  # workers that have run all their iterations
        self.merge_lock = context.Lock()
        self.parts = context.Queue()
        self.supervisor = os.getpid()


# --- A worker ---------------------------------------------------------------------------------


def run_worker(
    index: int,
    algorithm: Algorithm,
    shared: SharedState,
    channel: Channel,
    run_dir: str,
    resume: TrainingCheckpoint | None,
    callbacks: ByValue[Sequence[Callback]],
    env: ByValue[EnvSpec | None],
) -> None:
    """A worker process's body: one line and exit code 1 if training diverges. The callbacks and the env's
    registration come by value: they may be an interactive session's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to turn into a checkpoint and a stop
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # born blocked (start_workers); ignored from now on
    # tqdm's default lock is shared between processes: a worker the supervisor stops leaves it behind, and the
    # resource tracker warns of it. One process draws the bar, so a lock of this process's threads serves.
    tqdm.set_lock(threading.RLock())
    # A supervisor killed outright (SIGKILL, the out-of-memory killer) cannot stop its workers: they stop themselves,
    # or one in an env call that never returns would run on alone.
    lost = functools.partial(supervisor_lost, index, algorithm.cfg.collective_timeout)
    asks_for_a_stop = functools.partial(sigterm_asks_the_workers_to_stop, channel)
    try:
        with (
            stalled_env_named_when_stopped(worker_name(index), algorithm.cfg.collective_timeout, asks_for_a_stop),
            stopped_with_parent(lost, parent=channel.supervisor),  # it may have ended while this worker started
        ):
            register_in_this_process(env)
            WorkerLoop(index, algorithm, shared, channel, run_dir, resume).run(callbacks.value)
    except TrainingDiverged as error:
        print_error(f"error: {worker_name(index)}: training stopped: {error}")
        os._exit(1)
    except RunStopped as error:  # worker 0 writes the run's logs: the disk may refuse them
        print_error(error.lines(f"{worker_name(index)}: "))
        os._exit(1)
    except BrokenBarrierError:  # the supervisor stopped the job: another worker was lost, and it says so
        os._exit(1)


def sigterm_asks_the_workers_to_stop(channel: Channel) -> bool:
    """A worker's SIGTERM (sent to the whole job, or to this worker alone) asks every worker for the checkpoint and
    stop that Ctrl-C asks for; the supervisor's own, as it ends the workers at once, is not taken so."""
    if channel.stop_now.is_set():
        return False
    channel.stop_requested.set()
    return True


def supervisor_lost(index: int, collective_timeout: float) -> NoReturn:
    """End this worker, whose supervisor has ended, with one line; it leads with an env call that had stalled (what
    the supervisor may have been killed over)."""
    stall = stalled_env_call(stall_seconds(collective_timeout))
    lead = f"{worker_name(index)}: {stall}; " if stall else f"{worker_name(index)}: "
    print_error(f"error: {lead}the supervising process was lost; stopping")
    os._exit(1)


class WorkerLoop:
    """One worker: its envs and learner on the global weights, its training loop, its checkpoint parts."""

    def __init__(
        self,
        index: int,
        algorithm: Algorithm,
        shared: SharedState,
        channel: Channel,
        run_dir: str,
        resume: TrainingCheckpoint | None,
    ) -> None:
        cfg = self.cfg = algorithm.cfg
        configure_torch_threads(worker_threads(cfg, algorithm.cnn))
        self.index, self.algorithm, self.shared, self.channel, self.run_dir = index, algorithm, shared, channel, run_dir
        runtime = self.runtime = LocalRuntime(index)
        self.policy = algorithm.build_policy(runtime.device)
        batch_rows = algorithm.batch_rows(1)
        self.learner = algorithm.make_learner(self.policy, runtime, DataShard(batch_rows), env_ranks=cfg.workers)
        video_dir = training_video_folder(run_dir, resume) if cfg.capture_video and index == 0 else None
        self.source: ExperienceSource = algorithm.make_source(
            index, runtime.device, video_dir, env_ranks=cfg.workers, batch_rows=batch_rows
        )
        self.first_iteration = 1
        self.resumed_step: int | None = None
        if resume is not None:
            restore_run_state(resume, index, self.policy, self.learner, self.source, cfg.workers, role="worker")
            self.first_iteration = resume.counters.iteration + 1
            self.resumed_step = resume.counters.global_step
        if cfg.sync == "shared":
            self.weights: Weights = SharedWeights(self.learner, shared)
        else:
            self.weights = MergedWeights(self.learner, shared, channel.merge_lock, cfg.sync_every)
        self.checkpoints = 0
        self.frames_at_start = int(shared.frames[index])  # a resumed run's earlier steps are not this run's
        self.finished = False  # counted among the workers that have run all their iterations
        self.stopping = 0  # as decided at the newest meeting: 0, INTERRUPTED or FINISHED

    def run(self, callbacks: Sequence[Callback] = ()) -> None:
        cfg = self.cfg
        self.num_iterations = cfg.num_iterations(cfg.workers)
        # As in coupled mode, the step an iteration is at counts every worker's envs: SAC's
        # warm-up and a checkpoint's timing fall at the same iteration on every worker.
        self.steps_per_iteration = cfg.steps_per_iteration * cfg.workers
        # worker 0 writes the training's scalars, after those an earlier launch logged up to the checkpoint
        self.sink = open_sinks(
            cfg.logger, self.run_dir, self.index == 0, purge_step=self.resumed_step, config=cfg.to_dict()
        )
        self.metrics = TrainingMetrics(self.runtime.device, self.runtime.all_reduce_sum, self.algorithm.stat_tags)
        self.reported_frames = self.start_frames = int(self.shared.frames.sum())
        drawn = self.index == 0 and cfg.progress_bar
        total = self.num_iterations * self.steps_per_iteration
        self.progress = ProgressBar(total, drawn, initial=self.start_frames, drawn_by_job=cfg.progress_bar)
        self.step = (self.first_iteration - 1) * self.steps_per_iteration
        self.loop_clock = LoopClock()
        state = LoopState(
            self.first_iteration - 1,
            self.step,
            self.num_iterations,
            self.index,
            self.index == 0,
            self.run_dir,
            self.sink,
        )
        report_every = self.algorithm.iterations_per_report(cfg.workers)
        loop = TrainingLoop(
            cfg,
            self,
            state,
            self.first_iteration,
            report_every,
            self.steps_per_iteration,
            keeps_clock=True,  # each worker's, so that one that has finished early leaves the others a clock
            callbacks=callbacks,
            interrupt=SupervisorStop(self.channel),
        )
        loop.run()
        while not self.stopping:  # done before the others: a resumed run whose workers had stopped at different
            self.agree(self.num_iterations, Requests())  # iterations; it takes part in the others' checkpoints
            self.checkpoint(self.num_iterations)  # until theirs is the last
        self.progress.close()
        self.source.close()
        self.sink.close()

    def iterate(self, iteration: int) -> None:
        stepped_to = self.step + self.steps_per_iteration
        learn = functools.partial(self.learn, iteration, stepped_to)
        episodes = self.source.collect_and_learn(self.policy, self.step, learn)
        self.step = stepped_to
        self.shared.frames[self.index] += self.cfg.steps_per_iteration
        self.metrics.record_episodes(episodes.returns, episodes.lengths)

    def learn(self, iteration: int, step: int) -> None:
        """This worker's update of the shared networks, once its source has a batch (`step`: after the
        iteration's steps)."""
        batch = self.source.next_batch(step, self.runtime.all_reduce_sum)
        if batch is None:
            return
        self.metrics.record(self.source.batch_stats(batch))
        self.metrics.record(self.learner.update(batch, iteration))
        self.weights.after_update()

    def report(self, iteration: int) -> dict[str, float]:
        self.learner.raise_if_diverged()
        counts = self.frame_counts()  # read once: the other workers go on counting meanwhile
        all_frames = int(counts["Frames/global"])
        steps_per_second = (all_frames - self.start_frames) / self.loop_clock.seconds()
        scalars = self.metrics.compute() | {"Time/steps_per_second": steps_per_second} | counts
        self.sink.log_scalars(scalars, all_frames)
        self.progress.advance(all_frames - self.reported_frames, steps_per_second, scalars.get(EPISODE_RETURN))
        self.reported_frames = all_frames
        return scalars

    def frame_counts(self) -> dict[str, float]:
        """Env steps per worker and in all, logged by worker 0 (the x-axis is the global count)."""
        counts = self.shared.frames.tolist()
        return {"Frames/global": float(sum(counts))} | {f"Frames/worker_{k}": float(n) for k, n in enumerate(counts)}

    def agree(self, iteration: int, wanted: Requests) -> Requests:
        """Workers meet at checkpoints only: at a step interval, at their last iteration, or at a stop. There
        every worker's update is done and the global weights hold still; worker 0 decides whether all stop."""
        channel = self.channel
        if wanted.finish:
            channel.finish_requested.set()
        last = iteration == self.num_iterations
        if last and not self.finished:
            self.finished = True
            with channel.finished.get_lock():
                channel.finished.value += 1
        if wanted.checkpoint and self.cfg.checkpoint_seconds:  # this worker's clock, the first due of all
            channel.checkpoint_requested.set()
        checkpoint = wanted.checkpoint or channel.checkpoint_requested.is_set()
        if not (checkpoint or wanted.interrupt or last or channel.finish_requested.is_set()):
            return Requests()
        channel.barrier.wait()
        if self.index == 0:  # one worker decides, so that all stop after the same checkpoint
            channel.checkpoint_requested.clear()  # every worker is here: none will meet for this one again
            all_done = channel.finished.value == self.cfg.workers
            finish = all_done or channel.finish_requested.is_set()
            channel.stopping.value = INTERRUPTED if channel.stop_requested.is_set() else FINISHED if finish else 0
            counts = self.frame_counts()  # exact now: every worker is here
            self.sink.log_scalars(counts, int(counts["Frames/global"]))
        self.weights.publish()
        channel.barrier.wait()
        self.weights.take_published()  # synced: every copy restarts from the merged weights
        self.stopping = channel.stopping.value
        return Requests(self.stopping == INTERRUPTED, True, self.stopping == FINISHED)

    def ended(self, iteration: int) -> None:
        return

    def checkpoint(self, iteration: int) -> None:
        """Hand the supervisor this worker's part of the checkpoint the workers met for."""
        self.learner.raise_if_diverged()
        self.checkpoints += 1
        part = serialized(self.checkpoint_part(iteration, self.loop_clock))
        self.channel.parts.put((self.checkpoints, self.index, part))
        self.channel.barrier.wait()  # all parts are captured before anyone writes the global weights again

    def checkpoint_part(self, iteration: int, loop_clock: LoopClock) -> dict[str, Any]:
        part = {
            "learner": self.learner.state_dict(),
            "source": self.source.capture_state(),
            "iteration": iteration,
            "frames": int(self.shared.frames[self.index]),
            "loop_seconds": loop_clock.seconds(),
            "compile_seconds": loop_clock.compile_seconds(),
            "frames_this_run": int(self.shared.frames[self.index]) - self.frames_at_start,
            "peak_rss_mb": own_peak_rss_mb(),
            "env_seconds": self.source.env_seconds,
        }
        if self.index == 0:
            part["agent"] = agent_of(self.algorithm, self.policy, self.source).to_file()
        return part


def serialized(state: dict[str, Any]) -> bytes:
    """A snapshot as bytes: shared tensors sent as they are would arrive as the live shared memory."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def deserialized(data: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(data), weights_only=True)


# --- The supervisor ---------------------------------------------------------------------------


class WorkerLost(Exception):
    def __init__(self, index: int, exitcode: int) -> None:
        super().__init__(f"{worker_name(index)} {how_it_ended(exitcode)}")


def worker_resume(resume: TrainingCheckpoint | None, index: int) -> TrainingCheckpoint | None:
    """A worker's view of a Hogwild checkpoint: its own learner state and iteration count."""
    if resume is None:
        return None
    assert resume.workers is not None, "a Hogwild checkpoint holds its workers' states"
    worker = resume.workers[index]
    counters = Counters(resume.counters.global_step, worker.iteration)
    return replace(resume, learner=worker.learner, counters=counters)


def resumed_by_workers(
    resume: TrainingCheckpoint | None, workers: int, steps_per_iteration: int
) -> TrainingCheckpoint | None:
    """The checkpoint as `workers` workers resume it. As many as wrote it resume each its own state. Any other
    number shares out the iterations done as evenly as whole iterations allow, so that together the workers reach
    --total-timesteps as if they had trained from the start; each keeps its own learner state (its optimizer's)
    where it had one, and a new worker takes worker 0's. Every worker's envs then restart from fresh resets
    (`restore_run_state`)."""
    if resume is None or resume.workers is None or len(resume.workers) == workers:
        return resume
    each, extra = divmod(resume.counters.global_step // steps_per_iteration, workers)
    iterations = [each + (index < extra) for index in range(workers)]
    saved = resume.workers
    states = [
        WorkerState(saved[index if index < len(saved) else 0].learner, iteration, iteration * steps_per_iteration)
        for index, iteration in enumerate(iterations)
    ]
    return replace(resume, workers=states)


def train_hogwild(
    algorithm: Algorithm, resume: TrainingCheckpoint | None = None, callbacks: Sequence[Callback] = ()
) -> TrainingResult:
    """Train with `cfg.workers` worker processes; the run's result (its saved agent unless interrupted)."""
    cfg = algorithm.cfg
    configure_torch_threads(1)  # the supervisor waits; the cores are the workers'
    callbacks_by_value = ByValue(callbacks, "the callbacks").check()  # before the run folder is made
    runtime = LocalRuntime(0)
    # Worker 0 writes the training's scalars; the supervisor's own (its hyperparameters) go to TensorBoard alone,
    # since one process at a time writes a CSV file or a W&B run: the closing evaluation goes to them after the
    # workers have ended (`log_to_every_logger`).
    run = start_run(cfg.with_changes(logger=supervisor_loggers(cfg.logger)), runtime, resume)
    with ClosedIfItFails() as opened:
        opened.add(run.close)
        return supervise_run(algorithm, run, runtime, resume, callbacks_by_value)


def supervise_run(
    algorithm: Algorithm,
    run: Run,
    runtime: LocalRuntime,
    resume: TrainingCheckpoint | None,
    callbacks: ByValue[Sequence[Callback]],
) -> TrainingResult:
    """Start the workers, hand their checkpoints to the writer, and end the run as they end."""
    resume = resumed_by_workers(resume, algorithm.cfg.workers, algorithm.cfg.steps_per_iteration)
    shared = learner_in_shared_memory(algorithm, runtime, resume)
    context = mp.get_context("spawn")
    channel = Channel(context, algorithm.cfg.workers)
    processes = worker_processes(context, algorithm, shared, channel, run, resume, callbacks)
    writer = CheckpointWriter(algorithm, run.dir)
    train_workers(processes, channel, writer, run, algorithm.cfg.sync)
    interrupted = channel.stop_requested.is_set()
    release(processes, channel)
    return end_run(algorithm, writer, run, interrupted)


def learner_in_shared_memory(
    algorithm: Algorithm, runtime: LocalRuntime, resume: TrainingCheckpoint | None
) -> SharedState:
    """The learner every worker trains, in shared memory: resumed from the checkpoint's, where there is one."""
    cfg = algorithm.cfg
    policy = algorithm.build_policy(runtime.device)
    learner = algorithm.make_learner(policy, runtime, DataShard(algorithm.batch_rows(1)), env_ranks=cfg.workers)
    frames = torch.zeros(cfg.workers, dtype=torch.int64)
    if resume is not None:
        restore_run_state(worker_resume(resume, 0), 0, policy, learner, None)
        frames = torch.tensor([worker.frames for worker in resume.workers or []], dtype=torch.int64)
    return share_learner(learner, cfg.sync, frames)


def worker_processes(
    context: SpawnContext,
    algorithm: Algorithm,
    shared: SharedState,
    channel: Channel,
    run: Run,
    resume: TrainingCheckpoint | None,
    callbacks: ByValue[Sequence[Callback]],
) -> list[SpawnProcess]:
    """The workers, not yet started."""
    env = env_registration(algorithm.cfg.env_id)
    return [
        context.Process(
            target=run_worker,
            name=worker_name(index),
            args=(index, algorithm, shared, channel, run.dir, worker_resume(resume, index), callbacks, env),
        )
        for index in range(algorithm.cfg.workers)
    ]


def train_workers(
    processes: list[SpawnProcess], channel: Channel, writer: CheckpointWriter, run: Run, sync: str
) -> None:
    """Start the workers and supervise them until each has ended with its final checkpoint; on a worker lost, a
    second Ctrl-C or a SIGTERM whose stop did not come in time, stop the others and raise."""
    # The workers hear of Ctrl-C and SIGTERM (a kill, scancel) from the channel.
    with (
        InterruptFlag(on_request=channel.stop_requested.set),
        holding_sigterm("hogwild", channel.stop_requested.set) as sigterm,
    ):
        try:
            start_workers(processes)
            pids = ", ".join(str(process.pid) for process in processes)
            workers = counted(len(processes), "worker")
            print(f"hogwild: {workers} ({sync}), process ids {pids}; run folder {run.dir}", flush=True)
            supervise(processes, channel, writer.add, sigterm)
        except WorkerLost as lost:
            release(processes, channel)
            stopped = f"{lost}; the others were stopped, and the checkpoints written so far are in {run.dir}"
            raise RunStopped(stopped) from None
        except (CtrlCAgain, StoppedBySigterm) as stopped:  # the workers ignore Ctrl-C: this process stops them
            traceback.clear_frames(stopped.__traceback__)  # they hold the channel's queue, which release() frees
            stop_workers(processes, channel)
            release(processes, channel)
            if isinstance(stopped, CtrlCAgain):
                raise
            raise RunStopped(
                f"hogwild: stopped by SIGTERM before its checkpoint: the workers did not agree on a stop within "
                f"{STOP_SECONDS:.0f} s; they were stopped, and the checkpoints written so far are in {run.dir}"
            ) from None
        except RunStopped:  # a checkpoint that could not be written
            stop_workers(processes, channel)
            release(processes, channel)
            raise


def end_run(algorithm: Algorithm, writer: CheckpointWriter, run: Run, interrupted: bool) -> TrainingResult:
    """The run's end once every worker has ended: its figures, and its saved agent's evaluation if it finished."""
    final = writer.last
    if final is None:  # every worker ended without a checkpoint: cannot happen, each ends with one
        raise RuntimeError("the workers ended without handing in their final checkpoint")
    step = final.counters.global_step
    if interrupted:
        report_loop(writer, run, step)
        print(f"interrupted at step {step}: checkpoint written to {run.dir}", flush=True)
        record_end(step, interrupted=True)
        run.close()
        return TrainingResult(os.path.abspath(run.dir), None, None, step)
    log_to_every_logger(run, algorithm.cfg.logger)
    report_loop(writer, run, step)
    evaluation = finish(algorithm, final, run)
    record_end(step, interrupted=False)
    run.close()
    return TrainingResult(os.path.abspath(run.dir), os.path.abspath(agent_path(run.dir)), evaluation, step)


def supervisor_loggers(loggers: Sequence[str]) -> tuple[str, ...]:
    """The loggers the supervisor writes while its workers train: those that several processes can write at once."""
    return tuple(name for name in loggers if name == "tensorboard")


def log_to_every_logger(run: Run, loggers: Sequence[str]) -> None:
    """Once the workers have ended, the supervisor's sink continues worker 0's CSV file and W&B run too."""
    others = [name for name in loggers if name not in supervisor_loggers(loggers)]
    run.sink.add(open_sinks(others, run.dir, True, purge_step=sys.maxsize))


def start_workers(processes: list[SpawnProcess]) -> None:
    """Start the workers with Ctrl-C blocked: a worker still importing would die of it, where a started one
    leaves it to the supervisor. The supervisor's own Ctrl-C waits meanwhile, and reaches it after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with main_module_without_a_missing_file():
            for process in processes:
                process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def supervise(
    processes: list[SpawnProcess],
    channel: Channel,
    on_part: Callable[[int, int, bytes], None],
    sigterm: HeldSigterm,
) -> None:
    """Receive checkpoint parts until every worker has ended; a worker that fails stops all of them, as does a
    SIGTERM whose stop the workers do not agree on in time."""
    while True:
        try:
            on_part(*channel.parts.get(timeout=POLL_SECONDS))
            continue
        except queue.Empty:
            pass
        if channel.stopping.value == INTERRUPTED:
            sigterm.agreed.set()
        if sigterm.overdue():
            raise StoppedBySigterm
        exitcodes = [process.exitcode for process in processes]
        failed = [index for index, code in enumerate(exitcodes) if code not in (None, 0)]
        if failed:
            stop_workers(processes, channel)
            raise WorkerLost(failed[0], exitcodes[failed[0]])  # type: ignore[arg-type]
        if all(code == 0 for code in exitcodes):
            drain(channel, on_part)
            return


def drain(channel: Channel, on_part: Callable[[int, int, bytes], None]) -> None:
    while True:
        try:
            on_part(*channel.parts.get(timeout=POLL_SECONDS))
        except queue.Empty:
            return


def stop_workers(processes: list[SpawnProcess], channel: Channel) -> None:
    """Release workers waiting at a barrier and end them all, so that none is left waiting for a lost peer."""
    channel.barrier.abort()
    channel.stop_now.set()
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()


def release(processes: list[SpawnProcess], channel: Channel) -> None:
    """Free the ended workers and the channel's semaphores now: the run ends with `os._exit`, which
    would leave them for multiprocessing's resource tracker to report as leaked."""
    for process in processes:
        process.join()
        process.close()
    processes.clear()
    channel.parts.close()
    channel.parts.join_thread()
    vars(channel).clear()  # every semaphore it holds, whichever they are
    gc.collect()


class CheckpointWriter:
    """Assembles the workers' parts of each checkpoint and writes it, in the layout of the other modes."""

    def __init__(self, algorithm: Algorithm, run_dir: str) -> None:
        self.algorithm, self.run_dir = algorithm, run_dir
        self.workers = algorithm.cfg.workers
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.last: TrainingCheckpoint | None = None  # the newest checkpoint written
        self.loop_report = ""
        self.loop_figures: dict[str, float] = {}  # the Perf/* scalars of the newest checkpoint's parts

    def add(self, number: int, index: int, data: bytes) -> None:
        parts = self.pending.setdefault(number, {})
        parts[index] = deserialized(data)
        if len(parts) == self.workers:
            self.write([parts[index] for index in range(self.workers)])
            del self.pending[number]

    def write(self, parts: list[dict[str, Any]]) -> None:
        global_step = sum(part["frames"] for part in parts)
        counters = Counters(global_step, parts[0]["iteration"])
        rank_states = [part["source"] for part in parts]
        workers = [WorkerState(float32_state(part["learner"]), part["iteration"], part["frames"]) for part in parts]
        agent = from_file(parts[0]["agent"])
        checkpoint = training_checkpoint(agent, parts[0]["learner"], counters, rank_states, MODE, self.workers, workers)
        keep_checkpoint(self.run_dir, global_step, checkpoint, self.algorithm.cfg.keep_last)
        self.last = checkpoint
        reached(global_step, is_main=True)  # the supervisor journals its progress by the checkpoints it writes
        steps = sum(part["frames_this_run"] for part in parts)
        if steps == 0:  # a relaunch of a finished run trains none, and has no speed to report
            return
        loop_seconds = max(part["loop_seconds"] for part in parts)
        env_seconds = sum(part["env_seconds"] for part in parts) / len(parts)  # each worker's, on average
        peak_rss_mb = [part["peak_rss_mb"] for part in parts]
        self.loop_report = summary_line(steps, loop_seconds, peak_rss_mb, env_seconds=env_seconds)
        self.loop_figures = loop_figures(steps, loop_seconds, env_seconds, peak_rss_mb)
        if self.algorithm.cfg.compile:
            compiling = ", ".join(f"{part['compile_seconds']:.1f}" for part in parts)
            self.loop_report += f"; torch.compile: {compiling} s compiling per worker (left out of the env steps/s)"


def report_loop(writer: CheckpointWriter, run: Run, step: int) -> None:
    """The workers' loop figures of the final checkpoint, printed and logged: none where they trained no step."""
    if writer.loop_report:
        print(writer.loop_report, flush=True)
        run.sink.log_scalars(writer.loop_figures, step)


def finish(algorithm: Algorithm, final: TrainingCheckpoint, run: Run) -> dict[str, float] | None:
    """The saved agent and the closing greedy evaluation (its scalars), from the final global weights."""
    agent = final.saved_agent()
    write_file(agent_path(run.dir), agent)
    policy, normalizer = restored_agent(algorithm, agent)
    return report_evaluation(
        algorithm.cfg, algorithm.spaces.env_id, policy, normalizer, run, final.counters.global_step
    )
