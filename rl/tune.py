"""Hyperparameter search with Optuna: `python -m rl.tune [flags] -- [training flags]`.

    python -m rl.tune --trials 20 --workers 2 --study-name cartpole -- --preset cartpole --total-timesteps 50000

Each trial is an ordinary run of `train_fabric.py` (its own run folder under --out), with the
training flags after `--`, the values the sampler drew for the search space, `--logger csv` and
`--eval-every`: the tuner reads each periodic greedy evaluation from the run's CSV as it is
written, reports it to the pruner, and stops a pruned run with Ctrl-C, which checkpoints it. A
trial scores the run's closing greedy evaluation. The study lives in an Optuna storage (SQLite
by default), so several tuners, on one machine or many, share it, and a stopped study goes on
where it was: --trials counts every finished or pruned trial of the study, and every one whose run
failed (tuners running at once each finish the trial they are in, so a study may end a few trials
past it). Each tuner marks the trial it runs alive every --heartbeat seconds (Optuna's heartbeat):
a trial left running by a tuner killed outright, or on a machine lost, is ended, uncounted, by the
next tuner to start a trial. The best trial's flags are written as a file that `--config` takes
back. Needs `pip install -e '.[tuning]'`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from rl.config import RunConfig, check_seed, flag, home_expanded
from rl.config_files import (
    CONFIG_FILENAME,
    NOT_IN_CONFIG_FILES,
    NOT_IN_RUN_FOLDER_CONFIG,
    KeyGivenTwice,
    config_file_algorithm,
    newest_checkpoint,
    read_mapping,
)
from rl.errors import (
    INTERRUPTED_EXIT_CODE,
    UsageError,
    counted,
    did_you_mean,
    exit_on_ctrl_c,
    exit_on_usage_error,
    misspelled_option,
    print_error,
    unrecognized_options,
)
from rl.faults import process_ended
from rl.flag_parsing import fields_on_command_line, flag_spellings, parse_dataclass
from rl.logger import CSV_METRICS_FILE
from rl.peer_flags import TUNING_PEER_FLAGS, tools_peer_flag
from rl.signals import ended_with_this_process

if TYPE_CHECKING:
    import optuna  # an extra (tuning): imported where it is used

REPO = Path(__file__).resolve().parents[1]
TRIALS_FOLDER = "fabric_logs"  # train_fabric.py's runs, under --out
EVALUATION = re.compile(r"evaluation over \d+ greedy episodes?: return (-?[\d.]+)")
POLL_SECONDS = 0.5
USAGE_ERROR_EXIT = 2  # a training command's exit code for bad input
# Why a training flag that the tuner sets for each trial is not taken after --, where it would be replaced unsaid
# (the progress bar, which changes no result, is left off without a word)
SET_BY_THE_TUNER = {
    "run_name": "the tuner names each trial's run (trial-N)",
    "log_dir": "the tuner puts each trial's run under its --out",
    "logger": "the tuner has each trial log to CSV, which it reads",
    "eval_every": "the tuner's own --eval-every, before --, sets it for each trial",
    "torch_threads": "the tuner gives each trial's run one thread (--workers runs more trials at once)",
}
# What the tuner adds to a trial's run, left out of the best config: a run from it is a new run of its own.
TRIAL_BOOKKEEPING = (*SET_BY_THE_TUNER, "progress_bar")
STUDY_TRAINING = "training"  # the study's attribute that holds the training flags its trials share

# What a trial may change when no --space is given: SB3's and rl-zoo's usual ranges.
DEFAULT_SPACES: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "learning_rate": {"low": 1e-5, "high": 3e-3, "log": True},
        "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
        "gae_lambda": {"choices": [0.8, 0.9, 0.92, 0.95, 0.98, 1.0]},
        "clip_coef": {"choices": [0.1, 0.2, 0.3]},
        "ent_coef": {"low": 1e-8, "high": 0.1, "log": True},
        "update_epochs": {"choices": [1, 5, 10, 20]},
    },
    "sac": {
        "policy_lr": {"low": 1e-5, "high": 3e-3, "log": True},
        "q_lr": {"low": 1e-5, "high": 3e-3, "log": True},
        "gamma": {"choices": [0.95, 0.98, 0.99, 0.995, 0.999]},
        "tau": {"choices": [0.005, 0.01, 0.02, 0.05]},
        "batch_size": {"choices": [64, 128, 256, 512]},
    },
}


@dataclass
class TuneConfig:
    """Search hyperparameters with Optuna; the training flags follow `--`."""

    trials: int = 20
    """finished, pruned or failed trials after which the study starts no more, counting those of earlier tuners of
    the same study (tuners running at once each finish their trial, so a study may end a few past it)"""
    workers: int = 1
    """tuning processes on this machine, each running one trial at a time (one torch thread each)"""
    storage: str = "sqlite:///tuning.db"
    """the Optuna storage URL that holds the study (tuners that share it share the study)"""
    study_name: str = "tuning"
    """the study's name in the storage"""
    space: str | None = None
    """a YAML file of the search space (name: {low, high[, log]} or {choices: [...]}) (default: PPO's or SAC's)"""
    sampler: Literal["tpe", "random"] = "tpe"
    """how the next trial's values are drawn"""
    pruner: Literal["median", "none"] = "median"
    """how a trial is stopped early: below the median of earlier trials at the same evaluation, or never"""
    prune_below: float | None = None
    """prune, as well, every trial whose periodic evaluation is below this return"""
    timeout: float | None = None
    """seconds after which each tuning process starts no new trial (the trials running then finish)"""
    eval_every: int = 10_000
    """env steps between a trial's greedy evaluations, which the pruner reads"""
    heartbeat: int = 60
    """seconds between a tuner's signs of life for the trial it runs, in the storage: a trial without one for twice
    this (its tuner killed outright, or its machine lost) is ended by the next tuner to start a trial, uncounted"""
    seed: int = 0
    """seed of the sampler (each tuning process adds its index)"""
    out: str = "logs/tuning"
    """the folder of the study's trial runs, and of its best config"""
    worker: int = 0
    """this process's index among the tuning processes (set by the tuner for the ones it starts)"""


