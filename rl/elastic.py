"""Runs under torchrun's elastic agent (`--max-restarts`, `--nnodes=MIN:MAX`): what differs from one launch.

torchrun restarts every worker when one fails, or when a node joins or leaves. A restarted
worker is a new process with a new round: it must join a process group of this round only,
find the job's run folder again, and resume from its newest complete checkpoint. The journal
(`<run>/elastic.jsonl`) remembers across rounds what the processes themselves cannot: why the
last round ended, how far it got, and how many steps the restarts have redone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from rl.errors import RunStopped, UsageError, did_not_join, print_error, ranks_named

JOURNAL_FILENAME = "elastic.jsonl"
REACHED_FILENAME = "elastic.step"  # the step the current round has reached, rewritten in place every iteration
ROUND_KEYS = "rl/round"
ROUND_POLL_SECONDS = 0.005
STORE_CONNECT_TRY_SECONDS = 2.0  # one try at connecting to the job's store: how late a rank hears a signal then
STORE_LOOK_SECONDS = 0.05  # between looks for a store that is not listening (yet, or any more)


def under_torchelastic() -> bool:
    """Started by torchrun with a job id, so restarts and changes of membership may come (`fabric run` starts
    its ranks through torchrun too, but as a static group with no id: "none")."""
    return job_id() is not None


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def max_restarts() -> int:
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))


def job_id() -> str | None:
    """torchrun's rendezvous id (`--rdzv-id`; a fresh one per launch without it): the same in every round."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return None if run_id in (None, "none") else run_id


# --- A process group of this round only -------------------------------------------------------


