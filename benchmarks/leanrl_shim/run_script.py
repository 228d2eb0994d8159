"""Runs one of LeanRL's scripts as `__main__`, for `benchmarks/gpu.py --leanrl`:

    python run_script.py SCRIPT [ITS FLAGS...]

Their SAC reads each finished episode's return with `float(info["episode"]["r"])`. gymnasium 0.29, whose
`final_observation` that script needs, gives a single env's episode statistics as one-element arrays, and NumPy 2.4
and later refuse `float()` of an array that is not 0-d, so the script stopped at its first episode's end. Here those
statistics are 0-d arrays: the same values, read once per episode, so the speed measured is unchanged.
"""

import runpy
import sys
from collections.abc import Callable
from typing import Any

from gymnasium.wrappers import RecordEpisodeStatistics


def with_scalar_statistics(step: Callable[..., tuple]) -> Callable[..., tuple]:
    def step_with_scalar_statistics(self: RecordEpisodeStatistics, action: Any) -> tuple:
        *transition, infos = step(self, action)
        if not self.is_vector_env and "episode" in infos:
            infos["episode"] = {key: value.reshape(()) for key, value in infos["episode"].items()}
        return (*transition, infos)

    return step_with_scalar_statistics


if __name__ == "__main__":
    RecordEpisodeStatistics.step = with_scalar_statistics(RecordEpisodeStatistics.step)
    sys.argv = sys.argv[1:]  # the script parses its own flags, and names its runs after its own file
    runpy.run_path(sys.argv[0], run_name="__main__")
