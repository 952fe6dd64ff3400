#include "agents/tools.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>

namespace lragent {
namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_word_byte(unsigned char c) { return c >= 0x80 || std::isalnum(c); }  // UTF-8 letters count

// Lowercase words, minus the function words that would make every paragraph match.
std::set<std::string> content_words(std::string_view text) {
  static const std::set<std::string> kStop = {
      "a",    "an",    "and",  "are", "as",  "at",   "be",   "by",   "did",   "do",    "does", "for",  "from", "has",
      "have", "he",    "her",  "his", "how", "in",   "is",   "it",   "its",   "of",    "on",   "or",   "she",  "that",
      "the",  "their", "this", "to",  "was", "were", "what", "when", "where", "which", "who",  "whom", "why",  "with"};
  std::set<std::string> out;
  std::string w;
  for (const char ch : std::string(text) + " ") {  // the trailing space flushes the last word
    if (is_word_byte(static_cast<unsigned char>(ch))) {
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    } else if (!w.empty()) {
      if (!kStop.count(w)) out.insert(w);
      w.clear();
    }
  }
  return out;
}

size_t overlap(const std::set<std::string>& a, const std::set<std::string>& b) {
  size_t n = 0;
  for (const std::string& w : a) n += b.count(w);
  return n;
}

// Dice coefficient of the character-bigram multisets of two normalised strings: 1 for equal
// strings, high for typos and small insertions ("Eifel Tower" vs "Eiffel Tower").
double bigram_dice(std::string_view a, std::string_view b) {
  auto grams = [](std::string_view s) {
    std::vector<int> g;  // [len - 1] bigrams packed as (byte0 << 8) | byte1
    for (size_t i = 0; i + 1 < s.size(); ++i)
      g.push_back((static_cast<unsigned char>(s[i]) << 8) | static_cast<unsigned char>(s[i + 1]));
    std::sort(g.begin(), g.end());
    return g;
  };
  const std::vector<int> ga = grams(a), gb = grams(b);
  if (ga.empty() || gb.empty()) return a == b ? 1.0 : 0.0;
  std::vector<int> common;
  std::set_intersection(ga.begin(), ga.end(), gb.begin(), gb.end(), std::back_inserter(common));
  return 2.0 * static_cast<double>(common.size()) / static_cast<double>(ga.size() + gb.size());
}

// "Radio City (Indian radio station)" -> "Radio City": the disambiguation a user rarely types.
std::string without_parenthetical(std::string_view title) {
  const size_t p = title.rfind(" (");
  return p != std::string_view::npos && title.back() == ')' ? std::string(title.substr(0, p)) : std::string(title);
}

std::string join_sentences(const Paragraph& p, size_t n) {
  std::string out;
  for (size_t i = 0; i < std::min(n, p.sentences.size()); ++i) out += (out.empty() ? "" : " ") + p.sentences[i];
  return out;
}

}  // namespace

struct ToolEnv::State {
  HotpotQuestion q;
  ToolEnvOptions opts;
  int passage = -1;                      // index into q.context of the last passage found; -1: none
  std::string lookup_keyword;            // lowercase keyword of the current Lookup cursor
  std::vector<std::string> lookup_hits;  // sentences of the passage holding lookup_keyword
  size_t lookup_next = 0;                // next hit to return
  bool finished = false;
  std::string answer, verdict;

  void set_passage(int i) {
    passage = i;
    lookup_keyword.clear();  // a new passage restarts every Lookup cursor
    lookup_hits.clear();
    lookup_next = 0;
  }
};

namespace {

class BingSearch final : public Tool {
 public:
  explicit BingSearch(ToolEnv::State& st) : st_(st) {}
  std::string name() const override { return "BingSearch"; }
  std::string description() const override {
    return "BingSearch[query]: the first sentences of the paragraph sharing most words with the query";
  }
  Result<std::string> call(const std::string& arg) override {
    if (arg.empty()) return make_error(ErrorCode::kInvalidArgument, "BingSearch needs a query");
    std::set<std::string> q = content_words(arg);
    if (q.empty()) q = {lower(arg)};
    int best = -1;
    double best_score = 0;
    for (size_t i = 0; i < st_.q.context.size(); ++i) {
      const Paragraph& p = st_.q.context[i];
      const std::set<std::string> title = content_words(p.title);
      std::set<std::string> all = content_words(join_sentences(p, p.sentences.size()));
      all.insert(title.begin(), title.end());
      // Title words weigh more: a query naming the subject should land on its page.
      const double score = static_cast<double>(overlap(q, all)) + 0.5 * static_cast<double>(overlap(q, title));
      if (score > best_score) best = static_cast<int>(i), best_score = score;
    }
    st_.set_passage(best);
    if (best < 0) return fmt::format("No results found for [{}].", arg);
    const Paragraph& p = st_.q.context[static_cast<size_t>(best)];
    return fmt::format("{}: {}", p.title, join_sentences(p, static_cast<size_t>(st_.opts.search_sentences)));
  }

