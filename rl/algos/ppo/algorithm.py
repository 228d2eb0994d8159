"""PPO behind the algorithm interface: an actor-critic, rollouts with GAE, clipped-surrogate epochs."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl.algos.base import Algorithm, Learner
from rl.algos.ppo.config import PPOConfig
from rl.algos.ppo.env_groups import EnvGroups, group_slices
from rl.algos.ppo.policy import ActorCritic, CNNActorCritic, MLPActorCritic, action_shape_and_dtype
from rl.algos.ppo.recurrent import RecurrentActorCritic
from rl.algos.ppo.rollout import Batch, Rollout, RolloutCollector, SequenceBatch
from rl.algos.ppo.update import MinibatchSchedule, PPOHyperparameters, minibatch_loss, ppo_update
from rl.batch import Column, DataShard, RowCodec
from rl.compiling import compiled
from rl.cuda_graphs import CapturedSteps, learner_captured, make_capturable
from rl.encoders import image_encoder
from rl.envs import EnvSpaces
from rl.errors import UsageError
from rl.memory import check_storage_fits, storage_bytes
from rl.normalization import ObservationNormalizer, RewardScaler, RunningMoments
from rl.optim import FlatGradients, clip_and_step
from rl.runtime import Runtime
from rl.seeds import ACTION_STREAM, env_seeds, seeded_generator
from rl.uploads import to_device

ADAM_EPS = 1e-4


def hyperparameters(cfg: PPOConfig, skip_reset_steps: bool = False) -> PPOHyperparameters:
    return PPOHyperparameters(
        clip_coef=cfg.clip_coef,
        clip_vloss=cfg.clip_vloss,
        ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        update_epochs=cfg.update_epochs,
        minibatch_size=cfg.per_rank_batch_size,
        normalize_advantages=cfg.normalize_advantages,
        skip_reset_steps=skip_reset_steps,
        target_kl=cfg.target_kl,
    )


def annealed_lr(cfg: PPOConfig, update: int, num_updates: int) -> float:
    """Linear decay from the initial rate at update 1 towards zero after the last."""
    if not cfg.anneal_lr:
        return cfg.learning_rate
    return cfg.learning_rate * (1.0 - (update - 1) / num_updates)


class PPOLearner(Learner):
    def __init__(
        self,
        cfg: PPOConfig,
        agent: ActorCritic,
        runtime: Runtime,
        shard: DataShard,
        num_updates: int,
        skip_reset_steps: bool,
    ) -> None:
        super().__init__(agent)
        self.cfg, self.num_updates = cfg, num_updates
        # The fused kernel is several times faster than the per-tensor loop on CPU for these small nets.
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=ADAM_EPS, fused=True)
        if runtime.scaler is None:
            self.divergence.guard([self.optimizer])
        # With --target-kl each minibatch's KL rides at the end of the gradient buffer, averaged in its collective.
        self.kl_carrier = None if cfg.target_kl is None else torch.zeros(1, device=next(agent.parameters()).device)
        carried = [] if self.kl_carrier is None else [[self.kl_carrier]]
        self.gradients = FlatGradients(list(agent.parameters()), *carried)
        self.averaged_groups = len(carried)  # the last group that each collective averages
        self.trained = [parameter for parameter in agent.parameters() if parameter.requires_grad]
        self.runtime = runtime
        self.hp = hyperparameters(cfg, skip_reset_steps)
        self.loss_of = compiled(minibatch_loss, cfg.compile_mode) if cfg.compile else minibatch_loss
        # A recurrent policy's rows are whole sequences: a minibatch takes that many fewer rows.
        minibatch_rows = cfg.per_rank_batch_size // cfg.steps_per_row
        # Learners whose shards differ by a row take the same number of minibatches: their averages stay in step.
        minibatches = math.ceil(shard.largest_rows / minibatch_rows) if shard.largest_rows else None
        self.schedule = MinibatchSchedule(shard.rows, minibatch_rows, shard.shards, shard.index, cfg.seed, minibatches)
        self.captured: CapturedSteps | None = None
        if learner_captured(cfg, runtime.world_size):
            self.captured = CapturedSteps(self.minibatch_step_on_device, runtime=runtime)
            self.prepare_capture()

    def prepare_capture(self) -> None:
        """A captured optimizer step reads its learning rate from the device, where the annealing writes it."""
        make_capturable([self.optimizer])
        for group in self.optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=self.trained[0].device)

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def update(self, batch: Batch, iteration: int) -> dict[str, Tensor | float]:
        lr = annealed_lr(self.cfg, iteration, self.num_updates)
        self.set_learning_rate(lr)
        if self.cfg.replays_in_steps:  # the replay reads the sequences' starts on the device: one upload per update
            device = self.trained[0].device
            batch = batch.map(lambda column: to_device(column, device))
        stats = ppo_update(
            self.policy,
            batch,
            self.schedule,
            self.hp,
            self.backward_and_average,
            self.step,
            self.loss_of,
            None if self.captured is None else self.captured_minibatch_step,
        )
        return stats | {"learning_rate": lr}

    def captured_minibatch_step(self, minibatch: Batch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """A minibatch's whole step as a CUDA graph, one per minibatch size (a shard's last may be smaller)."""
        assert self.captured is not None
        outputs = self.captured((type(minibatch), len(minibatch)), *minibatch.tensors())
        return outputs["policy_loss"], outputs["value_loss"], outputs["entropy_loss"], outputs["new_logprobs"]

    def minibatch_step_on_device(self, kind: tuple[type[Batch], int], *tensors: Tensor) -> dict[str, Tensor]:
        """Loss, backward, clip and optimizer step of one minibatch, given as its kind (its batch type and rows)
        and its tensors; nothing here waits for the GPU."""
        batch_type, _ = kind
        loss, pg_loss, v_loss, ent_loss, new_logprobs = self.loss_of(self.policy, batch_type(*tensors), self.hp)
        self.backward_and_average(loss)
        self.step()
        return {
            "policy_loss": pg_loss.detach(),
            "value_loss": v_loss.detach(),
            "entropy_loss": ent_loss.detach(),
            "new_logprobs": new_logprobs.detach(),
        }

    def backward_and_average(self, loss: Tensor, kl: Tensor | None = None) -> Tensor | None:
        """The averaged gradient of `loss`; and, given the minibatch's KL, the KL averaged over the learners."""
        spans = self.gradients.spans(0, self.averaged_groups)
        if kl is None or self.kl_carrier is None:
            self.runtime.backward_and_average(loss, spans)
            return None
        carried = self.kl_carrier.grad
        assert carried is not None  # a view into the gradient buffer, which FlatGradients set
        self.runtime.backward_and_average(loss, spans, before_average=lambda: carried.copy_(kl.reshape(1)))
        return carried[0]

    def step(self) -> None:
        clip_and_step([self.optimizer], self.trained, self.hp.max_grad_norm, self.runtime.scaler, self.divergence)

    def weight_tensors(self) -> list[Tensor]:
        return list(self.policy.parameters())

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "epoch": self.schedule.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.epoch = state["epoch"]
        if self.captured is not None:  # a loaded optimizer takes the saved param groups' settings
            self.prepare_capture()


