"""SAC's configuration: Stable-Baselines3's and CleanRL's flag names, and their defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rl.algos.sac.presets import SAC_PRESETS
from rl.config import RunConfig, check_signs
from rl.errors import UsageError, counted

AUTO = "auto"
ENT_COEF_FORMS = "must be a positive number, 'auto' or 'auto_' and a positive start (auto_0.1)"


@dataclass
class SACConfig(RunConfig):
    """Soft Actor-Critic trained across processes (continuous actions)."""

    preset: Literal["pendulum", "halfcheetah", "hopper", "walker2d", "bipedalwalker"] | None = None
    """start from tuned settings for an env (flags given as well override them), per process: pendulum tuned for
    2 processes; the MuJoCo ones (halfcheetah, hopper, walker2d: the -v5 envs) and bipedalwalker (gSDE) are
    rl-zoo's for 1 process"""

    env_id: str = "Pendulum-v1"
    """the id of the gymnasium environment (its action space must be a bounded Box)"""
    num_envs: int = 1
    """the number of parallel environments per rank"""
    total_timesteps: int = 20_000
    """total environment steps, counted across all ranks; a run trains the whole global iterations that fit"""

    buffer_size: int = 1_000_000
    """replay buffer capacity in transitions, over all ranks (coupled: each rank holds its share)"""
    learning_starts: int = 100
    """env steps (across all ranks) of uniformly random actions before learning starts"""
    batch_size: int = 256
    """transitions per gradient step on each learner"""
    tau: float = 0.005
    """the target networks' Polyak averaging coefficient"""
    train_freq: int = 1
    """vector env steps between two learning phases"""
    gradient_steps: int = 1
    """gradient steps in each learning phase"""
    update_while_stepping: bool = False
    """start each learning phase while the envs take the phase's last step (after its actions are queued), so that
    on a GPU the update trains while the CPU steps the envs; the update then samples the replay buffer without
    that step's transitions, which later phases see (coupled and Hogwild modes); on by default with --cuda, where
    it was measured faster, off elsewhere"""
    ent_coef: str = AUTO
    """the entropy coefficient (temperature): a number, or 'auto' to tune it towards --target-entropy from 1.0
    ('auto_0.1': from 0.1, Stable-Baselines3's form)"""
    target_entropy: str = AUTO
    """the entropy the tuned temperature aims at: a number, or 'auto' for -(action dimensions)"""
    policy_lr: float = 3e-4
    """the learning rate of the actor's Adam optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the critics' and the temperature's Adam optimizers"""
    target_network_frequency: int = 1
    """gradient steps between two target-network updates"""
    policy_frequency: int = 1
    """gradient steps between actor updates; each time the actor takes that many steps (delayed, as TD3)"""
    actor_after_critics: bool = False
    """step the critics first and take the actor's loss from the updated ones, as Stable-Baselines3 and CleanRL do
    (a second backward pass and collective per step); by default one pass takes every loss from the same
    parameters, as the original SAC does"""
    scale_lr: bool = False
    """multiply the learning rates by the number of learners (the DSAC rule for comparable runs)"""
    save_buffer: bool = False
    """put the replay buffer into training checkpoints, so a resumed run equals an uninterrupted one (without it,
    a resumed run collects --learning-starts transitions with its policy before it trains again)"""
    log_every: int = 1000
    """env steps (across all ranks) between two logged points"""
    net_arch: tuple[int, int] = (256, 256)
    """units of the two hidden layers of the actor and of each critic (Stable-Baselines3's net_arch)"""
    log_std_init: float = -3.0
    """with --use-sde: the initial log of every entry of gSDE's noise std matrix (Stable-Baselines3's default)"""

    ALGORITHM = "sac"
    PRESETS = SAC_PRESETS
    REPORT_FLAG = "--log-every"
    IMMUTABLE = (*RunConfig.IMMUTABLE, "net_arch")
    PER_RANK = (*RunConfig.PER_RANK, "batch_size")
    FOLLOWING_DEFAULTS = (*RunConfig.FOLLOWING_DEFAULTS, "update_while_stepping")
    ITERATION_NAME = "learning phase"

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.train_freq

    def learners_shares(self, mode: str) -> tuple[str, ...]:
        if mode == "decoupled" and self.share_data:
            return ()  # the trainers split one batch of --batch-size between them
        return super().learners_shares(mode)

    def iterations_per_report(self, env_ranks: int) -> int:
        return max(1, self.log_every // self.global_iteration_steps(env_ranks))

    @property
    def autotune(self) -> bool:
        return self.ent_coef == AUTO or self.ent_coef.startswith(AUTO + "_")

    @property
    def initial_temperature(self) -> float:
        """The temperature training starts from: the fixed one, or where tuning starts (1.0 for 'auto')."""
        if self.ent_coef == AUTO:
            return 1.0
        try:
            return float(self.ent_coef.removeprefix(AUTO + "_"))
        except ValueError:
            raise UsageError("--ent-coef", f"{ENT_COEF_FORMS}, got {self.ent_coef!r}") from None

    def validate_algorithm(self) -> None:
        if self.gradient_steps == -1:
            phase = self.train_freq * self.num_envs
            message = f"takes a count: Stable-Baselines3's -1, a step per env step, is --gradient-steps {phase} here"
            envs = counted(self.num_envs, "env")
            raise UsageError("--gradient-steps", message + f" (--train-freq {self.train_freq} x {envs})")
        check_signs(
            self,
            positive=(
                "buffer_size",
                "batch_size",
                "train_freq",
                "gradient_steps",
                "policy_lr",
                "q_lr",
                "target_network_frequency",
                "policy_frequency",
                "log_every",
            ),
            non_negative=("learning_starts",),
        )
        if not 0.0 < self.tau <= 1.0:
            raise UsageError("--tau", f"must be in (0, 1], got {self.tau}")
        if not 0 < self.initial_temperature < math.inf:
            raise UsageError("--ent-coef", f"{ENT_COEF_FORMS}, got {self.ent_coef!r}")
        if self.target_entropy != AUTO:
            parse_number(self.target_entropy, "--target-entropy")
            if not self.autotune:
                message = "is what --ent-coef auto tunes towards; add --ent-coef auto (or drop the flag)"
                raise UsageError("--target-entropy", message)
        if self.log_std_init != type(self)().log_std_init and not self.use_sde:
            raise UsageError("--log-std-init", "starts the noise of --use-sde; add --use-sde (or drop the flag)")
        if min(self.net_arch) <= 0:
            raise UsageError("--net-arch", f"each layer needs a positive number of units, got {self.net_arch}")
        if self.buffer_size < self.batch_size:
            raise UsageError("--buffer-size", f"{self.buffer_size} cannot hold one batch of {self.batch_size}")

    def validate_steps(self, env_ranks: int) -> None:
        trained = self.trained_timesteps(env_ranks)
        if self.learning_starts >= trained:
            raise UsageError(
                "--learning-starts",
                f"{self.learning_starts} is not below the {trained} steps that --total-timesteps "
                f"{self.total_timesteps} trains: the run would end before its first gradient step",
            )
        received = trained // env_ranks  # the transitions each acting process's replay buffer receives
        if self.batch_size > received:
            raise UsageError(
                "--batch-size",
                f"{self.batch_size} is more than the {received} transitions that "
                f"{f'each of the {env_ranks} acting processes collects of' if env_ranks > 1 else 'the run collects in'}"
                f" --total-timesteps {self.total_timesteps}: the run would end before its first gradient step",
            )

    def following_defaults(self) -> dict[str, bool]:
        # An update that overlaps the envs' step: faster on a GPU, and a decoupled player (which has no update)
        # ignores it.
        return super().following_defaults() | {"update_while_stepping": self.cuda}

    def validate_decoupled(self, num_trainers: int) -> None:
        if self.update_while_stepping and not self.came_by_default("update_while_stepping"):
            raise UsageError(
                "--update-while-stepping",
                "starts a rank's update while its own envs step; a decoupled trainer has none",
            )
        if self.share_data and self.batch_size < num_trainers:
            raise UsageError(
                "--batch-size", f"a shared batch of {self.batch_size} cannot be split among {num_trainers} trainers"
            )


def parse_number(text: str, flag_name: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise UsageError(flag_name, f"must be a number or 'auto', got {text!r}") from None
    if not math.isfinite(number):
        raise UsageError(flag_name, f"must be a finite number, got {number}")
    return number
