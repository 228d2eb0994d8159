#!/usr/bin/env bash
# What a call to the GPU machine takes along: the working tree (tracked files and untracked ones git does not ignore)
# and the carried folders, 64 MiB in all. Long runs in progress leave their saves untracked but not ignored (a SAC
# checkpoint with its replay buffer, an SB3 reference run's save: 50-300 MB each), so that a copy of the working tree
# takes them to the next session; they would also push a device call past its limit.
#     bash benchmarks/device_tree.sh exclude   # before device calls: a .gitignore of its own in each folder of saves
#                                              # hides them, and the size that travels is printed (exit 1 over 64 MiB)
#     bash benchmarks/device_tree.sh restore   # after them: those .gitignore files go, and the saves with them
set -euo pipefail
cd "$(dirname "$0")/.."
MARK="# device_tree.sh: long runs' saves, kept from device calls until: bash benchmarks/device_tree.sh restore"
LIMIT=$((64 * 1024 * 1024))
CARRIED=(.whl .leanrl .envpool)

save_folders() {  # a deeper .gitignore overrides the negation in the top one that keeps these in the working tree
    find benchmarks/results -type d \( -path "*/runs/fabric_logs/*/checkpoints" -o -path "*/sb3/checkpoints" \)
}

restore() {
    { grep -rlx --include=.gitignore -F "$MARK" benchmarks/results || true; } | xargs -r rm --
}

travelling_bytes() {  # the files git would not ignore, and the carried folders
    {
        git ls-files -z --cached --others --exclude-standard
        for folder in "${CARRIED[@]}"; do if [ -d "$folder" ]; then find "$folder" -type f -print0; fi; done
    } | { xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{total += $1} END {print total + 0}'
}

case ${1:-} in
exclude)
    save_folders | while read -r folder; do printf '%s\n*\n' "$MARK" >"$folder/.gitignore"; done
    bytes=$(travelling_bytes)
    echo "a device call takes $((bytes / 1024 / 1024)) MiB of its 64 (carried: ${CARRIED[*]})"
    [ "$bytes" -le "$LIMIT" ] || { echo "over the limit: ignore or carry less" >&2; exit 1; }
    ;;
restore) restore ;;
*)
    echo "usage: bash benchmarks/device_tree.sh exclude|restore" >&2
    exit 2
    ;;
esac
