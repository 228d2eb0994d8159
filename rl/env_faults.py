"""What an env can do wrong in the middle of a run: raise, return a value that is not finite, end its process, or
never return.

The first three stop the run with one line that names the env's call and what it did, instead of a
traceback through the vector env, or a "gradient is not finite" that reads as the learner's fault
steps later. An env that raised also shows its own frames, above that line: the bug is there. A
call that never returns is named by the process it holds once that process is stopped
(`stalled_env_call`), since the peers that gave up waiting for it cannot tell what it was doing.

The warnings that gymnasium's checker raises at an env's first calls are shown only where the run takes what those
calls returned (`warnings_shown_if_it_succeeds`). Async envs, whose calls run in worker processes, warn and fail as
those that the training process steps itself (`WorkerEnv` in a worker, `WorkersErrorsRaised` and
`AsyncEnvFaultsNamed` in the training process).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState

from rl.errors import RunStopped, how_it_ended, print_error
from rl.gil_watch import entering_env_call

if TYPE_CHECKING:
    from rl.multi_input import MultiInputLayout

# Frames of the vector env, gymnasium's wrappers and checker, and this package lie between the run and the env's
# own code (numpy's too, where the checker calls it).
PLUMBING = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (__file__, gym.__file__, np.__file__))
GYMNASIUM_ENVS = os.path.join(os.path.dirname(gym.__file__), "envs") + os.sep  # its own envs are env code
GYMNASIUM_MAKE = os.path.join(GYMNASIUM_ENVS, "registration.py")  # but not `gym.make`, which lies beside them
# Python's own modules (functools, where gymnasium dispatches on a space's type) are no env's code either; installed
# packages may lie below them, where Python runs without a virtual environment.
STANDARD_LIBRARY = os.path.join(sysconfig.get_paths()["stdlib"], "")
INSTALLED = tuple(os.path.join(sysconfig.get_paths()[key], "") for key in ("purelib", "platlib"))
# gymnasium's batching of the envs' observations into the vector env's arrays: it fails only on an observation
# of another shape or type than the observation space's.
BATCHING = os.path.join(os.path.dirname(gym.__file__), "vector", "utils") + os.sep


class EnvFault(RunStopped):
    """The env raised or returned a non-finite value: `what` it did, in which call; `frames`, where it raised."""

    def __init__(self, what: str, frames: str = "") -> None:
        super().__init__(f"--env-id: the env's {what}; the run stopped, and the checkpoints written so far are kept")
        self.what = what
        self.context = frames


class EnvCall:
    """`with ENV_STEP:` around an env's call turns what it raises into `EnvFault`, and keeps when the call began
    (one instance per call kind: nothing is made per step)."""

    def __init__(self, call: str) -> None:
        self.call = call
        # time.monotonic() at the start of each call in progress, by thread (`--env-groups` step in threads)
        self.began: dict[int, float] = {}

    def __enter__(self) -> None:
        self.began[threading.get_ident()] = time.monotonic()
        entering_env_call()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.began.pop(threading.get_ident(), None)
        if error is None or not isinstance(error, Exception) or isinstance(error, EnvFault):
            return  # KeyboardInterrupt and the like are the loop's to handle
        if isinstance(error, WorkerFailed):
            raise error.fault(self.call) from None
        frames = env_frames(tb)
        if not frames and any(frame.filename.startswith(BATCHING) for frame in traceback.extract_tb(tb)):
            what = f"{self.call} returned an observation its space does not hold (batching it raised"
            raise EnvFault(f"{what} {summary(error)})") from error
        value = None if frames else unstored_step_value(tb)
        if value is not None:
            raise EnvFault(f"{self.call} returned {value} (storing it raised {summary(error)})") from error
        raise EnvFault(f"{self.call} raised {summary(error)}", frames) from error


# A vector env in this process stores each env's step values in its arrays, one statement naming each (gymnasium's
# SyncVectorEnv): the line that failed names the value it could not store.
STORED_STEP_VALUES = {
    "self._rewards[": "a reward that is not one number",
    "self._terminations[": "a terminated flag that is not one bool",
    "self._truncations[": "a truncated flag that is not one bool",
}


# The dtypes of the arrays that gymnasium's SyncVectorEnv stores its envs' rewards, terminated and truncated flags in.
STORED_DTYPES = (np.float64, np.bool_, np.bool_)


def stored_as_one_value_each(values: np.ndarray, dtype: type, what: str) -> np.ndarray:
    """An async env's stacked step values of more than one axis (each env's value an array) stored one per env as a
    sync vector env stores them, taking what numpy puts where one value goes (a flag given as an array of one value;
    a reward so given where numpy does: 2.2, with a DeprecationWarning, not 2.4); raise `EnvFault` naming `what`
    for the rest."""
    stored = np.empty(len(values), dtype)
    try:
        for index, value in enumerate(values):
            stored[index] = value
    except (TypeError, ValueError):
        raise EnvFault(f"step returned {what} (of shape {np.shape(values)[1:]} in each env)") from None
    return stored


def unstored_step_value(tb: TracebackType | None) -> str | None:
    """Which step value the vector env failed to store, where that is what failed: "a reward that is not one
    number"; None otherwise."""
    frames = traceback.extract_tb(tb)
    line = (frames[-1].line or "") if frames else ""
    return next((value for stored, value in STORED_STEP_VALUES.items() if line.startswith(stored)), None)


