#!/usr/bin/env bash
# run_sparse_study.sh - issue 37's sparse-accuracy session on one GPU host, one STEP per device call, back to back
# (the host forgets /tmp after 30 s idle; every step after prep exits 3 at once on a cold host), for REAL_MODEL
# [qwen-coder; or qwen-coder-0.5b] served as MODEL [/tmp/$REAL_MODEL-hf-yarn$YARN_FACTOR; YARN_FACTOR 4, 2 or
# empty (native, 32K)] at a context of 32768 x YARN_FACTOR, prompts of LENGTH [130000 / 65000 / 32500: a prompt
# and its answer within that context]:
#   STEP=prep    the model (bench/gpu/run_real.sh REAL_MODEL=$REAL_MODEL ACCURACY=0 VARIANTS="": join, convert, YaRN
#                views x2 and x4), and meanwhile the GPU tests of ops and of the bench's bf16 oracle (-m gpu tests/ops
#                tests/test_sparse_accuracy.py) -> $OUT/pytest_gpu.log
#   STEP=dev     bench.accuracy.ruler_forced on the dev split at DEV_LENGTHS [LENGTH], DEV_PROMPTS [8] cases, the
#                configs DEV_CONFIGS [CANDIDATES; attribution: add LA-B configs, one layer range sparse at a time],
#                under DEV_TIMEOUT [500 s] (the rows are written after every case), DEV_ARGS [none] more
#                ruler_forced options (e.g. "--guard 1e-9 --guard-every 8": the guard's bound is read off the
#                dev rows with `ruler_forced guarded`), then the dev rule
#                (`ruler_forced choose --by CHOOSE_BY` [density; forward_s: the fastest passing one, for candidates
#                differing in stride]) over CANDIDATES -> $STUDY/chosen (config) and $STUDY/chosen-flags; tables
#                and JSONL in $OUT/dev.tar.gz
#   STEP=oracle  the oracle bound (issue 37): bench.accuracy.ruler_forced --emulate --tf32 (fp32 model, exact
#                attention over the kept blocks) at ORACLE_LENGTHS [65000], ORACLE_PROMPTS [6] cases of
#                ORACLE_SPLIT [heldout] from ORACLE_FIRST [120] (cases no report reads: a diagnostic, never a
#                default's data), the configs ORACLE_CONFIGS [selection from the exact attention at two
#                masses, and the served selection], under ORACLE_TIMEOUT [400 s] -> $OUT/oracle-$ORACLE_FIRST.tar.gz
#                (runs from other first cases: `ruler_forced merge`); ORACLE_EMULATE=0: the same cases in bf16
#                (dense SDPA, configs through FlashInfer as the server runs them, oracle:MASS from the Triton exact
#                mass: ~1 s a 65K forward against the emulation's ~37 s) -> oracle-bf16-$ORACLE_FIRST;
#                ORACLE_ARGS [none]: more ruler_forced options (e.g. "--guard 1e-9 --guard-every 4": every
#                checked layer's guard statistic in the rows, for `ruler_forced guarded`)
#   STEP=servers the held-out step's servers side by side (bench/gpu/run_ruler.sh STEP=servers, on MODEL, once
#                the servers of an earlier view are stopped): `stock`, `sp0`
#                running the chosen config (DEFAULT_CONFIG without a dev step) plus SP0_ARGS [none; e.g. the
#                guard's flags, its statistic then logged per checked layer], and with GUARD set `guard`:
#                the chosen config with --prefill-ext-sparse-guard GUARD; waits for their health
#   STEP=held    the RULER-style suite through the servers HELD_ASK [stock sp0], one at a time (ASK_TIMEOUT
#                each), compared with HELD_EXTRA's files (e.g. guard); held-out split at HELD_LENGTHS [LENGTH],
#                HELD_PROMPTS [40] cases from case HELD_FIRST [40] (seeds no earlier run has read) ->
#                $OUT/$HELD_TAG-compare.md/.json, $OUT/$HELD_TAG-jsonl.tar.gz (HELD_TAG [held]: another length
#                in a later call keeps these)
#   STEP=ppl     perplexity and next-token accuracy (bench.accuracy.sparse_accuracy, bf16 FlashInfer path) on
#                each held-out corpus at PPL_LENGTHS [65536 131072 on the x4 view; else the view's context],
#                PPL_PROMPTS [4], the chosen config and the server's default -> $OUT/ppl-<corpus>-<length>.json/.log
#                (the servers stopped first)
# $STUDY [/tmp/sparse-study-$REAL_MODEL] keeps what the steps share while the host stays warm (the dev pick:
# one per model, whichever view serves); $STATE [/tmp/ruler-state] run_ruler.sh's servers and answers.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
PY=${PY:-python3}
OUT=${OUT:-$REPO/out-study}
REAL_MODEL=${REAL_MODEL:-qwen-coder}
STUDY=${STUDY:-/tmp/sparse-study-$REAL_MODEL}
STATE=${STATE:-/tmp/ruler-state}
export STATE
YARN_FACTOR=${YARN_FACTOR-4}
MODEL=${MODEL:-/tmp/$REAL_MODEL-hf${YARN_FACTOR:+-yarn$YARN_FACTOR}}
CONTEXT=$((32768 * ${YARN_FACTOR:-1}))
case ${YARN_FACTOR:-1} in
4) LENGTH=${LENGTH:-130000} PPL_LENGTHS=${PPL_LENGTHS:-65536 131072} ;;
2) LENGTH=${LENGTH:-65000} PPL_LENGTHS=${PPL_LENGTHS:-65536} ;;
1) LENGTH=${LENGTH:-32500} PPL_LENGTHS=${PPL_LENGTHS:-32768} ;;
*) echo "YARN_FACTOR=$YARN_FACTOR: 4, 2 or empty (the views run_real.sh makes)" >&2 && exit 2 ;;
esac
DEFAULT_CONFIG=${DEFAULT_CONFIG:-antidiagonal:0.9@x4,q}
# per-layer budgets: the middle layers, where the loss is (2026-12-04's attribution), at a higher mass
CANDIDATES=${CANDIDATES:-$DEFAULT_CONFIG antidiagonal:0.8@x16,q,M7-20=0.95 antidiagonal:0.8@x16,q,M7-20=0.97 antidiagonal:0.9@x16,q,M7-20=0.97 antidiagonal:0.7@x16,q,M7-20=0.95}
DEV_CONFIGS=${DEV_CONFIGS:-$CANDIDATES}
mkdir -p "$OUT" "$STUDY"
log() { echo "[study $(date +%H:%M:%S)] $*"; }
# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"

