"""The evaluator role: one process that takes the newest weights whenever it is free, runs greedy
episodes, logs them and keeps the best agent as `best.ckpt`. Nobody waits for it.

The evaluator asks for weights by adding 1 to a counter in the job's rendezvous store, then
waits in a receive. The side that holds the weights (the decoupled player) reads the counter at
each report, a store round-trip that never blocks, and sends only when a request is open, into
a receive already posted, so the send returns at once. (A gloo `isend` cannot be polled
instead: its work reports completion only once waited on.) When the run ends, the evaluator drops
an evaluation of earlier weights, and evaluates the final ones once the job's process group is
closed: no process waits for an evaluation, however long its episodes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from enum import IntEnum

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rl.algos.base import Algorithm
from rl.checkpoint import BestAgent, saved_agent
from rl.elastic import job_store_client, reached
from rl.evaluation import EvaluationAbandoned, evaluate_greedy
from rl.faults import peer
from rl.logger import open_sinks
from rl.normalization import ObservationNormalizer
from rl.optim import flat_parameters, load_flat_parameters, num_parameters
from rl.signals import ctrl_c_only_noted, sigterm_held

REQUESTS_KEY = "rl/evaluator/requests"
RUN_ENDED_KEY = "rl/evaluator/run-ended"  # set by the weight holder: an evaluation of earlier weights stops
POLLS_PER_STORE_CHECK = 16  # evaluation steps between two looks at RUN_ENDED_KEY (a store round trip each)
POLL_SECONDS = 0.05
STORE_TIMEOUT_SECONDS = 30


class Command(IntEnum):
    EVALUATE = 1  # weights follow; evaluate them, then ask again
    FINAL = 2  # the last weights of the run; evaluate them and stop


class WeightsMessage:
    """[command, env step, seconds since training began, the policy's weights, observation mean, variance, count]."""

    HEAD = 3

    def __init__(self, policy: nn.Module, obs_dim: int) -> None:
        self.num_weights, self.obs_dim = num_parameters(policy), obs_dim
        self.buffer = torch.zeros(self.HEAD + self.num_weights + 2 * obs_dim + 1)

    def pack(self, command: Command, step: int, seconds: float, policy: nn.Module, normalizer: dict) -> Tensor:
        head = torch.tensor([float(command), float(step), seconds])
        stats = [
            torch.as_tensor(normalizer["mean"]).float(),
            torch.as_tensor(normalizer["var"]).float(),
            torch.tensor([float(normalizer["count"])]),
        ]
        torch.cat([head, flat_parameters(policy).cpu(), *stats], out=self.buffer)
        return self.buffer

    def unpack(self, policy: nn.Module) -> tuple[Command, int, float, dict]:
        """Load the weights into `policy`; the command, step, seconds and normalizer state."""
        buffer, weights_end = self.buffer, self.HEAD + self.num_weights
        load_flat_parameters(policy, buffer[self.HEAD : weights_end])
        mean, var = buffer[weights_end : weights_end + self.obs_dim], buffer[weights_end + self.obs_dim : -1]
        normalizer = {"mean": mean.double(), "var": var.double(), "count": float(buffer[-1])}
        return Command(int(buffer[0])), int(buffer[1]), float(buffer[2]), normalizer


class EvaluatorLink:
    """The weight holder's side: offer the newest weights, sent only if the evaluator has asked."""

    def __init__(self, policy: nn.Module, obs_dim: int, evaluator_rank: int) -> None:
        self.message = WeightsMessage(policy, obs_dim)
        self.evaluator_rank = evaluator_rank
        self.store = job_store_client(STORE_TIMEOUT_SECONDS)
        self.served = 0
        self.started = time.monotonic()

    def offer(self, step: int, policy: nn.Module, normalizer: ObservationNormalizer) -> None:
        if self.store.add(REQUESTS_KEY, 0) > self.served:
            self._send(Command.EVALUATE, step, policy, normalizer)

    def finish(self, step: int, policy: nn.Module, normalizer: ObservationNormalizer) -> None:
        """The final weights, once the evaluator is free (it drops an evaluation of earlier weights, which the
        other processes would wait for when they leave the process group); the evaluator then stops."""
        self.store.set(RUN_ENDED_KEY, "1")
        while self.store.add(REQUESTS_KEY, 0) <= self.served:
            time.sleep(POLL_SECONDS)
        self._send(Command.FINAL, step, policy, normalizer)

    def _send(self, command: Command, step: int, policy: nn.Module, normalizer: ObservationNormalizer) -> None:
        seconds = time.monotonic() - self.started
        message = self.message.pack(command, step, seconds, policy, normalizer.state_dict())
        with peer("the evaluator"):
            dist.send(message, dst=self.evaluator_rank)
        self.served += 1


class Evaluator:
    """Evaluates whatever `weights_rank` sends until its final weights; keeps the best agent."""

    def __init__(
        self, algorithm: Algorithm, weights_rank: int, run_dir: str, best: BestAgent, resumed_step: int | None = None
    ) -> None:
        ctrl_c_only_noted()  # Ctrl-C is the player's: it sends the final weights
        self.algorithm, self.cfg, self.weights_rank = algorithm, algorithm.cfg, weights_rank
        self.run_dir = run_dir  # the lead player's run
        self.policy = algorithm.build_policy(torch.device("cpu"))
        self.message = WeightsMessage(self.policy, algorithm.spaces.obs_dim)
        self.normalizer = algorithm.obs_normalizer(torch.device("cpu"))
        # beside the player's logs; a resumed run's keep what was logged up to its checkpoint, as the player's do
        self.sink = open_sinks(
            self.cfg.logger,
            self.run_dir,
            True,
            purge_step=resumed_step,
            csv_folder="csv-evaluator",
            role="evaluator",
            config=self.cfg.to_dict(),
        )
        self.best = best  # the run's best.ckpt, replaced by a better agent
        self.final_step: int | None = None
        self.final_seconds = 0.0
        self.store = job_store_client(STORE_TIMEOUT_SECONDS)
        self.polls = 0

    def serve(self) -> None:
        """Ask for weights and evaluate them, until the final weights arrive (evaluated by
        `evaluate_final_weights`, once no process of the job waits for this one)."""
        while True:
            self.store.add(REQUESTS_KEY, 1)
            with peer("the player"):
                dist.recv(self.message.buffer, src=self.weights_rank)
            command, step, seconds, normalizer_state = self.message.unpack(self.policy)
            self.normalizer.load_state_dict(normalizer_state)
            reached(step, is_main=False)  # the step a fault of ours is journaled at
            if command is Command.FINAL:
                self.final_step, self.final_seconds = step, seconds
                return
            with contextlib.suppress(EvaluationAbandoned):  # the run has ended: its final weights come next
                self.evaluate(step, seconds, abandon=self.run_ended)

    def evaluate_final_weights(self) -> None:
        if self.final_step is not None and not sigterm_held():  # a process told to end starts no evaluation
            self.evaluate(self.final_step, self.final_seconds)
        self.sink.close()

    def run_ended(self) -> bool:
        self.polls += 1
        return self.polls % POLLS_PER_STORE_CHECK == 0 and self.store.check([RUN_ENDED_KEY])

    def evaluate(self, step: int, seconds: float, abandon: Callable[[], bool] | None = None) -> None:
        """Greedy episodes of the weights in hand, logged; `best.ckpt` replaced when they beat it."""
        spaces = self.algorithm.spaces
        returns, _ = evaluate_greedy(
            self.policy,
            spaces.env_id,
            self.cfg.eval_episodes,
            self.cfg.seed,
            self.normalizer,
            torch.device("cpu"),
            preprocessing=spaces.preprocessing,
            abandon=abandon,
        )
        mean = float(np.mean(returns))
        self.best.offer(mean, step, lambda: saved_agent(self.algorithm, self.policy, self.normalizer.state_dict()))
        self.sink.log_scalars(
            {
                "Eval/return_mean": mean,
                "Eval/return_std": float(np.std(returns)),
                "Eval/best_return": self.best.score,
                "Eval/seconds": seconds,
            },
            step,
        )
