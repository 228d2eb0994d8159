"""User-facing errors: one line, the offending flag, exit code 2 on every rank."""

from __future__ import annotations

import difflib
import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

USAGE_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # the shell's status for a process ended by SIGINT
# torchrun's agent stops every rank as soon as one exits. A rank that finds bad input therefore
# waits for its peers, checking the same input a moment later, to print their own line: it counts
# their reports in the launcher's store and leaves once all are in, or after this long at most.
# Ranks start at different times on a loaded machine (their imports alone take seconds of CPU),
# so the wait is generous; it runs out only where some rank found no problem (a file missing on
# one node), and then delays the exit by this much.
PEER_REPORT_TIMEOUT_SECONDS = 30.0
# Without a launcher's store nothing can be counted: the rank waits this long for its peers.
PEER_GRACE_SECONDS = 3.0
Behind = TypeVar("Behind", bound=BaseException)


class UsageError(Exception):
    """Bad input from the user (a flag, an environment, a checkpoint)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun` as a message says them: "1 rank", "2 ranks", "3 processes" (with `plural`)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def how_it_ended(exitcode: int) -> str:
    """A process's end, as its exit code tells it: "was killed by SIGSEGV", "ended with exit code 3"."""
    return f"was killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"ended with exit code {exitcode}"


SLIP_CUTOFF = 0.8  # difflib's similarity ratio above which an unknown name is taken for a slip of a known one


def did_you_mean(word: str, names: Iterable[str], cutoff: float = SLIP_CUTOFF) -> str:
    """ "did you mean num_envs?" where `word` is a slip of one of `names` (the closest); empty otherwise."""
    close = difflib.get_close_matches(word, list(names), n=1, cutoff=cutoff)
    return f"did you mean {close[0]}?" if close else ""


def misspelled_option(error: UsageError, spellings: Iterable[str]) -> UsageError | None:
    """A parse `error` for an unknown option that is a slip of one of `spellings` (--num-envz), or the last words of
    just one of them (--video, of --capture-video), with that one named; None for any other error."""
    listed_spellings = list(spellings)
    for word in unrecognized_options(error):
        option = word.partition("=")[0]
        slip = flag_meant(option, listed_spellings) if option.startswith("--") else ""
        if slip:
            return UsageError(error.flag, f"{error.message}; {slip}")
    return None


SHORTEST_FLAG_ENDING = 4  # letters: shorter endings (--lr, --id) end flags of other meanings


def flag_meant(option: str, spellings: list[str]) -> str:
    """ "did you mean --capture-video?" where `option` is a slip of one of `spellings`, or failing that the last
    words of exactly one of them; empty otherwise."""
    slip = did_you_mean(option, spellings)
    ending = option.removeprefix("--")
    if slip or len(ending) < SHORTEST_FLAG_ENDING:
        return slip
    ending_it = [name for name in spellings if name.endswith(f"-{ending}") and not name.startswith("--no-")]
    return f"did you mean {ending_it[0]}?" if len(ending_it) == 1 else ""


def listed(names: list[str]) -> str:
    """Names as a sentence lists them: "a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def ranks_named(ranks: list[int]) -> str:
    """Ranks as a message names them: "rank 1", "ranks 1 and 3"."""
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {listed([str(rank) for rank in ranks])}"


def did_not_join(who: str, timeout_seconds: float) -> str:
    """The end of a process that waited in vain for `who` to join the job's process group."""
    return (
        f"{who} did not join within --collective-timeout {timeout_seconds:g} s; "
        "a process that ends while starting says why in its own output"
    )


def unrecognized_options(error: UsageError) -> list[str]:
    """The words of the command line that the parser refused in `error` as unrecognized; [] for any other error."""
    _, listed, unrecognized = str(error).partition("Unrecognized options: ")
    return unrecognized.split(", ") if listed else []


