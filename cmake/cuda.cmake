# CUDA backend (sm_90a by default). Included from CMakeLists.txt when LRAGENT_CUDA=ON.
#   lragent_cuda             src/backend/cuda/*.cu (kernels and launchers; needs only cudart)
#   + lragent_lib gets src/backend/cuda/*.cpp (the CudaBackend, host C++) and links the above
#   lragent_cuda_tests       tests/cuda/*.cu, *.cpp vs the CPU reference (ctest -R Cuda)
#   lragent_attention_bench  bench/cuda/*.cu (standalone: CUDA events, JSON out)
enable_language(CUDA)
# CMake 3.25 knows no C++20 dialect flag for nvcc 13 (and with CMAKE_CXX_STANDARD_REQUIRED the
# CUDA targets inherit C++20): teach it the flag.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_ARCHITECTURES ${LRAGENT_CUDA_ARCH})
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)  # one runtime: the targets also link CUDA::cudart (shared)
find_package(CUDAToolkit REQUIRED)

# "90a" needs the -gencode spelling for wgmma/setmaxnreg; CMake's CUDA_ARCHITECTURES=90a
# produces exactly that (compute_90a, sm_90a).
set(LRAGENT_CUDA_FLAGS --expt-relaxed-constexpr -lineinfo)

file(GLOB LRAGENT_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu)
file(GLOB LRAGENT_CUDA_HOST_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cpp)
if(NOT LRAGENT_CUDA_SOURCES)
  message(STATUS "LRAGENT_CUDA=ON but src/backend/cuda has no sources yet")
  return()
endif()

add_library(lragent_cuda STATIC ${LRAGENT_CUDA_SOURCES})
target_include_directories(lragent_cuda PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(lragent_cuda PUBLIC CUDA::cudart)
target_compile_options(lragent_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${LRAGENT_CUDA_FLAGS}>)
if(LRAGENT_CUDA_ARCH MATCHES "90a")
  # The wgmma kernels (attention v5) exist only in sm_90a code; without it they are never launched.
  target_compile_definitions(lragent_cuda PRIVATE LRAGENT_CUDA_SM90A)
endif()
set_target_properties(lragent_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF)
# The backend (host C++ calling the launchers) joins the library; make_cuda_backend then works.
target_sources(lragent_lib PRIVATE ${LRAGENT_CUDA_HOST_SOURCES})
target_compile_definitions(lragent_lib PUBLIC LRAGENT_HAVE_CUDA)
target_link_libraries(lragent_lib PUBLIC lragent_cuda CUDA::cublasLt CUDA::cudart)
if(LRAGENT_CUDA_RESOURCE_USAGE)
  # Registers / shared memory / spills per kernel in the build log.
  target_compile_options(lragent_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--resource-usage>)
endif()

if(LRAGENT_BUILD_TESTS)
  find_package(GTest)
  file(GLOB LRAGENT_CUDA_TEST_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/cuda/*.cu
       ${PROJECT_SOURCE_DIR}/tests/cuda/*.cpp)
  if(GTest_FOUND AND LRAGENT_CUDA_TEST_SOURCES)
    enable_testing()
    # The test is host code only (it calls the launchers); it includes core/ headers that pull
    # fmt 9, which does not parse under nvcc in C++20 mode, so the host compiler builds it.
    set_source_files_properties(${LRAGENT_CUDA_TEST_SOURCES} PROPERTIES LANGUAGE CXX)
    add_executable(lragent_cuda_tests ${LRAGENT_CUDA_TEST_SOURCES})
    target_link_libraries(lragent_cuda_tests PRIVATE lragent_cuda lragent_lib GTest::gtest GTest::gtest_main
                                                     CUDA::cudart)
    target_include_directories(lragent_cuda_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    target_compile_definitions(lragent_cuda_tests PRIVATE LRAGENT_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                                          LRAGENT_BINARY_DIR="${PROJECT_BINARY_DIR}")
    include(GoogleTest)
    # Listing the tests needs no GPU (every test skips itself without one).
    gtest_discover_tests(lragent_cuda_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
  elseif(NOT GTest_FOUND)
    message(STATUS "GTest not found: lragent_cuda_tests not built")
  endif()
endif()

add_executable(lragent_attention_bench ${PROJECT_SOURCE_DIR}/bench/cuda/attention_bench.cu)
target_link_libraries(lragent_attention_bench PRIVATE lragent_cuda CUDA::cudart)
target_compile_options(lragent_attention_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${LRAGENT_CUDA_FLAGS}>)
# Decode GEMV versions vs the copy ceiling.
add_executable(lragent_gemv_bench ${PROJECT_SOURCE_DIR}/bench/cuda/gemv_bench.cu)
target_link_libraries(lragent_gemv_bench PRIVATE lragent_cuda CUDA::cudart)
target_compile_options(lragent_gemv_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${LRAGENT_CUDA_FLAGS}>)
# cuBLASLt's heuristic choice against its fastest candidate on few-row decode GEMMs.
add_executable(lragent_lt_small_m_bench ${PROJECT_SOURCE_DIR}/bench/cuda/lt_small_m_bench.cu)
target_link_libraries(lragent_lt_small_m_bench PRIVATE CUDA::cublasLt CUDA::cudart)
target_compile_options(lragent_lt_small_m_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${LRAGENT_CUDA_FLAGS}>)

# The whole model through the engine on the GPU (host C++ over lragent_lib's CUDA backend).
add_executable(lragent_model_bench ${PROJECT_SOURCE_DIR}/bench/cuda/model_bench.cpp)
target_link_libraries(lragent_model_bench PRIVATE lragent_lib)