def init_default_process_group(backend: str, timeout: timedelta) -> None:
    """`dist.init_process_group`, in key space of this round's own when the workers share torchrun's store.

    torchrun's c10d rendezvous hands every round's workers the same store (the agent's, which
    outlives them), and the process group keeps its keys there under fixed names. A restarted
    rank could then read a peer's address of the round before and fail to connect to a process
    that no longer exists ("Gloo connectFullMesh failed ... Connection refused"), or meet
    stale barrier counts. Here every round agrees on a fresh prefix first.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = job_store_client(timeout.total_seconds())
    global _round_prefix
    _round_prefix = f"{ROUND_KEYS}/{agree_on_round(store, rank, world_size, timeout.total_seconds())}/"
    dist.init_process_group(
        backend, store=job_store_client(timeout.total_seconds()), rank=rank, world_size=world_size, timeout=timeout
    )


_round_prefix: str | None = None  # this round's key space in torchrun's store, once agreed


def job_store_client(timeout_seconds: float) -> dist.Store:
    """A client of the job's rendezvous store (`MASTER_ADDR:MASTER_PORT`) on a connection of its own,
    in this round's key space where the store outlives the rounds.

    Connected in short tries from Python: torch's own connect retries in C++ until its timeout,
    where no signal handler runs, so a rank whose launcher (the store's host) was killed
    meanwhile would wait out the whole timeout instead of hearing that its launcher ended.
    """
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + timeout_seconds
    while True:
        wait_until_listening(host, port, deadline)
        try:  # the store may close between the look and the connect: then this try times out, and it looks again
            store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STORE_CONNECT_TRY_SECONDS))
            break
        except dist.DistNetworkError:
            if time.monotonic() > deadline:
                raise
    store.set_timeout(timedelta(seconds=timeout_seconds))
    return store if _round_prefix is None else dist.PrefixStore(_round_prefix, store)


def wait_until_listening(host: str, port: int, deadline: float) -> None:
    """Return once `host:port` takes a connection (closed at once, which the store ignores); raise
    `DistNetworkError` at `deadline`. Signal handlers run between the looks."""
    while True:
        try:
            socket.create_connection((host, port), timeout=STORE_CONNECT_TRY_SECONDS).close()
            return
        except OSError as error:
            if time.monotonic() > deadline:
                raise dist.DistNetworkError(f"no rendezvous store answered at {host}:{port}: {error}") from None
        time.sleep(STORE_LOOK_SECONDS)


def agree_on_round(store: dist.Store, rank: int, world_size: int, timeout_seconds: float) -> str:
    """An id that every rank of this round agrees on and that no earlier round used.

    Every fixed key may still hold an earlier round's value, so none can carry the id by itself.
    Rank 0 draws it; every other rank asks under a nonce of its own and waits for the answer
    under that nonce, which only this round's rank 0 can have written, then acknowledges it.
    """
    deadline = time.monotonic() + timeout_seconds
    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"{ROUND_KEYS}/ask/{rank}", nonce)
        answer = f"{ROUND_KEYS}/answer/{nonce}"
        # Polled, not a blocking get: that would hold this process in C++, where Ctrl-C cannot reach it.
        while not store.check([answer]):
            if time.monotonic() > deadline:
                raise RunStopped(f"{this_process()}: {did_not_join('rank 0', timeout_seconds)}")
            time.sleep(ROUND_POLL_SECONDS)
        round_id = store.get(answer).decode()
        store.set(f"{ROUND_KEYS}/{round_id}/joined/{rank}", "1")
        return round_id
    round_id = uuid.uuid4().hex
    waiting, answered = set(range(1, world_size)), set()
    while waiting:
        for peer in sorted(waiting):
            ask = f"{ROUND_KEYS}/ask/{peer}"
            nonce = store.get(ask).decode() if store.check([ask]) else None
            if nonce is not None and nonce not in answered:  # perhaps an earlier round's: answering is harmless
                store.set(f"{ROUND_KEYS}/answer/{nonce}", round_id)
                answered.add(nonce)
            if store.check([f"{ROUND_KEYS}/{round_id}/joined/{peer}"]):
                waiting.discard(peer)
        if time.monotonic() > deadline:
            raise RunStopped(f"{this_process()}: {did_not_join(ranks_named(sorted(waiting)), timeout_seconds)}")
        time.sleep(ROUND_POLL_SECONDS)
    return round_id


# --- The job's run folder and its newest complete checkpoint ------------------------------------


def check_writable(folder: str, flag: str) -> None:
    """Create `folder` and write a file into it, or raise `UsageError`: found at start, not at the first checkpoint."""
    probe = os.path.join(folder, f".write_test_{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb") as file:
            file.write(b"0")
        os.remove(probe)
    except OSError as error:
        raise UsageError(flag, f"cannot write checkpoints into {folder}: {error.strerror or error}") from None


# --- The journal: what the rounds of one job tell each other ------------------------------------


@dataclass
class RoundRecord:
    """How the round before this one went, as its journal entries tell it."""

    started_at: int  # the step it resumed from (0: from scratch)
    reached: int  # the furthest step it reported
    faults: list[dict[str, Any]]  # why it ended, from its survivors and failing ranks
    redone_before: int  # steps redone by the restarts up to it, its own included
    began_training: bool = True  # False: it ended during start-up, between its launch and its first iteration
    restart: int | None = None  # torchrun's restart count where its rank 0 ran (None: not journaled)
    host: str | None = None  # the machine of its rank 0
    ended: str | None = None  # how it ended cleanly ("finished", or "interrupted" by Ctrl-C or SIGTERM); None: not


class Journal:
    """`<run>/elastic.jsonl`: one JSON object per line, appended; rank 0 writes each round's start, any rank
    a fault (one small `O_APPEND` write each, so lines from several ranks never mix). Beside it,
    `elastic.step` holds the step the current round has reached, one fixed-width line rewritten
    in place after every iteration (a single `pwrite`: no growth, no measurable cost)."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, JOURNAL_FILENAME)
        self.reached_path = os.path.join(run_dir, REACHED_FILENAME)
        self._reached_file: int | None = None

    def write_reached(self, step: int) -> None:
        if self._reached_file is None:
            self._reached_file = os.open(self.reached_path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._reached_file, f"{step:20d}\n".encode(), 0)

    def read_reached(self) -> int:
        """The step the last round reached (0 if it never said)."""
        with contextlib.suppress(OSError, ValueError):
            return int(Path(self.reached_path).read_text().strip() or 0)
        return 0

    def entries(self) -> list[dict[str, Any]]:
        if not os.path.isfile(self.path):
            return []
        with open(self.path, encoding="utf-8") as file:
            lines = file.read().splitlines()
        entries = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):  # a line torn by a kill mid-write
                entries.append(json.loads(line))
        return entries

    def append(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry | {"time": round(time.time(), 3)}) + "\n").encode()
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    def rounds(self) -> list[RoundRecord]:
        """Every round journaled so far, oldest first: its start, how far it got, and its faults.

        A round opens with its `launch` entry (written once its rank 0 has read its command line and
        checkpoint) and begins training at its `start` entry; journals written before rounds were
        launched open each round at its start."""
        records: list[RoundRecord] = []
        for entry in self.entries():
            opens_a_round = entry["event"] == "launch" or (
                entry["event"] == "start" and (not records or records[-1].began_training)
            )
            if opens_a_round:
                records.append(opened_round(entry))
            if entry["event"] == "start":
                records[-1].began_training = True
            elif entry["event"] in ("fault", "end") and records:
                if entry["event"] == "fault":
                    records[-1].faults.append(entry)
                else:
                    records[-1].ended = entry["how"]
                records[-1].reached = max(records[-1].reached, entry["step"])
        return records


