"""Actor-critic networks and the action distributions for each supported action space.

Sampling takes an explicit `torch.Generator`, so the action randomness is a dedicated stream
that every mode seeds the same way, independent of weight init or anything else drawing numbers.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
HIDDEN_SIZE = 64


class CategoricalHead(nn.Module):
    """Independent categoricals, one per component; a Discrete space is the one-component case."""

    def __init__(self, hidden: int, nvec: list[int], squeeze: bool) -> None:
        super().__init__()
        self.nvec = nvec
        self.squeeze = squeeze  # Discrete actions are scalars, MultiDiscrete ones are vectors
        self.linear = nn.Linear(hidden, sum(nvec))

    def _log_probs(self, features: Tensor) -> list[Tensor]:
        logits = self.linear(features)
        return [torch.log_softmax(chunk, dim=-1) for chunk in logits.split(self.nvec, dim=-1)]

    def _as_components(self, action: Tensor) -> Tensor:
        return action.unsqueeze(-1) if self.squeeze else action

    def _from_components(self, components: Tensor) -> Tensor:
        return components.squeeze(-1) if self.squeeze else components

    def sample(self, features: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        log_probs = self._log_probs(features)
        samples = [torch.multinomial(lp.exp(), 1, generator=generator) for lp in log_probs]
        logprob = sum(lp.gather(-1, s) for lp, s in zip(log_probs, samples, strict=True)).squeeze(-1)
        return self._from_components(torch.cat(samples, dim=-1)), logprob

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        log_probs = self._log_probs(features)
        components = self._as_components(action).long()
        logprob = sum(lp.gather(-1, components[..., i : i + 1]) for i, lp in enumerate(log_probs)).squeeze(-1)
        entropy = sum(-(lp.exp() * lp).sum(-1) for lp in log_probs)
        return logprob, entropy

    def mode(self, features: Tensor) -> Tensor:
        modes = [lp.argmax(-1, keepdim=True) for lp in self._log_probs(features)]
        return self._from_components(torch.cat(modes, dim=-1))


class GaussianHead(nn.Module):
    """A diagonal Gaussian with a state-independent, learned log-std."""

    def __init__(self, hidden: int, action_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, action_dim)
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def sample(self, features: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        mean = self.linear(features)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        action = mean + self.log_std.exp() * noise
        return action, self._log_prob(mean, action)

    def _log_prob(self, mean: Tensor, action: Tensor) -> Tensor:
        z = (action - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def log_prob_entropy(self, features: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.linear(features)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(mean.shape[:-1])
        return self._log_prob(mean, action), entropy

    def mode(self, features: Tensor) -> Tensor:
        return self.linear(features)


def make_action_head(action_space: gym.Space, hidden: int) -> CategoricalHead | GaussianHead:
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalHead(hidden, [int(action_space.n)], squeeze=True)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return CategoricalHead(hidden, [int(n) for n in action_space.nvec], squeeze=False)
    if isinstance(action_space, gym.spaces.Box):
        return GaussianHead(hidden, int(np.prod(action_space.shape)))
    raise TypeError(f"unsupported action space {action_space}")


def action_shape_and_dtype(action_space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """How one env's action is stored in the rollout buffer."""
    if isinstance(action_space, gym.spaces.Discrete):
        return (), torch.long
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return tuple(action_space.shape), torch.long
    return tuple(action_space.shape), torch.float32


def _mlp(in_features: int, activation: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_features, HIDDEN_SIZE), activation(), nn.Linear(HIDDEN_SIZE, HIDDEN_SIZE), activation()
    )


def _orthogonal_init(module: nn.Module, gain: float) -> None:
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs.

    `forward` is the training call (log-prob, entropy and value of given actions): it is the
    only method a DDP- or Fabric-wrapped module may be called with. Acting uses the plain
    module, whose parameters are the same tensors.
    """

    def __init__(self, obs_dim: int, action_space: gym.Space, activation: str = "relu", ortho_init: bool = False):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.actor_body = _mlp(obs_dim, act)
        self.critic_body = _mlp(obs_dim, act)
        self.critic_head = nn.Linear(HIDDEN_SIZE, 1)
        self.action_head = make_action_head(action_space, HIDDEN_SIZE)
        if ortho_init:
            _orthogonal_init(self.actor_body, math.sqrt(2))
            _orthogonal_init(self.critic_body, math.sqrt(2))
            _orthogonal_init(self.critic_head, 1.0)
            _orthogonal_init(self.action_head, 0.01)

    def value(self, obs: Tensor) -> Tensor:
        return self.critic_head(self.critic_body(obs)).squeeze(-1)

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logprob, entropy = self.action_head.log_prob_entropy(self.actor_body(obs), action)
        return logprob, entropy, self.value(obs)

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions; returns (action, log-prob, value)."""
        action, logprob = self.action_head.sample(self.actor_body(obs), generator)
        return action, logprob, self.value(obs)

    @torch.no_grad()
    def greedy_action(self, obs: Tensor) -> Tensor:
        return self.action_head.mode(self.actor_body(obs))
