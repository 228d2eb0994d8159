"""PPO's configuration: the flags of Lightning's fabric RL example, with the same defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl.algos.ppo.presets import PPO_PRESETS
from rl.config import RunConfig, check_signs, flag
from rl.errors import UsageError, counted


@dataclass
class PPOConfig(RunConfig):
    """Proximal Policy Optimization trained across processes (the default algorithm; `sac --help` for SAC)."""

    preset: (
        Literal[
            "cartpole",
            "acrobot",
            "lunarlander",
            "masked-cartpole",
            "pendulum",
            "pendulum-gsde",
            "atari-ppo",
            "halfcheetah",
            "hopper",
            "walker2d",
            "ant",
            "swimmer",
            "swimmer-tuned",
            "cleanrl-mujoco",
        ]
        | None
    ) = None
    """start from tuned settings for an env (flags given as well override them), per process: the classic-control
    ones tuned for 2 processes (masked-cartpole: rl/MaskedCartPole-v1 with --recurrent; pendulum-gsde: rl-zoo's
    gSDE entry, for 1 process); the MuJoCo ones (halfcheetah, hopper, walker2d, ant, swimmer: the -v5 envs) are
    rl-zoo's for 1 process, swimmer-tuned its current Swimmer entry (4 envs); cleanrl-mujoco: CleanRL's
    continuous-action settings (Hopper-v5; give --env-id for another env); atari-ppo: CleanRL's Atari settings
    (ALE/Breakout-v5; give --env-id for another game)"""

    per_rank_batch_size: int = 64
    """the minibatch size on each rank (with --recurrent, by default one sequence: --num-steps)"""
    num_steps: int = 128
    """the number of steps each environment runs per rollout"""
    learning_rate: float = 1e-3
    """the learning rate of the Adam optimizer"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to zero over the run"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    update_epochs: int = 10
    """the number of passes over the rollout per update"""
    activation_function: Literal["relu", "tanh"] = "relu"
    """the activation function of the actor and critic networks"""
    hidden_size: int = 64
    """units in each of the two hidden layers of the actor's and the critic's MLPs (vector observations)"""
    log_std_init: float = 0.0
    """the initial log standard deviation of the Gaussian policy (continuous actions)"""
    ortho_init: bool = False
    """initialize the layers orthogonally"""
    normalize_advantages: bool = False
    """normalize the advantages of each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = False
    """clip the value loss, as in the PPO paper"""
    ent_coef: float = 0.0
    """the coefficient of the entropy bonus"""
    vf_coef: float = 1.0
    """the coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum global gradient norm, applied after DDP averaging (0 disables clipping)"""
    target_kl: float | None = None
    """stop an update's epochs at the first minibatch whose approximate KL divergence from the rollout's policy,
    averaged over the ranks, passes 1.5 x this (Stable-Baselines3's rule); every rank stops at the same minibatch"""
    normalize_observations: bool = False
    """normalize observations with running statistics synchronized across ranks"""
    normalize_rewards: bool = False
    """scale rewards by the running std of the discounted return, synchronized across ranks"""
    recurrent: bool = False
    """add an LSTM, shared by the actor and the critic, between the encoder and the heads: for tasks whose
    observations hide part of the state; minibatches then hold whole env sequences"""
    lstm_hidden_size: int = 128
    """with --recurrent: the LSTM's hidden units"""
    lstm_layers: int = 1
    """with --recurrent: the LSTM's layers"""
    env_groups: int = 1
    """split each process's --num-envs into this many groups that step in turn, each in a thread of its own: while
    one group's envs step, the policy acts on another's (envs that step outside Python's lock, such as native and
    async ones, then overlap acting on a GPU); --num-envs must divide by it"""

    ALGORITHM = "ppo"
    PRESETS = PPO_PRESETS
    IMMUTABLE = (
        *RunConfig.IMMUTABLE,
        "activation_function",
        "hidden_size",
        "recurrent",
        "lstm_hidden_size",
        "lstm_layers",
        "normalize_observations",  # the network was trained on its inputs as they were (normalized or raw)
        "env_groups",  # each group's envs are saved mid-episode with its own random stream
    )
    PER_RANK = (*RunConfig.PER_RANK, "per_rank_batch_size")
    ITERATION_NAME = "rollout"

    @property
    def rollout_steps_per_rank(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def steps_per_iteration(self) -> int:
        return self.rollout_steps_per_rank

    @property
    def steps_per_row(self) -> int:
        """Env steps in one row of a batch: a recurrent policy's row is an env's whole rollout."""
        return self.num_steps if self.recurrent else 1

    def cuda_graphs_refusal(self) -> str | None:
        refusal = super().cuda_graphs_refusal()
        if refusal is not None:
            return refusal
        if self.target_kl is not None:
            return (
                "cannot capture --target-kl's decision, which the host makes between a minibatch's backward and its "
                "step: drop one of them"
            )
        return None

    @property
    def replays_in_steps(self) -> bool:
        """Whether a recurrent policy trains on its sequences step by step, in shapes that every batch keeps
        (which --compile and --cuda-graphs need), rather than by segments planned for each batch."""
        return self.recurrent and (self.compile or self.cuda_graphs)

    def cuda_graphs_measured_faster(self) -> bool:
        # A captured step-by-step replay against cuDNN's uncaptured LSTM over planned segments: not yet measured.
        return not self.recurrent

    def fill_defaults(self, given: set[str]) -> None:
        # A recurrent minibatch holds whole env sequences: by default one rollout's sequence of --num-steps.
        if self.recurrent and "per_rank_batch_size" not in given:
            self.per_rank_batch_size = self.num_steps
        super().fill_defaults(given)

    def validate_algorithm(self) -> None:
        check_signs(
            self,
            positive=(
                "num_steps",
                "per_rank_batch_size",
                "update_epochs",
                "learning_rate",
                "clip_coef",
                "hidden_size",
                "env_groups",
            ),
            non_negative=("ent_coef", "vf_coef", "max_grad_norm"),
        )
        defaults = type(self)()
        for name in ("lstm_hidden_size", "lstm_layers"):
            if getattr(self, name) != getattr(defaults, name) and not self.recurrent:
                raise UsageError(flag(name), "shapes the LSTM of --recurrent; add --recurrent (or drop the flag)")
        if self.target_kl is not None and not self.target_kl > 0:
            raise UsageError("--target-kl", f"must be positive, got {self.target_kl}")
        if self.num_envs % self.env_groups:
            raise UsageError(
                "--env-groups", f"--num-envs {self.num_envs} cannot be split into {self.env_groups} equal groups"
            )
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise UsageError("--gae-lambda", f"must be in [0, 1], got {self.gae_lambda}")
        if self.recurrent:
            self.validate_recurrent()

    def validate_recurrent(self) -> None:
        check_signs(self, positive=("lstm_hidden_size", "lstm_layers"))
        if self.per_rank_batch_size % self.num_steps:
            raise UsageError(
                "--per-rank-batch-size",
                f"with --recurrent a minibatch holds whole env sequences of --num-steps {self.num_steps} steps; "
                f"give a multiple of {self.num_steps} (--per-rank-batch-size {self.num_steps} trains on one "
                f"sequence at a time), not {self.per_rank_batch_size}",
            )

    def share_unit(self, name: str) -> tuple[int, str]:
        if name == "per_rank_batch_size" and self.recurrent:
            return self.num_steps, f"whole sequences of --num-steps {self.num_steps}"
        if name == "num_envs" and self.env_groups > 1:
            return self.env_groups, f"whole groups of --env-groups {self.env_groups}"
        return super().share_unit(name)

    def validate_learner_rows(self, num_trainers: int | None) -> None:
        rollout = f"--num-envs {self.num_envs} x --num-steps {self.num_steps}"
        if num_trainers is None:  # each rank trains on its own rollout
            rows = self.rollout_steps_per_rank
            rows_are = f"the per-rank rollout ({rollout} = {rows})"
        else:  # each trainer on its share of every player's rollout, cut in whole rows (a recurrent row: a sequence)
            per_player = (self.rollout_steps_per_rank // self.steps_per_row // num_trainers) * self.steps_per_row
            rows = self.num_players * per_player
            rows_are = (
                f"each trainer's share of the rollouts ({counted(self.num_players, 'player')} x {rollout}, "
                f"shared by {counted(num_trainers, 'trainer')}: {rows})"
            )
        if self.per_rank_batch_size > rows:
            raise UsageError("--per-rank-batch-size", f"{self.per_rank_batch_size} is larger than {rows_are}")

    def validate_decoupled(self, num_trainers: int) -> None:
        if self.recurrent and self.num_envs < num_trainers:
            raise UsageError(
                "--num-envs",
                f"with --recurrent each trainer takes whole env sequences: "
                f"{counted(self.num_envs, 'env')} cannot feed {num_trainers} trainers",
            )
        if self.rollout_steps_per_rank < num_trainers:
            raise UsageError(
                "--num-steps",
                f"a rollout of {counted(self.rollout_steps_per_rank, 'row')} cannot feed {num_trainers} trainers",
            )
