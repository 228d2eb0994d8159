"""Named training runs that outlive a session: each launch resumes the run from its newest checkpoint.

A study gives every run a fixed `--run-name` under OUT/runs and a checkpoint interval. `train`
launches the run (which resumes by itself where its folder holds a checkpoint) and appends the
launch's figures to OUT/segments/NAME.jsonl; when the run finishes, its row (summed over every
launch) goes to OUT/rows/NAME.json, its training curve to OUT/curves/NAME.csv, its saved agent to
OUT/agents/NAME.ckpt where the study keeps it, and its checkpoints are deleted, so a finished run
is never launched again. A session that ends mid-run loses at most one checkpoint interval.

What a study keeps in the repository is that layout (`benchmarks/results/STUDY/`); the run
folders (TensorBoard event files, launch logs) are not committed, but for the newest checkpoint of
a run in progress, which lets the run go on from another machine (a SAC run's, which holds its replay
buffer, is left untracked in the working tree instead).

A launch stopped by Ctrl-C prints its figures and checkpoints. A launch killed outright (the
session ended) leaves OUT/segments/NAME.open behind; the next launch of the run closes it as a
segment that ran from its start to the newest checkpoint, the work after which is lost.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from launch import SUMMARY, run_in_folder

from rl.checkpoint import newest_checkpoint
from rl.logger import EPISODE_COUNT, EPISODE_LENGTH, EPISODE_RETURN

EVALUATION = re.compile(r"evaluation over \d+ greedy episodes?: return (-?[\d.]+) ± ([\d.]+)")
COMPILE = re.compile(r"torch\.compile: ([\d.]+) s compiling")
INTERRUPTED = re.compile(r"^interrupted at step \d+", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    """One named run: `command` is called afresh for each launch (a launcher may need a new port)."""

    name: str
    command: Callable[[], list[str]]
    keys: dict  # what identifies the run in its row: config, seed, ...
    keep_agent: bool = False  # whether its saved agent outlives the run folder (OUT/agents/NAME.ckpt)


def resumable_flags(name: str, out: Path) -> list[str]:
    """What makes a training command a resumable run of a study: its fixed name under OUT/runs, a checkpoint
    every 5 minutes (only the newest kept), one torch thread, and no progress bar."""
    return ["--torch-threads", "1", "--no-progress-bar", "--run-name", name, "--log-dir", str(out / "runs"),
            "--checkpoint-every", "5m", "--keep-last", "1"]  # fmt: skip


def run_folder(out: Path, name: str) -> Path:
    return out / "runs" / "fabric_logs" / name


class Interrupted(Exception):
    """A launch stopped by Ctrl-C: its run checkpointed and resumes when the study starts again."""


def saved_step(out: Path, name: str) -> tuple[int, float]:
    """The step of the run's newest checkpoint and the time it was written; (0, 0.0) before the first."""
    newest = newest_checkpoint(str(run_folder(out, name)))
    if newest is None:
        return 0, 0.0
    return int(Path(newest).stem.removeprefix("step_")), Path(newest).stat().st_mtime


def open_launch_file(out: Path, name: str) -> Path:
    return out / "segments" / f"{name}.open"


def write_json(path: Path, value: dict) -> None:
    """Written whole or not at all: a harness killed mid-write (a session's end) leaves the file it had, which
    the next launch reads."""
    partial = path.with_name(f"{path.name}.tmp")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def append_segment(out: Path, name: str, segment: dict) -> None:
    segments_file = out / "segments" / f"{name}.jsonl"
    segments_file.parent.mkdir(parents=True, exist_ok=True)
    with segments_file.open("a") as segments:
        segments.write(json.dumps(segment) + "\n")


CHECKPOINT_WATCH_S = 10.0


