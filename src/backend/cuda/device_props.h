// Properties of the CUDA device the launchers size their grids for (device_props.cu: in the
// lragent_cuda library with the kernels, which the standalone benchmarks link alone).
#pragma once

namespace lragent::cuda {

// Streaming multiprocessors of the device current at the first call (cached for the process; 132,
// an H100 SXM's, if the query fails). Split-K and GEMV launchers aim their grids at whole waves.
int sm_count();

}  // namespace lragent::cuda