def this_jobs_rounds(rounds: list[RoundRecord]) -> list[RoundRecord]:
    """The rounds since the last one that ended cleanly: a launch after a finished or interrupted run
    resumes it as a new job, whose restarts count from there."""
    ends = [index for index, round_ in enumerate(rounds) if round_.ended]
    return rounds[ends[-1] + 1 :] if ends else rounds


def opened_round(entry: dict[str, Any]) -> RoundRecord:
    """A round as its first entry (its launch, or its start) tells it, before it trains."""
    step = entry["step"]
    return RoundRecord(step, step, [], entry.get("redone", 0), False, entry.get("restart"), entry.get("host"))


class RepeatedFailure(Exception):
    """The last rounds failed the same way at the same step: restarting again would only repeat it."""


@dataclass
class ThisRound:
    """What this process knows of its round: the journal it writes to, and the steps redone so far."""

    journal: Journal
    started_at: int
    restarts: int  # rounds before this one, by the journal
    redone_total: int  # steps done twice over the whole job, this restart's included
    step: int = 0  # the last step reported, for a fault record


_this_round: ThisRound | None = None


def no_round() -> None:
    """A run without a fixed folder keeps no journal: forget the round of a run before it in this process (from
    Python), whose journal it would otherwise write into."""
    global _this_round
    _this_round = None


def begin_round(run_dir: str, resume_step: int, checkpoint: str | None, rank: int) -> bool:
    """Read the journal of a run with a fixed folder; rank 0 says what this restart resumes from and redoes. Whether
    this round is a restart of the job (which every rank learns).

    Raises `RepeatedFailure` on every rank alike when the last two rounds failed in the same place.
    """
    global _this_round
    journal = Journal(run_dir)
    rounds = this_jobs_rounds(journal.rounds())
    last = rounds[-1] if rounds else None
    if last is not None and last.began_training:  # the reached file is the last round's, finer than its faults
        last.reached = max(last.reached, journal.read_reached())
    redone = max(0, last.reached - resume_step) if last else 0
    redone_total = (last.redone_before if last else 0) + redone
    unjournaled = rounds_without_a_launch(last) if last else 0
    _this_round = ThisRound(journal, resume_step, len(rounds) + unjournaled, redone_total, resume_step)
    if rank == 0 and under_torchelastic():
        journal.append(
            {"event": "launch", "step": resume_step, "restart": restart_count(), "host": HOST, "redone": redone_total}
        )
    if last is None:
        return False
    if len(rounds) >= 2 and same_failure(rounds[-2], last):
        raise RepeatedFailure(
            f"the last two rounds both resumed from step {last.started_at} and failed at step {last.reached} with "
            f"{describe_end(last)}; restarting cannot get past it{this_node_restarts()}"
        )
    if rank != 0:
        return True
    where = f"resumes from step {resume_step} ({checkpoint})" if checkpoint else "no checkpoint yet: starts from step 0"
    before = f"the round before ended at step {last.reached}: {describe_end(last)}"
    if unjournaled:
        before = (
            f"{unjournaled} round{'s' if unjournaled > 1 else ''} before this one ended during start-up, before "
            f"writing to the run folder (killed, or its node lost); the last round that did ended at step "
            f"{last.reached}: {describe_end(last)}"
        )
    print_error(
        f"restart {_this_round.restarts} of the job{this_node_restarts()}: {before}; {where}; {redone} steps "
        f"are done twice ({redone_total} in this job so far)"
    )
    return True


HOST = socket.gethostname()


def rounds_without_a_launch(last: RoundRecord) -> int:
    """Rounds since `last` that ended before their rank 0 journaled their launch, as this node's torchrun counts
    them: only where `last` ran on this node too (a node that joined later counts its restarts from its joining)."""
    if last.restart is None or last.host != HOST:
        return 0
    return max(0, restart_count() - last.restart - 1)