@contextlib.contextmanager
def checkpoints_watched(out: Path, name: str, opened: dict) -> Iterator[None]:
    """While in the block, note in the launch's marker, by this machine's clock, when each new checkpoint appears,
    and write the run's curve so far.

    A killed launch counts up to its newest checkpoint, and a checkpoint file's own time cannot say when that
    was once its folder has been copied or restored: the file then carries the time of the copy. Its event files
    are not copied: the curve keeps what it logged up to there."""
    stop = threading.Event()

    def watch() -> None:
        seen = opened["from_step"]
        while not stop.wait(CHECKPOINT_WATCH_S):
            step = saved_step(out, name)[0]
            if step > seen:
                seen = step
                noted = {**opened, "checkpoint_step": step, "checkpoint_seen": round(time.time(), 1)}
                write_json(open_launch_file(out, name), noted)
                write_curve(out, name)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def close_killed_launch(out: Path, name: str) -> None:
    """Record a launch that was killed before it could: it counts from its start to its newest checkpoint."""
    marker = open_launch_file(out, name)
    if not marker.exists():
        return
    opened = json.loads(marker.read_text())
    step, written = saved_step(out, name)
    if step == opened.get("checkpoint_step"):  # else it was written in the launch's last seconds: its file's time
        written = opened["checkpoint_seen"]
    ended = max(opened["started"], written) if step > opened["from_step"] else opened["started"]
    seconds = round(ended - opened["started"], 1)
    append_segment(
        out,
        name,
        {
            "started": opened["started"],
            "ended": round(ended, 1),
            "wall_time_s": seconds,
            "exit": "killed",
            "steps": step - opened["from_step"],
            "loop_s": seconds,
            "compile_s": 0.0,
        },
    )
    marker.unlink()


def forget_launches_without_a_checkpoint(out: Path, name: str) -> None:
    """A run whose earlier launches left no checkpoint here (killed before its first, or a fresh clone: large
    checkpoints are not committed) starts again from step 0, in a clean folder, and those launches no longer count,
    nor does their curve."""
    earlier = [out / "segments" / f"{name}.jsonl", open_launch_file(out, name), curve_file(out, name)]
    if saved_step(out, name)[0] > 0 or not any(path.exists() for path in earlier):
        return
    print(f"{name}: no checkpoint of its earlier launches is left; it starts again from step 0", flush=True)
    for path in earlier:
        path.unlink(missing_ok=True)
    shutil.rmtree(run_folder(out, name), ignore_errors=True)


def launch_segment(run: Run, out: Path) -> tuple[dict, str]:
    """One launch of the run, to its end or until it fails or is interrupted; its figures and its stdout."""
    close_killed_launch(out, run.name)
    forget_launches_without_a_checkpoint(out, run.name)
    started = time.time()
    marker = open_launch_file(out, run.name)
    marker.parent.mkdir(parents=True, exist_ok=True)
    opened = {"started": round(started, 1), "from_step": saved_step(out, run.name)[0]}
    write_json(marker, opened)
    with checkpoints_watched(out, run.name, opened):
        done, wall_time = run_in_folder(run.command(), out / "launches" / run.name)
    summary, compiling = SUMMARY.search(done.stdout), COMPILE.search(done.stdout)
    segment = {
        "started": round(started, 1),
        "ended": round(time.time(), 1),
        "wall_time_s": round(wall_time, 1),
        "exit": done.returncode,
        "steps": int(summary.group(1)) if summary else 0,
        "loop_s": float(summary.group(2)) if summary else 0.0,
        "compile_s": float(compiling.group(1)) if compiling else 0.0,
    }
    append_segment(out, run.name, segment)
    write_curve(out, run.name)
    marker.unlink()
    return segment, done.stdout


