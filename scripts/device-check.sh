#!/usr/bin/env bash
# The GPU machine's check, in one run within a time budget: the engine compiled first, then the
# CuPy tests, the GPU benchmarks against PyTorch on CUDA and the pool-scaling runs of a many-core
# CPU, written to one summary.
#
#   scripts/device-check.sh --wheels WHEEL_DIR     here, beforehand: the wheels the lent machine lacks
#   scripts/device-check.sh OUT_DIR [WHEEL_DIR]    there: the check
#
# WHEEL_DIR (default .whl): wheels for the lent machine's Python (3.12) of what its image lacks:
# returns, array-api-compat and array-api-strict (the tests), mypy and its compiled needs (the
# engine's build), mypy-extensions (the compiled engine's native integer types, newer than the
# image's) and DyNet (the CPU runs' peer), at this environment's versions; installed there into a
# folder on PYTHONPATH.
#
# DEVICE_CHECK_DATA (optional): the suite's data (../shared/data copied into a folder that git
# ignores and `carry` names). With it, the step cpu-suite runs DyNet's suite and the Tree-LSTM on
# the many-core CPU, one process a configuration on a core of its own (scripts/cpu-suite.sh, up to
# 400 s; raise DEVICE_CHECK_BUDGET to match); its files go into logs.tar.gz, its ratios into the
# summary.
#
# In order: the wheels, the environment, the engine's build (MONADL_BUILD=compiled; the summary
# says whether the engine runs compiled, and why not), the CuPy tests, `bench models --device cuda`
# (the dense models again with --no-fused: what the fused kernels buy), the Tree-LSTM on CUDA (batches 16 and 64 against both PyTorch peers, 256 against the batched one),
# then on the CPU, BLAS on one thread: CIFAR columns at pool 1/2/4/8 (batch 16, and batch 48 at
# width 512) and the Tree-LSTM at 1/2/4/8 workers. Without a GPU (or CuPy) the GPU steps are
# skipped, saying why. Every step has a time limit, and the run stays within DEVICE_CHECK_BUDGET
# seconds (default 480): a step that would start with under 15 s left is skipped, saying so.
#
# OUT_DIR receives summary.txt (each step's status and seconds with the end of its log, then the
# figures: scripts/device_summary.py), logs.tar.gz (each step's log) and the benchmarks' JSON.
# The exit status is 0 unless a step failed or ran out of time (a skipped step is no failure).
#
# For trying the script where there is no GPU: DEVICE_CHECK_SMOKE=1 runs the benchmarks in their
# seconds-long smoke form, DEVICE_CHECK_BUILD=0 keeps the engine as it is (no build), and
# DEVICE_CHECK_ONLY="step ..." runs only the steps named (the others are skipped, saying so).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if [ "${1:-}" = "--wheels" ]; then
    DIR="${2:?usage: scripts/device-check.sh --wheels WHEEL_DIR}"
    mkdir -p "$DIR"
    # This environment's versions of what the lent machine lacks, for its CPython 3.12 on x86-64.
    mapfile -t WANTED < <("$PYTHON" - <<'EOF'
from importlib.metadata import version
for name in ("returns", "array-api-compat", "array-api-strict", "mypy", "mypy-extensions", "ast-serialize", "librt"):
    print(f"{name}=={version(name)}")
try:  # DyNet, the suite's peer in the CPU runs (cpu-suite): this environment's, or the newest
    print(f"dyNET38=={version('dyNET38')}")
except Exception:
    print("dyNET38")
EOF
    )
    exec "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$DIR" "${WANTED[@]}"
fi

OUT="${1:?usage: scripts/device-check.sh OUT_DIR [WHEEL_DIR] | --wheels WHEEL_DIR}"
WHEELS="${2:-.whl}"
BUDGET="${DEVICE_CHECK_BUDGET:-480}"
SMOKE="${DEVICE_CHECK_SMOKE:-0}"
ONLY="${DEVICE_CHECK_ONLY:-}"
mkdir -p "$OUT/logs"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
START=$(date +%s)
FAILED=0
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT COMMAND...: runs COMMAND with its output in logs/NAME.log, for at most LIMIT
# seconds and never past the budget; skipped if not in DEVICE_CHECK_ONLY (where given) or if under
# 15 s of the budget are left.
step() {
    local name=$1 limit=$2
    shift 2
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
        say "$name: skipped, not in DEVICE_CHECK_ONLY"
        return 0
    fi
    local remaining
    remaining=$(left)
    if ((remaining < 15)); then
        say "$name: skipped, the budget of ${BUDGET}s is spent"
        return 0
    fi
    ((limit > remaining)) && limit=$remaining
    local began
    began=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
    local rc=$?
    local status="ok"
    if ((rc == 124 || rc == 137)); then
        status="TIMED OUT after ${limit}s"
        FAILED=1
    elif ((rc != 0)); then
        status="FAILED (exit $rc)"
        FAILED=1
    fi
    say "$name: $status, $(($(date +%s) - began)) s"
    tail -n 3 "$OUT/logs/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    return 0
}

# gpu_step NAME LIMIT COMMAND...: a step that needs the GPU, skipped without one, saying why.
gpu_step() {
    if [ "$GPU" != 1 ]; then
        say "$1: skipped, $NO_GPU"
        return 0
    fi
    step "$@"
}

# The figures after the steps' lines (printed as they come): the whole summary is then on stdout too.
finish() {
    say "total: $(($(date +%s) - START)) s of a budget of ${BUDGET} s"
    say ""
    "$PYTHON" scripts/device_summary.py "$OUT" 2>&1 | tee -a "$SUMMARY"
    tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
}
trap finish EXIT