def this_node_restarts() -> str:
    """torchrun counts restarts per agent (a node that joined late counts from 0), as " (...)"; a launch of
    another launcher counts none, so nothing."""
    if not under_torchelastic():
        return ""
    return f" (this node's restart {restart_count()} of at most {max_restarts()})"


def same_failure(earlier: RoundRecord, later: RoundRecord) -> bool:
    """Both rounds failed (an error raised in a rank, not a lost process) from the same start, at the same step."""
    failures = [
        {(fault["step"], fault["what"]) for fault in round_.faults if fault["kind"] == "failed"}
        for round_ in (earlier, later)
    ]
    return bool(failures[1]) and earlier.started_at == later.started_at and failures[0] == failures[1]


def describe_end(record: RoundRecord) -> str:
    """Why a round ended: a rank's own error first (the cause), else an env call that held a rank, else what its
    survivors saw lost."""
    failed = [fault for fault in record.faults if fault["kind"] == "failed"]
    stalled = [fault for fault in record.faults if fault["kind"] == "stalled"]
    late = [fault for fault in record.faults if fault["kind"] == "timeout"]
    lost = [fault for fault in record.faults if fault["kind"] == "lost"]
    if failed:
        return f"{failed[0]['role']} failed: {failed[0]['what']}"
    if stalled:
        return f"{stalled[0]['role']}: {stalled[0]['what']}"
    if late:  # the others then lose the process that gave up
        return f"{late[0]['role']} waited longer than --collective-timeout for {late[0]['what']}"
    if lost:
        return f"{lost[0]['role']} lost {lost[0]['what']}"
    if record.faults:
        return f"{record.faults[0]['role']} was {record.faults[0]['what']}"
    if not record.began_training:
        return (
            "it ended during start-up, before its first iteration, and no process recorded why (killed, or the "
            "node that held it was lost)"
        )
    return "no process recorded why (all were stopped at once, or the node that held them was lost)"


def start_logged(world_size: int) -> dict[str, float]:
    """Rank 0, once the run is open: journal this round's start; the scalars that log the restarts."""
    if _this_round is None:
        return {}
    _this_round.journal.append(
        {
            "event": "start",
            "step": _this_round.started_at,
            "restart": restart_count(),
            "world_size": world_size,
            "redone": _this_round.redone_total,
        }
    )
    _this_round.journal.write_reached(_this_round.started_at)
    if not _this_round.restarts:
        return {}
    return {"Elastic/restarts": float(_this_round.restarts), "Elastic/steps_redone": float(_this_round.redone_total)}


def reached(step: int, is_main: bool) -> None:
    """The step this process has reached (an iteration's, or the batch or weights it last took), which its fault
    record names; the main process also journals it, so that a restart knows what it redoes."""
    if _this_round is None:
        return
    _this_round.step = step
    if is_main:
        _this_round.journal.write_reached(step)


def record_end(step: int, interrupted: bool) -> None:
    """The main process, once the run has ended cleanly at `step` (finished, or stopped by Ctrl-C) with its
    checkpoint written: a later launch in this folder is a resume, not a restart after a fault."""
    if _this_round is None:
        return
    with contextlib.suppress(OSError):
        _this_round.journal.append({"event": "end", "how": "interrupted" if interrupted else "finished", "step": step})


_role: str | None = None  # this process's name in the job's lines, where its mode gives it one


def name_this_process(role: str) -> None:
    """Name this process as its mode does ("player 1", "trainer 2"), in the faults it journals."""
    global _role
    _role = role


def this_process() -> str:
    """This process's name in the job's lines: its mode's, or its rank's."""
    return _role or f"rank {os.environ.get('RANK', '0')}"


def record_fault(role: str, kind: str, what: str) -> None:
    """Why this process ends: `kind` "failed" (its own error), "lost" (a peer is gone), "timeout" (a peer did not
    reach a collective in time), "stalled" (stopped in an env call that had not returned) or "stopped" (by SIGTERM:
    torchrun, or from outside; or by Ctrl-C, with a peer lost after it)."""
    if _this_round is None:
        return
    with contextlib.suppress(OSError):  # the folder itself is gone: the error line on stderr still says it
        _this_round.journal.append(
            {"event": "fault", "role": role, "kind": kind, "what": what, "step": _this_round.step}
        )
