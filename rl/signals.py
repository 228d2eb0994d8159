"""This process's stop signals: Ctrl-C counted, SIGTERM held for a stop the processes agree on, signals seen from a
thread where the main thread runs no handler, and the end of the process that started this one."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

_ctrl_c_heard = 0  # the Ctrl-Cs (SIGINT, which the launchers pass on to every rank) this process's handlers ran for
_command_line = False  # this process is the command line's (`rl.cli.run_main`), not a caller's (a notebook's)


def hear_ctrl_c(*_: object) -> None:
    """Note that this process has had Ctrl-C, whatever it does about it (a signal handler as it is, or called from
    one): a peer lost after it may have ended by it, as a process that is still starting does."""
    global _ctrl_c_heard
    _ctrl_c_heard += 1


_ctrl_c_counted = False  # whether this process's SIGINT handler now calls `hear_ctrl_c` (the training loop's does)


def ctrl_c_counted(counted: bool) -> None:
    """Whether this process's SIGINT handler calls `hear_ctrl_c` from now on: where it does, a Ctrl-C it has not heard
    in time was not taken (`PeerWatch.ctrl_c_not_taken`); where it does not (Python's, which raises
    KeyboardInterrupt), nothing can be told of it."""
    global _ctrl_c_counted
    _ctrl_c_counted = counted


def ctrl_c_is_counted() -> bool:
    """Whether this process's SIGINT handler now calls `hear_ctrl_c` (`ctrl_c_counted`)."""
    return _ctrl_c_counted


def ctrl_c_heard() -> int:
    """How many Ctrl-Cs this process's handlers have run for."""
    return _ctrl_c_heard


def command_line_owns_this_process() -> None:
    """This process runs the command line: a second Ctrl-C that its handler cannot take (its main thread held in
    native code) may end it from a thread (`PeerWatch.ctrl_c_not_taken`), where in a caller's process (a notebook's
    kernel) it is left to the caller."""
    global _command_line
    _command_line = True


def owned_by_the_command_line() -> bool:
    """Whether this process runs the command line (`command_line_owns_this_process`)."""
    return _command_line


def ctrl_c_only_noted() -> None:
    """For a role that leaves Ctrl-C to others (they checkpoint, then stop it): note it, and go on."""
    signal.signal(signal.SIGINT, hear_ctrl_c)
    signal.siginterrupt(signal.SIGINT, False)  # a system call under way goes on, as it did while SIGINT was ignored


class StoppedBySigterm(BaseException):
    """A SIGTERM whose stop did not come in time, raised where the process waited, so that it can stop what it
    started before it ends (a BaseException, as KeyboardInterrupt is: no handler of ordinary errors on the way takes
    it for one of its own)."""


# Between their SIGTERM and SIGKILL, torchrun's agent, SLURM (KillWait) and Kubernetes wait 30 s by default: a stop
# not agreed within this leaves no time for its checkpoint.
STOP_SECONDS = 20.0
# A signal whose handler has not run within this (the main thread held in native code) is taken from a thread.
HANDLER_GRACE_SECONDS = 2.0


def when_not_handled(handled: Callable[[], int], not_taken: Callable[[int], None]) -> Callable[[], None]:
    """A callback for `signals_seen_on_a_thread`: for the nth signal seen, `not_taken(n)` runs should the handler
    not have run n times (`handled()`) within `HANDLER_GRACE_SECONDS`: the main thread is held where none runs."""
    seen = itertools.count(1)  # next() on it is atomic

    def unless_handled(signal_number: int) -> None:
        if handled() < signal_number:
            not_taken(signal_number)

    def on_a_signal() -> None:
        timer = threading.Timer(HANDLER_GRACE_SECONDS, unless_handled, args=(next(seen),))
        timer.daemon = True
        timer.start()

    return on_a_signal


