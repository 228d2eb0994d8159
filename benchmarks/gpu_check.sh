#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA GPU:
#     bash benchmarks/gpu_check.sh [profile] [tests] [speed] [topologies]   (all four by default)
# Wheels in .whl/ (for a machine without a package index; benchmarks/gpu_kit.sh fetches them) are installed first,
# and .envpool/ (made by the same script) is put on the path.
# profile: benchmarks/gpu_profile.py (PROFILE_ARGS: more arguments, such as --python for cProfile); tests:
# tests/test_gpu.py (TEST_K: pytest's -k); speed: benchmarks/gpu.py at every variant, with the Atari envs' own rate
# and, where .leanrl/ holds LeanRL's scripts and wheels, LeanRL beside it (SPEED_ARGS: more arguments); topologies:
# the default variant coupled, decoupled (in lockstep and with --pipeline) and with an evaluator (TOPOLOGY_ARGS: more
# arguments). Each stage's output goes to stdout and to a file under $OUT, and all of them into $OUT/report.md.
# BUDGET: the seconds the whole check may take (0, the default: no limit). A stage still running when the budget
# nears its end is stopped (gpu.py then prints the table of the runs that finished), a stage with under 30 s left is
# skipped, and the report is written in time: set it a little under the device call's limit. For one call of
# 10 minutes, the figures first and then the checks that captured steps train as eager ones do:
#     BUDGET=560 SPEED_ARGS="--variants 32-true" TEST_K="captured or steady_state or sync_debug or cuda_graphs" \
#         bash benchmarks/gpu_check.sh speed tests
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# envpool for Atari alone (benchmarks/envpool_kit.py): the atari-envpool configs and the envs' own rate use it
[ -d .envpool ] && export PYTHONPATH=$PWD/.envpool${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
BUDGET=${BUDGET:-0}
stages=${*:-profile tests speed topologies}

seconds_left() {  # for the next stage, 10 s kept for the report; 0 means no limit, as for timeout(1)
    if [ "$BUDGET" -gt 0 ]; then echo $((BUDGET - SECONDS - 10)); else echo 0; fi
}
scratch=$(mktemp -d)
for stage in $stages; do
    left=$(seconds_left)
    if [ "$BUDGET" -gt 0 ] && [ "$left" -lt 30 ]; then
        echo "== $stage skipped: ${left} s of the ${BUDGET} s budget left" | tee "$OUT/$stage.txt"
        continue
    fi
    echo "== $stage ($(date +%T))"
    case $stage in
        profile)
            (cd "$scratch" && timeout "$left" python3 "$OLDPWD/benchmarks/gpu_profile.py" ${PROFILE_ARGS:-}) 2>&1 |
                grep -v "^WARNING: compiler\|^$\|USDT" | tee "$OUT/profile.txt" ;;
        tests)
            limit=${TEST_TIMEOUT:-480}
            [ "$left" -gt 0 ] && [ "$left" -lt "$limit" ] && limit=$left
            timeout "$limit" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" \
                tests/test_gpu.py ${TEST_K:+-k "$TEST_K"} >"$OUT/tests.txt" 2>&1
            tail -60 "$OUT/tests.txt" ;;
        speed)
            leanrl=(); [ -d .leanrl ] && leanrl=(--leanrl .leanrl)
            timeout "$left" python3 benchmarks/gpu.py --envs-alone ${leanrl[@]+"${leanrl[@]}"} ${SPEED_ARGS:-} 2>&1 | tee "$OUT/speed.txt" ;;
        topologies)
            timeout "$left" python3 benchmarks/gpu.py --variants 32-true --topologies coupled decoupled pipelined evaluator ${TOPOLOGY_ARGS:-} \
                2>&1 | tee "$OUT/topologies.txt" ;;
        *) echo "unknown stage: $stage (profile, tests, speed or topologies)"; exit 2 ;;
    esac
done
for stage in $stages; do
    file="$OUT/$stage.txt"
    [ -f "$file" ] && printf '## %s\n\n```\n%s\n```\n\n' "$stage" "$(tail -80 "$file")"
done >"$OUT/report.md"
echo "== done ($(date +%T)): $OUT/report.md"
