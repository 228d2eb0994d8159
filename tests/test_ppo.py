"""The PPO losses, statistics and minibatch schedule."""

import math

import pytest
import torch

from rl.algos.ppo.rollout import Batch, explained_variance
from rl.algos.ppo.update import MinibatchSchedule, entropy_loss, normalize, policy_loss, value_loss
from rl.optim import DivergenceGuard, TrainingDiverged, clip_and_step, clip_grad_norm


def test_policy_loss_is_the_negated_clipped_surrogate():
    old = torch.zeros(4)
    # ratios 1.5, 1.5, 0.5, 0.5 against advantages +1, -1, +1, -1
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    # per sample min(r*A, clip(r)*A): 1.2, -1.5, 0.5, -0.8
    expected = -(1.2 - 1.5 + 0.5 - 0.8) / 4
    assert policy_loss(new, old, advantages, clip_coef=0.2).item() == pytest.approx(expected)


def test_policy_loss_gradient_vanishes_outside_the_clip_range():
    new = torch.log(torch.tensor([1.5])).requires_grad_()
    policy_loss(new, torch.zeros(1), torch.ones(1), 0.2).backward()
    assert new.grad.item() == 0.0


def test_value_loss_unclipped_and_clipped():
    new, old, returns = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0])
    assert value_loss(new, old, returns, 0.2, clip_vloss=False).item() == pytest.approx(0.5)
    # clipped prediction 0.2 is further from 1.0 than 2.0: max(1.0, 0.64)
    assert value_loss(new, old, returns, 0.2, clip_vloss=True).item() == pytest.approx(0.5)
    new = torch.tensor([0.9])
    assert value_loss(new, old, returns, 0.2, clip_vloss=True).item() == pytest.approx(0.5 * 0.8**2)


def test_mujoco_presets_weigh_the_value_loss_as_stable_baselines3_does():
    """SB3's loss is vf_coef x MSE; with half the squared error here, the presets carry twice rl-zoo's vf_coef."""
    from rl.algos.ppo.presets import PPO_PRESETS

    new, returns = torch.tensor([0.3, -1.2, 2.0]), torch.tensor([1.0, 0.5, -0.5])
    rl_zoo_vf_coef = {"halfcheetah": 0.58096, "hopper": 0.835671, "walker2d": 0.871923, "ant": 0.5, "swimmer": 0.5}
    for name, coefficient in rl_zoo_vf_coef.items():
        ours = PPO_PRESETS[name]["vf_coef"] * value_loss(new, new, returns, 0.2, clip_vloss=False)
        assert ours.item() == pytest.approx(coefficient * torch.nn.functional.mse_loss(new, returns).item()), name


def test_mujoco_presets_build_the_network_rl_zoo_gives_each_env():
    """rl-zoo's HalfCheetah and Hopper entries set a ReLU 256x256 policy with log-std -2 and no orthogonal init;
    its Walker2d, Ant and Swimmer entries set no policy, so SB3's default applies: tanh 64x64, orthogonal, log-std 0.
    Its published Ant and Swimmer agents also saw the time feature, and its Ant agent no contact forces."""
    from rl.algos.ppo.config import PPOConfig
    from rl.flag_parsing import preset_values

    tuned_network = {"halfcheetah": True, "hopper": True, "walker2d": False, "ant": False, "swimmer": False}
    for name, tuned in tuned_network.items():
        cfg = PPOConfig(**preset_values(PPOConfig, name))
        network = (cfg.activation_function, cfg.hidden_size, cfg.log_std_init, cfg.ortho_init)
        assert network == (("relu", 256, -2.0, False) if tuned else ("tanh", 64, 0.0, True)), name
        assert (cfg.num_envs, cfg.normalize_observations, cfg.normalize_rewards) == (1, True, True), name
        assert cfg.time_feature == (name in ("ant", "swimmer")), name
        contact_forces = {"include_cfrc_ext_in_observation": False} if name == "ant" else {}
        assert cfg.make_kwargs() == contact_forces, name


