"""Recurrent PPO: the LSTM's state across steps and episodes, sequence replay, and every mode with real processes."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    SCRIPTS,
    all_scalars,
    launch_together,
    load_agent,
    needs_envpool,
    read_scalars,
    refusal_line,
    run_dir,
    run_ranks,
)

from rl.algos.ppo.algorithm import PPO
from rl.algos.ppo.config import PPOConfig
from rl.algos.ppo.recurrent import RecurrentActorCritic, replay_lstm
from rl.algos.ppo.rollout import SequenceBatch
from rl.envs import inspect_env

MASKED = "rl/MaskedCartPole-v1"
# 4 envs x 64 steps per rank; minibatches of 2 whole sequences
RECURRENT = [
    "--env-id",
    MASKED,
    "--recurrent",
    "--lstm-hidden-size",
    "16",
    "--num-envs",
    "4",
    "--num-steps",
    "64",
    "--per-rank-batch-size",
    "128",
    "--update-epochs",
    "2",
    "--no-progress-bar",
]


def stepwise(agent: RecurrentActorCritic, obs, starts, memory, actions):
    """Acting's view: one LSTM step at a time from `memory`; log-probs and values [T, B]."""
    logprobs, values = [], []
    for t in range(obs.shape[0]):
        features, memory = agent._step(obs[t], memory, starts[t])
        logprobs.append(agent.action_head.log_prob_entropy(features, actions[t])[0])
        values.append(agent._value(features))
    return torch.stack(logprobs), torch.stack(values)


