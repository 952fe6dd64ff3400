#!/usr/bin/env bash
# Builds the CUDA binaries on this (CPU) machine and packs them, with the shared libraries the
# GPU machine lacks and the test fixtures from ../shared, into .devbundle/bundle.tar.xz: the GPU
# machine has nvcc and the CUDA libraries but not the project's Debian dependencies (fmt, PCRE2,
# OpenBLAS, ...), and ../shared does not travel. scripts/gpu-check.sh uses the bundle when present:
#   scripts/device-bundle.sh            # here, then run with carry [".devbundle"]
#   bash scripts/gpu-check.sh           # there
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}  # scripts/test.sh builds the CUDA backend there too (where nvcc is)
SHARED=${LRAGENT_SHARED:-../shared}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLRAGENT_CUDA=ON -DLRAGENT_CUDA_ARCH=90a \
  -DLRAGENT_BUILD_TESTS=ON >/dev/null
[ "${NO_BUILD:-0}" = 1 ] ||  # NO_BUILD=1: pack what $B already holds
  cmake --build "$B" -j"$(nproc)" --target lragent lragent_cuda_tests lragent_attention_bench lragent_model_bench lragent_gemv_bench
S=.devbundle/stage
rm -rf .devbundle
mkdir -p $S/bin $S/lib $S/shared/models $S/shared/adapters
cp "$B/lragent" "$B/lragent_cuda_tests" "$B/lragent_attention_bench" "$B/lragent_model_bench" "$B/lragent_gemv_bench" $S/bin/
strip --strip-unneeded $S/bin/*
# Non-system libraries the binaries link (CUDA's own come from the GPU machine's toolkit).
ldd "$B/lragent_cuda_tests" "$B/lragent" | awk '/=> \// {print $3}' | sort -u |
  grep -vE "/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/cuda" |
  while read -r lib; do cp -L "$lib" $S/lib/; done
# The commit the binaries were built from (the GPU machine's copy of .git can be a stale one):
# gpu-check and trace-bench report it unless LRAGENT_COMMIT says otherwise.
C=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)" ] && C="$C-dirty"
echo "$C" >$S/COMMIT
cp -r "$SHARED/models/tinystories-656k" $S/shared/models/
cp -r "$SHARED/adapters/tinystories-656k" $S/shared/adapters/
tar -C $S -cJf .devbundle/bundle.tar.xz .
cp $S/COMMIT .devbundle/COMMIT  # beside the tarball too: gpu-check reads it without unpacking
rm -rf $S
ls -la .devbundle
