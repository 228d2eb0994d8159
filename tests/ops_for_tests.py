"""Run by the launchers in tests/test_host_syncs.py: one rank's aten ops, written to ops-RANK.json.

ops_for_tests.py coupled CONFIG ITERATIONS    per env step, in the steady-state window (see host_overhead)
ops_for_tests.py decoupled CONFIG STEPS       in total, over this process's whole run of STEPS env steps
"""

import io
import json
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_overhead

import rl

if __name__ == "__main__":
    mode, name, amount = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = host_overhead.CONFIGS[name]
    if mode == "coupled":
        counts = host_overhead.ops_per_step(config, amount)
    else:
        # One report and one checkpoint, at the end, whatever the length: two lengths differ by steady state only.
        # Tiny networks: the same ops as the preset's, with less arithmetic in each.
        run = config.config(amount, tiny=True)
        if hasattr(run, "log_every"):
            run.log_every = amount
        counter = host_overhead.OpCounter()
        with counter, redirect_stdout(io.StringIO()):
            rl.train(run, mode="decoupled")
        counts = dict(counter.counts)
    Path(f"ops-{os.environ['RANK']}.json").write_text(json.dumps(counts))
