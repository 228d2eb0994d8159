"""When a process of the job dies: name it, and end the survivors instead of leaving them waiting.

The launcher stops the survivors with SIGTERM as soon as one process ends, often before any
collective notices; otherwise a collective fails with a lost connection. Either way each
survivor prints one line naming the ranks or roles whose processes have ended, and exits 1.

On its own node a survivor sees an ended process in /proc. Across nodes, every rank beats a
counter in the job's rendezvous store once a second: a rank whose counter stands still is gone.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from rl.elastic import job_store_client, name_this_process, record_fault, under_torchelastic
from rl.env_faults import stalled_env_call
from rl.errors import INTERRUPTED_EXIT_CODE, RunStopped, listed, print_error
from rl.gil_watch import watch_env_calls, watching_env_calls
from rl.optim import TrainingDiverged
from rl.signals import (
    STOP_SECONDS,
    HeldSigterm,
    ctrl_c_heard,
    ctrl_c_is_counted,
    main_thread_position,
    on_main_thread,
    owned_by_the_command_line,
    signals_seen_on_a_thread,
    sigterm_held_by,
    stopped_with_parent,
    when_not_handled,
)

LOST_CONNECTION = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out")


class PeerLost(Exception):
    """A collective failed because the process on the other side is gone."""

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(peer)
        self.peer = peer
        self.detail = collective_failure(detail)

    @property
    def timed_out(self) -> bool:
        """The collective gave up waiting, rather than losing its connection."""
        return "timed out" in self.detail.lower()


SOURCE_LOCATION = re.compile(r"^\[[^\]]*\]\s*")  # gloo's "[.../pair.cc:553] " before what happened


def collective_failure(detail: str) -> str:
    """What a failed collective's error says happened, in its first sentence: gloo's adds the line of its source
    that raised it, and advice meant for whoever reads a crashed process's log."""
    first_line = detail.strip().splitlines()[0] if detail.strip() else ""
    what = SOURCE_LOCATION.sub("", first_line).split(". ")[0].rstrip(".")
    return what or "no detail"


@contextmanager
def peer(name: str) -> Iterator[None]:
    """Turn the failure of a collective whose other side is gone into `PeerLost(name)`."""
    try:
        yield
    except RuntimeError as error:  # gloo raises DistBackendError, or a plain RuntimeError from a waited Work
        if isinstance(error, dist.DistError) or any(sign in str(error) for sign in LOST_CONNECTION):
            raise PeerLost(name, str(error)) from None
        raise


HEARTBEAT_SECONDS = 1.0
# An env call running this long when its process is stopped is named (env steps take milliseconds); at most half
# the collective timeout, so that the process the others gave up on names it.
STALLED_ENV_SECONDS = 10.0


def _node_id() -> int:
    """This launcher group: the host, and the node rank a launcher gives (two "nodes" may share a host)."""
    return zlib.crc32(f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}".encode())


class Heartbeat:
    """Each rank adds 1 to its key in the job's store every `HEARTBEAT_SECONDS`, from a daemon thread.

    Its own client connection to the rendezvous store (`MASTER_ADDR:MASTER_PORT`, hosted by the
    launcher or rank 0), so it never shares a socket with the process group.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = job_store_client(timeout_seconds=10)
        self.stopped = threading.Event()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self.stopped.wait(HEARTBEAT_SECONDS):
            try:
                self.store.add(f"rl/heartbeat/{self.rank}", 1)
            except (RuntimeError, dist.DistError):  # the store's host is gone: silent_ranks says so
                return

    def silent_ranks(self) -> list[int] | None:
        """The other ranks whose beats stopped (over three periods); None if the store itself is gone."""
        self.stopped.set()
        try:
            before = self._counts()
            time.sleep(3 * HEARTBEAT_SECONDS)
            after = self._counts()
        except (RuntimeError, dist.DistError):
            return None
        return [rank for rank in range(self.world_size) if rank != self.rank and after[rank] == before[rank]]

    def _counts(self) -> list[int]:
        return [self.store.add(f"rl/heartbeat/{rank}", 0) for rank in range(self.world_size)]


def gather_process_ids(device: torch.device) -> Tensor:
    """(node id, pid) of every rank, so a survivor can tell whose process has ended."""
    own = torch.tensor([_node_id(), os.getpid()], dtype=torch.long, device=device)
    if not dist.is_initialized():
        return own.unsqueeze(0).cpu()
    every = [torch.zeros_like(own) for _ in range(dist.get_world_size())]
    dist.all_gather(every, own)
    return torch.stack(every).cpu()


PF_EXITING = 0x4  # the kernel's flag for a task inside exit(): set before it closes its sockets


def process_ended(pid: int) -> bool:
    """Gone, a zombie, or exiting. A killed process closes its sockets before it becomes a zombie, so a
    peer that sees the connection drop can still find it running ("R") with only its exit flag set."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        state, flags = fields[0], int(fields[6])
    except (FileNotFoundError, IndexError, ValueError):
        return True
    return state in ("Z", "X") or bool(flags & PF_EXITING)


