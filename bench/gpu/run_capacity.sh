#!/usr/bin/env bash
# run_capacity.sh - goodput capacity (issue 39) of stock's knob matrix and the extension's variants, one command.
#
# For each variant of bench/lib/variants.py (`python3 -m bench.lib.variants` lists them; VARIANTS picks some):
# start `python3 -m sglang.launch_server` with SERVER_ARGS and the variant's flags (stock*: stock SGLang,
# any other: a patched copy of it at $SITE_EXT), run `bench.serving.capacity run` (calibration: lone prompts,
# then the load-factor sweep of WORKLOADS), stop it. Variants are dealt to the visible GPUs (GPUS), one
# server per GPU at a time, stock first on the first GPU; every other variant judges long requests by stock's
# calibration (--alone-from, waiting for it). A server that does not start (PD-multiplexing, say) is reported
# in $OUT/capacity.md with the end of its log. Then `bench.serving.capacity compare` of every run, with the
# replay's predictions where PREDICTED holds them. Everything lands under $OUT:
#   env.txt  capacity.md  capacity.png (attainment vs rate)  capacity-cdf.png (short TTFT, TBT at capacity)
#   capacity-results.tar.gz (each variant's capacity.json, requests.jsonl, server log, the ext pass logs)
#
# Environment (defaults in brackets):
#   VARIANTS      names from bench/lib/variants.py [all]; FLAGS_<name> overrides one's flags
#   WORKLOADS     swept workloads [mixed,rag-stream] (also rag, agent)
#   CAPACITY_ARGS extra `capacity run` arguments for every variant, e.g. "--per-point 100 --seeds 2" []
#   FACTORS_<name> that variant's load factors, e.g. FACTORS_stock=0.5,0.35,0.25,0.15,0.1 [the CLI's]
#   BUDGET_S      seconds for the whole script; a variant that cannot start and sweep one point in what is left
#                 is skipped, a sweep stops before a point that would end past it [540]
#   GPUS          GPU indices to use, space-separated [every GPU nvidia-smi lists]
#   SERVER_ARGS   launch flags after --model-path, every variant [8B dummy, stock's default attention backend,
#                 0.8, 128K]
#   EXT_LOGS      1: ext* variants write the extension's pass log (--prefill-ext-pass-log) [1]
#   PREDICTED     a folder of bench.replay.capacity_replay's <variant>.json, compared beside []
#   MODEL [bench/models/llama3-8b-dummy]  OUT [./out-capacity]  SITE, JIT, SITE_EXT [/tmp/site, /tmp/jit,
#   /tmp/site-ext]  INSTALL=auto|0 [auto]
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
T_START=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
DEADLINE=$((T_START + BUDGET_S))
OUT=${OUT:-$REPO/out-capacity}
WORKLOADS=${WORKLOADS:-mixed,rag-stream}
CAPACITY_ARGS=${CAPACITY_ARGS:-}
MODEL=${MODEL:-$REPO/bench/models/llama3-8b-dummy}
SERVER_ARGS=${SERVER_ARGS:---load-format dummy --skip-tokenizer-init --context-length 131072 --mem-fraction-static 0.8}
EXT_LOGS=${EXT_LOGS:-1}
SITE_EXT=${SITE_EXT:-/tmp/site-ext}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.17}
SERVER_START_EST_S=${SERVER_START_EST_S:-100}
WORK=$(mktemp -d /tmp/capacity-XXXXXX)
PY=${PY:-python3}
mkdir -p "$OUT"

log() { echo "[run_capacity $(date +%H:%M:%S) +$(($(date +%s) - T_START))s${GPU:+ gpu$GPU}] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"
STOCK_PATH=$PYTHONPATH
# shellcheck source=bench/gpu/server.sh
source "$REPO/bench/gpu/server.sh"

VARIANTS=${VARIANTS:-$($PY -m bench.lib.variants | cut -f1 | tr '\n' ' ')}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ')}
read -r -a gpus <<<"${GPUS:-0}"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname) $(uname -srm), $(nproc) cores"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  echo "sglang dir: $SGLANG_DIR; ext copy: $SITE_EXT"
  echo "VARIANTS=$VARIANTS WORKLOADS=$WORKLOADS BUDGET_S=$BUDGET_S GPUS=${gpus[*]}"
  echo "CAPACITY_ARGS=$CAPACITY_ARGS"
  echo "SERVER_ARGS=$SERVER_ARGS EXT_LOGS=$EXT_LOGS"
} >"$OUT/env.txt"

variant_flags() {  # the variant's server flags: FLAGS_<name>, else bench/lib/variants.py's
  local name="FLAGS_$1"
  if [ -n "${!name+x}" ]; then echo "${!name}"; return 0; fi
  $PY -m bench.lib.variants | awk -F'\t' -v n="$1" '$1 == n {print $2; found=1} END {exit !found}'
}
for v in $VARIANTS; do echo "$v: $(variant_flags "$v" || echo "unknown variant")"; done >>"$OUT/env.txt"
cat "$OUT/env.txt"

