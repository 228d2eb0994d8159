"""A task that needs both keys of a Dict observation: an image and a vector, each half of the answer.

Each step shows two cues drawn anew: an image (36 x 36, uint8) with one of its four quarters lit,
and a one-hot vector of four. The step is rewarded (+1) when the action is the sum of the two
cues' numbers, modulo 4. An episode is 16 steps, so its return is 16 at best; with one cue alone
the sum is a uniform guess, and the expected return is 4. Registered as `rl/TwoCues-v0`.

`keys` keeps only some of the cues (`--env-kwargs keys=image`), to show what either alone gives;
`continuous=True` asks for a Box action in [-1, 1], its quarter the answer, for SAC.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

CUES = 4
EPISODE_STEPS = 16


class TwoCues(gym.Env):
    def __init__(self, keys: str | tuple[str, ...] = ("image", "vector"), continuous: bool = False, size: int = 36):
        chosen = (keys,) if isinstance(keys, str) else tuple(keys)
        spaces = {
            "image": gym.spaces.Box(0, 255, (size, size), np.uint8),
            "vector": gym.spaces.Box(0.0, 1.0, (CUES,), np.float32),
        }
        if not chosen or any(key not in spaces for key in chosen):
            raise ValueError(f"keys must name image, vector or both, got {keys}")
        self.keys, self.size = chosen, size
        self.observation_space = gym.spaces.Dict({key: spaces[key] for key in chosen})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(CUES)
        self.cues = np.zeros(2, dtype=np.int64)
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return self._draw(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        answer = int(self.cues.sum() % CUES)
        reward = float(self._chosen(action) == answer)
        self.steps += 1
        return self._draw(), reward, self.steps == EPISODE_STEPS, False, {}

    def _chosen(self, action: Any) -> int:
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(action)
        return int(np.clip((float(np.asarray(action).reshape(-1)[0]) + 1.0) / 2.0 * CUES, 0, CUES - 1))

    def _draw(self) -> dict[str, np.ndarray]:
        self.cues = self.np_random.integers(0, CUES, size=2)
        obs: dict[str, np.ndarray] = {}
        if "image" in self.keys:
            image = np.zeros((self.size, self.size), dtype=np.uint8)
            half = self.size // 2
            row, column = divmod(int(self.cues[0]), 2)
            image[row * half : (row + 1) * half, column * half : (column + 1) * half] = 255
            obs["image"] = image
        if "vector" in self.keys:
            obs["vector"] = np.eye(CUES, dtype=np.float32)[self.cues[1]]
        return obs


gym.register("rl/TwoCues-v0", entry_point="rl.two_cues:TwoCues")