class RunStopped(Exception):
    """The run stopped part way: one of its processes ended or failed (the others were stopped), or a file of the
    run could not be written. The message says what happened, and what of the run is kept. The command line
    prints it as an error line; in Python it is raised."""

    def __init__(self, message: str, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank  # every rank of the job raised it at once, and prints its line before it exits
        self.context = ""  # lines printed above the error line (an env's own frames, where it raised)

    def lines(self, who: str = "") -> str:
        """What to print: the context, if any, then the error line (`who`: the process, where several print)."""
        line = f"error: {who}{self}"
        return f"{self.context}\n{line}" if self.context else line


def system_error(error: BaseException | None) -> OSError | None:
    """The system's refusal (a full disk, a quota, a lost mount) behind `error`, if any: the error itself, or one
    it was raised over, as Python's traceback would show it."""
    return behind(error, OSError)


def behind(error: BaseException | None, kind: type[Behind]) -> Behind | None:
    """The error of `kind` that `error` is, or was raised over (from it, or while handling it), if any."""
    while error is not None and not isinstance(error, kind):
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return error


FOLDER_GONE = "folder is gone (removed or moved while the run wrote into it)"


@contextmanager
def refused_writes(error_for: Callable[[str], Exception]) -> Iterator[None]:
    """Raise `error_for(the system's reason)` in place of an error that a write the system refused is behind, and a
    Ctrl-C as itself where a library raised its own error over it. Libraries do: torch's zip writer, closing an
    archive after a failed or interrupted write, an unexplained RuntimeError; Lightning's TensorBoard logger, a
    ValueError about the value it was logging."""
    try:
        yield
    except Exception as error:
        interrupt = behind(error, KeyboardInterrupt)
        if interrupt is not None:
            raise interrupt from None
        refused = system_error(error)
        if refused is None:
            raise
        raise error_for(refused.strerror or str(refused)) from None


_progress_line_open = False  # a progress bar is drawn on stderr's current line


def progress_line(is_open: bool) -> None:
    """Called by the progress bar: while it is drawn, an error line must start on a line of its own."""
    global _progress_line_open
    _progress_line_open = is_open


def print_error(line: str) -> None:
    """One line on stderr in a single write, so lines from several ranks never interleave.

    A progress bar leaves the cursor at the end of its text, without a newline; the error line
    must not be glued to it. On a terminal the bar's line (whichever rank drew it) is cleared
    first; elsewhere (a pipe, a file) the line starts after a newline if this process's bar is
    drawn. Signal-safe: no lock is taken.
    """
    global _progress_line_open
    record_for_the_launcher(line)
    try:
        descriptor = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # a stream without a file, e.g. captured
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
        return
    if os.isatty(descriptor):
        line = f"\r\x1b[K{line}"
    elif _progress_line_open:
        line = f"\n{line}"
    _progress_line_open = False
    sys.stderr.flush()
    os.write(descriptor, f"{line}\n".encode())


def record_for_the_launcher(text: str) -> None:
    """Give torchrun (and `fabric run`) the error line of `text`, if it ends in one: its summary of a failed job
    shows each failed process's error file, which says otherwise only where to read about enabling tracebacks."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    line = text.rpartition("\n")[2]
    if path is None or not line.startswith("error: "):
        return
    try:
        with open(path, "w", encoding="utf-8") as file:
            # torch's own layout, which its summary shows by `py_callstack`: here the line stands in for a traceback
            json.dump(
                {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}},
                file,
            )
    except OSError:  # the launcher's summary is a courtesy: the line is printed above it either way
        pass


@contextmanager
def exit_on_usage_error(prefix: str = "error") -> Iterator[None]:
    """Turn a `UsageError` into a one-line message and exit code 2, without a traceback.

    Every rank validates the same input before the first collective, so every rank exits
    here on its own and none is left waiting on a peer.
    """
    try:
        yield
    except UsageError as error:
        print_error(f"{prefix}: {error}")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            exit_after_peers_report()
        sys.exit(USAGE_EXIT_CODE)


INTERRUPTED_STARTING = "interrupted (Ctrl-C) before training began"


def ctrl_c_ends_start_up() -> None:
    """Until `rl.cli.run_main` takes Ctrl-C over (`start_up_done`), it ends the process at once, with one line from
    rank 0. An entry script's imports take seconds, and a KeyboardInterrupt raised in one prints a traceback on every
    rank (or leaves a module half imported, for the code that catches it to fail on). Where this process started
    with SIGINT ignored (a shell's background job), it stays so."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_starting)


def start_up_done() -> None:
    """Ctrl-C raises KeyboardInterrupt again, as Python's default has it."""
    if signal.getsignal(signal.SIGINT) is _interrupted_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted_starting(signum: int, frame: object) -> None:
    if os.environ.get("RANK", "0") == "0":
        print_error(INTERRUPTED_STARTING)
    os._exit(INTERRUPTED_EXIT_CODE)


@contextmanager
def exit_on_ctrl_c() -> Iterator[None]:
    """Ctrl-C ends a tool (`rl.evaluate`, `rl.export`, `rl.tune`) in one line, with the shell's status for SIGINT,
    rather than a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        print_error("interrupted (Ctrl-C)")
        sys.exit(INTERRUPTED_EXIT_CODE)


def exit_after_peers_report(exit_code: int = USAGE_EXIT_CODE) -> None:
    """Give peers time to print their own line, then exit with `exit_code` even if the launcher stops us first.

    `os._exit` because a SIGTERM that lands during interpreter shutdown would otherwise read as -15.
    Nothing needs cleaning up: bad input is found before any file, logger or process group exists, and a run
    stopped on every rank at once has nothing left to write.
    """
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(exit_code))
    if not wait_for_every_rank_report(time.monotonic() + PEER_REPORT_TIMEOUT_SECONDS):
        time.sleep(PEER_GRACE_SECONDS)
    os._exit(exit_code)


def wait_for_every_rank_report(deadline: float) -> bool:
    """Count this rank's report in the launcher's store and wait, until `deadline`, for every rank's.
    False where there is no launcher's store to count in.

    Only where torchrun (or `fabric run`) says its agent's store at `MASTER_ADDR:MASTER_PORT` is up
    before any worker starts. Elsewhere rank 0 would host it only later, and whatever holds that
    port meanwhile may not be a store at all. Keyed by the restart, so an earlier round's count
    never stands in.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return False
    from datetime import timedelta

    import torch.distributed as dist

    world_size = int(os.environ["WORLD_SIZE"])
    key = f"rl/error_reports/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    try:
        # The agent's store is up before any worker starts: connecting takes no time unless no store is there.
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=PEER_GRACE_SECONDS),
        )
        reported = store.add(key, 1)
        while reported < world_size and time.monotonic() < deadline:
            time.sleep(0.02)
            reported = store.add(key, 0)
    except (KeyError, ValueError, RuntimeError):  # no launcher's store to count in (DistError is a RuntimeError)
        return False
    return True
