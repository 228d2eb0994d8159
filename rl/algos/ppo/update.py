"""PPO losses (pure functions), the minibatch schedule and the update step shared by every mode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import BatchSampler, DistributedSampler

from rl.algos.ppo.rollout import Batch


def mean(values: Tensor, mask: Tensor | None = None) -> Tensor:
    """The mean over all rows, or over the rows where `mask` is True."""
    if mask is None:
        return values.mean()
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def policy_loss(
    new_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, clip_coef: float, mask: Tensor | None = None
) -> Tensor:
    """The clipped surrogate objective, negated for minimization."""
    ratio = (new_logprobs - old_logprobs).exp()
    unclipped = advantages * ratio
    clipped = advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    return -mean(torch.min(unclipped, clipped), mask)


def value_loss(
    new_values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    clip_coef: float,
    clip_vloss: bool,
    mask: Tensor | None = None,
) -> Tensor:
    """Half the squared error; with `clip_vloss`, the worse of the clipped and unclipped errors."""
    unclipped = (new_values - returns).pow(2)
    if not clip_vloss:
        return 0.5 * mean(unclipped, mask)
    clipped_values = old_values + (new_values - old_values).clamp(-clip_coef, clip_coef)
    clipped = (clipped_values - returns).pow(2)
    return 0.5 * mean(torch.max(unclipped, clipped), mask)


def entropy_loss(entropy: Tensor, mask: Tensor | None = None) -> Tensor:
    return -mean(entropy, mask)


def approximate_kl(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """The low-variance estimator of KL(old || new) from Schulman's note on KL estimators."""
    log_ratio = new_logprobs - old_logprobs
    return mean((log_ratio.exp() - 1) - log_ratio, mask)


def normalize(advantages: Tensor, mask: Tensor | None = None) -> Tensor:
    """Zero mean and unit (sample) std over the rows `mask` keeps (all rows without one).

    With a mask, masked sums rather than a boolean index: the kept rows' count is never read on the
    host, so a GPU does not wait for it (and the step can be captured)."""
    if mask is not None:
        kept = mask.sum()
        center = mean(advantages, mask)
        variance = torch.where(mask, (advantages - center).pow(2), 0.0).sum() / (kept - 1).clamp(min=1)
        scale = torch.where(kept >= 2, variance.sqrt() + 1e-8, 1.0)
        return (advantages - center) / scale
    if advantages.numel() < 2:
        return advantages - advantages.mean()
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


@dataclass(frozen=True)
class PPOHyperparameters:
    clip_coef: float
    clip_vloss: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    update_epochs: int
    minibatch_size: int
    normalize_advantages: bool
    skip_reset_steps: bool = False  # NEXT_STEP envs: leave the reset steps out of every loss
    target_kl: float | None = None  # stop the update at a minibatch whose approximate KL passes 1.5 x this

    @property
    def kl_limit(self) -> float | None:
        """Stable-Baselines3's rule: the epochs stop at the first minibatch whose KL passes 1.5 x the target."""
        return None if self.target_kl is None else 1.5 * self.target_kl


UPDATE_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
# Where --target-kl stopped an update, 1-based; left out of the statistics of an update that ran its course.
KL_STOP_STATS = ("kl_stop_epoch", "kl_stop_minibatch")


class MinibatchSchedule:
    """Which rows each minibatch takes, the same way on every rank and in every mode.

    A `DistributedSampler` shuffles with its own generator seeded by (seed, epoch): all ranks
    draw the same permutation and keep their own shard of it. With `num_shards=1` it is a
    plain seeded shuffle of local data.
    """

    def __init__(
        self,
        num_rows: int,
        minibatch_size: int,
        num_shards: int,
        shard: int,
        seed: int,
        num_minibatches: int | None = None,
    ) -> None:
        self.sampler = DistributedSampler(range(num_rows), num_replicas=num_shards, rank=shard, shuffle=True, seed=seed)
        self.batches = BatchSampler(self.sampler, minibatch_size, drop_last=False)
        # A fixed count splits the shuffled rows into that many near-equal minibatches instead:
        # trainers whose shards differ in size still take the same number of averaged steps.
        self.num_minibatches = num_minibatches
        self.epoch = 0

    def next_epoch(self) -> list[list[int]]:
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        if self.num_minibatches is None:
            return list(self.batches)
        return [chunk.tolist() for chunk in np.array_split(list(self.sampler), self.num_minibatches)]


