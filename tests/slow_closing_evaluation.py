"""An entry script whose closing evaluations first wait SECONDS, as a long Atari game would:

fabric run ... tests/slow_closing_evaluation.py SECONDS SCRIPT [SCRIPT's flags]
"""

import runpy
import sys
import time

import rl.evaluation
import rl.modes.evaluator

seconds, script = float(sys.argv[1]), sys.argv[2]


def slowed(evaluate):
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return evaluate(*args, **kwargs)

    return slow


# The run's closing evaluation (through greedy_returns), and the evaluator role's of the final weights
rl.evaluation.greedy_returns = slowed(rl.evaluation.greedy_returns)
Evaluator = rl.modes.evaluator.Evaluator
Evaluator.evaluate_final_weights = slowed(Evaluator.evaluate_final_weights)
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