def ended_ranks(process_ids: Tensor, own_rank: int) -> list[int]:
    """Ranks on this node whose processes have ended (other nodes cannot be checked from here)."""
    node = _node_id()
    return [
        rank
        for rank, (rank_node, pid) in enumerate(process_ids.tolist())
        if rank != own_rank and rank_node == node and process_ended(pid)
    ]


def spans_nodes(process_ids: Tensor) -> bool:
    return len(set(process_ids[:, 0].tolist())) > 1


def report_failed_collective(role: str, known_lost: str, error: Exception) -> bool:
    """Print and record what ended this process's collective, if it was a peer; False if it was not.

    Once a peer is gone, whatever failed here follows from that: name the lost peer (`known_lost`,
    empty if none is known), never this process's symptom as if it were the cause."""
    if known_lost and ctrl_c_heard():  # one was still starting, or could not reach its checkpoint (`ctrl_c_seen`)
        record_fault(role, "stopped", f"Ctrl-C; then lost {known_lost}")
        print_error(
            f"interrupted (Ctrl-C): {role} then lost {known_lost}, as a process that is starting or cannot reach its "
            "checkpoint ends at once; the checkpoints written before are kept"
        )
    elif known_lost:
        record_fault(role, "lost", known_lost)
        print_error(f"error: {role}: lost {known_lost}")
    elif isinstance(error, PeerLost) and error.timed_out:  # alive, as far as can be seen, but late
        record_fault(role, "timeout", f"{error.peer}: {error.detail}")
        print_error(
            f"error: {role}: {error.peer} did not reach a collective within --collective-timeout, and no "
            f"process of the job is known to have ended: {error.detail}"
        )
    elif isinstance(error, PeerLost):  # reaped, or no heartbeat to tell: what the collective saw
        record_fault(role, "lost", f"{error.peer}: {error.detail}")
        print_error(f"error: {role}: lost {error.peer}: {error.detail}")
    else:
        return False
    return True


def stall_seconds(collective_timeout: float) -> float:
    """How long an env call runs before it counts as stalled."""
    return min(STALLED_ENV_SECONDS, collective_timeout / 2)


@contextmanager
def stalled_env_named_when_stopped(
    role: str, collective_timeout: float, asks_for_a_stop: Callable[[], bool] = lambda: False
) -> Iterator[None]:
    """Within, SIGTERM ends this process as it would have, after a line naming an env call that had stalled, unless
    `asks_for_a_stop` takes it (as a request for the checkpoint and stop that Ctrl-C asks for) and says so. An env
    call that holds Python's lock is named as it stalls (`rl.gil_watch`); one in native code that lets go of it, where
    no handler runs either, by a thread, once the handler has not run within `HANDLER_GRACE_SECONDS`."""
    seconds = stall_seconds(collective_timeout)
    watch_env_calls(role, seconds)
    handled = 0

    def name_the_stall() -> None:
        stall = stalled_env_call(seconds)
        if stall:
            print_error(f"error: {role}: {stall}; stopped by SIGTERM")

    def stopped(signum: int, frame: object) -> None:
        nonlocal handled
        handled += 1
        if asks_for_a_stop():
            return
        name_the_stall()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ended by the signal, as its parent expects

    def not_handled(signal_number: int) -> None:
        if asks_for_a_stop():
            return
        name_the_stall()
        os._exit(128 + signal.SIGTERM)  # as a shell reports an end by SIGTERM: a thread cannot restore its default

    signal.signal(signal.SIGTERM, stopped)
    with signals_seen_on_a_thread({signal.SIGTERM: when_not_handled(lambda: handled, not_handled)}):
        yield


