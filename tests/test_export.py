"""`python -m rl.export`: standalone greedy policies that act as the checkpoint does, and read no pickles."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import SCRIPTS, child_env, launch_together, run_dir, run_ranks
from torch import Tensor

from rl.agent import load_agent, restore_agent
from rl.checkpoint import load_checkpoint
from rl.envs import env_own_spaces, make_vector_env, observations_tensor
from rl.errors import UsageError
from rl.export import main

TINY = ["--eval-episodes", "0", "--no-progress-bar", "--torch-threads", "1"]
AGENTS = {
    "ppo-discrete-mlp": ["--env-id", "CartPole-v1", "--total-timesteps", "512"],
    "ppo-multibinary-mlp": ["--env-id", "envs_for_tests:CopyBits-v0", "--total-timesteps", "512"],
    "ppo-box-matrix": ["--env-id", "envs_for_tests:ReachTheTarget-v0", "--total-timesteps", "512"],
    "ppo-multidiscrete-from-minus-1": [
        "--env-id",
        "envs_for_tests:FollowTheCue-v0",
        "--env-kwargs",
        '{"cues": 2}',
        "--total-timesteps",
        "512",
    ],
    "ppo-dict-of-vectors": ["--env-id", "envs_for_tests:DictCartPole-v0", "--total-timesteps", "512"],
    "ppo-box-mlp-normalized": ["--env-id", "Pendulum-v1", "--normalize-observations", "--total-timesteps", "512"],
    "ppo-discrete-cnn": [
        "--env-id",
        "rl/PixelCartPole-v1",
        "--resize",
        "0",
        "--frame-stack",
        "2",
        "--total-timesteps",
        "512",
    ],
    "sac-box": [
        "sac",
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "300",
        "--learning-starts",
        "100",
        "--batch-size",
        "32",
    ],
}
FORMATS = {"torchscript": "pt", "onnx": "onnx"}
# `python -m rl.export` with each of the argument lists given as JSON, in one process.
EXPORT_EACH = """
import json, sys
from rl.export import main
for argv in json.loads(sys.argv[1]):
    main(argv)
"""
# Acts with every exported policy given as (policy, observations, actions out) triples, in a process where any
# import of this project fails.
RUN_WITHOUT_THE_PROJECT = """
import sys
sys.modules["rl"] = None
import numpy as np
for policy, obs_file, actions_file in zip(*[iter(sys.argv[1:])] * 3):
    obs = np.load(obs_file)
    if policy.endswith(".onnx"):
        import onnxruntime
        actions = onnxruntime.InferenceSession(policy).run(None, {"obs": obs})[0]
    else:
        import torch
        actions = torch.jit.load(policy)(torch.from_numpy(obs)).numpy()
    np.save(actions_file, actions)
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory) -> dict[str, Path]:
    folders = {name: tmp_path_factory.mktemp(name) for name in AGENTS}
    jobs = [("python", SCRIPTS["fabric"], [*AGENTS[name], *TINY], folders[name], 1) for name in AGENTS]
    for finished in launch_together(*jobs, via=run_ranks):
        assert finished.returncode == 0, finished.stderr[-3000:]
    return {name: run_dir(folder, "fabric") / "agent.ckpt" for name, folder in folders.items()}


def observations(env_id: str, preprocessing, count: int = 16) -> np.ndarray:
    """Observations the trained envs really show, after some random steps."""
    envs = make_vector_env(env_id, count, None, preprocessing=preprocessing)
    obs, _ = envs.reset(seed=list(range(count)))
    envs.action_space.seed(0)
    for _ in range(5):
        obs, *_ = envs.step(envs.action_space.sample())
    envs.close()
    return obs


