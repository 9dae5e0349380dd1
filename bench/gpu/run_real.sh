#!/usr/bin/env bash
# run_real.sh - the real-weights checks on one GPU host, in one command, for REAL_MODEL:
#   qwen-coder       Qwen2.5-Coder-1.5B-Instruct (32K native; YaRN views x2 / x4 for 64K / 128K), issue 26
#   qwen-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct (the same: 32K native, views x2 / x4), issue 37
#   smollm2          SmolLM2-135M-Instruct (8K native; YaRN views x4 / x8 / x16), issues 4, 6, 15
#  1. the model as an HF checkpoint in $HF: joined from the parts stashed in $PARTS (scripts/models/
#     model_parts.py join, sha256-checked) and converted (model_parts.py convert: qwen-coder* with the host's
#     transformers and the wheelhouse's gguf) unless $HF/config.json exists; then the YaRN views
#     $HF-yarnF for each F of YARN_VIEWS [qwen-coder*: "2 4"];
#  2. sparse accuracy: bench.accuracy.sparse_accuracy $ACCURACY_ARGS (sparse vs dense and vs the text), or one run
#     per "name: args" entry of ACCURACY_RUNS (';'-separated; a run's --model-dir, e.g. $HF-yarn4, overrides $HF),
#     results in $OUT/<name>.json/.log;
#  3. greedy identity: for each of VARIANTS, set the patch state (stock: reverted; off: patched, flag
#     off; ext*: patched with EXT_ARGS_<name>), start the server on $HF (or $HF-yarn$YARN_FACTOR)
#     with identical SERVER_ARGS, run bench.serving.greedy_check (50 prompts: chunked, cache hits, partial hits,
#     a burst), stop it; then compare every variant's outputs with the first's; or, with CHECK=passkey,
#     bench.accuracy.passkey $PASSKEY_ARGS (facts planted in real text at five depths, greedy answers, TTFT per
#     prompt) and compare every variant's recall, answers and TTFT with the first's (dense), then (REFERENCE=1)
#     the same prompts through transformers (the YaRN check) — e.g. issue 26's end-to-end run:
#       REAL_MODEL=qwen-coder YARN_FACTOR=4 CHECK=passkey ACCURACY=0 VARIANTS="stock ext_sparse" \
#       EXT_ARGS_ext_sparse="--enable-prefill-ext --prefill-ext-sparse" \
#       SERVER_ARGS="--context-length 131072 --mem-fraction-static 0.5" \
#       PASSKEY_ARGS="--length 32768 65536 131072 --keys 1 --kinds passkey constant" bash bench/gpu/run_real.sh
# Results in $OUT: greedy-<variant>.jsonl (or passkey-), greedy-compare.txt/.json, <run>.json/.log,
# env.txt, and real-logs.tar.gz (server logs with the sparse density per forward, patch CLI output).
#
# Environment [defaults]: REAL_MODEL [smollm2]; VARIANTS ["off ext stock"]; EXT_ARGS_ext [--enable-prefill-ext]
#   (any ext* variant takes EXT_ARGS_<name>); ATTENTION_BACKEND [empty: the server's default, fa3 on Hopper];
#   SERVER_ARGS [chunked prefill 1024, mem 0.3, context 8192, plus --attention-backend $ATTENTION_BACKEND
#   when set]; ACCURACY=0 skips step 2; VARIANTS="" skips step 3; BUDGET_S [540]; HF, PARTS, OUT, PORT;
#   YARN_FACTOR [empty]: serve $HF-yarn$YARN_FACTOR; YARN_VIEWS; CHECK [greedy; passkey];
#   PASSKEY_ARGS [--length 65536]; REFERENCE [1]. env.txt records the attention backend each variant's
#   server resolved.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
T_START=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
DEADLINE=$((T_START + BUDGET_S))
OUT=${OUT:-$REPO/out-real}
PY=${PY:-python3}
REAL_MODEL=${REAL_MODEL:-smollm2}
HF=${HF:-/tmp/$REAL_MODEL-hf}
PARTS=${PARTS:-/tmp/$REAL_MODEL-parts}
case $REAL_MODEL in qwen-coder*) YARN_VIEWS=${YARN_VIEWS:-2 4} ;; *) YARN_VIEWS=${YARN_VIEWS:-} ;; esac
MODEL=$HF
PORT=${PORT:-30000}
URL="http://127.0.0.1:$PORT"
VARIANTS=${VARIANTS-off ext stock}
EXT_ARGS_ext=${EXT_ARGS_ext:---enable-prefill-ext}
ATTENTION_BACKEND=${ATTENTION_BACKEND:-}
SERVER_ARGS=${SERVER_ARGS:---chunked-prefill-size 1024 --mem-fraction-static 0.3 --context-length 8192${ATTENTION_BACKEND:+ --attention-backend $ATTENTION_BACKEND}}
ACCURACY=${ACCURACY:-1}
ACCURACY_ARGS=${ACCURACY_ARGS:-}
YARN_FACTOR=${YARN_FACTOR:-}
REFERENCE=${REFERENCE:-1}
CHECK=${CHECK:-greedy}
PASSKEY_ARGS=${PASSKEY_ARGS:---length 65536}
WORK=$(mktemp -d /tmp/real-XXXXXX)
mkdir -p "$OUT"