def search_space(cfg: TuneConfig, algorithm: str) -> dict[str, dict[str, Any]]:
    """--space's search space, checked before any trial, or the algorithm's default one."""
    if cfg.space is None:
        return DEFAULT_SPACES[algorithm]
    try:
        space = read_mapping(Path(cfg.space).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UsageError("--space", f"cannot read {cfg.space}: {str(error).splitlines()[0]}") from None
    except KeyGivenTwice as error:
        raise UsageError("--space", f"{cfg.space} {error}: keep one") from None
    if not isinstance(space, dict) or not all(isinstance(d, dict) for d in space.values()):
        raise UsageError("--space", f"{cfg.space} must map each flag name to {{low, high}} or {{choices}}")
    from rl.registry import ALGORITHMS  # torch and the algorithms: only for a space to check

    flags = {member.name for member in fields(ALGORITHMS[algorithm].config_type)}
    for name, domain in space.items():
        key = str(name).replace("-", "_")
        if key not in flags:
            slip = did_you_mean(key, flags)
            raise UsageError(
                "--space", f"{cfg.space}: {name} is no flag of {algorithm.upper()}{': ' if slip else ''}{slip}"
            )
        if key in (*TRIAL_BOOKKEEPING, *NOT_IN_CONFIG_FILES, *NOT_IN_RUN_FOLDER_CONFIG):
            # a trial's command sets it after the values drawn, which would be recorded but never trained with
            why = f" ({SET_BY_THE_TUNER[key]})" if key in SET_BY_THE_TUNER else ""
            raise UsageError("--space", f"{cfg.space}: {name} is set for each trial's run, not searched{why}")
        space[name] = checked_domain(domain, f"{cfg.space}: {name}")
    return space


def checked_domain(domain: dict[str, Any], where: str) -> dict[str, Any]:
    """A flag's domain, `{choices: [...]}` or `{low, high[, log]}` with numbers (YAML's text 1e-5 included)."""
    if set(domain) == {"choices"} and isinstance(domain["choices"], list) and domain["choices"]:
        return domain
    if not {"low", "high"} <= set(domain) <= {"low", "high", "log"} or not isinstance(domain.get("log", False), bool):
        raise UsageError("--space", f"{where} must be {{low, high}} (and log: true) or {{choices: [...]}}")
    try:
        bounds = [value if isinstance(value, int) else float(value) for value in (domain["low"], domain["high"])]
    except (TypeError, ValueError):
        raise UsageError("--space", f"{where}: low and high must be numbers, got {domain}") from None
    low, high = bounds
    if not low < high or (domain.get("log") and low <= 0):
        raise UsageError("--space", f"{where}: needs low < high (and 0 < low with log), got low {low}, high {high}")
    return domain | {"low": low, "high": high}


def check_space_values(space: dict[str, dict[str, Any]], training: list[str], where: str) -> None:
    """Each choice of the space, and each bound, with the training flags, as a trial would be given it: a value no
    run takes (a choice the flag has not, a gamma above 1) stops the tuner before any trial, named."""
    from rl.cli import check_values_for_job, parse_config

    for name, domain in space.items():
        for value in domain["choices"] if "choices" in domain else (domain["low"], domain["high"]):
            try:
                cfg = parse_config([*training, flag(name.replace("-", "_")), str(value)], "coupled")
                check_values_for_job(cfg, "coupled", world_size=1)
            except UsageError as refusal:
                raise UsageError("--space", f"{where}: {name} {value}: {refusal}") from None


def given_training_fields(training: list[str]) -> set[str]:
    """The fields of the training config whose flags are given after --."""
    from rl.registry import ALGORITHMS

    return fields_on_command_line(ALGORITHMS[training_algorithm(training)].config_type, training)


def check_tuner_sets_alone(training: list[str]) -> None:
    """A training flag that the tuner sets for each trial, given after --, where the tuner's would replace it."""
    for name in sorted(given_training_fields(training) & set(SET_BY_THE_TUNER)):
        raise UsageError(flag(name), f"{SET_BY_THE_TUNER[name]}: leave it out after --")


def check_searched_not_given(space: dict[str, dict[str, Any]], training: list[str], where: str, default: bool) -> None:
    """A flag both searched and given after --: each trial's drawn value would replace the given one unsaid."""
    given = given_training_fields(training)
    for name in space:
        if name.replace("-", "_") in given:
            way_out = "give a --space without it" if default else "leave it out of one of them"
            unsaid = f"the values drawn would replace the one given; {way_out}"
            raise UsageError("--space", f"{where}: {name} is searched, and given after -- as well: {unsaid}")


def distribution(domain: dict[str, Any]) -> Any:
    """A flag's domain as Optuna's distribution: choices, whole numbers (both bounds whole, not log) or floats."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if "choices" in domain:
        return CategoricalDistribution(domain["choices"])
    if isinstance(domain["low"], int) and isinstance(domain["high"], int) and not domain.get("log"):
        return IntDistribution(domain["low"], domain["high"])
    return FloatDistribution(float(domain["low"]), float(domain["high"]), log=domain.get("log", False))


def suggest(trial: Any, space: dict[str, dict[str, Any]]) -> list[str]:
    """The flags of the values the trial draws from `space`."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    flags = []
    for name, domain in space.items():
        drawn = distribution(domain)
        if isinstance(drawn, CategoricalDistribution):
            value = trial.suggest_categorical(name, drawn.choices)
        elif isinstance(drawn, IntDistribution):
            value = trial.suggest_int(name, drawn.low, drawn.high)
        else:
            value = trial.suggest_float(name, drawn.low, drawn.high, log=drawn.log)
        flags += [flag(name.replace("-", "_")), str(value)]
    return flags


def check_same_space(study: Any, cfg: TuneConfig, space: dict[str, dict[str, Any]]) -> None:
    """A study goes on over the space it has searched: its best trial is the best of one search, and Optuna
    refuses a flag whose choices, or kind of values, changed."""
    from optuna.distributions import check_distribution_compatibility

    searched: dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):
        searched |= trial.distributions
    if not searched:
        return
    wanted = {name: distribution(domain) for name, domain in space.items()}
    differing = set(searched) ^ set(wanted)
    for name in set(searched) & set(wanted):
        try:
            check_distribution_compatibility(searched[name], wanted[name])
        except ValueError:
            differing.add(name)
    if differing:
        raise UsageError(
            "--study-name",
            f"the study {cfg.study_name!r} in {cfg.storage} searched another space (over "
            f"{', '.join(sorted(searched))}; {', '.join(sorted(differing))} differ): give this search a "
            "--study-name of its own",
        )