def stopped_while_stalled(known_lost: str) -> str:
    """How a process whose env call stalled was stopped: by the launcher over a lost peer, or by SIGTERM."""
    if known_lost:
        return f"stopped by the launcher once it lost {known_lost}"
    if under_torchelastic():
        return "stopped by SIGTERM, from the launcher or sent to the job"
    return "stopped by SIGTERM (a kill, scancel or shutdown); its checkpoints are kept"


def sigterm_stop_record(
    role: str, stall: str, known_lost: str, held: HeldSigterm, blocked_in: str = ""
) -> tuple[str, str, str]:
    """How a SIGTERM that ends this process at once is recorded (the fault's kind and detail) and told (its line):
    by what the process knows then, the most telling first. `blocked_in`: where the main thread was held, for a
    SIGTERM that its handler never heard."""
    if stall:  # what the others waited for, if they gave up: this process's env
        return "stalled", stall, f"error: {role}: {stall}; {stopped_while_stalled(known_lost)}"
    if known_lost and not held.started:  # a SIGTERM to the whole job ends starting processes at once: one went first
        while_starting = f"while it started, it had lost {known_lost}"
        line = f"error: {role}: stopped by SIGTERM, from the launcher or sent to the job; {while_starting}"
        return "stopped", f"stopped by SIGTERM; {while_starting}", line
    if known_lost:
        return "lost", known_lost, f"error: {role}: stopped by the launcher because it lost {known_lost}"
    if held.heard:  # held, and no stop agreed in time
        line = (
            f"error: {role}: stopped by SIGTERM before its checkpoint: the processes did not agree on a stop within "
            f"{STOP_SECONDS:.0f} s; the earlier checkpoints are kept"
        )
        return "stopped", f"stopped by SIGTERM: no stop agreed within {STOP_SECONDS:.0f} s", line
    if blocked_in:
        seconds = f"{STOP_SECONDS:.0f} s"
        held_for = f"its main thread was held in {blocked_in} for {seconds}, where no signal is handled"
        line = f"error: {role}: stopped by SIGTERM before its checkpoint: {held_for}; the earlier checkpoints are kept"
        return "stopped", f"stopped by SIGTERM: {held_for}", line
    if under_torchelastic():  # torchrun also restarts every worker when a node joins the job
        line = (
            f"error: {role}: stopped by SIGTERM, from the launcher or sent to the job; no process of the job is known "
            "to be lost"
        )
        return "stopped", "stopped by SIGTERM with no process of the job known to be lost", line
    # no launcher: a kill, SLURM's scancel or time limit, a shutdown
    return (
        "stopped",
        "stopped by SIGTERM",
        f"error: {role}: stopped by SIGTERM (a kill, scancel or shutdown); its checkpoints are kept",
    )


def ctrl_c_stop_record(role: str, stall: str, known_lost: str, blocked_in: str = "") -> tuple[str, str, str]:
    """How a Ctrl-C that a launcher passed on, and that ends this process before its checkpoint, is recorded (the
    fault's kind and detail) and told (its line): by what the process knows then, the most telling first."""
    if stall:
        why = stall
    elif known_lost:
        why = f"it had lost {known_lost}"
    elif blocked_in:
        why = f"its main thread was held in {blocked_in} for {STOP_SECONDS:.0f} s, where no signal is handled"
    else:
        why = f"the processes did not agree on a stop within {STOP_SECONDS:.0f} s"
    kept = "stopped before its checkpoint; the checkpoints written before are kept"
    return "stopped", f"Ctrl-C: {why}", f"interrupted (Ctrl-C): {role}: {why}; {kept}"


