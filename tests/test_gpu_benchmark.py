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


def test_the_envpool_atari_config_runs_only_when_named_and_is_held_to_leanrls_atari_figure(monkeypatch, capsys):
    from rl.cli import parse_config

    monkeypatch.setattr(gpu, "run_setting", lambda config, topology, variant, args: gpu.Result(3404.5))
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--configs", "atari", "atari-envpool", "--variants", "32-true"])
    gpu.main()
    printed = capsys.readouterr().out
    assert "| atari-envpool | 32-true | 3,404 | 1.00 | 0.50 | 0 |  |" in printed
    assert "atari-envpool" not in gpu.DEFAULT_CONFIGS
    config = parse_config([*gpu.CONFIGS["atari-envpool"], "--cuda"])
    assert config.vector_mode == "envpool" and config.env_id == "ALE/Breakout-v5"


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


def test_leanrls_folder_given_relative_reaches_runs_that_start_in_a_scratch_folder(tmp_path, monkeypatch):
    (tmp_path / "lean").mkdir()
    (tmp_path / "lean" / "sac_continuous_action_torchcompile.py").write_text("")
    monkeypatch.chdir(tmp_path)
    scripts = []

    def run_in_scratch(command, env, limit_seconds):
        scripts.append(Path(command[2]))
        return gpu.subprocess.CompletedProcess(command, 0, "leanrl speed: 700.0\n", "")

    monkeypatch.setattr(gpu, "run_in_scratch", run_in_scratch)
    monkeypatch.setattr(gpu, "install_leanrl_wheels", lambda leanrl: tmp_path)
    monkeypatch.setattr(gpu, "run_setting", lambda config, topology, variant, args: gpu.Result(600.0))
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--configs", "sac", "--variants", "32-true", "--leanrl", "lean"])
    gpu.main()
    assert scripts == [tmp_path / "lean" / "sac_continuous_action_torchcompile.py"]
    assert scripts[0].is_absolute() and scripts[0].is_file()


def test_a_run_past_its_limit_is_stopped_with_the_processes_it_started():
    started_a_child = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    done = gpu.run_in_scratch([sys.executable, "-c", started_a_child], dict(os.environ), limit_seconds=3)
    assert done.returncode != 0
    assert gpu.last_line(done.stderr) == "ran past --run-limit (3 s) and was stopped"
    child = int(done.stdout.split()[0])
    deadline = gpu.time.monotonic() + 10
    while gpu.time.monotonic() < deadline and child_alive(child):
        gpu.time.sleep(0.1)
    assert not child_alive(child)


def child_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(")")[-1].split()[0] == "Z")


def test_the_profile_splits_an_iteration_by_phase_and_puts_the_methods_back(tmp_path, monkeypatch):
    """benchmarks/gpu_profile.py's phases, on the CPU: each phase's range is found, and the rest is what is left."""
    import gpu_profile
    from torch.profiler import profile

    import rl
    from rl.experience import Collector

    monkeypatch.chdir(tmp_path)
    original = Collector.step_envs
    config = rl.preset("cartpole", total_timesteps=1024, eval_episodes=0, progress_bar=False, torch_threads=1)
    with gpu_profile.phases_marked(), profile() as profiled:
        rl.train(config)
    assert Collector.step_envs is original
    events = profiled.key_averages()
    wall_us = 1e9
    *phases, rest = gpu_profile.phase_lines(events, steps=1, wall_us=wall_us, gpu_us=0.0)
    assert [line.split(":")[0].strip(" -") for line in phases] == list(gpu_profile.PHASES)
    hosts = [float(line.split("host ")[1].split(" ms")[0]) for line in [*phases, rest]]
    assert all(host > 0 for host in hosts) and abs(sum(hosts) - wall_us / 1000) < 0.01  # each rounded to 0.001


def test_the_env_groups_variant_runs_for_the_atari_configs_alone_which_take_it():
    from rl.cli import parse_config

    assert [config for config in gpu.CONFIGS if gpu.runs_with(config, "32-true+2-groups")] == [
        "atari",
        "atari-envpool",
        "atari-recurrent",
    ]
    config = parse_config([*gpu.CONFIGS["atari"], *gpu.variant_flags("32-true+2-groups"), "--cuda"])
    assert config.env_groups == 2 and config.num_envs == 8


def test_sacs_4_step_phases_run_for_sac_alone_and_every_topology_takes_them():
    from rl.cli import parse_config

    assert [config for config in gpu.CONFIGS if gpu.runs_with(config, "32-true+4-step-phases")] == ["sac"]
    for topology in gpu.TOPOLOGIES.values():
        mode = "coupled" if topology.script == "train_fabric.py" else "decoupled"
        flags = [*gpu.CONFIGS["sac"], *gpu.variant_flags("32-true+4-step-phases"), *topology.flags, "--cuda"]
        config = parse_config(flags, mode=mode)
        assert (config.train_freq, config.gradient_steps) == (4, 4)
