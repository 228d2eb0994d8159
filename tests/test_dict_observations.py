"""Dict observations with images and vectors: each key carried in its own dtype as one row of bytes, a CNN
per image key beside an MLP, in every mode, with exact resume, `predict` and export by key."""

import subprocess
import sys

import envs_for_tests  # noqa: F401  (registers ImageAndText-v0)
import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    SCRIPTS,
    all_scalars,
    child_env,
    launch_together,
    load_agent,
    refusal_line,
    run_dir,
    run_ranks,
)

import rl
from rl.algos.ppo.algorithm import PPO
from rl.algos.ppo.config import PPOConfig
from rl.algos.ppo.policy import CNNActorCritic
from rl.algos.sac.algorithm import SAC
from rl.algos.sac.config import SACConfig
from rl.encoders import MultiInputEncoder, uses_cnn
from rl.envs import inspect_env, space_summary
from rl.errors import UsageError
from rl.export import greedy_policy, write
from rl.multi_input import MultiInputLayout, pack_each

CPU = torch.device("cpu")
SPACE = gym.spaces.Dict(
    {
        "camera": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
        "position": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        "mode": gym.spaces.Discrete(3),
        "depth": gym.spaces.Box(0, 255, (2, 40, 40), np.uint8),
    }
)
TWO_CUES = ["--env-id", "rl/TwoCues-v0", "--eval-episodes", "2", "--no-progress-bar", "--torch-threads", "1"]
PPO_RUN = [*TWO_CUES, "--num-envs", "2", "--num-steps", "64", "--update-epochs", "2"]
SAC_RUN = ["sac", *TWO_CUES, "--env-kwargs", '{"continuous": true}', "--learning-starts", "100"]
SAC_RUN += ["--batch-size", "16", "--buffer-size", "1000", "--log-every", "100", "--save-buffer"]
RUNS = {"ppo": (PPO_RUN, 512), "sac": (SAC_RUN, 200)}  # the flags, and the steps of half a run


def test_a_row_of_bytes_carries_every_key_bit_for_bit_at_any_offset():
    layout = MultiInputLayout(SPACE)
    SPACE.seed(0)
    observations = [SPACE.sample() for _ in range(5)]
    rows = torch.from_numpy(pack_each(layout, observations))
    assert rows.dtype == torch.uint8 and rows.shape[1] % 4 == 0
    assert rows.shape[1] == 3 * 4 + 3 * 4 + 36 * 36 * 3 + 2 * 40 * 40  # float32 vectors (one-hot mode), uint8 images
    shifted = torch.zeros(rows.numel() + 1, dtype=torch.uint8)[1:].view(rows.shape)  # rows 1 byte off alignment
    shifted.copy_(rows)
    for batch in (rows, shifted):
        keys = dict(zip([key.name for key in layout.keys], layout.unpack(batch), strict=True))
        camera, position, mode, depth = (keys[name] for name in ("camera", "position", "mode", "depth"))
        assert camera.dtype == depth.dtype == torch.uint8 and position.dtype == mode.dtype == torch.float32
        assert all(np.array_equal(camera[i].numpy(), obs["camera"]) for i, obs in enumerate(observations))
        assert all(np.array_equal(depth[i].numpy(), obs["depth"]) for i, obs in enumerate(observations))
        assert all(np.array_equal(position[i].numpy(), obs["position"]) for i, obs in enumerate(observations))
        assert mode.argmax(1).tolist() == [int(obs["mode"]) for obs in observations]


def test_the_encoder_reads_rows_and_keys_alike_with_a_cnn_per_image_key():
    layout = MultiInputLayout(SPACE)
    encoder = MultiInputEncoder(layout)
    assert len(encoder.cnns) == 2 and encoder.joint[0].in_features == 2 * 512 + 64 and encoder.features == 512
    rows = torch.from_numpy(pack_each(layout, [SPACE.sample() for _ in range(3)]))
    assert torch.equal(encoder(rows), encoder(layout.unpack(rows)))


@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
def test_rollouts_and_replay_buffers_keep_the_rows_as_bytes(algorithm):
    if algorithm == "ppo":
        cfg, kind = PPOConfig(env_id="rl/TwoCues-v0", num_envs=2, num_steps=8), PPO
    else:
        cfg = SACConfig(env_id="rl/TwoCues-v0", env_kwargs='{"continuous": true}', buffer_size=64, learning_starts=8)
        kind = SAC
    spaces = inspect_env(cfg.env_id, cfg.preprocessing())
    assert spaces.multi_input is not None and spaces.obs_dtype == torch.uint8
    row_bytes = 4 * 4 + 36 * 36
    assert spaces.obs_shape == (row_bytes,)
    agent = kind(cfg, spaces)
    policy = agent.build_policy(CPU)
    assert any(isinstance(module, MultiInputEncoder) for module in policy.modules())
    assert algorithm == "sac" or isinstance(policy, CNNActorCritic)
    assert agent.batch_codec().columns["obs"].bytes == row_bytes  # one byte a pixel between processes


