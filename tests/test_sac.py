"""SAC's pieces: the squashed Gaussian, the critic target, the ensemble, the replay buffer, the collector."""

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

from rl.algos.sac.algorithm import SAC
from rl.algos.sac.collector import Transitions, transition_columns
from rl.algos.sac.config import SACConfig
from rl.algos.sac.learner import SACLearner, StatMeans
from rl.algos.sac.losses import actor_loss, critic_loss, soft_target, temperature_loss
from rl.algos.sac.networks import CriticEnsemble, SquashedGaussianActor
from rl.algos.sac.replay import ReplayBuffer, check_buffer_fits
from rl.batch import Column, DataShard
from rl.config import validate_decoupled
from rl.envs import inspect_env
from rl.errors import UsageError
from rl.runtime import TorchRuntime
from rl.seeds import LEARNER_STREAM, derive_seed

BOX = gym.spaces.Box(low=torch.tensor([-2.0, 0.0]).numpy(), high=torch.tensor([2.0, 1.0]).numpy())


def test_squashed_log_prob_matches_torch_transformed_distribution():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(obs_dim=3, action_space=BOX, hidden=16)
    obs, noise = torch.randn(64, 3), torch.randn(64, 2)
    with torch.no_grad():
        action, logprob = actor(obs, noise)
        mean, log_std = actor.distribution(obs)
    scale, bias = actor.action_scale, actor.action_bias
    reference = TransformedDistribution(
        Independent(Normal(mean, log_std.exp()), 1), [TanhTransform(), AffineTransform(bias, scale)]
    )
    assert ((action >= bias - scale) & (action <= bias + scale)).all()
    # the reference inverts the action through atanh, which loses precision near the bounds
    inside = (action - bias).abs() < 0.99 * scale
    rows = inside.all(-1)
    torch.testing.assert_close(logprob[rows], reference.log_prob(action)[rows], rtol=1e-4, atol=1e-4)
    assert rows.sum() > 40


def test_squashed_log_prob_stays_finite_where_tanh_saturates():
    actor = SquashedGaussianActor(obs_dim=1, action_space=BOX, hidden=4)
    with torch.no_grad():
        actor.mean.bias.fill_(40.0)  # tanh(40) is 1.0 in float32
    action, logprob = actor(torch.zeros(2, 1), torch.zeros(2, 2))
    assert torch.isfinite(logprob).all()
    torch.testing.assert_close(action, (actor.action_bias + actor.action_scale).expand(2, -1))


def test_greedy_action_is_the_squashed_mean_and_sampling_follows_its_generator():
    torch.manual_seed(1)
    actor = SquashedGaussianActor(3, BOX, hidden=8)
    obs = torch.randn(5, 3)
    mean, _ = actor.distribution(obs)
    torch.testing.assert_close(actor.greedy_action(obs), torch.tanh(mean) * actor.action_scale + actor.action_bias)
    first = actor.act(obs, torch.Generator().manual_seed(3))[0]
    torch.manual_seed(99)
    assert torch.equal(first, actor.act(obs, torch.Generator().manual_seed(3))[0])


def test_the_critic_target_bootstraps_after_truncation_but_not_termination():
    rewards, next_q = torch.tensor([1.0, 1.0]), torch.tensor([[10.0, 10.0], [4.0, 4.0]])  # min over critics: 4
    next_logprob, alpha = torch.tensor([-1.0, -1.0]), torch.tensor(0.5)
    terminated = torch.tensor([1.0, 0.0])  # the second transition was truncated (or ran on)
    target = soft_target(rewards, terminated, next_q, next_logprob, alpha, gamma=0.9)
    assert target.tolist() == pytest.approx([1.0, 1.0 + 0.9 * (4.0 + 0.5)])


