#include "agents/hotpotqa.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/text_file.h"
#include "tokenizer/unicode.h"

namespace lragent {
namespace {

using nlohmann::json;

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Reads the Python string literals of a numpy array repr, grouped by the list that holds them:
//   "['A' 'B'\n 'C']"                                  -> {{A, B, C}}            (depth 1)
//   "[array(['s1', 's2'], dtype=object)\n array([..])]" -> {{s1, s2}, {...}}     (depth 2)
// A group opens at each '[' that reaches depth `group_depth`; literals outside groups are dropped.
Result<std::vector<std::vector<std::string>>> parse_numpy_strings(std::string_view s, int group_depth) {
  std::vector<std::vector<std::string>> groups;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '[') {
      if (++depth == group_depth) groups.emplace_back();
    } else if (c == ']') {
      if (--depth < 0) return make_error(ErrorCode::kCorrupt, "unbalanced brackets at offset {}", i);
    } else if (c == '\'' || c == '"') {
      std::string lit;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 == s.size()) {
          lit += s[j];
          continue;
        }
        const char e = s[++j];
        const int hex_digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex_digits > 0 && j + hex_digits < s.size()) {
          const std::string hex(s.substr(j + 1, static_cast<size_t>(hex_digits)));
          char* end = nullptr;
          const unsigned long cp = std::strtoul(hex.c_str(), &end, 16);
          if (*end != '\0' || cp > 0x10FFFF)
            return make_error(ErrorCode::kCorrupt, "bad \\{} escape in a string literal", e);
          unicode::append_utf8(lit, static_cast<uint32_t>(cp));
          j += static_cast<size_t>(hex_digits);
        } else if (e == 'n') {
          lit += '\n';
        } else if (e == 't') {
          lit += '\t';
        } else if (e == 'r') {
          lit += '\r';
        } else if (e == '\\' || e == '\'' || e == '"') {
          lit += e;
        } else {  // Python keeps unknown escapes verbatim
          lit += '\\';
          lit += e;
        }
      }
      if (j >= s.size()) return make_error(ErrorCode::kCorrupt, "unterminated string literal at offset {}", i);
      if (depth >= group_depth) groups.back().push_back(std::move(lit));
      i = j;
    }
  }
  if (depth != 0) return make_error(ErrorCode::kCorrupt, "unbalanced brackets");
  return groups;
}

Result<std::vector<Paragraph>> parse_context(const json& c, const std::string& where) {
  std::vector<Paragraph> out;
  if (c.is_array()) {
    for (const json& p : c) {
      if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_array())
        return make_error(ErrorCode::kCorrupt, "{}: \"context\" entries must be [title, [sentence, ...]]", where);
      Paragraph para{p[0].get<std::string>(), {}};
      for (const json& s : p[1]) {
        if (!s.is_string())
          return make_error(ErrorCode::kCorrupt, "{}: paragraph '{}' holds a non-string sentence", where, para.title);
        para.sentences.push_back(trim(s.get<std::string>()));
      }
      out.push_back(std::move(para));
    }
    return out;
  }
  if (!c.is_object() || !c.contains("title") || !c.contains("sentences"))
    return make_error(ErrorCode::kCorrupt,
                      "{}: \"context\" must be [[title, [sentences]], ...] or {{\"title\", \"sentences\"}}", where);
  const json &t = c["title"], &s = c["sentences"];
  std::vector<std::string> titles;
  std::vector<std::vector<std::string>> sentences;
  if (t.is_string() && s.is_string()) {
    auto tg = parse_numpy_strings(t.get_ref<const std::string&>(), 1);
    if (!tg.ok()) return make_error(ErrorCode::kCorrupt, "{}: \"context.title\": {}", where, tg.error().message);
    auto sg = parse_numpy_strings(s.get_ref<const std::string&>(), 2);
    if (!sg.ok()) return make_error(ErrorCode::kCorrupt, "{}: \"context.sentences\": {}", where, sg.error().message);
    if (!tg->empty()) titles = std::move(tg->front());
    sentences = std::move(*sg);
  } else if (t.is_array() && s.is_array()) {
    for (const json& x : t) {
      if (!x.is_string()) return make_error(ErrorCode::kCorrupt, "{}: \"context.title\" must hold strings", where);
      titles.push_back(x.get<std::string>());
    }
    for (const json& p : s) {
      if (!p.is_array())
        return make_error(ErrorCode::kCorrupt, "{}: \"context.sentences\" must hold arrays of strings", where);
      sentences.emplace_back();
      for (const json& x : p) {
        if (!x.is_string())
          return make_error(ErrorCode::kCorrupt, "{}: \"context.sentences\" must hold arrays of strings", where);
        sentences.back().push_back(x.get<std::string>());
      }
    }
  } else {
    return make_error(ErrorCode::kCorrupt,
                      "{}: \"context.title\" and \"context.sentences\" must both be strings or both arrays", where);
  }
  if (titles.size() != sentences.size())
    return make_error(ErrorCode::kCorrupt, "{}: \"context\" has {} titles but {} sentence lists", where, titles.size(),
                      sentences.size());
  for (size_t i = 0; i < titles.size(); ++i) {
    Paragraph p{titles[i], {}};
    for (const std::string& x : sentences[i]) p.sentences.push_back(trim(x));
    out.push_back(std::move(p));
  }
  return out;
}

