"""The training loop that every mode runs, its clocks, and the events that callbacks attach to.

A mode supplies only what is its own, as a `LoopBody`: one iteration of its role (collect and
learn, collect and send, ...), its report, how its processes agree on what a report decided,
and how it writes a checkpoint. `TrainingLoop` does the rest, written once: when a report is
due, Ctrl-C and SIGTERM, the checkpoint clock and step interval, the periodic evaluation and
--stop-at-return, a callback's request to stop, the final checkpoint, and the events.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rl import PROCESS_STARTED
from rl.compiling import compile_seconds
from rl.config import RunConfig
from rl.logger import MetricsSink
from rl.run import Run
from rl.runtime import Runtime
from rl.signals import (
    ctrl_c_counted,
    hear_ctrl_c,
    on_main_thread,
    sigterm_asks_for_a_stop,
    stop_agreed,
    take_back_an_unanswered_sigterm,
)


def checkpoint_due(every: int, global_step: int, steps_since_last_check: int) -> bool:
    """Whether the steps since the last check crossed a multiple of `every` env steps (0: never)."""
    return every > 0 and global_step // every > (global_step - steps_since_last_check) // every


def report_due(iteration: int, every: int, last_iteration: int) -> bool:
    """Iterations that log (and check for a stop and checkpoints): every `every`-th, and the last."""
    return iteration % every == 0 or iteration == last_iteration


# Env steps (of every process together) between two checks for a stop (Ctrl-C, SIGTERM): between two reports too,
# which SAC makes every 1,000 steps, longer than launchers wait for a stop (30 s under fabric run and torchrun) where
# steps are slow.
STOP_CHECK_STEPS = 100


def stop_check_interval(report_every: int, steps_per_iteration: int) -> int:
    """Iterations between two checks for a stop: at most `report_every`, about `STOP_CHECK_STEPS` env steps."""
    return max(1, min(report_every, STOP_CHECK_STEPS // steps_per_iteration))


def next_check(iteration: int, report_every: int, stop_check_every: int, last_iteration: int) -> int:
    """The first iteration from `iteration` on at which the processes agree on a stop: a report's or a stop
    check's."""
    return min(
        math.ceil(iteration / report_every) * report_every,
        math.ceil(iteration / stop_check_every) * stop_check_every,
        last_iteration,
    )


class LoopClock:
    """The training loop's seconds, less what this process spent compiling (--compile): the env steps/s
    measure training, and the compile time is reported on its own line."""

    def __init__(self) -> None:
        self.start, self.compiled_before = time.perf_counter(), compile_seconds()

    def compile_seconds(self) -> float:
        return compile_seconds() - self.compiled_before

    def seconds(self, also_left_out: float = 0.0) -> float:
        """Since the loop began, less the compile time and `also_left_out` (a peer's compile time waited for)."""
        return time.perf_counter() - self.start - self.compile_seconds() - also_left_out


def report_compile_time(cfg: RunConfig, seconds: float, who: str = "this process") -> None:
    if cfg.compile:
        print(f"torch.compile: {seconds:.1f} s compiling in {who} (left out of the env steps/s)", flush=True)


def summary_line(
    steps: int,
    seconds: float,
    peak_rss_mb: Sequence[float] = (),
    process_seconds: float | None = None,
    env_seconds: float | None = None,
    update_wait_seconds: float | None = None,
) -> str:
    """The line that closes every run's loop (benchmarks read their env steps/s from it). `env_seconds`: how long
    the process that prints it (or each worker, on average) spent in its envs' steps; `update_wait_seconds`: how
    long a decoupled player waited for the trainers' updates."""
    line = f"training loop: {steps} steps in {seconds:.2f} s ({steps / seconds:,.0f} steps/s)"
    if env_seconds is not None:
        line += f"; stepping the envs: {env_seconds:.2f} s ({env_seconds / seconds:.0%})"
    if update_wait_seconds is not None:
        line += f"; waiting for updates: {update_wait_seconds:.2f} s ({update_wait_seconds / seconds:.0%})"
    if peak_rss_mb:
        line += f"; peak RSS per rank (MB): {rss_text(peak_rss_mb)}"
    if process_seconds is not None:
        line += f"; rank 0 process time so far: {process_seconds:.2f} s"
    return line