def test_losses():
    q_values, target = torch.tensor([[1.0, 3.0], [2.0, 2.0]]), torch.tensor([1.0, 1.0])
    assert critic_loss(q_values, target).item() == pytest.approx(0.5 * (2.0 + 1.0))
    logprob, alpha = torch.tensor([-1.0, 1.0]), torch.tensor(0.1)
    assert actor_loss(logprob, q_values, alpha).item() == pytest.approx(((-0.1 - 1.0) + (0.1 - 2.0)) / 2)
    log_alpha = torch.zeros(1, requires_grad=True)
    temperature_loss(log_alpha, torch.tensor([-3.0, -1.0]), target_entropy=-1.0).backward()
    assert log_alpha.grad.item() == pytest.approx(3.0)  # entropy 2 > target 1: alpha goes down


def test_the_critic_ensemble_equals_separate_critics_and_detaches_on_request():
    torch.manual_seed(0)
    critics = CriticEnsemble(feature_dim=3, action_dim=2, hidden=8)
    obs, action = torch.randn(4, 3), torch.randn(4, 2, requires_grad=True)
    q_values = critics(obs, action)
    x = torch.cat([obs, action], -1)
    for member in range(2):
        hidden = torch.relu(x @ critics.w1[member] + critics.b1[member])
        hidden = torch.relu(hidden @ critics.w2[member] + critics.b2[member])
        torch.testing.assert_close(q_values[member], (hidden @ critics.w3[member] + critics.b3[member]).squeeze(-1))
    critics.q_values_of_actions(obs, action).sum().backward()
    assert action.grad is not None and all(p.grad is None for p in critics.parameters())


def test_the_buffer_wraps_around_and_samples_what_it_holds():
    buffer = ReplayBuffer(5, {"x": Column(()), "y": Column((2,))}, torch.device("cpu"))
    for start in (0, 3, 6):  # 3 rows each: the third add straddles the end of the ring
        rows = torch.arange(start, start + 3, dtype=torch.float32)
        buffer.add(x=rows, y=rows[:, None].expand(-1, 2))
    assert len(buffer) == 5 and buffer.position == 4
    assert buffer.storage["x"].tolist() == [5.0, 6.0, 7.0, 8.0, 4.0]
    sample = buffer.sample(200, torch.Generator().manual_seed(0))
    assert set(sample["x"].tolist()) == {4.0, 5.0, 6.0, 7.0, 8.0}
    assert torch.equal(sample["y"][:, 0], sample["x"]) and torch.equal(sample["y"][:, 1], sample["x"])
    again = ReplayBuffer(5, buffer.columns, torch.device("cpu"))
    again.load_state_dict(buffer.state_dict())
    assert torch.equal(
        again.sample(7, torch.Generator().manual_seed(1))["x"], buffer.sample(7, torch.Generator().manual_seed(1))["x"]
    )


def saved_buffer(capacity: int, *values: float) -> dict:
    buffer = ReplayBuffer(capacity, {"x": Column(()), "y": Column((2,))}, torch.device("cpu"))
    for value in values:
        buffer.add(x=torch.tensor([value]), y=torch.tensor([[value, -value]]))
    return buffer.state_dict()


def test_saved_buffers_are_shared_out_by_age_among_more_or_fewer_buffers():
    # Two ranks' buffers of 4, the first wrapped round its ring: rows 10..15 oldest first hold 12..15.
    saved = [saved_buffer(4, 10, 11, 12, 13, 14, 15), saved_buffer(4, 20, 21, 22, 23)]
    one = ReplayBuffer(8, {"x": Column(()), "y": Column((2,))}, torch.device("cpu"))
    one.load_share(saved, 0, 1)
    assert one.storage["x"].tolist() == [12, 20, 13, 21, 14, 22, 15, 23]  # in step by age, oldest first
    assert (len(one), one.position) == (8, 0)
    assert torch.equal(one.storage["y"][:, 1], -one.storage["x"])
    shares = []
    for rank in range(3):
        three = ReplayBuffer(3, one.columns, torch.device("cpu"))
        three.load_share(saved, rank, 3)
        shares.append(three.storage["x"][: len(three)].tolist())
    assert shares == [[12, 21, 15], [20, 14, 23], [13, 22]]  # every row once, each share of every age
    small = ReplayBuffer(2, one.columns, torch.device("cpu"))
    small.load_share(saved, 0, 1)  # 8 rows for a capacity of 2: the newest stay
    assert small.storage["x"].tolist() == [15, 23] and (len(small), small.position) == (2, 0)
    small.add(x=torch.tensor([30.0]), y=torch.tensor([[30.0, -30.0]]))  # overwrites the oldest
    assert small.storage["x"].tolist() == [30, 23]