log() { echo "[run_real $(date +%H:%M:%S) +$(($(date +%s) - T_START))s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"
# shellcheck source=bench/gpu/server.sh
source "$REPO/bench/gpu/server.sh"
trap stop_server EXIT

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  echo "VARIANTS=$VARIANTS"
  for v in $VARIANTS; do name="EXT_ARGS_$v"; [ -n "${!name:-}" ] && echo "$name=${!name}"; done
  echo "SERVER_ARGS=$SERVER_ARGS"
} | tee "$OUT/env.txt"

if [ ! -f "$HF/config.json" ]; then
  log "joining and converting $REAL_MODEL from $PARTS"
  $PY scripts/models/model_parts.py join --parts-dir "$PARTS" --out "/tmp/$REAL_MODEL-gguf" || exit 2
  gguf=$(ls "/tmp/$REAL_MODEL-gguf"/*.gguf)
  case $REAL_MODEL in
  qwen-coder*)
    # the host's transformers (the wheelhouse's 5.12.1 is untested on this GGUF) with the wheelhouse's gguf
    mkdir -p /tmp/gguf-only && ln -sfn "$SITE/gguf" "$SITE"/gguf-*.dist-info /tmp/gguf-only/
    PYTHONPATH=/tmp/gguf-only $PY scripts/models/model_parts.py convert --gguf "$gguf" --out "$HF" --check || exit 2
    ;;
  *) $PY scripts/models/model_parts.py convert --gguf "$gguf" --out "$HF" || exit 2 ;;
  esac
fi
for factor in $YARN_VIEWS $YARN_FACTOR; do
  [ -f "$HF-yarn$factor/config.json" ] \
    || $PY scripts/models/model_parts.py yarn --model-dir "$HF" --factor "$factor" --out "$HF-yarn$factor" || exit 2
done
[ -n "$YARN_FACTOR" ] && MODEL=$HF-yarn$YARN_FACTOR

if [ "$ACCURACY" = 1 ]; then
  IFS=';' read -r -a accuracy_runs <<<"${ACCURACY_RUNS:-accuracy:$ACCURACY_ARGS}"
  for run in "${accuracy_runs[@]}"; do
    name=$(echo "${run%%:*}" | tr -d ' ')
    log "sparse accuracy run $name: ${run#*:}"
    # shellcheck disable=SC2086  # the run's arguments are a list
    timeout "$(left)" $PY -m bench.accuracy.sparse_accuracy --model-dir "$MODEL" --json "$OUT/$name.json" ${run#*:} 2>&1 \
      | grep -v Warning | tee "$OUT/$name.log"
  done
fi

files=()
for v in $VARIANTS; do
  if [ "$(left)" -lt 60 ]; then log "$v: skipped, $(left) s left"; continue; fi
  set_variant "$v" || continue
  args_name="EXT_ARGS_$v"
  read -r -a extra <<<"${!args_name:-}"
  # shellcheck disable=SC2086  # SERVER_ARGS is a flag list
  if ! start_server "$WORK/server-$v.log" $SERVER_ARGS "${extra[@]}"; then continue; fi
  echo "$v: $(grep -m1 -o "attention_backend='[^']*'" "$WORK/server-$v.log" || echo "attention_backend: not logged")" \
    | tee -a "$OUT/env.txt"
  if [ "$CHECK" = passkey ]; then
    # shellcheck disable=SC2086  # PASSKEY_ARGS is a flag list
    $PY -m bench.accuracy.passkey run --url "$URL" --model-dir "$MODEL" --label "$v" --out "$OUT/passkey-$v.jsonl" \
      $PASSKEY_ARGS && files+=("$OUT/passkey-$v.jsonl")
  else
    $PY -m bench.serving.greedy_check run --url "$URL" --model-dir "$HF" --label "$v" --out "$OUT/greedy-$v.jsonl" \
      && files+=("$OUT/greedy-$v.jsonl")
  fi
  stop_server
done
if patch_cli status 2>/dev/null | grep -q ": applied"; then patch_cli revert >>"$WORK/patch-cli.log" 2>&1 || true; fi
if [ "$CHECK" = passkey ] && [ "$REFERENCE" = 1 ] && [ "$(left)" -gt 60 ]; then
  # the same prompts through transformers: equal answers say the server applies the YaRN scaling
  # shellcheck disable=SC2086  # PASSKEY_ARGS is a flag list
  timeout "$(left)" $PY -m bench.accuracy.passkey run --url transformers:cuda --model-dir "$MODEL" --label transformers \
    --out "$OUT/passkey-transformers.jsonl" $PASSKEY_ARGS && files+=("$OUT/passkey-transformers.jsonl")
fi
if [ ${#files[@]} -gt 1 ]; then
  if [ "$CHECK" = passkey ]; then check=bench.accuracy.passkey; else check=bench.serving.greedy_check; fi
  $PY -m "$check" compare "${files[@]}" --json "$OUT/$CHECK-compare.json" \
    | tee "$OUT/$CHECK-compare.txt"
fi

tar -C "$WORK" -czf "$OUT/real-logs.tar.gz" .
log "done"
