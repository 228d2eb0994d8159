"""An entry script whose greedy evaluations (closing, periodic, and the evaluator role's) first take SECONDS, as
a long Atari game would (asking `abandon` as they go, as an evaluation asks it at each step):

    fabric run ... tests/slow_closing_evaluation.py SECONDS SCRIPT [SCRIPT's flags]
"""

import runpy
import sys
import time

import rl.evaluation
import rl.modes.evaluator

seconds, script = float(sys.argv[1]), sys.argv[2]


def slowed(evaluate):
    def slow(*args, abandon=None, **kwargs):
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if abandon is not None and abandon():
                raise rl.evaluation.EvaluationAbandoned
            time.sleep(0.01)
        return evaluate(*args, **kwargs) if abandon is None else evaluate(*args, abandon=abandon, **kwargs)

    return slow


# The run's closing and periodic evaluations (through greedy_returns), and the evaluator role's
rl.evaluation.greedy_returns = slowed(rl.evaluation.greedy_returns)
rl.modes.evaluator.evaluate_greedy = slowed(rl.modes.evaluator.evaluate_greedy)
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