def report_resources(
    runtime: Runtime, run: Run, loop_seconds: float, steps: int, global_step: int, env_seconds: float
) -> None:
    """Loop speed over this launch's `steps`, rank 0's time in its envs' steps, and each rank's process time and
    peak memory, printed and logged by rank 0 at `global_step` (past the resumed step, where a run resumed). A launch
    that trained no step (a relaunch of a finished run) has no speed to report, and reports nothing."""
    if steps == 0:  # the same on every rank: none of them joins the gather
        return
    process_seconds = time.monotonic() - PROCESS_STARTED
    per_rank = runtime.all_gather_rows(torch.tensor([[own_peak_rss_mb(), process_seconds]], dtype=torch.float64))
    peak_rss = per_rank[:, 0].tolist()
    run.sink.log_scalars(loop_figures(steps, loop_seconds, env_seconds, peak_rss), global_step)
    if runtime.is_main:
        print(summary_line(steps, loop_seconds, peak_rss, float(per_rank[0, 1]), env_seconds), flush=True)


RSS_LISTED = 8  # ranks whose peak RSS the closing line lists one by one; more are given as a range


def rss_text(peak_rss_mb: Sequence[float]) -> str:
    """Each rank's peak RSS, "412, 398"; for many ranks their range, "398 to 412 over 64 ranks"."""
    if len(peak_rss_mb) <= RSS_LISTED:
        return ", ".join(f"{mb:.0f}" for mb in peak_rss_mb)
    return f"{min(peak_rss_mb):.0f} to {max(peak_rss_mb):.0f} over {len(peak_rss_mb)} ranks"


def own_peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def peak_rss_figure(peak_rss_mb: Sequence[float]) -> dict[str, float]:
    """The `Perf/*` scalar of the largest peak memory over a run's processes."""
    return {"Perf/peak_rss_mb_max": float(max(peak_rss_mb))}


def loop_figures(
    steps: int, loop_seconds: float, env_seconds: float, peak_rss_mb: Sequence[float] = ()
) -> dict[str, float]:
    """A loop's closing `Perf/*` scalars: its env steps/s, the share of its time spent in the envs' steps and,
    where every process's is known, the largest peak memory."""
    figures = {"Perf/loop_steps_per_second": steps / loop_seconds, "Perf/env_step_share": env_seconds / loop_seconds}
    return figures | (peak_rss_figure(peak_rss_mb) if peak_rss_mb else {})


