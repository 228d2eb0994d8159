"""CartPole seen through pixels only: a small image env that a CNN can learn in CI time.

The observation is a drawing of CartPole-v1's state, `size` x `size` uint8 grayscale: the cart
as a block on its track and the pole as a line, its angle drawn 3x larger so that the few
degrees CartPole allows span several pixels. Velocities are not drawn: stacked frames
(`--frame-stack`) carry them, as with any image env. Rendering (`render_mode="rgb_array"`) shows
CartPole's own frames. Registered as `rl/PixelCartPole-v1`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ANGLE_SCALE = 3.0
TRACK_LIMIT = 2.4  # CartPole ends an episode past this cart position


class PixelCartPole(gym.ObservationWrapper):
    def __init__(self, render_mode: str | None = None, size: int = 40) -> None:
        super().__init__(gym.make("CartPole-v1", render_mode=render_mode))
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)
        self._pole_points = np.linspace(0.0, 1.0, 2 * size)

    def observation(self, state: np.ndarray) -> np.ndarray:
        size = self.size
        image = np.zeros((size, size), dtype=np.uint8)
        cart_x = int(np.rint((state[0] / TRACK_LIMIT + 1.0) / 2.0 * (size - 1)))
        cart_x = min(max(cart_x, 1), size - 2)
        cart_y = size - 4
        image[cart_y : cart_y + 3, cart_x - 1 : cart_x + 2] = 128
        angle, length = ANGLE_SCALE * float(state[2]), 0.6 * size
        xs = np.rint(cart_x + self._pole_points * length * np.sin(angle)).astype(np.int64)
        ys = np.rint(cart_y - self._pole_points * length * np.cos(angle)).astype(np.int64)
        inside = (xs >= 0) & (xs < size) & (ys >= 0) & (ys < size)
        image[ys[inside], xs[inside]] = 255
        return image


gym.register("rl/PixelCartPole-v1", entry_point="rl.pixel_cartpole:PixelCartPole")  # CartPole-v1 ends it at 500 steps
