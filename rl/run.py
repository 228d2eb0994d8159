"""A run's folder, whatever the mode and algorithm: its name, its loggers and config file, where its
training videos go, and what a finished run returns. The loop that fills it is `rl/loop.py`'s,
what its checkpoints hold `rl/checkpoint.py`'s."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: runs go unheld
    fcntl = None

from rl.checkpoint import BEST_FILENAME, TrainingCheckpoint, newest_checkpoint, resumed_step
from rl.config import RunConfig, is_folder_name
from rl.config_files import CONFIG_FILENAME, NOT_IN_RUN_FOLDER_CONFIG, run_dir_of, write_config_file
from rl.elastic import job_id, restart_count, start_logged, under_torchelastic
from rl.envs import video_folder
from rl.errors import UsageError
from rl.logger import MetricsSink, Sinks, hparams_table, mark_resumed_in_tensorboard, open_sinks, refused_logs
from rl.runtime import Runtime

RUN_LOCK_FILE = "run.lock"


class RunFolderLock:
    """A run folder held by the run writing into it (its rank 0, lead player or Hogwild supervisor), through an
    exclusive `flock` on `<run>/run.lock` that the system drops when the process ends, however it ends. A second
    run into a folder still held would write over the first's checkpoints and logs, and is refused. The run
    removes the file as it lets the folder go; one left behind is a killed run's, and holds nothing."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None
        self._path = ""

    def take(self, run_dir: str, flag: str) -> str:
        """Hold `run_dir` (made if missing) and return it; raise `UsageError` naming `flag` where a live run holds
        it. A restarted torchrun round takes it unchecked: the round before was this job's, and a lost node's
        lock on a network file system can outlive it."""
        if fcntl is None or restart_count() > 0:
            return run_dir
        path = os.path.join(run_dir, RUN_LOCK_FILE)
        with refused_logs(run_dir):
            os.makedirs(run_dir, exist_ok=True)
        while True:
            with refused_logs(run_dir):
                file = open(path, "a+")  # noqa: SIM115 (held for the run's life)
            if not locked(file, fcntl.LOCK_EX, run_dir, flag):
                return run_dir
            if same_file(file, path):
                break
            file.close()  # locked as the run before removed it: the file now at `path` is the one to hold
        file.truncate(0)
        file.write(f"pid {os.getpid()} on {socket.gethostname()}, since {datetime.now():%Y-%m-%d %H:%M:%S}\n")
        file.flush()
        self._file, self._path = file, path
        return run_dir

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # a folder moved or removed meanwhile: nothing is left to tidy
                os.unlink(self._path)  # while still held, so that no run takes the file as it goes
            self._file.close()  # closing the file drops its lock
            self._file = None


def same_file(file: IO[str], path: str) -> bool:
    """Whether `path` still names the open `file`."""
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def check_run_folder_free(run_dir: str, flag: str) -> None:
    """Raise `UsageError` naming `flag` where a live run holds `run_dir`: asked by every rank before it reads or
    writes the run's journal, as a shared lock that the ranks of one launch never refuse each other (their rank 0
    takes the run's exclusive one after all of them have asked, past the launch's rendezvous)."""
    path = os.path.join(run_dir, RUN_LOCK_FILE)
    if fcntl is None or restart_count() > 0 or not os.path.isfile(path):
        return
    with open(path) as file:
        locked(file, fcntl.LOCK_SH, run_dir, flag)


def locked(file: IO[str], kind: int, run_dir: str, flag: str) -> bool:
    """Lock `file` as `kind` without waiting: True if locked, False on a file system without locks (the run goes
    on unheld). A live run's lock raises `UsageError` naming `flag`, and closes the file."""
    try:
        fcntl.flock(file, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "a process"
        file.close()
        raise UsageError(
            flag,
            f"{run_dir} is the folder of a run still going ({holder}): two runs would write over each other's "
            f"checkpoints and logs; give another {flag}, or wait for that run to end",
        ) from None
    except OSError:
        file.close()
        return False
    return True


@dataclass
class Run:
    dir: str
    sink: Sinks
    lock: RunFolderLock = field(default_factory=RunFolderLock)

    def close(self) -> None:
        """Close the logs, and let the folder go."""
        try:
            self.sink.close()
        finally:
            self.lock.release()


class ClosedIfItFails:
    """What a run opens in this process (its logs, envs, progress bar), closed if the run fails on its way: a run
    trained from Python (`rl.train`) then leaves no env worker or log writer behind in the caller's process. A run
    that ends well closes each itself, where its end needs it closed."""

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []

    def add(self, close: Callable[[], None]) -> None:
        self._closers.append(close)

    def __enter__(self) -> ClosedIfItFails:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        if error is None:
            return
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):  # the failure on its way out is the one to report
                close()


def run_name(cfg: RunConfig, env_id: str, suffix: str | None = None) -> str:
    """One folder name, ending with the start time unless `suffix`: namespaced ids (ALE/Pong-v5) lose their slash."""
    return f"{cfg.exp_name}_{env_id.replace('/', '-')}_{cfg.seed}_{suffix or f'{datetime.now():%Y%m%d_%H%M%S}'}"


def fixed_run_dir(cfg: RunConfig, log_subdir: str) -> str | None:
    """The folder of a run whose name does not depend on when it started (a resumed run's, whose checkpoint lies in
    its checkpoints/ folder; a named run's; a torchrun job's: the same in every restart), or None for a run named
    at its start."""
    if cfg.resume_from is not None and (resumed := run_dir_of(cfg.resume_from)) is not None:
        return resumed
    if cfg.run_name is not None and not is_folder_name(cfg.run_name):
        return None  # refused with the other flags, before any folder is read
    name = cfg.run_name or (run_name(cfg, cfg.env_id, suffix=job_id()) if under_torchelastic() else None)
    return None if name is None else os.path.join(cfg.log_dir, log_subdir, name)


