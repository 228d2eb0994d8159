"""Envs that only tests need, registered on import: `--env-id envs_for_tests:UnboundedActions-v0`."""

import ctypes
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


class UnboundedActions(gym.Env):
    """A state-vector env whose Box actions have infinite bounds (SAC cannot squash into them)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(3, dtype=np.float32), 0.0, False, False, {}


gym.register("UnboundedActions-v0", entry_point=UnboundedActions, max_episode_steps=10)


class LivesGame(gym.Env):
    """A game of 3 lives that pays 5 points every step and loses a life every 3 steps: 9 steps, 45 points."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.lives = 0, 3
        return np.zeros(2, dtype=np.float32), {"lives": self.lives}

    def step(self, action):
        self.steps += 1
        if self.steps % 3 == 0:
            self.lives -= 1
        return np.zeros(2, dtype=np.float32), 5.0, self.lives == 0, False, {"lives": self.lives}


gym.register("LivesGame-v0", entry_point=LivesGame)


class FailsAfter(gym.Env):
    """An env with a bug: its 500th step raises, whenever the run restarts from before it (its count is saved)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)
    steps_before_failure = 500

    def __init__(self):
        self.lifetime_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.lifetime_steps += 1
        if self.lifetime_steps == self.steps_before_failure:
            raise RuntimeError(f"the env broke after {self.steps_before_failure} steps")
        return np.zeros(2, dtype=np.float32), 1.0, self.lifetime_steps % 20 == 0, False, {}


gym.register("FailsAfter-v0", entry_point=FailsAfter)


class FixedLength(gym.Env):
    """Episodes of exactly `length` steps (a keyword argument of gym.make) that pay 1 a step, whatever the actions."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 5) -> None:
        self.length, self.steps = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.full(2, self.steps / self.length, dtype=np.float32), 1.0, self.steps >= self.length, False, {}


gym.register("FixedLength-v0", entry_point=FixedLength)


class ShowsItself(FixedLength):
    """FixedLength that renders to a window: in human mode each step draws a frame, a line in the file `frames`."""

    metadata: ClassVar[dict] = {"render_modes": ["human"], "render_fps": 1000}

    def __init__(self, length: int = 5, frames: str = "frames.txt", render_mode: str | None = None) -> None:
        super().__init__(length)
        self.frames, self.render_mode = frames, render_mode

    def step(self, action):
        stepped = super().step(action)
        if self.render_mode == "human":
            self.render()
        return stepped

    def render(self):
        with open(self.frames, "a") as frames:
            frames.write("frame\n")


gym.register("ShowsItself-v0", entry_point=ShowsItself)


class ShowsNothing(ShowsItself):
    """ShowsItself without a window to render to."""

    metadata: ClassVar[dict] = {"render_modes": []}


gym.register("ShowsNothing-v0", entry_point=ShowsNothing)


class CopyBits(gym.Env):
    """Shows random bits (4 by default) and pays, each step, the fraction of them that its MultiBinary action
    copies, over 8-step episodes: copying scores 8, guessing 4. An action outside the space raises."""

    def __init__(self, shape: tuple[int, ...] = (4,)) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, tuple(shape), dtype=np.float32)
        self.action_space = gym.spaces.MultiBinary(list(shape))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._draw(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"{action!r} is not in {self.action_space}")
        reward = float(np.mean(action == self.bits))
        self.steps += 1
        return self._draw(), reward, self.steps >= 8, False, {}

    def _draw(self) -> np.ndarray:
        self.bits = self.np_random.integers(0, 2, self.observation_space.shape).astype(np.float32)
        return self.bits


gym.register("CopyBits-v0", entry_point=CopyBits)


