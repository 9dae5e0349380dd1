# server.sh - sourced by the GPU scripts after stack.sh: the patch state per variant and one SGLang
# server at a time. Needs PY, MODEL, PORT, URL, WORK, and the functions log (one line to stdout) and
# left (seconds left of the caller's budget); GPU: the index whose memory stop_server waits on [0].

# set_variant VARIANT: stock* -> patch reverted; any other (ext*, off: patched, flag off) -> patch
# applied. Returns 1 if impossible.
set_variant() {
  local v=$1 plog="$WORK/patch-cli.log"
  echo "== $(date +%T) set_variant $v" >>"$plog"
  if [ "${v#stock}" = "$v" ]; then
    if ! patch_cli apply >>"$plog" 2>&1; then
      log "$v: the patch does not apply (see patch-cli.log): skipping it"
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
    used=$(nvidia-smi -i "${GPU:-0}" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1 || echo 0)
    [ "${used:-0}" -lt 2048 ] && break
    sleep 1
  done
}

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
      grep -oE "attention_backend='[a-z0-9_]+'" "$slog" | head -1 | sed 's/^/attention backend in use: /' || true
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

