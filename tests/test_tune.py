"""`python -m rl.tune`: tuning processes that share one Optuna study in SQLite, pruning, and a study that resumes."""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
import yaml
from conftest import child_env, child_pids, start_as_foreground_job, still_running, without_lock_watchers

from rl.cli import parse_config
from rl.tune import (
    DEFAULT_SPACES,
    check_searched_not_given,
    check_space_values,
    check_tuner_sets_alone,
    close_abandoned_trials,
)

TRAINING = ["--", "--preset", "cartpole", "--total-timesteps", "2048", "--eval-episodes", "2"]


def tune(tmp_path, *flags: str, training: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [
        sys.executable,
        "-m",
        "rl.tune",
        "--storage",
        storage,
        "--study-name",
        "cartpole",
        "--out",
        str(tmp_path / "runs"),
        "--eval-every",
        "512",
        *flags,
        *TRAINING,
        *training,
    ]
    return subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=400)


def trials(tmp_path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="cartpole").trials


@pytest.mark.slow
def test_two_tuning_processes_share_one_study_that_resumes_and_write_the_best_config(tmp_path):
    first = tune(tmp_path, "--trials", "3", "--workers", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    done = [trial for trial in trials(tmp_path) if trial.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 3 and len({trial.user_attrs["tuner_pid"] for trial in done}) == 2  # both processes tuned
    assert all(sorted(trial.intermediate_values) == [512, 1024, 1536] for trial in done)  # each one reported
    best = tmp_path / "runs" / "cartpole" / "best.yaml"
    flags = yaml.safe_load(best.read_text())
    top = max(done, key=lambda trial: trial.value)
    assert all(flags[name] == value for name, value in top.params.items())
    assert (
        "run_name" not in flags and parse_config(["--config", str(best)]).learning_rate == top.params["learning_rate"]
    )
    again = tune(tmp_path, "--trials", str(len(done) + 1))  # a stopped study goes on from where it was
    assert again.returncode == 0, again.stderr[-3000:]
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    assert sum(trial.state in finished for trial in trials(tmp_path)) == len(done) + 1  # one more, not a new study


def test_a_pruned_trial_is_stopped_at_its_first_evaluation(tmp_path):
    longer = ("--total-timesteps", "100000")  # so the run is still going when the tuner reads its first evaluation
    pruned = tune(tmp_path, "--trials", "1", "--prune-below", "1e9", training=longer)
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    assert re.match(r"trial 0: pruned at step 512, where its return was [\d.]+; learning_rate ", pruned.stdout)
    (trial,) = trials(tmp_path)
    assert trial.state == optuna.trial.TrialState.PRUNED and sorted(trial.intermediate_values) == [512]
    run = tmp_path / "runs" / "cartpole" / "fabric_logs" / "trial-0"
    assert not (run / "agent.ckpt").exists() and list((run / "checkpoints").glob("step_*.ckpt"))  # stopped, saved


@pytest.mark.parametrize(
    ("training", "told"),
    [
        (("--num-envs", "0"), "error: --num-envs: must be positive, got 0"),
        (("--num-envz", "2"), "error: --num-envz: Unrecognized options: --num-envz, 2; did you mean --num-envs?"),
    ],
)
def test_training_flags_that_every_trial_would_fail_on_stop_the_tuner_with_their_line_before_any_trial(
    tmp_path, training, told
):
    refused = tune(tmp_path, "--trials", "2", training=training)
    assert refused.returncode == 2
    assert refused.stderr.strip() == told
    assert not (tmp_path / "study.db").exists()


@pytest.mark.parametrize(
    ("argv", "word", "says"),
    [
        (["--n-trials", "10"], "--n-trials", "rl-zoo's flag, not this program's: --trials"),
        (["--n-jobs", "2"], "--n-jobs", "rl-zoo's flag, not this program's: --workers"),
        (["--algo", "sac", "--env", "Hopper-v5"], "--algo", "the training flags follow --: python -m rl.tune"),
        (["--env-id", "Hopper-v5", "--", "sac"], "--env-id", "a training flag: give it after --, as python -m"),
        (["--trials", "3", "--total-timesteps=100"], "--total-timesteps", "a training flag: give it after --"),
    ],
)
def test_rl_zoos_tuning_flags_and_training_flags_before_the_dashes_are_answered(argv, word, says):
    from rl.errors import UsageError
    from rl.tune import parse

    with pytest.raises(UsageError) as refused:
        parse(argv)
    assert refused.value.flag == word and says in str(refused.value)


@pytest.mark.slow
def test_a_study_goes_on_only_over_the_space_it_searched_and_with_the_training_flags_of_its_trials(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {choices: [0.002]}\n")
    first = tune(tmp_path, "--trials", "1", "--space", str(space))
    assert first.returncode == 0, first.stderr[-3000:]
    trial_line, best_line = first.stdout.splitlines()[-2:]  # each trial's line as it ends, then the best
    assert re.fullmatch(r"trial 0: greedy return [\d.]+; learning_rate 0.002 \(1 done, --trials 1\)", trial_line)
    assert best_line.startswith("best: trial 0, greedy return ") and "; learning_rate 0.002; its flags: " in best_line
    space.write_text("learning_rate: {choices: [0.002, 0.003]}\n")  # Optuna refuses choices that change
    refused = tune(tmp_path, "--trials", "2", "--space", str(space))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: --study-name: the study 'cartpole' in sqlite:///{tmp_path / 'study.db'} searched another space "
        "(over learning_rate; learning_rate differ): give this search a --study-name of its own"
    )
    space.write_text("learning_rate: {choices: [0.002]}\n")
    other_env = tune(tmp_path, "--trials", "2", "--space", str(space), training=("--env-id", "Acrobot-v1"))
    assert other_env.returncode == 2
    assert other_env.stderr.strip() == (
        f"error: --study-name: the study 'cartpole' in sqlite:///{tmp_path / 'study.db'} trained its trials with "
        "other training flags: --env-id CartPole-v1 (now Acrobot-v1); give this search a --study-name of its own"
    )
    assert len(trials(tmp_path)) == 1


@pytest.mark.slow
def test_failed_trials_count_so_a_study_whose_runs_all_fail_ends_and_says_where_their_output_is(tmp_path):
    fails = ("--env-id", "envs_for_tests:Misbehaves-v0", "--env-kwargs", '{"after": 300}')  # a run's env raises
    done = tune(tmp_path, "--trials", "2", training=fails)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    log = tmp_path / "runs" / "cartpole" / "trial-1.log"
    assert lines[-2].startswith(f"trial 1: failed (exit 1, its output in {log}); ")
    assert lines[-2].endswith("(2 done, --trials 2)")
    assert "lost contact with the simulator" in log.read_text()
    assert lines[-1] == "no trial of the study 'cartpole' has finished: no best.yaml"
    again = tune(tmp_path, "--trials", "2", training=fails)
    assert again.stdout.splitlines() == [
        f"the study 'cartpole' in sqlite:///{tmp_path / 'study.db'} holds 2 trials already: none is left to run "
        "(a larger --trials runs more)",
        lines[-1],
    ]


def tuner_in_its_first_trial(
    tmp_path, workers: int = 1, *flags: str, training: tuple[str, ...] = ()
) -> subprocess.Popen:
    """A tuner of one trial per worker, as a shell's foreground job, returned once each trial's run has evaluated."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    longer = ["--total-timesteps", "100000"]  # still training when it is stopped
    command = [sys.executable, "-m", "rl.tune", "--storage", storage, "--study-name", "cartpole", "--out", "runs"]
    command += ["--eval-every", "512", "--trials", "1", "--workers", str(workers), *flags, *TRAINING, *longer]
    command += training
    tuner = start_as_foreground_job(command, tmp_path)
    logs = tmp_path / "runs" / "cartpole" / "fabric_logs"
    every_metrics = [logs / f"trial-{number}" / "csv" / "metrics.csv" for number in range(workers)]
    deadline = time.monotonic() + 240  # each tuner imports and starts its run: a minute or more under CI's load
    while not all(metrics.exists() and "Eval/" in metrics.read_text() for metrics in every_metrics):
        assert tuner.poll() is None and time.monotonic() < deadline, "a trial's run did not reach its evaluation"
        time.sleep(0.2)
    return tuner


def test_ctrl_c_stops_the_tuner_and_its_trial_which_the_study_does_not_count(tmp_path):
    # Iterations of 4,096 steps (4 envs): the run reaches its checkpoint a second or more after Ctrl-C, after the
    # tuner has passed Ctrl-C on, which must then be the only one the run hears (a second would stop it without one).
    tuner = tuner_in_its_first_trial(tmp_path, training=("--num-steps", "1024"))
    metrics = tmp_path / "runs" / "cartpole" / "fabric_logs" / "trial-0" / "csv" / "metrics.csv"
    os.killpg(
        tuner.pid, signal.SIGINT
    )  # the terminal's Ctrl-C: the tuner hears it (its run, in a session of its own, does not)
    out, err = tuner.communicate(timeout=120)
    assert tuner.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert out.splitlines() == [
        "trial 0: interrupted (Ctrl-C); its run's checkpoints are in runs/cartpole/fabric_logs/trial-0",
        "no trial of the study 'cartpole' has finished: no best.yaml",
        "interrupted (Ctrl-C): the same command goes on with this study",
    ]
    assert list(metrics.parent.parent.glob("checkpoints/step_*.ckpt"))
    # The interrupted trial is not counted, nor does it hold the study to its training flags: one more runs,
    # shorter.
    again = tune(tmp_path, "--trials", "1")
    assert again.returncode == 0 and again.stdout.startswith("trial 1: greedy return "), again.stdout


def test_a_second_ctrl_c_stops_the_trials_run_at_once_and_the_tuner_says_no_checkpoint_was_written(tmp_path):
    # The tuner passes the second press on a poll (0.5 s) after the first. Iterations of 16,384 steps (4 envs, some
    # 4 s here) make sure the second reaches the run before its checkpoint at the iteration's end.
    tuner = tuner_in_its_first_trial(tmp_path, training=("--num-steps", "4096"))
    os.killpg(tuner.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(tuner.pid, signal.SIGINT)
    out, err = tuner.communicate(timeout=120)
    assert tuner.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert out.splitlines()[0] == (
        "trial 0: interrupted (Ctrl-C); its run stopped before its first checkpoint (runs/cartpole/fabric_logs/trial-0)"
    )
    log = (tmp_path / "runs" / "cartpole" / "trial-0.log").read_text()
    assert "interrupted (Ctrl-C) twice during training: stopped at once" in log, log[-3000:]


@pytest.mark.parametrize(
    ("signum", "workers"), [(signal.SIGTERM, 1), (signal.SIGKILL, 2)], ids=["SIGTERM", "SIGKILL, two tuners"]
)
def test_a_tuner_stopped_by_a_signal_to_it_alone_stops_its_trials_runs_which_checkpoint(
    tmp_path, capsys, signum, workers
):
    # kill, or kill -9 and the out-of-memory killer, which leave the tuner no time: no run trains on unwatched, and
    # no tuner it started goes on with the study.
    tuner = tuner_in_its_first_trial(tmp_path, workers)
    started = child_pids(tuner.pid)  # its trial's run, and the other tuner
    grandchildren = [grandchild for child in started for grandchild in child_pids(child)]
    started += without_lock_watchers(grandchildren)  # the other tuner's trial run
    assert len(started) == 2 * workers - 1
    tuner.send_signal(signum)
    out, err = tuner.communicate(timeout=120)
    assert not still_running(started, 60)
    stopped = re.compile(r"^interrupted (at step [\d,]+: checkpoint written|\(Ctrl-C\) before training began)", re.M)
    for log in (tmp_path / "runs" / "cartpole").glob("trial-*.log"):
        assert stopped.search(log.read_text()), log.read_text()[-3000:]
    if signum == signal.SIGKILL:
        # The killed tuner's own trial stayed running in the study: the next tuner ends it as interrupted, and only
        # that one (the other tuner, stopped by Ctrl-C, ended its own).
        left = [trial.number for trial in trials(tmp_path) if trial.state == optuna.trial.TrialState.RUNNING]
        assert len(left) == 1
        study = optuna.load_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="cartpole")
        close_abandoned_trials(study)
        assert capsys.readouterr().out.startswith(f"trial {left[0]}: its tuner (pid {tuner.pid}) ended without")
        assert all(trial.state == optuna.trial.TrialState.FAIL for trial in trials(tmp_path))
        assert all(trial.user_attrs["interrupted"] for trial in trials(tmp_path))  # so --trials counts neither
        return
    assert tuner.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert out.splitlines() == [
        "trial 0: interrupted (SIGTERM); its run's checkpoints are in runs/cartpole/fabric_logs/trial-0",
        "no trial of the study 'cartpole' has finished: no best.yaml",
    ]
    assert err.strip().splitlines()[-1] == (
        "error: rl.tune: stopped by SIGTERM (a kill, scancel or shutdown); its trials were stopped, and the same "
        "command goes on with this study"
    )


@pytest.mark.slow
def test_a_space_file_the_random_sampler_and_the_timeout_shape_the_study(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {choices: [0.002]}\nupdate_epochs: {low: 2, high: 3}\n")
    done = tune(tmp_path, "--trials", "5", "--space", str(space), "--sampler", "random", "--timeout", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = trials(tmp_path)  # the first trial outlasts the timeout: no second one starts
    assert trial.params["learning_rate"] == 0.002 and trial.params["update_epochs"] in (2, 3)
    assert set(trial.params) == {"learning_rate", "update_epochs"}


@pytest.mark.parametrize(
    ("text", "told"),
    [
        ("- learning_rate\n", "{space} must map each flag name to {{low, high}} or {{choices}}"),
        ("learning_rate: {min: 1.0e-5, max: 1.0e-3}\n", "{space}: learning_rate must be {{low, high}}"),
        ("learning_rate: {low: abc, high: 1e-3}\n", "{space}: learning_rate: low and high must be numbers"),
        ("learning_rate: {low: 1e-3, high: 1e-5}\n", "{space}: learning_rate: needs low < high"),
        ("tau: {choices: [0.01]}\n", "{space}: tau is no flag of PPO"),
        ("ent_coeff: {low: 0.0, high: 0.01}\n", "{space}: ent_coeff is no flag of PPO: did you mean ent_coef?"),
        (
            "activation_function: {choices: [tanh, gelu]}\n",
            "{space}: activation_function gelu: --activation-function: 'gelu' is not one of relu, tanh",
        ),
        ("gamma: {low: 0.9, high: 1.5}\n", "{space}: gamma 1.5: --gamma: must be in (0, 1], got 1.5"),
        ("eval_every: {choices: [256, 512]}\n", "{space}: eval_every is set for each trial's run, not searched"),
        (  # YAML keeps the last in silence: which range was meant?
            "gamma: {low: 0.9, high: 0.99}\ngamma: {low: 0.95, high: 0.999}\n",
            "{space} sets 'gamma' twice (lines 1 and 2): keep one",
        ),
    ],
)
def test_a_bad_space_file_is_refused_in_one_line_before_any_trial(tmp_path, text, told):
    space = tmp_path / "space.yaml"
    space.write_text(text)
    refused = tune(tmp_path, "--space", str(space))
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: --space: " + told.format(space=space))
    assert not (tmp_path / "study.db").exists()


def test_a_flag_both_searched_and_given_after_the_dashes_is_refused_before_any_trial(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {low: 1e-4, high: 1e-2, log: true}\n")
    refused = tune(tmp_path, "--space", str(space), training=("--learning-rate", "0.001"))
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line == (
        f"error: --space: {space}: learning_rate is searched, and given after -- as well: the values drawn would "
        "replace the one given; leave it out of one of them"
    )
    assert not (tmp_path / "study.db").exists()


@pytest.mark.parametrize(
    ("training", "told"),
    [
        (["--eval-every", "1000"], "--eval-every: the tuner's own --eval-every, before --, sets it for each trial"),
        (["sac", "--logger=tensorboard"], "--logger: the tuner has each trial log to CSV, which it reads"),
        (["--run-name", "mine"], "--run-name: the tuner names each trial's run (trial-N)"),
        (["--log-dir", "runs"], "--log-dir: the tuner puts each trial's run under its --out"),
        (["--torch-threads", "2"], "--torch-threads: the tuner gives each trial's run one thread"),
        (["--no-progress-bar", "--num-envs", "4"], None),  # no result depends on the bar: no refusal
    ],
)
def test_a_training_flag_the_tuner_sets_for_each_trial_is_refused_after_the_dashes(training, told):
    from rl.errors import UsageError

    if told is None:
        check_tuner_sets_alone(training)
        return
    with pytest.raises(UsageError) as refused:
        check_tuner_sets_alone(training)
    assert str(refused.value).startswith(told) and str(refused.value).endswith(": leave it out after --")


@pytest.mark.parametrize(
    ("training", "searched"),
    [(["--gamma=0.98"], "gamma"), (["sac", "--batch-size", "64"], "batch_size"), (["--num-envs", "4"], None)],
)
def test_the_default_space_refuses_a_flag_given_after_the_dashes_and_keeps_the_others(training, searched):
    from rl.errors import UsageError

    algorithm = training[0] if training[0] == "sac" else "ppo"
    where = f"{algorithm.upper()}'s default space"
    if searched is None:  # a flag the space does not search is the trials' own
        check_searched_not_given(DEFAULT_SPACES[algorithm], ["--preset", "cartpole", *training], where, default=True)
        return
    with pytest.raises(UsageError, match=rf"^--space: {where}: {searched} is searched, .* give a --space without it$"):
        check_searched_not_given(DEFAULT_SPACES[algorithm], training, where, default=True)


@pytest.mark.parametrize(
    ("storage", "told"),
    [
        ("sqlite:///{tmp_path}/no-such-folder/study.db", "(sqlite3.OperationalError) unable to open database file"),
        ("bogus://study", "Can't load plugin: sqlalchemy.dialects:bogus"),
    ],
    ids=["unmade-folder", "unknown-scheme"],
)
def test_a_storage_optuna_cannot_open_is_refused_in_one_line(tmp_path, storage, told):
    url = storage.format(tmp_path=tmp_path)
    command = [sys.executable, "-m", "rl.tune", "--storage", url, "--out", str(tmp_path / "runs"), *TRAINING]
    refused = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = refused.stderr.strip().splitlines()
    assert line == f"error: --storage: cannot open {url}: {told}"


@pytest.mark.parametrize(
    ("flags", "told"),
    [
        (["--workers", "0"], "--workers: must be positive, got 0"),
        (["--seed", "-1"], "--seed: must not be negative, got -1"),
        (["--seed", str(2**32)], "--seed: must be below 2**32 (Optuna's sampler takes no larger seed)"),
    ],
)
def test_tuner_flags_out_of_range_name_their_flag(flags, told):
    from rl.errors import UsageError
    from rl.tune import parse

    with pytest.raises(UsageError) as refused:
        parse([*flags, *TRAINING])
    assert str(refused.value).startswith(told)


def test_the_training_flags_algorithm_is_the_one_their_config_file_names(tmp_path):
    from rl.config_files import write_config_file
    from rl.tune import training_algorithm

    path = tmp_path / "best.yaml"
    write_config_file(parse_config(["sac", "--env-id", "Pendulum-v1"]), str(path))
    assert training_algorithm(["--config", str(path), "--seed", "2"]) == "sac"  # SAC's space, not PPO's
    assert training_algorithm(["sac", "--seed", "2"]) == "sac" and training_algorithm(["--seed", "2"]) == "ppo"
    path.write_text(path.read_text().replace("algorithm: sac\n", ""))
    assert training_algorithm(["--config", str(path)]) == "ppo"  # a file without its algorithm: as before


def test_a_tuners_ctrl_c_is_recorded_where_it_lands_and_raised_where_the_tuner_polls(monkeypatch):
    """Raised where it lands, a KeyboardInterrupt inside a garbage-collection callback is printed and dropped."""
    from rl import tune as tuning

    monkeypatch.setattr(tuning.Stop, "heard", "")
    with tuning.stops_heard_at_polls():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler has run by now, and raised nothing
        with pytest.raises(KeyboardInterrupt):
            tuning.raise_if_stopped()
    assert signal.getsignal(signal.SIGINT) != tuning.Stop.hear  # the handler before is back


def test_only_a_trial_whose_tuner_on_this_machine_has_ended_is_closed_as_interrupted(tmp_path, capsys):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="cartpole")
    tuners = [(ended.pid, socket.gethostname()), (os.getpid(), socket.gethostname()), (ended.pid, "another-machine")]
    for pid, host in tuners:
        trial = study.ask()
        trial.set_user_attr("tuner_pid", pid)
        trial.set_user_attr("tuner_host", host)
        trial.set_user_attr("run_dir", f"runs/trial-{trial.number}")
    close_abandoned_trials(study)
    assert capsys.readouterr().out == (
        f"trial 0: its tuner (pid {ended.pid}) ended without stopping it (killed outright); the study keeps it as "
        "interrupted; its run's checkpoints are in runs/trial-0\n"
    )
    states = [(trial.state, trial.user_attrs.get("interrupted")) for trial in trials(tmp_path)]
    running = (optuna.trial.TrialState.RUNNING, None)
    assert states == [(optuna.trial.TrialState.FAIL, True), running, running]


def heartbeat_storage(tmp_path, seconds: int = 1) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=seconds)


# Optuna's heartbeat is experimental, and meant for Study.optimize; the tests use its parts as a tuner does.
HEARTBEAT_WARNINGS = (
    "ignore::optuna.exceptions.ExperimentalWarning",
    "ignore:Heartbeat of storage is supposed to be used with Study.optimize",
)


@pytest.mark.filterwarnings(*HEARTBEAT_WARNINGS)
def test_a_trial_whose_tuner_fell_silent_is_ended_by_the_next_tuner_to_start_one_and_not_counted(tmp_path):
    # A tuner on another machine, killed outright (or its machine lost), left its trial running in the study.
    storage = heartbeat_storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="cartpole", direction="maximize")
    silent = study.ask()
    for key, value in {"tuner_pid": 4321, "tuner_host": "another-machine", "run_dir": "runs/trial-0"}.items():
        silent.set_user_attr(key, value)
    storage.record_heartbeat(silent._trial_id)
    time.sleep(3)  # past twice --heartbeat 1 (the storage keeps whole seconds)
    done = tune(tmp_path, "--trials", "1", "--heartbeat", "1")
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "trial 0: its tuner (pid 4321 on another-machine) gave no sign of life for over 2 s (killed outright, or its "
        "machine lost); the study keeps it as interrupted, uncounted; its run's checkpoints are in runs/trial-0 on "
        "another-machine"
    )
    assert lines[1].startswith("trial 1: greedy return ") and lines[1].endswith("(1 done, --trials 1)")
    assert [trial.state for trial in trials(tmp_path)] == [
        optuna.trial.TrialState.FAIL,
        optuna.trial.TrialState.COMPLETE,
    ]


def stop_outside_a_transaction(pid: int, database) -> None:
    """SIGSTOP `pid` at a moment it holds no lock on the SQLite `database`: stopped holding one, it would keep every
    other process out of the study."""
    while True:
        os.kill(pid, signal.SIGSTOP)
        connection = sqlite3.connect(database, timeout=0.2)
        try:
            connection.execute("BEGIN EXCLUSIVE")
            connection.rollback()
            return
        except sqlite3.OperationalError:  # locked: let it finish that transaction
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            connection.close()


@pytest.mark.slow
@pytest.mark.filterwarnings(*HEARTBEAT_WARNINGS)
def test_a_tuner_stopped_past_the_heartbeats_limit_stops_its_trials_run_and_goes_on_with_another(tmp_path):
    tuner = tuner_in_its_first_trial(tmp_path, 1, "--heartbeat", "1")
    stop_outside_a_transaction(tuner.pid, tmp_path / "study.db")  # the tuner alone: its trial's run trains on
    try:
        time.sleep(3)
        study = optuna.load_study(storage=heartbeat_storage(tmp_path), study_name="cartpole")
        optuna.storages.fail_stale_trials(study)  # what another tuner does as it starts a trial
        assert trials(tmp_path)[0].state == optuna.trial.TrialState.FAIL
    finally:
        os.kill(tuner.pid, signal.SIGCONT)
    # It starts trial 1, since trial 0 is not counted; the test stops it once that trial's run has evaluated.
    metrics = tmp_path / "runs" / "cartpole" / "fabric_logs" / "trial-1" / "csv" / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and "Eval/" in metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(tuner.pid, signal.SIGINT)
    out, err = tuner.communicate(timeout=120)
    assert "Traceback" not in err, err[-3000:]
    assert out.splitlines()[:2] == [
        "trial 0: another tuner ended it, having had no sign of life from this one for over 2 s (this tuner was "
        "stopped, or the storage out of its reach); the study keeps it as interrupted, uncounted; its run's "
        "checkpoints are in runs/cartpole/fabric_logs/trial-0",
        "trial 1: interrupted (Ctrl-C); its run's checkpoints are in runs/cartpole/fabric_logs/trial-1",
    ]
    # Trial 0's run was stopped as at Ctrl-C (it checkpointed), not left to train on to its end.
    assert re.search(
        r"^interrupted at step [\d,]+: checkpoint written", (tmp_path / "runs/cartpole/trial-0.log").read_text(), re.M
    )


def test_the_default_space_is_checked_with_the_training_flags_too():
    """SAC's default space draws batches of up to 512: a buffer that cannot hold one is refused before any trial."""
    from rl.errors import UsageError

    with pytest.raises(UsageError, match=r"^--space: SAC's default space: batch_size 512: --buffer-size: 300 cannot"):
        check_space_values(DEFAULT_SPACES["sac"], ["sac", "--buffer-size", "300"], "SAC's default space")
    check_space_values(DEFAULT_SPACES["sac"], ["sac", "--buffer-size", "1000"], "SAC's default space")
