#!/usr/bin/env bash
# The GPU machine's check, in one run within a time budget: the CuPy tests, the GPU benchmarks
# against PyTorch on CUDA, and the pool-scaling figures of a many-core CPU.
#
#   scripts/device-check.sh OUT_DIR [WHEEL_DIR]
#
# WHEEL_DIR (default .whl): wheels for this machine's Python of what it lacks (returns,
# array-api-compat, array-api-strict; mypy and its needs to compile the engine), installed into a
# target folder on PYTHONPATH. The engine is compiled in the background while the tests run on the
# pure-Python engine; the benchmarks use the compiled one if it was built in time. Without a GPU
# (or CuPy), the GPU steps are skipped, saying so. Every step has a time limit, and the whole run
# stays within DEVICE_CHECK_BUDGET seconds (default 480). OUT_DIR receives summary.txt (each step's
# exit status and seconds, then the figures), logs.tar.gz (each step's log) and the benchmarks' JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: scripts/device-check.sh OUT_DIR [WHEEL_DIR]}"
WHEELS="${2:-.whl}"
BUDGET="${DEVICE_CHECK_BUDGET:-480}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT" "$OUT/logs"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
START=$(date +%s)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT COMMAND...: runs COMMAND with its output in logs/NAME.log, for at most LIMIT
# seconds and never past the budget; skipped if under 15 s of the budget are left.
step() {
    local name=$1 limit=$2
    shift 2
    local remaining
    remaining=$(left)
    if ((remaining < 15)); then
        say "$name: skipped, the budget is spent"
        return 1
    fi
    ((limit > remaining)) && limit=$remaining
    local began=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
    local rc=$?
    local status="ok"
    ((rc == 124 || rc == 137)) && status="TIMED OUT after ${limit}s"
    ((rc != 0 && rc != 124 && rc != 137)) && status="FAILED (exit $rc)"
    say "$name: $status, $(($(date +%s) - began)) s"
    tail -n 3 "$OUT/logs/$name.log" | sed 's/^/    /' >>"$SUMMARY"
    return $rc
}

finish() {
    "$PYTHON" scripts/device_summary.py "$OUT" >>"$SUMMARY" 2>&1
    tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
    cat "$SUMMARY"
}
trap finish EXIT

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    step install 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/monadl-site "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/monadl-site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="/tmp/monadl-site/bin:$PATH"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step environment 30 bash -c "$PYTHON --version; nvidia-smi -L; nproc; $PYTHON -c 'import numpy, sys; print(\"numpy\", numpy.__version__)'; $PYTHON -c 'import cupy; print(\"cupy\", cupy.__version__, cupy.cuda.runtime.getDeviceCount(), \"GPUs\")'; $PYTHON -c 'import torch; print(\"torch\", torch.__version__, torch.cuda.is_available())'"

GPU=0
"$PYTHON" -c 'import cupy, sys; sys.exit(cupy.cuda.runtime.getDeviceCount() == 0)' >/dev/null 2>&1 && GPU=1
say "GPU: $([ $GPU = 1 ] && echo present || echo 'none (or no CuPy): the GPU steps are skipped')"

# The compiled engine, built beside the tests and the first GPU benchmarks (which run on the
# pure-Python engine); the later steps use it if it was built in time.
(
    began=$(date +%s)
    MONADL_BUILD=compiled timeout -k 5 "$(($(left) * 3 / 5))" "$PYTHON" setup.py build_ext --inplace \
        -j "$(nproc)" >"$OUT/logs/build.log" 2>&1
    echo "exit $? after $(($(date +%s) - began)) s" >>"$OUT/logs/build.log"
) &
BUILD=$!

TESTS=(tests/test_cupy.py tests/test_bench_device.py tests/test_ops_array_api.py tests/test_slicing.py
    tests/test_sparse.py tests/test_dropout.py)
MONADL_PURE=1 step tests-pure 150 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= "${TESTS[@]}"

BENCH=("$PYTHON" -m monadl.bench)
if [ $GPU = 1 ]; then
    MONADL_PURE=1 step treelstm-cuda-pure 100 "${BENCH[@]}" treelstm --device cuda --batches 16 64 256 \
        --phases train --max-unbatched 0 --trees 256 --repeats 3 --warmup 64 --no-progress \
        --json "$OUT/treelstm-cuda-pure.json"
    MONADL_PURE=1 step columns-cuda-pure 45 "${BENCH[@]}" columns --device cuda --columns 4 --pools 1 \
        --variants skip noskip --steps 60 --repeats 3 --warmup 10 --no-progress --json "$OUT/columns-cuda-pure.json"
fi

wait $BUILD
say "build: $(tail -n 1 "$OUT/logs/build.log")"
if "$PYTHON" -c 'import monadl, sys; sys.exit(not monadl.compiled())' >/dev/null 2>&1; then
    say "engine: compiled"
else
    say "engine: pure Python (the build failed or ran out of time: logs/build.log)"
    export MONADL_PURE=1
fi
step columns-pool 75 "${BENCH[@]}" columns --columns 4 8 --pools 1 2 4 8 --variants skip noskip \
    --steps 60 --repeats 3 --warmup 10 --no-torch --no-progress --json "$OUT/columns-pool.json"
step treelstm-pool 45 "${BENCH[@]}" treelstm --batches 64 --phases train --workers 1 2 4 \
    --max-unbatched 0 --trees 128 --repeats 3 --warmup 64 --no-torch --no-dynet --no-progress \
    --json "$OUT/treelstm-pool.json"
if [ $GPU = 1 ]; then
    step treelstm-cuda 45 "${BENCH[@]}" treelstm --device cuda --batches 64 --phases train \
        --max-unbatched 0 --trees 256 --repeats 3 --warmup 64 --no-progress --json "$OUT/treelstm-cuda.json"
    step overhead-cuda 35 "${BENCH[@]}" overhead --device cuda --chain 100 --repeats 3 --min-time 0.05 \
        --case elementwise-16x64 --case matmul-16x64 --case const-16x64 --json "$OUT/overhead-cuda.json"
    step suite-cuda-smoke 30 "${BENCH[@]}" suite --device cuda --smoke --no-progress
fi
