"""Export a trained policy as a standalone greedy policy: `python -m rl.export CHECKPOINT --format F --out FILE`.

The file maps a batch of observations, as the training envs gave them (after the run's image
wrappers: grayscale, resize, frame stack), to the actions the trained agent takes greedily. What
the policy does to an observation travels inside it: the observation normalization's statistics,
and for images the scaling of uint8 pixels and their layout. Actions come back in the env's own
shape, Box actions clipped to the env's bounds, as training sent them. It runs without this project:

- `--format torchscript`: `torch.jit.load(FILE)(obs)` with plain torch;
- `--format onnx`: `onnxruntime.InferenceSession(FILE).run(None, {"obs": obs})` (`pip install -e ".[export]"`).

A choice (`Discrete`, ...), or a Dict or Tuple of vectors, which training flattens, is given flattened:
`gymnasium.spaces.flatten(space, obs)` of each observation. With `--time-feature`, each observation ends in the
elapsed fraction of the episode's time limit, as gymnasium's `TimeAwareObservation(normalize_time=True)` appends
it. A Dict observation with images is given key by key, as named inputs in the Dict's order: images as uint8,
vector keys as float32 rows (choices one-hot, as gymnasium flattens them).

A recurrent policy takes one step per call and carries its LSTM's state from call to call: it takes
the observations, `state` (float32 [2, layers, batch, hidden], h and c; zeros to begin) and
`episode_start` (bool [batch], true where an observation is the first of its episode, which zeroes
that row's state first), and returns the actions and `next_state`, to give to the next call.

Only weights are read from the checkpoint (`torch.load(weights_only=True)`): nothing in it is
unpickled, whatever the file holds.
"""

from __future__ import annotations

import errno
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import gymnasium as gym
import torch
import tyro
from torch import Tensor, nn

from rl.agent import Agent, agent_from_file
from rl.config import home_expanded
from rl.envs import EnvActions, Preprocessing, is_image_space
from rl.errors import UsageError, exit_on_ctrl_c, exit_on_usage_error, misspelled_option, refused_writes
from rl.flag_parsing import flag_spellings, parse_dataclass
from rl.multi_input import KeyInput, MultiInputLayout, packed_layout
from rl.normalization import CLIP, ObservationNormalizer

ExportFormat = Literal["torchscript", "onnx"]


@dataclass
class ExportConfig:
    """Export a saved agent (agent.ckpt) or a training checkpoint as a standalone greedy policy."""

    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="CHECKPOINT")]
    """the file to export"""
    out: str
    """the file to write"""
    format: Literal["auto", "torchscript", "onnx"] = "auto"
    """torchscript (plain torch) or onnx (onnxruntime); auto: onnx for a .onnx file, else torchscript"""

    @property
    def chosen_format(self) -> ExportFormat:
        if self.format != "auto":
            return self.format
        return "onnx" if Path(self.out).suffix.lower() == ".onnx" else "torchscript"