class PeerWatch:
    """What this process can tell of its peers' ends (their processes on this node, their heartbeats across nodes),
    and how it ends itself when one is gone, when SIGTERM comes, or when its launcher is gone: with a line naming
    what happened."""

    def __init__(
        self, own_rank: int, name: Callable[[int], str], process_ids: Tensor, collective_timeout: float
    ) -> None:
        self.own_rank, self.name, self.process_ids = own_rank, name, process_ids
        self.role = name(own_rank)
        self.stall_seconds = stall_seconds(collective_timeout)
        self.heartbeat = Heartbeat(own_rank, len(process_ids)) if spans_nodes(process_ids) else None
        self.held = HeldSigterm(self.role)
        self.seen_tickets, self.stop_tickets = itertools.count(), itertools.count()  # next() on each is atomic
        # Ctrl-C to a process of the command line on its own, seen from a thread: its handler may never run.
        self.lone_ctrl_c_seen = when_not_handled(ctrl_c_heard, self.ctrl_c_not_taken)

    def lost(self) -> str:
        """The peers known to be gone, and how that is known; empty if none is."""
        gone = ended_ranks(self.process_ids, self.own_rank)
        if gone:  # seen on this node
            processes = "its process" if len(gone) == 1 else "their processes"
            return f"{listed([self.name(rank) for rank in gone])}: {processes} ended"
        if self.heartbeat is None:
            return ""
        silent = self.heartbeat.silent_ranks()
        if silent is None:
            return "the node hosting the rendezvous store (node 0): the store is unreachable"
        if not silent:
            return ""
        their = "its" if len(silent) == 1 else "their"
        return f"{listed([self.name(rank) for rank in silent])} on another node: {their} heartbeat stopped"

    def stopped_by_sigterm(self, signum: int, frame: object) -> None:
        """SIGTERM's handler: held for a stop with a checkpoint where one can come, else the end at once."""
        if self.held.agreed.is_set():  # the stop is under way: the process ends by this signal once its run has closed
            self.held.heard = True
            return
        stall = stalled_env_call(self.stall_seconds)
        # Only this node's processes are looked at here: the heartbeat's look takes seconds, and stops this beat.
        if stall or ended_ranks(self.process_ids, self.own_rank) or not self.held.hold():
            self.stop_at_once()

    def sigterm_seen(self) -> None:
        """A SIGTERM, seen from a thread of its own, whatever the main thread does: the stop its handler asks for
        must be agreed within `STOP_SECONDS`, else this ends the process. A main thread blocked where Python runs no
        handler (a collective waiting for a peer that no longer answers) cannot even ask for it."""
        self.stop_unless_agreed_in_time(signal.SIGTERM)

    def ctrl_c_seen(self) -> None:
        """Ctrl-C as a launcher passes it on, seen from a thread of its own. The launcher kills, without a word, the
        processes that have not ended 30 s later: so a process whose env call has stalled, which cannot reach its
        checkpoint, ends at once, and one whose stop is not agreed within `STOP_SECONDS` ends then, with its line."""
        if stalled_env_call(self.stall_seconds):
            self.stop_at_once(signal.SIGINT)
        else:
            self.stop_unless_agreed_in_time(signal.SIGINT)

    def ctrl_c_not_taken(self, seen: int) -> None:
        """Ctrl-C to a process of the command line on its own, where its main thread is held in native code: no
        handler takes it, so neither the first nor the second (which stops at once) would do anything. The first is
        told so; the second ends the process."""
        if seen > 2 or not ctrl_c_is_counted():  # ending already; or a handler that tells nothing of it (Python's)
            return
        held = f"held in {main_thread_position()}, where no signal is handled"
        stall = stalled_env_call(self.stall_seconds)
        where = f"{stall}, {held}" if stall else f"its main thread is {held}"
        if seen == 1:  # a note, as the handler's own would be
            os.write(2, f"\nCtrl-C: {where}: Ctrl-C again stops at once, without a checkpoint\n".encode())
            return
        if next(self.stop_tickets) > 0:  # already ending
            threading.Event().wait()
        record_fault(self.role, "stopped", f"Ctrl-C twice: {where}")
        print_error(
            f"interrupted (Ctrl-C) twice during training, as {where}: stopped at once, and the checkpoints written "
            "before are kept"
        )
        os._exit(INTERRUPTED_EXIT_CODE)

    def stop_unless_agreed_in_time(self, signum: int) -> None:
        if next(self.seen_tickets) == 0:  # one timer, from the first of the signals
            timer = threading.Timer(STOP_SECONDS, self.stop_unless_agreed, args=(signum,))
            timer.daemon = True
            timer.start()

    def stop_unless_agreed(self, signum: int) -> None:
        if not self.held.agreed.is_set():
            handled = self.held.heard if signum == signal.SIGTERM else ctrl_c_heard()
            self.stop_at_once(signum, blocked_in="" if handled else main_thread_position())

    def stop_at_once(self, signum: int = signal.SIGTERM, blocked_in: str = "") -> None:
        """End this process, stopped by `signum` (SIGTERM or a launcher's Ctrl-C) before its checkpoint, with its line.
        `blocked_in`: where the main thread was held, for a signal that its handler never heard."""
        if next(self.stop_tickets) > 0:  # the handler and the thread's timer both came at once: the first one ends it
            threading.Event().wait()
        stall, lost = stalled_env_call(self.stall_seconds), self.lost()
        if signum == signal.SIGINT:
            kind, detail, line = ctrl_c_stop_record(self.role, stall, lost, blocked_in)
        else:
            kind, detail, line = sigterm_stop_record(self.role, stall, lost, self.held, blocked_in)
        record_fault(self.role, kind, detail)
        print_error(line)
        os._exit(INTERRUPTED_EXIT_CODE if signum == signal.SIGINT else 1)

    def launcher_lost(self) -> None:
        stall = stalled_env_call(self.stall_seconds)
        record_fault(self.role, "stalled" if stall else "stopped", stall or "the launcher's process ended")
        print_error(
            f"error: {self.role}: {stall + '; ' if stall else ''}stopped because it lost the launcher (fabric run or "
            "torchrun): its process ended; its checkpoints are kept"
        )
        os._exit(1)

    def stop_beating(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stopped.set()


def watched_signals(watch: PeerWatch, launched: bool) -> dict[int, Callable[[], None]]:
    """The signals that `watch` sees from a thread: SIGTERM, and Ctrl-C as a launcher passes it on, or as it comes to a
    process of the command line on its own."""
    if launched:
        return {signal.SIGTERM: watch.sigterm_seen, signal.SIGINT: watch.ctrl_c_seen}
    if owned_by_the_command_line() and len(watch.process_ids) == 1:
        return {signal.SIGTERM: watch.sigterm_seen, signal.SIGINT: watch.lone_ctrl_c_seen}
    return {signal.SIGTERM: watch.sigterm_seen}


@contextmanager
def report_lost_peers(
    own_rank: int, name: Callable[[int], str], process_ids: Tensor, collective_timeout: float
) -> Iterator[None]:
    """End this process with a line naming what failed, instead of hanging or a traceback."""
    name_this_process(name(own_rank))
    watch = PeerWatch(own_rank, name, process_ids, collective_timeout)
    sigterm_held_by(watch.held)
    previous = signal.signal(signal.SIGTERM, watch.stopped_by_sigterm) if on_main_thread() else None
    # A launcher killed outright (SIGKILL) cannot stop its ranks: they stop themselves, or they would train on alone.
    launched = on_main_thread() and "TORCHELASTIC_RUN_ID" in os.environ
    try:
        with (
            signals_seen_on_a_thread(watched_signals(watch, launched)) if on_main_thread() else nullcontext(),
            stopped_with_parent(watch.launcher_lost) if launched else nullcontext(),
            watching_env_calls(watch.role, watch.stall_seconds),
        ):
            yield
    except (TrainingDiverged, RunStopped):
        raise  # it names what happened, whether or not a peer has already exited over it
    except Exception as error:
        if not report_failed_collective(watch.role, watch.lost(), error):
            raise
        os._exit(INTERRUPTED_EXIT_CODE if ctrl_c_heard() else 1)  # the process group is broken: skip its teardown
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        watch.stop_beating()