@pytest.mark.parametrize(
    ("algorithm", "flags", "flag", "says"),
    [
        ("ppo", ["--encoder", "mlp"], "--encoder", "a CNN per image key"),
        ("ppo", ["--normalize-observations"], "--normalize-observations", "not a Dict observation with images"),
        ("sac", ["--encoder", "mlp"], "--encoder", "a CNN per image key"),
        ("ppo", ["--time-feature"], "--time-feature", "rl/TwoCues-v0 gives Dict('image': Box(0, 255, "),
        ("ppo", ["--frame-stack", "2"], "--frame-stack", "), whose image keys come as the env gives them: drop"),
    ],
)
def test_flags_a_dict_with_images_cannot_take_are_refused_naming_them(tmp_path, algorithm, flags, flag, says):
    args = ["--env-id", "rl/TwoCues-v0", *flags]
    if algorithm == "sac":
        args = ["sac", *args, "--env-kwargs", '{"continuous": true}']
    line = refusal_line("fabric", args, tmp_path)
    assert line.startswith(f"error: {flag}: ") and says in line


def test_a_video_of_an_env_that_renders_no_frames_is_refused_before_training_and_evaluation(runs, tmp_path):
    """Made with render_mode="rgb_array", which it does not take, the env raised a TypeError at the run's start."""
    says = "error: --capture-video: rl/TwoCues-v0 does not render frames to record (render_mode 'rgb_array')"
    assert refusal_line("fabric", ["--env-id", "rl/TwoCues-v0", "--capture-video"], tmp_path) == says
    _, folders = runs
    command = [sys.executable, "-m", "rl.evaluate", str(folders["full"] / "agent.ckpt"), "--capture-video"]
    evaluated = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert evaluated.returncode == 2 and evaluated.stderr.strip() == says


def test_a_dict_with_images_is_named_in_messages_as_the_env_gives_it():
    packed = inspect_env("rl/TwoCues-v0", PPOConfig().preprocessing()).observation_space
    assert space_summary(packed) == repr(gym.make("rl/TwoCues-v0").observation_space)
    assert space_summary(gym.spaces.Box(-1, 1, (3,))) == "a Box of shape (3,)"


def test_an_image_key_too_small_for_the_cnn_is_the_envs_to_change_not_a_flags():
    """No flag resizes a Dict's images, so the refusal names the env, not --resize."""
    config = PPOConfig(env_id="rl/TwoCues-v0", env_kwargs='{"size": 24}')
    spaces = inspect_env(config.env_id, config.preprocessing())
    with pytest.raises(UsageError) as refused:
        uses_cnn("auto", spaces.observation_space)
    assert str(refused.value) == (
        "--env-id: the CNN needs images of at least 36x36 pixels, got the image key 'image' of shape (24, 24); "
        "make the env's images larger"
    )


def test_a_dict_with_a_key_no_encoder_takes_is_named_in_one_line(tmp_path):
    line = refusal_line("fabric", ["--env-id", "envs_for_tests:ImageAndText-v0"], tmp_path)
    assert line.startswith("error: --env-id: observation space Dict(") and "Text(" in line
    with pytest.raises(UsageError):
        inspect_env("envs_for_tests:ImageAndText-v0")


@pytest.fixture(scope="module", params=["ppo", pytest.param("sac", marks=pytest.mark.slow)])
def runs(request, tmp_path_factory) -> tuple[str, dict]:
    """For one algorithm: a run in one go, the same run stopped halfway and resumed, and one decoupled player
    with one trainer sharing its data (which trains as one coupled process does)."""
    algorithm = request.param
    flags, half = RUNS[algorithm]
    folders, jobs = {}, []
    for kind, launcher, script, steps, nproc in (
        ("full", "python", "fabric", 2 * half, 1),
        ("half", "python", "fabric", half, 1),
        ("decoupled", "fabric run", "decoupled", 2 * half, 2),
    ):
        folders[kind] = tmp_path_factory.mktemp(f"{algorithm}-{kind}")
        extra = ["--share-data"] if kind == "decoupled" else []
        jobs.append(
            (launcher, SCRIPTS[script], [*flags, *extra, "--total-timesteps", str(steps)], folders[kind], nproc)
        )
    for finished in launch_together(*jobs, via=run_ranks):
        assert finished.returncode == 0, finished.stderr[-3000:]
    (checkpoint,) = sorted((run_dir(folders["half"], "fabric") / "checkpoints").glob("step_*.ckpt"))[-1:]
    args = [*flags, "--total-timesteps", str(2 * half), "--resume-from", str(checkpoint)]
    finished = run_ranks("python", SCRIPTS["fabric"], args, folders["half"])
    assert finished.returncode == 0, finished.stderr[-3000:]
    return algorithm, {
        kind: run_dir(folder, "decoupled" if kind == "decoupled" else "fabric") for kind, folder in folders.items()
    }