def shared_training_values(run: RunConfig, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What every trial of a search trains with: the training flags as resolved, but those that each trial
    draws, the tuner's own and the files they came from."""
    left_out = {*TRIAL_BOOKKEEPING, *NOT_IN_CONFIG_FILES, *NOT_IN_RUN_FOLDER_CONFIG}
    left_out |= {name.replace("-", "_") for name in space}
    values = {name: value for name, value in run.to_dict().items() if name not in left_out}
    return json.loads(json.dumps(values, default=str))  # as the storage keeps them: tuples become lists


def check_same_training(study: Any, cfg: TuneConfig, values: dict[str, Any]) -> None:
    """A study goes on with the training flags its scored trials were trained with: scores of runs of other
    lengths or envs do not compare, and its best trial would be the best of none of them. A study without a scored
    trial (a new one, or one whose trials were all interrupted or failed) records the flags given now, as does one
    whose trials were scored before studies recorded them."""
    from optuna.trial import TrialState

    recorded = study.user_attrs.get(STUDY_TRAINING)
    if recorded is None or not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        study.set_user_attr(STUDY_TRAINING, values)
        return
    differing = sorted(name for name in recorded.keys() | values.keys() if recorded.get(name) != values.get(name))
    if differing:
        changes = ", ".join(f"{flag(name)} {recorded.get(name)} (now {values.get(name)})" for name in differing)
        raise UsageError(
            "--study-name",
            f"the study {cfg.study_name!r} in {cfg.storage} trained its trials with other training flags: "
            f"{changes}; give this search a --study-name of its own",
        )


class Stop:
    """Ctrl-C or SIGTERM (a kill, scancel) in a tuning process, recorded by its handler and raised as
    `KeyboardInterrupt` where the tuner polls (`raise_if_stopped`): either stops the trials running, which checkpoint,
    and the study goes on with the same command. Raised by the handler itself, it could land in a garbage-collection
    callback (SQLAlchemy's, under Optuna's storage), where Python prints its traceback and drops it, and the tuner
    would go on."""

    heard = ""  # "Ctrl-C" or "SIGTERM", the first to come
    ctrl_c_presses = 0  # each passed on to a trial's run, which stops at once at its second

    @classmethod
    def hear(cls, signum: int, frame: object) -> None:
        cls.heard = cls.heard or ("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")
        cls.ctrl_c_presses += signum == signal.SIGINT


@contextlib.contextmanager
def stops_heard_at_polls() -> Iterator[None]:
    """While the tuner runs its trials, SIGINT and SIGTERM are only recorded; its handlers before come back after."""
    Stop.heard, Stop.ctrl_c_presses = "", 0
    previous = {signum: signal.signal(signum, Stop.hear) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def raise_if_stopped() -> None:
    if Stop.heard:
        raise KeyboardInterrupt


class TrialFailed(Exception):
    """A trial's run ended with an error: the study records it as failed and goes on."""


def run_trial(trial: Any, cfg: TuneConfig, training: list[str], space: dict[str, dict[str, Any]]) -> float:
    """One trial's run, followed to its end: its closing greedy return."""
    import optuna

    folder = Path(cfg.out) / cfg.study_name
    name = f"trial-{trial.number}"
    command = trial_command([*training, *suggest(trial, space)], cfg.eval_every, name, folder)
    run_dir = folder / TRIALS_FOLDER / name
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("tuner_pid", os.getpid())
    trial.set_user_attr("tuner_host", socket.gethostname())
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{name}.log"  # a file, not a pipe: a run that prints much never blocks on an unread pipe
    if Stop.heard:  # between trials: none is started
        trial.set_user_attr("interrupted", True)
        raise KeyboardInterrupt
    # A session of its own: a terminal's Ctrl-C reaches this tuner alone, which passes it on (`stop_children`).
    with (
        log.open("w") as output,
        start_child(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True) as process,
    ):
        try:
            pruned = follow_evaluations(trial, process, run_dir / "csv" / CSV_METRICS_FILE, cfg.heartbeat)
            process.wait()
            raise_if_stopped()  # heard as the run ended on its own: it has checkpointed
        except KeyboardInterrupt:
            stop_interrupted_trial(trial, process, run_dir)
            raise
        except Exception:  # such as the storage refusing a report of a trial that another tuner ended
            stop_run(process)
            raise
    if pruned:
        raise optuna.TrialPruned()
    return closing_return(trial, name, log, process.returncode)


def trial_command(flags: list[str], eval_every: int, name: str, folder: Path) -> list[str]:
    """The trial's run: `flags` (the study's training flags, then the trial's suggestions), evaluated every
    `eval_every` steps into a CSV the tuner follows, in `folder` as `name`, on one thread."""
    command = [sys.executable, str(REPO / "train_fabric.py"), *flags, "--logger", "csv"]
    command += ["--eval-every", str(eval_every), "--run-name", name, "--log-dir", str(folder)]
    return [*command, "--no-progress-bar", "--torch-threads", "1"]


def closing_return(trial: Any, name: str, log: Path, returncode: int) -> float:
    """The closing greedy return that a trial's run printed into `log`; its refusal or failure raised."""
    printed = log.read_text()
    errors = [line for line in printed.splitlines() if line.startswith("error: ")]
    if returncode == USAGE_ERROR_EXIT:  # the flags, not the trial's luck: every trial would end so
        refusal = errors[-1] if errors else printed.strip()
        raise UsageError("rl.tune", f"the training flags of {name} were refused: {refusal}")
    closing = EVALUATION.search(printed)
    if returncode != 0 or closing is None:
        failure = f"exit {returncode}, its output in {log}"
        trial.set_user_attr("failure", failure)
        raise TrialFailed(f"{name} failed ({failure})")
    return float(closing.group(1))


def start_child(command: list[str], **options: Any) -> subprocess.Popen:
    """A trial's run, or another tuning process, that Linux sends Ctrl-C the moment this tuner ends, however it ends
    (SIGKILL, the out-of-memory killer): it stops as at Ctrl-C (a run checkpoints) instead of going on unwatched."""
    return subprocess.Popen(command, preexec_fn=ended_with_this_process(signal.SIGINT), **options)


def stop_interrupted_trial(trial: Any, process: subprocess.Popen, run_dir: Path) -> None:
    """Ctrl-C or SIGTERM: the trial's run checkpoints and stops (this tuner passes Ctrl-C on to it), and the study keeps
    the trial as failed and marked interrupted, which --trials does not count."""
    trial.set_user_attr("interrupted", True)
    stop_run(process)
    if newest_checkpoint(str(run_dir)):
        kept = f"its run's checkpoints are in {run_dir}"
    else:  # stopped before training began, or at once by a second Ctrl-C
        kept = f"its run stopped before its first checkpoint ({run_dir})"
    print_now(f"trial {trial.number}: interrupted ({Stop.heard}); {kept}")


def stop_run(process: subprocess.Popen) -> None:
    """A trial's run checkpoints and stops, as at Ctrl-C."""
    stop_children([process])


def stop_children(processes: list[subprocess.Popen]) -> None:
    """Ctrl-C to each child (a trial's run, a helper tuner), in a session of its own, until it ends: one, and one
    more for each further press heard, so that a second stops a run at once, as it stops a run started from the
    terminal. Were a terminal's Ctrl-C to reach a child too, this one would be its second: the run would stop
    without the checkpoint the first asked for."""
    passed_on = 0
    while running := [process for process in processes if process.poll() is None]:
        if passed_on < max(1, Stop.ctrl_c_presses):
            for process in running:
                process.send_signal(signal.SIGINT)
            passed_on += 1
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(timeout=POLL_SECONDS)


def follow_evaluations(trial: Any, process: subprocess.Popen, metrics: Path, heartbeat: float) -> bool:
    """Report each periodic evaluation of the running trial as it appears; Ctrl-C the run if the pruner says so.
    Every `heartbeat` seconds, mark the trial alive."""
    reported: set[int] = set()
    marked = time.monotonic()
    while process.poll() is None:
        time.sleep(POLL_SECONDS)
        raise_if_stopped()
        if time.monotonic() - marked >= heartbeat:
            mark_alive(trial)
            marked = time.monotonic()
        for step, value in evaluations(metrics):
            if step in reported:
                continue
            reported.add(step)
            trial.report(value, step)
            if trial.should_prune():
                process.send_signal(signal.SIGINT)  # it checkpoints and stops
                return True
    return False


def evaluations(metrics: Path) -> list[tuple[int, float]]:
    if not metrics.is_file():
        return []
    with metrics.open(newline="") as file:
        rows = list(csv.DictReader(file))
    return [(int(row["step"]), float(row["Eval/return_mean"])) for row in rows if row.get("Eval/return_mean")]


def make_pruner(cfg: TuneConfig) -> Any:
    """The pruner of --pruner, and with --prune-below a threshold beside it: a trial stops where either says so."""
    import optuna

    pruners = [optuna.pruners.MedianPruner() if cfg.pruner == "median" else optuna.pruners.NopPruner()]
    if cfg.prune_below is not None:
        pruners.append(optuna.pruners.ThresholdPruner(lower=cfg.prune_below))

    class AnyOf(optuna.pruners.BasePruner):
        def prune(self, study: Any, trial: Any) -> bool:
            return any(pruner.prune(study, trial) for pruner in pruners)

    return AnyOf()


def training_algorithm(training: list[str]) -> str:
    """The algorithm of the training flags, as the entry scripts read it: the one named first, else the one their
    --config file names, else PPO."""
    if training and training[0] in DEFAULT_SPACES:
        return training[0]
    in_file = config_file_algorithm(training)
    return in_file if in_file in DEFAULT_SPACES else "ppo"


def tune(cfg: TuneConfig, training: list[str], space: dict[str, dict[str, Any]]) -> None:
    """One tuning process: trials of the shared study until it holds --trials counted ones, or --timeout passes."""
    import optuna

    seed = (cfg.seed + cfg.worker) % 2**32  # each tuning process its own, within the sampler's range
    sampler = optuna.samplers.TPESampler(seed=seed) if cfg.sampler == "tpe" else optuna.samplers.RandomSampler(seed)
    study = optuna.create_study(
        storage=open_storage(cfg),
        study_name=cfg.study_name,
        direction="maximize",
        sampler=sampler,
        pruner=make_pruner(cfg),
        load_if_exists=True,
    )
    deadline = math.inf if cfg.timeout is None else time.monotonic() + cfg.timeout
    with stops_heard_at_polls():
        while trials_counted(study) < cfg.trials and time.monotonic() < deadline:
            run_next_trial(study, cfg, training, space)


def open_storage(cfg: TuneConfig) -> optuna.storages.RDBStorage:
    """The study's storage, with Optuna's heartbeat: a trial whose tuner has not marked it alive for twice
    --heartbeat seconds is ended, as failed, when a tuner starts a trial (`run_next_trial`)."""
    import optuna

    with warnings.catch_warnings():  # that the heartbeat is experimental: Optuna has had it since 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            cfg.storage,
            heartbeat_interval=cfg.heartbeat,
            grace_period=silence_limit(cfg),
            heartbeat_stale_trial_callback=say_silent_trial_ended(cfg),
        )


def run_next_trial(study: Any, cfg: TuneConfig, training: list[str], space: dict[str, dict[str, Any]]) -> None:
    """Optuna's ask and tell around `run_trial`. Not `Study.optimize`: with a heartbeat it marks trials alive from a
    thread of its own, and in a tuner of two threads, killed outright, each thread's end sends its trial's run the
    parent-death signal (a second Ctrl-C, which stops the run without its checkpoint). The tuner marks its trial
    alive where it polls the run instead (`follow_evaluations`)."""
    import optuna

    with warnings.catch_warnings():  # experimental, and meant for optimize: see above
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
        optuna.storages.fail_stale_trials(study)
        trial = study.ask()
    mark_alive(trial)
    value, state = None, optuna.trial.TrialState.FAIL
    try:
        value, state = run_trial(trial, cfg, training, space), optuna.trial.TrialState.COMPLETE
    except optuna.TrialPruned:
        state = optuna.trial.TrialState.PRUNED
    except (TrialFailed, optuna.exceptions.UpdateFinishedTrialError):  # the latter: another tuner ended it
        pass
    except BaseException:  # Ctrl-C, SIGTERM, refused training flags: the trial fails and the tuner stops
        told(study, trial, None, state)
        raise
    ended = told(study, trial, value, state)
    if ended.state == optuna.trial.TrialState.FAIL and not ended_by_this_tuner(ended):
        say_ended_by_another_tuner(ended, cfg)
    else:
        print_trial(cfg, study, ended)


def mark_alive(trial: Any) -> None:
    """The sign of life that Optuna's heartbeat reads, for the trial this tuner runs."""
    trial.study._storage.record_heartbeat(trial._trial_id)


def told(study: Any, trial: Any, value: float | None, state: Any) -> Any:
    """The trial as it ended: as this tuner tells it, or as another tuner ended it first."""
    import optuna

    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # ended by another tuner meanwhile
        return study.tell(trial, value, state=state, skip_if_finished=True)
    return study.get_trials(deepcopy=False)[trial.number]


def ended_by_this_tuner(trial: Any) -> bool:
    """A tuner fails its own trials with a `failure` (its run failed) or as `interrupted`; a trial failed without
    either was ended by another tuner, which found it without a sign of life (`open_storage`)."""
    return "failure" in trial.user_attrs or "interrupted" in trial.user_attrs


def silence_limit(cfg: TuneConfig) -> int:
    """Seconds after which a running trial without a sign of life from its tuner is ended by another."""
    return 2 * cfg.heartbeat


def say_silent_trial_ended(cfg: TuneConfig) -> Callable[[Any, Any], None]:
    def say(study: Any, trial: Any) -> None:
        host = trial.user_attrs.get("tuner_host", "its machine")
        print_now(
            f"trial {trial.number}: its tuner (pid {trial.user_attrs.get('tuner_pid')} on {host}) gave no sign of "
            f"life for over {silence_limit(cfg)} s (killed outright, or its machine lost); the study keeps it as "
            f"interrupted, uncounted; its run's checkpoints are in {trial.user_attrs.get('run_dir')} on {host}"
        )

    return say


def say_ended_by_another_tuner(trial: Any, cfg: TuneConfig) -> None:
    print_now(
        f"trial {trial.number}: another tuner ended it, having had no sign of life from this one for over "
        f"{silence_limit(cfg)} s (this tuner was stopped, or the storage out of its reach); the study keeps it as "
        f"interrupted, uncounted; its run's checkpoints are in {trial.user_attrs.get('run_dir')}"
    )


def print_now(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write: the lines of tuners that share a terminal stay whole
    sys.stdout.flush()


def counts(trial: Any) -> bool:
    """Whether --trials counts a trial: finished, pruned, or failed by its run (a study whose every trial fails, on
    an env that raises, say, ends rather than trying forever); not one interrupted (by Ctrl-C or SIGTERM, or its
    tuner killed or silent)."""
    import optuna

    state = optuna.trial.TrialState
    return trial.state in (state.COMPLETE, state.PRUNED) or (
        trial.state == state.FAIL and "failure" in trial.user_attrs
    )


def trials_counted(study: Any) -> int:
    return sum(counts(trial) for trial in study.get_trials(deepcopy=False))


def print_trial(cfg: TuneConfig, study: Any, trial: Any) -> None:
    """A line as each trial of this tuner ends (Optuna's own are off: a failed trial's would print its traceback)."""
    from optuna.trial import TrialState

    if trial.state == TrialState.COMPLETE:
        outcome = f"greedy return {trial.value:.2f}"
    elif trial.state == TrialState.PRUNED:
        step, value = max(trial.intermediate_values.items(), default=(0, math.nan))
        outcome = f"pruned at step {step:,}, where its return was {value:.2f}"
    else:
        outcome = f"failed ({trial.user_attrs['failure']})"  # its run failed: see `ended_by_this_tuner`
    done = f"{trials_counted(study)} done, --trials {cfg.trials}"
    print_now(f"trial {trial.number}: {outcome}; {params_text(trial.params)} ({done})")


def params_text(params: dict[str, Any]) -> str:
    """A trial's values, three digits of each float."""
    return ", ".join(
        f"{name} {value:.3g}" if isinstance(value, float) else f"{name} {value}" for name, value in params.items()
    )


def write_best(cfg: TuneConfig) -> Path | None:
    """The best trial's run folder's config as `<out>/<study>/best.yaml`, for --config."""
    import optuna

    study = optuna.load_study(storage=cfg.storage, study_name=cfg.study_name)
    completed = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    if not completed:
        print(f"no trial of the study {cfg.study_name!r} has finished: no best.yaml")
        return None
    best = max(completed, key=lambda trial: trial.value)
    target = Path(cfg.out) / cfg.study_name / "best.yaml"
    flags = yaml.safe_load((Path(best.user_attrs["run_dir"]) / CONFIG_FILENAME).read_text())
    kept = {key: value for key, value in flags.items() if key not in TRIAL_BOOKKEEPING}
    target.write_text(yaml.safe_dump(kept, sort_keys=False))
    values = params_text(best.params)
    print(f"best: trial {best.number}, greedy return {best.value:.2f}; {values}; its flags: --config {target}")
    return target


TUNING_FLAGS = {flag(member.name) for member in fields(TuneConfig)}


def training_flag_before_dashes(error: UsageError) -> UsageError | None:
    """An unknown flag that training takes (`--env-id`), given among the tuner's own."""
    from rl.registry import ALGORITHMS

    word = next(iter(unrecognized_options(error)), "").partition("=")[0]
    if not any(word in {flag(field.name) for field in fields(kind.config_type)} for kind in ALGORITHMS.values()):
        return None
    return UsageError(
        word, f"a training flag: give it after --, as python -m rl.tune --trials 20 -- {word} ... (sac first for SAC)"
    )


def parse(argv: list[str]) -> tuple[TuneConfig, list[str]]:
    split = argv.index("--") if "--" in argv else len(argv)
    try:
        cfg = parse_dataclass(TuneConfig, argv[:split])
    except UsageError as error:
        raise (
            tools_peer_flag(error, TUNING_PEER_FLAGS, TUNING_FLAGS)
            or training_flag_before_dashes(error)
            or misspelled_option(error, flag_spellings(TuneConfig))
            or error
        ) from None
    for name in ("trials", "workers", "eval_every", "heartbeat"):
        if getattr(cfg, name) <= 0:
            raise UsageError(flag(name), f"must be positive, got {getattr(cfg, name)}")
    check_seed(cfg.seed, bits=32, seeded="Optuna's sampler")
    cfg.out, cfg.space = home_expanded(cfg.out), home_expanded(cfg.space)  # --out=~/tuning, which no shell expands
    return cfg, argv[split + 1 :]


def main(argv: list[str]) -> None:
    try:
        import optuna
    except ImportError:
        raise UsageError("rl.tune", "tuning needs Optuna: pip install -e '.[tuning]'") from None
    cfg, training = parse(argv)
    space = search_space(cfg, training_algorithm(training))  # a bad space stops here, before any process or trial
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # each trial's line is print_trial's
    if cfg.worker > 0:  # a process another tuner started, after checking what follows: trials only
        try:
            tune(cfg, training, space)
        except KeyboardInterrupt:
            sys.exit(INTERRUPTED_EXIT_CODE)
        return
    from rl.cli import prepare

    check_tuner_sets_alone(training)
    # Bad training flags (or env) stop here, in one line, before any trial. What else a run would say of these
    # flags (how --total-timesteps rounds, say) is not said: each trial suggests flags of its own.
    with contextlib.redirect_stdout(io.StringIO()):
        algorithm, _, _ = prepare(training, TRIALS_FOLDER)
        where = cfg.space or f"{training_algorithm(training).upper()}'s default space"
        check_searched_not_given(space, training, where, default=cfg.space is None)
        check_space_values(space, training, where)
    Path(cfg.out, cfg.study_name).mkdir(parents=True, exist_ok=True)
    # the study exists before the other processes open it, so that they never race to create it
    study = create_study(cfg)
    check_same_space(study, cfg, space)
    check_same_training(study, cfg, shared_training_values(algorithm.cfg, space))
    close_abandoned_trials(study)
    done = trials_counted(study)
    if done >= cfg.trials:
        print(
            f"the study {cfg.study_name!r} in {cfg.storage} holds {counted(done, 'trial')} already: none is left to "
            "run (a larger --trials runs more)"
        )
    else:
        try:
            tune_in_every_process(cfg, argv, training, space)
        except KeyboardInterrupt:
            write_best(cfg)
            if Stop.heard == "SIGTERM":
                print_error(
                    "error: rl.tune: stopped by SIGTERM (a kill, scancel or shutdown); its trials were stopped, and "
                    "the same command goes on with this study"
                )
                sys.exit(1)
            print("interrupted (Ctrl-C): the same command goes on with this study")
            sys.exit(INTERRUPTED_EXIT_CODE)
    write_best(cfg)


def close_abandoned_trials(study: optuna.Study) -> None:
    """Trials left running by a tuner of this machine that was killed outright (kill -9, the out-of-memory killer)
    end as interrupted ones do: failed, not counted by --trials. Their runs stopped with it and checkpointed. A trial
    of a tuner on another machine, or of one still running, is left to that tuner."""
    import optuna

    host = socket.gethostname()
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        pid = frozen.user_attrs.get("tuner_pid")
        if frozen.user_attrs.get("tuner_host") != host or pid is None or not process_ended(pid):
            continue
        optuna.trial.Trial(study, frozen._trial_id).set_user_attr("interrupted", True)
        study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)
        print(
            f"trial {frozen.number}: its tuner (pid {pid}) ended without stopping it (killed outright); the study "
            f"keeps it as interrupted; its run's checkpoints are in {frozen.user_attrs.get('run_dir')}"
        )


def create_study(cfg: TuneConfig) -> optuna.Study:
    """The study, made if it is not in the storage yet; a storage Optuna cannot open stops the tuner in one line."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return optuna.create_study(
            storage=cfg.storage, study_name=cfg.study_name, direction="maximize", load_if_exists=True
        )
    except (SQLAlchemyError, ImportError) as error:  # a URL it cannot parse, a driver not installed, a file unmade
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError("--storage", f"cannot open {cfg.storage}: {reason}") from None


def tune_in_every_process(cfg: TuneConfig, argv: list[str], training: list[str], space: dict[str, Any]) -> None:
    """This tuning process and --workers - 1 more, each running trials of the study."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    helpers = [  # each in a session of its own: a terminal's Ctrl-C reaches this process alone, which passes it on
        start_child(
            [sys.executable, "-m", "rl.tune", *own, "--worker", str(index), "--", *training], start_new_session=True
        )
        for index in range(1, cfg.workers)
    ]
    try:
        tune(cfg, training, space)
    except KeyboardInterrupt:
        stop_children(helpers)
        raise
    finally:
        for helper in helpers:
            helper.wait()


if __name__ == "__main__":
    with exit_on_ctrl_c(), exit_on_usage_error():
        main(sys.argv[1:])
