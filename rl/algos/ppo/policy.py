"""Actor-critic networks and the action distributions for each supported action space.

Sampling takes an explicit `torch.Generator`, so the action randomness is a dedicated stream
that every mode seeds the same way, independent of weight init or anything else drawing numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rl.compiling import CompileMode, compiled
from rl.encoders import FlatPixels, orthogonal_init
from rl.precision import FLOAT32, Precision

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": torch.relu, "tanh": torch.tanh}
HIDDEN_SIZE = 64


def _linear(layer: nn.Linear, x: Tensor) -> Tensor:
    # Calling the functional op skips nn.Module's per-call hook machinery: these nets are tiny
    # and run once per env step, so that overhead is a large part of their cost.
    return F.linear(x, layer.weight, layer.bias)


def _race_noise(rows: int, choices: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """The Exp(1) noise of `_sample`'s draws, [rows, choices]."""
    return torch.empty((rows, choices), device=device).exponential_(1, generator=generator)


def _sample(log_probs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """One draw per row of a categorical given as log-probabilities; returns (index, log-prob).

    The exponential-race draw that `torch.multinomial(probs, 1)` makes on the CPU (argmax of the
    probabilities over Exp(1) `noise` from `_race_noise`), the same draws from the same generator,
    without the checks of its input that read the probabilities on the host: on a GPU those wait
    for the stream."""
    index = (log_probs.exp() / noise).argmax(-1, keepdim=True)
    return index.squeeze(-1), log_probs.gather(-1, index).squeeze(-1)


def _entropy(log_probs: Tensor) -> Tensor:
    return -(log_probs.exp() * log_probs).sum(-1)


class CategoricalHead(nn.Module):
    """A categorical over the actions of a Discrete space."""

    def __init__(self, hidden: int, num_actions: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, num_actions)

    def _log_probs(self, features: Tensor) -> Tensor:
        return torch.log_softmax(_linear(self.linear, features), dim=-1)

    def noise(self, rows: int, generator: torch.Generator | None) -> list[Tensor]:
        return [_race_noise(rows, self.linear.out_features, generator, self.linear.weight.device)]

    def sample(self, features: Tensor, noise: list[Tensor]) -> tuple[Tensor, Tensor]:
        return _sample(self._log_probs(features), noise[0])

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        log_probs = self._log_probs(features)
        return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), _entropy(log_probs)

    def mode(self, features: Tensor) -> Tensor:
        return self._log_probs(features).argmax(-1)


class MultiCategoricalHead(nn.Module):
    """Independent categoricals, one per component of a MultiDiscrete space."""

    def __init__(self, hidden: int, nvec: list[int]) -> None:
        super().__init__()
        self.nvec = nvec
        self.linear = nn.Linear(hidden, sum(nvec))

    def _log_probs(self, features: Tensor) -> list[Tensor]:
        logits = _linear(self.linear, features)
        return [torch.log_softmax(chunk, dim=-1) for chunk in logits.split(self.nvec, dim=-1)]

    def noise(self, rows: int, generator: torch.Generator | None) -> list[Tensor]:
        return [_race_noise(rows, n, generator, self.linear.weight.device) for n in self.nvec]

    def sample(self, features: Tensor, noise: list[Tensor]) -> tuple[Tensor, Tensor]:
        draws = [_sample(log_probs, part) for log_probs, part in zip(self._log_probs(features), noise, strict=True)]
        actions, logprobs = zip(*draws, strict=True)
        return torch.stack(actions, dim=-1), torch.stack(logprobs, dim=-1).sum(-1)

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        log_probs = self._log_probs(features)
        action = action.long()
        logprob = torch.stack([lp.gather(-1, action[..., i : i + 1]).squeeze(-1) for i, lp in enumerate(log_probs)])
        entropy = torch.stack([_entropy(lp) for lp in log_probs])
        return logprob.sum(0), entropy.sum(0)

    def mode(self, features: Tensor) -> Tensor:
        return torch.stack([lp.argmax(-1) for lp in self._log_probs(features)], dim=-1)


