"""User-facing errors: one line, the offending flag, exit code 2 on every rank."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

USAGE_EXIT_CODE = 2


class UsageError(Exception):
    """Bad input from the user (a flag, an environment, a checkpoint)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def print_error(line: str) -> None:
    """One line on stderr in a single write, so lines from several ranks never interleave."""
    try:
        descriptor = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # a stream without a file, e.g. captured
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
        return
    sys.stderr.flush()
    os.write(descriptor, f"{line}\n".encode())


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
        sys.exit(USAGE_EXIT_CODE)
