#!/usr/bin/env bash
# run_dense.sh - issue 7's dense path on one GPU host: the GPU tests of ops/ (dense, cascade, sparse),
# then bench/dense_bench.py (gathered dense vs stock's attention over whole chunked prefills).
# From the repo root, with the device tool's carry [".whl/sglang-site-cp312.tar.xz", ".gpu"] (or on a
# warm host that already unpacked them): bash bench/gpu/run_dense.sh
# Results in $OUT (default ./out-dense): pytest_gpu.log, dense_bench.log, dense_bench.json.
# Environment: LENS [8192 32768 65536 131072], TESTS [tests/ops], BENCH_ARGS [].
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/out-dense}
PY=${PY:-python3}
LENS=${LENS:-8192 32768 65536 131072}
TESTS=${TESTS:-tests/ops}
BENCH_ARGS=${BENCH_ARGS:-}
mkdir -p "$OUT"
t0=$(date +%s)
FLASHINFER_DISABLE_JIT=${FLASHINFER_DISABLE_JIT:-0}
# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"
[ "$FLASHINFER_DISABLE_JIT" = 0 ] && unset FLASHINFER_DISABLE_JIT  # FlashInfer reads presence, not value
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader

# shellcheck disable=SC2086  # TESTS is a list
timeout 200 $PY -m pytest -m gpu $TESTS -q -rfE -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
echo "gpu tests: rc=${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s"
# shellcheck disable=SC2086  # LENS and BENCH_ARGS are lists
timeout 200 $PY bench/dense_bench.py --lens $LENS --json "$OUT/dense_bench.json" $BENCH_ARGS 2>&1 | tee "$OUT/dense_bench.log"
echo "bench: rc=${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s"
