#!/usr/bin/env bash
# Fetches, on a machine with a package index, what benchmarks/gpu_check.sh needs on a GPU machine that has none:
#     bash benchmarks/gpu_kit.sh
# .whl/     the wheels this project needs beyond that machine's own packages (its Python is 3.12; it already holds
#           torch, lightning, numpy, tensorboard, imageio and opencv): gymnasium, tyro, MuJoCo and ale-py, at the versions
#           constraints.txt pins;
# .leanrl/wheels/  the dependencies of LeanRL's scripts (see benchmarks/gpu.py for why these versions);
# .envpool/ envpool for Atari alone, to step Breakout as LeanRL does (benchmarks/envpool_kit.py).
# LeanRL's two scripts are not fetched: copy ppo_continuous_action_torchcompile.py and
# sac_continuous_action_torchcompile.py from pytorch-labs/LeanRL (folder leanrl/) into .leanrl/ to run them beside.
# The three folders are kept out of git (.git/info/exclude) and travel with a device call as carried paths. Long runs'
# saves in progress are kept from device calls last (benchmarks/device_tree.sh exclude, which prints what a call
# takes): after the device calls, `bash benchmarks/device_tree.sh restore` lets them go with the working tree again.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-python3 -m pip}

pinned() {  # NAME==VERSION as constraints.txt pins it for Python 3.12
    local line
    line=$(grep -i -E "^$1==[^;]*(; python_version >= \"3.11\")?\s*(#.*)?$" constraints.txt | head -1)
    [ -n "$line" ] || { echo "gpu_kit.sh: constraints.txt pins no version of $1 for Python 3.12" >&2; exit 1; }
    echo "${line%%;*}" | awk '{print $1}'
}

download() {  # FOLDER SPEC...: Python 3.12 x86-64 wheels, without their dependencies
    local folder=$1
    shift
    mkdir -p "$folder"
    $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$folder" "$@"
}

for folder in .whl .leanrl .envpool; do
    grep -qx "/$folder/" .git/info/exclude 2>/dev/null || echo "/$folder/" >>.git/info/exclude
done

# mujoco-studio (13 MB, MuJoCo's viewer) is left out: HalfCheetah steps and renders without it.
ours=(gymnasium Farama-Notifications tyro docstring_parser typeguard mujoco mujoco-core glfw PyOpenGL ale-py)
specs=()
for name in "${ours[@]}"; do specs+=("$(pinned "$name")"); done
download .whl "${specs[@]}"
download .leanrl/wheels tensordict==0.6.2 torchrl==0.6.0 gymnasium==0.29.1 tqdm orjson cloudpickle pyvers
python3 benchmarks/envpool_kit.py --python-version 3.12

du -sh .whl .leanrl .envpool
missing=()
for script in ppo_continuous_action_torchcompile.py sac_continuous_action_torchcompile.py; do
    [ -f ".leanrl/$script" ] || missing+=("$script")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "LeanRL's scripts are not in .leanrl/ yet (${missing[*]}): copy them from pytorch-labs/LeanRL to run them beside"
fi
echo 'carry: [".whl", ".leanrl", ".envpool"]; after the device calls: bash benchmarks/device_tree.sh restore'
bash benchmarks/device_tree.sh exclude
