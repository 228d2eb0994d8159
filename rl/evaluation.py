"""Greedy evaluation on fresh environments: the closing evaluation of a run, and the periodic one of
`--eval-every`."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from rl.checkpoint import BestAgent, SavedAgent
from rl.config import RunConfig
from rl.env_faults import ENV_RESET, ENV_STEP, check_finite, close_envs
from rl.envs import (
    ATARI_PREPROCESSING,
    Preprocessing,
    ends_its_episodes_in_time,
    first_episode,
    make_vector_env,
    observations_tensor,
    stored_as_bytes,
    video_folder,
)
from rl.errors import counted, print_error
from rl.experience import Policy
from rl.loop import checkpoint_due
from rl.multi_input import packed_layout
from rl.normalization import ObservationNormalizer
from rl.run import Run
from rl.seeds import EVAL_STREAM, derive_seed


class EvaluationAbandoned(Exception):
    """`evaluate_greedy`'s `abandon` asked it to stop before its episodes ended."""


MAX_EVALUATION_ENVS = 64  # episodes played side by side at most: more are played in groups of this many
# Where the env sets no time limit, an evaluation episode ends after this many steps: else a greedy policy that
# never reaches an end (CliffWalking's, walking into a wall) would keep the evaluation going for ever.
UNLIMITED_EPISODE_STEPS = 10_000