def test_a_resumed_run_and_a_decoupled_one_train_as_one_run_in_one_process_does(runs):
    algorithm, folders = runs
    full = load_agent(folders["full"])["policy"]
    assert any(".cnns.0." in name for name in full) and any(".mlp." in name for name in full)
    tag = "Loss/policy_loss" if algorithm == "ppo" else "Loss/critic_loss"
    for other in ("half", "decoupled"):
        weights = load_agent(folders[other])["policy"]
        assert all(torch.equal(full[name], weights[name]) for name in full), other
        assert all_scalars(folders[other], tag) == all_scalars(folders["full"], tag), other


def test_the_agent_predicts_from_dicts_and_its_export_takes_one_input_per_key(runs, tmp_path):
    _, folders = runs
    agent = rl.load_agent(folders["full"] / "agent.ckpt")
    env = gym.make(agent.env_id, **dict(agent.preprocessing.env_kwargs))
    observations = [env.reset(seed=seed)[0] for seed in range(4)]
    actions, _ = agent.predict(observations)
    one_by_one = np.stack([agent.predict(obs)[0] for obs in observations])
    np.testing.assert_allclose(one_by_one, actions, rtol=1e-5, atol=1e-6)  # SAC's: a batch's float sums
    stacked = {key: np.stack([obs[key] for obs in observations]) for key in ("image", "vector")}
    np.testing.assert_array_equal(agent.predict(stacked)[0], actions)  # as a vector env gives them
    empty = {key: values[:0] for key, values in stacked.items()}
    assert agent.predict([])[0].shape == agent.predict(empty)[0].shape == (0, *actions.shape[1:])
    module, example = greedy_policy(agent)
    assert [tensor.dtype for tensor in example] == [torch.uint8, torch.float32]  # image, then vector
    keys = [torch.from_numpy(np.stack([obs[key] for obs in observations])) for key in ("image", "vector")]
    for fmt in ("torchscript", "onnx"):
        out = tmp_path / f"policy.{fmt}"
        write(module, example, str(out), fmt)
        if fmt == "torchscript":
            exported = torch.jit.load(str(out))(*keys).numpy()
        else:
            import onnxruntime

            session = onnxruntime.InferenceSession(str(out))
            assert [node.name for node in session.get_inputs()] == ["image", "vector"]
            exported = session.run(None, {"image": keys[0].numpy(), "vector": keys[1].numpy()})[0]
        np.testing.assert_allclose(exported, actions, atol=1e-5)


@pytest.mark.slow
def test_recurrent_ppo_hogwild_workers_and_the_evaluator_train_on_a_dict_with_images(tmp_path):
    folders = {name: tmp_path / name for name in ("recurrent", "hogwild", "evaluator")}
    for folder in folders.values():
        folder.mkdir()
    steps = ["--total-timesteps", "512"]
    recurrent = [*PPO_RUN, *steps, "--recurrent", "--per-rank-batch-size", "64"]
    jobs = [
        ("python", SCRIPTS["fabric"], recurrent, folders["recurrent"], 1),
        ("python", SCRIPTS["hogwild"], [*PPO_RUN, *steps, "--workers", "2"], folders["hogwild"], 1),
        ("fabric run", SCRIPTS["decoupled"], [*PPO_RUN, *steps, "--evaluator"], folders["evaluator"], 3),
    ]
    for finished in launch_together(*jobs):
        assert finished.returncode == 0, finished.stderr[-3000:]
    for name, mode in (("recurrent", "fabric"), ("hogwild", "hogwild"), ("evaluator", "decoupled")):
        weights = load_agent(run_dir(folders[name], mode))["policy"]
        assert any(".cnns.0." in key for key in weights) and any(".mlp." in key for key in weights), name
