# Every build option of lragent lives here.
option(LRAGENT_CUDA "Build the CUDA backend (sm_90a, needs nvcc)" OFF)
option(LRAGENT_SANITIZE "Build with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)
option(LRAGENT_FUZZ "Build libFuzzer targets (needs clang)" OFF)
option(LRAGENT_BUILD_TESTS "Build the GoogleTest suite" ON)
option(LRAGENT_BUILD_BENCH "Build the Google Benchmark microbenchmarks" ON)
option(LRAGENT_NATIVE "Tune for the build machine (-march=native)" OFF)
set(LRAGENT_CUDA_ARCH "90a" CACHE STRING "CUDA architecture(s) for the CUDA backend")
option(LRAGENT_PCH "Precompile the heavy third-party and standard headers once per target" ON)
