// Helpers shared by the CUDA tests (built only with -DLRAGENT_CUDA=ON).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/synthetic.h"

namespace lragent::testing {

// A small synthetic model with the tuned kernels' head_dim: 4 heads of 128 (hidden 512), 2 KV
// heads, 2 layers, positions up to 4096.
inline SyntheticSpec small_synthetic_spec() {
  SyntheticSpec s;
  s.hidden = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.layers = 2;
  s.intermediate = 1024;
  s.max_positions = 4096;
  return s;
}

// The agents tests' set-up: the small synthetic model on a backend and its three role adapters
// (r16, seed 7) with their names.
struct SyntheticAgents {
  std::unique_ptr<Backend> be;
  std::unique_ptr<LlamaModel> model;
  std::vector<std::unique_ptr<LoraAdapter>> adapters;
  std::vector<const LoraAdapter*> ptrs;  // [adapters]
  std::vector<std::string> names;        // [adapters]
};

// Fills `ag` on `be` (the adapters uploaded to it when `upload`); false, with the test failed
// naming the cause, when something cannot be made.
inline bool make_synthetic_agents(std::unique_ptr<Backend> be, bool upload, SyntheticAgents& ag) {
  ag.be = std::move(be);
  auto model = make_synthetic_model(small_synthetic_spec(), *ag.be);
  if (!model.ok()) {
    ADD_FAILURE() << model.error().message;
    return false;
  }
  ag.model = std::move(*model);
  ag.adapters = make_synthetic_adapters(ag.model->config(), 16, 7);
  for (auto& a : ag.adapters) {
    if (upload)
      if (Status st = upload_adapter(*a, *ag.be); !st.ok()) {
        ADD_FAILURE() << st.error().message;
        return false;
      }
    ag.ptrs.push_back(a.get());
    ag.names.push_back(a->name);
  }
  return true;
}

// The same on a CUDA backend of weights and caches in `dt`.
inline bool make_cuda_agents(DType dt, SyntheticAgents& ag) {
  CudaBackendOptions bo;
  bo.dtype = dt;
  auto be = make_cuda_backend(bo);
  if (!be.ok()) {
    ADD_FAILURE() << be.error().message;
    return false;
  }
  return make_synthetic_agents(std::move(*be), true, ag);
}

// Whether a CUDA device is usable here: without one the CUDA tests skip with a message.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace lragent::testing
