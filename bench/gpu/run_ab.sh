#!/usr/bin/env bash
# run_ab.sh - stock vs extension A/B on one GPU host, in one command.
#
# For each phase (main: the normal KV pool; pressure: a small pool) and each variant (stock, ext):
# set the patch state with the project's CLI (stock: reverted; ext: applied), start
# `python3 -m sglang.launch_server` with identical flags (ext adds --enable-prefill-ext), poll
# /health, run bench.serving.ttft_bench, kill the server's process tree. Then write a report with
# stock/ext ratios, a goodput table of every variant and the CDFs. Everything lands under $OUT:
#   env.txt  summary-<variant>.json  report.md  ttft-cdf.png  goodput-cdf.png  ab-results.tar.gz
# (the tarball holds every per-request JSONL, the summaries, server logs and patch-CLI output),
# plus doctor-<variant>-<phase>.txt for a request log written with --prefill-ext-log-fingerprints
# (its --json report in the tarball).
#
# On the offline H200 host it first unpacks .whl/sglang-site-cp312.tar.xz to $SITE and the kernel
# cache .gpu/jit-cache-sglang-0.5.17-sm90.tar.gz to $JIT (shared/gpu/README.md's recipe). On a host
# where SGLang 0.5.17 is pip-installed, leave those files out (or INSTALL=0): it uses that SGLang.
#
# Environment (defaults in brackets):
#   VARIANTS       variants to run, in order ["stock"]; "stock ext" for the A/B. Any name starting
#                  with "ext" runs the patched SGLang with EXT_ARGS_<name> (ext: EXT_ARGS), e.g.
#                  VARIANTS="stock ext ext_sparse" EXT_ARGS_ext_sparse="--enable-prefill-ext --prefill-ext-sparse";
#                  any other name starting with "stock" runs stock SGLang with STOCK_ARGS_<name>, e.g.
#                  STOCK_ARGS_stock_fi="--attention-backend flashinfer" (a second, labelled baseline);
#                  a variant whose server does not start is skipped, the others still run
#   WORKLOADS      main-phase workloads [baseline,burst,rag,agent,unique,mixed]; "none" skips
#                  them (and the main phase unless ROBUST=1), e.g. a call for the pressure phase alone
#   PRESSURE       1: also the pressure phase (separate servers, PRESSURE_SERVER_ARGS) [1]
#   BUDGET_S       seconds for the whole script; servers and workloads that would end later are
#                  skipped [520]
#   BENCH_ARGS     extra ttft_bench.py run arguments, e.g. "--baseline-reps 2" []
#   SERVER_ARGS    launch flags after --model-path, every variant [8B dummy, stock's default attention
#                  backend (fa3 on Hopper: bring it with bench/gpu/fa3_part.sh), 0.8, 128K]
#   PRESSURE_SERVER_ARGS  the same for the pressure phase [as SERVER_ARGS with mem fraction 0.2]
#   EXT_ARGS       added for the ext variant [--enable-prefill-ext]
#   EXT_LOGS       1: ext* variants also write the extension's request and pass logs (--prefill-ext-log,
#                  --prefill-ext-pass-log; one write() per finished request and per prefill pass, which
#                  stock servers do not do); 0: no logs, the same I/O as stock [1]
#   ROBUST         1: after each variant's workloads, bench.serving.robustness on the same server: malformed
#                  requests (their answers land in robustness-<variant>.json, compared in the report),
#                  ROBUST_LONG_REPS repeated long prompts for ext* variants [20] of ROBUST_LONG_LEN
#                  tokens [100000], then an idle spell and SGLang's idle memory check (server alive,
#                  no "leak detected" in its log) [0]; ROBUST_VARIANTS: only these variants [all]
#   MODEL          [bench/models/llama3-8b-dummy]   PORT [30000]   OUT [./out]
#   SITE, JIT      unpack folders [/tmp/site, /tmp/jit]; INSTALL=auto|0 [auto]
#   FLASHINFER_DISABLE_JIT  [1]: a kernel missing from the cache raises instead of compiling
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
T_START=$(date +%s)
BUDGET_S=${BUDGET_S:-520}
DEADLINE=$((T_START + BUDGET_S))
OUT=${OUT:-$REPO/out}
VARIANTS=${VARIANTS:-stock}
WORKLOADS=${WORKLOADS-baseline,burst,rag,agent,unique,mixed}
PRESSURE=${PRESSURE:-1}
BENCH_ARGS=${BENCH_ARGS:-}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.17}
MODEL=${MODEL:-$REPO/bench/models/llama3-8b-dummy}
PORT=${PORT:-30000}
# No --attention-backend: stock's default on the GPU (fa3 on Hopper; the server log names it).
COMMON_ARGS="--load-format dummy --skip-tokenizer-init --context-length 131072"
SERVER_ARGS=${SERVER_ARGS:-$COMMON_ARGS --mem-fraction-static 0.8}
PRESSURE_SERVER_ARGS=${PRESSURE_SERVER_ARGS:-$COMMON_ARGS --mem-fraction-static 0.2}
EXT_ARGS=${EXT_ARGS:---enable-prefill-ext}
EXT_LOGS=${EXT_LOGS:-1}
ROBUST=${ROBUST:-0}
ROBUST_LONG_REPS=${ROBUST_LONG_REPS:-20}
ROBUST_LONG_LEN=${ROBUST_LONG_LEN:-100000}
SERVER_START_EST_S=${SERVER_START_EST_S:-100}   # start-up (~70 s with the kernel cache) + margin
WORK=$(mktemp -d /tmp/ab-XXXXXX)
mkdir -p "$OUT"
PY=${PY:-python3}
URL="http://127.0.0.1:$PORT"

