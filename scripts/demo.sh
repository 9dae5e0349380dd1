#!/usr/bin/env bash
# demo.sh — the project's main job, run by `make demo` after the venv is set up.
#   GPU host: the patched SGLang server with the extension on (8B-shaped dummy model unless MODEL
#             is set), measured by the TTFT harness against the same server with the flag off.
#   CPU box:  apply the patch to the installed SGLang, replay workloads through stock and the
#             extension (prefix tree and scheduling), print the comparison.
# Env: PYTHON (interpreter with SGLang), SGLANG_VERSION [0.5.17], OUT [./out] (GPU results).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export SGLANG_VERSION=${SGLANG_VERSION:-0.5.17}

PYTHON=$PY scripts/apply_patch.sh apply
PYTHON=$PY scripts/apply_patch.sh status

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "== CUDA found: stock vs extension servers, TTFT harness (bench/gpu/run_ab.sh)"
  INSTALL=0 VARIANTS=${VARIANTS:-"stock ext"} WORKLOADS=${WORKLOADS:-baseline,burst} PRESSURE=${PRESSURE:-0} \
    EXT_ARGS=${EXT_ARGS:-"--enable-prefill-ext"} \
    PY=$PY bash bench/gpu/run_ab.sh
else
  echo "== no CUDA: the same request traces through stock SGLang's scheduler and the extension's (CPU)"
  "$PY" bench/schedule_replay.py --lpm-waiting 128
  echo "== stock RadixCache vs the extension's prefix tree (CPU)"
  "$PY" bench/radix_bench.py --lengths 8192 131072 --pages 1 16 --repeat 1
fi