class HeldSigterm:
    """SIGTERM while training, with no process of the job known to be lost, asks for the stop that Ctrl-C asks for:
    a checkpoint agreed by every process, then the end. The signal is held meanwhile and delivered once the run has
    closed (`deliver_held_sigterm`), so that the process still ends by it, as its launcher or scheduler expects.

    A SIGTERM that comes again, or once the stop is under way (torchrun's agent passes on the signal the whole job
    got), is held too. A stop not agreed within `STOP_SECONDS` of the signal (an env call that never returns,
    a peer that no longer answers) ends the process then, with its line: a watch of its own does that (`PeerWatch`'s
    thread, or Hogwild's supervisor through `overdue`)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.request: Callable[[], None] | None = None  # how this process asks for the stop, while it trains
        self.started = False  # whether it has begun to train (or serve): before, it is starting up
        self.heard = False
        self.heard_at = 0.0
        self.agreed = threading.Event()

    def overdue(self) -> bool:
        """Whether a SIGTERM held has waited `STOP_SECONDS` for a stop that was not agreed."""
        late = time.monotonic() - self.heard_at > STOP_SECONDS
        return self.heard and late and not self.agreed.is_set()

    def hold(self) -> bool:
        """Whether this SIGTERM is held (else the caller ends the process); from the signal handler."""
        if self.heard:  # again: the launcher passing on the signal the whole job got
            return True
        if self.request is None:
            return False
        self.heard, self.heard_at = True, time.monotonic()
        # os.write: a print could land inside one the handler interrupted
        os.write(2, f"\n{self.role}: SIGTERM: checkpointing, then stopping\n".encode())
        self.request()
        return True


_held_sigterm: HeldSigterm | None = None  # this process's, from the start of its training to its end


def sigterm_held_by(held: HeldSigterm) -> None:
    """From now on `held` takes this process's SIGTERM while it trains (`sigterm_asks_for_a_stop`, `stop_agreed`)."""
    global _held_sigterm
    _held_sigterm = held


@contextmanager
def sigterm_asks_for_a_stop(request: Callable[[], None]) -> Iterator[None]:
    """Within, a SIGTERM calls `request` (the training loop's Ctrl-C request), where `report_lost_peers` listens."""
    held = _held_sigterm
    if held is None:
        yield
        return
    held.request, held.started = request, True
    try:
        yield
    finally:
        held.request = None


@contextmanager
def sigterm_left_to_peers(ask_peers: Callable[[], None]) -> Iterator[None]:
    """Within, a SIGTERM is held for the stop that the processes which run the training loop agree on (a decoupled
    trainer's or evaluator's, which those stop): `ask_peers` asks them for it, should this process alone have had the
    signal. Where they do not agree in time, the held one gives up."""
    with sigterm_asks_for_a_stop(ask_peers):
        try:
            yield
        finally:
            stop_agreed()  # its role is over: stopped by its peers


@contextmanager
def holding_sigterm(role: str, request: Callable[[], None]) -> Iterator[HeldSigterm]:
    """Within, SIGTERM calls `request` and is held, for a process that watches the stop itself
    (`HeldSigterm.overdue`, `agreed`): Hogwild's supervisor."""
    global _held_sigterm
    held = _held_sigterm = HeldSigterm(role)
    with sigterm_asks_for_a_stop(request):  # let go of `request` after: what it holds may be freed then
        if not on_main_thread():
            yield held
            return
        previous = signal.signal(signal.SIGTERM, lambda *_: held.hold())
        try:
            yield held
        finally:
            signal.signal(signal.SIGTERM, previous)


def stop_agreed() -> None:
    """The processes agreed to stop with a checkpoint (or the loop ended with it): a SIGTERM from now on is held, and no
    stop that a signal asked for gives up."""
    if _held_sigterm is not None:
        _held_sigterm.agreed.set()


def take_back_an_unanswered_sigterm() -> None:
    """A SIGTERM held for a stop that did not come (it came after the loop's last stop check, as its final checkpoint
    was written): handle it now, as one that comes after training."""
    held = _held_sigterm
    if held is not None and held.heard and not held.agreed.is_set():
        held.heard = False
        signal.raise_signal(signal.SIGTERM)


def sigterm_held() -> bool:
    """Whether this process holds a SIGTERM, to end by it once its run has closed."""
    return _held_sigterm is not None and _held_sigterm.heard


def deliver_held_sigterm() -> None:
    """End this process by the SIGTERM it held, if it held one (its handler is the caller's again by now)."""
    global _held_sigterm
    held, _held_sigterm = _held_sigterm, None
    if held is not None and held.heard:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.raise_signal(signal.SIGTERM)


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
LINUX = sys.platform.startswith("linux")
PARENT_ENDED = signal.SIGRTMAX if LINUX else None  # a signal only the system sends here
# Looked up once: a child between fork and exec (`ended_with_this_process`) should only call it.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if LINUX else None


def signal_when_parent_dies(signum: int) -> bool:
    """Have Linux send this process `signum` the moment its parent ends, however it ends (SIGKILL and the
    out-of-memory killer included); 0 takes the request back. False where the system takes no such request."""
    return _prctl is not None and _prctl(PR_SET_PDEATHSIG, signum) == 0


def ended_with_this_process(signum: int) -> Callable[[], None]:
    """For `subprocess.Popen(preexec_fn=...)`, from the main thread: the child gets `signum` the moment this
    process ends, however it ends."""
    return functools.partial(signal_when_parent_dies, signum)