log() { echo "[run_ab $(date +%H:%M:%S) +$(($(date +%s) - T_START))s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

# ---------------------------------------------------------------------------------------------
# 1. SGLang and the kernel cache
# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname) $(uname -srm), $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 || true
  $PY - <<'EOF' 2>&1 || true
import importlib.metadata as md, importlib.util as u, sys
def ver(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return "absent"
v = {n: ver(n) for n in ("torch", "transformers", "sglang", "flashinfer-python", "sglang-kernel")}
print("python", sys.version.split()[0], "|", " | ".join(f"{k} {x}" for k, x in v.items()),
      "| sglang from", u.find_spec("sglang").origin)
EOF
  echo "sglang dir: $SGLANG_DIR"
  echo "VARIANTS=$VARIANTS WORKLOADS=$WORKLOADS PRESSURE=$PRESSURE BUDGET_S=$BUDGET_S BENCH_ARGS=$BENCH_ARGS"
  echo "SERVER_ARGS=$SERVER_ARGS"
  echo "PRESSURE_SERVER_ARGS=$PRESSURE_SERVER_ARGS"
  echo "EXT_ARGS=$EXT_ARGS EXT_LOGS=$EXT_LOGS"
  for v in $VARIANTS; do
    case "$v" in ext?*) name="EXT_ARGS_$v"; echo "$name=${!name:-}" ;; stock?*) name="STOCK_ARGS_$v"; echo "$name=${!name:-}" ;; esac
  done
  echo "ROBUST=$ROBUST ROBUST_LONG_REPS=$ROBUST_LONG_REPS ROBUST_LONG_LEN=$ROBUST_LONG_LEN"
  echo "FLASHINFER_DISABLE_JIT=${FLASHINFER_DISABLE_JIT:-unset}"
} | tee "$OUT/env.txt"

# ---------------------------------------------------------------------------------------------
# 2. Patch state and servers: set_variant, start_server, stop_server
# shellcheck source=bench/gpu/server.sh
source "$REPO/bench/gpu/server.sh"
trap stop_server EXIT

