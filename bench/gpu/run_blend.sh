#!/usr/bin/env bash
# run_blend.sh - issue 40's chunk-blending TTFT A/B on one GPU host, in one command.
#
# The rag-chunks workload (bench/serving/workloads.py: RAG_QUESTIONS questions, each retrieving k = 8 of
# 200 chunks of 512-2,048 tokens by Zipf popularity, in relevance order, after a shared 256-token system
# prompt; chunk_spans marks the chunks, a field stock SGLang ignores) through stock, the extension's
# prefix tree alone (ext) and the extension with --prefill-ext-blend at each ratio of RATIOS
# (ext_blend<ratio digits>), on Qwen2.5-Coder-1.5B's shape with dummy weights. bench/gpu/run_ab.sh starts
# the servers, runs bench.serving.ttft_bench and writes the report (stock/variant TTFT ratios) under $OUT.
# A variant whose server does not start is skipped (--prefill-ext-blend is served on SGLang 0.5.17 only:
# docs/BLEND.md). The summary's chunk_tokens_seen_before / chunk_tokens_in_a_prefix_seen_before say what
# blending could reuse and what a prefix cache can.
#
# Environment [defaults]: RATIOS ["0.15"]; RAG_QUESTIONS [200]; MODEL [bench/models/qwen2.5-coder-1.5b-dummy];
# SERVER_ARGS [dummy weights, no tokenizer, 32K context, stock's default backend, 0.8 of the memory: the
# 200 chunks (~256K tokens, 7.3 GB of KV) fit]; BENCH_ARGS, added after the workload's []; BUDGET_S [520];
# OUT [./out-blend]; VARIANTS [stock ext ext_blend...]; the rest as run_ab.sh.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RATIOS=${RATIOS:-0.15}
variants="stock ext"
for ratio in $RATIOS; do
  name="ext_blend${ratio//./}"
  variants+=" $name"
  export "EXT_ARGS_$name=--enable-prefill-ext --prefill-ext-blend --prefill-ext-blend-recompute-ratio $ratio"
done
export VARIANTS=${VARIANTS:-$variants}
export WORKLOADS=rag-chunks PRESSURE=0
export MODEL=${MODEL:-$REPO/bench/models/qwen2.5-coder-1.5b-dummy}
export SERVER_ARGS=${SERVER_ARGS:---load-format dummy --skip-tokenizer-init --context-length 32768 --mem-fraction-static 0.8}
export BENCH_ARGS="--rag-chunks-questions ${RAG_QUESTIONS:-200} ${BENCH_ARGS:-}"
export OUT=${OUT:-$REPO/out-blend}
exec bash "$REPO/bench/gpu/run_ab.sh"