 private:
  ToolEnv::State& st_;
};

class Retrieve final : public Tool {
 public:
  explicit Retrieve(ToolEnv::State& st) : st_(st) {}
  std::string name() const override { return "Retrieve"; }
  std::string description() const override {
    return "Retrieve[entity]: the paragraph titled entity, or similar titles when there is none";
  }
  Result<std::string> call(const std::string& arg) override {
    if (arg.empty()) return make_error(ErrorCode::kInvalidArgument, "Retrieve needs an entity");
    const auto& ctx = st_.q.context;
    const int found = match(arg);
    st_.set_passage(found);
    if (found >= 0)
      return join_sentences(ctx[static_cast<size_t>(found)], ctx[static_cast<size_t>(found)].sentences.size());
    std::vector<std::pair<double, size_t>> ranked;  // (similarity, paragraph)
    const std::string key = normalize_answer(arg);
    for (size_t i = 0; i < ctx.size(); ++i) {
      const double d = bigram_dice(key, normalize_answer(ctx[i].title));
      if (d > 0) ranked.emplace_back(-d, i);
    }
    std::sort(ranked.begin(), ranked.end());
    std::string similar;
    for (size_t i = 0; i < std::min(ranked.size(), static_cast<size_t>(st_.opts.max_similar)); ++i)
      similar += fmt::format("{}'{}'", i ? ", " : "", ctx[ranked[i].second].title);
    return fmt::format("Could not find [{}]. Similar: [{}]", arg, similar);
  }

 private:
  // Exact title (case-insensitive), then normalised, then without the parenthetical, then the
  // closest title by bigram similarity when it is close enough to be a misspelling.
  int match(const std::string& arg) const {
    const auto& ctx = st_.q.context;
    const std::string key = normalize_answer(arg);
    for (size_t i = 0; i < ctx.size(); ++i)
      if (lower(ctx[i].title) == lower(arg)) return static_cast<int>(i);
    for (size_t i = 0; i < ctx.size(); ++i)
      if (normalize_answer(ctx[i].title) == key) return static_cast<int>(i);
    for (size_t i = 0; i < ctx.size(); ++i)
      if (normalize_answer(without_parenthetical(ctx[i].title)) == key) return static_cast<int>(i);
    int best = -1;
    double best_dice = 0;
    for (size_t i = 0; i < ctx.size(); ++i) {
      const double d = bigram_dice(key, normalize_answer(without_parenthetical(ctx[i].title)));
      if (d > best_dice) best = static_cast<int>(i), best_dice = d;
    }
    return best_dice >= kFuzzyDice ? best : -1;
  }
  // "eifel tower" scores 0.95 against "eiffel tower"; titles sharing one word of two ~0.5.
  static constexpr double kFuzzyDice = 0.8;
  ToolEnv::State& st_;
};

class Lookup final : public Tool {
 public:
  explicit Lookup(ToolEnv::State& st) : st_(st) {}
  std::string name() const override { return "Lookup"; }
  std::string description() const override {
    return "Lookup[keyword]: the next sentence holding keyword in the passage last found";
  }
  Result<std::string> call(const std::string& arg) override {
    if (arg.empty()) return make_error(ErrorCode::kInvalidArgument, "Lookup needs a keyword");
    if (st_.passage < 0)
      return std::string("There is no passage to look up in: find one with BingSearch or Retrieve first.");
    const std::string kw = lower(arg);
    if (kw != st_.lookup_keyword) {
      st_.lookup_keyword = kw;
      st_.lookup_hits.clear();
      st_.lookup_next = 0;
      for (const std::string& s : st_.q.context[static_cast<size_t>(st_.passage)].sentences)
        if (lower(s).find(kw) != std::string::npos) st_.lookup_hits.push_back(s);
    }
    if (st_.lookup_next >= st_.lookup_hits.size()) return std::string("No more results.");
    const size_t i = st_.lookup_next++;
    return fmt::format("(Result {} / {}) {}", i + 1, st_.lookup_hits.size(), st_.lookup_hits[i]);
  }

 private:
  ToolEnv::State& st_;
};

class Finish final : public Tool {
 public:
  explicit Finish(ToolEnv::State& st) : st_(st) {}
  std::string name() const override { return "Finish"; }
  std::string description() const override { return "Finish[answer]: give the answer and end the search"; }
  Result<std::string> call(const std::string& arg) override {
    if (arg.empty()) return make_error(ErrorCode::kInvalidArgument, "Finish needs an answer");
    if (st_.finished) return make_error(ErrorCode::kInvalidArgument, "the answer is already given: Reflect comes next");
    st_.finished = true;
    st_.answer = arg;
    st_.verdict.clear();
    return std::string("Please reflect your answer.");
  }

