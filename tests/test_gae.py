"""GAE against a slow reference written from the definitions, and the rollout's autoreset handling."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl.algos.ppo.policy import MLPActorCritic
from rl.algos.ppo.rollout import RolloutCollector, compute_gae
from rl.envs import EnvSpaces
from rl.normalization import ObservationNormalizer, RewardScaler


def reference_gae(rewards, values, terminated, truncated, final_values, next_value, gamma, lam):
    """Per env, per step: sum over k of (gamma * lam)^k * delta_{t+k}, stopping at the episode's end."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    for env in range(envs):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for k in range(t, steps):
                ended = terminated[k, env] or truncated[k, env]
                if terminated[k, env]:
                    bootstrap = 0.0
                elif truncated[k, env]:
                    bootstrap = final_values[k, env]
                else:
                    bootstrap = values[k + 1, env] if k + 1 < steps else next_value[env]
                delta = rewards[k, env] + gamma * bootstrap - values[k, env]
                total += weight * delta
                if ended:
                    break
                weight *= gamma * lam
            advantages[t, env] = total
    return advantages, advantages + values


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_with_terminations_and_truncations(seed):
    rng = np.random.default_rng(seed)
    steps, envs, gamma, lam = 17, 3, 0.97, 0.9
    rewards = rng.normal(size=(steps, envs))
    values = rng.normal(size=(steps, envs))
    terminated = rng.random((steps, envs)) < 0.15
    truncated = rng.random((steps, envs)) < 0.15  # some steps are both: termination wins
    final_values = np.where(truncated, rng.normal(size=(steps, envs)), 0.0)
    next_value = rng.normal(size=envs)

    expected_adv, expected_ret = reference_gae(
        rewards, values, terminated, truncated, final_values, next_value, gamma, lam
    )
    as_t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    adv, ret = compute_gae(
        as_t(rewards),
        as_t(values),
        torch.tensor(terminated),
        torch.tensor(truncated),
        as_t(final_values),
        as_t(next_value),
        gamma,
        lam,
    )
    np.testing.assert_allclose(adv.numpy(), expected_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected_ret, rtol=1e-10, atol=1e-10)


def test_truncation_bootstraps_but_termination_does_not():
    zeros = torch.zeros(1, 1)
    final = torch.full((1, 1), 10.0)
    truncated_adv, _ = compute_gae(zeros, zeros, zeros.bool(), ~zeros.bool(), final, torch.zeros(1), 0.5, 1.0)
    terminated_adv, _ = compute_gae(zeros, zeros, ~zeros.bool(), zeros.bool(), final, torch.zeros(1), 0.5, 1.0)
    assert truncated_adv.item() == pytest.approx(5.0)
    assert terminated_adv.item() == 0.0


def make_collector(envs, num_steps=64, seed=0):
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    torch.manual_seed(seed)
    agent = MLPActorCritic(obs_dim, envs.single_action_space)
    generator = torch.Generator().manual_seed(seed)
    collector = RolloutCollector(
        envs,
        num_steps,
        EnvSpaces("test", obs_dim, envs.single_action_space, envs.single_observation_space),
        torch.device("cpu"),
        ObservationNormalizer(obs_dim, enabled=False, device=torch.device("cpu")),
        RewardScaler(envs.num_envs, 0.99, enabled=False),
        [seed + i for i in range(envs.num_envs)],
        generator,
        gamma=0.99,
        gae_lambda=0.95,
    )
    return agent, collector


def collect(collector, agent):
    """One rollout and the episodes that ended in it."""
    episodes = collector.collect(agent)
    return collector.buffer, episodes


def vector_env(num_envs, max_episode_steps=None):
    thunks = [lambda: gym.make("CartPole-v1", max_episode_steps=max_episode_steps)] * num_envs
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def test_rollout_never_stores_an_autoreset_step():
    # CartPole pays 1 on every real step; the fake step of NEXT_STEP autoreset would pay 0.
    agent, collector = make_collector(vector_env(3), num_steps=200)
    rollout, episodes = collect(collector, agent)
    assert torch.all(rollout.rewards == 1.0)
    ended = rollout.terminated | rollout.truncated
    assert int(ended.sum()) == len(episodes.returns) > 0
    # Every episode began inside this rollout, so its recorded length is its count of stored steps.
    stored_lengths = []
    for env in range(3):
        ends = torch.nonzero(ended[:, env]).flatten().tolist()
        stored_lengths += np.diff([-1, *ends]).tolist()
    assert sorted(stored_lengths) == sorted(episodes.lengths)


def test_truncated_steps_carry_the_value_of_the_final_observation():
    agent, collector = make_collector(vector_env(2, max_episode_steps=5), num_steps=12)
    with torch.no_grad():  # a critic that says 3 everywhere makes V(final observation) visible
        agent.critic_head.weight.zero_()
        agent.critic_head.bias.fill_(3.0)
    rollout, episodes = collect(collector, agent)
    assert rollout.truncated.sum() == 4 and not rollout.terminated.any()
    assert episodes.lengths == [5, 5, 5, 5]
    cut = rollout.truncated
    assert torch.all(rollout.final_values[cut] == 3.0) and torch.all(rollout.final_values[~cut] == 0)


