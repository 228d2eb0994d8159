"""The GPU paths, on a CUDA GPU: each precision, --compile, the torchrun baseline and decoupled roles.

Skipped where torch sees no CUDA GPU (CI's machines); run them on one with `pytest tests/test_gpu.py`.
"""

import glob
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, Finished, launch, load_agent, read_scalars, run_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import host_overhead  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHORT_PPO = [
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    "2048",
    "--update-epochs",
    "2",
    "--eval-episodes",
    "2",
    "--no-progress-bar",
    "--cuda",
]
SHORT_SAC = [
    "sac",
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    "600",
    "--learning-starts",
    "200",
    "--batch-size",
    "64",
    "--log-every",
    "200",
    "--eval-episodes",
    "2",
    "--no-progress-bar",
    "--cuda",
]
PRECISIONS = ["32-true", "bf16-mixed", "16-mixed", "bf16-true"]


def launch_on_gpu(launcher: str, script: str, args: list[str], cwd, nproc: int = 1, timeout: float = 600) -> Finished:
    """`fabric run` or `torchrun`, as a user would. More processes than GPUs (decoupled roles on the CPU)
    need `fabric run --accelerator=cpu`, which only starts the processes: each role picks its device."""
    accelerator = "cpu" if nproc > torch.cuda.device_count() else "cuda"
    return launch(launcher, SCRIPTS[script], args, cwd, nproc, timeout, accelerator)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_fabric_and_torchrun_agree_on_a_gpu(tmp_path, precision):
    args = [*SHORT_PPO, "--precision", precision]
    runs = {}
    for launcher, mode in (("fabric run", "fabric"), ("torchrun", "torch")):
        (tmp_path / mode).mkdir()
        finished = launch_on_gpu(launcher, mode, args, tmp_path / mode)
        assert finished.returncode == 0, finished.stderr[-3000:]
        runs[mode] = load_agent(run_dir(tmp_path / mode, mode))
    for name, tensor in runs["fabric"]["policy"].items():
        torch.testing.assert_close(tensor, runs["torch"]["policy"][name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
@pytest.mark.parametrize("precision", PRECISIONS[1:])
def test_each_precision_trains_checkpoints_in_float32_and_resumes_at_another(tmp_path, algorithm, precision):
    args = [
        *(SHORT_PPO if algorithm == "ppo" else SHORT_SAC),
        "--precision",
        precision,
        "--checkpoint-every",
        "1024" if algorithm == "ppo" else "400",
        "--eval-episodes",
        "0",
    ]
    first = launch_on_gpu("fabric run", "fabric", args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = run_dir(tmp_path, "fabric")
    checkpoint = sorted(glob.glob(str(folder / "checkpoints" / "step_*.ckpt")))[0]
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert saved["config"]["precision"] == precision
    assert all(tensor.dtype == torch.float32 for tensor in saved["policy"].values())
    resumed = launch_on_gpu(
        "fabric run", "fabric", [*args, "--precision", "32-true", "--resume-from", checkpoint], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming a {precision} checkpoint at --precision 32-true" in resumed.stdout


@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "default+cuda-graphs"])
def test_a_compiled_run_on_a_gpu_starts_as_the_eager_run_does(tmp_path, algorithm, mode):
    """Compiled (and with `+cuda-graphs`, compiled kernels replayed as CUDA graphs)."""
    args = [*(SHORT_PPO if algorithm == "ppo" else SHORT_SAC), "--eval-episodes", "0"]
    (tmp_path / "eager").mkdir(), (tmp_path / "compiled").mkdir()
    eager = launch_on_gpu("fabric run", "fabric", args, tmp_path / "eager")
    compile_mode, *captured = mode.split("+")
    flags = ["--compile", "--compile-mode", compile_mode, *(["--cuda-graphs"] if captured else [])]
    compiled = launch_on_gpu("fabric run", "fabric", [*args, *flags], tmp_path / "compiled")
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr[-8000:]
    assert "torch.compile: " in compiled.stdout
    tags = ("Loss/policy_loss", "Loss/value_loss") if algorithm == "ppo" else ("Loss/critic_loss", "Loss/actor_loss")
    eager_scalars = read_scalars(run_dir(tmp_path / "eager", "fabric"))
    compiled_scalars = read_scalars(run_dir(tmp_path / "compiled", "fabric"))
    for tag in tags:
        assert compiled_scalars[tag][0][1] == pytest.approx(eager_scalars[tag][0][1], rel=1e-3, abs=1e-5), tag


@pytest.mark.parametrize("launcher", ["fabric run", "torchrun"])
@pytest.mark.parametrize("evaluator", [False, True])
def test_decoupled_players_on_the_cpu_leave_the_one_gpu_to_the_trainer(tmp_path, launcher, evaluator):
    args = [*SHORT_PPO, "--precision", "bf16-mixed", *(["--evaluator"] if evaluator else [])]
    finished = launch_on_gpu(launcher, "decoupled", args, tmp_path, nproc=3 if evaluator else 2)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert load_agent(run_dir(tmp_path, "decoupled"))["config"]["cuda"] is True


@pytest.mark.parametrize("script, nproc", [("fabric", 1), ("decoupled", 2)], ids=["coupled", "cpu-player"])
def test_a_recurrent_policy_replays_its_sequences_on_a_gpu(tmp_path, script, nproc):
    """Eagerly, the trainer plans each minibatch's segments from the starts it keeps on the host: from its own
    rollout, or from the rows a CPU player sent. Captured, it replays them step by step: the same first update
    within rounding (cuDNN's LSTM, which may use TF32, and the LSTM cell sum in other orders)."""
    args = ["--preset", "masked-cartpole", "--total-timesteps", "1024", "--eval-episodes", "0", "--no-progress-bar"]
    losses = {}
    for name, flags in (("eager", []), ("graphed", ["--cuda-graphs"])):
        (tmp_path / name).mkdir()
        finished = launch_on_gpu("fabric run", script, [*args, "--cuda", *flags], tmp_path / name, nproc=nproc)
        assert finished.returncode == 0, finished.stderr[-3000:]
        losses[name] = read_scalars(run_dir(tmp_path / name, script))
        assert all(math.isfinite(value) for _, value in losses[name]["Loss/value_loss"])
    for tag in ("Loss/policy_loss", "Loss/value_loss"):
        first_eager, first_graphed = losses["eager"][tag][0][1], losses["graphed"][tag][0][1]
        assert first_graphed == pytest.approx(first_eager, rel=1e-2, abs=1e-3), tag


def test_a_captured_step_replays_what_the_eager_step_computes():
    from rl.cuda_graphs import CapturedSteps

    weights = torch.zeros(3, device="cuda")

    def step(kind: int, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        weights.add_(inputs * kind)  # state the step changes in place, as an optimizer does
        return {"total": weights.sum(), "scaled": inputs * kind}

    captured = CapturedSteps(step, warm_up=2)
    expected = torch.zeros(3, device="cuda")
    for call in range(8):
        kind = 1 + call % 2  # two kinds, alternating: each captured at its third call
        inputs = torch.arange(3.0, device="cuda") + call
        outputs = captured(kind, inputs)
        expected += inputs * kind
        torch.testing.assert_close(outputs["scaled"], inputs * kind, rtol=0, atol=0)
        torch.testing.assert_close(outputs["total"], expected.sum(), rtol=0, atol=0)
    assert set(captured.graphs) == {1, 2}


@pytest.mark.parametrize("algorithm", ["ppo", "sac", "sac --no-update-while-stepping", "sac --actor-after-critics"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_cuda_graphs_train_as_the_eager_step_does_and_resume(tmp_path, algorithm, precision):
    short, every = (SHORT_PPO, "1024") if algorithm == "ppo" else (SHORT_SAC, "400")
    args = [
        *short,
        *algorithm.split()[1:],
        "--precision",
        precision,
        "--eval-episodes",
        "0",
        "--checkpoint-every",
        every,
    ]
    for name, flags in (("eager", ["--no-cuda-graphs"]), ("graphed", ["--cuda-graphs"])):
        (tmp_path / name).mkdir()
        finished = launch_on_gpu("fabric run", "fabric", [*args, *flags], tmp_path / name)
        assert finished.returncode == 0, finished.stderr[-5000:]
    eager = load_agent(run_dir(tmp_path / "eager", "fabric"))["policy"]
    graphed = load_agent(run_dir(tmp_path / "graphed", "fabric"))["policy"]
    for name, tensor in eager.items():
        difference = (tensor - graphed[name]).abs().max().item()
        assert difference == 0, f"{name}: the captured run differs by up to {difference}"
    folder = run_dir(tmp_path / "graphed", "fabric")
    checkpoint = sorted(glob.glob(str(folder / "checkpoints" / "step_*.ckpt")))[0]
    resumed = launch_on_gpu(
        "fabric run", "fabric", [*args, "--cuda-graphs", "--resume-from", checkpoint], tmp_path / "graphed"
    )
    assert resumed.returncode == 0, resumed.stderr[-5000:]


GPU_CONFIGS = host_overhead.CONFIGS | {
    # a recurrent policy's CUDA graphs are a choice (off by default): its acting and step-by-step replay
    "ppo/recurrent-captured": host_overhead.Config("masked-cartpole", {"cuda_graphs": True}, timed_iterations=40),
}


@pytest.mark.parametrize(
    "config", [*host_overhead.STEADY_STATE_CONFIGS, "sac/pendulum-while-stepping", "ppo/recurrent-captured"]
)
def test_the_steady_state_loop_makes_no_synchronizing_call(tmp_path, monkeypatch, config):
    """The one wait a step needs, for its actions' copy to the envs, waits on an event recorded after that copy
    (`HostCopy`), which torch's sync debug mode does not count: nothing else may wait."""
    monkeypatch.chdir(tmp_path)  # the runs write their folders under ./logs
    sites = host_overhead.sync_sites(GPU_CONFIGS[config], iterations=2)
    assert not sites, f"the host waited for the GPU (file:line -> times): {sites}"


def test_the_sync_debug_mode_finds_a_wait_where_there_is_one():
    with host_overhead.SyncSites() as watched:
        torch.ones(1, device="cuda").item()
    assert any(site.startswith("tests/test_gpu.py:") for site in watched.sites), dict(watched.sites)


def test_captured_sac_acting_draws_what_eager_acting_draws():
    """The same actions and log-probs from the same generator, while the weights change in place between steps
    as the optimizer changes them, and for two batch sizes."""
    import gymnasium as gym

    from rl.algos.sac.networks import SquashedGaussianActor

    box = gym.spaces.Box(-1.0, 1.0, (3,))
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    eager = SquashedGaussianActor(5, box, (32, 32)).to(cuda)
    torch.manual_seed(0)
    captured = SquashedGaussianActor(5, box, (32, 32)).to(cuda)
    captured.capture_acting()
    generators = [torch.Generator(cuda).manual_seed(1) for _ in range(2)]
    for step in range(8):
        rows = 3 if step % 4 else 1
        obs = torch.randn(rows, 5, device=cuda)
        outputs = []
        for agent, generator in zip((eager, captured), generators, strict=True):
            outputs.append(agent.act(obs, generator, agent.exploration_matrices(rows, generator)))
            with torch.no_grad():
                for parameter in agent.parameters():
                    parameter.add_(0.01)
        for ours, theirs in zip(*outputs, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


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
def test_captured_ppo_steps_fill_the_rollouts_eager_steps_fill(changes, monkeypatch):
    """PPO's captured step (acting, and the rollout's row at a device-side cursor) fills the eager step's
    rollouts bit for bit, over four rollouts: the normalizers change between them, and the weights in place."""
    import dataclasses

    import envs_for_tests  # noqa: F401  (registers the tests' envs)

    from rl.algos.ppo.algorithm import PPO
    from rl.algos.ppo.config import PPOConfig
    from rl.envs import inspect_env

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # as runs set it (--torch-deterministic)
    cuda = torch.device("cuda")
    filled = []
    for captured in (False, True):
        cfg = PPOConfig(num_envs=2, num_steps=16, per_rank_batch_size=16, cuda=True, cuda_graphs=captured, **changes)
        algorithm = PPO(cfg, inspect_env(cfg.env_id, cfg.preprocessing()))
        torch.manual_seed(0)
        policy = algorithm.build_policy(cuda)
        source = algorithm.make_source(0, cuda, None, env_ranks=1, batch_rows=32)
        rollouts = []
        for _ in range(4):
            source.collect(policy)
            source.next_batch(0, lambda tensor: tensor)
            rollouts.append({f.name: getattr(source.buffer, f.name).clone() for f in dataclasses.fields(source.buffer)})
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.add_(0.01)
        filled.append(rollouts)
    for eager, captured_rollout in zip(*filled, strict=True):
        for name, column in eager.items():
            assert torch.equal(column, captured_rollout[name]), f"{name} differs"


def test_captured_gae_computes_what_eager_gae_computes():
    import functools

    from rl.algos.ppo.rollout import compute_gae
    from rl.cuda_graphs import captured_function

    gae = functools.partial(compute_gae, gamma=0.99, gae_lambda=0.95)
    captured = captured_function(gae)
    generator = torch.Generator("cuda").manual_seed(0)
    for _ in range(5):  # the first two run eagerly, the third is captured, the rest replay it
        steps, envs = 64, 4
        draw = functools.partial(torch.rand, generator=generator, device="cuda")
        rollout = (
            draw(steps, envs),
            draw(steps, envs),
            draw(steps, envs) < 0.05,
            draw(steps, envs) < 0.05,
            draw(steps, envs),
            draw(envs),
        )
        for ours, theirs in zip(captured(*rollout), gae(*rollout), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def _learners_on_one_gpu_over_gloo(rank: int, port: int, folder: str, algorithm_name: str) -> None:
    """Two learners on one GPU (NCCL refuses that, gloo carries CUDA tensors): the eager learner and the
    captured one take the same steps, each rank on its own data."""
    from conftest import join_as_rank
    from test_ppo import random_batch
    from test_sac import random_transitions

    from rl.algos.ppo.algorithm import PPO
    from rl.algos.ppo.config import PPOConfig
    from rl.algos.sac.algorithm import SAC
    from rl.algos.sac.config import SACConfig
    from rl.batch import DataShard
    from rl.envs import inspect_env
    from rl.runtime import TorchRuntime

    join_as_rank(rank, port)
    runtime = TorchRuntime(SACConfig(), 2)  # a gloo group: the config asks for no GPU
    cuda = runtime.device = torch.device("cuda")
    weights = {}
    for captured in (False, True):
        if algorithm_name == "sac":
            cfg = SACConfig(batch_size=16, gradient_steps=2, policy_frequency=2, cuda=True, cuda_graphs=captured)
            algorithm = SAC(cfg, inspect_env("Pendulum-v1"))
            data = [random_transitions(32, seed=10 * rank + i).map(lambda t: t.to(cuda)) for i in range(1, 7)]
        else:
            cfg = PPOConfig(env_id="Pendulum-v1", num_envs=2, num_steps=16, per_rank_batch_size=12, cuda=True)
            cfg.cuda_graphs = captured
            algorithm = PPO(cfg, inspect_env("Pendulum-v1"))
            generator = torch.Generator().manual_seed(rank)
            data = [random_batch(32, algorithm, generator).map(lambda t: t.to(cuda)) for _ in range(3)]
        policy = algorithm.build_policy(cuda)
        learner = algorithm.make_learner(policy, runtime, DataShard(len(data[0])), env_ranks=2)
        for iteration, batch in enumerate(data, start=1):
            learner.update(batch, iteration)
        steps = learner.step if algorithm_name == "sac" else learner.captured
        cuts = sorted(len(graph.graphs.graphs) - 1 for graph in steps.graphs.values()) if captured else []
        weights[captured] = ([t.detach().cpu() for t in learner.weight_tensors()], cuts)
    torch.save(weights, f"{folder}/rank{rank}.pt")
    runtime.shutdown()


@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
def test_a_step_captured_among_learners_averages_between_its_graphs_as_the_eager_step_does(tmp_path, algorithm):
    import torch.multiprocessing as mp
    from conftest import free_port

    mp.spawn(_learners_on_one_gpu_over_gloo, args=(free_port(), str(tmp_path), algorithm), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    for weights in ranks:
        (eager, _), (graphed, cuts) = weights[False], weights[True]
        # One cut per gradient average: PPO's minibatch step (of 12 rows, and the last of 8) has one; SAC's step
        # one, or two with its delayed actor's catch-up.
        assert cuts == ([1, 1] if algorithm == "ppo" else [1, 2]), cuts
        for ours, theirs in zip(eager, graphed, strict=True):
            assert torch.equal(ours, theirs), (ours - theirs).abs().max()
    for ours, theirs in zip(ranks[0][True][0], ranks[1][True][0], strict=True):
        assert torch.equal(ours, theirs)  # averaged gradients: the learners stay in step


def test_the_storage_check_reads_the_memory_of_the_gpu_it_names():
    from rl.algos.sac.replay import check_buffer_fits
    from rl.batch import Column
    from rl.errors import UsageError

    last = torch.cuda.device_count() - 1
    with pytest.raises(UsageError, match="its GPU has"):
        check_buffer_fits(10**13, {"obs": Column((100,))}, processes_here=4, gpu=last)
    fits_once = int(torch.cuda.mem_get_info(last)[0] * 0.4) // 400  # 40% of its free memory; 4 buffers would not fit
    check_buffer_fits(
        fits_once, {"obs": Column((100,))}, processes_here=4, gpu=last
    )  # each process has a GPU of its own
