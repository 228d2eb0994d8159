"""Naming an env call held in native code that keeps Python's interpreter lock (the GIL).

Such a call (a simulator's C++ step waiting forever, through pybind11 or SWIG, which keep the lock)
stops every thread of its process: the signal handlers and threads that name a stalled env call
(`rl.env_faults.stalled_env_call`) never run, Ctrl-C and SIGTERM wait for it, and the launcher's
SIGKILL ends the process without a word.

This is seen from outside the lock. A thread re-arms faulthandler's timer
(`faulthandler.dump_traceback_later`) every `period` seconds, and says so down a pipe (a tick); only
a held lock keeps it from re-arming, and then the timer's own thread, which needs no lock, writes
every thread's stack down the pipe. At the other end a small process (this file run as a script,
with only Python's standard library) finds the thread inside an env call and, once no tick has come
for two periods (a process stopped by Ctrl-Z or left unscheduled, then resumed, ticks at once),
prints one line naming where it is held. The env call sites reach it down the same pipe, each as it
is first entered (`EnvCall`).

The watch starts with the first envs made to step in a process whose role named its stalls
(`watching_env_calls`): a role whose envs step in processes of their own, or that steps none, starts
no watcher. faulthandler has one such timer per process: a run replaces another user's of it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType

TICK = b"\0"  # the re-arming thread's, between lines or within a dump's: no line holds one
FRAME = re.compile(r'\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)')


class GilWatch:
    """The re-arming thread and the reporting process of one process's watch."""

    def __init__(self, role: str, seconds: float) -> None:
        self.seconds = seconds
        self.period = min(1.0, seconds / 4)
        read_end, self.pipe = os.pipe()
        command = [sys.executable, "-I", "-S", os.path.abspath(__file__), role, f"{seconds:g}", f"{self.period:g}"]
        try:  # a session of its own: Ctrl-C, and signals sent to the job's process group, are the run's to handle
            self.reporter = subprocess.Popen(command, stdin=read_end, start_new_session=True)
        except OSError:
            os.close(self.pipe)
            raise
        finally:
            os.close(read_end)
        self.sites: set[CodeType] = set()
        self.stopped = threading.Event()
        # Taken to arm the timer or write down the pipe: once `stop` closed it, its number may be another file's.
        self.using_the_pipe = threading.Lock()
        self.arm()  # before the first env call: a lock held from its start is seen too
        threading.Thread(target=self.rearm, name="gil-watch", daemon=True).start()

    def arm(self) -> None:
        # The thread is due again `period` after it armed: the timer fires only once it missed `seconds`, and again
        # each time after, until the thread runs: a hold that follows another at once is seen too.
        with self.using_the_pipe:
            if not self.stopped.is_set():
                faulthandler.dump_traceback_later(self.seconds + self.period, repeat=True, file=self.pipe)

    def rearm(self) -> None:
        while not self.stopped.wait(self.period):
            self.arm()
            self.write(TICK)

    def entered_from(self, code: CodeType) -> None:
        """An env call is made from `code`: the reporter learns the site before the call can hold the lock."""
        if code not in self.sites:
            self.sites.add(code)
            self.tell({"site": [code.co_filename, code.co_name]})

    def tell(self, message: dict) -> None:
        self.write(json.dumps(message).encode() + b"\n")

    def write(self, data: bytes, stopping: bool = False) -> None:
        # One write, below the pipe's atomic size. It fails where the reporter is gone, killed with the job.
        with self.using_the_pipe, contextlib.suppress(OSError):
            if stopping or not self.stopped.is_set():
                os.write(self.pipe, data)

    def stop(self) -> None:
        with self.using_the_pipe:
            self.stopped.set()
            faulthandler.cancel_dump_traceback_later()
        # Said, not left to the pipe's end: forks of this process (async env workers) may hold it open after.
        self.write(b'{"stop": true}\n', stopping=True)
        with self.using_the_pipe:
            os.close(self.pipe)
        try:
            self.reporter.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.reporter.kill()


_role: tuple[str, float] | None = None  # the role's name and stall seconds, while it watches
_watch: GilWatch | None = None


