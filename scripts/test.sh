#!/usr/bin/env bash
# The test command (README): installs dependencies, builds and runs every test.
#  1. Release build + full GoogleTest suite (ctest)
#  2. AddressSanitizer + UBSan build + full suite
#  3. libFuzzer targets, 60 s each (LRAGENT_FUZZ_SECONDS to change)
#  4. CUDA backend compile check when nvcc is present (CUDA tests run only on a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${LRAGENT_FUZZ_SECONDS:-60}

scripts/setup.sh
scripts/fetch-fixtures.sh
export LRAGENT_REQUIRE_FIXTURES=1  # the fetched tokenizer fixtures are there: a test missing one fails

echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

echo "== sanitizer build (ASan + UBSan) + tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLRAGENT_SANITIZE=ON -DLRAGENT_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS"

echo "== fuzzers (${FUZZ_SECONDS}s each)"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DLRAGENT_FUZZ=ON \
  -DLRAGENT_BUILD_TESTS=OFF -DLRAGENT_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j "$JOBS"
for target in build-fuzz/fuzz/fuzz_*; do
  name=$(basename "$target")
  corpus=$(mktemp -d)
  cp -r fuzz/seeds/"${name#fuzz_}"/. "$corpus"/ 2>/dev/null || true
  echo "-- $name"
  "$target" -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 "$corpus" 2>&1 | tail -n 2
  rm -rf "$corpus"
done

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== CUDA compile check (sm_${LRAGENT_CUDA_ARCH:-90a}; kernels run only on a GPU)"
  cmake -S . -B build-cuda -G Ninja -DLRAGENT_CUDA=ON -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
    -DCMAKE_BUILD_TYPE=Release -DLRAGENT_BUILD_BENCH=OFF >/dev/null
  # Only the CUDA targets: the CPU suite already ran above.
  cmake --build build-cuda -j "$JOBS" --target lragent_cuda lragent_cuda_tests lragent_attention_bench lragent_gemv_bench \
    lragent_lt_small_m_bench
  ./build-cuda/lragent_cuda_tests 2>&1 | tail -n 3  # skips with a message without a GPU
else
  echo "== CUDA compile check skipped: nvcc not found"
fi
echo "== all tests passed"
