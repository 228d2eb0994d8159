"""SAC's networks: a tanh-squashed Gaussian actor and twin critics evaluated as one batched ensemble."""

from __future__ import annotations

import math
from collections.abc import Callable

import gymnasium as gym
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rl.compiling import CompileMode, compiled
from rl.cuda_graphs import captured_function
from rl.precision import FLOAT32, Precision

HIDDEN_SIZE = 256
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # Stable-Baselines3's clamp of the actor's log-std
SDE_MEAN_CLIP = 2.0  # with gSDE, SB3 clips the mean before the squash, so the perturbation keeps tanh unsaturated
SDE_VARIANCE_FLOOR = 1e-6
Hidden = int | tuple[int, int]  # units of the two hidden layers (one number: both)


def _layer_sizes(hidden: Hidden) -> tuple[int, int]:
    return (hidden, hidden) if isinstance(hidden, int) else (int(hidden[0]), int(hidden[1]))


NUM_CRITICS = 2
LOG_2 = math.log(2.0)


def _linear(layer: nn.Linear, x: Tensor) -> Tensor:
    # The functional op skips nn.Module's per-call hook machinery, a visible cost at batch 1 when acting.
    return F.linear(x, layer.weight, layer.bias)


def squash(pre_tanh: Tensor, noise_logprob: Tensor, scale: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """Squash a Gaussian sample into [bias - scale, bias + scale]; returns (action, log-prob).

    The log-prob subtracts log|d action / d pre_tanh| = log(scale) + log(1 - tanh^2), written as
    2 (log 2 - u - softplus(-2u)), which stays finite where tanh saturates.
    """
    log_det = (scale.log() + 2.0 * (LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(-1)
    return torch.tanh(pre_tanh) * scale + bias, noise_logprob - log_det


class SquashedGaussianActor(nn.Module):
    """obs -> 256 -> 256 -> (mean, log-std) of a Gaussian whose sample is tanh-squashed into the action bounds.

    `forward(obs, noise)` is the reparameterized training call; acting and evaluation use `act`
    and `greedy_action`. With an `encoder` (images), obs -> encoder -> features -> 256 ...;
    the encoder is the critics' too, and trained by their loss alone: the actor's loss starts
    from detached features (`from_features`), as SAC-AE and DrQ train pixel SAC.

    `state_dependent` explores with gSDE, as Stable-Baselines3's SAC does: the log-std is a
    (hidden x actions) parameter, the perturbation before the squash is `hidden @ (std * noise)`
    for a standard-normal noise matrix (one per env when acting, one per gradient step when
    training), and the mean is clipped to +-2.
    """

    acting: Callable[..., tuple[Tensor, ...]] | None = None  # `forward` compiled, or captured as a CUDA graph
    recurrent = False

    def __init__(
        self,
        obs_dim: int,
        action_space: gym.spaces.Box,
        hidden: Hidden = HIDDEN_SIZE,
        encoder: nn.Module | None = None,
        precision: Precision = FLOAT32,
        state_dependent: bool = False,
        log_std_init: float = -3.0,
    ) -> None:
        super().__init__()
        action_dim = int(action_space.shape[0])
        first, second = _layer_sizes(hidden)
        self.precision = precision
        self.encoder = encoder
        self.state_dependent = state_dependent
        self.hidden1 = nn.Linear(getattr(encoder, "features", obs_dim), first)
        self.hidden2 = nn.Linear(first, second)
        self.mean = nn.Linear(second, action_dim)
        self.log_std: nn.Linear | nn.Parameter
        if state_dependent:  # gSDE: SB3's log_std_init (-3 for SAC) for every entry of the noise's std matrix
            self.log_std = nn.Parameter(torch.full((second, action_dim), log_std_init))
        else:
            self.log_std = nn.Linear(second, action_dim)
        precision.convert_trunk(encoder, self.hidden1, self.hidden2)
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        # Buffers move with the module; the runtimes do not broadcast buffers, these never change.
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    @property
    def action_dim(self) -> int:
        return self.mean.out_features

    @property
    def feature_dim(self) -> int:
        """What the critics see of an observation: the encoder's features, or the observation itself."""
        return self.hidden1.in_features

    def encode(self, obs: Tensor) -> Tensor:
        return obs if self.encoder is None else self.precision.trunk(self.encoder, obs)

    def compile_acting(self, mode: CompileMode) -> None:
        """Compile the forward that acting takes (a fixed batch of one row per env); evaluation stays eager."""
        self.acting = compiled(self.forward, mode)

    def capture_acting(self) -> None:
        """Act through a CUDA graph of the (compiled) forward, one per batch size (`--cuda-graphs` on a GPU)."""
        self.acting = captured_function(self.acting or self.forward)

    def head_parameters(self) -> list[nn.Parameter]:
        """The actor's own parameters: all but the encoder's, which the critics' loss trains."""
        encoder = set() if self.encoder is None else set(self.encoder.parameters())
        return [parameter for parameter in self.parameters() if parameter not in encoder]

    def distribution(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and log-std of the Gaussian before the squash (without gSDE)."""
        hidden = self.precision.trunk(self._hidden, features)
        assert isinstance(self.log_std, nn.Linear)
        log_std = _linear(self.log_std, hidden).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return _linear(self.mean, hidden), log_std

    def _sde_mean(self, hidden: Tensor) -> Tensor:
        return _linear(self.mean, hidden).clamp(-SDE_MEAN_CLIP, SDE_MEAN_CLIP)

    def _hidden(self, features: Tensor) -> Tensor:
        features = features.to(self.hidden1.weight.dtype)  # bf16 weights (bf16-true) take bf16 inputs
        return torch.relu(_linear(self.hidden2, torch.relu(_linear(self.hidden1, features))))

    def forward(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """A reparameterized action for standard-normal `noise`, and its log-prob."""
        return self.from_features(self.encode(obs), noise)

    def from_features(self, features: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        if self.state_dependent:
            return self._state_dependent_sample(features, noise)
        mean, log_std = self.distribution(features)
        pre_tanh = mean + log_std.exp() * noise
        noise_logprob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return squash(pre_tanh, noise_logprob, self.action_scale, self.action_bias)

    def _state_dependent_sample(self, features: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """gSDE's reparameterized sample for a noise matrix [hidden, actions] (the whole batch's) or one per row
        [rows, hidden, actions]; its Gaussian has the variance hidden^2 @ std^2, through which the features learn."""
        hidden = self.precision.trunk(self._hidden, features)
        assert isinstance(self.log_std, nn.Parameter)
        std = self.log_std.exp()
        weights = std * noise
        perturbation = (hidden.unsqueeze(-2) @ weights).squeeze(-2)  # a shared matrix broadcasts over the rows
        scale = (hidden.pow(2) @ std.pow(2) + SDE_VARIANCE_FLOOR).sqrt()
        z = perturbation / scale
        noise_logprob = (-0.5 * z.pow(2) - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
        return squash(self._sde_mean(hidden) + perturbation, noise_logprob, self.action_scale, self.action_bias)

    def noise(self, rows: int, generator: torch.Generator | None) -> Tensor:
        """Standard-normal noise for `rows` reparameterized samples: with gSDE, one noise matrix that they share."""
        shape = tuple(self.log_std.shape) if self.state_dependent else (rows, self.action_dim)
        return torch.randn(shape, generator=generator, device=self.action_scale.device, dtype=torch.float32)

    @torch.no_grad()
    def exploration_matrices(self, rows: int, generator: torch.Generator | None) -> Tensor | None:
        """gSDE's standard-normal noise matrices for `rows` envs (`act` scales them by the std); None without gSDE."""
        if not self.state_dependent:
            return None
        shape = (rows, *self.log_std.shape)
        return torch.randn(shape, generator=generator, device=self.action_scale.device, dtype=torch.float32)

    @torch.no_grad()
    def act(
        self, obs: Tensor, generator: torch.Generator | None, exploration: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Sampled actions within the bounds (through gSDE's `exploration` matrices, with --use-sde), and their
        log-probs."""
        noise = self.noise(obs.shape[0], generator) if exploration is None else exploration
        return (self.acting or self.forward)(obs, noise)

    @torch.no_grad()
    def greedy_action(self, obs: Tensor) -> Tensor:
        features = self.encode(obs)
        if self.state_dependent:
            mean = self._sde_mean(self.precision.trunk(self._hidden, features))
        else:
            mean, _ = self.distribution(features)
        return torch.tanh(mean) * self.action_scale + self.action_bias


def _uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    """nn.Linear's default initialization: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class CriticEnsemble(nn.Module):
    """`members` Q-networks (obs, action) -> 256 -> 256 -> 1, stacked so each layer is one batched matmul.

    Two critics as one module cost one kernel per layer instead of two.
    """

    def __init__(
        self,
        feature_dim: int,
        action_dim: int,
        hidden: Hidden = HIDDEN_SIZE,
        members: int = NUM_CRITICS,
        precision: Precision = FLOAT32,
    ) -> None:
        super().__init__()
        inputs = feature_dim + action_dim
        first, second = _layer_sizes(hidden)
        self.precision = precision
        self.w1, self.b1 = _uniform((members, inputs, first), inputs), _uniform((members, 1, first), inputs)
        self.w2, self.b2 = _uniform((members, first, second), first), _uniform((members, 1, second), first)
        self.w3, self.b3 = _uniform((members, second, 1), second), _uniform((members, 1, 1), second)
        for trunk in (self.w1, self.b1, self.w2, self.b2):  # the hidden layers; the output layer stays float32
            trunk.data = trunk.data.to(precision.trunk_dtype)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        """Q-values of every member, shape [members, rows]; `obs` are the actor's features of the observations."""
        return self.q_values(obs, action, self.w1, self.b1, self.w2, self.b2, self.w3, self.b3)

    def q_values_of_actions(self, obs: Tensor, action: Tensor) -> Tensor:
        """Q-values through weights cut from the graph: gradients reach `action`, never the critics.

        The actor's loss uses this, so its backward never touches the critics' gradients, and
        one backward pass can serve the critics' and the actor's losses together.
        """
        weights = [p.detach() for p in (self.w1, self.b1, self.w2, self.b2, self.w3, self.b3)]
        return self.q_values(obs, action, *weights)

    def q_values(
        self, obs: Tensor, action: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, w3: Tensor, b3: Tensor
    ) -> Tensor:
        x = torch.cat([obs, action], dim=-1)
        hidden = self.precision.trunk(_hidden_layers, x, w1, b1, w2, b2)
        # The one-unit output layer as a multiply-and-sum: a batched matmul with one column is slow on CPU.
        return (hidden * w3.transpose(1, 2)).sum(-1) + b3.squeeze(-1)


def _hidden_layers(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """The critics' two hidden layers, every member at once."""
    x = x.to(w1.dtype).expand(w1.shape[0], -1, -1)  # bf16 weights (bf16-true) take bf16 inputs
    hidden = torch.relu(torch.baddbmm(b1, x, w1))
    return torch.relu(torch.baddbmm(b2, hidden, w2))