case "${STEP:-dev}" in
prep)
  timeout "${TESTS_TIMEOUT:-240}" $PY -m pytest -m gpu tests/ops tests/test_sparse_accuracy.py --ignore=tests/ops/test_backend_dispatch.py -q -rfE \
    -p no:cacheprovider >"$OUT/pytest_gpu.log" 2>&1 &
  tests=$!
  REAL_MODEL=$REAL_MODEL ACCURACY=0 VARIANTS="" OUT=$STUDY/real bash bench/gpu/run_real.sh 2>&1 | tail -15
  wait "$tests"
  tail -15 "$OUT/pytest_gpu.log"
  [ -f "$MODEL/config.json" ] || { log "no $MODEL: the conversion failed"; exit 2; }
  ;;
dev)
  [ -f "$MODEL/config.json" ] || { log "cold host: no $MODEL"; exit 3; }
  # beside the idle servers a 130K forward needs ~50 GB: unfragmented (2026-12-04's first try ran out)
  export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
  # shellcheck disable=SC2086  # lists
  timeout "${DEV_TIMEOUT:-500}" $PY -m bench.accuracy.ruler_forced run --model-dir "$MODEL" --out-dir "$STUDY/dev" \
    --split dev --lengths ${DEV_LENGTHS:-$LENGTH} --prompts "${DEV_PROMPTS:-8}" --configs $DEV_CONFIGS ${DEV_ARGS:-} 2>&1 \
    | grep -v -i warn | tee "$OUT/dev.log"
  # shellcheck disable=SC2086
  $PY -m bench.accuracy.ruler_forced choose "$STUDY/dev/summary.json" --among $CANDIDATES --by "${CHOOSE_BY:-density}" \
    --config-out "$STUDY/chosen" >"$STUDY/chosen-flags" 2>>"$OUT/dev.log"
  log "chosen: $(cat "$STUDY/chosen"): $(cat "$STUDY/chosen-flags")"
  tar -C "$STUDY" -czf "$OUT/dev.tar.gz" dev chosen chosen-flags
  ;;
