"""SAC's learner: twin critics and their targets, the actor, the tuned temperature, and one gradient step
of all three over every rank."""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import torch
from torch import Tensor

from rl.algos.base import Learner
from rl.algos.sac.collector import Transitions
from rl.algos.sac.config import AUTO, SACConfig
from rl.algos.sac.losses import actor_loss, critic_loss, soft_target, temperature_loss
from rl.algos.sac.networks import CriticEnsemble, SquashedGaussianActor
from rl.batch import DataShard, joined, shard_slice
from rl.compiling import compiled
from rl.cuda_graphs import CapturedSteps, Step, learner_captured, make_capturable
from rl.optim import FlatGradients, optimizer_steps
from rl.runtime import Runtime
from rl.seeds import (
    CRITIC_STREAM,
    LEARNER_STREAM,
    derive_seed,
)


class StatMeans:
    """Per-step statistics kept as tensors and averaged once per update: no host sync per step."""

    def __init__(self) -> None:
        self.values: dict[str, list[Tensor]] = {}

    def add(self, **stats: Tensor) -> None:
        """Values of named statistics: one each, or several in a 1-D tensor."""
        for name, value in stats.items():
            value = value if value.dim() == 1 and not value.requires_grad else value.detach().reshape(-1)
            self.values.setdefault(name, []).append(value)

    def means(self) -> dict[str, Tensor]:
        return {name: mean(joined(values)) for name, values in self.values.items()}

    def gathered(self) -> dict[str, Tensor]:
        """Each statistic's values so far in one tensor (another `StatMeans` adds them as they are)."""
        return {name: joined(values) for name, values in self.values.items()}


def mean(values: Tensor) -> Tensor:
    """The mean of a 1-D tensor; a single value as it is (a view: no kernel, and the same bits)."""
    return values.reshape(()) if values.numel() == 1 else values.mean()


