#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA GPU: bash benchmarks/gpu_check.sh [profile] [tests] [speed]
# (all three by default). Wheels in .whl/ (for a machine without a package index) are installed first.
# profile: benchmarks/gpu_profile.py; tests: tests/test_gpu.py (TEST_K: pytest's -k); speed: benchmarks/gpu.py
# (LeanRL's configs; SPEED_ARGS: its arguments).
# Output goes to stdout and, where $OUT is set, to files under it.
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
stages=${*:-profile tests speed}
scratch=$(mktemp -d)
for stage in $stages; do
    echo "== $stage ($(date +%T))"
    case $stage in
        profile) (cd "$scratch" && python3 "$OLDPWD/benchmarks/gpu_profile.py" ${PROFILE_ARGS:-}) 2>&1 | grep -v "^WARNING: compiler\|^$\|USDT" | tee "$OUT/profile.txt" ;;
        tests)
            timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" \
                tests/test_gpu.py ${TEST_K:+-k "$TEST_K"} >"$OUT/tests.txt" 2>&1
            tail -60 "$OUT/tests.txt" ;;
        speed) python3 benchmarks/gpu.py ${SPEED_ARGS:-} 2>&1 | tee "$OUT/speed.txt" ;;
        *) echo "unknown stage: $stage (profile, tests or speed)"; exit 2 ;;
    esac
done
echo "== done ($(date +%T))"