def test_entropy_loss_and_advantage_normalization():
    assert entropy_loss(torch.tensor([1.0, 3.0])).item() == -2.0
    normalized = normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert normalized.mean().item() == pytest.approx(0.0, abs=1e-7)
    assert normalized.std().item() == pytest.approx(1.0, abs=1e-6)


def test_explained_variance():
    targets = torch.tensor([1.0, 2.0, 3.0])
    assert float(explained_variance(targets, targets)) == 1.0
    assert float(explained_variance(torch.zeros(3), targets)) == pytest.approx(0.0)
    assert math.isnan(explained_variance(torch.zeros(3), torch.ones(3)))


def test_shards_are_disjoint_cover_the_rollout_and_agree_across_ranks():
    rows, world = 40, 2
    schedules = [MinibatchSchedule(rows, 8, world, rank, seed=3) for rank in range(world)]
    for _ in range(3):
        epochs = [schedule.next_epoch() for schedule in schedules]
        shards = [sorted(i for batch in epoch for i in batch) for epoch in epochs]
        assert set(shards[0]).isdisjoint(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(rows))
        assert [len(epoch) for epoch in epochs] == [3, 3]  # same minibatch count: DDP stays in step


def test_each_epoch_reshuffles_and_a_seed_repeats():
    first, again = MinibatchSchedule(32, 8, 1, 0, seed=1), MinibatchSchedule(32, 8, 1, 0, seed=1)
    epoch_one, epoch_two = first.next_epoch(), first.next_epoch()
    assert epoch_one != epoch_two
    assert again.next_epoch() == epoch_one


def _gradients(seed: int, scale: float) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    parameters = [torch.zeros(shape, requires_grad=True) for shape in [(3, 4), (4,), (1,)]]
    for parameter in parameters:
        parameter.grad = scale * torch.randn(parameter.shape, generator=generator)
    return parameters


@pytest.mark.parametrize(("scale", "max_norm"), [(10.0, 0.5), (0.01, 0.5), (10.0, 0.0)])
def test_clip_grad_norm_matches_torch(scale, max_norm):
    ours, reference = _gradients(0, scale), _gradients(0, scale)
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(reference, max_norm if max_norm > 0 else math.inf)
    assert torch.equal(norm, expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, reference, strict=True))


def test_a_non_finite_gradient_norm_skips_the_step_on_the_device_and_stops_training_at_the_check():
    parameters = _gradients(0, 1.0)
    optimizer = torch.optim.Adam(parameters, lr=0.1, fused=True)
    guard = DivergenceGuard(torch.device("cpu"))
    guard.guard([optimizer])
    clip_and_step([optimizer], parameters, 0.5, None, guard)
    guard.raise_if_diverged()  # a finite step: taken, and nothing to say
    taken = [parameter.detach().clone() for parameter in parameters]
    moments = [optimizer.state[parameter]["exp_avg"].clone() for parameter in parameters]
    parameters[1].grad[0] = math.nan
    clip_and_step([optimizer], parameters, 0.5, None, guard)
    assert all(torch.equal(parameter, before) for parameter, before in zip(parameters, taken, strict=True))
    assert all(
        torch.equal(optimizer.state[parameter]["exp_avg"], moment)
        for parameter, moment in zip(parameters, moments, strict=True)
    )
    assert all(optimizer.state[parameter]["step"] == 1 for parameter in parameters)  # the skipped step is not counted
    with pytest.raises(TrainingDiverged, match="not finite"):
        guard.raise_if_diverged()


def test_minibatches_take_the_listed_rows_in_order():
    rows = torch.arange(10.0)
    batch = Batch(
        obs=rows[:, None],
        actions=rows,
        logprobs=rows,
        values=rows,
        advantages=rows,
        returns=rows,
        is_transition=rows >= 0,
    )
    epoch = [[3, 1, 4], [0, 9], [2]]
    minibatches = batch.minibatches(epoch)
    for minibatch, index in zip(minibatches, epoch, strict=True):
        assert minibatch.obs.squeeze(-1).tolist() == index
        assert minibatch.returns.tolist() == index


