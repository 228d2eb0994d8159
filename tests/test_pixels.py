"""Pixel observations: the encoder's layouts, uint8 from the env to the network, Atari's training
signal beside the game's own score, raw-frame videos, and real runs on a pixel env."""

import glob
import math
import sys

import envs_for_tests  # noqa: F401  (registers LivesGame-v0)
import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import SCRIPTS, load_agent, needs_envpool, read_scalars, run_dir, run_ranks

from rl.algos.ppo.algorithm import PPO
from rl.algos.ppo.config import PPOConfig
from rl.algos.ppo.policy import CNNActorCritic, MLPActorCritic
from rl.algos.ppo.rollout import RolloutCollector
from rl.algos.sac.algorithm import SAC
from rl.algos.sac.collector import Transitions, transition_columns
from rl.algos.sac.config import SACConfig
from rl.algos.sac.learner import StatMeans
from rl.batch import DataShard
from rl.encoders import ImageLayout, NatureCNN, uses_cnn
from rl.envs import EnvSpaces, Preprocessing, inspect_env, make_env, refusal_for_missing_module
from rl.errors import UsageError
from rl.evaluation import evaluate_greedy
from rl.experience import TrainingSignal
from rl.normalization import ObservationNormalizer, RewardScaler
from rl.runtime import TorchRuntime

CPU = torch.device("cpu")
PIXEL_CARTPOLE = ["--env-id", "rl/PixelCartPole-v1", "--resize", "0", "--frame-stack", "2"]
SMALL_FRAMES = Preprocessing(resize=0, frame_stack=2)  # PixelCartPole's own 40 x 40, two frames


@pytest.mark.parametrize(
    ("shape", "chw"),
    [((84, 84), (1, 84, 84)), ((4, 84, 84), (4, 84, 84)), ((96, 96, 3), (3, 96, 96)), ((4, 84, 84, 3), (12, 84, 84))],
)
def test_image_layouts_put_channels_first_and_scale_uint8_to_unit_floats(shape, chw):
    layout = ImageLayout(shape)
    assert layout.chw == chw
    images = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    floats = layout.to_float_chw(images)
    assert floats.dtype == torch.float32 and floats.shape == (5, *chw)
    assert floats.min() >= 0.0 and floats.max() <= 1.0
    assert floats.max() == images.max().float() / 255.0


def test_channels_last_and_channels_first_images_give_the_same_features():
    channels_last = torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8)
    torch.manual_seed(0)
    hwc = NatureCNN((84, 84, 4))
    torch.manual_seed(0)
    chw = NatureCNN((4, 84, 84))
    features = hwc(channels_last)
    assert features.shape == (3, 512)
    # equal up to rounding: the layouts reach different convolution kernels
    assert torch.allclose(features, chw(channels_last.permute(0, 3, 1, 2).contiguous()), atol=1e-6)


def test_the_encoder_follows_the_observation_space_unless_told():
    image, vector = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Box(-1, 1, (4,), np.float32)
    assert uses_cnn("auto", image) and uses_cnn("cnn", image)
    assert not uses_cnn("auto", vector) and not uses_cnn("mlp", image)
    with pytest.raises(UsageError) as error:
        uses_cnn("cnn", vector)
    assert error.value.flag == "--encoder"
    with pytest.raises(UsageError) as error:
        uses_cnn("auto", gym.spaces.Box(0, 255, (2, 20, 20), np.uint8))
    assert error.value.flag == "--resize"


def test_preprocessing_flags_shape_the_observations():
    assert inspect_env("CarRacing-v3").obs_shape == (4, 84, 84)  # grayscale, 84 x 84, 4 frames
    colour = inspect_env("CarRacing-v3", Preprocessing(grayscale=False, resize=64, frame_stack=1))
    assert colour.obs_shape == (64, 64, 3) and colour.obs_dtype == torch.uint8
    assert inspect_env("rl/PixelCartPole-v1", SMALL_FRAMES).obs_shape == (2, 40, 40)
    assert inspect_env("CartPole-v1").obs_shape == (4,) and inspect_env("CartPole-v1").obs_dtype == torch.float32


