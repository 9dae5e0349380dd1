#!/usr/bin/env bash
# fa3_part.sh - one call of the sequence that brings fa3 (stock's default attention backend on
# Hopper) to the offline GPU host: scripts/gpu/make_fa3_parts.sh's header lists the calls and what
# each carries. Stashes the carried .gpu/fa3 parts in /tmp/fa3 and sources stack.sh, which unpacks
# SGLang's site (first call) and joins the parts into it once all are there.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PY:-python3}
# shellcheck source=bench/gpu/stack.sh
source "$REPO/bench/gpu/stack.sh"