def checkpoint_actions(checkpoint: Path, obs: np.ndarray) -> np.ndarray:
    state = load_checkpoint(str(checkpoint))
    algorithm, agent, normalizer = restore_agent(state, state.env_id)
    space = algorithm.spaces.action_space
    pixels = obs.dtype == np.uint8
    actions = agent.greedy_action(normalizer(observations_tensor(obs, pixels, torch.device("cpu")))).numpy()
    actions = np.clip(actions, space.low, space.high) if isinstance(space, gym.spaces.Box) else actions
    own_actions = env_own_spaces(state.env_id, algorithm.spaces.preprocessing)[1]
    start = np.reshape(getattr(own_actions, "start", 0), -1)  # trained from 0, the env's own choices out
    return (actions.reshape(len(actions), -1) + start).reshape(len(actions), *own_actions.shape)


@pytest.fixture(scope="module")
def acted(agents, tmp_path_factory) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """For every agent and format: the exported policy's actions, run without this project, and the
    checkpoint's actions on the same observations. Every policy is exported by `rl.export.main`, what its command
    line runs, all in one process (an interpreter's start-up costs more than an export)."""
    folder = tmp_path_factory.mktemp("exported")
    cases = [(name, fmt) for name in AGENTS for fmt in FORMATS]
    policies = {case: folder / f"{case[0]}.{FORMATS[case[1]]}" for case in cases}
    commands = [[str(agents[name]), "--format", fmt, "--out", str(policies[name, fmt])] for name, fmt in cases]
    exported = subprocess.run(
        [sys.executable, "-c", EXPORT_EACH, json.dumps(commands)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    expected, triples = {}, []
    for name in AGENTS:
        state = load_checkpoint(str(agents[name]))
        obs = observations(state.env_id, restore_agent(state, state.env_id)[0].spaces.preprocessing)
        np.save(folder / f"{name}.npy", obs.astype(np.float32) if obs.dtype != np.uint8 else obs)
        expected[name] = checkpoint_actions(agents[name], obs)
        for fmt in FORMATS:
            actions = folder / f"{name}-{fmt}-actions.npy"
            triples += [str(policies[name, fmt]), str(folder / f"{name}.npy"), str(actions)]
    ran = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_THE_PROJECT, *triples],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    return {(name, fmt): (np.load(folder / f"{name}-{fmt}-actions.npy"), expected[name]) for name, fmt in cases}


@pytest.mark.parametrize("name", list(AGENTS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_exported_policy_acts_as_the_checkpoint_does_without_this_project(acted, name, fmt):
    exported, expected = acted[name, fmt]
    assert exported.shape == expected.shape
    if np.issubdtype(expected.dtype, np.integer):
        assert np.array_equal(exported, expected)
    else:
        np.testing.assert_allclose(exported, expected, rtol=0, atol=1e-5)


class WritesAFileWhenUnpickled:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", list(AGENTS))
def test_a_loaded_agent_predicts_the_checkpoints_greedy_actions_for_one_observation_or_a_batch(agents, name):
    agent = load_agent(agents[name])
    obs = observations(agent.env_id, agent.preprocessing)
    expected = checkpoint_actions(agents[name], obs)
    actions, state = agent.predict(obs)
    assert state is None and actions.shape == expected.shape
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)
    one, _ = agent.predict(obs[3])
    assert np.shape(one) == np.shape(expected[3])
    np.testing.assert_allclose(one, expected[3], rtol=1e-5, atol=1e-5)
    agent.seed(7)
    sampled, _ = agent.predict(obs, deterministic=False)
    agent.seed(7)
    assert np.array_equal(sampled, agent.predict(obs, deterministic=False)[0])  # its own seeded stream
    if isinstance(agent.action_space, gym.spaces.Box):
        flat = sampled.reshape(len(sampled), -1)  # as the policy acts, each action one vector
        assert (flat >= agent.action_space.low).all() and (flat <= agent.action_space.high).all()
    else:
        assert np.array_equal(sampled, sampled.astype(np.int64))


def test_a_flattened_dicts_policy_says_it_takes_what_gymnasium_flattens_and_acts_on_it_as_predict_does(
    agents, tmp_path, capsys
):
    out = tmp_path / "policy.pt"
    main([str(agents["ppo-dict-of-vectors"]), "--out", str(out)])
    takes = "a batch of float32 vectors [batch, 6] (the env's Dict observations, each as gymnasium.spaces.flatten"
    assert takes in capsys.readouterr().out
    env = gym.make("envs_for_tests:DictCartPole-v0")
    env.action_space.seed(0)
    raw = [env.reset(seed=0)[0]] + [env.step(env.action_space.sample())[0] for _ in range(7)]
    flat = np.stack([gym.spaces.flatten(env.observation_space, obs) for obs in raw]).astype(np.float32)
    exported = torch.jit.load(out)(torch.from_numpy(flat)).numpy()
    assert np.array_equal(exported, load_agent(agents["ppo-dict-of-vectors"]).predict(raw)[0])


def test_an_image_policy_says_how_the_run_prepared_its_frames(agents, tmp_path, capsys):
    main([str(agents["ppo-discrete-cnn"]), "--out", str(tmp_path / "policy.pt")])
    frames = "uint8 images [batch, 2, 40, 40] (the env's frames grayscale, stacked by 2, as rl.load_agent(CHECKPOINT)"
    assert frames in capsys.readouterr().out


def test_a_time_feature_policy_says_it_takes_the_elapsed_fraction_last_and_acts_on_it_as_predict_does(tmp_path, capsys):
    args = ["--env-id", "Pendulum-v1", "--time-feature", "--total-timesteps", "512", *TINY]
    trained = run_ranks("python", SCRIPTS["fabric"], args, tmp_path, nproc=1)
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint, out = run_dir(tmp_path, "fabric") / "agent.ckpt", tmp_path / "policy.pt"
    main([str(checkpoint), "--out", str(out)])
    assert "[batch, 4] (each with the elapsed fraction of the time limit last" in capsys.readouterr().out
    env = gym.make("Pendulum-v1")  # its time limit: 200 steps
    env.action_space.seed(0)
    raw = [env.reset(seed=0)[0]] + [env.step(env.action_space.sample())[0] for _ in range(7)]
    with_time = np.stack([np.append(obs, t / 200) for t, obs in enumerate(raw)]).astype(np.float32)
    agent = load_agent(checkpoint)
    wrapped = agent.make_env()
    wrapped.action_space.seed(0)
    made = [wrapped.reset(seed=0)[0]] + [wrapped.step(wrapped.action_space.sample())[0] for _ in range(7)]
    np.testing.assert_allclose(np.stack(made), with_time, rtol=0, atol=1e-6)  # what the line tells a user to give
    exported = torch.jit.load(out)(torch.from_numpy(with_time)).numpy()
    np.testing.assert_allclose(exported, agent.predict(np.stack(made))[0], rtol=0, atol=1e-5)


def test_a_loaded_agent_refuses_observations_of_another_shape_and_a_file_that_is_not_an_agent(agents, tmp_path):
    agent = load_agent(agents["ppo-discrete-mlp"])
    with pytest.raises(ValueError, match=r"this agent takes \(4,\), or a batch of them"):
        agent.predict(np.zeros(3))
    (tmp_path / "x.ckpt").write_text("no")
    with pytest.raises(UsageError, match="is not a checkpoint"):
        load_agent(tmp_path / "x.ckpt")


@pytest.mark.parametrize("module", ["rl.export", "rl.evaluate"])
def test_a_file_that_would_run_code_when_unpickled_is_refused_unread(tmp_path, module):
    marker, evil = tmp_path / "the_pickle_ran", tmp_path / "agent.ckpt"
    torch.save({"format": "x", "payload": WritesAFileWhenUnpickled(marker)}, evil)
    extra = ["--out", str(tmp_path / "p.pt")] if module == "rl.export" else []
    done = subprocess.run(
        [sys.executable, "-m", module, str(evil), *extra], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: CHECKPOINT: {evil} holds Python objects (classes or code)") and "trust" in line
    assert not marker.exists()


def export_to(agent: Path, out: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rl.export", str(agent), "--out", out, *extra]
    return subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


def test_bad_output_paths_end_with_one_line_and_a_onnx_file_is_onnx(agents, tmp_path):
    agent = next(iter(agents.values()))
    (tmp_path / "a-file").write_text("in the way")
    for out, told in (
        (str(tmp_path), "is a folder; give the file to write"),
        (str(tmp_path / "a-file" / "policy.pt"), "a-file is a file, not a folder"),
    ):
        done = export_to(agent, out, tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: --out: ") and told in line, line
    # before the agent is read: loading it could warn (its env's old version) above that line, or take long
    done = export_to(tmp_path / "no-such.ckpt", str(tmp_path), tmp_path)
    assert done.stderr.startswith("error: --out: "), done.stderr[-2000:]
    done = export_to(agent, str(tmp_path / "new" / "folder" / "policy.onnx"), tmp_path)
    assert done.returncode == 0 and "(onnx)" in done.stdout, done.stderr[-2000:]
    assert (tmp_path / "new" / "folder" / "policy.onnx").read_bytes()[:2] != b"PK"  # ONNX, not a TorchScript zip


def test_an_output_path_that_starts_with_a_tilde_after_an_equals_sign_is_in_the_users_home(
    agents, tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    main([str(next(iter(agents.values()))), "--out=~/policy.pt"])  # a shell expands ~ at a word's start only
    assert (tmp_path / "policy.pt").is_file() and not (tmp_path / "~").exists()


def test_the_help_names_the_checkpoint_and_the_formats_a_user_can_give(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "CHECKPOINT --out STR [--format {auto,torchscript,onnx}]" in usage, usage


def test_a_given_format_wins_over_the_files_suffix(agents, tmp_path):
    agent = next(iter(agents.values()))
    done = export_to(agent, str(tmp_path / "policy.pt"), tmp_path, "--format", "onnx")
    assert done.returncode == 0 and "(onnx)" in done.stdout, done.stderr[-2000:]
    assert (tmp_path / "policy.pt").read_bytes()[:2] != b"PK"  # ONNX, not a TorchScript zip


# Steps an exported recurrent policy through recorded episodes, in a process where any import of this project
# fails: its inputs per step from `steps.npz` (the observation's keys, then episode_start), its state carried from
# zeros; the actions per step and the last state go to `acted.npz`.
STEP_WITHOUT_THE_PROJECT = """
import sys
sys.modules["rl"] = None
import numpy as np
policy, steps_file, shape, acted_file = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
steps = np.load(steps_file)
keys = [key for key in steps.files if key != "episode_start"]
state = np.zeros([int(side) for side in shape.split(",")], np.float32)
actions = []
if policy.endswith(".onnx"):
    import onnxruntime
    session = onnxruntime.InferenceSession(policy)
    names = [node.name for node in session.get_inputs()]
    assert names == [*keys, "state", "episode_start"], names
    for step in range(len(steps["episode_start"])):
        inputs = [steps[key][step] for key in keys] + [state, steps["episode_start"][step]]
        action, state = session.run(None, dict(zip(names, inputs)))
        actions.append(action)
else:
    import torch
    module = torch.jit.load(policy)
    state = torch.from_numpy(state)
    for step in range(len(steps["episode_start"])):
        inputs = [torch.from_numpy(steps[key][step]) for key in keys]
        action, state = module(*inputs, state, torch.from_numpy(steps["episode_start"][step]))
        actions.append(action.numpy())
    state = state.numpy()
np.savez(acted_file, actions=np.stack(actions), state=state)
"""
RECURRENT_AGENTS = {
    "vectors": ["--env-id", "rl/MaskedCartPole-v1", "--per-rank-batch-size", "128", "--total-timesteps", "256"],
    "dict-with-images": ["--env-id", "rl/TwoCues-v0", "--per-rank-batch-size", "128", "--total-timesteps", "256"],
}


@pytest.fixture(scope="module")
def recurrent_agents(tmp_path_factory) -> dict[str, Path]:
    folders = {name: tmp_path_factory.mktemp(f"recurrent-{name}") for name in RECURRENT_AGENTS}
    args = {name: [*TINY, "--recurrent", *flags] for name, flags in RECURRENT_AGENTS.items()}
    jobs = [("python", SCRIPTS["fabric"], args[name], folders[name], 1) for name in RECURRENT_AGENTS]
    for finished in launch_together(*jobs, via=run_ranks):
        assert finished.returncode == 0, finished.stderr[-3000:]
    return {name: run_dir(folder, "fabric") / "agent.ckpt" for name, folder in folders.items()}


def recorded_episodes(agent, envs: int = 3, steps: int = 40) -> tuple[dict[str, np.ndarray], np.ndarray, Tensor]:
    """`agent.predict` stepping a vector env through episodes that end at different steps: every step's inputs
    (the observation's keys as an exported policy takes them, and episode_start), its actions, and the last state."""
    vector_env = gym.make_vec(agent.env_id, num_envs=envs)
    obs, _ = vector_env.reset(seed=0)
    starts, state = np.ones(envs, dtype=bool), None
    inputs: dict[str, list[np.ndarray]] = {"episode_start": []}
    actions = []
    for _ in range(steps):
        for key, value in obs.items() if isinstance(obs, dict) else [("obs", obs.astype(np.float32))]:
            inputs.setdefault(key, []).append(value)
        inputs["episode_start"].append(starts)
        action, state = agent.predict(obs, state, episode_start=starts)
        actions.append(action)
        obs, _, terminated, truncated, _ = vector_env.step(action)
        starts = terminated | truncated
    vector_env.close()
    assert np.stack(inputs["episode_start"])[1:].any(), "no episode ended: the state was never zeroed mid-run"
    return {key: np.stack(values) for key, values in inputs.items()}, np.stack(actions), state


@pytest.mark.parametrize("name", list(RECURRENT_AGENTS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_recurrent_policy_exports_as_one_step_that_carries_its_state_as_predict_does(
    recurrent_agents, name, fmt, tmp_path
):
    agent = load_agent(recurrent_agents[name])
    inputs, expected_actions, expected_state = recorded_episodes(agent)
    np.savez(tmp_path / "steps.npz", **inputs)
    policy = tmp_path / f"policy.{FORMATS[fmt]}"
    done = export_to(recurrent_agents[name], str(policy), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "state (float32 [2, 1, batch, 128], zeros to begin) and episode_start (bool [batch])" in done.stdout
    shape = ",".join(str(side) for side in expected_state.shape)
    command = [sys.executable, "-c", STEP_WITHOUT_THE_PROJECT, str(policy), "steps.npz", shape, "acted.npz"]
    ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    acted = np.load(tmp_path / "acted.npz")
    assert np.array_equal(acted["actions"], expected_actions)
    np.testing.assert_allclose(acted["state"], expected_state.numpy(), rtol=0, atol=1e-4)


def test_a_recurrent_policy_evaluates_with_its_state_and_predict_refuses_another_batchs_state(recurrent_agents):
    agent = str(recurrent_agents["vectors"])
    folder = recurrent_agents["vectors"].parent
    evaluate = [sys.executable, "-m", "rl.evaluate", agent, "--episodes", "2"]
    evaluated = subprocess.run(evaluate, cwd=folder, env=child_env(), capture_output=True, text=True, timeout=120)
    assert evaluated.returncode == 0 and "rl/MaskedCartPole-v1, 2 deterministic episodes" in evaluated.stdout
    loaded = load_agent(agent)
    obs = observations(loaded.env_id, loaded.preprocessing, count=3)
    first, state = loaded.predict(obs)
    assert state is not None and loaded.recurrent
    again, _ = loaded.predict(obs, state=None)
    assert np.array_equal(first, again)  # no state: every episode starts here
    _, carried = loaded.predict(obs, state=state)
    assert not torch.equal(carried, state)  # the state moves on from step to step
    one_rows_state = loaded.predict(obs[0])[1]
    with pytest.raises(ValueError, match=r"a state of shape \(2, 1, 1, 128\) for 3 observation\(s\)"):
        loaded.predict(obs, state=one_rows_state)  # it broadcast over the 3 rows in silence
    with pytest.raises(ValueError, match=r"episode_start of shape \(2,\) for 3 observation\(s\)"):
        loaded.predict(obs, state=state, episode_start=[True, False])