# ---------------------------------------------------------------------------------------------
# 4. Phases x variants
run_phase() {  # run_phase PHASE WORKLOADS ARGS...
  local phase=$1 wl=$2
  shift 2
  local v
  for v in $VARIANTS; do
    if [ "$(left)" -lt "$SERVER_START_EST_S" ]; then
      log "$phase/$v: skipped, $(left) s left of the budget"
      continue
    fi
    set_variant "$v" || continue
    mkdir -p "$WORK/$v"
    local extra=() args_name="EXT_ARGS_$v"
    [ "${v#stock}" != "$v" ] && args_name="STOCK_ARGS_$v"
    [ "$v" = ext ] && read -r -a extra <<<"$EXT_ARGS"
    [ "$v" != ext ] && [ "$v" != stock ] && read -r -a extra <<<"${!args_name:-}"
    # ext* variants keep the extension's per-request log (--prefill-ext-log) with the results
    [ "${v#ext}" != "$v" ] && [ "$EXT_LOGS" = 1 ] && extra+=(--prefill-ext-log "$WORK/$v/requests-$phase.jsonl" \
      --prefill-ext-pass-log "$WORK/$v/passes-$phase.jsonl")
    if ! start_server "$WORK/$v/server-$phase.log" "$@" "${extra[@]}"; then
      log "$phase/$v: server did not start"
      continue
    fi
    if [ "$wl" != none ]; then
      # shellcheck disable=SC2086
      $PY -m bench.serving.ttft_bench run --url "$URL" --label "$v" --workloads "$wl" --out-dir "$WORK/$v" \
        --deadline "$DEADLINE" --no-progress --health-timeout 60 $BENCH_ARGS || log "$phase/$v: bench exit $?"
    fi
    if [ "$ROBUST" = 1 ] && [ "$phase" = main ] && [[ " ${ROBUST_VARIANTS:-$VARIANTS} " == *" $v "* ]]; then
      local reps=0
      [ "${v#ext}" != "$v" ] && reps=$ROBUST_LONG_REPS
      $PY -m bench.serving.robustness run --url "$URL" --label "$v" --model-dir "$MODEL" --long-reps "$reps" \
        --long-len "$ROBUST_LONG_LEN" --deadline "$DEADLINE" --server-log "$WORK/$v/server-$phase.log" \
        --out "$WORK/$v/robustness.json" || log "$phase/$v: robustness exit $?"
      cp "$WORK/$v/robustness.json" "$OUT/robustness-$v.json" 2>/dev/null || true
    fi
    stop_server
  done
}

# SERVER_ARGS and PRESSURE_SERVER_ARGS are flag lists: split on purpose
if { [ -n "$WORKLOADS" ] && [ "$WORKLOADS" != none ]; } || [ "$ROBUST" = 1 ]; then
  # shellcheck disable=SC2086
  run_phase main "${WORKLOADS:-none}" $SERVER_ARGS
fi
if [ "$PRESSURE" = 1 ]; then
  # shellcheck disable=SC2086
  run_phase pressure pressure $PRESSURE_SERVER_ARGS
fi

# leave the installed SGLang pristine
if patch_cli status 2>/dev/null | grep -q ": applied"; then patch_cli revert >>"$WORK/patch-cli.log" 2>&1 || true; fi

# ---------------------------------------------------------------------------------------------
# 5. Report and files back
sums=()
for v in $VARIANTS; do
  if [ -f "$WORK/$v/summary.json" ]; then
    cp "$WORK/$v/summary.json" "$OUT/summary-$v.json"
    sums+=("$v=$WORK/$v/summary.json")
  fi
done
if [ ${#sums[@]} -gt 0 ]; then
  $PY -m bench.serving.ttft_bench report "${sums[@]}" --reference bench/baselines/h200-stock-2026-11-29.json \
    --out-md "$OUT/report.md" --out-png "$OUT/ttft-cdf.png" \
    --out-goodput-png "$OUT/goodput-cdf.png" || log "report failed"
fi
# the cache doctor on each request log written with --prefill-ext-log-fingerprints (in EXT_ARGS*)
for f in "$WORK"/*/requests-*.jsonl; do
  [ -f "$f" ] && grep -q '"fp_block"' "$f" || continue
  name=$(basename "$(dirname "$f")")-$(basename "$f" .jsonl | sed 's/^requests-//')
  $PY -m sglang_prefill_ext.cli doctor "$f" >"$OUT/doctor-$name.txt" 2>&1 || log "doctor $name failed"
  $PY -m sglang_prefill_ext.cli doctor "$f" --json >"$WORK/doctor-$name.json" 2>&1 || true
done
robust=()
for v in $VARIANTS; do [ -f "$OUT/robustness-$v.json" ] && robust+=("$OUT/robustness-$v.json"); done
if [ ${#robust[@]} -gt 0 ]; then
  $PY -m bench.serving.robustness compare "${robust[@]}" | tee -a "$OUT/report.md" || log "robustness compare failed"
fi
cp "$OUT/env.txt" "$WORK/" 2>/dev/null || true
tar -C "$WORK" -czf "$OUT/ab-results.tar.gz" .
log "done; files in $OUT:" "$OUT"/*