def test_a_saved_buffer_holds_its_filled_rows_only(tmp_path):
    buffer = ReplayBuffer(100_000, {"obs": Column((17,))}, torch.device("cpu"))
    buffer.add(obs=torch.ones(10, 17))
    torch.save(buffer.state_dict(), tmp_path / "buffer.pt")
    assert (tmp_path / "buffer.pt").stat().st_size < 10_000  # 10 rows of 68 bytes, not the 6.8 MB allocated


def test_a_buffer_that_cannot_fit_is_refused_before_allocation():
    with pytest.raises(
        UsageError, match=r"^--buffer-size: 2 replay buffers of 10,000,000,000,000 transitions need"
    ) as error:
        check_buffer_fits(10**13, {"obs": Column((100,))}, processes_here=2)
    assert str(error.value).endswith("GiB available; lower --buffer-size")
    assert error.value.flag == "--buffer-size"
    check_buffer_fits(1000, {"obs": Column((100,))}, processes_here=2)


def test_truncated_transitions_store_the_true_final_observation():
    cfg = SACConfig(num_envs=2, learning_starts=10**6, buffer_size=64, batch_size=4)
    algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=4)
    source.envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make("Pendulum-v1", max_episode_steps=3)] * 2,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    )
    source.reset_envs([0, 1])
    observed = []
    for step in range(4):
        before = source.raw_obs.clone()
        source.collect(None, step)
        observed.append((before, source.raw_obs.clone()))
    storage = source.buffer.storage
    assert storage["terminated"][:8].sum() == 0  # Pendulum only truncates
    # steps 0-2 make one episode per env; step 3 starts the next from a reset
    for step in range(4):
        assert torch.equal(storage["obs"][2 * step : 2 * step + 2], observed[step][0])
    assert torch.equal(storage["next_obs"][0:2], observed[0][1])  # mid-episode: the next observation
    assert not torch.equal(storage["next_obs"][4:6], observed[2][1])  # the last step: not the reset's
    assert torch.equal(storage["obs"][6:8], observed[2][1])  # the reset's observation opens the next episode
    final = source.led_to(observed[2][1].numpy(), np.array([True, False]), {"final_obs": [np.ones(3), None]})
    assert final[0].tolist() == [1.0, 1.0, 1.0] and final[1].tolist() == observed[2][1][1].tolist()


@pytest.mark.parametrize("saved_buffer", [True, False], ids=["with its buffer", "without its buffer"])
def test_a_resumed_run_trains_again_once_its_buffer_holds_its_share_of_learning_starts(saved_buffer):
    cfg = SACConfig(num_envs=2, learning_starts=40, buffer_size=256, batch_size=4, save_buffer=saved_buffer)
    algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
    actor = algorithm.build_policy(torch.device("cpu"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=2, batch_rows=4)
    source.reset_envs([0, 1])
    for step in range(0, 24, 4):  # 6 vector steps: 12 of this rank's rows, 24 global steps
        source.collect(None, step)
    state = source.capture_state()
    resumed = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=2, batch_rows=4)
    resumed.restore_state(state, fresh_seeds=[0, 1])
    assert len(resumed.buffer) == (12 if saved_buffer else 0)
    for step in range(100, 136, 4):  # 9 more vector steps: 18 rows, to 30 with the buffer
        resumed.collect(actor, step)
        rows, share = len(resumed.buffer), 20  # this rank's half of 40 global steps
        trains = resumed.next_batch(step, None) is not None
        assert trains == (rows >= 4 if saved_buffer else rows >= share), rows


