"""Normalization statistics pooled across ranks equal those of the pooled data."""

import numpy as np
import pytest
import torch
from gymnasium.wrappers.utils import RunningMeanStd

from rl.normalization import ObservationNormalizer, RewardScaler, RunningMoments


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
    np.testing.assert_allclose(normalizer.moments.mean.numpy(), expected.mean, rtol=1e-9)
    np.testing.assert_allclose(normalizer.moments.var.numpy(), expected.var, rtol=1e-9)
    assert normalizer.moments.count.item() == expected.count

    obs = torch.tensor(rank0[:3], dtype=torch.float32)
    scaled = (obs - torch.tensor(expected.mean, dtype=torch.float32)) / torch.tensor(
        np.sqrt(expected.var + 1e-8), dtype=torch.float32
    )
    torch.testing.assert_close(normalizer(obs), scaled.clamp(-10, 10))


def test_running_moments_are_gymnasiums_bit_for_bit():
    rng = np.random.default_rng(1)
    ours, gymnasiums = RunningMoments((3,), torch.device("cpu")), RunningMeanStd(shape=(3,))
    for rows in (1, 7, 300, 2):
        batch = rng.normal(rng.normal(), rng.uniform(0.1, 5.0), size=(rows, 3))
        mean, var = batch.mean(0), batch.var(0)
        ours.update(torch.from_numpy(mean), torch.from_numpy(var), torch.tensor(float(rows), dtype=torch.float64))
        gymnasiums.update_from_moments(mean, var, float(rows))
        np.testing.assert_array_equal(ours.mean.numpy(), gymnasiums.mean)
        np.testing.assert_array_equal(ours.var.numpy(), gymnasiums.var)
        assert ours.count.item() == gymnasiums.count


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
    rewards = torch.tensor([5.0, -5.0], dtype=torch.float64)
    assert scaler.scale(rewards) is rewards
    assert not scaler.track(np.array([5.0, -5.0]), np.array([False, False])).any()


def test_reward_scaler_divides_by_the_std_of_discounted_returns():
    scaler = RewardScaler(1, gamma=0.5, enabled=True)
    tracked = [scaler.track(np.array([1.0]), np.array([False]))[0] for _ in range(3)]
    assert tracked == [1.0, 1.5, 1.75]
    after_end = scaler.track(np.array([1.0]), np.array([True]))
    assert after_end[0] == 1.875 and scaler.discounted_returns[0] == 0.0  # the next episode starts afresh
    scaler.sync_update(torch.tensor(tracked), lambda t: t)
    expected = RunningMeanStd(shape=())
    expected.update(np.array(tracked, dtype=np.float32).astype(np.float64))
    state = scaler.state_dict()  # pooled sums of squares, not numpy's two passes: equal to rounding
    assert state == pytest.approx({"mean": expected.mean, "var": expected.var, "count": expected.count}, rel=1e-12)
    scaled = scaler.scale(torch.tensor([2.0, 1e9, -1e9], dtype=torch.float64))
    assert scaled.tolist() == [2.0 / np.sqrt(state["var"] + 1e-8), 10.0, -10.0]  # clipped at +-10


def test_reward_scaler_pools_only_the_returns_its_mask_marks_as_samples():
    returns = torch.tensor([1.0, 0.0, 3.0, 0.0])  # the zeros: reset steps' placeholders
    masked, selected = RewardScaler(1, 0.99, enabled=True), RewardScaler(1, 0.99, enabled=True)
    masked.sync_update(returns, lambda t: t, samples=torch.tensor([True, False, True, False]))
    selected.sync_update(torch.tensor([1.0, 3.0]), lambda t: t)
    assert masked.state_dict() == selected.state_dict()
    assert masked.moments.count.item() == pytest.approx(2.0 + 1e-4)


def test_the_normalizer_updates_its_tensors_in_place():
    """A CUDA graph that normalizes reads them where they were when it was captured."""
    normalizer = ObservationNormalizer(2, enabled=True, device=torch.device("cpu"))
    mean, scale = normalizer._mean, normalizer._scale
    normalizer.sync_update(torch.tensor([[1.0, 2.0], [3.0, 5.0]]), lambda t: t)
    normalizer.load_state_dict(normalizer.state_dict())
    assert normalizer._mean is mean and normalizer._scale is scale
    assert mean.tolist() != [0.0, 0.0]
