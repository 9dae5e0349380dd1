#!/usr/bin/env bash
# run_sparse_study.sh - issue 37's sparse-accuracy session on one GPU host, one STEP per device call, after the
# model exists (bench/gpu/run_real.sh REAL_MODEL=qwen-coder ACCURACY=0 VARIANTS="" joins and converts it):
#   STEP=tests  the ops' GPU tests (-m gpu tests/ops) -> $OUT/pytest_gpu.log
#   STEP=dev    bench.accuracy.ruler_forced on the dev split at DEV_LENGTHS [130000], DEV_PROMPTS [10] cases, the
#               configs DEV_CONFIGS (attribution: one layer range sparse at a time; candidates: CANDIDATES), then
#               the dev rule (`ruler_forced choose`) over CANDIDATES -> $STUDY/chosen (config) and
#               $STUDY/chosen-flags (server flags); tables and JSONL in $OUT/dev.tar.gz
#   STEP=held   the RULER-style suite through servers: stock (unpatched) and `sp` ($STUDY/chosen-flags, or
#               SP_FLAGS), side by side (bench/gpu/run_ruler.sh), held-out split at HELD_LENGTHS [130000],
#               HELD_PROMPTS [40] cases -> $OUT/$HELD_TAG-compare.md/.json, $OUT/$HELD_TAG-jsonl.tar.gz (HELD_TAG
#               [held]: a second length in a later call keeps the first's files); the servers stay up
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
DEFAULT_CONFIG=${DEFAULT_CONFIG:-antidiagonal:0.8@x16,q}
CANDIDATES=${CANDIDATES:-$DEFAULT_CONFIG $DEFAULT_CONFIG,c antidiagonal:0.9@x16,q antidiagonal:0.9@x16,q,c}
DEV_CONFIGS=${DEV_CONFIGS:-$CANDIDATES $DEFAULT_CONFIG,L0-6 $DEFAULT_CONFIG,L7-13 $DEFAULT_CONFIG,L14-20 $DEFAULT_CONFIG,L21-27}
mkdir -p "$OUT" "$STUDY"
log() { echo "[study $(date +%H:%M:%S)] $*"; }
# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"

case "${STEP:-dev}" in
tests)
  timeout "${TESTS_TIMEOUT:-300}" $PY -m pytest -m gpu tests/ops --ignore=tests/ops/test_backend_dispatch.py -q -rfE \
    -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
  ;;
dev)
  # shellcheck disable=SC2086  # lists
  $PY -m bench.accuracy.ruler_forced run --model-dir "$MODEL" --out-dir "$STUDY/dev" --split dev \
    --lengths ${DEV_LENGTHS:-130000} --prompts "${DEV_PROMPTS:-10}" --configs $DEV_CONFIGS 2>&1 \
    | grep -v -i warn | tee "$OUT/dev.log"
  # shellcheck disable=SC2086
  $PY -m bench.accuracy.ruler_forced choose "$STUDY/dev/summary.json" --among $CANDIDATES \
    --config-out "$STUDY/chosen" >"$STUDY/chosen-flags" 2>>"$OUT/dev.log"
  log "chosen: $(cat "$STUDY/chosen" 2>/dev/null) -> $(cat "$STUDY/chosen-flags")"
  tar -C "$STUDY" -czf "$OUT/dev.tar.gz" dev chosen chosen-flags
  ;;
held)
  flags=${SP_FLAGS:-$(cat "$STUDY/chosen-flags" 2>/dev/null || echo --enable-prefill-ext --prefill-ext-sparse)}
  log "sp: $flags"
  if [ ! -f /tmp/ruler-state/servers ]; then
    STEP=servers SERVERS="stock: ;sp: $flags" OUT=$OUT bash bench/gpu/run_ruler.sh
  fi
  TAG=${HELD_TAG:-held} RULER_ARGS="--split heldout --lengths ${HELD_LENGTHS:-130000} --prompts ${HELD_PROMPTS:-40}" STEP=ask \
    OUT=$OUT bash bench/gpu/run_ruler.sh
  ;;
ppl)
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