Result<HotpotQuestion> parse_question(const json& q, const std::string& where, const std::string& level) {
  if (!q.is_object()) return make_error(ErrorCode::kCorrupt, "{}: a question must be an object", where);
  HotpotQuestion out;
  const char* id_key = q.contains("id") ? "id" : "_id";
  if (!q.contains(id_key) || !q[id_key].is_string())
    return make_error(ErrorCode::kCorrupt, "{}: \"id\" (or \"_id\") must be a string", where);
  out.id = q[id_key].get<std::string>();
  if (!q.contains("question") || !q["question"].is_string())
    return make_error(ErrorCode::kCorrupt, "{}: \"question\" must be a string", where);
  out.question = q["question"].get<std::string>();
  if (q.contains("answer")) {
    if (!q["answer"].is_string()) return make_error(ErrorCode::kCorrupt, "{}: \"answer\" must be a string", where);
    out.answer = q["answer"].get<std::string>();
  }
  out.level = q.contains("level") && q["level"].is_string() ? q["level"].get<std::string>() : level;
  if (!q.contains("context")) return make_error(ErrorCode::kCorrupt, "{}: the question has no \"context\"", where);
  LRA_ASSIGN_OR_RETURN(out.context, parse_context(q["context"], where));
  return out;
}

bool is_article(std::string_view w) { return w == "a" || w == "an" || w == "the"; }

}  // namespace

Result<std::vector<HotpotQuestion>> parse_hotpot_questions(const std::string& json_text, const std::string& source) {
  LRA_ASSIGN_OR_RETURN(const json j, parse_json(json_text, source));
  std::vector<HotpotQuestion> out;
  auto add_all = [&](const json& arr, const std::string& level, const std::string& prefix) -> Status {
    for (size_t i = 0; i < arr.size(); ++i) {
      LRA_ASSIGN_OR_RETURN(auto q, parse_question(arr[i], fmt::format("{}: {}[{}]", source, prefix, i), level));
      out.push_back(std::move(q));
    }
    return Status::Ok();
  };
  if (j.is_array()) {
    LRA_RETURN_IF_ERROR(add_all(j, "", ""));
  } else if (j.is_object()) {
    for (const auto& [level, arr] : j.items()) {
      if (!arr.is_array())
        return make_error(ErrorCode::kCorrupt, "{}: \"{}\" must be an array of questions", source, level);
      LRA_RETURN_IF_ERROR(add_all(arr, level, level));
    }
  } else {
    return make_error(ErrorCode::kCorrupt, "{}: expected an array of questions or an object of levels", source);
  }
  if (out.empty()) return make_error(ErrorCode::kCorrupt, "{}: holds no questions", source);
  return out;
}

Result<std::vector<HotpotQuestion>> load_hotpot_questions(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, "{}: cannot open the questions file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hotpot_questions(ss.str(), path);
}

const HotpotQuestion& builtin_question() {
  static const HotpotQuestion q{
      "builtin-seine",
      "easy",
      "Which river flows through the city where the Eiffel Tower stands?",
      "Seine",
      {{"Eiffel Tower",
        {"The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
         "It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.",
         "It was the tallest man-made structure in the world until 1930."}},
       {"Paris",
        {"Paris is the capital and largest city of France.",
         "The city stands on the river Seine, in the north of the country.",
         "Its landmarks include the Louvre, Notre-Dame and the Eiffel Tower."}},
       {"Seine",
        {"The Seine is a 777-kilometre-long river in northern France.",
         "It rises at Source-Seine, north-west of Dijon, and flows through Paris into the English Channel at Le "
         "Havre."}}}};
  return q;
}

Result<HotpotQuestion> find_question_by_id(const std::vector<HotpotQuestion>& questions, const std::string& id,
                                           const std::string& source) {
  for (const HotpotQuestion& q : questions)
    if (q.id == id) return q;
  // Name some ids that exist, so that a typo or the wrong file shows at once.
  std::string known;
  const size_t shown = std::min<size_t>(questions.size(), 3);
  for (size_t i = 0; i < shown; ++i) known += (i ? ", " : "") + questions[i].id;
  if (questions.size() > shown) known += fmt::format(", ... ({} questions)", questions.size());
  return make_error(ErrorCode::kNotFound, "{}: no question has id '{}' (ids: {})", source, id,
                    known.empty() ? "none" : known);
}

HotpotQuestion question_for_text(const std::vector<HotpotQuestion>& questions, const std::string& text) {
  const std::string key = normalize_answer(text);
  for (const HotpotQuestion& q : questions)
    if (normalize_answer(q.question) == key) return q;
  HotpotQuestion q = builtin_question();
  q.id = "custom";
  q.level.clear();
  q.question = text;
  q.answer.clear();
  return q;
}

std::string normalize_answer(std::string_view text) {
  std::string out, word;
  auto flush = [&] {
    if (!word.empty() && !is_article(word)) out += (out.empty() ? "" : " ") + word;
    word.clear();
  };
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isspace(c)) {
      flush();
    } else if (c >= 0x80 || std::isalnum(c)) {  // non-ASCII bytes are letters of UTF-8 words
      word += static_cast<char>(std::tolower(c));
    }  // ASCII punctuation is dropped, joining its neighbours as HotpotQA's evaluation does
  }
  flush();
  return out;
}

}  // namespace lragent