@torch.no_grad()
def evaluate_greedy(
    agent: Policy,
    env_id: str,
    episodes: int,
    seed: int,
    obs_normalizer: ObservationNormalizer,
    device: torch.device,
    video_dir: str | None = None,
    deterministic: bool = True,
    preprocessing: Preprocessing = ATARI_PREPROCESSING,
    abandon: Callable[[], bool] | None = None,
    window: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of `episodes` episodes, one per env, played side by side in groups of at most
    `MAX_EVALUATION_ENVS` (so that many episodes never hold as many envs at once); episode i's env is seeded by i.

    Greedy (the distribution's mode) unless `deterministic` is False; then actions are sampled
    from a generator seeded by `seed`. With `video_dir`, the first env's episode is recorded (the
    env's own frames); with `window`, the first env shows itself in a window. The envs are the game as
    it is: no episodic life, no clipped rewards. Where the env sets no time limit, an episode still going after
    `UNLIMITED_EPISODE_STEPS` steps ends there, and a warning says so. `abandon`, asked before each step, raises
    `EvaluationAbandoned` once it answers True.
    """
    generator = torch.Generator(device=device).manual_seed(derive_seed(seed, EVAL_STREAM, episodes))
    groups = [
        _play_episodes(
            agent,
            env_id,
            range(first, min(first + MAX_EVALUATION_ENVS, episodes)),
            seed,
            obs_normalizer,
            device,
            (video_dir, window) if first == 0 else (None, False),
            deterministic,
            generator,
            preprocessing,
            abandon,
        )
        for first in range(0, episodes, MAX_EVALUATION_ENVS)
    ]
    cut = sum(cut for _, _, cut in groups)
    if cut:
        warn_of_cut_episodes(env_id, cut, episodes)
    return np.concatenate([returns for returns, _, _ in groups]), np.concatenate([lengths for _, lengths, _ in groups])


def _play_episodes(
    agent: Policy,
    env_id: str,
    indices: range,
    seed: int,
    obs_normalizer: ObservationNormalizer,
    device: torch.device,
    shown: tuple[str | None, bool],
    deterministic: bool,
    generator: torch.Generator,
    preprocessing: Preprocessing,
    abandon: Callable[[], bool] | None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The episodes `indices`, one per env, side by side, their returns and lengths, and how many of them were cut
    at `UNLIMITED_EPISODE_STEPS`; `shown`: the first env's video folder and window."""
    episodes = len(indices)
    video_dir, window = shown
    envs = make_vector_env(
        env_id, episodes, video_dir, preprocessing=preprocessing, window=window, video_episodes=first_episode
    )
    as_bytes = stored_as_bytes(envs.single_observation_space)
    layout = packed_layout(envs.single_observation_space)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
    finished = np.zeros(episodes, dtype=bool)
    act = _stepper(agent, episodes, device, deterministic, generator)
    step_limit = None if ends_its_episodes_in_time(envs) else UNLIMITED_EPISODE_STEPS
    try:
        with ENV_RESET:
            obs, _ = envs.reset(seed=[derive_seed(seed, EVAL_STREAM, i) for i in indices])
        check_finite(obs, call="reset", layout=layout)
        starts = np.ones(episodes, dtype=bool)
        steps = 0
        while not finished.all() and steps != step_limit:
            if abandon is not None and abandon():
                raise EvaluationAbandoned
            obs_t = observations_tensor(obs, as_bytes, device)
            action = act(obs_normalizer(obs_t), torch.as_tensor(starts, device=device)).cpu().numpy()
            with ENV_STEP:
                obs, reward, terminated, truncated, info = envs.step(action)
            check_finite(obs, reward, layout=layout)  # else a score of nan, and no word of where it came from
            starts = terminated | truncated
            if "_episode" in info:  # only an env's first episode counts
                ended = info["_episode"] & ~finished
                returns[ended] = info["episode"]["r"][ended]
                lengths[ended] = info["episode"]["l"][ended]
                finished |= ended
            steps += 1
        cut = ~finished  # each env still in its first episode has played `steps` steps of it
        returns[cut], lengths[cut] = envs.episode_returns[cut], steps
    finally:
        close_envs(envs)
    return returns, lengths, int(cut.sum())


def warn_of_cut_episodes(env_id: str, cut: int, episodes: int) -> None:
    print_error(
        f"warning: {cut} of {episodes} evaluation episodes did not end within {UNLIMITED_EPISODE_STEPS:,} steps and "
        f"were cut there: {env_id} sets no time limit (register it with max_episode_steps, or train with "
        "--env-kwarg max_episode_steps=N)"
    )


def _stepper(
    agent: Policy, num_envs: int, device: torch.device, deterministic: bool, generator: torch.Generator
) -> Callable[[Tensor, Tensor], Tensor]:
    """`(obs, starts) -> actions` for `num_envs` envs; a recurrent policy's state is carried from call to call."""
    # gSDE's noise matrices, one per env for the whole evaluation (stochastic play only)
    exploration = None if deterministic else agent.exploration_matrices(num_envs, generator)
    if not agent.recurrent:
        return lambda obs, _: agent.greedy_action(obs) if deterministic else agent.act(obs, generator, exploration)[0]
    memory = agent.initial_memory(num_envs, device)

    def act(obs: Tensor, starts: Tensor) -> Tensor:
        nonlocal memory
        if deterministic:
            action, memory = agent.greedy_action(obs, memory, starts)
        else:
            action, _, _, memory = agent.act(obs, generator, memory, starts, exploration)
        return action

    return act


def greedy_returns(
    cfg: RunConfig, env_id: str, policy: nn.Module, obs_normalizer: ObservationNormalizer, video_dir: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of --eval-episodes greedy episodes, on the policy's device."""
    device = next(policy.parameters()).device
    return evaluate_greedy(
        policy,
        env_id,
        cfg.eval_episodes,
        cfg.seed,
        obs_normalizer,
        device,
        video_dir,
        preprocessing=cfg.preprocessing(),
    )


def report_evaluation(
    cfg: RunConfig,
    env_id: str,
    policy: nn.Module,
    obs_normalizer: ObservationNormalizer,
    run: Run,
    global_step: int,
) -> dict[str, float] | None:
    """The closing evaluation's `Test/` scalars, logged and printed (None with --eval-episodes 0)."""
    if cfg.eval_episodes == 0:
        return None
    video_dir = video_folder(run.dir, "test", f"step_{global_step}") if cfg.capture_video else None
    returns, lengths = greedy_returns(cfg, env_id, policy, obs_normalizer, video_dir)
    summary = {
        "Test/return_mean": float(np.mean(returns)),
        "Test/return_std": float(np.std(returns)),
        "Test/length_mean": float(np.mean(lengths)),
    }
    run.sink.log_scalars(summary, global_step)
    print(
        f"evaluation over {counted(cfg.eval_episodes, 'greedy episode')}: return "
        f"{summary['Test/return_mean']:.2f} ± {summary['Test/return_std']:.2f}, "
        f"length {summary['Test/length_mean']:.1f}",
        flush=True,
    )
    return summary


class PeriodicEvaluation:
    """`--eval-every`: greedy episodes during training, on the main process, logged as Eval/ scalars, with the
    best agent so far kept as the run's `best.ckpt` (the training loop stops at --stop-at-return).

    The time it takes is kept apart (`seconds`), so that the loop's env steps/s measure training.
    """

    def __init__(self, cfg: RunConfig, env_id: str, run: Run, is_main: bool, start_step: int) -> None:
        self.cfg, self.env_id, self.run, self.is_main = cfg, env_id, run, is_main
        self.last_step, self.seconds = start_step, 0.0
        # Read on every rank, so that a bad file stops each with its line (only the main process keeps it).
        self.best = BestAgent(run.dir, "--eval-every") if cfg.eval_every else None

    def reached_target_by(self, global_step: int) -> bool:
        """Whether an evaluation at or before `global_step` reached --stop-at-return, which ends training there:
        a run resumed from that far has nothing left to train (the main process says so)."""
        target, best = self.cfg.stop_at_return, self.best
        if target is None or best is None or best.step is None or best.step > global_step or best.score < target:
            return False
        if self.is_main:
            print(
                f"this run already reached --stop-at-return {target:g} at step {best.step:,} (a greedy return of "
                f"{best.score:.2f}): nothing is left to train but its closing evaluation (a higher --stop-at-return "
                "trains on)",
                flush=True,
            )
        return True

    def evaluate(
        self,
        policy: nn.Module,
        obs_normalizer: ObservationNormalizer,
        global_step: int,
        agent: Callable[[], SavedAgent],
    ) -> dict | None:
        """Evaluate if an --eval-every boundary has passed since the last call (main process only): the `Eval/`
        scalars logged, else None. `agent()` is the policy as a saved agent, kept if it scores best so far."""
        due = checkpoint_due(self.cfg.eval_every, global_step, global_step - self.last_step)
        self.last_step = global_step
        if not (due and self.is_main and self.best is not None):
            return None
        started = time.perf_counter()
        returns, lengths = greedy_returns(self.cfg, self.env_id, policy, obs_normalizer)
        self.seconds += time.perf_counter() - started
        mean = float(np.mean(returns))
        self.best.offer(mean, global_step, agent)
        scalars = {
            "Eval/return_mean": mean,
            "Eval/return_std": float(np.std(returns)),
            "Eval/length_mean": float(np.mean(lengths)),
            "Eval/best_return": self.best.score,
        }
        self.run.sink.log_scalars(scalars, global_step)
        print(
            f"step {global_step}: greedy return {scalars['Eval/return_mean']:.2f} ± {scalars['Eval/return_std']:.2f} "
            f"over {counted(len(returns), 'episode')}",
            flush=True,
        )
        return scalars
