"""TensorBoard sinks, cross-rank metric aggregation and the rank-0 progress bar."""

from __future__ import annotations

import csv
import glob
import importlib.util
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from tqdm import tqdm

from rl.errors import FOLDER_GONE, RunStopped, UsageError, progress_line, refused_writes
from rl.normalization import AllReduceSum
from rl.uploads import to_device

LoggerName = Literal["tensorboard", "csv", "wandb"]
CSV_METRICS_FILE = "metrics.csv"  # what Lightning's CSV logger writes


class MetricsSink(Protocol):
    """Where rank 0 writes scalars, hyperparameters and text."""

    log_dir: str

    def log_scalars(self, metrics: dict[str, float], step: int) -> None: ...
    def log_hparams(self, params: dict[str, Any]) -> None: ...
    def log_text(self, tag: str, text: str) -> None: ...
    def close(self) -> None: ...


EVENTS_PREFIX = "events.out.tfevents."  # then the second its writer opened, its host, process and number


def mark_resumed_in_tensorboard(log_dir: str, resumed_step: int) -> None:
    """Hide, in TensorBoard, what earlier launches logged in `log_dir` past the checkpoint at `resumed_step` (the
    steps now done again); what they logged up to it, its own step's included, stays.

    One marker file, written before any writer of this launch opens, whose name sorts before theirs (TensorBoard
    reads a folder's event files in name order, and a restart marker hides every point read before it from its step
    on). A marker in each writer's own file, as `SummaryWriter(purge_step=...)` writes, would also hide the new
    points of a writer beside it whose file was read first: the evaluator's or the training's.
    """
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.summary.writer.record_writer import RecordWriter

    os.makedirs(log_dir, exist_ok=True)  # a resumed run may log into a new folder (--run-name, --log-dir)
    # An earlier file named in this very second would sort after the marker ("!" comes before a host's name) and
    # escape it: name the marker in a later second (a relaunch within a second of the run's start waits for it).
    wait = newest_events_second(log_dir) + 1 - time.time()
    if wait > 0:
        time.sleep(wait)
    now, step = time.time(), resumed_step + 1
    path = os.path.join(log_dir, f"{EVENTS_PREFIX}{int(now):010d}.!resumed-at-{resumed_step}")
    with open(path, "wb") as file:
        records = RecordWriter(file)
        records.write(Event(wall_time=now, step=step, file_version="brain.Event:2").SerializeToString())
        restart = Event(wall_time=now, step=step, session_log=SessionLog(status=SessionLog.START))
        records.write(restart.SerializeToString())


def newest_events_second(log_dir: str) -> int:
    """The second in the name of the folder's newest TensorBoard event file (writers name them by when they open);
    0 where there is none."""
    seconds = [name.split(".")[3] for name in os.listdir(log_dir) if name.startswith(EVENTS_PREFIX)]
    return max((int(second) for second in seconds if second.isdigit()), default=0)


