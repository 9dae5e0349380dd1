#!/usr/bin/env bash
# Issue 6 on the H200 host: the ops' GPU tests, then bench.ops.ops_bench; a summary table last.
# From the repo root, with the device tool's carry [".whl/sglang-site-cp312.tar.xz", ".gpu"]:
#     bash bench/gpu/run_ops.sh                     # tests + the 128K rows and the 8K-chunk rows, ~2 min
#     LENS="8192 32768 65536 131072" bash bench/gpu/run_ops.sh   # every length
#     OPS_ARGS="--heads 12 2 --per-query-head" bash bench/gpu/run_ops.sh   # Qwen2.5-Coder-1.5B's shape
#     TESTS=0 ... bash bench/gpu/run_ops.sh         # the bench alone
# Results land in $OUT (default ./out-ops): pytest_gpu.log, ops_bench.log, ops_bench.json, summary.txt,
# new-flashinfer-jit.tgz if FlashInfer had to build a module the kernel cache lacked, and
# triton-ops-cache.tgz: the Triton kernels compiled here (scoring, pooling, index expansion), relative to
# the kernel-cache root, so `tar -C $JIT -xzf` puts them under $JIT/triton ($TRITON_CACHE_DIR of this
# script and of run_ab.sh). Carried back as .gpu/triton-ops-cache.tgz, this script unpacks it first.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-$PWD/out-ops}
LENS=${LENS:-131072}
MAX_RETURN_BYTES=$((16 << 20))
mkdir -p "$OUT"
t0=$(date +%s)

REPO=$PWD PY=python3 JIT_BUILD=1
# shellcheck source=bench/gpu/stack.sh
source bench/gpu/stack.sh
echo "unpacked in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader

if [ "${TESTS:-1}" = 1 ]; then
    timeout 240 python3 -m pytest -m gpu tests/ops --ignore=tests/ops/test_backend_dispatch.py -q -rfE -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
    pytest_rc=${PIPESTATUS[0]}
else
    echo "gpu tests skipped (TESTS=0)" > "$OUT/pytest_gpu.log"
    pytest_rc=skipped
fi
echo "gpu tests: rc=$pytest_rc after $(( $(date +%s) - t0 )) s"

# shellcheck disable=SC2086  # LENS is a list
timeout ${BENCH_TIMEOUT:-300} python3 -m bench.ops.ops_bench --lens $LENS ${OPS_ARGS:-} --json "$OUT/ops_bench.json" 2>&1 | tee "$OUT/ops_bench.log"
bench_rc=${PIPESTATUS[0]}
echo "bench: rc=$bench_rc after $(( $(date +%s) - t0 )) s"

new_jit=$(find $JIT/fi $JIT/tvm-ffi -name '*.so' -newer $JIT/.start 2>/dev/null)
if [ -n "$new_jit" ]; then
    echo "$new_jit" | sed "s|^$JIT/||" | tar -C $JIT -czf "$OUT/new-flashinfer-jit.tgz" -T -
fi
# Triton keeps one folder per compiled kernel variant; pack the folders this run created.
new_triton=$(find $JIT/triton -mindepth 1 -maxdepth 1 -type d -newer $JIT/.start | sed "s|^$JIT/||")
triton_note="no new Triton kernels (all came from the cache)"
if [ -n "$new_triton" ]; then
    echo "$new_triton" | tar -C $JIT -czf "$OUT/triton-ops-cache.tgz" -T -
    size=$(stat -c %s "$OUT/triton-ops-cache.tgz")
    triton_note="$(echo "$new_triton" | wc -l) new Triton kernel folders, triton-ops-cache.tgz $((size >> 10)) KiB"
    if [ "$size" -gt "$MAX_RETURN_BYTES" ]; then
        rm -f "$OUT/triton-ops-cache.tgz"
        triton_note="$triton_note: over 16 MiB, not returned"
    fi
fi

{
    echo "== issue 6 ops on $(nvidia-smi --query-gpu=name --format=csv,noheader), LENS=$LENS, $(( $(date +%s) - t0 )) s in all"
    echo "gpu tests (rc=$pytest_rc): $(grep -E '(passed|failed|error)' "$OUT/pytest_gpu.log" | tail -1)"
    grep -E '^(FAILED|ERROR)' "$OUT/pytest_gpu.log" | head -20
    echo "new FlashInfer modules built (packed in new-flashinfer-jit.tgz): $(echo -n "$new_jit" | grep -c . || true)"
    echo "Triton cache: $triton_note"
    echo "bench (rc=$bench_rc):"
    sed -n '/^bf16 matmul ceiling/,$p' "$OUT/ops_bench.log"
    python3 - "$OUT/ops_bench.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, ValueError, KeyError) as err:
    sys.exit(f"no bench JSON: {err}")
print("\n== sparse rows: where the time goes (ms; plan = indices + FlashInfer planner)")
head = ("L", "path", "backend", "total", "select", "plan", "attn", "speed-up", "shared speed-up", "density",
        "recall")
print(" | ".join(head))
for r in rows:
    if "plan_ms" not in r:
        continue
    cells = [r["L"], r["path"], r.get("backend", ""), r["ms"], r["select_ms"], r["plan_ms"], r["attn_ms"],
             r["vs_dense"], r.get("vs_dense_shared", ""), r.get("density", ""), r.get("recall", "")]
    print(" | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells))
print("speed-up: vs FlashInfer ragged dense (full rows) or paged dense (chunk rows), select + plan + attn counted;")
print("shared speed-up: select + plan counted once per 30 layers (--prefill-ext-sparse-per-layer off).")
PY
} | tee "$OUT/summary.txt"
