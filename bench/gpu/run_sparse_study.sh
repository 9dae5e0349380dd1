#!/usr/bin/env bash
# run_sparse_study.sh - issue 37's sparse-accuracy session on one GPU host, one STEP per device call, back to back
# (the host forgets /tmp after 30 s idle; every step after prep exits 3 at once on a cold host):
#   STEP=prep   the model (bench/gpu/run_real.sh REAL_MODEL=qwen-coder ACCURACY=0 VARIANTS="": join, convert, YaRN
#               views), then every server of the study started side by side (bench/gpu/run_ruler.sh STEP=servers:
#               `stock`, `sp0`.. one per CANDIDATES entry with its server flags, `guard`: the default selection
#               with --prefill-ext-sparse-guard GUARD [0.5]), and while they load the ops' GPU tests
#               (-m gpu tests/ops) -> $OUT/pytest_gpu.log; waits for the servers' health
#   STEP=dev    bench.accuracy.ruler_forced on the dev split at DEV_LENGTHS [130000], DEV_PROMPTS [8] cases, the
#               configs DEV_CONFIGS (candidates: CANDIDATES; a per-layer budget, MA-B=X, the bench alone
#               serves; attribution: one layer range sparse at a time), under DEV_TIMEOUT [500 s] (the rows
#               are written after every case), then the dev rule (`ruler_forced choose`) over CANDIDATES ->
#               $STUDY/chosen (config), $STUDY/chosen-flags and the server that runs it, $STUDY/chosen-server;
#               tables and JSONL in $OUT/dev.tar.gz
#   STEP=held   the RULER-style suite through the servers HELD_ASK [stock and the chosen one], one at a time
#               (ASK_TIMEOUT each), compared with HELD_EXTRA's earlier files (e.g. guard); held-out split at
#               HELD_LENGTHS [130000], HELD_PROMPTS [40] cases from case HELD_FIRST [40] (seeds no earlier run
#               has read) -> $OUT/$HELD_TAG-compare.md/.json,
#               $OUT/$HELD_TAG-jsonl.tar.gz (HELD_TAG [held]: another length in a later call keeps these)
#   STEP=ppl    perplexity and next-token accuracy (bench.accuracy.sparse_accuracy, bf16 FlashInfer path) on
#               each held-out corpus at PPL_LENGTHS [65536 131072], PPL_PROMPTS [4], the chosen config and
#               the server's default -> $OUT/ppl-<corpus>-<length>.json/.log (the servers stopped first)
# $STUDY [/tmp/sparse-study] keeps what the steps share while the host stays warm.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
PY=${PY:-python3}
OUT=${OUT:-$REPO/out-study}
STUDY=${STUDY:-/tmp/sparse-study}
MODEL=${MODEL:-/tmp/qwen-coder-hf-yarn4}
DEFAULT_CONFIG=${DEFAULT_CONFIG:-antidiagonal:0.9@x16,q}
CANDIDATES=${CANDIDATES:-antidiagonal:0.8@x16,q $DEFAULT_CONFIG antidiagonal:0.95@x16,q}
DEV_CONFIGS=${DEV_CONFIGS:-$CANDIDATES $DEFAULT_CONFIG,M7-20=0.97 $DEFAULT_CONFIG,L0-6 $DEFAULT_CONFIG,L7-13 $DEFAULT_CONFIG,L14-20 $DEFAULT_CONFIG,L21-27}
mkdir -p "$OUT" "$STUDY"
log() { echo "[study $(date +%H:%M:%S)] $*"; }
# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"

