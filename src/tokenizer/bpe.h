// The BPE model of tokenizer.json: vocab + ranked merges, applied to one pre-token at a time
// exactly as HF `tokenizers` does (rank-ordered merges, byte fallback, unk fusing, ignore_merges).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace lragent {

// Hash for maps keyed by std::string that can be probed with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object with type BPE.
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, std::string_view where);

  // Appends the ids of one pre-token (non-empty, valid UTF-8).
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  const std::string* id_to_token(int32_t id) const;   // nullptr if absent
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Initial symbols of a word (one per character, or its bytes / unk), then all merges applied.
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;        // [max id + 1]; "" where no token has that id
  std::vector<bool> has_id_;                    // [max id + 1]; whether some token has that id
  std::unordered_map<uint64_t, Merge> merges_;  // pair_key(left, right) -> merge
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_ids_;  // [256] id of "<0xNN>" or -1; empty without byte_fallback
  std::string prefix_;             // continuing_subword_prefix
  std::string suffix_;             // end_of_word_suffix

  // Word -> ids cache; encode() is const and may run on several threads.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace lragent
