#!/usr/bin/env bash
# run_ab.sh - stock vs extension A/B on one GPU host, in one command.
#
# For each phase (main: the normal KV pool; pressure: a small pool) and each variant (stock, ext):
# set the patch state with the project's CLI (stock: reverted; ext: applied), start
# `python3 -m sglang.launch_server` with identical flags (ext adds --enable-prefill-ext), poll
# /health, run bench/ttft_bench.py, kill the server's process tree. Then write a report with
# stock/ext ratios and a TTFT CDF. Everything lands under $OUT in at most 7 files:
#   env.txt  summary-stock.json  summary-ext.json  report.md  ttft-cdf.png  ab-results.tar.gz
# (the tarball holds every per-request JSONL, the summaries, server logs and patch-CLI output).
#
# On the offline H200 host it first unpacks .whl/sglang-site-cp312.tar.xz to $SITE and the kernel
# cache .gpu/jit-cache-sglang-0.5.17-sm90.tar.gz to $JIT (shared/gpu/README.md's recipe). On a host
# where SGLang 0.5.17 is pip-installed, leave those files out (or INSTALL=0): it uses that SGLang.
#
# Environment (defaults in brackets):
#   VARIANTS       variants to run, in order ["stock"]; "stock ext" for the A/B
#   WORKLOADS      main-phase workloads [baseline,burst,rag,agent,unique,mixed]; "none" skips
#                  the main phase (e.g. a call for the pressure phase alone)
#   PRESSURE       1: also the pressure phase (separate servers, PRESSURE_SERVER_ARGS) [1]
#   BUDGET_S       seconds for the whole script; servers and workloads that would end later are
#                  skipped [520]
#   BENCH_ARGS     extra ttft_bench.py run arguments, e.g. "--baseline-reps 2" []
#   SERVER_ARGS    launch flags after --model-path, both variants [8B dummy, FlashInfer, 0.8, 128K]
#   PRESSURE_SERVER_ARGS  the same for the pressure phase [as SERVER_ARGS with mem fraction 0.2]
#   EXT_ARGS       added for the ext variant [--enable-prefill-ext]
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
COMMON_ARGS="--load-format dummy --skip-tokenizer-init --attention-backend flashinfer --context-length 131072"
SERVER_ARGS=${SERVER_ARGS:-$COMMON_ARGS --mem-fraction-static 0.8}
PRESSURE_SERVER_ARGS=${PRESSURE_SERVER_ARGS:-$COMMON_ARGS --mem-fraction-static 0.2}
EXT_ARGS=${EXT_ARGS:---enable-prefill-ext}
SITE=${SITE:-/tmp/site}
JIT=${JIT:-/tmp/jit}
INSTALL=${INSTALL:-auto}
SITE_TARBALL=${SITE_TARBALL:-$REPO/.whl/sglang-site-cp312.tar.xz}
JIT_TARBALL=${JIT_TARBALL:-$REPO/.gpu/jit-cache-sglang-0.5.17-sm90.tar.gz}
SERVER_START_EST_S=${SERVER_START_EST_S:-100}   # start-up (~70 s with the kernel cache) + margin
WORK=$(mktemp -d /tmp/ab-XXXXXX)
mkdir -p "$OUT"
PY=${PY:-python3}
URL="http://127.0.0.1:$PORT"

log() { echo "[run_ab $(date +%H:%M:%S) +$(($(date +%s) - T_START))s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

# ---------------------------------------------------------------------------------------------
# 1. SGLang and the kernel cache
if [ "$INSTALL" != 0 ] && [ -f "$SITE_TARBALL" ]; then
  if [ ! -f "$SITE/sglang/version.py" ]; then
    log "unpacking $(basename "$SITE_TARBALL") to $SITE"
    mkdir -p "$SITE" && tar -C "$SITE" -xJf "$SITE_TARBALL"
  else
    log "$SITE already holds sglang (warm host): not unpacking again"
  fi
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
  SGLANG_DIR=$SITE
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  SGLANG_DIR=$($PY -c 'import importlib.util as u, pathlib as p; print(p.Path(next(iter(u.find_spec("sglang").submodule_search_locations))).parent)')
fi
if [ "$INSTALL" != 0 ] && [ -f "$JIT_TARBALL" ]; then
  if [ ! -d "$JIT/flashinfer-aot" ]; then
    log "unpacking the kernel cache to $JIT"
    mkdir -p "$JIT" && tar -C "$JIT" -xzf "$JIT_TARBALL"
    # Triton kernels of the sparse path, as bench/gpu/run_ops.sh packs them (relative to $JIT).
    if [ -f "$REPO/.gpu/triton-ops-cache.tgz" ]; then tar -C "$JIT" -xzf "$REPO/.gpu/triton-ops-cache.tgz"; fi
  fi
  mkdir -p "$SGLANG_DIR/flashinfer/data/aot" && cp -r "$JIT/flashinfer-aot/." "$SGLANG_DIR/flashinfer/data/aot/"
  export TVM_FFI_CACHE_DIR=$JIT/tvm-ffi TRITON_CACHE_DIR=$JIT/triton FLASHINFER_WORKSPACE_BASE=$JIT/fi
  export FLASHINFER_DISABLE_JIT=${FLASHINFER_DISABLE_JIT:-1}
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

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
  echo "EXT_ARGS=$EXT_ARGS"
  echo "FLASHINFER_DISABLE_JIT=${FLASHINFER_DISABLE_JIT:-unset}"
} | tee "$OUT/env.txt"