@pytest.mark.parametrize("in_steps", [False, True], ids=["segments", "in-steps"])
@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))], ids=["discrete", "box"])
def test_replaying_sequences_gives_what_stepping_gave(space, in_steps):
    torch.manual_seed(0)
    steps, envs = 12, 5
    agent = RecurrentActorCritic(
        3, space, cnn=None, pixels=False, lstm_hidden=8, lstm_layers=2, replay_in_steps=in_steps
    )
    obs, memory = torch.randn(steps, envs, 3), torch.randn(2, 2, envs, 8)
    starts = torch.rand(steps, envs) < 0.25
    starts[0, 1] = starts[5, 1] = starts[6, 1] = True  # a start on the first step, and one-step episodes
    actions = torch.stack([agent.act(obs[0], None, memory, starts[0])[0]] * steps)
    with torch.no_grad():
        logprobs, values = stepwise(agent, obs, starts, memory, actions)
        replayed, _, replayed_values = agent(
            obs.transpose(0, 1), actions.transpose(0, 1), starts.transpose(0, 1), memory.permute(2, 0, 1, 3)
        )
    torch.testing.assert_close(replayed, logprobs.transpose(0, 1).reshape(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(replayed_values, values.transpose(0, 1).reshape(-1), rtol=0, atol=1e-5)


def random_sequences(agent: RecurrentActorCritic, batch: int, steps: int, generator: torch.Generator):
    """A forward's inputs for `batch` sequences of `steps`: obs, actions, starts and each sequence's memory."""
    obs = torch.randn(batch, steps, 3, generator=generator)
    starts = torch.rand(batch, steps, generator=generator) < 0.25
    memory = torch.randn(batch, 2, agent.lstm.num_layers, agent.lstm.hidden_size, generator=generator)
    actions = torch.randint(0, 3, (batch, steps), generator=generator)
    return obs, actions, starts, memory


def test_both_replays_give_the_same_losses_and_gradients():
    """Step by step (what --compile and --cuda-graphs train with) and by planned segments (cuDNN's and the CPU's
    one LSTM call): the same arithmetic, summed in another order."""
    torch.manual_seed(0)
    agent = RecurrentActorCritic(3, gym.spaces.Discrete(3), cnn=None, pixels=False, lstm_hidden=8, lstm_layers=2)
    inputs = random_sequences(agent, 6, 10, torch.Generator().manual_seed(1))
    results = []
    for in_steps in (False, True):
        agent.replay_in_steps = in_steps
        agent.zero_grad()
        outputs = agent(*inputs)
        sum(output.square().sum() for output in outputs).backward()
        results.append([*outputs, *(parameter.grad.clone() for parameter in agent.parameters())])
    for segments, in_steps in zip(*results, strict=True):
        torch.testing.assert_close(in_steps, segments, rtol=1e-5, atol=1e-5)


def test_the_replay_in_steps_traces_as_one_graph_that_no_batch_recompiles():
    """Its shapes are the minibatch's alone: other episode starts neither break the graph nor recompile it."""
    torch._dynamo.reset()
    agent = RecurrentActorCritic(
        3, gym.spaces.Discrete(3), cnn=None, pixels=False, lstm_hidden=8, lstm_layers=2, replay_in_steps=True
    )
    replay = torch.compile(agent, backend="eager", fullgraph=True)  # fullgraph: a graph break raises
    generator = torch.Generator().manual_seed(0)
    replay(*random_sequences(agent, 4, 10, generator))
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(3):
            replay(*random_sequences(agent, 4, 10, generator))


def test_an_episode_start_zeroes_that_envs_state_alone():
    torch.manual_seed(0)
    agent = RecurrentActorCritic(3, gym.spaces.Discrete(2), cnn=None, pixels=False, lstm_hidden=4, lstm_layers=1)
    obs, memory = torch.randn(3, 3), torch.randn(2, 1, 3, 4)
    _, carried = agent._step(obs, memory, torch.tensor([False, False, False]))
    _, reset = agent._step(obs, memory, torch.tensor([False, True, False]))
    _, fresh = agent._step(obs, torch.zeros_like(memory), torch.tensor([False, False, False]))
    torch.testing.assert_close(reset[:, :, [0, 2]], carried[:, :, [0, 2]])
    torch.testing.assert_close(reset[:, :, 1], fresh[:, :, 1])


def test_replay_runs_one_packed_batch_through_the_lstm():
    """The time loop is the LSTM's own: one call for all segments, whatever the starts."""
    lstm = torch.nn.LSTM(3, 4)
    calls = []
    lstm.register_forward_hook(lambda *_: calls.append(1))
    starts = torch.rand(6, 20) < 0.3
    replay_lstm(lstm, torch.randn(6, 20, 3), starts, torch.zeros(2, 1, 6, 4))
    assert len(calls) == 1


def recurrent_algorithm(**changes) -> PPO:
    settings = {"num_envs": 3, "num_steps": 8, "per_rank_batch_size": 16, "lstm_hidden_size": 4} | changes
    return PPO(PPOConfig(env_id=MASKED, recurrent=True, **settings), inspect_env(MASKED))


def test_a_rollout_keeps_each_envs_start_state_and_where_its_episodes_start():
    algorithm = recurrent_algorithm()
    agent = algorithm.build_policy(torch.device("cpu"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=3)
    source.collect(agent)
    first = source.buffer
    assert first.starts[0].all() and first.memory.abs().sum() == 0  # fresh episodes, zero states
    carried = source.memory.permute(2, 0, 1, 3).clone()
    ended_last = source.starts.clone()
    source.collect(agent)
    torch.testing.assert_close(source.buffer.memory, carried)  # the next rollout begins where this one stopped
    assert torch.equal(source.buffer.starts[0], ended_last)
    batch = source.next_batch(16, lambda tensor: tensor)
    assert isinstance(batch, SequenceBatch) and batch.obs.shape == (3, 8, 2) and batch.memory.shape == (3, 2, 1, 4)
    assert torch.equal(batch.starts, source.buffer.starts.T)


@pytest.mark.parametrize("vector_mode", ["native", pytest.param("envpool", marks=needs_envpool)])
def test_envs_that_reset_a_step_late_zero_the_state_on_the_first_observation_not_the_last(vector_mode):
    """Native and envpool CartPoles return an ended episode's last observation, then a step later (a step that
    trains nothing) the next episode's first: the state carries to the last observation and zeroes on the first."""
    algorithm = PPO(
        PPOConfig(env_id="CartPole-v1", recurrent=True, vector_mode=vector_mode, num_envs=3, num_steps=64,
                  per_rank_batch_size=64, lstm_hidden_size=4),
        inspect_env("CartPole-v1"),
    )  # fmt: skip
    agent = algorithm.build_policy(torch.device("cpu"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=3)
    assert source.resets_next_step
    source.collect(agent)
    source.collect(agent)  # begun mid-episode, and where the last rollout ended, with a reset step
    rollout = source.buffer
    ended = rollout.terminated | rollout.truncated
    assert ended.sum() > 3 and not rollout.is_transition.all()
    # Row t + 1 acts on the last observation (its step is the reset, which trains nothing), row t + 2 on the first.
    last_observation = ~rollout.is_transition
    assert torch.equal(last_observation[1:], ended[:-1])
    assert torch.equal(rollout.starts[1:], last_observation[:-1])
    assert not (rollout.starts & last_observation).any()


def test_a_recurrent_policy_trains_on_envs_that_reset_a_step_late(tmp_path):
    args = [*RECURRENT, "--env-id", "CartPole-v1", "--vector-mode", "native", "--total-timesteps", "1024"]
    finished = run_ranks("fabric run", SCRIPTS["fabric"], [*args, "--eval-episodes", "2"], tmp_path, nproc=1)
    assert finished.returncode == 0, finished.stderr[-3000:]
    scalars = read_scalars(run_dir(tmp_path, "fabric"))
    assert np.isfinite([value for _, value in scalars["Loss/policy_loss"]]).all()
    assert "evaluation over 2 greedy episodes" in finished.stdout


def test_a_sequence_batch_travels_through_the_codec_exactly():
    algorithm = recurrent_algorithm()
    agent = algorithm.build_policy(torch.device("cpu"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=3)
    source.collect(agent)
    source.collect(agent)
    batch = source.next_batch(16, lambda tensor: tensor)
    codec = algorithm.batch_codec()
    rows = codec.empty_rows(algorithm.batch_rows(1))
    codec.pack(batch, rows)
    unpacked = codec.unpack(rows)
    for name in ("obs", "actions", "logprobs", "advantages", "starts", "memory"):
        assert torch.equal(getattr(unpacked, name), getattr(batch, name)), name


def test_truncated_episodes_bootstrap_from_the_value_with_the_carried_state():
    algorithm = recurrent_algorithm(num_envs=2)
    agent = algorithm.build_policy(torch.device("cpu"))
    source = algorithm.make_source(0, torch.device("cpu"), None, env_ranks=1, batch_rows=2)
    source.envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make(MASKED, max_episode_steps=5)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    source.reset_envs([0, 1])
    source.collect(agent)
    rollout = source.buffer
    assert rollout.truncated[4].all() and rollout.starts[5].all()  # the step after a cut starts afresh
    assert (rollout.final_values[:4] == 0).all()
    # env 0 again, by hand: its final observation, and the state its first 5 steps carried to it
    env = gym.make(MASKED, max_episode_steps=5)
    env.reset(seed=0)
    memory = torch.zeros(2, 1, 1, 4)
    for t in range(5):
        final_obs = env.step(int(rollout.actions[t, 0]))[0]
        memory = agent._step(rollout.obs[t, :1], memory, rollout.starts[t, :1])[1]
    expected = agent.value(torch.as_tensor(final_obs).unsqueeze(0), memory, torch.tensor([False]))
    torch.testing.assert_close(rollout.final_values[4, :1], expected)


BAD_RECURRENT = [
    ([*RECURRENT, "--per-rank-batch-size", "96"], "--per-rank-batch-size"),  # not whole 64-step sequences
    (["sac", "--recurrent"], "--recurrent"),
    ([*RECURRENT, "--lstm-layers", "0"], "--lstm-layers"),
]


@pytest.mark.parametrize(("args", "flag"), BAD_RECURRENT, ids=[flag for _, flag in BAD_RECURRENT])
def test_what_recurrent_cannot_do_ends_with_one_line_naming_the_flag(tmp_path, args, flag):
    assert refusal_line("fabric", args, tmp_path).startswith(f"error: {flag}: ")


def test_fabric_and_torchrun_are_bit_identical_with_shared_data(tmp_path):
    args = [*RECURRENT, "--total-timesteps", "1024", "--share-data", "--eval-episodes", "2"]
    (tmp_path / "fabric").mkdir(), (tmp_path / "torch").mkdir()
    fabric, torchrun = launch_together(
        ("fabric run", SCRIPTS["fabric"], args, tmp_path / "fabric", 2),
        ("torchrun", SCRIPTS["torch"], args, tmp_path / "torch", 2),
        via=run_ranks,
    )
    assert fabric.returncode == 0 and torchrun.returncode == 0, (fabric.stderr + torchrun.stderr)[-3000:]
    fabric_dir, torch_dir = run_dir(tmp_path / "fabric", "fabric"), run_dir(tmp_path / "torch", "torch")
    fabric_agent, torch_agent = load_agent(fabric_dir)["policy"], load_agent(torch_dir)["policy"]
    assert any("lstm" in name for name in fabric_agent)
    assert all(torch.equal(fabric_agent[name], torch_agent[name]) for name in fabric_agent)
    fabric_scalars, torch_scalars = read_scalars(fabric_dir), read_scalars(torch_dir)
    for tag in ("Loss/policy_loss", "Loss/value_loss", "Loss/approx_kl"):
        assert fabric_scalars[tag] == torch_scalars[tag], tag
    assert fabric_scalars["Info/replay_ratio"][-1][1] == 2.0  # 2 epochs over every step
    assert "evaluation over 2 greedy episodes" in fabric.stdout


@pytest.mark.parametrize(
    ("nproc", "args"),
    [(3, ["--share-data", "--pipeline"]), (4, ["--num-players", "2", "--async"])],
    ids=["1-player-2-trainers-pipeline-share", "2-players-2-trainers-async"],
)
def test_decoupled_players_send_sequences_the_trainers_replay(tmp_path, nproc, args):
    args = [*RECURRENT, "--total-timesteps", "1536", "--eval-episodes", "2", *args]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=nproc)
    assert finished.returncode == 0, finished.stderr[-3000:]
    scalars = read_scalars(run_dir(tmp_path, "decoupled"))
    assert np.isfinite([value for _, value in scalars["Loss/policy_loss"]]).all()
    assert "evaluation over 2 greedy episodes" in finished.stdout


@pytest.mark.parametrize("sync", [pytest.param("shared", marks=pytest.mark.slow), "synced"])
def test_hogwild_workers_carry_their_own_states(tmp_path, sync):
    finished = run_ranks(
        "python",
        SCRIPTS["hogwild"],
        [*RECURRENT, "--total-timesteps", "2048", "--workers", "2", "--sync", sync, "--eval-episodes", "2"],
        tmp_path,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "evaluation over 2 greedy episodes" in finished.stdout


@pytest.mark.parametrize(("script", "nproc"), [("fabric", 2), ("decoupled", 3)])
def test_resuming_mid_episode_equals_an_uninterrupted_run(tmp_path, script, nproc):
    """The envs' LSTM states travel in the checkpoint: the continued run matches the uninterrupted one."""
    args = [*RECURRENT, "--eval-episodes", "0"]
    (tmp_path / "full").mkdir(), (tmp_path / "part").mkdir()
    full, part = launch_together(
        ("fabric run", SCRIPTS[script], [*args, "--total-timesteps", "2048"], tmp_path / "full", nproc),
        ("fabric run", SCRIPTS[script], [*args, "--total-timesteps", "1024"], tmp_path / "part", nproc),
        via=run_ranks,
    )
    assert full.returncode == 0 and part.returncode == 0, (full.stderr + part.stderr)[-3000:]
    part_dir = run_dir(tmp_path / "part", script)
    (saved,) = sorted((part_dir / "checkpoints").glob("step_*.ckpt"))
    state = torch.load(saved, weights_only=True)
    assert state["rank_states"][0]["memory"].abs().sum() > 0  # a state mid-episode, not a fresh one
    resumed = run_ranks(
        "fabric run",
        SCRIPTS[script],
        [*args, "--total-timesteps", "2048", "--resume-from", str(saved)],
        tmp_path / "part",
        nproc=nproc,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole, continued = load_agent(run_dir(tmp_path / "full", script)), load_agent(part_dir)
    assert all(torch.equal(whole["policy"][name], continued["policy"][name]) for name in whole["policy"])
    tag = "Loss/policy_loss"
    assert all_scalars(part_dir, tag) == all_scalars(run_dir(tmp_path / "full", script), tag)