def test_every_statistic_ppo_reports_has_a_tensorboard_tag():
    from rl.algos.ppo.algorithm import PPO
    from rl.algos.ppo.update import KL_STOP_STATS, UPDATE_STATS

    assert {*UPDATE_STATS, *KL_STOP_STATS, "learning_rate", "explained_variance"} == set(PPO.stat_tags)


def test_masked_losses_equal_the_losses_of_the_kept_rows_alone():
    generator = torch.Generator().manual_seed(0)
    new, old, advantages, values, returns, entropy = torch.randn(6, 32, generator=generator)
    keep = torch.rand(32, generator=generator) > 0.3
    kept_alone = policy_loss(new[keep], old[keep], advantages[keep], 0.2)
    assert policy_loss(new, old, advantages, 0.2, keep) == pytest.approx(float(kept_alone))
    for clip_vloss in (False, True):
        masked = value_loss(new, values, returns, 0.2, clip_vloss, keep)
        assert masked == pytest.approx(float(value_loss(new[keep], values[keep], returns[keep], 0.2, clip_vloss)))
    assert entropy_loss(entropy, keep) == pytest.approx(float(entropy_loss(entropy[keep])))
    normalized = normalize(advantages, keep)
    assert torch.allclose(normalized[keep], normalize(advantages[keep]))
    # and a dropped row's value cannot reach a masked loss's gradient
    advantages.requires_grad_(True)
    policy_loss(new, old, advantages, 0.2, keep).backward()
    assert torch.all(advantages.grad[~keep] == 0) and torch.all(advantages.grad[keep] != 0)


def test_normalizing_with_a_mask_keeps_the_old_rules_for_zero_and_one_kept_rows():
    advantages = torch.tensor([3.0, -1.0, 2.0])
    none_kept, one_kept = torch.zeros(3, dtype=torch.bool), torch.tensor([False, True, False])
    assert torch.equal(normalize(advantages, none_kept), advantages)  # no center, no scale
    assert torch.equal(normalize(advantages, one_kept), advantages + 1.0)  # centered on the one row


