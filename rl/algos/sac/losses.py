"""SAC's losses as pure functions: no optimizers, devices or process groups."""

from __future__ import annotations

from torch import Tensor


def soft_target(
    rewards: Tensor, terminated: Tensor, next_q: Tensor, next_logprob: Tensor, alpha: Tensor, gamma: float
) -> Tensor:
    """r + gamma * (min_i Q'_i(s', a') - alpha * log pi(a'|s')), the bootstrap cut only where the episode terminated.

    A truncated transition (a time limit) keeps its bootstrap: its `next_obs` is the true final
    observation, so the return continues past the cut.
    """
    soft_value = next_q.min(0).values - alpha * next_logprob
    return rewards + gamma * (1.0 - terminated) * soft_value


def critic_loss(q_values: Tensor, target: Tensor) -> Tensor:
    """Half the sum over critics of each critic's mean squared error (Stable-Baselines3's scale)."""
    return 0.5 * (q_values - target).pow(2).mean(-1).sum()


def actor_loss(logprob: Tensor, q_values: Tensor, alpha: Tensor) -> Tensor:
    """E[alpha * log pi(a|s) - min_i Q_i(s, a)] for reparameterized actions a."""
    return (alpha * logprob - q_values.min(0).values).mean()


def temperature_loss(log_alpha: Tensor, logprob: Tensor, target_entropy: float) -> Tensor:
    """Raises alpha while the policy's entropy is below the target, lowers it above."""
    return -(log_alpha * (logprob.detach() + target_entropy)).mean()
