#!/usr/bin/env bash
# apply_patch.sh VERB — apply | revert | check | status the extension's patches on an installed SGLang.
# Env: SGLANG_VERSION (required): the version the patches are for; the installed one must match.
#      SGLANG_DIR (optional): folder holding the sglang/ package; default: the one $PYTHON imports.
#      PYTHON (optional): interpreter whose SGLang is patched; default: python3.
set -euo pipefail
verb=${1:?usage: apply_patch.sh apply|revert|check|status}
: "${SGLANG_VERSION:?set SGLANG_VERSION, e.g. SGLANG_VERSION=0.5.17}"
root=$(cd "$(dirname "$0")/.." && pwd)
args=("$verb" --sglang-version "$SGLANG_VERSION")
[ -n "${SGLANG_DIR:-}" ] && args+=(--sglang-dir "$SGLANG_DIR")
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m sglang_prefill_ext.cli "${args[@]}"