class SACLearner(Learner):
    """Twin critics with Polyak targets, a squashed-Gaussian actor and (optionally) a tuned temperature.

    A gradient step takes the critics', the actor's and the temperature's losses from the same
    parameters, as the original SAC implementation does (Stable-Baselines3 and CleanRL update
    the critics first and show the actor the updated ones: `--actor-after-critics`). The three
    gradients are separate by construction: the critics' target carries no gradient, the actor
    sees the critics through detached weights, the temperature a detached log-prob. So one
    backward pass writes them all into one flat buffer, and one collective per gradient step
    averages them across learners, where DDP would need one per module and a wait for the
    critics' update.
    """

    CRITIC, ACTOR = 0, 1  # the gradient buffer's groups: the critics, then the actor and the temperature

    def __init__(self, cfg: SACConfig, actor: SquashedGaussianActor, runtime: Runtime, shard: DataShard):
        super().__init__(actor)
        self.cfg, self.shard, self.runtime = cfg, shard, runtime
        device = runtime.device
        lr_scale = runtime.world_size if cfg.scale_lr else 1
        torch.manual_seed(derive_seed(cfg.seed, CRITIC_STREAM))  # the same critics on every learner
        self.critic = CriticEnsemble(actor.feature_dim, actor.action_dim, cfg.net_arch, precision=actor.precision).to(
            device
        )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        # An image encoder belongs to the critics' side: their loss trains it, their target has a copy.
        self.encoder_parameters = [] if actor.encoder is None else list(actor.encoder.parameters())
        self.target_encoder = copy.deepcopy(actor.encoder).requires_grad_(False) if self.encoder_parameters else None
        critic_side = [*self.critic.parameters(), *self.encoder_parameters]
        self.target_entropy = -float(actor.action_dim) if cfg.target_entropy == AUTO else float(cfg.target_entropy)
        initial = cfg.initial_temperature
        self.log_alpha = torch.full((1,), math.log(initial), device=device, requires_grad=cfg.autotune)
        self.fixed_alpha = torch.tensor([1.0 if cfg.autotune else initial], device=device)
        temperature = [self.log_alpha] if cfg.autotune else []
        self.gradients = FlatGradients(critic_side, [*actor.head_parameters(), *temperature])
        self.critic_optimizer = adam(critic_side, cfg.q_lr * lr_scale)
        self.actor_optimizer = adam(actor.head_parameters(), cfg.policy_lr * lr_scale)
        self.alpha_optimizer = adam(temperature, cfg.q_lr * lr_scale) if cfg.autotune else None
        self.noise = torch.Generator(device=device)
        self.gradient_steps = 0
        self.losses = compiled(self._losses, cfg.compile_mode) if cfg.compile else self._losses
        if runtime.scaler is None:
            self.divergence.guard(self.optimizers())
        self.step: Step = self.step_on_device
        self.captured = learner_captured(cfg, runtime.world_size)
        if self.captured:
            make_capturable(self.optimizers())
            self.step = CapturedSteps(self.step_on_device, runtime=runtime)

    def update(self, batch: Transitions, iteration: int) -> dict[str, Tensor | float]:
        start = time.perf_counter()
        # Reseeded per update from (seed, learner, iteration): exact on resume with nothing to save.
        self.noise.manual_seed(derive_seed(self.cfg.seed, LEARNER_STREAM, self.runtime.rank, iteration))
        stats = StatMeans()
        steps = self.cfg.gradient_steps
        if steps == 1 and self.shard.shards == 1:  # the whole batch is the step's: no views to make
            self.gradient_step(batch, stats)
        else:
            own = shard_slice(len(batch) // steps, self.shard.shards, self.shard.index)
            for step in range(steps):
                # Strided: the rows are independent draws, and a batch may join several sources' draws
                # one after another (decoupled players); every gradient step takes its share of each.
                self.gradient_step(batch.map(lambda t, s=step: t[s::steps][own]), stats)
        # The host's time: on a GPU, the time to launch the step (it runs on while the host goes on).
        elapsed_ms = 1000.0 * (time.perf_counter() - start) / self.cfg.gradient_steps
        return stats.means() | {"gradient_step_ms": elapsed_ms}  # on the host, which logs it there

    def gradient_step(self, batch: Transitions, stats: StatMeans) -> None:
        cfg = self.cfg
        self.gradient_steps += 1
        # A delayed actor trains every policy_frequency steps, then catches up (TD3's rule, as CleanRL).
        actor_steps = cfg.policy_frequency if self.gradient_steps % cfg.policy_frequency == 0 else 0
        kind = (actor_steps, self.gradient_steps % cfg.target_network_frequency == 0)
        stats.add(**self.step(kind, *batch.tensors(), *self.draw_noise(len(batch), actor_steps)))

    def draw_noise(self, rows: int, actor_steps: int) -> list[Tensor]:
        """The step's noise, drawn here rather than inside the (possibly captured) step: the target's, then
        one per actor step (gSDE: one noise matrix per gradient step, shared by both samples, as SB3)."""
        draws = 1 + actor_steps - (1 if actor_steps and self.policy.state_dependent else 0)
        return [self.policy.noise(rows, self.noise) for _ in range(draws)]

    def step_on_device(self, kind: tuple[int, bool], *tensors: Tensor) -> dict[str, Tensor]:
        """One gradient step: the critics (and every `actor_steps` the actor and temperature, in as many
        steps; with --actor-after-critics each after the critics' update), then the targets; its statistics.
        Nothing here waits for the GPU (`--cuda-graphs` captures it)."""
        actor_steps, updates_targets = kind
        fields = len(Transitions.__dataclass_fields__)
        batch = Transitions(*tensors[:fields])
        next_noise, *actor_noise = tensors[fields:]
        if actor_steps and self.policy.state_dependent:  # gSDE: the first actor step shares the target's matrix
            actor_noise.insert(0, next_noise)
        joint = bool(actor_steps) and not self.cfg.actor_after_critics  # the first actor step in the critics' pass
        stats = StatMeans()
        loss, features, step_stats = self.losses(batch, next_noise, actor_noise.pop(0) if joint else None)
        stats.add(**step_stats)
        self.backward_and_step(loss, self.CRITIC, self.ACTOR if joint else self.CRITIC)
        if joint:
            stats.add(alpha=self.alpha)
        for catch_up_noise in actor_noise:  # after the critics' update: the actor's loss sees the updated critics
            loss = self.actor_and_temperature_loss(features.detach(), catch_up_noise, stats)
            self.backward_and_step(loss, self.ACTOR, self.ACTOR)
            stats.add(alpha=self.alpha)
        if updates_targets:
            with torch.no_grad():  # else autograd records every update: the targets' history grows without end
                torch._foreach_lerp_(self.target_tensors(), self.online_tensors(), self.cfg.tau)
        return stats.gathered()

    def _losses(
        self, batch: Transitions, next_noise: Tensor, actor_noise: Tensor | None
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One gradient step's loss (the critics', plus the actor's and the temperature's given `actor_noise`),
        the encoder's features of the observations, and the step's statistics (compiled with --compile)."""
        stats = StatMeans()
        features = self.policy.encode(batch.obs)  # through the encoder, which the critics' loss trains
        loss = self.critic_loss(batch, features, next_noise, stats)
        if actor_noise is not None:
            loss = loss + self.actor_and_temperature_loss(features.detach(), actor_noise, stats)
        return loss, features, {name: values[0] for name, values in stats.values.items()}

    def critic_loss(self, batch: Transitions, features: Tensor, next_noise: Tensor, stats: StatMeans) -> Tensor:
        with torch.no_grad():
            next_actions, next_logprob = self.policy(batch.next_obs, next_noise)
            next_features = batch.next_obs if self.target_encoder is None else self.target_encoder(batch.next_obs)
            next_q = self.critic_target(next_features, next_actions)
            target = soft_target(batch.rewards, batch.terminated, next_q, next_logprob, self.alpha, self.cfg.gamma)
        q_values = self.critic(features, batch.actions)
        loss = critic_loss(q_values, target)
        stats.add(critic_loss=loss, q_values=q_values.mean())
        return loss

    def actor_and_temperature_loss(self, features: Tensor, noise: Tensor, stats: StatMeans) -> Tensor:
        """From detached features: the actor's loss trains the actor's head alone, never the encoder."""
        actions, logprob = self.policy.from_features(features, noise)
        loss = actor_loss(logprob, self.critic.q_values_of_actions(features, actions), self.alpha)
        stats.add(actor_loss=loss, entropy=-logprob.mean())
        if not self.cfg.autotune:
            return loss
        alpha_loss = temperature_loss(self.log_alpha, logprob, self.target_entropy)
        stats.add(alpha_loss=alpha_loss)
        return loss + alpha_loss

    @property
    def alpha(self) -> Tensor:
        """The temperature, read from `log_alpha` when tuned: other processes may have changed it (Hogwild)."""
        return self.log_alpha.detach().exp() if self.cfg.autotune else self.fixed_alpha

    def backward_and_step(self, loss: Tensor, first_group: int, last_group: int) -> None:
        """Write the gradients of `loss` into groups first..last (the others keep theirs), average them over
        the learners in one collective, and step those groups' optimizers (none if a gradient is not finite)."""
        spans = self.gradients.spans(first_group, last_group)
        self.runtime.backward_and_average(loss, spans)
        if self.runtime.scaler is None:  # fp16's loss scaler skips an overflowed step itself
            self.divergence.check(spans)
        optimizers = [self.critic_optimizer] if first_group == self.CRITIC else []
        optimizer_steps(optimizers + (self.actor_optimizers() if last_group == self.ACTOR else []), self.runtime.scaler)

    def actor_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.actor_optimizer, *([self.alpha_optimizer] if self.alpha_optimizer is not None else [])]

    def online_tensors(self) -> list[Tensor]:
        """What the target networks follow: the critics, and the encoder where there is one."""
        return [*self.critic.parameters(), *self.encoder_parameters]

    def target_tensors(self) -> list[Tensor]:
        target_encoder = [] if self.target_encoder is None else list(self.target_encoder.parameters())
        return [*self.critic_target.parameters(), *target_encoder]

    def weight_tensors(self) -> list[Tensor]:
        targets = [*self.critic.parameters(), *self.target_tensors()]
        return [*self.policy.parameters(), *targets, *([self.log_alpha] if self.cfg.autotune else [])]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.critic_optimizer, *self.actor_optimizers()]

    def state_dict(self) -> dict[str, Any]:
        state = {
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "target_encoder": None if self.target_encoder is None else self.target_encoder.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha": self.alpha.cpu(),
            "gradient_steps": self.gradient_steps,
        }
        if self.cfg.autotune:
            assert self.alpha_optimizer is not None
            state |= {"log_alpha": self.log_alpha.detach().cpu(), "alpha_optimizer": self.alpha_optimizer.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        if self.target_encoder is not None:
            self.target_encoder.load_state_dict(state["target_encoder"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.gradient_steps = state["gradient_steps"]
        if self.alpha_optimizer is not None:
            with torch.no_grad():
                self.log_alpha.copy_(state["log_alpha"])
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        if self.captured:  # a loaded optimizer takes the saved param groups' settings
            make_capturable(self.optimizers())


def adam(parameters: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=lr, fused=True)