def _forget_in_a_fork() -> None:
    """A fork (an async env's worker) has no timer thread: faulthandler's timer must not be touched there."""
    global _role, _watch
    _role = _watch = None


os.register_at_fork(after_in_child=_forget_in_a_fork)


@contextmanager
def watching_env_calls(role: str, seconds: float) -> Iterator[None]:
    """Within, envs made to step in this process start a watch that names an env call holding the lock `seconds`."""
    watch_env_calls(role, seconds)
    try:
        yield
    finally:
        stop_watching()


def watch_env_calls(role: str, seconds: float) -> None:
    """From now on (for the rest of a Hogwild worker's process, say)."""
    global _role
    _role = (role, seconds)


def envs_step_here() -> None:
    """Envs that step in this process were made: watch them, where this process's role watches."""
    global _watch
    if _role is not None and _watch is None:
        # A watch that cannot start (its Python gone from under a long run, say) leaves the run as it was.
        with contextlib.suppress(OSError):
            _watch = GilWatch(*_role)


def entering_env_call() -> None:
    """`EnvCall.__enter__`'s note of its caller's code; nothing where no watch runs."""
    if _watch is not None:
        _watch.entered_from(sys._getframe(2).f_code)


def stop_watching() -> None:
    global _role, _watch
    if _watch is not None:
        _watch.stop()
    _role = _watch = None


# The reporting process: standard library only, since it starts as the run does.


def held_thread(dump: list[str], sites: set[tuple[str, str]]) -> tuple[str, str, str] | None:
    """(file, line, function) of the innermost frame of the dumped thread that is inside an env call, if one is."""
    innermost = None
    for line in dump:
        if line.startswith(("Thread ", "Current thread ")):
            innermost = None
            continue
        frame = FRAME.match(line)
        if frame is None:
            continue
        where = frame.group("file", "line", "function")
        innermost = innermost or where
        if (where[0], where[2]) in sites:
            return innermost
    return None


def held_line(role: str, seconds: str, where: tuple[str, str, str]) -> str:
    file, line, function = where
    return (
        f"warning: {role}: an env call has held Python's interpreter lock for {seconds} s, in native code called "
        f"from {file}, line {line}, in {function}: Ctrl-C and SIGTERM wait for it to return; kill -9 ends it"
    )


def report(role: str, seconds: str, period: str) -> None:
    """Read the pipe until it closes or says stop: learn the env call sites, and name the one where a dump shows
    the lock held, once no tick has followed the dump for two periods; once for each place, until a tick."""
    sites: set[tuple[str, str]] = set()
    pending, dump, due, named = b"", [], 0.0, None
    while True:
        if dump and not select.select([0], [], [], max(0.0, due - time.monotonic()))[0]:
            named = name_the_held_call(role, seconds, dump, sites, named)  # no tick since: the lock is still held
            dump = []
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # every writer has closed: the process ended (killed, perhaps right after its dump)
            name_the_held_call(role, seconds, dump, sites, named)
            return
        for index, piece in enumerate(chunk.split(TICK)):
            if index > 0:  # a tick: the lock was free after what came before it
                dump, named = [], None
            *lines, pending = (pending + piece).split(b"\n")
            for raw in lines:
                text = raw.decode(errors="replace")
                if text.startswith("{"):
                    message = json.loads(text)
                    if "stop" in message:
                        return
                    sites.add(tuple(message["site"]))
                    continue
                if not dump or text.startswith("Timeout ("):  # a dump begins
                    dump, due = [], time.monotonic() + 2 * float(period)
                dump.append(text)


def name_the_held_call(
    role: str, seconds: str, dump: list[str], sites: set[tuple[str, str]], named: tuple[str, str, str] | None
) -> tuple[str, str, str] | None:
    """Print the line for the env call that `dump` shows held, unless it was `named` already; what is named now."""
    where = held_thread(dump, sites)
    if where is None or where == named:
        return named
    say(held_line(role, seconds, where))
    return where


def say(line: str) -> None:
    """One write to stderr; on a terminal, over a progress bar's line."""
    clear = "\r\x1b[K" if os.isatty(2) else ""
    os.write(2, f"{clear}{line}\n".encode())


if __name__ == "__main__":
    report(*sys.argv[1:4])
