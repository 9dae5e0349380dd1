#!/usr/bin/env bash
# apply_patch.sh {apply|revert|check|status} [SGLANG_VERSION] [SGLANG_DIR] [CLI options]
# Patches (or reverts, checks, reports on) the SGLang that $PYTHON (default python3) imports, or the
# one in SGLANG_DIR (the folder holding sglang/), with this checkout's patches/. Installs nothing: it
# runs the package's CLI, `python -m sglang_prefill_ext.cli`, with the checkout on PYTHONPATH.
# SGLANG_VERSION, when given (empty: not given), must be the version found, else it is refused
# (exit 2, nothing written); so is a $PYTHON without SGLang when no SGLANG_DIR is given. Options
# after them (e.g. `revert --force-stock --wheel PATH`) go to the CLI as they are.
# `make apply|revert|check|status` calls this script.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
if [ $# -lt 1 ]; then
  echo "usage: $0 {apply|revert|check|status} [SGLANG_VERSION] [SGLANG_DIR] [CLI options]" >&2
  exit 2
fi
verb=$1
shift
args=()
if [ $# -gt 0 ] && [[ $1 != -* ]]; then
  [ -z "$1" ] || args+=(--sglang-version "$1")
  shift
fi
if [ $# -gt 0 ] && [[ $1 != -* ]]; then
  [ -z "$1" ] || args+=(--sglang-dir "$1")
  shift
fi
args+=("$@")
# Without a folder, the SGLang is $PY's: say which knob picks another interpreter (the CLI, run by $PY,
# only knows its own --sglang-dir).
if [[ " ${args[*]} " != *" --sglang-dir "* ]] &&
  ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)" 2>/dev/null; then
  echo "$0: $PY imports no sglang package: name an interpreter that has it, PYTHON=/path/to/python $0 $verb ...," \
    "or give the folder holding sglang/ as the third argument" >&2
  exit 2
fi
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m sglang_prefill_ext.cli "$verb" "${args[@]}"
# The patched SGLang imports this package; say so when $PY finds it only through the line above
# (sys.path[0] is the current folder under -c: left out, as it is for a server started elsewhere).
if [ "$verb" = apply ] && ! "$PY" -c "import sys; del sys.path[0]; import sglang_prefill_ext" 2>/dev/null; then
  echo "note: $PY imports sglang_prefill_ext only with PYTHONPATH=$repo, and the patched SGLang" \
    "needs it: run SGLang with that PYTHONPATH, or $PY -m pip install $repo" >&2
fi
