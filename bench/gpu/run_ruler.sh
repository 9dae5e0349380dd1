#!/usr/bin/env bash
# run_ruler.sh - the RULER-style retrieval suite (bench/accuracy/ruler.py) on one GPU host, with every
# server up side by side, so one start serves a whole sweep:
#   STEP=servers  start one server per SERVERS entry ("name: flags", ';'-separated) at once, on ports $PORT
#                 [30000], $PORT + 1, ...: a stock* name on the unpatched SGLang ($SITE), any other on a patched
#                 copy of its sglang package ($SITE_EXT, made once with the project's CLI). Each runs under
#                 setsid, so it outlives this call while the host stays warm; waits until every one answers
#                 /health and writes "name port pid" lines to $STATE/servers.
#   STEP=ask      for each server of $STATE/servers (or of ASK="name ..."), one at a time while the others idle
#                 (TTFTs are not shared), `ruler run $RULER_ARGS` -> $STATE/$TAG-<name>.jsonl (kept across calls);
#                 then `ruler compare` of the $TAG files of COMPARE's servers (default: all, in start order), the
#                 first as dense -> $OUT/$TAG-compare.md/.json, and every $TAG file in $OUT/$TAG-jsonl.tar.gz;
#                 the file the dev rule picks (`ruler.choose`) -> $STATE/$TAG-chosen; with the servers' logs. ASK_TIMEOUT [0: none]
#                 bounds each server's run (the cases asked by then are kept).
#   STEP=stop     stop every server and wait until they are gone (their ports free for the next STEP=servers).
# Environment: TAG [ruler]: names a sweep's files; MODEL [/tmp/qwen-coder-hf-yarn4]; SERVER_ARGS [--context-length
#   $CONTEXT [131072] --mem-fraction-static 0.7 --max-total-tokens 300000: several servers share the GPU, plus
#   --attention-backend $ATTENTION_BACKEND when set]; OUT; STATE [/tmp/ruler-state]; SITE_EXT
#   [/tmp/site-ext]. The model must exist (bench/gpu/run_real.sh REAL_MODEL=qwen-coder ACCURACY=0 VARIANTS=""
#   joins, converts and makes the YaRN views).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
PY=${PY:-python3}
OUT=${OUT:-$REPO/out-ruler}
STATE=${STATE:-/tmp/ruler-state}
MODEL=${MODEL:-/tmp/qwen-coder-hf-yarn4}
SITE_EXT=${SITE_EXT:-/tmp/site-ext}
SERVER_ARGS=${SERVER_ARGS:---context-length ${CONTEXT:-131072} --mem-fraction-static 0.7 --max-total-tokens 300000${ATTENTION_BACKEND:+ --attention-backend $ATTENTION_BACKEND}}
STEP=${STEP:-ask}
PORT=${PORT:-30000}
TAG=${TAG:-ruler}
mkdir -p "$OUT" "$STATE"

log() { echo "[run_ruler $(date +%H:%M:%S)] $*"; }

# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"
STOCK_PATH=$PYTHONPATH

ext_site() {
  [ -f "$SITE_EXT/.patched" ] && return 0
  rm -rf "$SITE_EXT" && mkdir -p "$SITE_EXT"
  cp -r "$SITE/sglang" "$SITE"/sglang-*.dist-info "$SITE_EXT/"
  $PY -m sglang_prefill_ext.cli apply --sglang-version 0.5.17 --sglang-dir "$SITE_EXT" && touch "$SITE_EXT/.patched"
}

alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }  # a zombie is gone

healthy() {
  $PY -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=3).status == 200 else 1)" 2>/dev/null
}

case "$STEP" in
servers)
  ext_site || { log "could not patch $SITE_EXT"; exit 2; }
  : >"$STATE/servers"
  port=$PORT
  IFS=';' read -r -a entries <<<"$SERVERS"
  for entry in "${entries[@]}"; do
    name=$(echo "${entry%%:*}" | tr -d ' ')
    flags=${entry#*:}
    if [ "${name#stock}" = "$name" ]; then path="$SITE_EXT:$STOCK_PATH"; else path=$STOCK_PATH; fi
    # shellcheck disable=SC2086  # flag lists
    PYTHONPATH=$path setsid "$PY" -m sglang.launch_server --model-path "$MODEL" $SERVER_ARGS $flags \
      --port $port >"$STATE/server-$name.log" 2>&1 &
    echo "$name $port $!" >>"$STATE/servers"
    log "$name: port $port, pid $!, flags:$flags"
    port=$((port + 1))
  done
  t0=$(date +%s)
  while read -r name port pid; do
    until healthy "$port"; do
      if ! kill -0 "$pid" 2>/dev/null; then log "$name died:"; tail -20 "$STATE/server-$name.log"; break; fi
      if [ $(($(date +%s) - t0)) -gt 480 ]; then log "$name: not healthy after 480 s"; break; fi
      sleep 2
    done
    healthy "$port" && log "$name healthy after $(($(date +%s) - t0)) s; $(grep -oE "max_total_num_tokens=[0-9]+" "$STATE/server-$name.log" | head -1); $(grep -oE "attention_backend='[a-z0-9_]+'" "$STATE/server-$name.log" | head -1)"
  done <"$STATE/servers"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  ;;
ask)
  names=${ASK:-$(cut -d' ' -f1 "$STATE/servers" | tr '\n' ' ')}
  for name in $names; do
    port=$(awk -v n="$name" '$1 == n {print $2}' "$STATE/servers")
    [ -n "$port" ] || { log "$name: no such server"; continue; }
    log "$name: ruler run $RULER_ARGS"
    # shellcheck disable=SC2086  # RULER_ARGS is a flag list
    timeout "${ASK_TIMEOUT:-0}" $PY -m bench.accuracy.ruler run --url "http://127.0.0.1:$port" --model-dir "$MODEL" --label "$name" \
      --out "$STATE/$TAG-$name.jsonl" $RULER_ARGS
  done
  order=${COMPARE:-$(cut -d' ' -f1 "$STATE/servers" | tr '\n' ' ')}
  files=()
  for name in $order; do [ -f "$STATE/$TAG-$name.jsonl" ] && files+=("$STATE/$TAG-$name.jsonl"); done
  if [ ${#files[@]} -gt 1 ]; then
    $PY -m bench.accuracy.ruler compare "${files[@]}" --json "$OUT/$TAG-compare.json" --md "$OUT/$TAG-compare.md" \
      --choose "$STATE/$TAG-chosen"
  fi
  # with the servers' logs so far (the sparse path's density and guard lines per forward)
  tar -C "$STATE" -czf "$OUT/$TAG-jsonl.tar.gz" $(cd "$STATE" && ls "$TAG"-*.jsonl server-*.log 2>/dev/null)
  ;;
stop)
  while read -r name port pid; do kill -TERM -- "-$pid" 2>/dev/null && log "stopped $name"; done <"$STATE/servers"
  while read -r name port pid; do
    for _ in $(seq 60); do alive "$pid" || break; sleep 1; done
    alive "$pid" && log "$name (pid $pid) still running after 60 s"
  done <"$STATE/servers"
  rm -f "$STATE/servers"
  ;;
esac