def one_process_learner(**changes) -> tuple[SAC, SACLearner]:
    cfg = SACConfig(batch_size=8, **changes)
    algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
    runtime = TorchRuntime(cfg, 1)
    policy = algorithm.build_policy(runtime.device)
    return algorithm, algorithm.make_learner(policy, runtime, DataShard(algorithm.batch_rows(1)), env_ranks=1)


def random_transitions(rows: int, seed: int = 0) -> Transitions:
    generator = torch.Generator().manual_seed(seed)
    columns = transition_columns(inspect_env("Pendulum-v1"))
    values = {name: torch.rand((rows, *column.shape), generator=generator) for name, column in columns.items()}
    values["terminated"] = (values["terminated"] > 0.8).float()
    return Transitions(**values)


def test_one_backward_gives_each_network_the_gradient_of_its_own_loss_alone():
    _, learner = one_process_learner()
    batch = random_transitions(8)

    def gradients_of(pick) -> torch.Tensor:
        learner.gradients.buffer.zero_()
        learner.noise.manual_seed(0)
        stats = StatMeans()
        features = learner.policy.encode(batch.obs)
        critic = learner.critic_loss(batch, features, learner.policy.noise(8, learner.noise), stats)
        actor = learner.actor_and_temperature_loss(features.detach(), learner.policy.noise(8, learner.noise), stats)
        pick(critic, actor).backward()
        return learner.gradients.buffer.clone()

    joint = gradients_of(lambda critic, actor: critic + actor)
    critic_only, actor_only = gradients_of(lambda critic, _: critic), gradients_of(lambda _, actor: actor)
    critic_size = learner.gradients.span(learner.CRITIC, learner.CRITIC).numel()
    assert actor_only[:critic_size].eq(0).all()  # the actor's loss sees the critics through detached weights
    assert critic_only[critic_size:].eq(0).all()  # the target carries no gradient into the actor
    assert torch.equal(joint, critic_only + actor_only) and joint[critic_size:].ne(0).any()
    assert learner.log_alpha.grad.ne(0).all()  # the temperature's gradient is in the same buffer


def test_update_takes_gradient_steps_and_moves_targets_and_temperature():
    _, learner = one_process_learner(gradient_steps=3, policy_frequency=2, tau=0.5)
    target_before = [p.clone() for p in learner.critic_target.parameters()]
    stats = learner.update(random_transitions(24), iteration=1)
    assert learner.gradient_steps == 3
    assert set(stats) == {"critic_loss", "q_values", "actor_loss", "entropy", "alpha_loss", "alpha", "gradient_step_ms"}
    assert all(math.isfinite(float(value)) for value in stats.values())
    assert not torch.equal(target_before[0], learner.critic_target.w1)
    assert learner.alpha.item() != 1.0  # log_alpha took a step from 0
    # The targets move outside autograd: no history that would grow with every update.
    assert all(p.is_leaf and p.grad_fn is None and not p.requires_grad for p in learner.target_tensors())


@pytest.mark.parametrize("after_critics", [False, True])
def test_the_actor_loss_sees_the_critics_before_their_update_or_after_it_as_asked(after_critics):
    _, learner = one_process_learner(actor_after_critics=after_critics)
    batch = random_transitions(8)
    actor, alpha = copy.deepcopy(learner.policy), learner.alpha.clone()
    critics = {"before": copy.deepcopy(learner.critic)}
    stats = learner.update(batch, iteration=1)
    critics["after"] = learner.critic
    learner.noise.manual_seed(derive_seed(learner.cfg.seed, LEARNER_STREAM, 0, 1))  # the update's own draws
    _, actor_noise = learner.draw_noise(8, actor_steps=1)
    with torch.no_grad():
        features = actor.encode(batch.obs)
        actions, logprob = actor.from_features(features, actor_noise)
        losses = {
            when: actor_loss(logprob, critic.q_values_of_actions(features, actions), alpha)
            for when, critic in critics.items()
        }
    seen, other = ("after", "before") if after_critics else ("before", "after")
    torch.testing.assert_close(stats["actor_loss"], losses[seen], rtol=0, atol=1e-6)
    assert (losses[other] - losses[seen]).abs() > 1e-4  # the critics' step moved the loss: the test tells them apart