CPU = torch.device("cpu")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "rl/MaskedCartPole-v1"])
def test_one_call_per_minibatch_step_trains_as_the_split_steps_do(env_id):
    """The function `--cuda-graphs` captures (loss, backward, clip and step in one call) takes the same
    steps as the update's own loop, to the bit: on a GPU the captured graph replays this function. A
    recurrent policy's minibatches are whole sequences, replayed step by step as a captured run does."""
    from rl.algos.ppo.algorithm import PPO
    from rl.algos.ppo.config import PPOConfig
    from rl.algos.ppo.update import ppo_update
    from rl.batch import DataShard
    from rl.envs import inspect_env
    from rl.runtime import TorchRuntime

    recurrent = env_id == "rl/MaskedCartPole-v1"
    changes = {"recurrent": True, "per_rank_batch_size": 32, "lstm_hidden_size": 8} if recurrent else {}
    settings = {"env_id": env_id, "num_envs": 2, "num_steps": 16, "per_rank_batch_size": 12, "update_epochs": 2}
    cfg = PPOConfig(**settings | changes)
    algorithm = PPO(cfg, inspect_env(env_id))
    rows = algorithm.batch_rows(1)
    learners = []
    for _ in range(2):
        policy = algorithm.build_policy(CPU)
        policy.replay_in_steps = recurrent
        learners.append(algorithm.make_learner(policy, TorchRuntime(cfg, 1), DataShard(rows), env_ranks=1))
    if recurrent:  # a rollout's sequences
        source = algorithm.make_source(0, CPU, None, env_ranks=1, batch_rows=rows)
        source.collect(learners[0].policy)
        batch = source.next_batch(0, lambda tensor: tensor)
    else:
        batch = random_batch(32, algorithm, torch.Generator().manual_seed(0))
    split, whole = learners

    def one_call(minibatch: Batch):
        outputs = whole.minibatch_step_on_device((type(minibatch), len(minibatch)), *minibatch.tensors())
        return outputs["policy_loss"], outputs["value_loss"], outputs["entropy_loss"], outputs["new_logprobs"]

    for learner, step in ((split, None), (whole, one_call)):
        backward, loss_of = learner.backward_and_average, learner.loss_of
        ppo_update(learner.policy, batch, learner.schedule, learner.hp, backward, learner.step, loss_of, step)
    for ours, theirs in zip(split.policy.parameters(), whole.policy.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert not torch.equal(next(split.policy.parameters()), next(algorithm.build_policy(CPU).parameters()))


def random_batch(rows: int, algorithm, generator: torch.Generator) -> Batch:
    discrete = algorithm.spaces.action_space.shape == ()
    if discrete:
        actions = torch.randint(0, 2, (rows,), generator=generator)
    else:
        actions = torch.rand(rows, 1, generator=generator)
    return Batch(
        obs=torch.rand(rows, algorithm.spaces.obs_dim, generator=generator),
        actions=actions,
        logprobs=-torch.rand(rows, generator=generator),
        values=torch.rand(rows, generator=generator),
        advantages=torch.randn(rows, generator=generator),
        returns=torch.rand(rows, generator=generator),
        is_transition=torch.ones(rows, dtype=torch.bool),
    )


CAPTURE_REFUSALS = [({"target_kl": 0.01}, "--target-kl"), ({"precision": "16-mixed"}, "16-mixed")]


@pytest.mark.parametrize(("changes", "words"), CAPTURE_REFUSALS)
def test_cuda_graphs_refuse_what_a_captured_minibatch_step_cannot_hold(changes, words):
    from rl.algos.ppo.config import PPOConfig
    from rl.config import check_cuda_graphs
    from rl.errors import UsageError

    check_cuda_graphs(PPOConfig(cuda=True, cuda_graphs=True))
    with pytest.raises(UsageError, match=words) as refused:
        check_cuda_graphs(PPOConfig(cuda=True, cuda_graphs=True, **changes))
    assert refused.value.flag == "--cuda-graphs"


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"env_id": "Pendulum-v1", "normalize_observations": True, "normalize_rewards": True},
        {"env_id": "Pendulum-v1", "use_sde": True, "sde_sample_freq": 4},
        {"env_id": "rl/PixelCartPole-v1", "resize": 0, "frame_stack": 2},
        {"env_id": "rl/MaskedCartPole-v1", "recurrent": True, "lstm_hidden_size": 8},
    ],
)
def test_a_recorded_step_fills_the_rollout_as_the_eager_step_does(changes):
    """The step `--cuda-graphs` captures (acting, then the rollout's row where a device-side cursor points) fills
    the same rollouts as the eager step, over two rollouts with the normalizers updated between them. On the CPU
    it runs uncaptured; tests/test_gpu.py replays it as a CUDA graph."""
    import dataclasses

    import envs_for_tests  # noqa: F401  (registers the tests' envs)

    from rl.algos.ppo.algorithm import PPO
    from rl.algos.ppo.config import PPOConfig
    from rl.envs import inspect_env

    filled = []
    for recorded in (False, True):
        cfg = PPOConfig(num_envs=2, num_steps=16, per_rank_batch_size=16, cuda_graphs=recorded, **changes)
        algorithm = PPO(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
        torch.manual_seed(0)
        policy = algorithm.build_policy(CPU)
        source = algorithm.make_source(0, CPU, None, env_ranks=1, batch_rows=32)
        assert (source.recorded_step is not None) == recorded
        rollouts = []
        for _ in range(2):
            source.collect(policy)
            source.next_batch(0, lambda tensor: tensor)  # updates the normalizers
            rollouts.append({f.name: getattr(source.buffer, f.name).clone() for f in dataclasses.fields(source.buffer)})
        filled.append(rollouts)
    for eager, recorded in zip(*filled, strict=True):
        for name, column in eager.items():
            assert torch.equal(column, recorded[name]), f"{name} differs"