class ReachTheTarget(gym.Env):
    """Acts in a Box of any `shape` (a matrix by default, or a number with `shape=[]`), which training flattens:
    pays, each step, minus the mean distance of the action from a fixed target of that shape, over 8-step episodes
    (the best return is 0, acting 0 scores -3.84). An action of another shape raises."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), dtype=np.float32)

    def __init__(self, shape: tuple[int, ...] = (2, 3)) -> None:
        self.action_space = gym.spaces.Box(-1.0, 1.0, tuple(shape), dtype=np.float32)
        self.target = np.linspace(-0.8, 0.8, self.action_space.low.size, dtype=np.float32).reshape(shape)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if np.shape(action) != self.action_space.shape:
            raise ValueError(f"an action of shape {np.shape(action)}, not {self.action_space.shape}")
        reward = -float(np.mean(np.abs(action - self.target)))
        self.steps += 1
        return np.full(1, self.steps / 8, np.float32), reward, self.steps >= 8, False, {}


gym.register("ReachTheTarget-v0", entry_point=ReachTheTarget)


class CountsItsCopies(CartPoleEnv):
    """CartPole that counts its copies open at once in this process (the most of them in `most_at_once`)."""

    open_now = most_at_once = 0

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        CountsItsCopies.open_now += 1
        CountsItsCopies.most_at_once = max(CountsItsCopies.most_at_once, CountsItsCopies.open_now)

    def close(self) -> None:  # gymnasium may close an env more than once
        if not getattr(self, "closed", False):
            CountsItsCopies.open_now -= 1
            self.closed = True
        super().close()


gym.register("CountsItsCopies-v0", entry_point=CountsItsCopies, max_episode_steps=500)


class FollowTheCue(gym.Env):
    """Choices counted from -1 (left, stay, right): each step shows a cue, one of the three as a one-hot vector, and
    pays 1 for the choice that matches it, over 10-step episodes (guessing scores about 3.3, following 10). With
    `cues=k`, k cues at once and a MultiDiscrete of k choices from -1 that pays the share matched. An action outside
    the env's own space raises."""

    def __init__(self, cues: int | None = None) -> None:
        self.cues = cues
        shown = cues or 1
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3 * shown,), dtype=np.float32)
        if cues is None:
            self.action_space = gym.spaces.Discrete(3, start=-1)
        else:
            self.action_space = gym.spaces.MultiDiscrete([3] * cues, start=[-1] * cues)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._show(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"{action!r} is not an action of {self.action_space}")
        reward = float(np.mean(np.asarray(action) == self.cue))
        self.steps += 1
        return self._show(), reward, self.steps >= 10, False, {}

    def _show(self) -> np.ndarray:
        self.cue = self.np_random.integers(-1, 2, size=self.cues or ())
        return np.eye(3, dtype=np.float32)[np.reshape(self.cue, -1) + 1].reshape(-1)


gym.register("FollowTheCue-v0", entry_point=FollowTheCue)


class BoxOfShape(gym.Env):
    """Observations in a float Box of any `shape` (a matrix, or a scalar with `shape=[]`), which training flattens;
    pays 1 for action 1 over 5-step episodes."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, shape: tuple[int, ...] = (2, 3)) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, tuple(shape), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._draw(), {}

    def step(self, action):
        self.steps += 1
        return self._draw(), float(action), self.steps >= 5, False, {}

    def _draw(self) -> np.ndarray:
        return self.np_random.uniform(-1.0, 1.0, self.observation_space.shape).astype(np.float32)


gym.register("BoxOfShape-v0", entry_point=BoxOfShape)


class HeldCartPole(CartPoleEnv):
    """CartPole whose `step` waits while the file `hold` exists: a test holds a run at a point of its choosing,
    however fast the machine trains."""

    def __init__(self, hold: str) -> None:
        super().__init__()
        self.hold = hold

    def step(self, action: int) -> tuple:
        while os.path.exists(self.hold):
            time.sleep(0.01)
        return super().step(action)


gym.register("HeldCartPole-v0", entry_point=HeldCartPole, max_episode_steps=500)


STEPS_TIMED: list[tuple[int, float, float]] = []  # (thread, start, end) of each TimedCartPole step in this process


class TimedCartPole(CartPoleEnv):
    """CartPole whose `step` takes `seconds` more, outside Python's lock (as a native env's does), and is timed in
    `STEPS_TIMED` with the thread that took it."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def step(self, action: int) -> tuple:
        start = time.monotonic()
        time.sleep(self.seconds)
        stepped = super().step(action)
        STEPS_TIMED.append((threading.get_ident(), start, time.monotonic()))
        return stepped


gym.register("TimedCartPole-v0", entry_point=TimedCartPole, max_episode_steps=500)


class StepReturnsFourValues(FixedLength):
    """The old gym API: (obs, reward, done, info)."""

    def step(self, action):
        obs, reward, terminated, _, info = super().step(action)
        return obs, reward, terminated, info


class ResetTakesNoSeed(FixedLength):
    def reset(self):
        self.steps = 0
        return np.zeros(2, dtype=np.float32), {}


class ObservationsOutsideTheSpace(FixedLength):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, 5.0, dtype=np.float32), {}


