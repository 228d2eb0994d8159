"""Normalization statistics pooled across ranks equal those of the pooled data."""

import numpy as np
import pytest
import torch
from gymnasium.wrappers.utils import RunningMeanStd

from rl.normalization import ObservationNormalizer, RewardScaler


def pooled_all_reduce(other_ranks_sums):
    """Stands in for the all-reduce: adds the sums another rank would contribute."""
    return lambda local: local + other_ranks_sums


def local_sums(samples):
    flat = samples.double()
    return torch.cat([flat.new_tensor([flat.shape[0]]), flat.sum(0), flat.pow(2).sum(0)])


def test_observation_statistics_pool_both_ranks_rollouts():
    rng = np.random.default_rng(0)
    rank0, rank1 = rng.normal(2.0, 3.0, size=(50, 4)), rng.normal(-1.0, 0.5, size=(70, 4))
    normalizer = ObservationNormalizer(4, enabled=True, device=torch.device("cpu"))
    normalizer.sync_update(torch.tensor(rank0), pooled_all_reduce(local_sums(torch.tensor(rank1))))

    expected = RunningMeanStd(shape=(4,))
    expected.update(np.concatenate([rank0, rank1]))
    np.testing.assert_allclose(normalizer.rms.mean, expected.mean, rtol=1e-9)
    np.testing.assert_allclose(normalizer.rms.var, expected.var, rtol=1e-9)
    assert normalizer.rms.count == expected.count

    obs = torch.tensor(rank0[:3], dtype=torch.float32)
    scaled = (obs - torch.tensor(expected.mean, dtype=torch.float32)) / torch.tensor(
        np.sqrt(expected.var + 1e-8), dtype=torch.float32
    )
    torch.testing.assert_close(normalizer(obs), scaled.clamp(-10, 10))


def test_statistics_round_trip_through_a_state_dict():
    normalizer = ObservationNormalizer(2, enabled=True, device=torch.device("cpu"))
    normalizer.sync_update(torch.tensor([[1.0, 2.0], [3.0, 5.0]]), lambda t: t)
    restored = ObservationNormalizer(2, enabled=True, device=torch.device("cpu"))
    restored.load_state_dict(normalizer.state_dict())
    probe = torch.tensor([[0.5, 0.5]])
    torch.testing.assert_close(restored(probe), normalizer(probe))
    assert all(isinstance(v, torch.Tensor | float) for v in normalizer.state_dict().values())


def test_disabled_normalizers_pass_values_through():
    normalizer = ObservationNormalizer(2, enabled=False, device=torch.device("cpu"))
    obs = torch.tensor([[100.0, -100.0]])
    assert normalizer(obs) is obs
    scaler = RewardScaler(2, 0.99, enabled=False)
    rewards = np.array([5.0, -5.0])
    assert scaler(rewards, np.array([False, False]))[0] is rewards


def test_reward_scaler_divides_by_the_std_of_discounted_returns():
    scaler = RewardScaler(1, gamma=0.5, enabled=True)
    tracked = [scaler(np.array([1.0]), np.array([False]))[1][0] for _ in range(3)]
    assert tracked == [1.0, 1.5, 1.75]
    _, after_end = scaler(np.array([1.0]), np.array([True]))
    assert after_end[0] == 1.875 and scaler.discounted_returns[0] == 0.0  # the next episode starts afresh
    scaler.sync_update(torch.tensor(tracked), lambda t: t)
    scaled, _ = scaler(np.array([2.0]), np.array([False]))
    assert scaled[0] == np.float64(2.0 / np.sqrt(scaler.rms.var + 1e-8))


def test_reward_scaler_pools_only_the_returns_its_mask_marks_as_samples():
    returns = torch.tensor([1.0, 0.0, 3.0, 0.0])  # the zeros: reset steps' placeholders
    masked, selected = RewardScaler(1, 0.99, enabled=True), RewardScaler(1, 0.99, enabled=True)
    masked.sync_update(returns, lambda t: t, samples=torch.tensor([True, False, True, False]))
    selected.sync_update(torch.tensor([1.0, 3.0]), lambda t: t)
    assert masked.state_dict() == selected.state_dict()
    assert masked.rms.count == pytest.approx(2.0 + 1e-4)
