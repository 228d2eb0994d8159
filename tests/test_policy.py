"""Action distributions for each supported space, against torch.distributions."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Categorical, Normal

from rl.algos.ppo.policy import MLPActorCritic

OBS_DIM, BATCH = 5, 7


def agent_for(space, seed=0):
    torch.manual_seed(seed)
    return MLPActorCritic(OBS_DIM, space)


@pytest.fixture
def obs():
    return torch.randn(BATCH, OBS_DIM, generator=torch.Generator().manual_seed(1))


def test_discrete(obs):
    agent = agent_for(gym.spaces.Discrete(3))
    action, logprob, value = agent.act(obs, torch.Generator().manual_seed(0))
    assert action.shape == (BATCH,) and action.dtype == torch.long and value.shape == (BATCH,)
    reference = Categorical(logits=agent.action_head.linear(agent.actor_body(obs)))
    torch.testing.assert_close(logprob, reference.log_prob(action))
    new_logprob, entropy, _ = agent(obs, action)
    torch.testing.assert_close(new_logprob, reference.log_prob(action))
    torch.testing.assert_close(entropy, reference.entropy())
    torch.testing.assert_close(agent.greedy_action(obs), reference.probs.argmax(-1))


def test_multi_discrete(obs):
    nvec = [2, 4, 3]
    agent = agent_for(gym.spaces.MultiDiscrete(nvec))
    action, logprob, _ = agent.act(obs, torch.Generator().manual_seed(0))
    assert action.shape == (BATCH, 3) and action.dtype == torch.long
    assert all((action[:, i] < n).all() for i, n in enumerate(nvec))
    logits = agent.action_head.linear(agent.actor_body(obs)).split(nvec, dim=-1)
    parts = [Categorical(logits=chunk) for chunk in logits]
    expected_logprob = sum(d.log_prob(action[:, i]) for i, d in enumerate(parts))
    torch.testing.assert_close(logprob, expected_logprob)
    new_logprob, entropy, _ = agent(obs, action)
    torch.testing.assert_close(new_logprob, expected_logprob)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in parts))


def test_multi_binary(obs):
    agent = agent_for(gym.spaces.MultiBinary(3))
    action, logprob, _ = agent.act(obs, torch.Generator().manual_seed(0))
    assert action.shape == (BATCH, 3) and action.dtype == torch.long
    assert set(action.unique().tolist()) == {0, 1}
    reference = Bernoulli(logits=agent.action_head.linear(agent.actor_body(obs)))
    torch.testing.assert_close(logprob, reference.log_prob(action.float()).sum(-1))
    new_logprob, entropy, _ = agent(obs, action)
    torch.testing.assert_close(new_logprob, reference.log_prob(action.float()).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    torch.testing.assert_close(agent.greedy_action(obs), (reference.probs > 0.5).long())


def test_sampled_bits_follow_their_probabilities():
    agent = agent_for(gym.spaces.MultiBinary(3))
    with torch.no_grad():
        agent.action_head.linear.bias.copy_(torch.tensor([-1.5, 0.0, 2.0]))
    obs = torch.zeros(20000, OBS_DIM)
    actions = agent.act(obs, torch.Generator().manual_seed(0))[0]
    probs = torch.sigmoid(agent.action_head.linear(agent.actor_body(obs[:1])))[0]
    np.testing.assert_allclose(actions.float().mean(0).numpy(), probs.detach().numpy(), atol=0.015)


def test_box_gaussian_with_learned_log_std(obs):
    space = gym.spaces.Box(-1.0, 1.0, shape=(2,))
    agent = agent_for(space)
    with torch.no_grad():
        agent.action_head.log_std.fill_(0.7)  # wide enough that samples leave the bounds
    action, logprob, _ = agent.act(obs, torch.Generator().manual_seed(0))
    assert action.shape == (BATCH, 2) and action.dtype == torch.float32
    assert (action.abs() > 1).any(), "samples are stored unclipped"
    reference = Normal(agent.action_head.linear(agent.actor_body(obs)), torch.full((2,), 0.7).exp())
    torch.testing.assert_close(logprob, reference.log_prob(action).sum(-1))
    new_logprob, entropy, _ = agent(obs, action)
    torch.testing.assert_close(new_logprob, reference.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    assert agent.action_head.log_std.requires_grad


def test_sampling_follows_its_generator_only(obs):
    agent = agent_for(gym.spaces.Discrete(4))
    first = agent.act(obs, torch.Generator().manual_seed(5))[0]
    torch.manual_seed(123)  # the global stream must not matter
    second = agent.act(obs, torch.Generator().manual_seed(5))[0]
    torch.testing.assert_close(first, second)


def test_sampled_frequencies_match_the_probabilities():
    agent = agent_for(gym.spaces.Discrete(3))
    obs = torch.zeros(20000, OBS_DIM)
    actions = agent.act(obs, torch.Generator().manual_seed(0))[0]
    probs = torch.softmax(agent.action_head.linear(agent.actor_body(obs[:1])), -1)[0]
    frequencies = torch.bincount(actions, minlength=3).float() / len(actions)
    np.testing.assert_allclose(frequencies.numpy(), probs.detach().numpy(), atol=0.015)


def test_orthogonal_init_changes_the_weights():
    plain = agent_for(gym.spaces.Discrete(2))
    torch.manual_seed(0)
    ortho = MLPActorCritic(OBS_DIM, gym.spaces.Discrete(2), ortho_init=True)
    weight = ortho.actor_body.hidden1.weight
    # a tall orthogonal matrix with gain sqrt(2): its columns are orthogonal with squared norm 2
    torch.testing.assert_close(weight.T @ weight, 2.0 * torch.eye(OBS_DIM), atol=1e-4, rtol=0)
    assert not torch.equal(plain.actor_body.hidden1.weight, weight)
    assert torch.all(ortho.actor_body.hidden1.bias == 0)


def test_hidden_size_and_initial_log_std_reach_the_networks_from_the_flags():
    from rl.algos.ppo.algorithm import PPO
    from rl.cli import parse_config
    from rl.envs import inspect_env

    cfg = parse_config(["--env-id", "Pendulum-v1", "--hidden-size", "32", "--log-std-init", "-2"])
    agent = PPO(cfg, inspect_env(cfg.env_id)).build_policy(torch.device("cpu"))
    for body in (agent.actor_body, agent.critic_body):
        assert (body.hidden1.out_features, body.hidden2.in_features, body.hidden2.out_features) == (32, 32, 32)
    assert agent.critic_head.in_features == agent.action_head.linear.in_features == 32
    torch.testing.assert_close(agent.action_head.log_std.detach(), torch.full((1,), -2.0))


def test_the_categorical_sampler_draws_what_multinomial_draws_from_the_same_generator():
    """It replaced `torch.multinomial` (whose input checks wait for a GPU): the same actions from the same
    seed, and the generator left in the same state, so runs are unchanged."""
    from rl.algos.ppo.policy import _race_noise, _sample

    ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    shapes = [(1, 2), (7, 5), (64, 18), (3, 1)]
    for shape in shapes * 25:
        log_probs = torch.log_softmax(torch.randn(shape) * 3, dim=-1)
        index, log_prob = _sample(log_probs, _race_noise(*shape, ours, torch.device("cpu")))
        expected = torch.multinomial(log_probs.exp(), 1, generator=theirs).squeeze(-1)
        assert torch.equal(index, expected)
        assert torch.equal(log_prob, log_probs.gather(-1, expected.unsqueeze(-1)).squeeze(-1))
    assert torch.equal(ours.get_state(), theirs.get_state())
