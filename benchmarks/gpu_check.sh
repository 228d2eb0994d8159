#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA GPU:
#     bash benchmarks/gpu_check.sh [profile] [tests] [speed] [topologies]   (all four by default)
# Wheels in .whl/ (for a machine without a package index) are installed first.
# profile: benchmarks/gpu_profile.py (PROFILE_ARGS: more arguments, such as --python for cProfile); tests:
# tests/test_gpu.py (TEST_K: pytest's -k); speed: benchmarks/gpu.py at every variant, with the Atari envs' own rate
# and, where .leanrl/ holds LeanRL's scripts and wheels, LeanRL beside it (SPEED_ARGS: more arguments); topologies:
# the default variant coupled, decoupled and with an evaluator (TOPOLOGY_ARGS: more arguments). Each stage's output
# goes to stdout and to a file under $OUT, and all of them into $OUT/report.md at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
stages=${*:-profile tests speed topologies}
scratch=$(mktemp -d)
for stage in $stages; do
    echo "== $stage ($(date +%T))"
    case $stage in
        profile) (cd "$scratch" && python3 "$OLDPWD/benchmarks/gpu_profile.py" ${PROFILE_ARGS:-}) 2>&1 | grep -v "^WARNING: compiler\|^$\|USDT" | tee "$OUT/profile.txt" ;;
        tests)
            timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" \
                tests/test_gpu.py ${TEST_K:+-k "$TEST_K"} >"$OUT/tests.txt" 2>&1
            tail -60 "$OUT/tests.txt" ;;
        speed)
            leanrl=(); [ -d .leanrl ] && leanrl=(--leanrl .leanrl)
            python3 benchmarks/gpu.py --envs-alone ${leanrl[@]+"${leanrl[@]}"} ${SPEED_ARGS:-} 2>&1 | tee "$OUT/speed.txt" ;;
        topologies)
            python3 benchmarks/gpu.py --variants 32-true --topologies coupled decoupled evaluator ${TOPOLOGY_ARGS:-} \
                2>&1 | tee "$OUT/topologies.txt" ;;
        *) echo "unknown stage: $stage (profile, tests, speed or topologies)"; exit 2 ;;
    esac
done
for stage in $stages; do
    file="$OUT/$stage.txt"
    [ -f "$file" ] && printf '## %s\n\n```\n%s\n```\n\n' "$stage" "$(tail -80 "$file")"
done >"$OUT/report.md"
echo "== done ($(date +%T)): $OUT/report.md"