class GreedyPolicy(nn.Module):
    """Observations in, greedy actions out: the normalization, the policy and the action bounds in one module."""

    def __init__(
        self,
        policy: nn.Module,
        normalizer: ObservationNormalizer,
        pixels: bool,
        space: gym.Space,
        env_actions: EnvActions | None = None,
    ) -> None:
        super().__init__()
        self.policy, self.pixels, self.normalizes = policy, pixels, normalizer.enabled
        self.action_shape = list((env_actions.shape if env_actions else space.shape) or ())  # as the env takes it
        start = env_actions.start if env_actions else None
        self.offsets = start is not None
        self.register_buffer("start", torch.as_tensor(0 if start is None else start))
        mean, scale = normalizer.mean_and_scale()
        self.register_buffer("mean", mean)
        self.register_buffer("scale", scale)
        bounded = isinstance(space, gym.spaces.Box)
        self.clips = bounded
        self.register_buffer("low", torch.as_tensor(space.low if bounded else 0.0, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(space.high if bounded else 0.0, dtype=torch.float32))

    @property
    def input_names(self) -> list[str]:
        """The exported file's inputs."""
        return ["obs"]

    @property
    def output_names(self) -> list[str]:
        """The exported file's outputs."""
        return ["action"]

    def forward(self, obs: Tensor) -> Tensor:
        return self.env_actions(self.policy.greedy_action(self.policy_inputs(obs)))

    def policy_inputs(self, obs: Tensor) -> Tensor:
        """The observations as the policy trained on them."""
        if self.pixels:  # images stay uint8 into the CNN
            return obs
        obs = obs.reshape(obs.shape[0], -1).float()  # vectors train as float32 rows
        return ((obs - self.mean) * self.scale).clamp(-CLIP, CLIP) if self.normalizes else obs

    def env_actions(self, action: Tensor) -> Tensor:
        """The policy's actions within the bounds, each in the env's own shape, counted from the env's start."""
        if self.clips:
            action = torch.maximum(torch.minimum(action, self.high), self.low)
        if self.offsets:
            action = action + self.start
        return action.reshape([action.shape[0], *self.action_shape])


class GreedyMultiInputPolicy(GreedyPolicy):
    """A Dict observation with images, one input per key in the Dict's order: uint8 images as the env gives
    them, vector keys as float32 rows (choices one-hot, as gymnasium flattens them)."""

    def __init__(
        self,
        policy: nn.Module,
        normalizer: ObservationNormalizer,
        layout: MultiInputLayout,
        space: gym.Space,
        env_actions: EnvActions | None = None,
    ) -> None:
        super().__init__(policy, normalizer, True, space, env_actions)  # its observations are not normalized
        self.layout = layout

    def forward(self, *keys: Tensor) -> Tensor:  # type: ignore[override]
        return self.env_actions(self.policy.greedy_action(self.policy_inputs(*keys)))

    def policy_inputs(self, *keys: Tensor) -> list[Tensor]:  # type: ignore[override]
        return list(keys)  # the encoder takes the keys themselves as well as packed rows

    @property
    def input_names(self) -> list[str]:
        return [key.name for key in self.layout.keys]  # one per key


class GreedyRecurrentPolicy(nn.Module):
    """One step of a recurrent policy: the observations (as `observations` takes them), the LSTM's `state` and
    `episode_start` in; the greedy actions and the next state out."""

    def __init__(self, observations: GreedyPolicy) -> None:
        super().__init__()
        self.observations = observations

    @property
    def input_names(self) -> list[str]:
        return [*self.observations.input_names, "state", "episode_start"]

    @property
    def output_names(self) -> list[str]:
        return ["action", "next_state"]

    def forward(self, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        *obs, state, episode_start = inputs
        policy_inputs = self.observations.policy_inputs(*obs)
        action, next_state = self.observations.policy.greedy_action(policy_inputs, state, episode_start)
        return self.observations.env_actions(action), next_state


Exported = GreedyPolicy | GreedyRecurrentPolicy
STATES = ("state", "next_state")  # [2 (h, c), layers, batch, hidden]: their batch is axis 2


def greedy_policy(agent: Agent) -> tuple[Exported, tuple[Tensor, ...]]:
    """The agent's policy as a module in float32 (a recurrent one as one step of it), and an example batch of
    its inputs."""
    module, example = feed_forward_policy(agent)
    if not agent.recurrent:
        return module, example
    rows = example[0].shape[0]
    state = torch.rand_like(agent.policy.initial_memory(rows, torch.device("cpu")))  # any state traces the same
    episode_start = torch.arange(rows) == 0  # a row that zeroes its state and one that keeps it
    return GreedyRecurrentPolicy(module).eval(), (*example, state, episode_start)


def feed_forward_policy(agent: Agent) -> tuple[GreedyPolicy, tuple[Tensor, ...]]:
    """The agent's observations in and actions out, as a `GreedyPolicy` in float32, and an example batch."""
    space = agent.observation_space
    layout = packed_layout(space)
    module: GreedyPolicy
    if layout is not None:
        module = GreedyMultiInputPolicy(agent.policy, agent.normalizer, layout, agent.action_space, agent.env_actions)
        return module.eval().requires_grad_(False), tuple(layout.example_inputs(2))
    pixels = is_image_space(space)
    module = GreedyPolicy(agent.policy, agent.normalizer, pixels, agent.action_space, agent.env_actions)
    module = module.eval().requires_grad_(False)
    example = torch.as_tensor(space.sample()).unsqueeze(0).repeat(2, *[1] * len(space.shape or ()))
    return module, (example if pixels else example.float(),)


def check_output_path(out: str) -> None:
    """Raise `UsageError` where `out` cannot be a file written: a folder, below a file, or where its nearest folder
    refuses this user; nothing is made."""
    path = Path(out)
    if path.is_dir():
        raise UsageError("--out", f"{out} is a folder; give the file to write, such as {path / 'policy.pt'}")
    ancestor = next(folder for folder in path.parents if folder.exists())
    if not ancestor.is_dir():
        raise UsageError("--out", f"cannot write {out}: {ancestor} is a file, not a folder")
    if not os.access(path if path.exists() else ancestor, os.W_OK):
        raise UsageError("--out", f"cannot write {out}: {os.strerror(errno.EACCES)}")


def check_output_file(out: str) -> None:
    """Make the folders of `out` and check that a file can be written there, or raise `UsageError`."""
    check_output_path(out)
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as error:  # no permission, a read-only disk
        raise UsageError("--out", f"cannot write {out}: {error.strerror or error}") from None


def export(module: Exported, example: tuple[Tensor, ...], out: str, format: ExportFormat) -> None:
    check_output_file(out)
    with refused_writes(lambda reason: UsageError("--out", f"cannot write {out}: {reason}")):
        try:
            write(module, example, out, format)
        except BaseException:
            Path(out).unlink(missing_ok=True)  # a file cut short would load as a broken policy
            raise


def write(module: Exported, example: tuple[Tensor, ...], out: str, format: ExportFormat) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notes on TorchScript and on tracing
        if format == "torchscript":
            traced = torch.jit.trace(module, example)
            with open(out, "wb") as file:  # a Python file, whose failed write says why (torch's own does not)
                torch.jit.save(traced, file)
            return
        try:
            import onnx  # noqa: F401
        except ImportError:
            raise UsageError("--format", "onnx needs the export extra: pip install -e '.[export]'") from None
        names = [*module.input_names, *module.output_names]
        torch.onnx.export(
            module,
            example,
            out,
            input_names=module.input_names,
            output_names=module.output_names,
            dynamic_axes={name: {2 if name in STATES else 0: "batch"} for name in names},
            dynamo=False,
        )


def main(argv: list[str]) -> None:
    try:
        cfg = parse_dataclass(ExportConfig, argv)
    except UsageError as error:
        raise misspelled_option(error, flag_spellings(ExportConfig)) or error from None
    cfg.out = home_expanded(cfg.out)  # --out=~/policy.onnx, which no shell expands
    check_output_path(cfg.out)  # before the agent is loaded: a slip of --out is its one line
    agent = agent_from_file(cfg.checkpoint, "cpu", None, flag="CHECKPOINT")
    module, example = greedy_policy(agent)
    export(module, example, cfg.out, cfg.chosen_format)
    takes = inputs_text(module, agent)
    print(f"{cfg.out}: the greedy policy of {agent.env_id} ({cfg.chosen_format}); it takes {takes}")


def inputs_text(module: Exported, agent: Agent) -> str:
    if isinstance(module, GreedyRecurrentPolicy):
        lstm = module.observations.policy.lstm
        state = f"state (float32 [2, {lstm.num_layers}, batch, {lstm.hidden_size}], zeros to begin)"
        starts = "episode_start (bool [batch])"
        return f"{inputs_text(module.observations, agent)}, {state} and {starts}; it returns next_state too"
    if isinstance(module, GreedyMultiInputPolicy):
        keys = ", ".join(key_text(key) for key in module.layout.keys)
        return f"one batch per key: {keys}"
    sides = ", ".join(str(side) for side in agent.observation_space.shape or ())
    if module.pixels:
        return f"a batch of uint8 images [batch, {sides}]{image_wrappers_text(agent.preprocessing)}"
    text = f"a batch of float32 vectors [batch, {sides}]"
    own_space = agent.env_observation_space
    if own_space is not None and not isinstance(own_space, gym.spaces.Box):  # a Box of several axes is reshaped
        text += f" (the env's {type(own_space).__name__} observations, each as gymnasium.spaces.flatten gives it)"
    if agent.preprocessing.time_feature:
        text += " (each with the elapsed fraction of the time limit last, as TimeAwareObservation(normalize_time=True))"
    return text


def image_wrappers_text(preprocessing: Preprocessing) -> str:
    """How the run prepared the env's frames, where it changed them, as the export's line says it."""
    steps = ["grayscale"] if preprocessing.grayscale else []
    if preprocessing.resize:
        steps.append(f"resized to {preprocessing.resize}x{preprocessing.resize}")
    if preprocessing.frame_stack > 1:
        steps.append(f"stacked by {preprocessing.frame_stack}")
    if not steps:
        return ""
    return f" (the env's frames {', '.join(steps)}, as rl.load_agent(CHECKPOINT).make_env() gives them)"


def key_text(key: KeyInput) -> str:
    sides = ", ".join(str(side) for side in key.shape)
    return f"{key.name} ({key.dtype_name} [batch, {sides}])"


if __name__ == "__main__":
    with exit_on_ctrl_c(), exit_on_usage_error():
        main(sys.argv[1:])
