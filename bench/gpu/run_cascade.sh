#!/usr/bin/env bash
# Issue 7 on the H200 host: the cascade GPU tests, then bench/cascade_bench.py; a summary table last.
# From the repo root, with the device tool's carry [".whl/sglang-site-cp312.tar.xz", ".gpu"]:
#     bash bench/gpu/run_cascade.sh
# Results land in $OUT (default ./out-cascade): pytest_gpu.log, cascade_bench.log, cascade_bench.json,
# summary.txt, and new-flashinfer-jit.tgz if FlashInfer had to build a module the kernel cache lacked.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-cascade}
mkdir -p "$OUT"
t0=$(date +%s)

REPO=$PWD PY=python3 JIT_BUILD=1
# shellcheck source=bench/gpu/stack.sh
source bench/gpu/stack.sh
echo "unpacked in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader

timeout 150 python3 -m pytest -m gpu tests/ops/test_cascade_gpu.py -q -rfE -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
pytest_rc=${PIPESTATUS[0]}
echo "gpu tests: rc=$pytest_rc after $(( $(date +%s) - t0 )) s"

timeout 120 python3 bench/cascade_bench.py --json "$OUT/cascade_bench.json" 2>&1 | tee "$OUT/cascade_bench.log"
bench_rc=${PIPESTATUS[0]}
echo "bench: rc=$bench_rc after $(( $(date +%s) - t0 )) s"

new_jit=$(find $JIT/fi $JIT/tvm-ffi -name '*.so' -newer $JIT/.start 2>/dev/null)
[ -n "$new_jit" ] && tar -C $JIT -czf "$OUT/new-flashinfer-jit.tgz" $(echo "$new_jit" | sed "s|^$JIT/||")

{
    echo "== issue 7 cascade on $(nvidia-smi --query-gpu=name --format=csv,noheader), $(( $(date +%s) - t0 )) s in all"
    echo "gpu tests (rc=$pytest_rc): $(grep -E '(passed|failed|error)' "$OUT/pytest_gpu.log" | tail -1)"
    grep -E '^(FAILED|ERROR)' "$OUT/pytest_gpu.log" | head -20
    echo "new FlashInfer modules built (packed in new-flashinfer-jit.tgz): $(echo -n "$new_jit" | grep -c . || true)"
    echo "bench (rc=$bench_rc):"
    sed -n '/^shape BxNxS/,$p' "$OUT/cascade_bench.log"
} | tee "$OUT/summary.txt"