ENV_STEP, ENV_RESET = EnvCall("step"), EnvCall("reset")


def stalled_env_call(seconds: float) -> str:
    """ "the env's step had not returned after 37 s" while this process's env call has run `seconds` or longer (a
    hung env, or a simulator that stopped answering); empty otherwise."""
    now = time.monotonic()
    for call in (ENV_STEP, ENV_RESET):
        began = min(list(call.began.values()), default=None)  # a copy: another thread may start or end a call
        if began is not None and now - began >= seconds:
            return f"the env's {call.call} had not returned after {now - began:.0f} s"
    return ""


PIPE_CLOSED = (EOFError, BrokenPipeError, ConnectionResetError)  # what an async env's call meets once a worker is gone
WORKER_EXIT_SECONDS = 2.0  # a worker whose pipe closed has its exit code within this


SHOWN_WARNINGS: set[tuple[str, type[Warning], str, int]] = set()  # held warnings shown in this process


@contextlib.contextmanager
def warnings_shown_if_it_succeeds() -> Iterator[None]:
    """Hold the warnings raised in the block, shown once it has ended without an error: a refusal or an env's fault
    stays one line, which says what they would (gymnasium warns that a version is out of date, then refuses it as
    removed; its checker warns of the reward an env's first step returned, which then cannot be stored).

    Only the showing is held (each warning meets the filters as it is raised, in its own module), and a held
    warning is shown once a process: the filters forget what they have shown whenever they change (a library's
    import adds some), and an env's every maker (inspecting, training, evaluating) would repeat it. The hold is
    the process's: blocks in two threads at once would each take the other's (a rank's env groups take their first
    steps in turn)."""
    with warnings_held() as held:
        yield
    held.show()


@contextlib.contextmanager
def warnings_held() -> Iterator[HeldWarnings]:
    """Hold the showing of the block's warnings, for the caller to show or drop."""
    show = warnings.showwarning
    held = HeldWarnings(show)
    warnings.showwarning = held
    try:
        yield held
    finally:
        warnings.showwarning = show


class HeldWarnings:
    """`warnings.showwarning` while a block's warnings are held: it keeps them, for `show` to show as `shown_by`,
    each once a process."""

    def __init__(self, shown_by: Callable[..., None]) -> None:
        self.warnings: list[tuple[Any, ...]] = []
        self.shown_by = shown_by

    def __call__(self, *warning: Any) -> None:
        self.warnings.append(warning)

    def show(self) -> None:
        for message, category, filename, lineno, *where in self.warnings:
            if not isinstance(self.shown_by, HeldWarnings):  # else an enclosing block holds it, and shows it once
                seen = (str(message), category, filename, lineno)
                if seen in SHOWN_WARNINGS:
                    continue
                SHOWN_WARNINGS.add(seen)
            self.shown_by(message, category, filename, lineno, *where)
        self.warnings.clear()


WORKERS_HELD_CALLS = 2  # an async env's worker holds the warnings of its env's first reset and first step
CLOSE_REPORTED, HELD_WARNINGS = "close_reported", "held_warnings"  # `WorkerEnv` methods, which workers call


