"""gSDE (--use-sde): the state-dependent Gaussians of PPO and SAC, the noise schedule, exact resume, every mode."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import SCRIPTS, launch_together, load_agent, refusal_line, run_dir, run_ranks
from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

from rl.algos.ppo.policy import MLPActorCritic, StateDependentGaussianHead
from rl.algos.sac.networks import SquashedGaussianActor
from rl.experience import StateDependentExploration

BOX = gym.spaces.Box(low=np.array([-2.0, 0.0], dtype=np.float32), high=np.array([2.0, 1.0], dtype=np.float32))


def test_the_ppo_head_scores_actions_by_the_gaussian_of_its_state_dependent_std():
    torch.manual_seed(0)
    head = StateDependentGaussianHead(hidden=8, action_dim=2, log_std_init=-0.5)
    features, generator = torch.randn(16, 8), torch.Generator().manual_seed(1)
    action, logprob = head.sample(features, [head.exploration_matrices(16, generator)])
    std = head.log_std.exp()
    scale = (features.pow(2) @ std.pow(2) + head.VARIANCE_FLOOR).sqrt()
    reference = Independent(Normal(head.mode(features), scale), 1)
    torch.testing.assert_close(logprob, reference.log_prob(action))
    scored, entropy = head.log_prob_entropy(features, action)
    torch.testing.assert_close(scored, logprob)
    torch.testing.assert_close(entropy, reference.entropy())


def test_the_ppo_head_trains_its_std_but_leaves_the_features_to_the_mean():
    head = StateDependentGaussianHead(hidden=4, action_dim=1)
    features = torch.randn(8, 4, requires_grad=True)
    actions = torch.randn(8, 1)
    logprob, _ = head.log_prob_entropy(features, actions)
    (features_grad,) = torch.autograd.grad(logprob.sum(), features, retain_graph=True)
    (log_std_grad,) = torch.autograd.grad(logprob.sum(), head.log_std)
    mean_only = torch.autograd.grad(
        (-0.5 * ((actions - head.mode(features)) / head._scale(features)).pow(2)).sum(), features
    )[0]
    torch.testing.assert_close(features_grad, mean_only)  # the std's features are detached, as SB3's
    assert log_std_grad.abs().sum() > 0


def test_with_one_noise_matrix_the_action_is_a_function_of_the_state():
    torch.manual_seed(0)
    agent = MLPActorCritic(3, BOX, state_dependent=True)
    generator = torch.Generator().manual_seed(0)
    matrices = agent.exploration_matrices(2, generator)
    obs = torch.randn(1, 3).expand(2, 3)
    same_matrix = matrices[:1].expand(2, -1, -1)
    first, _, _ = agent.act(obs, None, same_matrix)
    assert torch.equal(first[0], first[1])  # the same state and matrix: the same action
    again, _, _ = agent.act(obs, None, same_matrix)
    assert torch.equal(first, again)  # no fresh draw between steps
    other, _, _ = agent.act(obs, None, matrices)
    assert not torch.equal(other[0], other[1])  # another env's matrix perturbs the same state otherwise


class CountingPolicy:
    def __init__(self) -> None:
        self.draws = 0

    def exploration_matrices(self, rows: int, generator: torch.Generator) -> torch.Tensor:
        self.draws += 1
        return torch.full((rows, 1, 1), float(self.draws))


@pytest.mark.parametrize(("sample_freq", "drawn_at"), [(-1, [0]), (4, [0, 4]), (3, [0, 3, 6])])
def test_the_noise_is_drawn_at_each_collection_start_and_every_sample_freq_steps(sample_freq, drawn_at):
    exploration, policy, generator = StateDependentExploration(sample_freq), CountingPolicy(), torch.Generator()
    for collection in range(2):
        draws_before = policy.draws
        seen = [float(exploration.for_step(policy, step, 2, generator)[0, 0, 0]) for step in range(8)]
        fresh = [step for step in range(8) if step == 0 or seen[step] != seen[step - 1]]
        assert fresh == drawn_at, collection
        assert policy.draws - draws_before == len(drawn_at)


def test_the_sac_actor_scores_its_sample_by_the_squashed_state_dependent_gaussian():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, BOX, hidden=(16, 8), state_dependent=True, log_std_init=-1.0)
    obs, noise = torch.randn(32, 3), actor.noise(32, torch.Generator().manual_seed(2))
    assert noise.shape == (8, 2)  # one matrix that the whole batch shares, as SB3's training step
    with torch.no_grad():
        action, logprob = actor(obs, noise)
        hidden = actor._hidden(obs)
        mean = actor._sde_mean(hidden)
        std = actor.log_std.exp()
        scale = (hidden.pow(2) @ std.pow(2) + 1e-6).sqrt()
    bias, span = actor.action_bias, actor.action_scale
    reference = TransformedDistribution(
        Independent(Normal(mean, scale), 1), [TanhTransform(), AffineTransform(bias, span)]
    )
    rows = ((action - bias).abs() < 0.99 * span).all(-1)  # the reference's atanh loses precision at the bounds
    torch.testing.assert_close(logprob[rows], reference.log_prob(action)[rows], rtol=1e-4, atol=1e-4)
    assert rows.sum() > 20
    greedy = actor.greedy_action(obs)
    torch.testing.assert_close(greedy, torch.tanh(mean) * span + bias)
    assert (mean.abs() <= 2.0).all()  # SB3 clips gSDE's mean before the squash


def test_sac_actor_loss_trains_the_std_through_the_noise_matrix():
    actor = SquashedGaussianActor(3, BOX, hidden=8, state_dependent=True)
    action, logprob = actor(torch.randn(16, 3), actor.noise(16, torch.Generator().manual_seed(0)))
    (action.sum() + logprob.sum()).backward()
    assert actor.log_std.grad is not None and actor.log_std.grad.abs().sum() > 0


def test_use_sde_is_refused_for_discrete_actions_with_one_line(tmp_path):
    line = refusal_line("fabric", ["--env-id", "CartPole-v1", "--use-sde"], tmp_path)
    assert line.startswith("error: --use-sde: state-dependent exploration perturbs continuous actions")


SHORT = ["--eval-episodes", "0", "--no-progress-bar", "--use-sde", "--sde-sample-freq", "4"]
PPO_RUN = [*SHORT, "--env-id", "Pendulum-v1", "--update-epochs", "2", "--num-steps", "64"]
SAC_RUN = [
    "sac",
    *SHORT,
    "--learning-starts",
    "64",
    "--batch-size",
    "32",
    "--train-freq",
    "8",
    "--gradient-steps",
    "2",
    "--net-arch",
    "32",
    "32",
    "--save-buffer",
]


@pytest.mark.parametrize(("algorithm", "args", "steps"), [("ppo", PPO_RUN, 512), ("sac", SAC_RUN, 256)])
def test_a_resumed_gsde_run_equals_an_uninterrupted_one(tmp_path, algorithm, args, steps):
    """Two ranks, checkpointed halfway: the resumed run's noise matrices are the uninterrupted run's."""
    (tmp_path / "whole").mkdir()
    (tmp_path / "half").mkdir()
    whole, half = launch_together(
        ("fabric run", SCRIPTS["fabric"], [*args, "--total-timesteps", str(steps)], tmp_path / "whole", 2),
        ("fabric run", SCRIPTS["fabric"], [*args, "--total-timesteps", str(steps // 2)], tmp_path / "half", 2),
        via=run_ranks,
    )
    assert whole.returncode == 0 and half.returncode == 0, (whole.stderr + half.stderr)[-3000:]
    (checkpoint,) = sorted((run_dir(tmp_path / "half", "fabric") / "checkpoints").glob("step_*.ckpt"))
    resumed = run_ranks(
        "fabric run",
        SCRIPTS["fabric"],
        [*args, "--total-timesteps", str(steps), "--resume-from", str(checkpoint)],
        tmp_path / "half",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    uninterrupted = load_agent(run_dir(tmp_path / "whole", "fabric"))["policy"]
    continued = load_agent(run_dir(tmp_path / "half", "fabric"))["policy"]
    assert any(name.endswith("log_std") and tensor.dim() == 2 for name, tensor in continued.items())  # gSDE's
    assert all(torch.equal(uninterrupted[name], continued[name]) for name in uninterrupted)


@pytest.mark.parametrize(
    ("script", "args", "nproc"),
    [
        ("decoupled", [*PPO_RUN, "--total-timesteps", "512"], 3),
        ("decoupled", [*SAC_RUN, "--total-timesteps", "256"], 3),
        ("hogwild", [*PPO_RUN, "--total-timesteps", "512", "--workers", "2"], 1),
        pytest.param("hogwild", [*SAC_RUN, "--total-timesteps", "256", "--workers", "2"], 1, marks=pytest.mark.slow),
    ],
    ids=["decoupled-ppo", "decoupled-sac", "hogwild-ppo", "hogwild-sac"],
)
def test_gsde_trains_in_the_decoupled_and_hogwild_modes(tmp_path, script, args, nproc):
    launcher = "fabric run" if script == "decoupled" else "python"
    finished = run_ranks(launcher, SCRIPTS[script], args, tmp_path, nproc=nproc)
    assert finished.returncode == 0, finished.stderr[-3000:]
    agent = load_agent(run_dir(tmp_path, script))
    assert agent["config"]["use_sde"] and any(name.endswith("log_std") for name in agent["policy"])