def minibatch_loss(
    model: nn.Module, minibatch: Batch, hp: PPOHyperparameters
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The loss of one minibatch, and its parts: (loss, policy loss, value loss, entropy loss, new log-probs).

    The model scores every step of the minibatch (of a recurrent policy, every step of its sequences),
    flattened in row order.
    """
    new_logprobs, entropy, new_values = model(*minibatch.model_inputs())
    mask = minibatch.is_transition.reshape(-1) if hp.skip_reset_steps else None
    advantages = minibatch.advantages.reshape(-1)
    advantages = normalize(advantages, mask) if hp.normalize_advantages else advantages
    pg_loss = policy_loss(new_logprobs, minibatch.logprobs.reshape(-1), advantages, hp.clip_coef, mask)
    v_loss = value_loss(
        new_values, minibatch.values.reshape(-1), minibatch.returns.reshape(-1), hp.clip_coef, hp.clip_vloss, mask
    )
    ent_loss = entropy_loss(entropy, mask)
    loss = pg_loss + hp.vf_coef * v_loss
    if hp.ent_coef != 0:  # at 0 (the example's default) the term adds only backward work, no gradient
        loss = loss + hp.ent_coef * ent_loss
    return loss, pg_loss, v_loss, ent_loss, new_logprobs


MinibatchLoss = Callable[[nn.Module, Batch, PPOHyperparameters], tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]


# backward(loss, kl): the gradient of `loss` averaged over the learners into the parameters' `.grad`; given the
# minibatch's KL (a 0-d tensor), it returns the KL averaged over the learners in the same collective.
Backward = Callable[[Tensor, Tensor | None], Tensor | None]


# A whole minibatch step, loss to optimizer step: (policy loss, value loss, entropy loss, new log-probs).
MinibatchStep = Callable[[Batch], tuple[Tensor, Tensor, Tensor, Tensor]]


def ppo_update(
    model: nn.Module,
    batch: Batch,
    schedule: MinibatchSchedule,
    hp: PPOHyperparameters,
    backward: Backward,
    step: Callable[[], None],
    loss_of: MinibatchLoss = minibatch_loss,
    minibatch_step: MinibatchStep | None = None,
) -> dict[str, Tensor]:
    """`update_epochs` passes of minibatch gradient steps over `batch`.

    `backward` writes the averaged gradient (`Backward`); `step()` then clips the averaged gradients
    and steps the optimizer. `loss_of` is `minibatch_loss`, or its compiled form. With a target KL,
    the update stops before the step of the first minibatch whose KL, averaged over the learners,
    passes `hp.kl_limit`: every learner reads the same average, so all stop at the same minibatch.
    Returns the mean of each of `UPDATE_STATS` as tensors, so a GPU run syncs once per update
    (and once per minibatch with a target KL, to decide). A `minibatch_step` (a captured one) does a
    minibatch's loss, backward and step in one call, where no target KL asks for a decision between.
    """
    stats = UpdateStats()
    for epoch in range(1, hp.update_epochs + 1):
        for index, minibatch in enumerate(batch.minibatches(schedule.next_epoch()), start=1):
            if minibatch_step is not None:
                stats.record(*minibatch_step(minibatch), minibatch.logprobs.reshape(-1))
                continue
            loss, pg_loss, v_loss, ent_loss, new_logprobs = loss_of(model, minibatch, hp)
            old_logprobs = minibatch.logprobs.reshape(-1)
            stats.record(pg_loss, v_loss, ent_loss, new_logprobs, old_logprobs)
            kl = None
            if hp.kl_limit is not None:
                mask = minibatch.is_transition.reshape(-1) if hp.skip_reset_steps else None
                kl = approximate_kl(new_logprobs.detach(), old_logprobs, mask)
            averaged_kl = backward(loss, kl)
            if averaged_kl is not None and hp.kl_limit is not None and float(averaged_kl) > hp.kl_limit:
                return stats.means(hp.clip_coef) | stopped_at(epoch, index, loss)
            step()
    return stats.means(hp.clip_coef)


def stopped_at(epoch: int, minibatch: int, like: Tensor) -> dict[str, Tensor]:
    return dict(zip(KL_STOP_STATS, (like.new_tensor(float(epoch)), like.new_tensor(float(minibatch))), strict=True))


class UpdateStats:
    """Collects each minibatch's losses and log-probs; reduces them once, after the update."""

    def __init__(self) -> None:
        self.losses: list[Tensor] = []
        self.new_logprobs: list[Tensor] = []
        self.old_logprobs: list[Tensor] = []

    def record(
        self, pg_loss: Tensor, v_loss: Tensor, ent_loss: Tensor, new_logprobs: Tensor, old_logprobs: Tensor
    ) -> None:
        self.losses += [pg_loss.detach(), v_loss.detach(), -ent_loss.detach()]
        self.new_logprobs.append(new_logprobs.detach())
        self.old_logprobs.append(old_logprobs)

    @torch.no_grad()
    def means(self, clip_coef: float) -> dict[str, Tensor]:
        """Losses averaged over minibatches; approx_kl and clip_fraction over every row trained on."""
        policy, value, entropy = torch.stack(self.losses).view(-1, 3).mean(0)
        new_logprobs, old_logprobs = torch.cat(self.new_logprobs), torch.cat(self.old_logprobs)
        approx_kl = approximate_kl(new_logprobs, old_logprobs)
        clip_fraction = (((new_logprobs - old_logprobs).exp() - 1.0).abs() > clip_coef).float().mean()
        return dict(zip(UPDATE_STATS, (policy, value, entropy, approx_kl, clip_fraction), strict=True))