class PPO(Algorithm):
    config_type = PPOConfig
    name = PPOConfig.ALGORITHM
    stat_tags: ClassVar[dict[str, str]] = {
        "policy_loss": "Loss/policy_loss",
        "value_loss": "Loss/value_loss",
        "entropy": "Loss/entropy",
        "approx_kl": "Loss/approx_kl",
        "clip_fraction": "Loss/clip_fraction",
        "explained_variance": "Loss/explained_variance",
        "learning_rate": "Info/learning_rate",
        "kl_stop_epoch": "Info/kl_stop_epoch",
        "kl_stop_minibatch": "Info/kl_stop_minibatch",
    }
    cfg: PPOConfig
    handles_late_resets = True

    @property
    def passes_per_batch(self) -> int:  # type: ignore[override]
        return self.cfg.update_epochs

    def __init__(self, cfg: PPOConfig, spaces: EnvSpaces) -> None:
        super().__init__(cfg, spaces)
        if cfg.use_sde and not isinstance(spaces.action_space, gym.spaces.Box):
            raise UsageError(
                "--use-sde",
                f"state-dependent exploration perturbs continuous actions; "
                f"{spaces.env_id}'s are {spaces.action_space}: drop the flag",
            )
        if cfg.normalize_observations and spaces.pixels:
            raise UsageError(
                "--normalize-observations", "image observations are scaled to [0, 1] by the encoder; drop the flag"
            )
        if cfg.normalize_observations and spaces.multi_input:
            raise UsageError(
                "--normalize-observations",
                "it normalizes vector observations, not a Dict observation with images; drop the flag",
            )

    def check_memory(self, env_ranks: int, processes_here: int, gpu: int | None) -> None:
        steps = self.cfg.rollout_steps_per_rank  # the learner's batches and statistics come on top: a lower bound
        rollout = storage_bytes(steps, Rollout.step_columns(self.spaces, self.cfg.normalize_observations))
        storage, fix = ("rollout", f"of {steps:,} env steps"), "lower --num-steps or --num-envs"
        check_storage_fits(rollout, processes_here, gpu, "--num-steps", storage, fix)

    def build_policy(self, device: torch.device) -> nn.Module:
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every rank and in every mode
        cfg, spaces = self.cfg, self.spaces
        precision = self.precision(device)
        agent: ActorCritic | RecurrentActorCritic
        if cfg.recurrent:
            agent = RecurrentActorCritic(
                spaces.obs_dim,
                spaces.action_space,
                image_encoder(spaces.observation_space) if self.cnn else None,
                spaces.pixels,
                cfg.lstm_hidden_size,
                cfg.lstm_layers,
                cfg.activation_function,
                cfg.ortho_init,
                precision,
                cfg.hidden_size,
                cfg.log_std_init,
                cfg.use_sde,
                cfg.replays_in_steps,
            )
        elif self.cnn:
            agent = CNNActorCritic(
                image_encoder(spaces.observation_space),
                spaces.action_space,
                cfg.ortho_init,
                precision,
                cfg.log_std_init,
                cfg.use_sde,
            )
        else:
            agent = MLPActorCritic(
                spaces.obs_dim,
                spaces.action_space,
                cfg.activation_function,
                cfg.ortho_init,
                spaces.pixels,
                precision,
                cfg.hidden_size,
                cfg.log_std_init,
                cfg.use_sde,
            )
        if cfg.compile:
            agent.compile_acting(cfg.compile_mode)
        return agent.to(device)

    def obs_normalizer(self, device: torch.device) -> ObservationNormalizer:
        return ObservationNormalizer(self.spaces.obs_dim, self.cfg.normalize_observations, device)

    def make_source(
        self, rank: int, device: torch.device, video_dir: str | None, env_ranks: int, batch_rows: int
    ) -> RolloutCollector | EnvGroups:
        cfg = self.cfg
        if cfg.env_groups == 1:
            return self.make_collector(rank, device, video_dir, env_seeds(cfg.seed, rank, cfg.num_envs))
        memory_shape = (cfg.lstm_layers, cfg.lstm_hidden_size) if cfg.recurrent else None
        normalizer = self.obs_normalizer(device)
        rollout = Rollout.allocate(cfg.num_steps, cfg.num_envs, self.spaces, device, normalizer.enabled, memory_shape)
        seeds = env_seeds(cfg.seed, rank, cfg.num_envs)
        groups: list[RolloutCollector] = []
        for group, envs in enumerate(group_slices(cfg.num_envs, cfg.env_groups)):
            shared = {"obs_normalizer": normalizer, "moments": groups[0].reward_scaler.moments} if groups else {}
            video = video_dir if group == 0 else None  # the rank's first env, as ever
            columns = rollout.envs_view(envs)
            groups.append(self.make_collector(rank, device, video, seeds[envs], group, columns, **shared))
        return EnvGroups(groups, rollout)

    def make_collector(
        self,
        rank: int,
        device: torch.device,
        video_dir: str | None,
        seeds: list[int],
        group: int = 0,
        buffer: Rollout | None = None,
        obs_normalizer: ObservationNormalizer | None = None,
        moments: RunningMoments | None = None,
    ) -> RolloutCollector:
        """The collector of a rank's envs, or of its `group` of them (`--env-groups`): a share of `seeds`, writing
        into `buffer` (its columns of the rank's rollout), with the rank's normalizer and reward statistics."""
        cfg, spaces = self.cfg, self.spaces
        stream = (ACTION_STREAM, rank, group) if group else (ACTION_STREAM, rank)  # a rank of one group: as ever
        return RolloutCollector(
            self.make_envs(video_dir, seeds[0], len(seeds)),
            cfg.num_steps,
            spaces,
            device,
            obs_normalizer or self.obs_normalizer(device),
            RewardScaler(len(seeds), cfg.gamma, cfg.normalize_rewards, device, moments),
            seeds,
            seeded_generator(device, cfg.seed, *stream),
            cfg.gamma,
            cfg.gae_lambda,
            self.training_signal(),
            (cfg.lstm_layers, cfg.lstm_hidden_size) if cfg.recurrent else None,
            self.exploration(),
            capture=cfg.cuda_graphs,
            buffer=buffer,
        )

    def make_learner(self, policy: nn.Module, runtime: Runtime, shard: DataShard, env_ranks: int) -> PPOLearner:
        assert isinstance(policy, ActorCritic | RecurrentActorCritic)
        skip_reset_steps = self.vector_mode in ("native", "envpool")
        return PPOLearner(self.cfg, policy, runtime, shard, self.cfg.num_iterations(env_ranks), skip_reset_steps)

    def batch_rows(self, learners_fed: int) -> int:
        return self.cfg.rollout_steps_per_rank // self.cfg.steps_per_row  # one rollout, whoever trains on it

    def batch_codec(self) -> RowCodec:
        """A row per transition, or per env sequence (recurrent: each column holds the rollout's steps)."""
        steps = (self.cfg.num_steps,) if self.cfg.recurrent else ()
        action_shape, action_dtype = action_shape_and_dtype(self.spaces.action_space)
        obs = self.obs_column()
        columns = {
            "obs": Column((*steps, *obs.shape), obs.dtype),
            "actions": Column((*steps, *action_shape), action_dtype),
        }
        columns |= {name: Column(steps) for name in ("logprobs", "values", "advantages", "returns")}
        columns |= {"is_transition": Column(steps, torch.bool)}
        if not self.cfg.recurrent:
            return RowCodec(Batch, columns)
        memory = Column((2, self.cfg.lstm_layers, self.cfg.lstm_hidden_size))
        starts = Column(steps, torch.bool, on_host=True)
        return RowCodec(SequenceBatch, columns | {"starts": starts, "memory": memory})