say "device check at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC')"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    step install 60 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/monadl-site "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/monadl-site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="/tmp/monadl-site/bin:$PATH"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# What is missing (a GPU, CuPy, torch) is reported; the steps that need it say so and are skipped.
step environment 20 bash -c "$PYTHON --version; nvidia-smi -L || echo 'nvidia-smi: none'; nproc; $PYTHON -c 'import numpy; print(\"numpy\", numpy.__version__)'; $PYTHON -c 'import cupy; print(\"cupy\", cupy.__version__)' 2>/dev/null || echo 'cupy: not installed'; $PYTHON -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available())' 2>/dev/null || echo 'torch: not installed'"

NO_GPU=$("$PYTHON" - <<'EOF' 2>&1
try:
    import cupy
except ImportError:
    print("no GPU here: CuPy is not installed")
else:
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver
        print(f"no GPU here: CuPy finds no CUDA driver ({type(e).__name__})")
    else:
        print("" if count else "no GPU here: CuPy finds no CUDA GPU")
EOF
)
GPU=$([ -z "$NO_GPU" ] && echo 1 || echo 0)
say "GPU: $([ "$GPU" = 1 ] && echo present || echo "none ($NO_GPU): the GPU steps are skipped")"

# The engine, compiled before anything is measured (about 25 s on 16 CPUs once mypy is kept out
# of torch and jax; a build that stalls is stopped at 100 s, and everything then runs pure).
if [ "${DEVICE_CHECK_BUILD:-1}" = 1 ]; then
    step build 100 env MONADL_BUILD=compiled "$PYTHON" setup.py build_ext --inplace -j "$(nproc)"
else
    say "build: skipped (DEVICE_CHECK_BUILD=0)"
fi
ENGINE=$("$PYTHON" - <<'EOF' 2>&1 | tail -n 1
import monadl

print("compiled" if monadl.compiled() else f"pure Python ({monadl._compiled.reason()})")
EOF
)
say "engine: $ENGINE"

# Four processes where pytest-xdist is installed, each test file in one (the files share caches).
XDIST=()
"$PYTHON" -c 'import xdist' >/dev/null 2>&1 && XDIST=(-n 4 --dist loadfile)
TESTS=(tests/test_cupy.py tests/test_fused_kernels.py tests/test_bench_device.py tests/test_ops_array_api.py
    tests/test_slicing.py tests/test_sparse.py tests/test_dropout.py)
gpu_step tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= "${XDIST[@]}" "${TESTS[@]}"

BENCH=("$PYTHON" -m monadl.bench)
if [ "$SMOKE" = 1 ]; then
    SIZE=(--smoke)
    MODELS=(--smoke)
    TREES=(--smoke)
    COLUMNS=(--smoke)
    WIDE=(--smoke --batch 20 --hidden 32)
    TREE_POOL=(--smoke --workers 1 2)
else
    MODELS=(--repeats 3 --segment 0.25 --warmup 3)
    TREES=(--batches 16 64 --trees 64 --repeats 3 --warmup 32)
    SIZE=(--batches 256 --phases train --no-torch-eager --trees 256 --repeats 3 --warmup 256)
    COLUMNS=(--columns 8 --pools 1 2 4 8 --steps 40 --repeats 3 --warmup 10)
    WIDE=(--columns 8 --pools 1 4 --batch 48 --hidden 512 --steps 15 --repeats 3 --warmup 5)
    TREE_POOL=(--batches 64 --phases train --workers 1 2 4 8 --trees 128 --repeats 3 --warmup 64)
fi
gpu_step models-cuda 90 "${BENCH[@]}" models --device cuda "${MODELS[@]}" --json "$OUT/models-cuda.json"
gpu_step models-cuda-unfused 40 "${BENCH[@]}" models --device cuda --no-fused --only mlp encoder "${MODELS[@]}" \
    --json "$OUT/models-cuda-unfused.json"
gpu_step treelstm-cuda 100 "${BENCH[@]}" treelstm --device cuda --max-unbatched 0 --no-progress "${TREES[@]}" \
    --json "$OUT/treelstm-cuda.json"
gpu_step treelstm-cuda-256 45 "${BENCH[@]}" treelstm --device cuda --max-unbatched 0 --no-progress "${SIZE[@]}" \
    --json "$OUT/treelstm-cuda-256.json"

# DyNet's suite and the Tree-LSTM on the CPU, every configuration at once (where the data is given).
if [ -n "${DEVICE_CHECK_DATA:-}" ]; then
    if [ "$SMOKE" = 1 ]; then
        step cpu-suite 120 env CPU_SUITE_SMOKE=1 PYTHON="$PYTHON" scripts/cpu-suite.sh "$OUT/logs/cpu" "$DEVICE_CHECK_DATA"
    else
        step cpu-suite 430 env PYTHON="$PYTHON" scripts/cpu-suite.sh "$OUT/logs/cpu" "$DEVICE_CHECK_DATA"
    fi
else
    say "cpu-suite: skipped, DEVICE_CHECK_DATA names no data folder"
fi

# The CPU's cores: the executor's pool against pool 1, BLAS on one thread, no peers.
step columns-pool 50 "${BENCH[@]}" columns --variants skip noskip --no-torch --no-progress "${COLUMNS[@]}" \
    --json "$OUT/columns-pool.json"
step columns-pool-wide 50 "${BENCH[@]}" columns --variants skip noskip --no-torch --no-progress "${WIDE[@]}" \
    --json "$OUT/columns-pool-wide.json"
step treelstm-pool 45 "${BENCH[@]}" treelstm --max-unbatched 0 --no-torch --no-dynet --no-progress \
    "${TREE_POOL[@]}" --json "$OUT/treelstm-pool.json"
trap - EXIT
finish
exit "$FAILED"
