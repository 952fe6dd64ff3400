#!/usr/bin/env bash
# The test command (README): installs dependencies, builds and runs every test.
#  1. Release build + full GoogleTest suite (ctest). Where nvcc is present the same build compiles
#     the CUDA backend, its tests and benchmarks (the CUDA tests skip themselves without a GPU).
#  2. Sanitizer build (clang, AddressSanitizer + UBSan, libFuzzer coverage) + full suite
#  3. The libFuzzer targets of that same build, 30 s each (LRAGENT_FUZZ_SECONDS to change), as many
#     at once as there are jobs
# CI runs this on a 2-core machine; each phase prints the time so far.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
# 11 targets, 2 at once: ~3 min of CI's 45 (30 s since session 58: a clean run took 44.2 min at 40 s)
FUZZ_SECONDS=${LRAGENT_FUZZ_SECONDS:-30}
phase() { echo "== $* (at ${SECONDS}s)"; }

scripts/setup.sh
scripts/fetch-fixtures.sh
export LRAGENT_REQUIRE_FIXTURES=1  # the fetched tokenizer fixtures are there: a test missing one fails

CUDA=(-DLRAGENT_CUDA=OFF)
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
if [ -n "$NVCC" ]; then
  CUDA=(-DLRAGENT_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC")
  phase "release build + tests, with the CUDA backend (sm_${LRAGENT_CUDA_ARCH:-90a}; its kernels run only on a GPU)"
else
  phase "release build + tests (nvcc not found: no CUDA backend)"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${CUDA[@]}" >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

phase "sanitizer build (clang, ASan + UBSan, fuzzer coverage) + tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DLRAGENT_FUZZ=ON -DLRAGENT_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
# ReferenceReplay (every mode and adapter set through `lragent replay` against a NumPy reference)
# runs in the release phase only: under ASan it took 72 s of CI's 45 minutes, and the sanitized
# suite runs the same replay paths in its Sharing, Icarus, SpeculativeTurn and Cli tests.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS" -E '^ReferenceReplay\.'

phase "fuzzers (${FUZZ_SECONDS}s each, ${JOBS} at once)"
fuzz_one() {  # runs one target on a copy of its seeds (libFuzzer writes new inputs into its corpus)
  local target=$1 name corpus log rc=0
  name=$(basename "$target")
  corpus=$(mktemp -d)
  log=$(mktemp)
  cp -r fuzz/seeds/"${name#fuzz_}"/. "$corpus"/ 2>/dev/null || true
  # Crashes, timeouts and slow units go to build-asan/fuzz-artifacts/, not into the checkout.
  "$target" -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 -artifact_prefix="build-asan/fuzz-artifacts/$name-" \
    "$corpus" >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then echo "-- $name: $(tail -n 1 "$log")"; else echo "-- $name FAILED (exit $rc):"; tail -n 60 "$log"; fi
  rm -rf "$corpus" "$log"
  return "$rc"
}
mkdir -p build-asan/fuzz-artifacts
export -f fuzz_one
export FUZZ_SECONDS
ls build-asan/fuzz/fuzz_* | xargs -P "$JOBS" -I{} bash -c 'fuzz_one {}'
phase "all tests passed"