class FabricSink:
    """Lightning's own TensorBoard logger; it writes on global rank 0 only."""

    def __init__(self, root_dir: str, run_name: str) -> None:
        from lightning.fabric.loggers import TensorBoardLogger

        self._logger = TensorBoardLogger(root_dir=root_dir, name=run_name, version="")
        self.log_dir = self._logger.log_dir

    def log_scalars(self, metrics: dict[str, float], step: int) -> None:
        self._logger.log_metrics(metrics, step=step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        self._logger.log_hyperparams(params)

    def log_text(self, tag: str, text: str) -> None:
        self._logger.experiment.add_text(tag, text)

    def close(self) -> None:
        self._logger.finalize("success")


class SummaryWriterSink:
    """A plain `SummaryWriter` for the torchrun baseline; only rank 0 owns one."""

    def __init__(self, log_dir: str, is_main: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir) if is_main else None

    def log_scalars(self, metrics: dict[str, float], step: int) -> None:
        if self._writer:
            for tag, value in metrics.items():
                self._writer.add_scalar(tag, value, step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        if self._writer:
            from torch.utils.tensorboard.summary import hparams

            # Written into this run's own event file, rather than a sub-run as `add_hparams` does.
            for summary in hparams({k: _hparam_value(v) for k, v in params.items()}, {}):
                self._writer.file_writer.add_summary(summary)

    def log_text(self, tag: str, text: str) -> None:
        if self._writer:
            self._writer.add_text(tag, text)

    def close(self) -> None:
        if self._writer:
            self._writer.close()


class CSVSink:
    """Lightning's CSV logger: `<run>/<folder>/metrics.csv`, a row per logged step and a column per scalar.

    A resumed run keeps what the run before logged up to its checkpoint (`purge_step`), as the
    TensorBoard sinks do; Lightning's logger starts the file afresh, so those rows are logged again."""

    def __init__(self, run_dir: str, is_main: bool, purge_step: int | None = None, folder: str = "csv") -> None:
        from lightning.fabric.loggers import CSVLogger

        self.log_dir = run_dir
        self._logger = None
        if not is_main:
            return
        earlier = _rows_before(os.path.join(run_dir, folder, CSV_METRICS_FILE), purge_step)
        self._logger = CSVLogger(root_dir=run_dir, name=folder, version="", flush_logs_every_n_steps=1)
        with warnings.catch_warnings(), as_rank_zero():
            # Lightning warns that it deletes the folder's metrics.csv: the rows kept are written back just below
            warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
            self._logger.experiment  # noqa: B018 - opens the file now, under the filter
            for step, metrics in earlier:
                self._logger.log_metrics(metrics, step=step)

    def log_scalars(self, metrics: dict[str, float], step: int) -> None:
        if self._logger is not None:
            with as_rank_zero():
                self._logger.log_metrics(metrics, step=step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        return  # Lightning's CSV logger takes none; the run folder's config.yaml holds them

    def log_text(self, tag: str, text: str) -> None:
        return  # a CSV holds numbers

    def close(self) -> None:
        if self._logger is not None:
            with as_rank_zero():
                self._logger.finalize("success")


@contextmanager
def as_rank_zero() -> Iterator[None]:
    """Lightning's CSV and W&B loggers write on global rank 0 alone (and do nothing elsewhere, silently); the
    process that logs a sink's scalars may be another rank: decoupled mode's evaluator, which logs its own."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    rank = getattr(rank_zero_only, "rank", None)
    rank_zero_only.rank = 0
    try:
        yield
    finally:
        rank_zero_only.rank = rank


def _rows_before(path: str, purge_step: int | None) -> list[tuple[int, dict[str, float]]]:
    """The rows of an earlier launch's metrics.csv up to `purge_step`, the checkpoint's step, which the resumed
    run does not log again (none for a fresh run)."""
    if purge_step is None or not os.path.isfile(path):
        return []
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    kept = []
    for row in rows:
        step = int(row.pop("step"))
        if step <= purge_step:
            kept.append((step, {key: float(value) for key, value in row.items() if value != ""}))
    return kept


WANDB_ID_FILE = "wandb_id"  # in the run folder: the W&B run that a restart or a resume continues
VIDEO_FOLDERS = ("train_videos", "test_videos")


WANDB_MISSING = "wandb needs the tracking extra: pip install -e '.[tracking]'"


def check_loggers_installed(loggers: Iterable[str]) -> None:
    """Refuse --logger wandb without its package, before a run or an evaluation opens anything."""
    if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
        raise UsageError("--logger", WANDB_MISSING)


class WandbSink:
    """Weights & Biases through its Lightning Fabric logger, in the run folder (`wandb/`).

    Without a network it runs offline (`WANDB_MODE=offline`), and `wandb sync` uploads the run
    later. The run's W&B id is kept in the run folder, so an elastic restart or `--resume-from`
    continues the same W&B run; the videos a launch recorded are logged when it closes.

    A process with a `role` of its own (decoupled mode's evaluator) logs to a W&B run of its own,
    `<run>-<role>`, beside the trainers' one: both are in the W&B group named after the run (or
    `WANDB_RUN_GROUP`), as W&B groups the processes of one distributed job."""

    def __init__(
        self,
        run_dir: str,
        is_main: bool,
        role: str | None = None,
        videos: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        """`videos`: the folders whose mp4s are logged when the sink closes, by W&B key (by default a training
        run's own videos, and none for a process with a role); `config`: the run's config, recorded as W&B opens
        the run (as `log_hparams` records it later)."""
        self.log_dir, self._logger = run_dir, None
        if not is_main:
            return
        self.videos = videos if videos is not None else ({} if role else training_videos(run_dir))
        # what an earlier launch of the run recorded, that launch logged
        self.logged_before = {video for folder in training_videos(run_dir).values() for video in mp4_files(folder)}
        try:
            from wandb.integration.lightning.fabric import WandbLogger
        except ImportError:
            raise UsageError("--logger", WANDB_MISSING) from None
        offline = not wandb_credentials()
        if offline and os.environ.get("WANDB_MODE") is None and role is None:
            print(
                f"wandb: no API key on this machine: logging offline to {run_dir}/wandb (`wandb sync` uploads "
                "it later)",
                flush=True,
            )
        run_name = os.path.basename(run_dir)
        self._logger = WandbLogger(
            name=run_name if role is None else f"{run_name}-{role}",
            save_dir=run_dir,
            id=wandb_run_id(run_dir, role),
            project=os.environ.get("WANDB_PROJECT", "fabric-rl"),
            offline=offline,
            group=os.environ.get("WANDB_RUN_GROUP", run_name),  # W&B's own variables, where set, still decide
            job_type=role or os.environ.get("WANDB_JOB_TYPE", "train"),
            config=None if config is None else {key: _hparam_value(value) for key, value in config.items()},
        )
        # The Fabric logger hands wandb.init `anonymous=None`, a setting W&B has deprecated, which then warns on
        # every run that the setting has no effect: leave it out, as W&B's default.
        getattr(self._logger, "_wandb_init", {}).pop("anonymous", None)

    def log_scalars(self, metrics: dict[str, float], step: int) -> None:
        if self._logger is not None:
            with as_rank_zero():
                self._logger.log_metrics(metrics, step=step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        if self._logger is not None:
            with as_rank_zero():
                self._logger.log_hyperparams(params)

    def log_text(self, tag: str, text: str) -> None:
        return  # the config is the run's W&B config already

    def close(self) -> None:
        if self._logger is None:
            return
        with as_rank_zero():
            for key, folder in self.videos.items():
                videos = [video for video in mp4_files(folder) if video not in self.logged_before]
                if videos:
                    self._logger.log_video(key, videos)
            self._logger.finalize("success")
            self._logger.experiment.finish()


def mp4_files(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "**", "*.mp4"), recursive=True))


def training_videos(run_dir: str) -> dict[str, str]:
    """The folders of a training run's videos (`--capture-video`), by W&B key."""
    return {f"video/{folder}": os.path.join(run_dir, folder) for folder in VIDEO_FOLDERS}


def wandb_credentials() -> bool:
    """Whether W&B can log online: an API key in the environment or in ~/.netrc, and no WANDB_MODE saying
    otherwise."""
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return False
    netrc = os.path.expanduser("~/.netrc")
    in_netrc = os.path.isfile(netrc) and "api.wandb.ai" in Path(netrc).read_text()
    return bool(os.environ.get("WANDB_API_KEY")) or in_netrc


def wandb_run_id(run_dir: str, role: str | None = None) -> str:
    """The W&B id of the run in `run_dir` (or of its process with that `role`): the one kept there, or a new one,
    kept there from now on."""
    path = os.path.join(run_dir, WANDB_ID_FILE if role is None else f"{WANDB_ID_FILE}-{role}")
    if os.path.isfile(path):
        return Path(path).read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    os.makedirs(run_dir, exist_ok=True)
    with open(path, "w") as file:
        file.write(run_id + "\n")
    return run_id


class Sinks:
    """Every logger of the run (`--logger`), behind one sink. A write the system refuses stops the run with
    `RunStopped` (`refused_logs`)."""

    def __init__(self, sinks: list[MetricsSink], log_dir: str) -> None:
        self.sinks, self.log_dir = sinks, log_dir

    def add(self, other: Sinks) -> None:
        """`other`'s sinks too, from now on (and closed with these)."""
        self.sinks += other.sinks

    def log_scalars(self, metrics: dict[str, float], step: int) -> None:
        if not metrics:
            return  # a CSV row of nothing but its step
        with refused_logs(self.log_dir):
            for sink in self.sinks:
                sink.log_scalars(metrics, step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        with refused_logs(self.log_dir):
            for sink in self.sinks:
                sink.log_hparams(params)

    def log_text(self, tag: str, text: str) -> None:
        with refused_logs(self.log_dir):
            for sink in self.sinks:
                sink.log_text(tag, text)

    def close(self) -> None:
        with refused_logs(self.log_dir):
            for sink in self.sinks:
                sink.close()


def refused_logs(log_dir: str) -> AbstractContextManager[None]:
    """A write of the run's logs or config that the system refuses (a full disk, a lost mount, the folder removed)
    stops the run."""

    def stopped(reason: str) -> RunStopped:
        if not os.path.isdir(log_dir):
            return RunStopped(f"could not write the run's files in {log_dir}: the {FOLDER_GONE}; the run stopped")
        return RunStopped(
            f"could not write the run's files in {log_dir}: {reason}; the run stopped, and the checkpoints "
            "written before it are kept"
        )

    return refused_writes(stopped)


def quiet_tensorboard_writer_threads() -> None:
    """tensorboard writes its event files from a thread, which prints the traceback of a write the system
    refuses, then hands the error to the next write, where `refused_logs` tells it in one line: leave the
    telling to that line. Other threads' errors are printed as before."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: Any) -> None:
        writer_thread = type(args.thread).__module__.startswith("tensorboard.")
        if not (writer_thread and args.exc_type is not None and issubclass(args.exc_type, OSError)):
            previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def open_sinks(
    loggers: Iterable[str],
    run_dir: str,
    is_main: bool,
    purge_step: int | None = None,
    tensorboard: Callable[[], MetricsSink] | None = None,
    csv_folder: str = "csv",
    role: str | None = None,
    videos: dict[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> Sinks:
    """The run's sinks for `--logger`: `tensorboard` makes the TensorBoard one (a `SummaryWriter` by default);
    a process with a `role` of its own logs to a W&B run of its own, grouped with the run's, `videos` are the
    folders of the videos logged to W&B and `config` the run's config, which W&B records as it opens the run
    (`WandbSink`)."""
    make_tensorboard = tensorboard or (lambda: SummaryWriterSink(run_dir, is_main))
    sinks: list[MetricsSink] = []
    with refused_logs(run_dir):
        for name in dict.fromkeys(loggers):
            if name == "tensorboard":
                quiet_tensorboard_writer_threads()
                sinks.append(make_tensorboard())
            elif name == "csv":
                sinks.append(CSVSink(run_dir, is_main, purge_step, csv_folder))
            else:
                sinks.append(WandbSink(run_dir, is_main, role, videos, config))
    return Sinks(sinks, run_dir)


def _hparam_value(value: Any) -> Any:
    return value if isinstance(value, int | float | str | bool) else str(value)


def hparams_table(params: dict[str, Any]) -> str:
    rows = "\n".join(f"|{key}|{value}|" for key, value in params.items())
    return f"|param|value|\n|-|-|\n{rows}"


class MeanOverRanks:
    """Named running means pooled over every rank with one all-reduce per `compute`.

    torchmetrics syncs each metric separately (a barrier and two all-gathers apiece); with
    eight means that was 27 ms per update on gloo here, a tenth of the loop. Every rank must
    call `compute` at the same point, even with nothing recorded. Means with no samples on
    any rank are left out of the result.
    """

    def __init__(
        self,
        names: Iterable[str],
        device: torch.device,
        all_reduce_sum: AllReduceSum,
        counted: dict[str, str] | None = None,
    ) -> None:
        """`counted`: mean name -> the name under which `compute` also returns its number of samples."""
        self._index = {name: i for i, name in enumerate(names)}
        self._counted = counted or {}
        self._sums = torch.zeros(len(self._index), 2, dtype=torch.float64, device=device)  # (sum, count)
        # Values that are on the host already (episode returns, a learning rate) add up there, in Python: uploading
        # each would make the host wait for the GPU, and a torch op apiece costs more than the sum. They join the
        # device's sums once per compute.
        self._host_sums = [[0.0, 0.0] for _ in self._index]
        self._all_reduce_sum = all_reduce_sum
        self._rows: dict[tuple[tuple[str, ...], torch.device], torch.Tensor] = {}  # `update_present`'s indices
        self._samples: dict[tuple[str, ...], torch.Tensor] = {}  # `update_each`'s staging, per list of names

    def update(self, name: str, values: torch.Tensor | float | Sequence[float]) -> None:
        if isinstance(values, torch.Tensor) and values.device == self._sums.device:
            if values.numel():
                self._sums[self._index[name], 0] += values.double().sum()
                self._sums[self._index[name], 1] += values.numel()
            return
        if isinstance(values, torch.Tensor):  # on the host, beside a GPU's sums
            values = values.reshape(-1).tolist()
        values = [values] if isinstance(values, int | float) else values
        if values:
            sums = self._host_sums[self._index[name]]
            sums[0] += float(sum(values))
            sums[1] += len(values)

    def update_present(self, names: Sequence[str], values: torch.Tensor) -> None:
        """One sample of each of `names`, given as one vector in their order with NaN where a value is absent.
        On the sums' device it is added there, without reading it on the host; a vector on the host beside a
        GPU's sums adds up in Python, as `update`'s host values do."""
        if values.device != self._sums.device:  # on the host, beside a GPU's sums
            for name, value in zip(names, values.tolist(), strict=True):
                if not math.isnan(value):
                    self.update(name, value)
            return
        rows, values = self._rows_of(names, self._sums.device), values.to(torch.float64)
        present = ~values.isnan()
        self._sums[rows, 0] += torch.where(present, values, 0.0)
        self._sums[rows, 1] += present.to(torch.float64)

    def update_each(self, names: Sequence[str], values: torch.Tensor) -> None:
        """One sample of each of `names`, given as one vector on the device in their order: two launches for
        all of them, where `update` takes several per name."""
        samples = self._samples.get(tuple(names))
        if samples is None:  # (value, 1) rows, whose counts are set once: each update writes the values alone
            samples = self._samples[tuple(names)] = torch.ones(len(names), 2, dtype=torch.float64, device=values.device)
        samples[:, 0].copy_(values)
        self._sums.index_add_(0, self._rows_of(names, self._sums.device), samples)

    def _rows_of(self, names: Sequence[str], device: torch.device) -> torch.Tensor:
        """The sums' rows of `names` as an index on `device`, made once per list of names."""
        key = (tuple(names), device)
        if key not in self._rows:
            self._rows[key] = to_device([self._index[name] for name in names], device)  # not waited for
        return self._rows[key]

    def compute(self) -> dict[str, float]:
        self._sums += to_device(self._host_sums, self._sums.device, torch.float64)
        self._host_sums = [[0.0, 0.0] for _ in self._index]
        pooled = self._all_reduce_sum(self._sums).tolist()
        self._sums.zero_()
        means = {name: total / count for name, (total, count) in zip(self._index, pooled, strict=True) if count > 0}
        counts = {tag: pooled[self._index[name]][1] for name, tag in self._counted.items() if name in means}
        return means | counts


EPISODE_RETURN = "Rewards/rew_avg"
EPISODE_LENGTH = "Game/ep_len_avg"
# How many episodes ended in a report's interval: the weight of its mean return, from which a study
# recovers the mean of the last N training episodes (the figure CleanRL publishes).
EPISODE_COUNT = "Game/episodes"
EPISODE_STATISTICS = (EPISODE_RETURN, EPISODE_LENGTH)


class TrainingMetrics(MeanOverRanks):
    """Episode statistics and an algorithm's named statistics, aggregated across ranks."""

    def __init__(self, device: torch.device, all_reduce_sum: AllReduceSum, stat_tags: dict[str, str]) -> None:
        self.stat_tags = stat_tags  # statistic name -> TensorBoard tag
        super().__init__(
            [*EPISODE_STATISTICS, *stat_tags.values()], device, all_reduce_sum, counted={EPISODE_RETURN: EPISODE_COUNT}
        )

    def record_episodes(self, returns: list[float], lengths: list[int]) -> None:
        self.update(EPISODE_RETURN, returns)
        self.update(EPISODE_LENGTH, lengths)

    def record(self, stats: dict[str, torch.Tensor | float]) -> None:
        scalars = {name: value for name, value in stats.items() if self._is_device_scalar(value)}
        if scalars:  # an update's statistics: one vector, added at once
            values = torch.cat([value.reshape(1) for value in scalars.values()])  # type: ignore[union-attr]
            self.update_each([self.stat_tags[name] for name in scalars], values)
        for name, value in stats.items():
            if name not in scalars:
                self.update(self.stat_tags[name], value)

    def _is_device_scalar(self, value: torch.Tensor | float) -> bool:
        return isinstance(value, torch.Tensor) and value.numel() == 1 and value.device == self._sums.device

    def record_present(self, names: Sequence[str], values: torch.Tensor) -> None:
        """Statistics as one vector in `names`' order, NaN where one was not computed (see `update_present`)."""
        self.update_present([self.stat_tags[name] for name in names], values)


class ProgressBar:
    """Steps, steps/s and the recent return on rank 0, one refresh per update."""

    def __init__(self, total_steps: int, enabled: bool, initial: int = 0, drawn_by_job: bool | None = None) -> None:
        """`drawn_by_job`: another process of the job draws the bar on the shared stderr (default: `enabled`)."""
        self._bar = tqdm(total=total_steps, initial=initial, unit="step", disable=not enabled, dynamic_ncols=True)
        self._recent_return: float | None = None
        progress_line(enabled if drawn_by_job is None else drawn_by_job)

    def advance(self, steps: int, steps_per_second: float, episode_return: float | None) -> None:
        if episode_return is not None:
            self._recent_return = episode_return
        postfix = {"sps": f"{steps_per_second:,.0f}"}
        if self._recent_return is not None:
            postfix["return"] = f"{self._recent_return:.1f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(steps)

    def close(self) -> None:
        self._bar.close()
        progress_line(False)
