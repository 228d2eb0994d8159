"""Evaluate a saved agent or training checkpoint: `python -m rl.evaluate CHECKPOINT [flags]`.

Prints the mean ± std of the episode return and length; with --capture-video writes an mp4 of
the first episode under the run folder and logs it, and the scores, to TensorBoard there; with
--render shows the first env in a window as the agent plays.
"""

from __future__ import annotations

import glob
import io
import math
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from rl.agent import agent_from_file
from rl.checkpoint import CHECKPOINT_DIR
from rl.cli import check_video_support
from rl.config import check_seed, flag
from rl.env_faults import EnvFault
from rl.envs import check_renders, has_display, video_folder
from rl.errors import UsageError, exit_on_ctrl_c, exit_on_usage_error, misspelled_option, print_error, refused_writes
from rl.flag_parsing import flag_spellings, parse_dataclass
from rl.logger import LoggerName, check_loggers_installed, open_sinks, quiet_tensorboard_writer_threads
from rl.peer_flags import EVALUATION_PEER_FLAGS, tools_peer_flag
from rl.runtime import configure_torch_threads


@dataclass
class EvalConfig:
    """Evaluate a saved agent (agent.ckpt) or a training checkpoint."""

    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="CHECKPOINT")]
    """the file to evaluate"""
    episodes: int = 10
    """how many episodes, run side by side"""
    deterministic: bool = True
    """act with the distribution's mode; --stochastic (or --no-deterministic) samples actions"""
    capture_video: bool = False
    """write an mp4 of the first episode under the run folder and log it to TensorBoard and W&B"""
    render: bool = False
    """show the first env in a window as the agent plays (needs a display and an env that renders to one)"""
    env_id: str | None = None
    """evaluate on another env with the same spaces (default: the one it was trained on)"""
    seed: int = 0
    """seed of the evaluation envs and of sampled actions"""
    logger: tuple[LoggerName, ...] = ("tensorboard",)
    """where the scores go, in the run folder: tensorboard (evaluation/), csv (evaluation-csv/metrics.csv, a row per
    evaluation), wandb (the run's own W&B run)"""


def parse(argv: list[str]) -> EvalConfig:
    argv = ["--no-deterministic" if arg == "--stochastic" else arg for arg in argv]
    try:
        return parse_dataclass(EvalConfig, argv)
    except UsageError as error:
        flags_here = {flag(member.name) for member in fields(EvalConfig)}
        peers = tools_peer_flag(error, EVALUATION_PEER_FLAGS, flags_here)
        raise peers or misspelled_option(error, flag_spellings(EvalConfig)) or error from None


def run_folder(checkpoint: str) -> Path:
    """The run folder: where agent.ckpt lies, or the parent of a checkpoints/ folder."""
    folder = Path(checkpoint).resolve().parent
    return folder.parent if folder.name == CHECKPOINT_DIR else folder


def log_scores(
    loggers: tuple[str, ...], folder: Path, returns: np.ndarray, lengths: np.ndarray, video_dir: str | None
) -> None:
    """The scores to each logger, with the video: TensorBoard here, the others through the run's sinks."""
    if "tensorboard" in loggers:
        log_to_tensorboard(folder, returns, lengths, video_dir)
    others = [name for name in loggers if name != "tensorboard"]
    if others:
        # every evaluation adds its row to those of the evaluations before it, as TensorBoard's event files do
        videos = {"Eval/video": video_dir} if video_dir else {}  # the training's videos are the run's already
        sinks = open_sinks(
            others, str(folder), True, purge_step=sys.maxsize, csv_folder="evaluation-csv", videos=videos
        )
        sinks.log_scalars(
            {
                "Eval/return_mean": float(returns.mean()),
                "Eval/return_std": float(returns.std()),
                "Eval/length_mean": float(lengths.mean()),
            },
            0,
        )
        sinks.close()