 private:
  ToolEnv::State& st_;
};

class Reflect final : public Tool {
 public:
  explicit Reflect(ToolEnv::State& st) : st_(st) {}
  std::string name() const override { return "Reflect"; }
  std::string description() const override {
    return "Reflect[right/wrong]: right after Finish, accept the answer or hand back to the plan agent";
  }
  Result<std::string> call(const std::string& arg) override {
    if (!st_.finished) return make_error(ErrorCode::kInvalidArgument, "Reflect must come right after Finish");
    if (!st_.verdict.empty()) return make_error(ErrorCode::kInvalidArgument, "the answer was already accepted");
    const std::string v = lower(arg);
    if (v != "right" && v != "wrong")
      return make_error(ErrorCode::kInvalidArgument, "Reflect takes right or wrong, not '{}'", arg);
    st_.verdict = v;
    if (v == "right") return std::string("Answer accepted.");
    st_.finished = false;  // handed back: the plan agent searches on
    return std::string("Answer rejected: back to the plan agent.");
  }

 private:
  ToolEnv::State& st_;
};

}  // namespace

ParsedAction parse_action(std::string_view line) {
  line = line.substr(0, line.find('\n'));
  ParsedAction out;
  const size_t open = line.find('[');
  if (open == std::string_view::npos) return out;
  size_t end = open;
  while (end > 0 && line[end - 1] == ' ') --end;
  size_t begin = end;
  while (begin > 0 && (std::isalpha(static_cast<unsigned char>(line[begin - 1])) || line[begin - 1] == '_')) --begin;
  if (begin == end) return out;
  out.tool = std::string(line.substr(begin, end - begin));
  const size_t close = line.find(']', open + 1);
  std::string arg =
      trim(line.substr(open + 1, close == std::string_view::npos ? std::string_view::npos : close - open - 1));
  if (arg.size() >= 2 && (arg.front() == '"' || arg.front() == '\'') && arg.back() == arg.front())
    arg = trim(std::string_view(arg).substr(1, arg.size() - 2));
  out.arg = std::move(arg);
  out.ok = true;
  return out;
}

ToolEnv::ToolEnv(HotpotQuestion question, ToolEnvOptions opts) : st_(std::make_unique<State>()) {
  st_->q = std::move(question);
  st_->opts = opts;
  tools_.push_back(std::make_unique<BingSearch>(*st_));
  tools_.push_back(std::make_unique<Retrieve>(*st_));
  tools_.push_back(std::make_unique<Lookup>(*st_));
  tools_.push_back(std::make_unique<Finish>(*st_));
  tools_.push_back(std::make_unique<Reflect>(*st_));
}

ToolEnv::~ToolEnv() = default;

ToolStep ToolEnv::act(std::string_view line) {
  ToolStep step;
  const ParsedAction pa = parse_action(line);
  const std::string shown = trim(line.substr(0, line.find('\n')));
  if (!pa.ok) {
    step.observation =
        fmt::format("Invalid action: expected Tool[argument], e.g. Retrieve[Milhouse], got '{}'.", shown);
    return step;
  }
  Tool* tool = nullptr;
  for (const auto& t : tools_)
    if (lower(t->name()) == lower(pa.tool)) tool = t.get();
  step.arg = pa.arg;
  if (!tool) {
    step.observation = fmt::format(
        "Invalid action: unknown tool '{}'; use BingSearch[query], Retrieve[entity], Lookup[keyword] or "
        "Finish[answer].",
        pa.tool);
    return step;
  }
  auto r = tool->call(pa.arg);
  if (!r.ok()) {
    step.observation = fmt::format("Invalid action: {}.", r.error().message);
    return step;
  }
  step.tool = tool->name();
  step.valid = true;
  step.observation = std::move(*r);
  std::replace(step.observation.begin(), step.observation.end(), '\n', ' ');  // one observation, one line
  return step;
}

ToolStep ToolEnv::reflect(std::string_view line) {
  line = line.substr(0, line.find('\n'));
  const std::string low = lower(line);
  for (size_t p = low.find("reflect"); p != std::string::npos; p = low.find("reflect", p + 1)) {
    size_t q = p + 7;
    while (q < low.size() && low[q] == ' ') ++q;
    if (q < low.size() && low[q] == '[') return act(line.substr(p));
  }
  ToolStep step;
  step.observation = "Invalid action: the reflect agent wrote no Reflect[right/wrong].";
  return step;
}

const HotpotQuestion& ToolEnv::question() const { return st_->q; }
bool ToolEnv::finished() const { return st_->finished; }
const std::string& ToolEnv::answer() const { return st_->answer; }
const std::string& ToolEnv::verdict() const { return st_->verdict; }
bool ToolEnv::answer_correct() const {
  return !st_->q.answer.empty() && !st_->answer.empty() &&
         normalize_answer(st_->answer) == normalize_answer(st_->q.answer);
}

}  // namespace lragent