# stock SGLang in $SGLANG_DIR, a patched copy of its package for the others (servers run side by side)
if patch_cli status 2>/dev/null | grep -q ": applied"; then patch_cli revert >>"$WORK/patch-cli.log" 2>&1; fi
if [ ! -f "$SITE_EXT/.patched" ]; then
  rm -rf "$SITE_EXT" && mkdir -p "$SITE_EXT"
  cp -r "$SGLANG_DIR/sglang" "$SGLANG_DIR"/sglang-*.dist-info "$SITE_EXT/"
  $PY -m sglang_prefill_ext.cli apply --sglang-version "$SGLANG_VERSION" --sglang-dir "$SITE_EXT" >>"$WORK/patch-cli.log" 2>&1 \
    && touch "$SITE_EXT/.patched" || log "could not patch $SITE_EXT: ext variants will not start"
fi

sweep_variant() {  # sweep_variant VARIANT: start its server on this worker's GPU and port, sweep, stop
  local v=$1 flags path extra=() alone=() factors=()
  if ! flags=$(variant_flags "$v"); then log "$v: unknown variant"; return; fi
  mkdir -p "$WORK/$v"
  if [ "$(left)" -lt $((SERVER_START_EST_S + 60)) ]; then
    log "$v: skipped, $(left) s left of the budget"
    echo "$v: skipped, $(left) s left of the budget" >"$WORK/$v/not-run.txt"
    return
  fi
  path=$STOCK_PATH
  if [ "${v#stock}" = "$v" ]; then
    path="$SITE_EXT:$STOCK_PATH"
    [ "$EXT_LOGS" = 1 ] && extra+=(--prefill-ext-pass-log "$WORK/$v/passes.jsonl")
  fi
  # shellcheck disable=SC2086  # flag lists
  if ! PYTHONPATH=$path start_server "$WORK/$v/server.log" $SERVER_ARGS $flags "${extra[@]}"; then
    log "$v: server did not start"
    { echo "$v: the server did not start ($flags); the end of its log:"; tail -15 "$WORK/$v/server.log"; } >"$WORK/$v/not-run.txt"
    return
  fi
  [[ " $VARIANTS " == *" stock "* ]] && [ "$v" != stock ] && alone=(--alone-from "$WORK/stock/capacity.json" --alone-wait-s 300)
  local fname="FACTORS_$v"
  [ -n "${!fname:-}" ] && factors=(--factors "${!fname}")
  # shellcheck disable=SC2086  # CAPACITY_ARGS is a flag list
  $PY -m bench.serving.capacity run --url "$URL" --label "$v" --workloads "$WORKLOADS" --out-dir "$WORK/$v" \
    --deadline "$DEADLINE" --health-timeout 60 "${alone[@]}" "${factors[@]}" $CAPACITY_ARGS || log "$v: capacity exit $?"
  stop_server
}

worker() {  # worker GPU VARIANT...: the variants one after another on one GPU
  GPU=$1
  shift
  export CUDA_VISIBLE_DEVICES=$GPU
  PORT=$((30000 + GPU))
  URL="http://127.0.0.1:$PORT"
  trap stop_server EXIT
  local v
  for v in "$@"; do sweep_variant "$v"; done
}

# deal the variants to the GPUs, stock first
ordered="stock $(echo " $VARIANTS " | sed 's/ stock / /')"
[[ " $VARIANTS " == *" stock "* ]] || ordered=$VARIANTS
declare -A dealt
i=0
for v in $ordered; do
  g=${gpus[$((i % ${#gpus[@]}))]}
  dealt[$g]="${dealt[$g]:-} $v"
  i=$((i + 1))
done
pids=()
for g in "${gpus[@]}"; do
  [ -n "${dealt[$g]:-}" ] || continue
  # shellcheck disable=SC2086  # the variant list
  worker "$g" ${dealt[$g]} >"$WORK/worker-$g.log" 2>&1 &
  pids+=($!)
  log "gpu $g:${dealt[$g]}"
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$WORK"/worker-*.log

runs=()
predicted=()
for v in $ordered; do
  [ -f "$WORK/$v/capacity.json" ] && runs+=("$v=$WORK/$v/capacity.json")
  [ -n "${PREDICTED:-}" ] && [ -f "$PREDICTED/$v.json" ] && predicted+=("$v=$PREDICTED/$v.json")
done
if [ ${#runs[@]} -gt 0 ]; then
  $PY -m bench.serving.capacity compare "${runs[@]}" ${predicted[@]+--predicted "${predicted[@]}"} \
    --out-md "$OUT/capacity.md" --out-png "$OUT/capacity.png" --out-cdf-png "$OUT/capacity-cdf.png" || log "compare failed"
fi
for f in "$WORK"/*/not-run.txt; do [ -f "$f" ] && { echo; cat "$f"; } >>"$OUT/capacity.md"; done
cp "$OUT/env.txt" "$WORK/" 2>/dev/null || true
tar -C "$WORK" -czf "$OUT/capacity-results.tar.gz" .
log "done; files in $OUT:" "$OUT"/*