def log_to_tensorboard(folder: Path, returns: np.ndarray, lengths: np.ndarray, video_dir: str | None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    quiet_tensorboard_writer_threads()
    with SummaryWriter(str(folder / "evaluation")) as writer:
        writer.add_scalar("Eval/return_mean", float(returns.mean()))
        writer.add_scalar("Eval/return_std", float(returns.std()))
        writer.add_scalar("Eval/length_mean", float(lengths.mean()))
        videos = sorted(glob.glob(os.path.join(video_dir, "*.mp4"))) if video_dir else []
        if videos:
            writer.file_writer.add_summary(video_summary("Eval/video", videos[0]))


# A longer episode's GIF keeps every k-th frame and plays k times as fast: an Atari episode of 27,000 steps, all
# its frames, took minutes and GBs to encode.
GIF_FRAMES = 600


def video_summary(tag: str, mp4: str):
    """The mp4 as TensorBoard's animated-GIF video summary, at most `GIF_FRAMES` frames long.

    `SummaryWriter.add_video` encodes through moviepy 1.x's `moviepy.editor`, which moviepy 2
    removed, so the GIF is made here with Pillow.
    """
    from moviepy import VideoFileClip
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    with VideoFileClip(mp4) as clip:
        every = max(1, math.ceil(clip.duration * clip.fps / GIF_FRAMES))
        frames = [Image.fromarray(frame) for index, frame in enumerate(clip.iter_frames()) if index % every == 0]
        duration_ms = int(1000 * every / clip.fps)
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:], duration=duration_ms, loop=0)
    width, height = frames[0].size
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def check_window_support(cfg: EvalConfig) -> None:
    """--render's window is the first env's render mode, which a recording takes too, and needs a display."""
    if cfg.capture_video:
        raise UsageError("--render", "takes no --capture-video: the first env shows itself or records, not both")
    if not has_display():
        raise UsageError("--render", "no display here (no DISPLAY or WAYLAND_DISPLAY); --capture-video records an mp4")


def main(argv: list[str]) -> None:
    cfg = parse(argv)
    if cfg.episodes <= 0:
        raise UsageError("--episodes", f"must be positive, got {cfg.episodes}")
    check_seed(cfg.seed)
    if cfg.capture_video:
        check_video_support()
    check_loggers_installed(cfg.logger)
    if cfg.render:
        check_window_support(cfg)
    agent = agent_from_file(cfg.checkpoint, "cpu", cfg.env_id, flag="CHECKPOINT")
    if cfg.render:
        check_renders(agent.env_id, agent.preprocessing, "human", "--render")
    if cfg.capture_video:
        check_renders(agent.env_id, agent.preprocessing, "rgb_array", "--capture-video")
    configure_torch_threads(0, agent.cnn)  # as training would: one thread for an MLP
    folder = run_folder(cfg.checkpoint)
    video_dir = video_folder(str(folder), "eval", Path(cfg.checkpoint).stem) if cfg.capture_video else None
    env_id = agent.env_id
    try:
        returns, lengths = agent.evaluate(cfg.episodes, cfg.seed, cfg.deterministic, video_dir, cfg.render)
    except EnvFault as fault:  # a bad env, named as the flag that chose it
        if fault.context:
            print_error(fault.context)
        raise UsageError("--env-id", f"{env_id}'s {fault.what}") from None
    mode = "deterministic" if cfg.deterministic else "stochastic"
    episodes = f"{cfg.episodes} {mode} episode{'s' if cfg.episodes > 1 else ''}"
    print(
        f"{env_id}, {episodes}: return {returns.mean():.2f} ± {returns.std():.2f}, "
        f"length {lengths.mean():.1f} ± {lengths.std():.1f}"
    )
    # The logs go into the checkpoint's run folder: a full disk there is told as such, after the scores.
    unlogged = f"cannot log the scores above into the checkpoint's run folder, {folder}"
    with refused_writes(lambda reason: UsageError("CHECKPOINT", f"{unlogged}: {reason}")):
        log_scores(cfg.logger, folder, returns, lengths, video_dir)
    if video_dir:
        print(f"video: {sorted(glob.glob(os.path.join(video_dir, '*.mp4')))[0]}")


if __name__ == "__main__":
    with exit_on_ctrl_c(), exit_on_usage_error():
        main(sys.argv[1:])