def segments(out: Path, name: str) -> list[dict]:
    path = out / "segments" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train(run: Run, out: Path) -> dict:
    """Launch (or resume) the run until it finishes; its row, summed over every launch it took."""
    segment, stdout = launch_segment(run, out)
    evaluation = EVALUATION.search(stdout)
    if INTERRUPTED.search(stdout):
        raise Interrupted(f"{run.name} was interrupted; it resumes from its checkpoint when the study starts again")
    if segment["exit"] != 0 or evaluation is None:
        sys.exit(f"{run.name} failed (exit {segment['exit']}); see {out / 'launches' / run.name}")
    launches = segments(out, run.name)
    steps, loop_seconds = sum(s["steps"] for s in launches), sum(s["loop_s"] for s in launches)
    return {
        **run.keys,
        "eval_return": float(evaluation.group(1)),
        "eval_std": float(evaluation.group(2)),
        "steps": steps,
        "wall_time_s": round(sum(s["wall_time_s"] for s in launches), 1),
        "launches": len(launches),
        "env_steps_per_s": round(steps / loop_seconds) if loop_seconds else None,
        "compile_s": round(sum(s["compile_s"] for s in launches), 1),
        "training_return_last100": training_return_of_last(out, run.name),
    }


def row_file(out: Path, name: str) -> Path:
    return out / "rows" / f"{name}.json"


def run_all(plan: list[Run], out: Path, parallel: int = 1) -> list[dict]:
    """Every run of `plan` without a row yet, `parallel` at a time in plan order; the rows of the whole plan."""
    (out / "rows").mkdir(parents=True, exist_ok=True)
    pending = [run for run in plan if not row_file(out, run.name).exists()]
    print(f"{len(plan)} runs, {len(plan) - len(pending)} already done", flush=True)
    started = time.perf_counter()

    stopping = threading.Event()  # a failed run stops the study: a worker must not start the next one

    def finish(run: Run) -> None:
        if stopping.is_set():
            return
        try:
            row = train(run, out)
        except BaseException:
            stopping.set()
            raise
        write_json(row_file(out, run.name), row)
        if run.keep_agent:
            agent_file(out, run.name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run_folder(out, run.name) / "agent.ckpt", agent_file(out, run.name))
        shutil.rmtree(run_folder(out, run.name) / "checkpoints", ignore_errors=True)  # done: never resumed again
        print(
            f"{run.name}: return {row['eval_return']:.1f}, {row['wall_time_s']:.0f} s "
            f"({time.perf_counter() - started:.0f} s into this launch of the study)",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(finish, run) for run in pending]
        try:
            for future in futures:
                future.result()
        except BaseException as stop:  # a failed run, or Ctrl-C, stops the study; runs already going end their launch
            stopping.set()
            for future in futures:
                future.cancel()
            if not isinstance(stop, (Interrupted, KeyboardInterrupt)):
                raise
            pool.shutdown(wait=True)  # Ctrl-C reached the runs too: each writes its checkpoint
            sys.exit("interrupted: every unfinished run resumes from its newest checkpoint when the study starts again")
    return [json.loads(row_file(out, run.name).read_text()) for run in plan]


def training_seconds(out: Path, name: str, wall_clock: float) -> float:
    """Seconds of the run's launches before `wall_clock`: the time between sessions is not training."""
    return sum(
        max(0.0, min(wall_clock, s["ended"]) - s["started"]) for s in segments(out, name) if s["started"] <= wall_clock
    )


def agent_file(out: Path, name: str) -> Path:
    return out / "agents" / f"{name}.ckpt"


# What a run's curve keeps of its logs, and the column each goes to.
CURVE_COLUMNS = {EPISODE_RETURN: "episode_return", EPISODE_COUNT: "episodes", EPISODE_LENGTH: "episode_length"}


def curve_file(out: Path, name: str) -> Path:
    return out / "curves" / f"{name}.csv"


def write_curve(out: Path, name: str) -> Path:
    """OUT/curves/NAME.csv: the run's logged training figures at each report, kept where its event files are not.

    Written at each new checkpoint and after every launch, so a run that goes on from another machine keeps the
    curve of its earlier launches; written whole or not at all, as a killed harness may stop it mid-write."""
    scalars = logged_scalars(out, name, list(CURVE_COLUMNS))
    steps = sorted({step for points in scalars.values() for step in points})
    path = curve_file(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.tmp")
    with partial.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["env_steps", "wall_time", *CURVE_COLUMNS.values()])
        for step in steps:
            logged = [scalars.get(tag, {}).get(step) for tag in CURVE_COLUMNS]
            wall_time = next(point[1] for point in logged if point is not None)
            writer.writerow([step, round(wall_time, 3), *("" if point is None else point[0] for point in logged)])
    os.replace(partial, path)
    return path


