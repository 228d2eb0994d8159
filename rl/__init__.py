"""Distributed PPO and SAC on Lightning Fabric and raw torch.distributed.

As a library: `rl.train(rl.preset("cartpole"))` trains in this process (`rl.api`), and
`rl.load_agent(path).predict(obs)` acts with a saved agent (`rl.agent`).
"""

import os
import time

# When this process started its Python work: the end-of-run summary reports the time since.
PROCESS_STARTED = time.monotonic()

# torch's OpenMP threads wait for their next op by spinning, unless told otherwise. On a machine whose cores
# other processes also use (runs side by side, a shared node), a spinning thread holds a core that the thread it
# waits for needs: one process on 2 threads trained 2-9.5x slower, or worse, than with sleeping threads. On a
# machine it has to itself, sleeping costs it 14-20% (benchmarks/omp_wait.py). So threads sleep, unless the user
# chose a wait. Set here: OpenMP reads it once, as torch loads it, and the entry points import this package first.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


LIBRARY = {  # the library's names, and the modules that hold them
    "load_agent": "rl.agent",
    "Agent": "rl.agent",
    "train": "rl.api",
    "preset": "rl.api",
    "load_config": "rl.api",
    "TrainingResult": "rl.run",
    "PPOConfig": "rl.algos.ppo.config",
    "SACConfig": "rl.algos.sac.config",
    "UsageError": "rl.errors",
    "RunStopped": "rl.errors",
    "TrainingDiverged": "rl.optim",
    "Callback": "rl.loop",
    "LoopState": "rl.loop",
}


def __getattr__(name: str):
    # The library's names load on first use: `import rl` stays light for the entry points, which set up
    # threads and OpenMP before torch loads.
    if name in LIBRARY:
        import importlib

        return getattr(importlib.import_module(LIBRARY[name]), name)
    raise AttributeError(f"module 'rl' has no attribute {name!r}")


def __dir__() -> list[str]:
    # What tab completion offers: the library's names, which load only on first use, the submodules loaded so far
    # and the dunders; not the names this file uses itself (os, time, LIBRARY, PROCESS_STARTED).
    dunders = [name for name in globals() if name.startswith("__")]
    submodules = [name for name, value in globals().items() if getattr(value, "__name__", "") == f"{__name__}.{name}"]
    return sorted([*dunders, *submodules, *LIBRARY])


__all__ = list(LIBRARY)
