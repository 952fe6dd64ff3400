// Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over the Backend interface.
// One forward pass serves a batch of sequences of different lengths, each at its own
// position (prefill chunks and decode steps mixed), each with its own adapter or none.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_binding.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace lragent {

struct LoraAdapter;  // model/lora.h
class AdapterRegistry;

struct LayerWeights {
  TensorView attn_norm;               // [hidden]
  TensorView wq, wk, wv, wo;          // [heads*hd, hidden], [kv*hd, hidden] x2, [hidden, heads*hd]
  TensorView bq, bk, bv;              // biases (Qwen2 / attention_bias), data null when absent
  TensorView bo;                      // [hidden] o_proj bias (Llama, Qwen3 with attention_bias), data null when absent
  TensorView q_norm, k_norm;          // [hd] per-head RMSNorm weights of q and k (Qwen3), data null when absent
  TensorView mlp_norm;                // [hidden]
  TensorView w_gate, w_up, w_down;    // [inter, hidden] x2, [hidden, inter]
};

struct ModelWeights {
  TensorView embed;       // [vocab, hidden]
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden] (== embed when tied)
  std::vector<LayerWeights> layers;
};

// One sequence in a forward batch.
struct SeqInput {
  const int32_t* tokens = nullptr;  // [n_tokens] new tokens
  int n_tokens = 0;
  int64_t start_pos = 0;            // position of tokens[0] (tokens already cached)
  KvBinding* kv = nullptr;
  const LoraAdapter* adapter = nullptr;  // null: base model
  bool all_logits = false;          // logits for every new token; else only the last
  // Decode lookahead: >= 0 when the (single) new token is row feed_row of the pick of the pass
  // launched before this one (LlamaModel::launch_sample), still on the device; `tokens` is not read.
  int feed_row = -1;
  // ICaRus (--kv-share icarus): the new tokens run through the base model (the logical encoder;
  // `adapter` must be null), which stores their entries, and again through this adapter (the
  // logical decoder), which only reads the entries, its own rows' included; the logits rows
  // (every row when all_logits, else the last) are the decoder's. Null: one ordinary pass.
  const LoraAdapter* decoder = nullptr;
};

// Counters for tests and benchmarks.
struct ForwardStats {
  int64_t lora_shrink_rows = 0;  // rows multiplied by some A (x·A), summed over modules
  int64_t lora_shrink_calls = 0; // x·A GEMMs issued (one per shared-A group per module)
};

// Weight placement progress: bytes placed on the backend so far, of `total`; called after each
// tensor and once at the end with done == total (a CPU backend reads the mapped files in place:
// only that last call).
using LoadProgress = std::function<void(int64_t done, int64_t total)>;

// One caller at a time: a pass uses the backend's scratch, its deferred picks and this model's
// counters, so callers that share a model take turns (the server holds a lock around the engine).
class LlamaModel {
 public:
  // Loads config.json + safetensors from `dir`. Missing/mis-shaped tensors are errors naming them.
  static Result<std::unique_ptr<LlamaModel>> load(const std::string& dir, Backend& backend,
                                                  const LoadProgress& progress = {});
  // Wraps weights the caller built (synthetic models); `owned` keeps their memory alive.
  static Result<std::unique_ptr<LlamaModel>> from_weights(ModelConfig cfg, ModelWeights weights,
                                                          std::vector<Tensor> owned, Backend& backend);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  Backend& backend() const { return be_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  const std::string& source() const { return source_; }

  // Runs the batch; returns logits [rows, vocab]: for each sequence in order, one row per new
  // token if all_logits else one row (its last token). Validates ids and positions first.
  // `registry` resolves shared-A groups (may be null).
  Result<Tensor> forward(const std::vector<SeqInput>& batch, const AdapterRegistry* registry = nullptr);
  // The same pass, but each logits row is turned into a token id on the backend's device
  // (Backend::sample_rows; rules in backend/sampling_ref.h), so only the ids come back, one per
  // row forward() would return. `rows` gives each of those rows its parameters (its u drawn on
  // the host); a size other than the row count is an error.
  Result<std::vector<int32_t>> forward_sample(const std::vector<SeqInput>& batch, std::span<const RowSampling> rows);
  // forward_sample, greedy on every row: the id of each row's largest value (ties: lowest id).
  Result<std::vector<int32_t>> forward_argmax(const std::vector<SeqInput>& batch);
  // Decode lookahead: forward_sample's pass, launched but not waited for; its ids stay on the
  // backend until take_picks (oldest pass first). Meanwhile the caller may launch the next pass,
  // whose sequences name with SeqInput::feed_row the row of this pass's pick that is their token:
  // on a GPU the host then builds step t+1 while the device runs step t. At most
  // Backend::kMaxDeferredPicks passes wait for take_picks.
  Status launch_sample(const std::vector<SeqInput>& batch, std::span<const RowSampling> rows);
  Result<std::vector<int32_t>> take_picks();
  // Waits for and drops the picks of every launched pass not taken yet: a caller that leaves a
  // lookahead on an error calls it, so that no stale pick reaches the next caller's take_picks.
  void discard_picks();
  size_t pending_picks() const { return deferred_rows_.size(); }
  // Runs only layers [0, n_layers) of the batch and stores their cache entries (the bindings
  // decide which); no logits, and the last layer's attention and MLP are skipped (they feed
  // nothing stored). The entries are those forward() would store for these layers: a DroidSpeak
  // catch-up needs its private layers' entries, and those depend only on the layers below them.
  Status forward_kv(const std::vector<SeqInput>& batch, int n_layers);

  // Optional hook to capture per-layer hidden states (fidelity tools): called with the
  // residual stream [rows, hidden] entering each layer, and with layer == num_layers at the end.
  using HiddenHook = void (*)(void* ctx, int layer, const TensorView& hidden);
  void set_hidden_hook(HiddenHook hook, void* ctx) { hook_ = hook; hook_ctx_ = ctx; }

  ForwardStats& stats() { return stats_; }

 private:
  LlamaModel(ModelConfig cfg, Backend& be) : cfg_(std::move(cfg)), be_(be) {}
  // forward() and forward_sample(): logits (host) when picks is null, else the ids in it, picked
  // with `rows` (empty: greedy).
  // deferred: the picks stay on the backend (launch_sample); picks is then left empty.
  // kv_layers >= 0: forward_kv's pass over the first kv_layers layers (no logits, no picks).
  Result<Tensor> run_pass(const std::vector<SeqInput>& batch, std::vector<int32_t>* picks,
                          std::span<const RowSampling> rows = {}, bool deferred = false, int kv_layers = -1);
  Status validate_batch(const std::vector<SeqInput>& batch) const;
  // Copies host weights to a non-CPU backend (its weight dtype); a no-op on the CPU.
  Status place_weights(const LoadProgress& progress = {});

  ModelConfig cfg_;
  Backend& be_;
  ModelWeights w_;
  std::unique_ptr<WeightStore> store_;
  std::vector<Tensor> owned_;
  std::vector<float> inv_freq_;
  std::string source_;
  HiddenHook hook_ = nullptr;
  void* hook_ctx_ = nullptr;
  ForwardStats stats_;
  std::deque<int64_t> deferred_rows_;  // rows of each launched pass whose picks are not taken
};

}  // namespace lragent