case "${STEP:-dev}" in
prep)
  REAL_MODEL=qwen-coder ACCURACY=0 VARIANTS="" OUT=$STUDY/real bash bench/gpu/run_real.sh 2>&1 | tail -15
  [ -f "$MODEL/config.json" ] || { log "no $MODEL: the conversion failed"; exit 2; }
  servers="stock: "
  : >"$STUDY/server-configs"
  n=0
  for config in $CANDIDATES; do
    servers="$servers;sp$n: $($PY -c "from bench.accuracy.ruler_forced import server_flags as f; print(' '.join(f('$config')))")"
    echo "sp$n $config" >>"$STUDY/server-configs"
    n=$((n + 1))
  done
  servers="$servers;guard: --enable-prefill-ext --prefill-ext-sparse --prefill-ext-sparse-guard ${GUARD:-0.5}"
  log "servers: $servers"
  STEP=servers SERVERS=$servers OUT=$OUT bash bench/gpu/run_ruler.sh >"$OUT/servers.log" 2>&1 &
  waiter=$!
  timeout "${TESTS_TIMEOUT:-240}" $PY -m pytest -m gpu tests/ops --ignore=tests/ops/test_backend_dispatch.py -q -rfE \
    -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
  wait "$waiter"
  cat "$OUT/servers.log"
  ;;
dev)
  [ -f "$MODEL/config.json" ] || { log "cold host: no $MODEL"; exit 3; }
  # beside the idle servers a 130K forward needs ~50 GB: unfragmented (2026-12-04's first try ran out)
  export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
  # shellcheck disable=SC2086  # lists
  timeout "${DEV_TIMEOUT:-500}" $PY -m bench.accuracy.ruler_forced run --model-dir "$MODEL" --out-dir "$STUDY/dev" \
    --split dev --lengths ${DEV_LENGTHS:-130000} --prompts "${DEV_PROMPTS:-8}" --configs $DEV_CONFIGS 2>&1 \
    | grep -v -i warn | tee "$OUT/dev.log"
  # shellcheck disable=SC2086
  $PY -m bench.accuracy.ruler_forced choose "$STUDY/dev/summary.json" --among $CANDIDATES \
    --config-out "$STUDY/chosen" >"$STUDY/chosen-flags" 2>>"$OUT/dev.log"
  awk -v c="$(cat "$STUDY/chosen")" '$2 == c {print $1}' "$STUDY/server-configs" >"$STUDY/chosen-server"
  log "chosen: $(cat "$STUDY/chosen") -> server $(cat "$STUDY/chosen-server"): $(cat "$STUDY/chosen-flags")"
  tar -C "$STUDY" -czf "$OUT/dev.tar.gz" dev chosen chosen-flags chosen-server server-configs
  ;;
held)
  [ -f /tmp/ruler-state/servers ] || { log "cold host: no servers"; exit 3; }
  chosen=$(cat "$STUDY/chosen-server" 2>/dev/null || echo sp0)
  ask=${HELD_ASK:-stock $chosen}
  log "asking: $ask (compared: stock $chosen ${HELD_EXTRA:-})"
  TAG=${HELD_TAG:-held} ASK=$ask COMPARE="stock $chosen ${HELD_EXTRA:-}" OUT=$OUT STEP=ask \
    RULER_ARGS="--split heldout --lengths ${HELD_LENGTHS:-130000} --prompts ${HELD_PROMPTS:-40} --first ${HELD_FIRST:-40}" \
    bash bench/gpu/run_ruler.sh
  ;;
ppl)
  [ -f "$MODEL/config.json" ] || { log "cold host: no $MODEL"; exit 3; }
  [ -f /tmp/ruler-state/servers ] && STEP=stop OUT=$OUT bash bench/gpu/run_ruler.sh
  chosen=$(cat "$STUDY/chosen" 2>/dev/null || echo "$DEFAULT_CONFIG")
  configs=$chosen
  [ "$chosen" = "$DEFAULT_CONFIG" ] || configs="$DEFAULT_CONFIG $chosen"
  for corpus in ${PPL_CORPORA:-package-code prose}; do
    for length in ${PPL_LENGTHS:-65536 131072}; do
      # shellcheck disable=SC2086  # lists
      $PY -m bench.accuracy.sparse_accuracy --model-dir "$MODEL" --corpus "$corpus" --length "$length" \
        --prompts "${PPL_PROMPTS:-4}" --configs $configs --json "$OUT/ppl-$corpus-$length.json" 2>&1 \
        | grep -v -i warn | tee "$OUT/ppl-$corpus-$length.log"
    done
  done
  ;;
esac
