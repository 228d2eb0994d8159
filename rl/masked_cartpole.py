"""CartPole with its velocities hidden: a task that needs memory.

The observation is CartPole-v1's cart position and pole angle only; the cart's and the pole's
velocities, which a policy needs to balance the pole, must be inferred from how those change
from step to step. A feed-forward policy sees one observation and cannot; a recurrent one
(`--recurrent`) can. Registered as `rl/MaskedCartPole-v1`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

VISIBLE = [0, 2]  # cart position and pole angle; 1 and 3 are their velocities


class MaskedCartPole(gym.ObservationWrapper):
    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(gym.make("CartPole-v1", render_mode=render_mode))
        full = self.env.observation_space
        self.observation_space = gym.spaces.Box(full.low[VISIBLE], full.high[VISIBLE], dtype=np.float32)

    def observation(self, state: np.ndarray) -> np.ndarray:
        return state[VISIBLE]


gym.register("rl/MaskedCartPole-v1", entry_point="rl.masked_cartpole:MaskedCartPole")  # CartPole-v1 ends it at 500