def open_run(
    cfg: RunConfig,
    run_dir: str,
    make_sink: Callable[[str, str], MetricsSink],
    resume: TrainingCheckpoint | None,
    world_size: int,
    is_main: bool = True,
    on_main: Callable[[Callable[[], None]], None] | None = None,
) -> Run:
    """Open the run folder's loggers (--logger), log the hyperparameters and, on rank 0, the config file, the
    round's start in the journal and a restart's scalars: through `on_main` (`Runtime.write_on_main` among ranks,
    which every rank waits for, so that none trains before the round's start is on record).

    A resumed run writes on into its folder's TensorBoard run, which hides what the run before
    logged past the checkpoint (the steps now done again), so no step is logged twice.
    """
    resume_step = resume.counters.global_step if resume else None
    if resume_step is not None and is_main and "tensorboard" in cfg.logger:
        with refused_logs(run_dir):  # before any writer of this launch opens: the evaluator's, Hogwild's workers'
            mark_resumed_in_tensorboard(run_dir, resume_step)
    sink = open_sinks(cfg.logger, run_dir, is_main, resume_step, lambda: make_sink(*os.path.split(run_dir)))
    sink.log_hparams(cfg.to_dict())
    sink.log_text("hyperparameters", hparams_table(cfg.to_dict()))

    def record_start() -> None:
        with refused_logs(run_dir):
            # what --config takes back to repeat the run
            write_config_file(cfg, os.path.join(run_dir, CONFIG_FILENAME), leave_out=NOT_IN_RUN_FOLDER_CONFIG)
        sink.log_scalars(start_logged(world_size), resume_step or 0)

    if on_main is not None:
        on_main(record_start)
    elif is_main:
        record_start()
    return Run(sink.log_dir, sink)


def new_run_dir(cfg: RunConfig, log_subdir: str) -> str:
    """The folder of a run named at its start, made here so that no other run takes it: a run of the same config
    started within the same second (from a loop in Python, or beside it from a shell) gets `..._2`, `..._3`."""
    base = path = os.path.join(cfg.log_dir, log_subdir, run_name(cfg, cfg.env_id))
    number = 1
    with refused_logs(base):
        while True:
            try:
                os.makedirs(path)
                return path
            except FileExistsError:
                number += 1
                path = f"{base}_{number}"


def start_run(cfg: RunConfig, runtime: Runtime, resume: TrainingCheckpoint | None) -> Run:
    """Open the run folder, held by rank 0 (`RunFolderLock`); a run named at its start is named on rank 0, so that
    all ranks agree."""
    lock = RunFolderLock()
    run_dir = runtime.write_on_main(lambda: take_run_folder(cfg, runtime.log_subdir, lock))
    # Through write_on_main: an env that failed in another rank's first rollout would otherwise end the round (the
    # launcher stops rank 0) before the journal knew it began, and a config file the disk refuses stops every rank.
    run = open_run(cfg, run_dir, runtime.make_sink, resume, runtime.world_size, runtime.is_main, runtime.write_on_main)
    run.lock = lock
    return run


def take_run_folder(cfg: RunConfig, log_subdir: str, lock: RunFolderLock) -> str:
    """The run's folder, held by `lock`: its fixed one, or a new one named now."""
    fixed = fixed_run_dir(cfg, log_subdir)
    if fixed is None:
        return lock.take(new_run_dir(cfg, log_subdir), "--run-name")
    return lock.take(fixed, run_folder_flag(cfg, log_subdir, fixed))


def run_folder_flag(cfg: RunConfig, log_subdir: str, folder: str) -> str:
    """The flag that chose the fixed run folder `folder`: --resume-from where it is the checkpoint's own run's
    (and not the named run's, which a named run's relaunch resumes from itself), else --run-name."""
    named = cfg.run_name is not None and same_folder(folder, os.path.join(cfg.log_dir, log_subdir, cfg.run_name))
    return "--resume-from" if cfg.resume_from is not None and not named else "--run-name"


def same_folder(one: str, other: str) -> bool:
    return os.path.realpath(one) == os.path.realpath(other)


def training_video_folder(run_dir: str, resume: TrainingCheckpoint | None) -> str:
    """Where a launch records its training episodes: a folder of its own, named by the step it starts from."""
    return video_folder(run_dir, "train", f"from_step_{resumed_step(resume)}")


@dataclass(frozen=True)
class TrainingResult:
    """What a finished (or interrupted) run left.

    Attributes:
        run_dir: The run's folder (an absolute path).
        agent_path: Its saved agent, `agent.ckpt`, which `rl.load_agent` loads; None where the run was interrupted
            before it saved one (its checkpoint resumes it).
        evaluation: The closing evaluation's `Test/` scalars, on the main process; None elsewhere, or without one.
        global_step: The run's env steps, all processes' together.
    """

    run_dir: str
    agent_path: str | None
    evaluation: dict[str, float] | None
    global_step: int

    @property
    def checkpoint_path(self) -> str | None:
        """The run's newest training checkpoint (every run writes one as it ends), which `resume_from` continues
        for more steps; None where the run wrote none."""
        return newest_checkpoint(self.run_dir)

    @property
    def best_agent_path(self) -> str | None:
        """The run's `best.ckpt`, the agent of its best evaluation during training (`eval_every`; decoupled mode's
        evaluator writes it from its own process), which `rl.load_agent` loads; None where there is none."""
        path = os.path.join(self.run_dir, BEST_FILENAME)
        return path if os.path.isfile(path) else None