def test_auto_with_a_start_tunes_the_temperature_from_that_start():
    """Stable-Baselines3's 'auto_0.1': tuned, as 'auto', but from 0.1 instead of 1.0."""
    _, learner = one_process_learner(ent_coef="auto_0.1")
    assert learner.alpha.item() == pytest.approx(0.1)
    stats = learner.update(random_transitions(8), iteration=1)
    assert "alpha_loss" in stats and learner.alpha.item() != pytest.approx(0.1, abs=1e-7)


def test_a_fixed_entropy_coefficient_is_not_tuned():
    _, learner = one_process_learner(ent_coef="0.2")
    stats = learner.update(random_transitions(8), iteration=1)
    assert "alpha_loss" not in stats and stats["alpha"].item() == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"buffer_size": 0}, "--buffer-size"),
        ({"batch_size": 0}, "--batch-size"),
        ({"tau": 0.0}, "--tau"),
        ({"tau": 1.5}, "--tau"),
        ({"train_freq": 0}, "--train-freq"),
        ({"gradient_steps": 0}, "--gradient-steps"),
        ({"ent_coef": "hot"}, "--ent-coef"),
        ({"ent_coef": "-0.1"}, "--ent-coef"),
        ({"ent_coef": "auto_x"}, "--ent-coef"),
        ({"ent_coef": "auto_0"}, "--ent-coef"),
        ({"target_entropy": "low"}, "--target-entropy"),
        ({"ent_coef": "inf"}, "--ent-coef"),  # no number a loss can be scaled by
        ({"ent_coef": "auto_1e400"}, "--ent-coef"),
        ({"target_entropy": "-inf"}, "--target-entropy"),
        ({"target_entropy": "nan"}, "--target-entropy"),
        ({"policy_lr": 0.0}, "--policy-lr"),
        ({"q_lr": -1.0}, "--q-lr"),
        ({"policy_frequency": 0}, "--policy-frequency"),
        ({"target_network_frequency": 0}, "--target-network-frequency"),
        ({"learning_starts": -1}, "--learning-starts"),
        ({"buffer_size": 10, "batch_size": 32}, "--buffer-size"),
        ({"total_timesteps": 0}, "--total-timesteps"),
        ({"learning_starts": 10_000, "total_timesteps": 10_000}, "--learning-starts"),  # no gradient step
    ],
)
def test_bad_sac_values_name_their_flag(changes, flag):
    from rl.config import validate

    cfg = SACConfig(**changes)
    with pytest.raises(UsageError) as error:
        validate(cfg, world_size=1, gpu_count=0)
    assert error.value.flag == flag


def test_learning_starts_is_checked_against_the_steps_the_run_trains_not_the_total_asked_for():
    from rl.config import validate

    # Two ranks step 2 envs each: whole global iterations of 4 steps, so 10,003 trains 10,000, all before learning.
    cfg = SACConfig(num_envs=2, learning_starts=10_000, total_timesteps=10_003)
    with pytest.raises(UsageError, match="10000 is not below the 10000 steps that --total-timesteps 10003 trains"):
        validate(cfg, world_size=2, gpu_count=0)
    validate(SACConfig(num_envs=2, learning_starts=10_000, total_timesteps=10_004), world_size=2, gpu_count=0)


def test_a_batch_larger_than_what_each_replay_buffer_receives_is_refused_since_no_gradient_step_would_run():
    from rl.config import validate

    # Each of 2 ranks' buffers receives half of the 2,000 steps: a batch of 1,001 is never there to sample.
    cfg = SACConfig(batch_size=1001, learning_starts=100, total_timesteps=2000)
    with pytest.raises(UsageError) as error:
        validate(cfg, world_size=2, gpu_count=0)
    assert str(error.value) == (
        "--batch-size: 1001 is more than the 1000 transitions that each of the 2 acting processes collects of "
        "--total-timesteps 2000: the run would end before its first gradient step"
    )
    validate(SACConfig(batch_size=1000, learning_starts=100, total_timesteps=2000), world_size=2, gpu_count=0)


