"""A recurrent actor-critic: an encoder, one LSTM that the actor and the critic share, and their heads.

Acting steps the LSTM once per env step, carrying each env's state (`memory`: h and c stacked,
[2, layers, envs, hidden]) from step to step. An observation that begins an episode (`starts`)
first zeroes its env's state, inside the step, so one env's reset leaves the others alone.

Training replays each env's whole rollout from the state the env began it with. Episode starts
cut a sequence into segments, each run from its own initial state; all segments of a minibatch go
through the LSTM at once, padded to the longest, so the time loop is the LSTM's own kernel, not a
Python loop over steps. The host keeps the starts, as the envs report them, and plans the
segments there: the device never has to report back the shapes it runs.

Those shapes still change from batch to batch, which neither a CUDA graph nor a compiled graph
can follow. With `replay_in_steps` (`--cuda-graphs`, `--compile`) training replays the sequences
step by step instead, as acting stepped them, zeroing the state where an episode starts: the same
shapes for every batch, at the cost of one LSTM step's kernels per step.

The actor and the critic share the LSTM, as the CNN is shared in the feed-forward pixel policy:
one recurrent step per env step instead of two, and the value loss shapes the memory too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl.algos.ppo.policy import HIDDEN_SIZE, MLP, action_noise, exploration_matrices, make_action_head
from rl.compiling import CompileMode, compiled
from rl.encoders import FlatPixels, orthogonal_init
from rl.precision import FLOAT32, Precision
from rl.uploads import to_device

Memory = Tensor  # [2 (h, c), layers, envs, hidden]


def initial_memory(layers: int, num_envs: int, hidden: int, device: torch.device) -> Memory:
    return torch.zeros(2, layers, num_envs, hidden, device=device)


class RecurrentActorCritic(nn.Module):
    """obs -> encoder (an MLP, or the Nature CNN for images) -> LSTM -> actor and critic heads.

    The encoder runs at the run's precision; the LSTM and the heads compute in float32, since the
    recurrence carries rounding errors from step to step.
    """

    recurrent = True

    def __init__(
        self,
        obs_dim: int,
        action_space: gym.Space,
        cnn: nn.Module | None,
        pixels: bool,
        lstm_hidden: int,
        lstm_layers: int,
        activation: str = "relu",
        ortho_init: bool = False,
        precision: Precision = FLOAT32,
        hidden: int = HIDDEN_SIZE,
        log_std_init: float = 0.0,
        state_dependent: bool = False,
        replay_in_steps: bool = False,
    ) -> None:
        super().__init__()
        self.precision = precision
        self.replay_in_steps = replay_in_steps
        self.acting_step: Callable[[Tensor, Memory, Tensor], tuple[Tensor, Memory]] | None = None  # --compile
        if cnn is not None:  # image observations: their CNN encoder
            self.encoder: nn.Module = cnn
            features = cnn.features
        else:
            self.encoder = nn.Sequential(*([FlatPixels()] if pixels else []), MLP(obs_dim, activation, hidden))
            features = hidden
        self.lstm = nn.LSTM(features, lstm_hidden, lstm_layers)
        # Each layer's weights as the LSTM holds them (the same parameters, not registered again), for stepping
        # it cell by cell: torch.compile traces these, where it stops at the LSTM module itself.
        self.cell_weights = [
            [getattr(self.lstm, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            for layer in range(lstm_layers)
        ]
        self.critic_head = nn.Linear(lstm_hidden, 1)
        self.action_head = make_action_head(action_space, lstm_hidden, log_std_init, state_dependent)
        if ortho_init:
            orthogonal_init(self.encoder, math.sqrt(2))
            orthogonal_init(self.critic_head, 1.0)
            orthogonal_init(self.action_head, 0.01)
            for name, weight in self.lstm.named_parameters():
                (nn.init.orthogonal_ if name.startswith("weight") else nn.init.zeros_)(weight)
        precision.convert_trunk(self.encoder)

    def initial_memory(self, num_envs: int, device: torch.device) -> Memory:
        return initial_memory(self.lstm.num_layers, num_envs, self.lstm.hidden_size, device)

    def encode(self, obs: Tensor) -> Tensor:
        return self.precision.trunk(self.encoder, obs)

    def compile_acting(self, mode: CompileMode) -> None:
        """Compile the step that acting takes (a fixed batch of one row per env); evaluation stays eager."""
        self.acting_step = compiled(self._step, mode)

    def _step(self, obs: Tensor, memory: Memory, starts: Tensor) -> tuple[Tensor, Memory]:
        """One LSTM step for a batch of envs: their features after `obs`, and their next state."""
        return self._recur(self.encode(obs), memory, starts)

    def _recur(self, features: Tensor, memory: Memory, starts: Tensor) -> tuple[Tensor, Memory]:
        """One LSTM step from encoded `features`, the state zeroed first where `starts`."""
        keep = (~starts).to(memory.dtype).view(1, 1, -1, 1)
        hidden, cell = (list(part.unbind(0)) for part in (memory * keep).unbind(0))
        features = self._cells(features, hidden, cell)
        return features, torch.stack([*hidden, *cell]).unflatten(0, (2, -1))

    def _cells(self, features: Tensor, hidden: list[Tensor], cell: list[Tensor]) -> Tensor:
        """One step through each layer's cell: the last layer's output; `hidden` and `cell` (a state per layer)
        advance in place.

        Through `torch.lstm_cell` with the LSTM's own weights: for one step it costs half of what a call of
        the whole module does (134 against 298 us for 4 envs here).
        """
        for layer, weights in enumerate(self.cell_weights):
            features, cell[layer] = torch.lstm_cell(features, (hidden[layer], cell[layer]), *weights)
            hidden[layer] = features
        return features

    def _value(self, features: Tensor) -> Tensor:
        return self.critic_head(features).squeeze(-1)

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        generator: torch.Generator | None,
        memory: Memory,
        starts: Tensor,
        exploration: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Memory]:
        """Sample actions (through gSDE's `exploration` matrices, with --use-sde); returns (action, log-prob,
        value, next memory)."""
        noise = action_noise(self.action_head, obs.shape[0], generator, exploration)
        return self.act_with_noise(obs, memory, starts, *noise)

    def act_with_noise(
        self, obs: Tensor, memory: Memory, starts: Tensor, *noise: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Memory]:
        """`act`, given its noise: nothing here draws a random number or waits for the GPU (`--cuda-graphs`
        captures it with the rollout's writes, `RolloutCollector`)."""
        features, memory = (self.acting_step or self._step)(obs, memory, starts)
        action, logprob = self.action_head.sample(features, list(noise))
        return action, logprob, self._value(features), memory

    @torch.no_grad()
    def exploration_matrices(self, rows: int, generator: torch.Generator | None) -> Tensor | None:
        return exploration_matrices(self.action_head, rows, generator)

    @torch.no_grad()
    def value(self, obs: Tensor, memory: Memory, starts: Tensor) -> Tensor:
        """V(obs) with the state carried to it (the state itself does not advance)."""
        return self._value(self._step(obs, memory, starts)[0])

    @torch.no_grad()
    def greedy_action(self, obs: Tensor, memory: Memory, starts: Tensor) -> tuple[Tensor, Memory]:
        features, memory = self._step(obs, memory, starts)
        return self.action_head.mode(features), memory

    def forward(self, obs: Tensor, actions: Tensor, starts: Tensor, memory: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Replay whole sequences: obs [B, T, ...], actions [B, T, ...], starts [B, T], memory [B, 2, layers,
        hidden] (each sequence's state before its first step); log-probs, entropies and values, [B * T]."""
        batch, steps = starts.shape
        features = self.encode(obs.reshape(batch * steps, *obs.shape[2:])).view(batch, steps, -1)
        replay = self.replay_stepwise if self.replay_in_steps else functools.partial(replay_lstm, self.lstm)
        features = replay(features, starts, memory.permute(1, 2, 0, 3))
        logprob, entropy = self.action_head.log_prob_entropy(
            features, actions.reshape(batch * steps, *actions.shape[2:])
        )
        return logprob, entropy, self._value(features)

    def replay_stepwise(self, features: Tensor, starts: Tensor, memory: Memory) -> Tensor:
        """What `replay_lstm` returns, stepped as acting stepped it, so that every shape is fixed by the
        minibatch's size (`starts` on the features' device; nothing is planned)."""
        keep = (~starts).to(memory.dtype).unsqueeze(-1)  # [B, T, 1]
        hidden, cell = (list(part.unbind(0)) for part in memory.unbind(0))
        outputs = []
        for step in range(starts.shape[1]):
            hidden = [state * keep[:, step] for state in hidden]
            cell = [state * keep[:, step] for state in cell]
            outputs.append(self._cells(features[:, step], hidden, cell))
        return torch.stack(outputs, dim=1).flatten(0, 1)


def replay_lstm(lstm: nn.LSTM, features: Tensor, starts: Tensor, memory: Memory) -> Tensor:
    """`lstm` over [B, T, F] sequences whose state zeroes where `starts`, from `memory` [2, layers, B, hidden]:
    its outputs, [B * T, hidden], as stepping it one step at a time would give them.

    Each sequence is cut at its episode starts into segments; segments that begin a sequence start
    from its saved state (zero where that step starts an episode), the others from zeros. The
    segments run as one batch, padded at their ends to the longest. `starts` [B, T] are on the
    host, which plans the segments: their number and length set the LSTM's shapes, which a plan
    made on the device would have to read back, making the host wait for the GPU.
    """
    batch, steps = starts.shape
    plan = SegmentPlan(starts.cpu().numpy(), features.device)
    padded = features.reshape(batch * steps, -1).index_select(0, plan.padded_rows)
    initial = memory[:, :, plan.sequence] * plan.carries.to(memory.dtype).view(1, 1, -1, 1)
    hidden, cell = initial.unbind(0)
    # Padding only trails each segment, so it never reaches a real step's output: the dense kernel
    # can run over it. (Packing would skip it, but on CPU its per-step slices make backward
    # allocate and zero the whole batch at every step: 6x slower here.)
    output, _ = lstm(padded.view(plan.longest, plan.segments, -1), (hidden.contiguous(), cell.contiguous()))
    return output.reshape(plan.longest * plan.segments, -1).index_select(0, plan.output_rows)


class SegmentPlan:
    """Where a minibatch's sequences split at their episode starts, planned on the host from `starts` [B, T].

    `padded_rows`: for each padded step (time-major: [longest, segments]), the row of [B * T] it
    takes (padding repeats row 0); `output_rows`: for each row of [B * T], its padded step;
    `sequence` and `carries`: each segment's sequence, and whether it begins that sequence mid-episode
    (so it starts from the sequence's saved state). All four reach the device in one copy.
    """

    def __init__(self, starts: np.ndarray, device: torch.device) -> None:
        batch, steps = starts.shape
        boundaries = starts.copy()
        boundaries[:, 0] = True
        first = np.flatnonzero(boundaries)  # each segment's first row, in [B * T] order
        lengths = np.diff(first, append=batch * steps)
        self.segments, self.longest = len(first), int(lengths.max())
        offsets = np.arange(self.longest)
        valid = offsets[:, None] < lengths[None, :]  # [longest, segments]
        padded_rows = np.where(valid, first[None, :] + offsets[:, None], 0)
        output_rows = np.empty(batch * steps, dtype=np.int64)
        output_rows[padded_rows[valid]] = np.flatnonzero(valid)  # both in the padded steps' order
        carries = (first % steps == 0) & ~starts.reshape(-1)[first]
        parts = [padded_rows.reshape(-1), output_rows, first // steps, carries]
        on_device = to_device(np.concatenate(parts, dtype=np.int64), device)
        self.padded_rows, self.output_rows, self.sequence, self.carries = on_device.split([len(p) for p in parts])