class WorkerEnv(gym.Wrapper):
    """An async env in its worker process, made to warn and fail as an env that the training process steps itself.

    - It holds the warnings of its first reset and first step (gymnasium's checker warns of the values they
      returned), which the training process fetches once it has taken what the call returned
      (`AsyncEnvFaultsNamed`), to show each once; where it stopped the run instead, its one line stands alone.
    - It closes its env when the training process asks (`close_reported`), and says what the close raised, for
      the training process to name once: raised in gymnasium's worker, it would print a traceback in each process.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.held_calls = WORKERS_HELD_CALLS
        self.held: list[tuple[Any, ...]] = []
        self.env_closed = False

    def reset(self, **kwargs: Any) -> Any:
        if self.held_calls == 0:
            return self.env.reset(**kwargs)
        return self.call_held(lambda: self.env.reset(**kwargs))

    def step(self, action: Any) -> Any:
        if self.held_calls == 0:  # every step after the first: nothing made per step
            return self.env.step(action)
        return self.call_held(lambda: self.env.step(action))

    def call_held(self, call: Callable[[], Any]) -> Any:
        self.held_calls -= 1
        with warnings_held() as held:
            try:
                return call()
            finally:
                self.held += held.warnings

    def held_warnings(self) -> list[tuple[str, str, str, str, int]]:
        """The warnings held so far, which it holds no longer: each its message, its category's module and name (a
        category of the env's own module pickles only where that module is imported), its file and line."""
        taken, self.held = self.held, []
        return [
            (str(message), category.__module__, category.__qualname__, filename, lineno)
            for message, category, filename, lineno, *_ in taken
        ]

    def close_reported(self) -> tuple[str, str] | None:
        """Close the env: None, or what its close raised (the error in one line, and the traceback's text)."""
        self.held, self.env_closed = [], True
        try:
            self.env.close()
        except Exception as error:
            return summary(error), traceback.format_exc()
        return None

    def close(self) -> None:
        if not self.env_closed:
            self.env_closed = True
            self.env.close()


def show_warnings_fetched(fetched: Iterable[list[tuple[str, str, str, str, int]]]) -> None:
    """Show the warnings that async envs' workers held (`WorkerEnv.held_warnings`), each once (the workers run the
    same env, and warn alike), as if raised here: through this process's filters, and noted as shown where their
    module keeps that, so that the same warning raised here later (by an evaluation's env) is not shown again."""
    with warnings_held() as held:
        for worker in fetched:
            for message, module, name, filename, lineno in worker:
                category = getattr(sys.modules.get(module), name, UserWarning)
                source = module_of_file(filename)
                registry = vars(source).setdefault("__warningregistry__", {}) if source else None
                warnings.warn_explicit(message, category, filename, lineno, getattr(source, "__name__", None), registry)
    held.show()


def module_of_file(filename: str) -> types.ModuleType | None:
    """The module imported from `filename` in this process, if any."""
    return next(
        (module for module in list(sys.modules.values()) if getattr(module, "__file__", None) == filename), None
    )


# The test in gymnasium's async worker (and env checker) that ends an episode, which fails on a flag of more than one
# value.
FLAGS_TESTED, FLAG_NOT_ONE_BOOL = "if terminated or truncated:", "a terminated or truncated flag that is not one bool"


def flag_test_failed(tb: TracebackType | None) -> bool:
    """Whether what failed is gymnasium's test of an env's terminated and truncated flags."""
    frames = traceback.extract_tb(tb)
    return bool(frames) and frames[-1].line == FLAGS_TESTED


class WorkerFailed(Exception):
    """What an async env's worker raised, in one line (`summary`), with its traceback's text: its frames lie in the
    worker's process."""

    def __init__(self, raised: str, trace: str) -> None:
        super().__init__(raised)
        self.trace = trace

    def fault(self, call: str) -> EnvFault:
        """The fault, named as where the env steps in this process: the env raised, in its own frames (shown), or
        the worker could not store or test what the env returned."""
        frames = traceback_frames(self.trace)
        if frames and not any(is_env_code(filename) for filename, _ in frames):  # the env returned, the worker failed
            filename, lines = frames[-1]
            if filename.startswith(BATCHING):
                return EnvFault(f"{call} returned an observation its space does not hold (storing it raised {self})")
            if FLAGS_TESTED in lines:
                return EnvFault(f"{call} returned {FLAG_NOT_ONE_BOOL} (testing it raised {self})")
        return EnvFault(f"{call} raised {self}", self.env_frames())

    def env_frames(self) -> str:
        """As `env_frames` gives them, from the worker's traceback."""
        frames = traceback_frames(self.trace)
        own = next((i for i, (filename, _) in enumerate(frames) if is_env_code(filename)), len(frames))
        shown = "".join(lines for _, lines in frames[own:]).rstrip("\n")
        return f"the env raised in these frames:\n{shown}" if shown else ""


