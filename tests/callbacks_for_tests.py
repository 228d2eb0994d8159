"""A user's callback for the tests: it records the training loop's events and asks to stop at a report."""

import json
from pathlib import Path

import rl


class StopAtReport(rl.Callback):
    """Record every event of this process to events-RANK.json in the working folder at the end, log its rank and
    its count of reports with the run's loggers at each report, and ask the run to stop at the `report`-th report
    of the process of rank `rank` (None: never)."""

    def __init__(self, rank: int | None, report: int) -> None:
        self.rank, self.report, self.reports, self.events = rank, report, 0, []

    def record(self, name: str, state: rl.LoopState) -> None:
        self.events.append({"event": name, "iteration": state.iteration, "step": state.global_step})

    def on_report(self, state: rl.LoopState, scalars: dict[str, float]) -> None:
        self.reports += 1
        self.record("report", state)
        state.log({"Custom/rank": float(state.rank), "Custom/reports": float(self.reports)})
        if state.rank == self.rank and self.reports == self.report:
            state.request_stop()

    def on_checkpoint(self, state: rl.LoopState) -> None:
        self.record("checkpoint", state)

    def on_finish(self, state: rl.LoopState) -> None:
        self.record("finish", state)
        finished = {"events": self.events, "interrupted": state.interrupted, "iterations": self.iterations}
        Path(f"events-{state.rank}.json").write_text(json.dumps(finished))

    iterations = 0

    def on_iteration_end(self, state: rl.LoopState) -> None:
        self.iterations += 1