def test_pixel_rollouts_stay_uint8_and_travel_as_one_byte_a_pixel():
    cfg = PPOConfig(env_id="rl/PixelCartPole-v1", resize=0, frame_stack=2, num_envs=2, num_steps=8)
    algorithm = PPO(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
    policy = algorithm.build_policy(CPU)
    assert isinstance(policy, CNNActorCritic)
    source = algorithm.make_source(0, CPU, None, env_ranks=1, batch_rows=16)
    source.collect(policy)
    assert source.buffer.obs.dtype == torch.uint8 and source.buffer.obs.shape == (8, 2, 2, 40, 40)
    batch = source.next_batch(0, lambda tensor: tensor)
    codec = algorithm.batch_codec()
    assert codec.columns["obs"].bytes == 2 * 40 * 40
    rows = codec.empty_rows(len(batch))
    codec.pack(batch, rows)
    unpacked = codec.unpack(rows)
    assert unpacked.obs.dtype == torch.uint8
    assert all(torch.equal(getattr(unpacked, name), getattr(batch, name)) for name in codec.columns)
    mlp = PPO(PPOConfig(env_id=cfg.env_id, resize=0, frame_stack=2, encoder="mlp"), algorithm.spaces)
    assert isinstance(mlp.build_policy(CPU), MLPActorCritic)


@pytest.mark.parametrize(
    ("changes", "flag", "says"),
    [
        pytest.param(
            {"env_id": "rl/PixelCartPole-v1", "vector_mode": "envpool"},
            "--vector-mode",
            "envpool has no rl/PixelCartPole",
            marks=needs_envpool,
        ),
        ({"env_id": "CarRacing-v3", "vector_mode": "native"}, "--vector-mode", "no native vector env"),
        ({"env_id": "CartPole-v1", "encoder": "cnn"}, "--encoder", "cnn needs image observations"),
        ({"env_id": "rl/PixelCartPole-v1", "resize": 32}, "--resize", "at least 36x36"),
    ],
)
def test_pixel_flags_that_cannot_work_are_refused_naming_the_flag(changes, flag, says):
    cfg = PPOConfig(**changes)
    with pytest.raises(UsageError, match=says) as error:
        PPO(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
    assert error.value.flag == flag


@needs_envpool
def test_a_backend_whose_frames_differ_from_gymnasiums_is_refused_naming_the_flag():
    cfg = PPOConfig(env_id="CarRacing-v3", vector_mode="envpool")  # envpool's CarRacing: raw 96 x 96 colour
    algorithm = PPO(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
    with pytest.raises(UsageError, match=r"observations of shape \(96, 96, 3\)") as error:
        algorithm.make_source(0, CPU, None, env_ranks=1, batch_rows=256)
    assert error.value.flag == "--vector-mode"


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4", "Breakout-ramDeterministic-v4"])
def test_an_atari_id_without_ale_py_names_the_extra(monkeypatch, env_id):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if ale-py were not installed
    monkeypatch.delitem(gym.envs.registry, env_id, raising=False)  # which only ale-py registers
    with pytest.raises(UsageError) as error:
        inspect_env(env_id)
    assert (error.value.flag, error.value.message) == ("--env-id", f"{env_id} needs ale-py: pip install -e '.[atari]'")


def test_a_module_an_extra_installs_is_named_with_the_extra_however_its_absence_is_raised():
    import_error = ImportError("No module named 'mujoco'", name="mujoco")
    try:  # as gymnasium's MuJoCo envs raise it
        raise gym.error.DependencyNotInstalled("MuJoCo is not installed") from import_error
    except gym.error.DependencyNotInstalled as error:
        from_gymnasium = error
    for error in (import_error, from_gymnasium):
        assert (
            refusal_for_missing_module("Hopper-v5", error).message
            == "Hopper-v5 needs mujoco: pip install -e '.[mujoco]'"
        )
    assert refusal_for_missing_module("Hopper-v5", ImportError("No module named 'yaml'", name="yaml")) is None


def test_a_mujoco_env_without_mujoco_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # as if mujoco were not installed
    for module in [name for name in sys.modules if name.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, module)  # so that making the env imports mujoco
    with pytest.raises(UsageError) as error:
        inspect_env("HalfCheetah-v5")
    assert (error.value.flag, error.value.message) == (
        "--env-id",
        "HalfCheetah-v5 needs mujoco: pip install -e '.[mujoco]'",
    )


@pytest.mark.parametrize(
    ("env_id", "flags", "signal"),
    [
        ("ALE/Breakout-v5", {}, TrainingSignal(episodic_life=True, clip_rewards=True)),
        ("ALE/Breakout-v5", {"episodic_life": False, "clip_rewards": False}, TrainingSignal()),
        ("ALE/Breakout-v5", {"clip_rewards": False}, TrainingSignal(episodic_life=True)),
        ("CarRacing-v3", {}, TrainingSignal()),  # never outside Atari, whatever the flags say
    ],
)
def test_episodic_life_and_clipped_rewards_follow_their_flags_on_atari_only(env_id, flags, signal):
    cfg = PPOConfig(env_id=env_id, **flags)
    assert PPO(cfg, inspect_env(env_id, cfg.preprocessing())).training_signal() == signal


@pytest.mark.parametrize(("obs_type", "skipped_by_the_env"), [("rgb", 1), ("grayscale", 1), ("ram", 4)])
def test_an_atari_game_skips_frames_once_in_its_preprocessing_or_in_the_env_if_it_shows_its_memory(
    obs_type, skipped_by_the_env
):
    """Frames are skipped by AtariPreprocessing, which max-pools them; the console's memory (128 bytes, a
    vector) is not preprocessed, so the env skips them itself."""
    env = make_env("ALE/Breakout-v5", None, Preprocessing(env_kwargs=(("obs_type", obs_type),)))
    assert env.unwrapped._frameskip == skipped_by_the_env
    preprocessed = [wrapper for wrapper in wrappers(env) if isinstance(wrapper, gym.wrappers.AtariPreprocessing)]
    assert [wrapper.frame_skip for wrapper in preprocessed] == ([] if obs_type == "ram" else [4])
    env.close()


def wrappers(env: gym.Env) -> list[gym.Env]:
    layers = []
    while isinstance(env, gym.Wrapper):
        layers.append(env)
        env = env.env
    return layers


def test_image_observations_cannot_be_normalized_with_running_statistics():
    cfg = PPOConfig(env_id="rl/PixelCartPole-v1", normalize_observations=True)
    with pytest.raises(UsageError) as error:
        PPO(cfg, inspect_env(cfg.env_id))
    assert error.value.flag == "--normalize-observations"


def test_sac_trains_the_image_encoder_through_the_critics_loss_alone():
    cfg = SACConfig(env_id="CarRacing-v3", resize=36, frame_stack=2, batch_size=8)
    algorithm = SAC(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
    runtime = TorchRuntime(cfg, 1)
    policy = algorithm.build_policy(CPU)
    learner = algorithm.make_learner(policy, runtime, DataShard(8), env_ranks=1)
    columns = transition_columns(algorithm.spaces)
    assert columns["obs"].dtype == torch.uint8
    generator = torch.Generator().manual_seed(0)
    batch = Transitions(
        obs=torch.randint(0, 256, (8, 2, 36, 36), dtype=torch.uint8, generator=generator),
        actions=torch.rand((8, 3), generator=generator),
        rewards=torch.rand(8, generator=generator),
        next_obs=torch.randint(0, 256, (8, 2, 36, 36), dtype=torch.uint8, generator=generator),
        terminated=torch.zeros(8),
    )
    encoder = list(policy.encoder.parameters())

    def encoder_and_head_gradients(loss_of) -> tuple[bool, bool]:
        learner.gradients.buffer.zero_()
        features = policy.encode(batch.obs)
        loss_of(features).backward()
        return any(p.grad.ne(0).any() for p in encoder), any(p.grad.ne(0).any() for p in policy.head_parameters())

    stats, noise = StatMeans(), policy.noise(8, None)
    assert encoder_and_head_gradients(lambda f: learner.critic_loss(batch, f, noise, stats)) == (True, False)
    assert encoder_and_head_gradients(lambda f: learner.actor_and_temperature_loss(f.detach(), noise, stats)) == (
        False,
        True,
    )
    target_before = [p.clone() for p in learner.target_encoder.parameters()]
    learned = learner.update(batch, iteration=1)
    assert all(math.isfinite(float(value)) for value in learned.values())
    assert any(not torch.equal(a, b) for a, b in zip(target_before, learner.target_encoder.parameters(), strict=True))


def lives_game_collector(signal: TrainingSignal, steps: int = 9) -> tuple[RolloutCollector, MLPActorCritic]:
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make("LivesGame-v0")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    spaces = EnvSpaces("LivesGame-v0", 2, envs.single_action_space, envs.single_observation_space)
    collector = RolloutCollector(
        envs,
        steps,
        spaces,
        CPU,
        ObservationNormalizer(2, False, CPU),
        RewardScaler(2, 0.99, False),
        [0, 1],
        torch.Generator().manual_seed(0),
        0.99,
        0.95,
        signal,
    )
    return collector, MLPActorCritic(2, envs.single_action_space)


def test_the_learner_sees_lives_and_clipped_rewards_while_the_game_score_is_logged():
    collector, agent = lives_game_collector(TrainingSignal(episodic_life=True, clip_rewards=True))
    episodes = collector.collect(agent)
    assert collector.buffer.rewards.unique().tolist() == [1.0]  # 5 points a step, clipped to its sign
    ends = collector.buffer.terminated[:, 0].nonzero().flatten().tolist()
    assert ends == [2, 5, 8]  # each lost life ends an episode for the learner
    assert episodes.returns == [45.0, 45.0] and episodes.lengths == [9, 9]  # the game: 3 lives, unclipped

    as_played, agent = lives_game_collector(TrainingSignal())
    as_played.collect(agent)
    assert as_played.buffer.rewards.unique().tolist() == [5.0]
    assert as_played.buffer.terminated[:, 0].nonzero().flatten().tolist() == [8]


@pytest.mark.parametrize("mode", ["sync", "native", pytest.param("envpool", marks=needs_envpool)])
def test_atari_runs_in_every_vector_mode_with_lives_for_the_learner(mode):
    cfg = PPOConfig(env_id="ALE/Breakout-v5", vector_mode=mode, num_envs=2, num_steps=32)
    algorithm = PPO(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
    source = algorithm.make_source(0, CPU, None, env_ranks=1, batch_rows=64)
    assert source.signal == TrainingSignal(episodic_life=True, clip_rewards=True)
    assert source.lives is not None and source.lives.tolist() == [5, 5]
    source.collect(algorithm.build_policy(CPU))
    assert source.buffer.obs.shape == (32, 2, 4, 84, 84) and source.buffer.obs.dtype == torch.uint8
    source.close()


def test_videos_show_the_envs_own_frames_not_the_agents_input(tmp_path):
    from moviepy import VideoFileClip  # the video extra, in the dev extra the tests run with

    spaces = inspect_env("rl/PixelCartPole-v1", SMALL_FRAMES)
    cfg = PPOConfig(env_id="rl/PixelCartPole-v1", resize=0, frame_stack=2, encoder="mlp")
    policy = PPO(cfg, spaces).build_policy(CPU)
    normalizer = ObservationNormalizer(spaces.obs_dim, False, CPU)
    evaluate_greedy(policy, cfg.env_id, 1, 0, normalizer, CPU, str(tmp_path / "videos"), preprocessing=SMALL_FRAMES)
    video = sorted(glob.glob(str(tmp_path / "videos" / "*.mp4")))[0]
    with VideoFileClip(video) as clip:
        assert tuple(clip.size) == (600, 400)  # CartPole's own rendering, not the 40 x 40 observation


PPO_ON_PIXELS = [*PIXEL_CARTPOLE, "--total-timesteps", "1024", "--update-epochs", "2", "--eval-episodes", "2"]
SAC_ON_PIXELS = [
    "sac",
    "--env-id",
    "CarRacing-v3",
    "--resize",
    "36",
    "--frame-stack",
    "2",
    "--total-timesteps",
    "300",
    "--learning-starts",
    "200",
    "--batch-size",
    "16",
    "--buffer-size",
    "1000",
    "--log-every",
    "100",
    "--eval-episodes",
    "0",
]


@pytest.mark.parametrize(
    ("args", "tags"),
    [
        (PPO_ON_PIXELS, ["Loss/policy_loss", "Loss/value_loss", "Rewards/rew_avg"]),
        pytest.param(SAC_ON_PIXELS, ["Loss/critic_loss"], marks=pytest.mark.slow),
    ],
    ids=["ppo", "sac"],
)
def test_one_decoupled_trainer_sharing_data_equals_one_coupled_process_on_pixels(tmp_path, args, tags):
    """A player and one trainer train exactly as one coupled process: the uint8 frames travel bit for bit
    (SAC's through its replay buffer too, its encoder trained by the critics)."""
    args = [*args, "--torch-threads", "1", "--share-data"]
    (tmp_path / "coupled").mkdir()
    (tmp_path / "decoupled").mkdir()
    coupled = run_ranks("python", SCRIPTS["fabric"], args, tmp_path / "coupled")
    decoupled = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path / "decoupled", nproc=2)
    assert coupled.returncode == 0 and decoupled.returncode == 0, (coupled.stderr + decoupled.stderr)[-3000:]
    coupled_dir, decoupled_dir = run_dir(tmp_path / "coupled", "fabric"), run_dir(tmp_path / "decoupled", "decoupled")
    coupled_agent, decoupled_agent = load_agent(coupled_dir)["policy"], load_agent(decoupled_dir)["policy"]
    assert any(name.startswith("encoder.convs") for name in coupled_agent)
    assert all(torch.equal(coupled_agent[name], decoupled_agent[name]) for name in coupled_agent)
    for tag in tags:
        assert read_scalars(coupled_dir)[tag] == read_scalars(decoupled_dir)[tag], tag