FRAME_LINE = re.compile(r'  File "(?P<filename>[^"]*)", line \d+')


def traceback_frames(trace: str) -> list[tuple[str, str]]:
    """The frames of a traceback printed as Python prints one (its last, where exceptions were chained): each
    frame's file, and its lines (the `File` line, and the source and carets under it)."""
    frames: list[tuple[str, str]] = []
    in_frames = False
    for line in trace.splitlines(keepends=True):
        if line.startswith("Traceback (most recent call last):"):
            frames, in_frames = [], True
        elif in_frames and (found := FRAME_LINE.match(line)):
            frames.append((found["filename"], line))
        elif in_frames and frames and line.startswith("    "):
            filename, lines = frames[-1]
            frames[-1] = (filename, lines + line)
        else:
            in_frames = False
    return frames


class WorkersErrorsRaised(gym.vector.AsyncVectorEnv):
    """gymnasium's async vector env, which raises what a worker raised as `WorkerFailed`, with the worker's
    traceback, for the run to name in one line; gymnasium's own logs the traceback in red, then raises the error
    again without it."""

    def _raise_if_errors(self, successes: Iterable[bool]) -> None:
        failures = [self.error_queue.get() for success in successes if not success]
        if not failures:
            return
        for index, *_ in failures:  # as gymnasium does: a failed worker's pipe is done with
            self.parent_pipes[index].close()
            self.parent_pipes[index] = None
        self._state = AsyncState.DEFAULT
        _, _, error, trace = failures[0]
        raise WorkerFailed(summary(error), trace)

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the workers; where an env's close raised in one (each closes its env first, as the training
        process asks), raise `WorkerFailed` for it once they are all closed."""
        failure = None
        if not terminate and self._state == AsyncState.DEFAULT and all(self.parent_pipes):
            try:
                reports = self.call(CLOSE_REPORTED)
                failure = next((report for report in reports if report is not None), None)
            except Exception:  # a worker that fails now: all of them are ended
                terminate = True
        super().close_extras(timeout, terminate)
        if failure is not None:
            raise WorkerFailed(*failure)


class AsyncEnvFaultsNamed(gym.vector.VectorWrapper):
    """An async vector env whose worker process ends mid-call (a crash in an env's native code, the out-of-memory
    killer) raises `EnvFault` naming the env and how its process ended, rather than its pipe's EOFError. A reward or
    flag that an env gives as an array (which it stacks as a column each) is taken or refused as a sync vector env
    takes or refuses it, rather than failing in the wrappers over its shape. After its first reset and step it
    shows the warnings that its workers held, once each."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.calls_holding_warnings = WORKERS_HELD_CALLS

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        try:
            reset = self.env.reset(**kwargs)
        except PIPE_CLOSED:
            self.raise_if_a_worker_ended("reset")
            raise
        self.show_workers_warnings()
        return reset

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        try:
            stepped = self.env.step(actions)
        except PIPE_CLOSED:
            self.raise_if_a_worker_ended("step")
            raise
        obs, *values, infos = stepped
        stored = [
            each if np.ndim(each) == 1 else stored_as_one_value_each(each, dtype, what)
            for each, dtype, what in zip(values, STORED_DTYPES, STORED_STEP_VALUES.values(), strict=True)
        ]
        self.show_workers_warnings()
        return obs, *stored, infos

    def show_workers_warnings(self) -> None:
        """After a call whose warnings the workers held (their envs' first reset and step), taken: show them."""
        if self.calls_holding_warnings > 0:
            self.calls_holding_warnings -= 1
            show_warnings_fetched(self.env.call(HELD_WARNINGS))

    def raise_if_a_worker_ended(self, call: str) -> None:
        ended = ended_processes(self.env.unwrapped.processes)
        if ended:
            self.end_every_worker()
            index, exitcode = ended[0]
            raise EnvFault(f"process (env {index}) {how_it_ended(exitcode)} during a {call}")

    def end_every_worker(self) -> None:
        """Stop the other workers and close the env, without waiting for the call in progress: gymnasium's own
        `close` waits for it, and raises on the closed pipe before it stops any worker."""
        envs = self.env.unwrapped
        for process in envs.processes:
            if process.is_alive():
                process.terminate()
        for pipe in envs.parent_pipes:
            if pipe is not None:
                pipe.close()
        for process in envs.processes:
            process.join(timeout=WORKER_EXIT_SECONDS)
            if process.is_alive():  # SIGTERM is the default's in a worker (rl.envs), but a native call may hold it
                process.kill()
                process.join()
        envs.closed = True


