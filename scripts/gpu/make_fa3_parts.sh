#!/usr/bin/env bash
# make_fa3_parts.sh - bring SGLang's default Hopper attention backend (fa3) to the offline H200 host.
#
# Stock SGLang 0.5.17 picks `--attention-backend fa3` by default on Hopper for Llama/Qwen-style
# models (ServerArgs._get_default_attn_backend). Its kernels live in sgl_kernel's flash_ops.abi3.so
# (1.12 GB, dropped from the slim wheelhouse), so they have to travel separately: compressed with
# zstd (~220 MB) and cut into parts that fit one transfer to the GPU host (64 MiB each, next to what else travels).
# The host has no zstd binary; the python `zstandard` wheel (5.5 MB) travels with the first part.
#
# Usage (here, with PyPI):  scripts/gpu/make_fa3_parts.sh [DIR [FIRST_MB [PART_MB]]]
#   DIR       output folder [.gpu/fa3] (git-ignored)
#   FIRST_MB  size of part p0, carried with the SGLang site tarball and the kernel cache [4.4]
#   PART_MB   size of every later part, each carried alone [51]
# Writes DIR/p0, DIR/q0 ... DIR/qN, DIR/PARTS (their names, in order), DIR/SHA256 (of the whole .zst)
# and DIR/zstandard-*.whl (the host has no zstd binary).
#
# On the host (bench/gpu/README.md; each call within the host's 30 s warm window, ~5 s each), every call
# runs `bash bench/gpu/fa3_part.sh`, which stashes the carried parts in /tmp/fa3 and, through
# bench/gpu/stack.sh, unpacks the site and joins the parts once all are there (sha256-checked):
#   call 1: carry .whl/sglang-site-cp312.tar.xz .gpu/jit-cache-sglang-0.5.17-sm90.tar.gz
#                 .gpu/fa3/p0 .gpu/fa3/PARTS .gpu/fa3/SHA256 .gpu/fa3/zstandard-*.whl
#   call k: carry .gpu/fa3/q<k-2>
# Then run_ab.sh and the other scripts find fa3 in the unpacked site: stock's default backend.
set -euo pipefail
DEST=${1:-.gpu/fa3}
FIRST_MB=${2:-4.4}
PART_MB=${3:-51}
SGL_KERNEL=${SGL_KERNEL:-sglang-kernel==0.4.5}
command -v zstd >/dev/null || { echo "needs zstd here (apt-get install zstd)"; exit 2; }
mkdir -p "$DEST"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" "$SGL_KERNEL"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$DEST" zstandard
unzip -q -o "$tmp"/sglang_kernel-*.whl 'sgl_kernel/flash_ops.abi3.so' -d "$tmp"
zstd -q -T0 -6 "$tmp/sgl_kernel/flash_ops.abi3.so" -o "$tmp/flash_ops.zst"
first=$(python3 -c "print(int($FIRST_MB * 1000000))")
part=$(python3 -c "print(int($PART_MB * 1000000))")
rm -f "$DEST"/p0 "$DEST"/q*
head -c "$first" "$tmp/flash_ops.zst" > "$DEST/p0"
tail -c +"$((first + 1))" "$tmp/flash_ops.zst" | split -b "$part" -d -a 1 - "$DEST/q"
sha256sum < "$tmp/flash_ops.zst" | cut -d' ' -f1 > "$DEST/SHA256"
(cd "$DEST" && ls p0 q* | tr '\n' ' ' > PARTS)
ls -l "$DEST"
echo "parts: $(cat "$DEST/PARTS"); whole .zst sha256 $(cat "$DEST/SHA256")"