def test_box2d_envs_restart_from_fresh_resets_on_resume(capsys):
    from rl.algos.ppo.config import PPOConfig
    from rl.checkpoint import Counters, TrainingCheckpoint, restore_run_state
    from rl.envs import make_vector_env

    agent, collector = make_collector(make_vector_env("LunarLander-v3", 2), num_steps=8)
    collector.collect(agent)
    state = collector.capture_state()
    assert state["envs"] is None  # Box2D worlds unpickle broken, so they are not saved
    assert collector.restore_state(state, fresh_seeds=[5, 6]) is False
    rollout, _ = collect(collector, agent)  # the fresh envs run
    assert rollout.obs.shape == (8, 2, 8)
    resume = TrainingCheckpoint(
        algorithm="ppo",
        policy=agent.state_dict(),
        obs_normalizer=collector.obs_normalizer.state_dict(),
        config=PPOConfig(num_envs=2).to_dict(),
        env_id="LunarLander-v3",
        reward_scaler=collector.reward_scaler.state_dict(),
        learner={},
        counters=Counters(0, 3),
        mode="coupled",
        world_size=2,
        rank_states=[{}, state],
    )
    restore_run_state(resume, 1, agent, None, collector)
    assert "warning: rank 1: these envs cannot be saved" in capsys.readouterr().err


def test_classic_control_envs_resume_mid_episode():
    agent, collector = make_collector(vector_env(2), num_steps=20)
    collector.collect(agent)
    state = collector.capture_state()
    expected, _ = collect(collector, agent)
    expected = expected.obs.clone()
    collector.restore_state(state, fresh_seeds=[0, 0])
    again, _ = collect(collector, agent)
    assert torch.equal(again.obs, expected)


def test_native_vector_envs_mark_their_late_reset_steps_as_no_transition():
    from rl.envs import make_vector_env

    # A native CartPole resets an ended env on the next step, which pays 0 and ignores the action.
    agent, collector = make_collector(make_vector_env("CartPole-v1", 4, mode="native"), num_steps=200)
    assert collector.resets_next_step
    rollout, episodes = collect(collector, agent)
    ended = rollout.terminated | rollout.truncated
    reset_steps = ~rollout.is_transition
    assert int(ended.sum()) == len(episodes.returns) > 0
    assert torch.equal(reset_steps[1:], ended[:-1])  # exactly the steps after an episode ended
    assert torch.all(rollout.rewards[reset_steps] == 0) and torch.all(rollout.rewards[~reset_steps] == 1)
    # The next rollout starts with a reset step where this one ended on its last step.
    first_next = ended[-1].clone()
    rollout, _ = collect(collector, agent)
    assert torch.equal(~rollout.is_transition[0], first_next)
    batch = collector.next_batch(0, lambda tensor: tensor)
    assert torch.equal(batch.is_transition, rollout.is_transition.reshape(-1))


def test_a_native_env_cut_by_its_time_limit_bootstraps_from_the_observation_it_returned():
    from rl.envs import make_vector_env

    envs = make_vector_env("CartPole-v1", 2, mode="native")
    envs.unwrapped.max_episode_steps = 5  # CartPoleVectorEnv's own time limit
    agent, collector = make_collector(envs, num_steps=13)
    with torch.no_grad():
        agent.critic_head.weight.zero_()
        agent.critic_head.bias.fill_(3.0)
    rollout, episodes = collect(collector, agent)
    # 5 steps, a reset step, 5 steps, a reset step, 1 step: each env is cut twice
    assert rollout.truncated.sum() == 4 and episodes.lengths == [5, 5, 5, 5]
    assert torch.all(rollout.final_values[rollout.truncated] == 3.0)
    assert (~rollout.is_transition).sum() == 4


def test_native_envs_resume_mid_episode_including_a_pending_reset():
    from rl.envs import make_vector_env

    agent, collector = make_collector(make_vector_env("CartPole-v1", 3, mode="native"), num_steps=37)
    collector.collect(agent)
    state = collector.capture_state()
    expected, _ = collect(collector, agent)
    expected = (expected.obs.clone(), expected.is_transition.clone())
    collector.restore_state(state, fresh_seeds=[0, 0, 0])
    again, _ = collect(collector, agent)
    assert torch.equal(again.obs, expected[0]) and torch.equal(again.is_transition, expected[1])
    assert not expected[1].all()  # the window held reset steps


def test_async_envs_give_the_same_rollout_as_sync_envs():
    from rl.envs import make_vector_env

    rollouts = {}
    for mode in ("sync", "async"):
        agent, collector = make_collector(make_vector_env("CartPole-v1", 3, mode=mode), num_steps=40)
        rollout, episodes = collect(collector, agent)
        rollouts[mode] = (rollout.obs.clone(), rollout.rewards.clone(), rollout.terminated.clone(), episodes.lengths)
        assert rollout.is_transition.all() and not collector.resets_next_step
        collector.close()
    sync, asynchronous = rollouts["sync"], rollouts["async"]
    assert all(torch.equal(a, b) for a, b in zip(sync[:3], asynchronous[:3], strict=True))
    assert sync[3] == asynchronous[3] and len(sync[3]) > 0