def test_envs_sac_cannot_train_on_are_refused_with_what_to_do():
    with pytest.raises(UsageError, match=r"SAC needs continuous \(Box\) actions") as error:
        SAC.check_spaces(inspect_env("CartPole-v1"))
    assert error.value.flag == "--env-id"
    assert "but CartPole-v1 has Discrete actions; " in str(error.value)  # the kind, whatever space the policy acts in
    assert str(error.value).endswith("train it with PPO instead (no 'sac' subcommand, or a PPOConfig)")  # CLI, Python


def test_unbounded_actions_are_refused():
    spaces = inspect_env("Pendulum-v1")
    unbounded = type(spaces)(
        spaces.env_id, spaces.obs_dim, gym.spaces.Box(-math.inf, math.inf, (1,)), spaces.observation_space
    )
    with pytest.raises(UsageError, match="not finite"):
        SAC.check_spaces(unbounded)


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5", "Humanoid-v5"])
def test_the_mujoco_envs_sac_is_run_on_collect_and_learn(env_id):
    # gymnasium's MuJoCo envs come with the `mujoco` extra (and `dev`, so these run in CI).
    spaces = inspect_env(env_id)
    SAC.check_spaces(spaces)
    cfg = SACConfig(env_id=env_id, num_envs=2, learning_starts=8, batch_size=8, buffer_size=64)
    algorithm = SAC(cfg, spaces)
    runtime = TorchRuntime(cfg, 1)
    policy = algorithm.build_policy(runtime.device)
    learner = algorithm.make_learner(policy, runtime, DataShard(algorithm.batch_rows(1)), env_ranks=1)
    source = algorithm.make_source(0, runtime.device, None, env_ranks=1, batch_rows=algorithm.batch_rows(1))
    batches = 0
    for iteration in range(1, 9):
        source.collect(policy, 2 * (iteration - 1))
        batch = source.next_batch(2 * iteration, lambda tensor: tensor)
        if batch is not None:
            batches += 1
            assert all(math.isfinite(float(value)) for value in learner.update(batch, iteration).values())
    source.close()
    assert batches == 4  # iterations 5 to 8: past --learning-starts (global step 10 > 8), a batch in the buffer


def test_train_freq_steps_the_envs_that_many_times_per_iteration():
    cfg = SACConfig(num_envs=2, train_freq=3, learning_starts=0, batch_size=4, buffer_size=64)
    algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=4)
    policy = algorithm.build_policy(torch.device("cpu"))
    source.collect(policy, 0)
    assert len(source.buffer) == 6 and cfg.steps_per_iteration == 6


@pytest.mark.parametrize("while_stepping", [False, True], ids=["after the steps", "while the last step runs"])
def test_a_phase_learns_after_its_steps_or_while_the_last_runs_with_its_actions_chosen_before(while_stepping):
    """The update (here: every weight of the actor moved by 1) never changes the phase's actions; started while
    the last step runs, it sees the rows stored before that step."""

    def phase(update_while_stepping: bool) -> tuple[ReplayBuffer, list[int]]:
        cfg = SACConfig(
            num_envs=2,
            train_freq=3,
            learning_starts=0,
            batch_size=4,
            buffer_size=64,
            update_while_stepping=update_while_stepping,
        )
        algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
        policy = algorithm.build_policy(torch.device("cpu"))
        source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=4)
        rows_seen = []

        def learn() -> None:
            rows_seen.append(len(source.buffer))
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.add_(1.0)

        source.collect_and_learn(policy, 0, learn)
        return source.buffer, rows_seen

    learned_after, _ = phase(False)
    buffer, rows_seen = phase(while_stepping)
    assert rows_seen == ([4] if while_stepping else [6])  # 2 envs x 3 steps; the last step's 2 rows come after
    assert len(buffer) == 6 and torch.equal(buffer.storage["actions"], learned_after.storage["actions"])


def test_update_while_stepping_is_refused_in_decoupled_mode():
    with pytest.raises(UsageError, match="a decoupled trainer has none") as error:
        validate_decoupled(SACConfig(update_while_stepping=True), world_size=2)
    assert error.value.flag == "--update-while-stepping"


