#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace lragent {

namespace {

using tokjson::json;

// Dense id->token tables are only built for vocabularies whose ids are reasonably packed, so
// that a hostile file cannot ask for billions of slots.
constexpr int64_t kMaxIdSlack = 1 << 20;

Result<std::vector<std::pair<std::string, std::string>>> parse_merges(const json& list, std::string_view where) {
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    if (m.is_string()) {
      // Legacy "a b" form: HF skips "#version" header lines and needs exactly one space.
      const std::string& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return tokjson::corrupt(tokjson::element(where, i),
                                fmt::format("merge \"{}\" is not two tokens separated by one space", line));
      }
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return tokjson::corrupt(tokjson::element(where, i), "a merge must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  return merges;
}

}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const json& model, std::string_view where) {
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel());
  const std::string vocab_where = tokjson::member(where, "vocab");
  const json* vocab = tokjson::find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return tokjson::corrupt(vocab_where, "expected an object");
  int64_t max_id = -1;
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    LRA_ASSIGN_OR_RETURN(const int32_t id, tokjson::to_id(id_json, tokjson::member(vocab_where, token)));
    bpe->vocab_[token] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  if (max_id >= static_cast<int64_t>(bpe->vocab_.size()) + kMaxIdSlack) {
    return tokjson::corrupt(vocab_where,
                            fmt::format("ids are too sparse ({} tokens, max id {})", bpe->vocab_.size(), max_id));
  }
  bpe->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  bpe->has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : bpe->vocab_) {
    bpe->id_to_token_[id] = token;
    bpe->has_id_[id] = true;
  }

  LRA_ASSIGN_OR_RETURN(const auto prefix, tokjson::get_optional_string(model, "continuing_subword_prefix", where));
  LRA_ASSIGN_OR_RETURN(const auto suffix, tokjson::get_optional_string(model, "end_of_word_suffix", where));
  bpe->prefix_ = prefix.value_or("");
  bpe->suffix_ = suffix.value_or("");

  const std::string merges_where = tokjson::member(where, "merges");
  const json* merges_json = tokjson::find(model, "merges");
  if (merges_json == nullptr || !merges_json->is_array()) return tokjson::corrupt(merges_where, "expected an array");
  LRA_ASSIGN_OR_RETURN(const auto merges, parse_merges(*merges_json, merges_where));
  bpe->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const std::string merged = a + b.substr(std::min(bpe->prefix_.size(), b.size()));
    for (const std::string* t : {&a, &b, &merged}) {
      if (bpe->token_to_id(*t) < 0) {
        return tokjson::corrupt(tokjson::element(merges_where, rank),
                                fmt::format("merge \"{} {}\" needs token \"{}\", which is not in the vocab", a, b, *t));
      }
    }
    // As in HF, a repeated pair keeps its last rank.
    bpe->merges_[pair_key(bpe->token_to_id(a), bpe->token_to_id(b))] =
        Merge{static_cast<int32_t>(rank), bpe->token_to_id(merged)};
  }

  LRA_ASSIGN_OR_RETURN(const auto unk, tokjson::get_optional_string(model, "unk_token", where));
  if (unk) {
    bpe->unk_id_ = bpe->token_to_id(*unk);
    if (bpe->unk_id_ < 0) {
      return tokjson::corrupt(tokjson::member(where, "unk_token"), fmt::format("\"{}\" is not in the vocab", *unk));
    }
  }
  LRA_ASSIGN_OR_RETURN(bpe->fuse_unk_, tokjson::get_bool(model, "fuse_unk", where, false));
  LRA_ASSIGN_OR_RETURN(bpe->ignore_merges_, tokjson::get_bool(model, "ignore_merges", where, false));
  LRA_ASSIGN_OR_RETURN(const bool byte_fallback, tokjson::get_bool(model, "byte_fallback", where, false));
  if (byte_fallback) {
    bpe->byte_ids_.resize(256);
    for (int b = 0; b < 256; ++b) bpe->byte_ids_[b] = bpe->token_to_id(fmt::format("<0x{:02X}>", b));
  }
  if (const json* dropout = tokjson::find(model, "dropout")) {
    if (!dropout->is_number()) return tokjson::corrupt(tokjson::member(where, "dropout"), "expected a number");
    if (dropout->get<double>() > 0.0) {
      return tokjson::unsupported(tokjson::member(where, "dropout"), "BPE dropout is random, so it is not supported");
    }
  }
  return bpe;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    // Llama-3: a pre-token that is itself a vocab entry is emitted whole, whatever the merges say.
    if (const int32_t id = token_to_id(word); id >= 0) {
      ids.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < kCacheCapacity)
      cache_.emplace(std::string(word), std::vector<int32_t>(ids.begin() + first, ids.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  // symbols: [n] doubly linked list over the word; a merged-away symbol has alive == false.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[n - 1].next = n;
  };
  bool pending_unk = false;  // an unk symbol waiting to be added (so unknown chars can fuse)
  std::string piece;
  for (size_t i = 0, len = 0; i < word.size(); i += len) {
    len = unicode::utf8_length(static_cast<unsigned char>(word[i]));
    piece.assign(i > 0 ? prefix_ : std::string());
    piece.append(word.substr(i, len));
    if (i + len >= word.size()) piece += suffix_;
    if (const int32_t id = token_to_id(piece); id >= 0) {
      if (pending_unk) add(unk_id_);
      pending_unk = false;
      add(id);
      continue;
    }
    if (!byte_ids_.empty()) {
      bool all_bytes = true;
      for (const char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        // HF adds the bytes without flushing a pending unk first; kept for identical ids.
        for (const char c : piece) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) add(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(unk_id_);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  // Lowest rank first, then leftmost: the order HF's BinaryHeap pops merges in.
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Skip entries made stale by earlier merges: the pair there must still produce new_id.
    const Symbol right = symbols[left.next];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    symbols[left.next].alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids.push_back(s.id);
  }
}

}  // namespace lragent
