#!/usr/bin/env bash
# Issue 6 on the H200 host: the ops' GPU tests, then bench/ops_bench.py; a summary table last.
# From the repo root, with the device tool's carry [".whl/sglang-site-cp312.tar.xz", ".gpu"]:
#     bash bench/gpu/run_ops.sh
# Results land in $OUT (default ./out-ops): pytest_gpu.log, ops_bench.log, ops_bench.json, summary.txt,
# and new-flashinfer-jit.tgz if FlashInfer had to build a module the kernel cache lacked.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-ops}
mkdir -p "$OUT"
t0=$(date +%s)

mkdir -p /tmp/site /tmp/jit
tar -C /tmp/site -xJf .whl/sglang-site-cp312.tar.xz || exit 2
tar -C /tmp/jit -xzf .gpu/jit-cache-sglang-0.5.17-sm90.tar.gz || exit 2
mkdir -p /tmp/site/flashinfer/data/aot && cp -r /tmp/jit/flashinfer-aot/. /tmp/site/flashinfer/data/aot/
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi TRITON_CACHE_DIR=/tmp/jit/triton FLASHINFER_WORKSPACE_BASE=/tmp/jit/fi
unset FLASHINFER_DISABLE_JIT  # a module missing from the cache gets built (and packed below)
touch /tmp/jit/.start
echo "unpacked in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader

timeout 270 python3 -m pytest -m gpu tests/ops --ignore=tests/ops/test_backend_dispatch.py -q -rfE -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
pytest_rc=${PIPESTATUS[0]}
echo "gpu tests: rc=$pytest_rc after $(( $(date +%s) - t0 )) s"

timeout 240 python3 bench/ops_bench.py --json "$OUT/ops_bench.json" 2>&1 | tee "$OUT/ops_bench.log"
bench_rc=${PIPESTATUS[0]}
echo "bench: rc=$bench_rc after $(( $(date +%s) - t0 )) s"

new_jit=$(find /tmp/jit/fi /tmp/jit/tvm-ffi -name '*.so' -newer /tmp/jit/.start 2>/dev/null)
if [ -n "$new_jit" ]; then
    tar -C /tmp/jit -czf "$OUT/new-flashinfer-jit.tgz" $(echo "$new_jit" | sed 's|^/tmp/jit/||')
fi

{
    echo "== issue 6 ops on $(nvidia-smi --query-gpu=name --format=csv,noheader), $(( $(date +%s) - t0 )) s in all"
    echo "gpu tests (rc=$pytest_rc): $(grep -E '(passed|failed|error)' "$OUT/pytest_gpu.log" | tail -1)"
    grep -E '^(FAILED|ERROR)' "$OUT/pytest_gpu.log" | head -20
    echo "new FlashInfer modules built (packed in new-flashinfer-jit.tgz): $(echo -n "$new_jit" | grep -c . || true)"
    echo "bench (rc=$bench_rc):"
    sed -n '/^bf16 matmul ceiling/,$p' "$OUT/ops_bench.log"
} | tee "$OUT/summary.txt"
