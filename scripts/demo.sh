#!/usr/bin/env bash
# demo.sh — the project's main job, run by `make demo` after the venv is set up.
#   GPU host: the patched SGLang server with the extension on (8B-shaped dummy model unless MODEL
#             is set), measured by the TTFT harness against the same server with the flag off.
#   CPU box:  apply the patch to the installed SGLang, replay workloads through stock and the
#             extension (prefix tree and scheduling), print the comparison.
# Ends with a summary (CPU) or run_ab.sh's report (GPU), then reverts SGLang to stock.
# Env: PYTHON (interpreter with SGLang and this package), OUT [./out] (GPU results),
#      KEEP_PATCHED=1: leave SGLang patched at the end,
#      DEMO_VERBOSE=1: print SGLang's and torch's warnings as they come (CPU; by default they are
#      held back by scripts/demo_step.py and counted in the summary; errors always show).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
patch_cli() { PYTHON=$PY scripts/apply_patch.sh "$@"; }

finish() {
  if [ "${KEEP_PATCHED:-0}" = 1 ]; then
    echo "== SGLang stays patched (KEEP_PATCHED=1); back to stock: make revert (or PYTHON=$PY scripts/apply_patch.sh revert)"
  else
    patch_cli revert
    echo "== SGLang reverted to stock (KEEP_PATCHED=1 make demo leaves it patched)"
  fi
}
patch_cli apply
trap finish EXIT
patch_cli status

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "== CUDA found: stock vs extension servers, TTFT harness (bench/gpu/run_ab.sh)"
  INSTALL=0 VARIANTS=${VARIANTS:-"stock ext"} WORKLOADS=${WORKLOADS:-baseline,burst} PRESSURE=${PRESSURE:-0} \
    EXT_ARGS=${EXT_ARGS:-"--enable-prefill-ext"} \
    PY=$PY bash bench/gpu/run_ab.sh
else
  tables=$(mktemp -d)
  held=$tables/held.txt
  touch "$held"
  if [ "${DEMO_VERBOSE:-0}" = 1 ]; then
    step() { "$PY" "$@"; }
  else
    step() { DEMO_HELD=$held "$PY" scripts/demo_step.py "$@"; }
  fi
  echo "== no CUDA: the same request traces through stock SGLang's scheduler and the extension's (CPU)"
  step -m bench.replay.schedule_replay --lpm-waiting 128 | tee "$tables/replay.md"
  echo "== stock RadixCache vs the extension's prefix tree, prompts sharing a few long prefixes (CPU)"
  step -m bench.replay.radix_bench --workload shared --lengths 32768 131072 --pages 1 16 --repeat 1 | tee "$tables/radix.md"
  "$PY" -m bench.replay.demo_summary "$tables/replay.md" "$tables/radix.md" --held "$held"
  rm -rf "$tables"
fi