def ended_processes(processes: list[BaseProcess]) -> list[tuple[int, int]]:
    """(index, exit code) of the `processes` that have ended, waiting a little for the first: a process closes its
    pipes before its exit code can be read."""
    deadline = time.monotonic() + WORKER_EXIT_SECONDS
    while True:
        ended = [(index, process.exitcode) for index, process in enumerate(processes) if process.exitcode is not None]
        if ended or time.monotonic() >= deadline:
            return ended
        time.sleep(0.01)


def close_envs(envs: gym.vector.VectorEnv) -> None:
    """Close envs done with; one whose close raises is named in a warning (its frames above it), and the run goes
    on to its result: the training or evaluation it served is over."""
    try:
        envs.close()
    except WorkerFailed as error:
        warn_of_close_fault(error.env_frames(), str(error))
    except Exception as error:
        warn_of_close_fault(env_frames(error.__traceback__), summary(error))


def warn_of_close_fault(frames: str, raised: str) -> None:
    if frames:
        print_error(frames)
    print_error(f"warning: --env-id: the env's close raised {raised}; the run goes on")


def summary(error: BaseException) -> str:
    """The error's type and the first line of its message."""
    return f"{type(error).__name__}: {str(error).splitlines()[0]}" if str(error).strip() else type(error).__name__


def env_frames(tb: TracebackType | None) -> str:
    """The traceback's frames from the first in the env's own code, as Python prints them; empty where the env's
    code is not among them (a vector env's worker process prints its own)."""
    own = own_frames(tb)
    return "the env raised in these frames:\n" + "".join(traceback.format_list(own)).rstrip("\n") if own else ""


def own_frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    frames = traceback.extract_tb(tb)
    first = next((i for i, frame in enumerate(frames) if is_env_code(frame.filename)), len(frames))
    return frames[first:]


def is_env_code(filename: str) -> bool:
    """Whether a frame's file is an env's: gymnasium's envs, and any file but the plumbing's and Python's own."""
    if filename.startswith(GYMNASIUM_ENVS):
        return filename != GYMNASIUM_MAKE
    if filename.startswith(PLUMBING):
        return False
    return filename.startswith(INSTALLED) or not filename.startswith(STANDARD_LIBRARY)


def check_finite(
    obs: np.ndarray,
    reward: np.ndarray | None = None,
    call: str = "step",
    layout: MultiInputLayout | None = None,
    what: str = "an observation",
    envs: np.ndarray | None = None,
) -> None:
    """Raise `EnvFault` if a reward or an observation's value is NaN or infinite.

    The observation's values: a floating-point one's, or the vectors' of a Dict with images, whose rows of
    bytes `layout` reads back. `envs`: which envs the rows are of, where not all of them in order.
    """
    if reward is not None:
        stop_if_not_finite(reward, call, "a reward", envs)
    if layout is not None:
        if layout.vector_bytes:
            stop_if_not_finite(layout.vector_values(obs), call, what, envs, layout.vector_key_at)
    elif obs.dtype.kind == "f":
        stop_if_not_finite(obs, call, what, envs)


def stop_if_not_finite(
    values: np.ndarray,
    call: str,
    where: str,
    envs: np.ndarray | None = None,
    key_at: Callable[[int], str] | None = None,
) -> None:
    """`EnvFault` naming the first value that is not finite, its env, and (`key_at` its column) its key."""
    if np.isfinite(values).all():
        return
    rows = values.reshape(len(values), -1)  # a row per env
    row, column = np.argwhere(~np.isfinite(rows))[0]
    if key_at is not None:
        where = f"{where}'s {key_at(column)!r}"
    env = row if envs is None else envs[row]
    value = rows[row, column]
    # gymnasium's vector envs store a None reward as nan: that may be what the env returned
    stored = "; or None, which the vector env stores as nan" if where == "a reward" and np.isnan(value) else ""
    raise EnvFault(f"{call} returned {value} in {where} (env {env}{stored})")
