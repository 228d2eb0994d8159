"""A rank's envs in groups that step in turn (`--env-groups`): while one group's envs step, the policy acts on
another's.

Each group is a `RolloutCollector` over its share of the envs, with its own random stream, that writes into its
columns of the rank's one rollout and runs its collection in a thread of its own. Envs that step outside Python's
lock (ale-py's and envpool's threads, async envs' processes) then step while another thread waits for the GPU's
actions. The groups share the observation normalizer, frozen while they collect, and the reward scaler's
statistics, updated from the whole rollout afterwards, as one collector's are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch
from torch import Tensor

from rl.algos.ppo.policy import ActorCritic
from rl.algos.ppo.recurrent import RecurrentActorCritic
from rl.algos.ppo.rollout import Rollout, RolloutCollector
from rl.batch import TensorBatch
from rl.cuda_graphs import CAPTURED_BY_CALL
from rl.experience import EpisodeLog, ExperienceSource
from rl.normalization import AllReduceSum

ABANDON_WAIT_SECONDS = 10.0


def group_slices(num_envs: int, groups: int) -> list[slice]:
    """Each group's envs among a rank's `num_envs`, in order."""
    size = num_envs // groups
    return [slice(index * size, (index + 1) * size) for index in range(groups)]


class EnvGroups(ExperienceSource):
    """The experience source of a rank whose envs are split into `groups`, which fill `rollout` together."""

    def __init__(self, groups: Sequence[RolloutCollector], rollout: Rollout) -> None:
        self.groups, self.rollout = list(groups), rollout
        lead = self.groups[0]
        self.obs_normalizer, self.reward_scaler = lead.obs_normalizer, lead.reward_scaler  # shared, as a rank's
        self.threads = ThreadPoolExecutor(len(self.groups), thread_name_prefix="env-group")
        self.running: list[Future[EpisodeLog]] = []  # the groups' collections in their threads
        self.collections = 0

    @property
    def num_envs(self) -> int:
        return sum(group.num_envs for group in self.groups)

    @property
    def env_seconds(self) -> float:
        """The longest any group's envs took to step: the groups' steps overlap."""
        return max(group.env_seconds for group in self.groups)

    def shares(self, seeds: list[int]) -> list[list[int]]:
        """`seeds`, one per env of the rank, as each group's envs take them."""
        return [seeds[envs] for envs in group_slices(len(seeds), len(self.groups))]

    def collect(self, policy: ActorCritic | RecurrentActorCritic, global_step: int) -> EpisodeLog:
        """Every group's collection, in threads that run at once; the first ones, until each group's acting has
        been captured as a CUDA graph (on a GPU), one after another: a capture admits no other thread's GPU work."""
        if self.collections * self.groups[0].num_steps < CAPTURED_BY_CALL:
            logs = [group.collect(policy, global_step) for group in self.groups]
        else:
            self.running = [self.threads.submit(collected, group, policy, global_step) for group in self.groups]
            wait(self.running)  # all of them, even where one failed: the envs are closed only once none steps
            logs = [done.result() for done in self.running]
        self.collections += 1
        self.rollout.next_obs = self.joined(lambda group: group.buffer.next_obs)
        self.rollout.next_value = self.joined(lambda group: group.buffer.next_value)
        episodes = EpisodeLog()
        for log in logs:
            episodes.returns.extend(log.returns)
            episodes.lengths.extend(log.lengths)
        return episodes

    def joined(self, part: Callable[[RolloutCollector], Tensor]) -> Tensor:
        return torch.cat([part(group) for group in self.groups])

    def next_batch(self, global_step: int, all_reduce_sum: AllReduceSum) -> TensorBatch:
        return self.groups[0].batch_of(self.rollout, all_reduce_sum)

    def batch_stats(self, batch: TensorBatch) -> dict[str, Tensor]:
        return self.groups[0].batch_stats(batch)

    def reset_envs(self, seeds: list[int]) -> None:
        for group, share in zip(self.groups, self.shares(seeds), strict=True):
            group.reset_envs(share)

    def capture_state(self) -> dict[str, Any]:
        return {"groups": [group.capture_state() for group in self.groups]}

    def restore_state(self, state: dict[str, Any], fresh_seeds: list[int]) -> bool:
        shares = self.shares(fresh_seeds)
        groups = zip(self.groups, state["groups"], shares, strict=True)
        return all([group.restore_state(saved, seeds) for group, saved, seeds in groups])  # every group, then all

    def close(self) -> None:
        self.threads.shutdown()
        for group in self.groups:
            group.close()

    def abandon(self) -> None:
        """A failed or stopped run's envs, closed once the groups' threads are out of them (a second Ctrl-C can
        come while they collect), or after ABANDON_WAIT_SECONDS, should a call never return."""
        wait(self.running, timeout=ABANDON_WAIT_SECONDS)
        self.threads.shutdown(wait=False, cancel_futures=True)
        for group in self.groups:
            group.abandon()


def collected(group: RolloutCollector, policy: ActorCritic | RecurrentActorCritic, global_step: int) -> EpisodeLog:
    """`group`'s collection, in a thread of the pool."""
    if group.device.type == "cuda":
        torch.cuda.set_device(group.device)  # a thread's current GPU, whose stream its launches join, is the first
    return group.collect(policy, global_step)
