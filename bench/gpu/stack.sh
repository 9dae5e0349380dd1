# stack.sh - sourced by the GPU scripts: make SGLang 0.5.17 and its compiled kernels importable.
#
# On the offline H200 host: unpack .whl/sglang-site-cp312.tar.xz to $SITE and the kernel cache
# .gpu/jit-cache-sglang-0.5.17-sm90.tar.gz (+ .gpu/triton-ops-cache.tgz, the sparse path's Triton
# kernels as bench/gpu/run_ops.sh packs them) to $JIT, once per warm host (shared/gpu/README.md's
# recipe). On a host where SGLang 0.5.17 is pip-installed, leave those files out (or INSTALL=0).
# Needs REPO and PY; sets SGLANG_DIR (the folder holding sglang/) and the environment.
# fa3 (stock's default attention backend on Hopper) travels in parts (scripts/gpu/make_fa3_parts.sh,
# bench/gpu/fa3_part.sh): carried parts are stashed in $FA3_PARTS and, once all are there, joined
# into the unpacked site (sha256-checked); SGLANG_BACKEND says which default the server will get.
# Environment: SITE, JIT, FA3_PARTS [/tmp/site, /tmp/jit, /tmp/fa3]; INSTALL=auto|0 [auto];
#   JIT_BUILD [0]: 1 lets FlashInfer compile a kernel missing from the cache (else it raises) and
#   touches $JIT/.start, so the caller can pack what it compiled.
SITE=${SITE:-/tmp/site}
JIT=${JIT:-/tmp/jit}
INSTALL=${INSTALL:-auto}
SITE_TARBALL=${SITE_TARBALL:-$REPO/.whl/sglang-site-cp312.tar.xz}
JIT_TARBALL=${JIT_TARBALL:-$REPO/.gpu/jit-cache-sglang-0.5.17-sm90.tar.gz}

stack_log() { echo "[stack $(date +%H:%M:%S)] $*"; }

if [ "$INSTALL" != 0 ] && { [ -f "$SITE_TARBALL" ] || [ -f "$SITE/sglang/version.py" ]; }; then
  if [ ! -f "$SITE/sglang/version.py" ]; then
    stack_log "unpacking $(basename "$SITE_TARBALL") to $SITE"
    mkdir -p "$SITE" && tar -C "$SITE" -xJf "$SITE_TARBALL"
  else
    stack_log "$SITE already holds sglang (warm host): not unpacking again"
  fi
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
  SGLANG_DIR=$SITE
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  SGLANG_DIR=$($PY -c 'import importlib.util as u, pathlib as p; print(p.Path(next(iter(u.find_spec("sglang").submodule_search_locations))).parent)')
fi
if [ "$INSTALL" != 0 ] && { [ -f "$JIT_TARBALL" ] || [ -d "$JIT/flashinfer-aot" ]; }; then
  if [ ! -d "$JIT/flashinfer-aot" ]; then
    stack_log "unpacking the kernel cache to $JIT"
    mkdir -p "$JIT" && tar -C "$JIT" -xzf "$JIT_TARBALL"
  fi
  if [ -f "$REPO/.gpu/triton-ops-cache.tgz" ]; then tar -C "$JIT" -xzf "$REPO/.gpu/triton-ops-cache.tgz"; fi
  # once per site: overwriting a .so a running server has mapped crashes it (SIGSEGV in the next call into it)
  aot=$SGLANG_DIR/flashinfer/data/aot
  if [ ! -f "$aot/.from-jit-cache" ]; then
    mkdir -p "$aot" && cp -r "$JIT/flashinfer-aot/." "$aot/" && touch "$aot/.from-jit-cache"
  fi
  export TVM_FFI_CACHE_DIR=$JIT/tvm-ffi TRITON_CACHE_DIR=$JIT/triton FLASHINFER_WORKSPACE_BASE=$JIT/fi
  if [ "${JIT_BUILD:-0}" = 1 ]; then
    unset FLASHINFER_DISABLE_JIT
    mkdir -p "$JIT/triton" && touch "$JIT/.start"  # what this run compiles is newer than .start
  else
    export FLASHINFER_DISABLE_JIT=1
  fi
fi
FA3_PARTS=${FA3_PARTS:-/tmp/fa3}
if [ -d "$REPO/.gpu/fa3" ]; then mkdir -p "$FA3_PARTS" && cp -n "$REPO"/.gpu/fa3/* "$FA3_PARTS"/; fi
if [ "$SGLANG_DIR" = "$SITE" ] && [ ! -f "$SITE/sgl_kernel/flash_ops.abi3.so" ] && [ -f "$FA3_PARTS/PARTS" ]; then
  if [ ! -d "$FA3_PARTS/zst" ]; then
    $PY -m pip install -q --no-index --no-deps --target "$FA3_PARTS/zst" "$FA3_PARTS"/zstandard-*.whl
  fi
  PYTHONPATH="$FA3_PARTS/zst" $PY "$REPO/bench/gpu/fa3_join.py" "$FA3_PARTS" "$SITE/sgl_kernel/flash_ops.abi3.so" || true
fi
if [ -f "$SGLANG_DIR/sgl_kernel/flash_ops.abi3.so" ]; then
  stack_log "fa3 present: a server without --attention-backend gets stock's Hopper default (fa3)"
else
  stack_log "fa3 absent (sgl_kernel/flash_ops.abi3.so): pass --attention-backend flashinfer, or bring fa3 first"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

# patch_cli apply|revert|status: the project's patch CLI on the SGLang in use
patch_cli() { $PY -m sglang_prefill_ext.cli "$1" --sglang-version "${SGLANG_VERSION:-0.5.17}" --sglang-dir "$SGLANG_DIR"; }
