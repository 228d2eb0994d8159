"""What a spawned process takes from the process that started it, when that one is an interactive session.

A spawned process is a fresh interpreter: it imports by name what it unpickles, and runs the
starting script again to find what was defined there. A notebook, `python -c` or `python -` has
no script to run again, so a callback class defined there, or an env registered there, would be
missing in the new process. They travel by value instead.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import sys
from collections import ChainMap
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Generic, TypeVar

import cloudpickle
import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from rl.envs import register_optional_envs

T = TypeVar("T")


class ByValue(Generic[T]):
    """`value`, pickled by cloudpickle: the classes and functions of the starting session travel with it. The
    reductions that multiprocessing and torch register (tensors in shared memory, queues, pipes) still apply."""

    def __init__(self, value: T, name: str = "a value") -> None:
        self.value, self.name = value, name

    def check(self) -> ByValue[T]:
        """Raise the TypeError that sending `value` would raise, without sending it: a trial pickling that stands
        in for the file descriptors of shared tensors and queues (sharing one for nothing would hold it open)."""
        with _as_if_spawning():
            self._pickled(_TrialPickler)
        return self

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        return _unpickled, (self._pickled(_ForkingCloudPickler),)

    def _pickled(self, pickler: type[cloudpickle.Pickler]) -> bytes:
        buffer = io.BytesIO()
        try:
            pickler(buffer).dump(self.value)
        except Exception as error:  # whatever pickling an object of the user's raises: a lock's TypeError, say
            raise TypeError(f"{self.name} cannot be pickled for a spawned process: {error}") from error
        return buffer.getvalue()


class _ForkingCloudPickler(cloudpickle.Pickler):
    """cloudpickle's pickler with the reductions of multiprocessing's (a ForkingPickler's table)."""

    def __init__(self, file: io.BytesIO) -> None:
        # Set before the pickler is made, which reads its table once.
        forking_reductions = ForkingPickler(io.BytesIO()).dispatch_table
        self.dispatch_table = ChainMap(forking_reductions, cloudpickle.Pickler.dispatch_table)
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)


class _TrialPickler(cloudpickle.Pickler):
    """cloudpickle's pickler with what multiprocessing's would share (tensors, queues, pipes) stood in for."""

    def __init__(self, file: io.BytesIO) -> None:
        shared_types = ForkingPickler(io.BytesIO()).dispatch_table
        stand_ins = {kind: _stand_in for kind in shared_types}
        self.dispatch_table = ChainMap(stand_ins, cloudpickle.Pickler.dispatch_table)
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)


def _stand_in(_shared: object) -> tuple[type[None], tuple[()]]:
    return type(None), ()


class _NoChild:
    """The process being spawned, for a trial pickling: multiprocessing's locks and queues pickle only while
    one is, and ask it for their file descriptors."""

    @staticmethod
    def duplicate_for_child(fd: int) -> int:
        return fd

    @staticmethod
    def DupFd(fd: int) -> int:  # the name multiprocessing calls
        return fd


@contextmanager
def _as_if_spawning() -> Iterator[None]:
    spawning = multiprocessing.context.get_spawning_popen()
    multiprocessing.context.set_spawning_popen(_NoChild())
    try:
        yield
    finally:
        multiprocessing.context.set_spawning_popen(spawning)


def _unpickled(data: bytes) -> ByValue:
    return ByValue(pickle.loads(data))


def env_registration(env_id: str) -> ByValue[EnvSpec | None]:
    """This process's registry entry for `env_id`, for a spawned process. None for an id that gymnasium's
    `module:Env-v0` form imports by itself, and for an entry that cannot be pickled (its keyword arguments hold a
    lock, say): the spawned process then has only what its imports register."""
    spec = gym.envs.registry.get(env_id)
    try:
        with _as_if_spawning():
            _TrialPickler(io.BytesIO()).dump(spec)
    except Exception:  # whatever pickling an object of the user's raises
        return ByValue(None)
    return ByValue(spec)


def register_in_this_process(registration: ByValue[EnvSpec | None]) -> None:
    """Register the env of `env_registration` here, unless importing this process's modules registered it."""
    spec = registration.value
    if spec is None:
        return
    register_optional_envs(spec.id)
    gym.envs.registry.setdefault(spec.id, spec)


@contextmanager
def main_module_without_a_missing_file() -> Iterator[None]:
    """Hide the main module's file while processes are spawned, where that file does not exist.

    `python -` names it `<stdin>`, which a spawned process would try to run. Without a file the main
    module is an interactive session's, whose definitions travel by value (`ByValue`)."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or path is None or os.path.isfile(path):
        yield  # run as a module (`python -m`, found again by name), interactive, or a script: spawn handles each
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def importing_the_script_that_spawned_this_process() -> bool:
    """Whether this process was spawned and is running the starting script again (as multiprocessing does, to find
    what the script defines): what that script starts outside `if __name__ == "__main__":` would run here too."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))
