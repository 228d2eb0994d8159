"""--precision and --compile: what runs in which dtype, fp16's loss scaling, checkpoints, compiled losses, refusals."""

import glob
import os
import platform
import warnings
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, launch_together, load_agent, read_scalars, refusal_line, run_dir, run_ranks

from rl.algos.ppo.policy import CNNActorCritic, MLPActorCritic
from rl.algos.ppo.rollout import Batch
from rl.algos.ppo.update import PPOHyperparameters, minibatch_loss
from rl.algos.sac.networks import CriticEnsemble, SquashedGaussianActor
from rl.compiling import compiled
from rl.encoders import NatureCNN
from rl.envs import inspect_env
from rl.optim import DivergenceGuard, FlatGradients, TrainingDiverged, clip_and_step
from rl.precision import Precision, float32_state

CARTPOLE, PENDULUM = inspect_env("CartPole-v1"), inspect_env("Pendulum-v1")
LOW_PRECISIONS = ["bf16-mixed", "bf16-true"]


def networks(precision: Precision) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "mlp": MLPActorCritic(4, CARTPOLE.action_space, precision=precision),
        "cnn": CNNActorCritic(NatureCNN((2, 36, 36)), CARTPOLE.action_space, precision=precision),
        "actor": SquashedGaussianActor(3, PENDULUM.action_space, precision=precision),
        "critics": CriticEnsemble(3, 1, precision=precision),
    }


def outputs(name: str, network: torch.nn.Module) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    if name in ("mlp", "cnn"):
        obs = torch.rand(8, 4, generator=generator) if name == "mlp" else torch.randint(0, 256, (8, 2, 36, 36))
        return list(network(obs, torch.randint(0, 2, (8,))))
    if name == "actor":
        return list(network(torch.rand(8, 3, generator=generator), torch.randn(8, 1, generator=generator)))
    return [network(torch.rand(8, 3, generator=generator), torch.rand(8, 1, generator=generator))]


@pytest.mark.parametrize("name", ["mlp", "cnn", "actor", "critics"])
@pytest.mark.parametrize("precision", LOW_PRECISIONS)
def test_trunks_compute_at_the_precision_and_heads_in_float32(name, precision):
    low, full = networks(Precision(precision))[name], networks(Precision())[name]
    for (parameter_name, parameter), (_, reference) in zip(
        low.named_parameters(), full.named_parameters(), strict=True
    ):
        head = parameter_name.split(".")[0] in ("action_head", "critic_head", "mean", "log_std", "w3", "b3")
        expected = torch.float32 if head or precision == "bf16-mixed" else torch.bfloat16
        assert parameter.dtype == expected, parameter_name
        torch.testing.assert_close(parameter.float(), reference.float(), atol=0.01, rtol=0.01)  # bf16 rounding only
    low_outputs, full_outputs = outputs(name, low), outputs(name, full)
    for got, want in zip(low_outputs, full_outputs, strict=True):
        assert got.dtype == torch.float32  # log-probs, entropies, values, actions and Q-values leave in float32
        torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)
    assert any(not torch.equal(got, want) for got, want in zip(low_outputs, full_outputs, strict=True))


@pytest.mark.parametrize(
    ("capability", "hip", "refused"), [((7, 0), None, True), ((8, 0), None, False), ((9, 0), "6.2", False)]
)
def test_bf16_is_refused_on_a_gpu_older_than_ampere_though_torch_calls_it_supported(
    monkeypatch, capability, hip, refused
):
    """On a V100 `torch.cuda.is_bf16_supported()` is True (a bf16 tensor can be made there), yet its products are
    not all computed: the check reads the GPU's compute capability (AMD's GPUs all compute in bf16)."""
    from rl.errors import UsageError
    from rl.precision import check_precision_on_this_gpu

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    if refused:
        with pytest.raises(UsageError, match="bf16-mixed needs a GPU with bf16 support"):
            check_precision_on_this_gpu("bf16-mixed", cuda=True)
    else:
        check_precision_on_this_gpu("bf16-mixed", cuda=True)
    check_precision_on_this_gpu("16-mixed", cuda=True)