class BernoulliHead(nn.Module):
    """Independent Bernoullis, one per component of a MultiBinary space (a logit each)."""

    def __init__(self, hidden: int, bits: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, bits)

    def noise(self, rows: int, generator: torch.Generator | None) -> list[Tensor]:
        weight = self.linear.weight
        return [torch.rand((rows, self.linear.out_features), generator=generator, device=weight.device)]

    def sample(self, features: Tensor, noise: list[Tensor]) -> tuple[Tensor, Tensor]:
        logits = _linear(self.linear, features)
        action = (noise[0] < torch.sigmoid(logits)).long()  # a bit is 1 with its probability
        return action, self._log_prob(logits, action)

    def _log_prob(self, logits: Tensor, action: Tensor) -> Tensor:
        bits = action.to(logits.dtype)
        return -F.binary_cross_entropy_with_logits(logits, bits, reduction="none").sum(-1)

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        logits = _linear(self.linear, features)
        entropy = (F.softplus(logits) - torch.sigmoid(logits) * logits).sum(-1)
        return self._log_prob(logits, action), entropy

    def mode(self, features: Tensor) -> Tensor:
        return (_linear(self.linear, features) > 0).long()  # probability above one half


class GaussianHead(nn.Module):
    """A diagonal Gaussian with a state-independent, learned log-std."""

    def __init__(self, hidden: int, action_dim: int, log_std_init: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), log_std_init))

    def noise(self, rows: int, generator: torch.Generator | None) -> list[Tensor]:
        weight = self.linear.weight
        return [torch.randn((rows, self.linear.out_features), generator=generator, device=weight.device)]

    def sample(self, features: Tensor, noise: list[Tensor]) -> tuple[Tensor, Tensor]:
        mean = _linear(self.linear, features)
        action = mean + self.log_std.exp() * noise[0]
        return action, self._log_prob(mean, action)

    def _log_prob(self, mean: Tensor, action: Tensor) -> Tensor:
        z = (action - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        mean = _linear(self.linear, features)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(mean.shape[:-1])
        return self._log_prob(mean, action), entropy

    def mode(self, features: Tensor) -> Tensor:
        return _linear(self.linear, features)


class StateDependentGaussianHead(nn.Module):
    """Generalized state-dependent exploration (gSDE, Raffin et al. 2022), as Stable-Baselines3 defines it.

    An action is the mean plus `features @ E`, where E is a (features x actions) matrix of
    N(0, std^2) entries that stays fixed for several steps: within that span the noise is a smooth
    function of the state rather than a fresh draw per step. Its Gaussian has the variance
    `features^2 @ std^2`; the features are detached there, so only the mean's loss trains them.
    """

    VARIANCE_FLOOR = 1e-6  # SB3's epsilon under the square root

    def __init__(self, hidden: int, action_dim: int, log_std_init: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, action_dim)
        self.log_std = nn.Parameter(torch.full((hidden, action_dim), log_std_init))

    def exploration_matrices(self, rows: int, generator: torch.Generator | None) -> Tensor:
        """One noise matrix per env, [rows, features, actions]."""
        std = self.log_std.exp()
        draws = torch.randn((rows, *std.shape), generator=generator, device=std.device, dtype=std.dtype)
        return std * draws

    def _scale(self, features: Tensor) -> Tensor:
        variance = features.detach().pow(2) @ self.log_std.exp().pow(2)
        return (variance + self.VARIANCE_FLOOR).sqrt()

    def sample(self, features: Tensor, noise: list[Tensor]) -> tuple[Tensor, Tensor]:
        """`noise`: the envs' exploration matrices, alone."""
        (exploration,) = noise
        mean = _linear(self.linear, features)
        action = mean + torch.bmm(features.unsqueeze(1), exploration).squeeze(1)
        return action, _gaussian_log_prob(action, mean, self._scale(features))

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        mean, scale = _linear(self.linear, features), self._scale(features)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + scale.log()).sum(-1)
        return _gaussian_log_prob(action, mean, scale), entropy

    def mode(self, features: Tensor) -> Tensor:
        return _linear(self.linear, features)