# ---------------------------------------------------------------------------------------------
# 2. Patch state
patch_cli() { $PY -m sglang_prefill_ext.cli "$1" --sglang-version "$SGLANG_VERSION" --sglang-dir "$SGLANG_DIR"; }

# set_variant VARIANT: stock -> patch reverted; ext -> patch applied. Returns 1 if impossible.
set_variant() {
  local v=$1 plog="$WORK/patch-cli.log"
  echo "== $(date +%T) set_variant $v" >>"$plog"
  if [ "$v" = ext ]; then
    if ! patch_cli apply >>"$plog" 2>&1; then
      log "ext: the patch does not apply (see patch-cli.log): skipping ext"
      tail -3 "$plog"
      return 1
    fi
  else
    local st
    st=$(patch_cli status 2>>"$plog" || true)
    echo "$st" >>"$plog"
    case "$st" in
      *": applied"* | *"partially applied"*)
        if ! patch_cli revert >>"$plog" 2>&1; then
          log "stock: could not revert the patch: skipping stock"
          return 1
        fi ;;
      *"foreign changes"*) log "stock: sglang has foreign changes ($st): skipping stock"; return 1 ;;
    esac
  fi
  patch_cli status >>"$plog" 2>&1 || true
  return 0
}

# ---------------------------------------------------------------------------------------------
# 3. Server start and stop
SERVER_PID=""

descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$p"
    descendants "$p"
  done
}

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  local pids
  pids="$SERVER_PID $(descendants "$SERVER_PID" | tr '\n' ' ')"
  log "stopping server pid $SERVER_PID (tree: $pids)"
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 30); do
    local alive=0 p
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  # let the driver give the memory back before the next server sizes its KV pool
  for _ in $(seq 30); do
    local used
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1 || echo 0)
    [ "${used:-0}" -lt 2048 ] && break
    sleep 1
  done
}
trap stop_server EXIT

# start_server LOG ARGS...: returns 0 once /health answers 200, 1 if the server died or timed out
start_server() {
  local slog=$1
  shift
  log "starting: python3 -m sglang.launch_server --model-path $MODEL $* --port $PORT"
  setsid "$PY" -m sglang.launch_server --model-path "$MODEL" "$@" --port "$PORT" >"$slog" 2>&1 &
  SERVER_PID=$!
  local t0
  t0=$(date +%s)
  while true; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      log "server exited during start-up; last lines of its log:"
      tail -25 "$slog"
      SERVER_PID=""
      return 1
    fi
    if $PY -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('$URL/health', timeout=3).status == 200 else 1)" 2>/dev/null; then
      log "server healthy after $(($(date +%s) - t0)) s"
      grep -E "KV Cache is allocated|max_total_num_tokens=" "$slog" | tail -4 || true
      return 0
    fi
    if [ "$(left)" -le 0 ] || [ $(($(date +%s) - t0)) -gt 400 ]; then
      log "server not healthy in time"
      tail -25 "$slog"
      stop_server
      return 1
    fi
    sleep 2
  done
}

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
    local extra=()
    [ "$v" = ext ] && read -r -a extra <<<"$EXT_ARGS"
    if ! start_server "$WORK/$v/server-$phase.log" "$@" "${extra[@]}"; then
      log "$phase/$v: server did not start"
      continue
    fi
    # shellcheck disable=SC2086
    $PY bench/ttft_bench.py run --url "$URL" --label "$v" --workloads "$wl" --out-dir "$WORK/$v" \
      --deadline "$DEADLINE" --no-progress --health-timeout 60 $BENCH_ARGS || log "$phase/$v: bench exit $?"
    stop_server
  done
}

# SERVER_ARGS and PRESSURE_SERVER_ARGS are flag lists: split on purpose
if [ -n "$WORKLOADS" ] && [ "$WORKLOADS" != none ]; then
  # shellcheck disable=SC2086
  run_phase main "$WORKLOADS" $SERVER_ARGS
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
  $PY bench/ttft_bench.py report "${sums[@]}" --reference bench/reference/h200-stock-2026-11-29.json \
    --out-md "$OUT/report.md" --out-png "$OUT/ttft-cdf.png" || log "report failed"
fi
cp "$OUT/env.txt" "$WORK/" 2>/dev/null || true
tar -C "$WORK" -czf "$OUT/ab-results.tar.gz" .
log "done; files in $OUT:" "$OUT"/*