class CheckpointClock:
    """`--checkpoint-every` as a time: due once that long has passed since the last checkpoint."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds

    def restart(self) -> None:
        self.last = time.monotonic()


class StopRequest:
    """How a training loop hears that it should checkpoint and stop, while it runs (`with` it)."""

    requested: bool = False

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


class CtrlCAgain(KeyboardInterrupt):
    """A second Ctrl-C while training: stop at once, where the process is, without the checkpoint the first asked
    for (an env step that never returns cannot reach it)."""


class InterruptFlag(StopRequest):
    """Ctrl-C (SIGINT, which the launchers pass on to every rank), while training, asks for a checkpoint
    and a clean stop at the next report, agreed by all ranks, rather than a KeyboardInterrupt in the
    middle of a collective; a second raises `CtrlCAgain`. Outside training Ctrl-C does what it did before
    (in a notebook: it interrupts the cell; the command line's entry points end with one line)."""

    heard_in_this_process = False  # whether training here has listened for Ctrl-C (a later one comes after it)

    def __init__(self, on_request: Callable[[], object] | None = None) -> None:
        self.on_request = on_request
        self.previous: Any = None

    def __enter__(self) -> InterruptFlag:
        if on_main_thread():
            self.previous = signal.signal(signal.SIGINT, self._request)
            ctrl_c_counted(True)
            InterruptFlag.heard_in_this_process = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.previous is not None:  # None: not set from this thread, or replaced a handler set outside Python
            signal.signal(signal.SIGINT, self.previous)
            ctrl_c_counted(False)

    def _request(self, signum: int, frame: object) -> None:
        hear_ctrl_c()
        if self.requested:
            raise CtrlCAgain
        self.requested = True
        if os.environ.get("RANK", "0") == "0":  # os.write: a print could land inside one the handler interrupted
            os.write(2, b"\nCtrl-C: checkpointing, then stopping (Ctrl-C again stops at once, without it)\n")
        if self.on_request is not None:
            self.on_request()


@dataclass
class Requests:
    """What a process asks for at a report (between reports, at a stop check: Ctrl-C or SIGTERM only); pooled over the
    processes (`LoopBody.agree`), a request of any one of them holds for all."""

    interrupt: bool = False  # Ctrl-C or SIGTERM: checkpoint and stop, the run unfinished
    checkpoint: bool = False  # a checkpoint is due (by the clock, or by --checkpoint-every steps)
    finish: bool = False  # --stop-at-return was reached or a callback asked to stop: the run ends finished

    def as_flags(self) -> list[bool]:
        return [self.interrupt, self.checkpoint, self.finish]


def agreed(runtime: Runtime, wanted: Requests) -> Requests:
    """Each request, held where any rank made it: one all-reduce for all of them."""
    flags = torch.tensor([float(flag) for flag in wanted.as_flags()], device=runtime.device)
    return Requests(*(value > 0 for value in runtime.all_reduce_sum(flags).tolist()))


@dataclass
class LoopState:
    """Where the loop is, as the events see it.

    Attributes:
        iteration: The iteration (a rollout and its update), counted from 1.
        global_step: The run's env steps so far, all processes' together.
        num_iterations: The iterations the run trains in all.
        rank: This process's rank among those that run the loop.
        is_main: Whether this process logs (one process of the run does).
        run_dir: The run's folder, where this process knows it (every rank in coupled mode, the lead player,
            Hogwild's worker 0); else None.
        stop_requested: Whether a callback of this process called `request_stop`.
        interrupted: In `on_finish`: whether Ctrl-C or SIGTERM stopped the run.
    """

    iteration: int
    global_step: int
    num_iterations: int
    rank: int
    is_main: bool
    run_dir: str | None
    sink: MetricsSink | None = field(default=None, repr=False)  # the run's loggers, which only the main one writes
    stop_requested: bool = False
    interrupted: bool = False

    def log(self, scalars: dict[str, float]) -> None:
        """Log scalars of your own (`{"Custom/x": 1.0}`) with the run's loggers (--logger: TensorBoard, CSV,
        W&B) at `global_step`; on a process that does not log (`is_main` False), nothing."""
        if self.sink is not None:
            self.sink.log_scalars(scalars, self.global_step)

    def request_stop(self) -> None:
        """End the run at this report (or the next), on every process, as a finished run: its agent saved and
        evaluated. A launch after it (the same `run_name`, a restart under torchrun) trains on from its final
        checkpoint until a callback asks again: the request is not saved."""
        self.stop_requested = True


class Callback:
    """Code of your own on the training loop's events: pass instances to `rl.train(config, callbacks=[...])`.

    Every process that runs the loop calls its callbacks (each rank when coupled, each player when
    decoupled, each Hogwild worker); `state.is_main` tells the one that logs. `state.request_stop()`
    from any event, on any process, ends the run on all of them at the report where it was asked
    (the next one if asked between reports), as a finished run. Override the events you need; a
    method that looks meant for one but is none (`on_reprot`, Stable-Baselines3's `_on_step`) is
    warned of when the run starts, since the loop never calls it.
    Each Hogwild worker calls a copy of its own: what it gathers reaches the caller through what
    processes share (a `multiprocessing` queue, a tensor in shared memory)."""

    def on_iteration_start(self, state: LoopState) -> None:
        """Before each iteration (`state.iteration` and `state.global_step` are those it is about to reach)."""

    def on_iteration_end(self, state: LoopState) -> None:
        """After each iteration: a rollout collected, and learned from."""

    def on_report(self, state: LoopState, scalars: dict[str, float]) -> None:
        """At each report, with the scalars it logged (every rank has them when coupled)."""

    def on_evaluation(self, state: LoopState, scalars: dict[str, float]) -> None:
        """After each `--eval-every` evaluation (on the process that evaluates), with its `Eval/` scalars."""

    def on_checkpoint(self, state: LoopState) -> None:
        """After a checkpoint was written (the files are in `state.run_dir`/checkpoints)."""

    def on_finish(self, state: LoopState) -> None:
        """When the loop has ended: `state.interrupted` after Ctrl-C or SIGTERM, else training is done."""


class LoopBody(Protocol):
    """What a mode's process does at each point of the loop."""

    def iterate(self, iteration: int) -> None:
        """One iteration of this process's role."""

    def report(self, iteration: int) -> dict[str, float]:
        """Log this report's statistics; the scalars logged (empty where this process logs none)."""

    def agree(self, iteration: int, wanted: Requests) -> Requests:
        """Pool this report's requests with the other processes'."""

    def ended(self, iteration: int) -> None:
        """The loop's last iteration is done (its final checkpoint comes next): stop the clocks."""

    def checkpoint(self, iteration: int) -> None:
        """Write (or take part in writing) a training checkpoint at the end of `iteration`."""


@dataclass
class Evaluation:
    """A periodic evaluation that the loop runs at reports: `evaluate(step)` gives its `Eval/` scalars when it
    evaluated, else None; `target` is --stop-at-return."""

    evaluate: Callable[[int], dict[str, float] | None]
    target: float | None


@dataclass
class TrainingLoop:
    """Iterations from `first_iteration` to `num_iterations`, with a report every `report_every` and the last;
    at a report the processes agree whether to checkpoint or stop. `keeps_clock`: this process keeps a
    checkpoint clock, whose checkpoint the mode's `agree` makes every process's (one process keeps it, or each
    Hogwild worker, the first due asking all)."""

    cfg: RunConfig
    body: LoopBody
    state: LoopState
    first_iteration: int
    report_every: int
    steps_per_iteration: int  # every process's env steps together
    keeps_clock: bool
    evaluation: Evaluation | None = None
    callbacks: Sequence[Callback] = ()
    interrupt: StopRequest = field(default_factory=InterruptFlag)  # Ctrl-C, or how the mode hears of it

    def __post_init__(self) -> None:
        self.clock = CheckpointClock(self.cfg.checkpoint_seconds)
        self.stop_check_every = stop_check_interval(self.report_every, self.steps_per_iteration)
        # The iteration of the newest checkpoint: at first the one this run resumed from (if any), so that a
        # loop with no iteration left to run (a Hogwild worker resumed at its last) writes it no second time.
        self.saved_at = self.first_iteration - 1
        self.sigterm_heard = False  # SIGTERM asks for the stop Ctrl-C asks for (rl.signals.HeldSigterm)

    def run(self) -> LoopState:
        """The loop, to its last iteration or a stop; the state it ended in. It ends with a checkpoint."""
        with self.interrupt, sigterm_asks_for_a_stop(self.hear_sigterm):
            state = self._run()
        take_back_an_unanswered_sigterm()
        if self.interrupt.requested:  # a Ctrl-C after the last stop check: the loop has ended with its checkpoint
            stop_agreed()
        return state

    def hear_sigterm(self) -> None:
        self.sigterm_heard = True

    def stop_wanted(self) -> bool:
        """Whether this process asks to checkpoint and stop: Ctrl-C, or SIGTERM."""
        return self.interrupt.requested or self.sigterm_heard

    def _run(self) -> LoopState:
        state = self.state
        iteration, start_step = self.first_iteration - 1, state.global_step
        checked_step = start_step
        for iteration in range(self.first_iteration, state.num_iterations + 1):
            state.iteration = iteration
            state.global_step = start_step + (iteration - self.first_iteration + 1) * self.steps_per_iteration
            self.fire("on_iteration_start")
            self.body.iterate(iteration)
            self.fire("on_iteration_end")
            if report_due(iteration, self.report_every, state.num_iterations):
                self.fire("on_report", self.body.report(iteration))
                last = iteration == state.num_iterations
                finish = not last and (self.evaluated_target() or state.stop_requested)
                steps = state.global_step - checked_step
                steps_due = checkpoint_due(self.cfg.checkpoint_steps, state.global_step, steps)
                checked_step = state.global_step
                time_due = self.keeps_clock and self.clock.due()
                wanted = Requests(self.stop_wanted(), steps_due or time_due, finish)
            elif iteration % self.stop_check_every == 0:  # between reports: Ctrl-C or SIGTERM only
                wanted = Requests(interrupt=self.stop_wanted())
            else:
                continue
            decided = self.body.agree(iteration, wanted)
            if decided.interrupt or decided.finish:
                state.interrupted = decided.interrupt
                if decided.interrupt:
                    stop_agreed()
                break  # to the final checkpoint
            if decided.checkpoint:
                self.checkpoint(iteration)
        self.body.ended(iteration)
        if self.saved_at != iteration:
            self.checkpoint(iteration)
        self.fire("on_finish")
        return state

    def checkpoint(self, iteration: int) -> None:
        self.saved_at = iteration
        self.clock.restart()
        self.body.checkpoint(iteration)
        self.fire("on_checkpoint")

    def evaluated_target(self) -> bool:
        """Run the periodic evaluation if one is due here; whether it reached --stop-at-return."""
        if self.evaluation is None:
            return False
        scalars = self.evaluation.evaluate(self.state.global_step)
        if scalars is None:
            return False
        self.fire("on_evaluation", scalars)
        target = self.evaluation.target
        if target is None or scalars["Eval/return_mean"] < target:
            return False
        step = self.state.global_step
        print(f"step {step}: the greedy return reached --stop-at-return {target:g}; training ends here", flush=True)
        return True

    def fire(self, event: str, *payload: dict[str, float]) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self.state, *payload)
