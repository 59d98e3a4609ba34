#!/usr/bin/env bash
# DyNet's suite and the Tree-LSTM on a many-core CPU, every configuration at once: each (task,
# instances per update) of `bench suite` and each batch of `bench treelstm` a process of its own,
# one thread, pinned to a core of its own (cores 2 and up; the first two are left to the rest of
# the machine), so that a 16-core machine measures in a few minutes what the suite measures
# on one core in forty. The processes share the last-level cache and memory bandwidth, which slows
# every implementation alike; each ratio is paired within its process, as in a plain run.
#
#   scripts/cpu-suite.sh OUT_DIR DATA_DIR
#
# DATA_DIR: the suite's data (sst/ and dynet-benchmark/, as `bench suite --data` reads). DyNet and
# PyTorch are the peers where installed. OUT_DIR receives a JSON file and a log per process.
# CPU_SUITE_REPEATS (default 3), CPU_SUITE_LIMIT (seconds a process may take, default 400: the
# language model at 1 an update takes the longest, its DyNet peers training some 15 sentences a
# second), CPU_SUITE_SMOKE=1 (seconds-long runs, for trying the script). Without `taskset`, or with fewer
# cores than processes, the processes run unpinned.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: scripts/cpu-suite.sh OUT_DIR DATA_DIR}"
DATA="${2:?usage: scripts/cpu-suite.sh OUT_DIR DATA_DIR}"
PYTHON="${PYTHON:-python3}"
REPEATS="${CPU_SUITE_REPEATS:-3}"
LIMIT="${CPU_SUITE_LIMIT:-400}"
EXTRA=()
[ "${CPU_SUITE_SMOKE:-0}" = 1 ] && EXTRA=(--smoke)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"

TASKS=(bilstm-tagger bilstm-tagger-withchar treenn rnnlm-batch)
BATCHES=(1 16 64)
TREE_BATCHES=(16 64)
PROCESSES=$((${#TASKS[@]} * ${#BATCHES[@]} + ${#TREE_BATCHES[@]}))
PIN=0
command -v taskset >/dev/null && (($(nproc) >= PROCESSES + 2)) && PIN=1

core=2
# launch NAME COMMAND...: COMMAND in the background, on the next core where pinned.
launch() {
    local name=$1
    shift
    if ((PIN)); then
        taskset -c "$core" timeout -k 5 "$LIMIT" "$@" >"$OUT/$name.log" 2>&1 &
    else
        timeout -k 5 "$LIMIT" "$@" >"$OUT/$name.log" 2>&1 &
    fi
    core=$((core + 1))
}

START=$(date +%s)
for task in "${TASKS[@]}"; do
    for batch in "${BATCHES[@]}"; do
        launch "suite-$task-$batch" "$PYTHON" -m monadl.bench suite --tasks "$task" --batches "$batch" \
            --data "$DATA" --repeats "$REPEATS" --no-progress "${EXTRA[@]}" --json "$OUT/suite-$task-$batch.json"
    done
done
for batch in "${TREE_BATCHES[@]}"; do
    launch "treelstm-$batch" "$PYTHON" -m monadl.bench treelstm --batches "$batch" --max-unbatched 0 \
        --no-torch-eager --repeats "$REPEATS" --no-progress "${EXTRA[@]}" --json "$OUT/treelstm-$batch.json"
done
FAILED=0
for job in $(jobs -p); do
    wait "$job" || FAILED=1
done
echo "$PROCESSES processes ($([ "$PIN" = 1 ] && echo "each on a core of its own" || echo "unpinned")) in $(($(date +%s) - START)) s"
((FAILED)) && echo "some failed or ran out of their ${LIMIT}s: see $OUT/*.log"
exit "$FAILED"