PARENT_LOOK_SECONDS = 0.1  # how often a process's own thread looks whether its parent has ended
# An ending process closes its sockets a moment before its children are told: an error from a dropped connection
# comes first. Within this, it is told.
PARENT_END_HEARD_SECONDS = 0.5


def ends_within(parent: int, seconds: float) -> bool:
    """Whether this process's parent `parent` has ended, or is seen to end within `seconds`."""
    deadline = time.monotonic() + seconds
    while os.getppid() == parent:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


@contextmanager
def stopped_with_parent(stop: Callable[[], None], parent: int | None = None) -> Iterator[None]:
    """Within this context, `stop` (which ends this process) runs once `parent` (by default this process's parent now)
    has ended, however it ended (SIGKILL and the out-of-memory killer included). Set from the main thread.

    Linux's parent-death signal runs it at once where the main thread runs Python. A thread of its own looks too, for
    where the signal's handler cannot run: on a main thread blocked in native code that a signal does not end (a
    simulator's step, a wait), or on one the signal reached between a handler and the call it returns to. An error
    raised within, once the parent is seen to have ended, is taken for a symptom of its end."""
    parent = os.getppid() if parent is None else parent
    tickets = itertools.count()  # next() on it is atomic
    leaving = threading.Event()

    def stop_once() -> None:
        if next(tickets) > 0:  # the handler and the thread both heard it: the first one is ending this process
            threading.Event().wait()
        stop()

    def parent_ended(signum: int, frame: object) -> None:
        if os.getppid() != parent:  # the end of the thread that started this process sends it too
            stop_once()

    def watch() -> None:
        while os.getppid() == parent:
            if leaving.wait(PARENT_LOOK_SECONDS):
                return
        stop_once()

    previous = None
    if PARENT_ENDED is not None:
        previous = signal.signal(PARENT_ENDED, parent_ended)
        signal_when_parent_dies(PARENT_ENDED)
    watcher = threading.Thread(target=watch, name="parent-watch", daemon=True)
    watcher.start()  # it also finds a parent that ended before the signal was asked for
    try:
        yield
    except Exception:
        if ends_within(parent, PARENT_END_HEARD_SECONDS):  # what failed was talking to it (the store it hosted)
            stop_once()
        raise
    finally:
        leaving.set()
        watcher.join()
        if PARENT_ENDED is not None:
            signal_when_parent_dies(0)
            signal.signal(PARENT_ENDED, previous)


def main_thread_position() -> str:
    """Where the main thread is now: the function of its innermost Python frame, and of the innermost one of this
    project's below it (`torch.distributed.distributed_c10d.barrier (line 4800), from rl.loop.run (line 366)`)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "native code"
    innermost = _frame_name(frame)
    while frame is not None and not frame.f_globals.get("__name__", "").startswith("rl."):
        frame = frame.f_back
    return innermost if frame is None or _frame_name(frame) == innermost else f"{innermost}, from {_frame_name(frame)}"


def _frame_name(frame: FrameType) -> str:
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name} (line {frame.f_lineno})"


_wakeup_fd_set = False  # whether `signals_seen_on_a_thread` has set Python's wakeup fd (a fork lets go of it)


def _let_go_of_the_wakeup_fd_in_a_fork() -> None:
    # A fork (an async env's worker) would tell its own signals to its parent's thread.
    if _wakeup_fd_set:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)


os.register_at_fork(after_in_child=_let_go_of_the_wakeup_fd_in_a_fork)


@contextmanager
def signals_seen_on_a_thread(seen: dict[int, Callable[[], None]]) -> Iterator[None]:
    """Within, `seen[signum]` runs on a thread of its own each time `signum` comes, whatever the main thread does: one
    blocked in native code (a collective, a simulator's step) runs no handler until that returns. Python's C handler
    writes each signal it catches down its wakeup fd, from whichever thread the signal reached, so each signal must
    have a Python handler. Set from the main thread; the wakeup fd taken is given back after."""
    global _wakeup_fd_set
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C handler must never wait on it

    def watch() -> None:
        while True:
            signals = os.read(read_end, 256)
            for signum, callback in seen.items():
                if signum in signals:
                    callback()
            if LEAVING in signals:
                return

    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    _wakeup_fd_set = True
    watcher = threading.Thread(target=watch, name="signal-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        _wakeup_fd_set = False
        os.write(write_end, bytes([LEAVING]))
        watcher.join()
        os.close(read_end)
        os.close(write_end)


LEAVING = 0  # no signal's number: `signals_seen_on_a_thread`'s watcher stops on it


def on_main_thread() -> bool:
    """Whether this thread may set signal handlers: Python runs them in the main thread only, so training
    started from another thread hears no signal, and sets no handler."""
    return threading.current_thread() is threading.main_thread()