oracle)
  [ -f "$MODEL/config.json" ] || { log "cold host: no $MODEL"; exit 3; }
  [ -f "$STATE/servers" ] && STEP=stop OUT=$OUT bash bench/gpu/run_ruler.sh
  export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
  first=${ORACLE_FIRST:-120}
  emulate="--emulate --tf32" && [ "${ORACLE_EMULATE:-1}" = 0 ] && emulate="" && first=bf16-$first
  # shellcheck disable=SC2086  # lists
  timeout "${ORACLE_TIMEOUT:-400}" $PY -m bench.accuracy.ruler_forced run --model-dir "$MODEL" $emulate \
    --out-dir "$STUDY/oracle-$first" --split "${ORACLE_SPLIT:-heldout}" --lengths ${ORACLE_LENGTHS:-65000} \
    --prompts "${ORACLE_PROMPTS:-6}" --first "${ORACLE_FIRST:-120}" \
    --configs ${ORACLE_CONFIGS:-oracle:0.9@q oracle:0.95@q $DEFAULT_CONFIG} ${ORACLE_ARGS:-} 2>&1 | grep -v -i warn | tee "$OUT/oracle.log"
  tar -C "$STUDY" -czf "$OUT/oracle-$first.tar.gz" "oracle-$first"
  ;;
servers)
  [ -f "$MODEL/config.json" ] || { log "cold host: no $MODEL"; exit 3; }
  chosen=$(cat "$STUDY/chosen" 2>/dev/null || echo "$DEFAULT_CONFIG")
  flags=$($PY -c "from bench.accuracy.ruler_forced import server_flags as f; print(' '.join(f('$chosen')))")
  servers="stock: ;sp0: $flags${SP0_ARGS:+ $SP0_ARGS}"
  [ -n "${GUARD:-}" ] && servers="$servers;guard: $flags --prefill-ext-sparse-guard $GUARD"
  [ -f "$STATE/servers" ] && STEP=stop OUT=$OUT bash bench/gpu/run_ruler.sh
  log "chosen: $chosen; servers on $MODEL: $servers"
  STEP=servers SERVERS=$servers MODEL=$MODEL CONTEXT=$CONTEXT OUT=$OUT bash bench/gpu/run_ruler.sh
  echo "$MODEL" >"$STATE/model"
  ;;
held)
  [ -f "$STATE/servers" ] || { log "cold host: no servers"; exit 3; }
  served=$(cat "$STATE/model" 2>/dev/null)
  [ "$served" = "$MODEL" ] || { log "the servers run $served, not $MODEL (YARN_FACTOR?)"; exit 3; }
  ask=${HELD_ASK:-stock sp0}
  log "asking: $ask (compared: stock sp0 ${HELD_EXTRA:-})"
  TAG=${HELD_TAG:-held} ASK=$ask COMPARE="stock sp0 ${HELD_EXTRA:-}" MODEL=$MODEL OUT=$OUT STEP=ask \
    RULER_ARGS="--split heldout --lengths ${HELD_LENGTHS:-$LENGTH} --prompts ${HELD_PROMPTS:-40} --first ${HELD_FIRST:-40}" \
    bash bench/gpu/run_ruler.sh
  ;;
ppl)
  [ -f "$MODEL/config.json" ] || { log "cold host: no $MODEL"; exit 3; }
  [ -f "$STATE/servers" ] && STEP=stop OUT=$OUT bash bench/gpu/run_ruler.sh
  chosen=$(cat "$STUDY/chosen" 2>/dev/null || echo "$DEFAULT_CONFIG")
  configs=$chosen
  [ "$chosen" = "$DEFAULT_CONFIG" ] || configs="$DEFAULT_CONFIG $chosen"
  for corpus in ${PPL_CORPORA:-package-code prose}; do
    for length in $PPL_LENGTHS; do
      # shellcheck disable=SC2086  # lists
      $PY -m bench.accuracy.sparse_accuracy --model-dir "$MODEL" --corpus "$corpus" --length "$length" \
        --prompts "${PPL_PROMPTS:-4}" --configs $configs --json "$OUT/ppl-$corpus-$length.json" 2>&1 \
        | grep -v -i warn | tee "$OUT/ppl-$corpus-$length.log"
    done
  done
  ;;
esac