def read_curve(path: Path, tags: list[str]) -> dict[str, dict[int, tuple[float, float]]]:
    with path.open() as file:
        lines = list(csv.DictReader(file))
    points = {}
    for tag in tags:
        column = CURVE_COLUMNS[tag]
        logged = {
            int(line["env_steps"]): (float(line[column]), float(line["wall_time"])) for line in lines if line[column]
        }
        if logged:
            points[tag] = logged
    return points


def logged_scalars(out: Path, name: str, tags: list[str]) -> dict[str, dict[int, tuple[float, float]]]:
    """Per tag, the run's logged points: step -> (value, wall time). Its curve file holds those of launches whose
    event files are gone; the event files here hold the newer ones, from their first step on."""
    kept = read_curve(curve_file(out, name), tags) if curve_file(out, name).exists() else {}
    logged = logged_events(out, name, tags)
    first_logged = min((step for points in logged.values() for step in points), default=None)
    merged = {}
    for tag in {*kept, *logged}:
        earlier = {
            step: point for step, point in kept.get(tag, {}).items() if first_logged is None or step < first_logged
        }
        merged[tag] = earlier | logged.get(tag, {})
    return {tag: merged[tag] for tag in tags if tag in merged}


def logged_events(out: Path, name: str, tags: list[str]) -> dict[str, dict[int, tuple[float, float]]]:
    """Per tag, the points in the run's event files; the newest launch's where launches overlap."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # A resumed launch logs again from its checkpoint's step; TensorBoard then warns that it drops the
    # points the earlier launch logged past that step ("out of order event.step"), which is what we want.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    folder = run_folder(out, name)
    if not folder.exists():
        return {}
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    logged = set(events.Tags()["scalars"])
    return {tag: {p.step: (p.value, p.wall_time) for p in events.Scalars(tag)} for tag in tags if tag in logged}


def curve(out: Path, name: str) -> tuple[list[float], list[float], list[float]]:
    """The run's logged training return: env steps, training seconds and return at each point."""
    points = logged_scalars(out, name, [EPISODE_RETURN]).get(EPISODE_RETURN, {})
    steps = sorted(points)
    seconds = [training_seconds(out, name, points[step][1]) for step in steps]
    return steps, seconds, [points[step][0] for step in steps]


def mean_of_last_episodes(steps: list[int], returns: list[float], episodes: list[float], last: int) -> float | None:
    """The mean return of the last `last` training episodes, from reports of (step, mean return, episodes ended):
    the newest reports' means weighted by their episodes, the oldest of them by only the episodes it adds."""
    total = weight = 0.0
    for _, mean, count in sorted(zip(steps, returns, episodes, strict=True), reverse=True):
        taken = min(count, last - weight)
        total, weight = total + mean * taken, weight + taken
        if weight >= last:
            break
    return total / weight if weight else None


def training_return_of_last(out: Path, name: str, last: int = 100) -> float | None:
    """The mean of the run's last `last` training episodes, as CleanRL reports a run, from its logs.

    Each report logs the mean return of the episodes that ended since the last and their number. Runs
    logged before that number was counted are weighed by the steps between reports over the mean
    episode length, the number of episodes that ended on average."""
    scalars = logged_scalars(out, name, [EPISODE_RETURN, EPISODE_COUNT, EPISODE_LENGTH])
    returns = scalars.get(EPISODE_RETURN, {})
    steps = sorted(returns)
    if not steps:
        return None
    if EPISODE_COUNT in scalars:
        counts = [scalars[EPISODE_COUNT][step][0] for step in steps]
    else:
        lengths, previous = scalars[EPISODE_LENGTH], [0, *steps[:-1]]
        counts = [(step - before) / lengths[step][0] for step, before in zip(steps, previous, strict=True)]
    return mean_of_last_episodes(steps, [returns[step][0] for step in steps], counts, last)