def test_our_autocast_is_fabrics():
    from lightning.fabric.plugins import MixedPrecision

    network = networks(Precision())["mlp"]
    obs = torch.rand(16, 4)
    with Precision("bf16-mixed").autocast():
        ours = network.actor_body(obs)
    with MixedPrecision("bf16-mixed", "cpu").forward_context():
        fabrics = network.actor_body(obs)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, fabrics)


@pytest.mark.parametrize(("short", "full"), [("bf16", "bf16-mixed"), ("16", "16-mixed"), ("32", "32-true")])
def test_fabrics_short_precision_names_are_taken_wherever_a_precision_is_given(tmp_path, monkeypatch, short, full):
    from lightning.fabric.connector import _convert_precision_to_unified_args

    from rl import PPOConfig
    from rl.cli import parse_config
    from rl.config_files import check_field_types

    with warnings.catch_warnings():  # Fabric warns that the short names are kept for old code
        warnings.simplefilter("ignore")
        assert _convert_precision_to_unified_args(short) == full  # Fabric's own reading of the short name
    assert parse_config(["--precision", short]).precision == full
    assert parse_config([f"--precision={short}"]).precision == full
    (tmp_path / "flags.yaml").write_text(f"precision: {short}\n")  # YAML reads 16 and 32 as numbers
    assert parse_config(["--config", str(tmp_path / "flags.yaml")]).precision == full
    built = PPOConfig(precision=short)
    check_field_types(built)
    assert built.precision == full
    monkeypatch.setenv("LT_PRECISION", short)  # `fabric run --precision bf16 ...`
    assert parse_config([]).precision == full


def test_checkpoint_state_is_float32_whatever_the_precision():
    state = {"agent": networks(Precision("bf16-true"))["mlp"].state_dict(), "step": 3, "ids": torch.arange(3)}
    saved = float32_state(state)
    floats = [tensor for tensor in saved["agent"].values() if tensor.is_floating_point()]
    assert floats and all(tensor.dtype == torch.float32 for tensor in floats)
    assert saved["step"] == 3 and saved["ids"].dtype == torch.int64


def test_bf16_true_keeps_one_gradient_buffer_per_dtype_and_clips_them_together():
    network = networks(Precision("bf16-true"))["mlp"]
    gradients = FlatGradients(list(network.parameters()))
    assert {span.dtype for span in gradients.spans(0, 0)} == {torch.bfloat16, torch.float32}
    loss, *_ = minibatch_loss(network, random_minibatch(16), hyperparameters())
    loss.backward()
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3, fused=True)
    before = [parameter.detach().clone() for parameter in network.parameters()]
    clip_and_step([optimizer], list(network.parameters()), 1e-3, None, DivergenceGuard(torch.device("cpu")))
    norm = torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in network.parameters()]))
    assert norm <= 1.01e-3  # one global norm over both dtypes
    assert all(not torch.equal(b, p) for b, p in zip(before, network.parameters(), strict=True))