@pytest.mark.parametrize(
    ("argv", "while_stepping", "reloaded_with_cuda"),
    [
        (["sac"], False, True),  # a default, left out of the file: it follows the reloading run's --cuda
        (["sac", "--cuda"], True, True),  # the faster setting on a GPU
        (["sac", "--cuda", "--no-update-while-stepping"], False, False),  # a choice stays
        (["sac", "--update-while-stepping"], True, True),
    ],
)
def test_updates_overlap_the_envs_step_by_default_on_a_gpu_and_a_choice_stays(
    tmp_path, argv, while_stepping, reloaded_with_cuda
):
    from rl.cli import parse_config
    from rl.config_files import write_config_file

    cfg = parse_config(argv)
    assert cfg.update_while_stepping is while_stepping
    if "--update-while-stepping" not in argv:
        validate_decoupled(cfg, world_size=2)  # a default is never refused: a decoupled player has no update
    path = str(tmp_path / "written.yaml")
    write_config_file(cfg, path)
    assert parse_config(["--config", path, "--cuda"]).update_while_stepping is reloaded_with_cuda


def test_targets_move_every_target_network_frequency_steps_and_the_target_entropy_is_taken():
    _, learner = one_process_learner(target_network_frequency=2, target_entropy="-3")
    assert learner.target_entropy == -3.0
    before = learner.critic_target.w1.clone()
    learner.update(random_transitions(8), iteration=1)
    assert torch.equal(learner.critic_target.w1, before)  # the first gradient step leaves the targets
    learner.update(random_transitions(8, seed=1), iteration=2)
    assert not torch.equal(learner.critic_target.w1, before)


def test_a_diverged_critic_skips_its_step_and_stops_training_at_the_check():
    from rl.optim import TrainingDiverged

    _, learner = one_process_learner()
    weights = [tensor.detach().clone() for tensor in learner.weight_tensors()]
    batch = random_transitions(8)
    batch.rewards[0] = math.inf
    learner.update(batch, iteration=1)
    assert all(torch.equal(now, before) for now, before in zip(learner.weight_tensors(), weights, strict=True))
    with pytest.raises(TrainingDiverged, match="not finite"):
        learner.raise_if_diverged()


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"precision": "16-mixed"}, "loss scaler"),
        ({"compile": True, "compile_mode": "reduce-overhead"}, "both capture CUDA graphs"),
    ],
)
def test_cuda_graphs_refuse_what_a_captured_step_cannot_hold(changes, words):
    from rl.config import check_cuda_graphs

    check_cuda_graphs(SACConfig(cuda=True, cuda_graphs=True))
    with pytest.raises(UsageError, match=words) as refused:
        check_cuda_graphs(SACConfig(cuda=True, cuda_graphs=True, **changes))
    assert refused.value.flag == "--cuda-graphs"


def test_cuda_graphs_capture_several_learners_only_when_asked():
    from rl.cli import parse_config
    from rl.cuda_graphs import learner_captured

    asked = parse_config(["sac", "--cuda", "--cuda-graphs"])
    assert learner_captured(asked, learners=1) and learner_captured(asked, learners=2)
    by_default = parse_config(["sac", "--cuda"])
    assert by_default.cuda_graphs and learner_captured(by_default, learners=1)
    assert not learner_captured(by_default, learners=2)  # not yet measured on several GPUs
    assert not learner_captured(parse_config(["sac", "--cuda", "--no-cuda-graphs"]), learners=1)


def test_a_changed_copy_of_a_config_keeps_its_choices_in_the_file_it_writes(tmp_path):
    """As Hogwild's supervisor writes its run folder's config.yaml: from a copy with its own loggers."""
    from rl.cli import parse_config
    from rl.config_files import write_config_file

    path = str(tmp_path / "config.yaml")
    write_config_file(parse_config(["sac", "--update-while-stepping"]).with_changes(logger=("tensorboard",)), path)
    assert parse_config(["--config", path]).update_while_stepping