class WholeNumberActions(FixedLength):
    """A Box of integer actions, which no policy's real-valued actions lie in."""

    action_space = gym.spaces.Box(-3, 3, (2,), dtype=np.int64)


gym.register("StepReturnsFourValues-v0", entry_point=StepReturnsFourValues)
gym.register("WholeNumberActions-v0", entry_point=WholeNumberActions)
gym.register("ResetTakesNoSeed-v0", entry_point=ResetTakesNoSeed)
gym.register("ObservationsOutsideTheSpace-v0", entry_point=ObservationsOutsideTheSpace)


class KilledOnceAtStartup(CartPoleEnv):
    """CartPole whose first construction after the file `marker` appears deletes it and kills its own process
    outright: a test makes one round of a job die during start-up, before it trains."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        try:
            os.remove(marker)
        except FileNotFoundError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


gym.register("KilledOnceAtStartup-v0", entry_point=KilledOnceAtStartup, max_episode_steps=500)


class SlowToMake(CartPoleEnv):
    """CartPole that takes a minute to make, and says on stderr when it starts to: a test interrupts a run
    while it is still starting up."""

    def __init__(self) -> None:
        super().__init__()
        print("making an env", file=sys.stderr, flush=True)
        time.sleep(60)


gym.register("SlowToMake-v0", entry_point=SlowToMake, max_episode_steps=500)


class SlowToMakeForTraining(CartPoleEnv):
    """CartPole that takes a minute to make once its process listens for SIGTERM (the run's own handler: the envs it
    trains on, not those it makes first to look at the env), and says so on stderr: a test stops a run then. Where
    `on_rank` is given, only in that rank's process; the others say when they take their first step."""

    def __init__(self, on_rank: int | None = None) -> None:
        super().__init__()
        rank = os.environ.get("RANK", "0")
        for_training = signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        slow_here = on_rank is None or rank == str(on_rank)
        self.says_first_step = for_training and not slow_here
        if for_training and slow_here:
            print(f"rank {rank} is making an env to train on", file=sys.stderr, flush=True)
            time.sleep(60)

    def step(self, action):
        if self.says_first_step:
            self.says_first_step = False
            print(f"rank {os.environ.get('RANK', '0')} took its first step", file=sys.stderr, flush=True)
        return super().step(action)


gym.register("SlowToMakeForTraining-v0", entry_point=SlowToMakeForTraining, max_episode_steps=500)