def test_fp16_loss_scaling_skips_an_overflowed_step_instead_of_stopping():
    """16-mixed needs a GPU; its scaler logic is the same on the CPU, checked here with a CPU GradScaler."""
    network = networks(Precision())["mlp"]
    FlatGradients(list(network.parameters()))
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    before = [parameter.detach().clone() for parameter in network.parameters()]
    loss, *_ = minibatch_loss(network, random_minibatch(16), hyperparameters())
    scaler.scale(loss * float("inf")).backward()
    guard = DivergenceGuard(torch.device("cpu"))
    guard.guard([optimizer])
    clip_and_step([optimizer], list(network.parameters()), 0.5, scaler, guard)  # the scaler skips it
    assert all(torch.equal(b, p) for b, p in zip(before, network.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**15
    for parameter in network.parameters():
        parameter.grad.zero_()
    loss, *_ = minibatch_loss(network, random_minibatch(16), hyperparameters())
    scaler.scale(loss).backward()
    clip_and_step([optimizer], list(network.parameters()), 0.5, scaler, guard)
    guard.raise_if_diverged()  # an overflow the scaler skipped is no divergence
    assert all(not torch.equal(b, p) for b, p in zip(before, network.parameters(), strict=True))
    for parameter in network.parameters():
        parameter.grad.fill_(float("nan"))
    guard.guard([optimizer])  # the scaler's step took its own flag away
    clip_and_step([optimizer], list(network.parameters()), 0.5, None, guard)
    with pytest.raises(TrainingDiverged):  # without a scaler a non-finite gradient still stops the run
        guard.raise_if_diverged()


def hyperparameters() -> PPOHyperparameters:
    return PPOHyperparameters(0.2, True, 0.01, 0.5, 0.5, 1, 16, True)


def random_minibatch(rows: int) -> Batch:
    generator = torch.Generator().manual_seed(rows)
    return Batch(
        obs=torch.rand(rows, 4, generator=generator),
        actions=torch.randint(0, 2, (rows,), generator=generator),
        logprobs=-torch.rand(rows, generator=generator),
        values=torch.rand(rows, generator=generator),
        advantages=torch.randn(rows, generator=generator),
        returns=torch.rand(rows, generator=generator),
        is_transition=torch.ones(rows, dtype=torch.bool),
    )


COMPILED_TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}  # float32 kernels fused in another order


def test_the_compiled_minibatch_loss_and_gradients_equal_eager_ones():
    network, minibatch, hp = networks(Precision())["mlp"], random_minibatch(64), hyperparameters()

    def loss_and_gradients(loss_of):
        network.zero_grad()
        results = loss_of(network, minibatch, hp)
        results[0].backward()
        return [*results, *(parameter.grad.clone() for parameter in network.parameters())]

    eager = loss_and_gradients(minibatch_loss)
    compiled_ = loss_and_gradients(compiled(minibatch_loss, "default"))
    for got, want in zip(compiled_, eager, strict=True):
        torch.testing.assert_close(got, want, **COMPILED_TOLERANCE)


@pytest.mark.slow
def test_a_compiled_run_reports_its_compile_time_and_learns_as_an_eager_run(tmp_path):
    args = ["--total-timesteps", "1024", "--update-epochs", "2", "--eval-episodes", "0", "--no-progress-bar"]
    (tmp_path / "eager").mkdir(), (tmp_path / "compiled").mkdir()
    eager = run_ranks("python", SCRIPTS["fabric"], args, tmp_path / "eager", timeout=120)
    compiled_run = run_ranks("python", SCRIPTS["fabric"], [*args, "--compile"], tmp_path / "compiled", timeout=300)
    assert eager.returncode == 0 and compiled_run.returncode == 0, compiled_run.stderr[-3000:]
    assert "torch.compile: " in compiled_run.stdout and "left out of the env steps/s" in compiled_run.stdout
    assert "torch.compile" not in eager.stdout
    eager_scalars = read_scalars(run_dir(tmp_path / "eager", "fabric"))
    compiled_scalars = read_scalars(run_dir(tmp_path / "compiled", "fabric"))
    for tag in ("Loss/policy_loss", "Loss/value_loss", "Loss/entropy"):
        first_eager, first_compiled = eager_scalars[tag][0][1], compiled_scalars[tag][0][1]
        assert first_compiled == pytest.approx(first_eager, rel=1e-3, abs=1e-5), tag  # the same first update


NO_RECOMPILE = """
import torch
import rl


class NoCompilingAfter(rl.Callback):
    def __init__(self, step):
        self.step = step

    def on_iteration_end(self, state):
        if state.global_step >= self.step:  # warmed up: every compiled region has met each of its shapes
            torch.compiler.set_stance("fail_on_recompile")


if __name__ == "__main__":
    if "ALGORITHM" == "ppo":  # annealed learning rate; 256 rows in minibatches of 96, the last one short
        config = rl.preset("cartpole", total_timesteps=1536, num_envs=2, num_steps=128, per_rank_batch_size=96,
                           update_epochs=2, anneal_lr=True, compile=True, eval_episodes=1, progress_bar=False)
        warm = 256
    elif "ALGORITHM" == "ppo-recurrent":  # replayed step by step; acting's LSTM step compiled as well
        config = rl.preset("masked-cartpole", total_timesteps=96, num_envs=3, num_steps=8, per_rank_batch_size=16,
                           lstm_hidden_size=8, update_epochs=2, compile=True, eval_episodes=1, progress_bar=False)
        warm = 48
    elif "ALGORITHM" == "ppo-dict":  # a Dict of an image and a vector, read back from its rows of bytes
        config = rl.preset("cartpole", env_id="rl/TwoCues-v0", total_timesteps=512, num_envs=2, num_steps=64,
                           per_rank_batch_size=64, update_epochs=1, normalize_observations=False, compile=True,
                           eval_episodes=1, progress_bar=False)
        warm = 128
    else:
        config = rl.preset("sac/pendulum", total_timesteps=600, learning_starts=200, batch_size=32, log_every=100,
                           compile=True, eval_episodes=1, progress_bar=False)
        warm = 300
    rl.train(config, callbacks=[NoCompilingAfter(warm)])
    from torch._dynamo.utils import counters

    print("graph breaks:", sum(counters["graph_break"].values()))
"""


@pytest.mark.slow
def test_compiled_runs_have_no_graph_break_and_never_recompile_once_warm(tmp_path):
    """After the first update (PPO) or the first gradient steps (SAC), torch.compile's stance forbids compiling:
    the learning rate's annealing, a short last minibatch, other episode starts and the steps after never
    recompile."""
    jobs = []
    for algorithm in ("ppo", "sac", "ppo-dict", "ppo-recurrent"):
        (tmp_path / algorithm).mkdir()
        script = tmp_path / algorithm / "train.py"
        script.write_text(NO_RECOMPILE.replace("ALGORITHM", algorithm))
        jobs.append(("python", script, [], tmp_path / algorithm, 1))
    for finished in launch_together(*jobs):
        assert finished.returncode == 0, finished.stderr[-3000:]
        assert "graph breaks: 0" in finished.stdout


def test_compile_without_a_cpp_compiler_ends_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    line = refusal_line("fabric", ["--compile"], tmp_path)
    assert line.startswith("error: --compile: ") and "/nonexistent/g++" in line


@pytest.mark.parametrize(
    ("algorithm", "precision"),
    [("ppo", "bf16-mixed"), ("ppo", "bf16-true"), pytest.param("sac", "bf16-true", marks=pytest.mark.slow)],
)
def test_a_checkpoint_is_float32_resumes_exactly_and_at_another_precision(tmp_path, algorithm, precision):
    if algorithm == "ppo":
        args = ["--total-timesteps", "1024", "--checkpoint-every", "512", "--update-epochs", "2"]
    else:
        args = [
            "sac",
            "--total-timesteps",
            "240",
            "--learning-starts",
            "80",
            "--checkpoint-every",
            "160",
            "--save-buffer",
            "--batch-size",
            "32",
            "--log-every",
            "80",
        ]
    args += ["--precision", precision, "--eval-episodes", "0", "--no-progress-bar"]
    trained = run_ranks("python", SCRIPTS["fabric"], args, tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert ("warning: --precision bf16" in trained.stderr) == cpu_emulates_bf16(), trained.stderr[-3000:]
    folder = run_dir(tmp_path, "fabric")
    uninterrupted = load_agent(folder)
    checkpoints = sorted(glob.glob(str(folder / "checkpoints" / "step_*.ckpt")))
    first = torch.load(checkpoints[0], weights_only=True)
    assert first["config"]["precision"] == precision
    floats = [t for t in flatten(first) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert floats and not any(t.dtype in (torch.bfloat16, torch.float16) for t in floats)
    assert all(t.dtype == torch.float32 for t in first["policy"].values())

    os.remove(folder / "agent.ckpt")
    resumed = run_ranks("python", SCRIPTS["fabric"], [*args, "--resume-from", checkpoints[0]], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming a" not in resumed.stdout  # the same precision: nothing to say
    for name, tensor in uninterrupted["policy"].items():
        assert torch.equal(tensor, load_agent(folder)["policy"][name]), name

    other = run_ranks(
        "python", SCRIPTS["fabric"], [*args, "--precision", "32-true", "--resume-from", checkpoints[0]], tmp_path
    )
    assert other.returncode == 0, other.stderr[-3000:]
    assert f"resuming a {precision} checkpoint at --precision 32-true" in other.stdout
    assert "warning: --precision" not in other.stderr


def cpu_emulates_bf16() -> bool:
    """Read from the kernel's CPU flags, apart from how the program asks torch: an x86 CPU without AVX512-BF16
    or AMX."""
    if platform.machine() != "x86_64":
        return False
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    flags = set(" ".join(line for line in cpuinfo if line.startswith("flags")).split())
    return not flags & {"avx512_bf16", "amx_tile"}


def flatten(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from flatten(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from flatten(item)
    else:
        yield value
