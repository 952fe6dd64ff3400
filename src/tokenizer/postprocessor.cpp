#include "tokenizer/postprocessor.h"

#include "tokenizer/json_util.h"

namespace lragent {

using tokjson::json;

namespace {

// Bert/Roberta "cls" / "sep" members: ["<s>", 0].
Result<int32_t> special_pair_id(const json& j, std::string_view key, std::string_view where) {
  const json* v = tokjson::find(j, key);
  const std::string w = tokjson::member(where, key);
  if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[0].is_string()) {
    return tokjson::corrupt(w, "expected [token, id]");
  }
  return tokjson::to_id((*v)[1], tokjson::element(w, 1));
}

}  // namespace

Result<PostProcessor> PostProcessor::from_json(const json& j, std::string_view where) {
  PostProcessor p;
  if (!j.is_null()) LRA_RETURN_IF_ERROR(parse_into(j, where, p.templates_));
  return p;
}

PostProcessor PostProcessor::bos_eos(int32_t bos, int32_t eos) {
  Template t;
  if (bos >= 0) t.push_back({false, {bos}});
  t.push_back({true, {}});
  if (eos >= 0) t.push_back({false, {eos}});
  PostProcessor p;
  p.templates_.push_back(std::move(t));
  return p;
}

Status PostProcessor::parse_into(const json& j, std::string_view where, std::vector<Template>& out) {
  LRA_RETURN_IF_ERROR(tokjson::expect_object(j, where));
  LRA_ASSIGN_OR_RETURN(const std::string type, tokjson::get_string(j, "type", where));
  if (type == "ByteLevel") return Status::Ok();  // only trims offsets; ids are unchanged
  if (type == "Sequence") {
    const json* list = tokjson::find(j, "processors");
    const std::string list_where = tokjson::member(where, "processors");
    if (list == nullptr || !list->is_array()) return tokjson::corrupt(list_where, "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      LRA_RETURN_IF_ERROR(parse_into((*list)[i], tokjson::element(list_where, i), out));
    }
    return Status::Ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    LRA_ASSIGN_OR_RETURN(const int32_t cls, special_pair_id(j, "cls", where));
    LRA_ASSIGN_OR_RETURN(const int32_t sep, special_pair_id(j, "sep", where));
    out.push_back({{false, {cls}}, {true, {}}, {false, {sep}}});
    return Status::Ok();
  }
  if (type != "TemplateProcessing") {
    return tokjson::unsupported(where, fmt::format("post-processor type \"{}\" is not supported", type));
  }
  const json* specials = tokjson::find(j, "special_tokens");
  const std::string specials_where = tokjson::member(where, "special_tokens");
  if (specials != nullptr && !specials->is_object()) return tokjson::corrupt(specials_where, "expected an object");
  const json* single = tokjson::find(j, "single");
  const std::string single_where = tokjson::member(where, "single");
  if (single == nullptr || !single->is_array()) return tokjson::corrupt(single_where, "expected an array");
  Template t;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string item_where = tokjson::element(single_where, i);
    if (const json* seq = tokjson::find(item, "Sequence")) {
      LRA_ASSIGN_OR_RETURN(const std::string id,
                           tokjson::get_string(*seq, "id", tokjson::member(item_where, "Sequence")));
      // A single sequence only has $A; HF ignores $B pieces there.
      if (id == "A") t.push_back({true, {}});
      continue;
    }
    const json* special = tokjson::find(item, "SpecialToken");
    if (special == nullptr) return tokjson::corrupt(item_where, "expected a Sequence or SpecialToken piece");
    LRA_ASSIGN_OR_RETURN(const std::string name,
                         tokjson::get_string(*special, "id", tokjson::member(item_where, "SpecialToken")));
    const json* entry = specials == nullptr ? nullptr : tokjson::find(*specials, name);
    if (entry == nullptr) return tokjson::corrupt(specials_where, fmt::format("missing special token \"{}\"", name));
    const std::string entry_where = tokjson::member(specials_where, name);
    const json* ids = tokjson::find(*entry, "ids");
    if (ids == nullptr || !ids->is_array())
      return tokjson::corrupt(tokjson::member(entry_where, "ids"), "expected an array");
    Piece piece;
    for (size_t k = 0; k < ids->size(); ++k) {
      LRA_ASSIGN_OR_RETURN(const int32_t id,
                           tokjson::to_id((*ids)[k], tokjson::element(tokjson::member(entry_where, "ids"), k)));
      piece.ids.push_back(id);
    }
    t.push_back(std::move(piece));
  }
  out.push_back(std::move(t));
  return Status::Ok();
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  for (const Template& t : templates_) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Piece& p : t) {
      const std::vector<int32_t>& src = p.is_sequence ? ids : p.ids;
      out.insert(out.end(), src.begin(), src.end());
    }
    ids = std::move(out);
  }
}

}  // namespace lragent
