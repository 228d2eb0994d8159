"""benchmarks/gpu.py's own logic, which needs no GPU: what each variant runs with, and a stopped study's table."""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu


def test_a_variant_is_its_precision_its_flags_and_the_openmp_wait_a_users_run_starts_with(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # as benchmarks/launch.py sets it for the CPU benchmarks
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    flags = gpu.variant_flags("bf16-mixed+eager+spin+1-thread")
    assert flags == ["--precision", "bf16-mixed", "--no-cuda-graphs", "--torch-threads", "1"]
    plain = gpu.variant_environment("32-true")
    assert "OMP_WAIT_POLICY" not in plain and "GOMP_SPINCOUNT" not in plain
    spinning = gpu.variant_environment(gpu.BASELINE + "32-true+spin")
    assert spinning["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in spinning


def test_sigterm_ends_the_rounds_and_the_table_keeps_the_runs_that_finished(monkeypatch, capsys):
    runs = []

    def run_setting(config, topology, variant, args):
        runs.append((config, variant))
        if len(runs) == 3:  # a time limit arrives during the third run
            os.kill(os.getpid(), signal.SIGTERM)
        return gpu.Result(1000.0 * len(runs), envs_share=0.25)

    monkeypatch.setattr(gpu, "run_setting", run_setting)
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--configs", "atari", "sac", "--variants", "32-true", "32-true+eager"])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        gpu.main()
    finally:
        signal.signal(signal.SIGTERM, handler)
    printed = capsys.readouterr().out
    assert runs == [("atari", "32-true"), ("atari", "32-true+eager"), ("sac", "32-true")]
    assert "stopped by SIGTERM" in printed
    assert "| atari | 32-true | 1,000 | 1.00 | 0.15 | 0 | 25% |" in printed
    assert "| atari | 32-true+eager | 2,000 | 2.00 | 0.29 | 0 | 25% |" in printed
    assert (
        "| sac | 32-true | failed or not run |" in printed and "| sac | 32-true+eager | failed or not run |" in printed
    )


def test_a_variant_with_an_option_of_one_config_runs_for_that_config_alone(monkeypatch, capsys):
    runs = []
    monkeypatch.setattr(gpu, "run_setting", lambda config, topology, variant, args: runs.append((config, variant)))
    monkeypatch.setattr(gpu.Measured, "add", lambda self, key, result: None)
    monkeypatch.setattr(gpu, "describe", lambda result: "")
    variants = ["32-true", "32-true+while-stepping"]
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--configs", "atari", "sac", "--variants", *variants])
    gpu.main()
    assert runs == [("atari", "32-true"), ("sac", "32-true"), ("sac", "32-true+while-stepping")]
    assert gpu.variant_flags("32-true+while-stepping") == ["--precision", "32-true", "--update-while-stepping"]


def test_the_recurrent_config_runs_only_when_named_and_its_row_has_no_leanrl_ratio(monkeypatch, capsys):
    from rl.cli import parse_config

    runs = []

    def run_setting(config, topology, variant, args):
        runs.append(config)
        return gpu.Result(500.0)

    monkeypatch.setattr(gpu, "run_setting", run_setting)
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--variants", "32-true"])
    gpu.main()
    assert runs == ["atari", "ppo-mujoco", "sac"]  # LeanRL's three
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--configs", "atari-recurrent", "--variants", "32-true+cuda-graphs"])
    gpu.main()
    assert runs[-1] == "atari-recurrent"
    assert "| atari-recurrent | 32-true+cuda-graphs | 500 | 1.00 |  | 0 |  |" in capsys.readouterr().out
    config = parse_config([*gpu.CONFIGS["atari-recurrent"], "--cuda-graphs"])  # a run the GPU machine accepts
    assert config.recurrent and config.replays_in_steps and config.vector_mode == "auto"


def test_leanrls_scripts_read_a_single_envs_episode_statistics_as_scalars():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "leanrl_shim"))
    import numpy as np
    from run_script import with_scalar_statistics

    class SingleEnvStatistics:  # gymnasium 0.29's RecordEpisodeStatistics around one env, at an episode's end
        is_vector_env = False

        def step(self, action):
            return np.zeros(3), 1.0, False, True, {"episode": {"r": np.array([-42.5]), "l": np.array([1000])}}

    *transition, infos = with_scalar_statistics(SingleEnvStatistics.step)(SingleEnvStatistics(), 0)
    assert float(infos["episode"]["r"]) == -42.5 and int(infos["episode"]["l"]) == 1000
    assert transition[1:] == [1.0, False, True]