class DictCartPole(CartPoleEnv):
    """CartPole whose observation is a Dict: the cart's position and velocity, the pole's angle and angular
    velocity, and a Discrete flag that says which side of the track the cart is on."""

    def __init__(self) -> None:
        super().__init__()
        bound = np.array([4.8, np.inf], dtype=np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "cart": gym.spaces.Box(-bound, bound),
                "pole": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "side": gym.spaces.Discrete(2),
            }
        )

    def _as_dict(self, obs: np.ndarray) -> dict:
        return {"cart": obs[:2].astype(np.float32), "pole": obs[2:].astype(np.float32), "side": int(obs[0] > 0)}

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return self._as_dict(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return self._as_dict(obs), reward, terminated, truncated, info


gym.register("DictCartPole-v0", entry_point=DictCartPole, max_episode_steps=500)


class TextObservations(FixedLength):
    observation_space = gym.spaces.Text(8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "hello", {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return "hello", reward, terminated, truncated, info


gym.register("TextObservations-v0", entry_point=TextObservations)


class ImageAndText(FixedLength):
    """A Dict of an image and a Text: a key that no encoder takes."""

    observation_space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (36, 36), np.uint8), "note": gym.spaces.Text(8)}
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation(), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return self.observation(), reward, terminated, truncated, info

    @staticmethod
    def observation() -> dict:
        return {"image": np.zeros((36, 36), np.uint8), "note": "hello"}


gym.register("ImageAndText-v0", entry_point=ImageAndText)


def wait_forever_holding_the_gil(holding: bool = True) -> None:
    """What a simulator's native step can do: wait forever, through any signal, keeping Python's interpreter lock (a
    call through ctypes.PyDLL keeps it), or letting other threads run (`holding=False`: ctypes.CDLL lets go of it)."""
    mutex = ctypes.create_string_buffer(64)  # zeroed: an unlocked mutex of the default kind
    lock = (ctypes.PyDLL if holding else ctypes.CDLL)(None).pthread_mutex_lock
    lock(mutex)
    lock(mutex)  # it waits for itself


class Misbehaves(gym.Env):
    """From its `after`th step on (counted over the env's life), `fault`: "raise" (a RuntimeError from a helper),
    "nan_observation", "nan_last_observation" (NaN only in an episode's last observation), "inf_reward",
    "huge_reward" (1e30, which the value loss squares past float32's range),
    "wrong_shape" (an observation of 4 values, where its space holds 3), "outside_the_space" (an observation beyond
    its space's bounds, which gymnasium's checker warns of at the first step, and a run takes), "none_reward" (None,
    which the vector env stores as nan), "reward_array" and "terminated_array" (a reward or a terminated flag as an
    array of one value, not a number or a bool; the flag ends each episode at its 10th step), "terminated_pair" (a
    terminated flag as an array of two), "warn" (a UserWarning at each step, which Python shows once a process),
    "hang" (a step that never returns, after touching the file HANG_MARKER names), "hang_holding_the_gil" (the same,
    in native code that keeps Python's interpreter lock), "hang_in_native_code" (the same, in native code that lets
    go of it), "die_once" (the first env to get there, the one that creates the file DIE_MARKER names, kills its own
    process), "raise_on_close" (its close raises), or "as_asked" (the fault that MISBEHAVE names in the environment,
    where it is set); only in the process of rank `on_rank`, where it is given."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, after: int = 300, fault: str = "raise", on_rank: int | None = None):
        self.after, self.fault, self.lifetime_steps = after, fault, 0
        self.faulty = on_rank is None or os.environ.get("RANK", "0") == str(on_rank)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        self.steps += 1
        self.lifetime_steps += 1
        obs, reward, terminated = np.full(3, 0.5, dtype=np.float32), 1.0, False
        fault = os.environ.get("MISBEHAVE") if self.fault == "as_asked" else self.fault
        if self.faulty and self.lifetime_steps >= self.after:
            if fault == "raise":
                self.lose_contact()
            if fault == "nan_observation" or (fault == "nan_last_observation" and self.steps >= 20):
                obs[2] = np.nan
            if fault == "wrong_shape":
                obs = np.append(obs, 0.5).astype(np.float32)
            if fault == "outside_the_space":
                obs = np.full(3, 2.0, dtype=np.float32)
            if fault == "none_reward":
                reward = None
            if fault == "inf_reward":
                reward = float("inf")
            if fault == "huge_reward":
                reward = 1e30  # finite, but its squared value error is not
            if fault == "reward_array":
                reward = np.array([reward])
            if fault == "terminated_array":
                terminated = np.array([self.steps >= 10])
            if fault == "terminated_pair":
                terminated = np.array([terminated, terminated])
            if fault == "warn":
                warnings.warn("the simulator's clock drifts", UserWarning, stacklevel=1)
            if fault == "hang":
                self.hang()
            if fault in ("hang_holding_the_gil", "hang_in_native_code"):
                self.hang_holding_the_gil(holding=fault == "hang_holding_the_gil")
            if fault == "die_once":
                self.die_once()
        return obs, reward, terminated, self.steps >= 20, {}

    def close(self):
        if self.fault == "raise_on_close" and self.lifetime_steps >= self.after:
            self.lose_contact()

    @staticmethod
    def lose_contact():
        raise RuntimeError("lost contact with the simulator\nits log: ...")

    @staticmethod
    def die_once():
        try:
            os.close(os.open(os.environ["DIE_MARKER"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def hang():
        Path(os.environ["HANG_MARKER"]).touch()
        time.sleep(3600)

    @staticmethod
    def hang_holding_the_gil(holding: bool = True):
        Path(os.environ["HANG_MARKER"]).touch()
        wait_forever_holding_the_gil(holding)


gym.register("Misbehaves-v0", entry_point=Misbehaves)


class MisbehavesWithImage(Misbehaves):
    """`Misbehaves` whose observation is a Dict of an image and its vector, under the key "state"."""

    observation_space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (36, 36), np.uint8), "state": Misbehaves.observation_space}
    )

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return self.with_image(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return self.with_image(obs), reward, terminated, truncated, info

    @staticmethod
    def with_image(state: np.ndarray) -> dict:
        return {"image": np.zeros((36, 36), np.uint8), "state": state}


gym.register("MisbehavesWithImage-v0", entry_point=MisbehavesWithImage)