def _gaussian_log_prob(action: Tensor, mean: Tensor, scale: Tensor) -> Tensor:
    z = (action - mean) / scale
    return (-0.5 * z.pow(2) - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


ActionHead = CategoricalHead | MultiCategoricalHead | BernoulliHead | GaussianHead | StateDependentGaussianHead


def make_action_head(
    action_space: gym.Space, hidden: int, log_std_init: float = 0.0, state_dependent: bool = False
) -> ActionHead:
    """The distribution over `action_space`; `log_std_init` is a Gaussian's initial log-std (Box actions), and
    `state_dependent` makes its exploration gSDE's."""
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalHead(hidden, int(action_space.n))
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return MultiCategoricalHead(hidden, [int(n) for n in action_space.nvec])
    if isinstance(action_space, gym.spaces.MultiBinary):
        return BernoulliHead(hidden, int(np.prod(action_space.shape)))
    if isinstance(action_space, gym.spaces.Box):
        head = StateDependentGaussianHead if state_dependent else GaussianHead
        return head(hidden, int(np.prod(action_space.shape)), log_std_init)
    raise TypeError(f"unsupported action space {action_space}")


def exploration_matrices(head: ActionHead, rows: int, generator: torch.Generator | None) -> Tensor | None:
    if isinstance(head, StateDependentGaussianHead):
        return head.exploration_matrices(rows, generator)
    return None


def action_noise(
    head: ActionHead, rows: int, generator: torch.Generator | None, exploration: Tensor | None
) -> list[Tensor]:
    """The noise a head's `sample` takes for `rows` actions: gSDE's exploration matrices, the others' fresh
    draws. Drawn before the forward pass (the same numbers as during it), so that acting is a function of
    its inputs, which a CUDA graph can replay."""
    if isinstance(head, StateDependentGaussianHead):
        if exploration is None:
            raise ValueError("gSDE acts through exploration matrices: draw them with `exploration_matrices`")
        return [exploration]
    return head.noise(rows, generator)


def action_shape_and_dtype(action_space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """How one env's action is stored in the rollout buffer."""
    if isinstance(action_space, gym.spaces.Discrete):
        return (), torch.long
    if isinstance(action_space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return tuple(action_space.shape), torch.long
    return tuple(action_space.shape), torch.float32


class MLP(nn.Module):
    """Two hidden layers of `hidden` units."""

    def __init__(self, in_features: int, activation: str, hidden: int = HIDDEN_SIZE) -> None:
        super().__init__()
        self.hidden1 = nn.Linear(in_features, hidden)
        self.hidden2 = nn.Linear(hidden, hidden)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.hidden1.weight.dtype)  # bf16 weights (bf16-true) take bf16 inputs
        return self.activation(_linear(self.hidden2, self.activation(_linear(self.hidden1, x))))


class ActorCritic(nn.Module):
    """An actor and a critic over observations.

    `forward` is the training call (log-prob, entropy and value of given actions); `act`,
    `value` and `greedy_action` are for acting and evaluation, without a graph. Subclasses say
    how observations become the actor's and the critic's features (the trunk, which runs at the
    run's precision); the heads always compute in float32.
    """

    action_head: ActionHead
    critic_head: nn.Linear
    recurrent = False
    precision = FLOAT32
    acting_features: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None  # compiled `features`, with --compile

    def trunk(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def critic_trunk(self, obs: Tensor) -> Tensor:
        raise NotImplementedError

    def features(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """The actor's and the critic's features of `obs`, as float32."""
        return self.precision.trunk(self.trunk, obs)

    def critic_features(self, obs: Tensor) -> Tensor:
        return self.precision.trunk(self.critic_trunk, obs)

    def compile_acting(self, mode: CompileMode) -> None:
        """Compile the forward that acting takes (a fixed batch of one row per env); evaluation stays eager."""
        self.acting_features = compiled(self.features, mode)

    def value(self, obs: Tensor) -> Tensor:
        return self._value(self.critic_features(obs))

    def _value(self, features: Tensor) -> Tensor:
        return _linear(self.critic_head, features).squeeze(-1)

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        actor_features, critic_features = self.features(obs)
        logprob, entropy = self.action_head.log_prob_entropy(actor_features, action)
        return logprob, entropy, self._value(critic_features)

    @torch.no_grad()
    def act(
        self, obs: Tensor, generator: torch.Generator | None, exploration: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions (through gSDE's `exploration` matrices, with --use-sde); returns (action, log-prob, value)."""
        noise = action_noise(self.action_head, obs.shape[0], generator, exploration)
        return self.act_with_noise(obs, *noise)

    def act_with_noise(self, obs: Tensor, *noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`act`, given its noise: nothing here draws a random number or waits for the GPU (`--cuda-graphs`
        captures it with the rollout's writes, `RolloutCollector`)."""
        actor_features, critic_features = (self.acting_features or self.features)(obs)
        action, logprob = self.action_head.sample(actor_features, list(noise))
        return action, logprob, self._value(critic_features)

    @torch.no_grad()
    def exploration_matrices(self, rows: int, generator: torch.Generator | None) -> Tensor | None:
        """gSDE's noise matrices for `rows` envs; None for a head without state-dependent exploration."""
        return exploration_matrices(self.action_head, rows, generator)

    @torch.no_grad()
    def greedy_action(self, obs: Tensor) -> Tensor:
        return self.action_head.mode(self.features(obs)[0])


class MLPActorCritic(ActorCritic):
    """Separate actor and critic MLPs (Lightning's example and SB3's default for vector observations).

    `pixels`: the observations are uint8 images, flattened and scaled to [0, 1] first.
    """

    def __init__(
        self,
        obs_dim: int,
        action_space: gym.Space,
        activation: str = "relu",
        ortho_init: bool = False,
        pixels: bool = False,
        precision: Precision = FLOAT32,
        hidden: int = HIDDEN_SIZE,
        log_std_init: float = 0.0,
        state_dependent: bool = False,
    ) -> None:
        super().__init__()
        self.precision = precision
        self.actor_body = MLP(obs_dim, activation, hidden)
        self.critic_body = MLP(obs_dim, activation, hidden)
        self.critic_head = nn.Linear(hidden, 1)
        self.action_head = make_action_head(action_space, hidden, log_std_init, state_dependent)
        self.flat_pixels = FlatPixels() if pixels else None
        if ortho_init:
            orthogonal_init(self.actor_body, math.sqrt(2))
            orthogonal_init(self.critic_body, math.sqrt(2))
            orthogonal_init(self.critic_head, 1.0)
            orthogonal_init(self.action_head, 0.01)
        precision.convert_trunk(self.actor_body, self.critic_body)

    def _inputs(self, obs: Tensor) -> Tensor:
        return obs if self.flat_pixels is None else self.flat_pixels(obs)

    def trunk(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        obs = self._inputs(obs)
        return self.actor_body.forward(obs), self.critic_body.forward(obs)

    def critic_trunk(self, obs: Tensor) -> Tensor:
        return self.critic_body.forward(self._inputs(obs))


class CNNActorCritic(ActorCritic):
    """One Nature-DQN CNN that the actor and the critic share, each a linear head on its 512 features
    (Mnih et al. 2016, as CleanRL's and SB3's Atari PPO): both losses train the encoder."""

    def __init__(
        self,
        encoder: nn.Module,
        action_space: gym.Space,
        ortho_init: bool = False,
        precision: Precision = FLOAT32,
        log_std_init: float = 0.0,
        state_dependent: bool = False,
    ) -> None:
        super().__init__()
        self.precision = precision
        self.encoder = encoder
        self.critic_head = nn.Linear(self.encoder.features, 1)
        self.action_head = make_action_head(action_space, self.encoder.features, log_std_init, state_dependent)
        if ortho_init:
            orthogonal_init(self.encoder, math.sqrt(2))
            orthogonal_init(self.critic_head, 1.0)
            orthogonal_init(self.action_head, 0.01)
        precision.convert_trunk(self.encoder)

    def trunk(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        shared = self.encoder(obs)
        return shared, shared

    def critic_trunk(self, obs: Tensor) -> Tensor:
        return self.encoder(obs)
