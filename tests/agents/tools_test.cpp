// The offline ReAct tool environment: HotpotQA loading (all three context formats), tool
// semantics on a real question, tolerant action parsing, and clear errors for bad files.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>

#include "agents/tools.h"
#include "test_util.h"

namespace lragent {
namespace {

std::string questions_path() { return testing::shared_dir() + "/data/hotpotqa/questions-easy-medium-hard.json"; }

// "Which magazine was started first Arthur's Magazine or First for Women?" (medium, 10 paragraphs).
constexpr char kMagazineId[] = "5a7a06935542990198eaf050";

class Tools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto qs = load_hotpot_questions(questions_path());
    ASSERT_TRUE(qs.ok()) << qs.error().message;
    questions_ = std::make_unique<std::vector<HotpotQuestion>>(std::move(*qs));
  }
  static void TearDownTestSuite() { questions_.reset(); }
  void SetUp() override { ASSERT_NE(questions_, nullptr) << questions_path() << " did not load"; }
  static HotpotQuestion magazine() {
    auto q = find_question_by_id(*questions_, kMagazineId, questions_path());
    EXPECT_TRUE(q.ok()) << q.error().message;
    return *q;
  }
  static std::unique_ptr<std::vector<HotpotQuestion>> questions_;  // the whole file, parsed once (2 MB)
};
std::unique_ptr<std::vector<HotpotQuestion>> Tools::questions_;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::temp_dir("tools") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST_F(Tools, LoadsAllLevelsIncludingNumpyPrintedContexts) {
  ASSERT_EQ(questions_->size(), 300u);
  int per_level[3] = {0, 0, 0};
  for (const HotpotQuestion& q : *questions_) {
    per_level[0] += q.level == "easy";
    per_level[1] += q.level == "medium";
    per_level[2] += q.level == "hard";
    EXPECT_FALSE(q.context.empty()) << q.id;
    for (const Paragraph& p : q.context) {
      EXPECT_FALSE(p.title.empty()) << q.id;
      EXPECT_FALSE(p.sentences.empty()) << q.id << " " << p.title;
    }
  }
  EXPECT_EQ(per_level[0], 100);
  EXPECT_EQ(per_level[1], 100);
  EXPECT_EQ(per_level[2], 100);

  // The hard split stores its context as numpy reprs: titles "['A' 'B' ...]", sentences
  // "[array(['s1', 's2'], dtype=object) ...]", with Python escapes.
  auto hard = find_question_by_id(*questions_, "5a7613c15542994ccc9186bf", questions_path());
  ASSERT_TRUE(hard.ok()) << hard.error().message;
  ASSERT_EQ(hard->context.size(), 10u);
  EXPECT_EQ(hard->context[0].title, "Constantin Medien");
  EXPECT_EQ(hard->context[1].title, "VIVA Poland");
  ASSERT_EQ(hard->context[1].sentences.size(), 3u);
  EXPECT_EQ(hard->context[1].sentences[0], "VIVA Polska (earlier \"VIVApolska!\")");
  EXPECT_EQ(hard->context[7].title, "Gesellschaft mit beschränkter Haftung");
  auto escaped = find_question_by_id(*questions_, "5adf2fa35542993344016c11", questions_path());
  ASSERT_TRUE(escaped.ok()) << escaped.error().message;
  ASSERT_GE(escaped->context.size(), 2u);
  EXPECT_EQ(escaped->context[1].title, "Relativity (Emarosa album)");
  ASSERT_EQ(escaped->context[1].sentences.size(), 2u);
  EXPECT_NE(escaped->context[1].sentences[1].find("Dance Gavin Dance's debut album"), std::string::npos)
      << "\\' in a numpy repr decodes to '";
}

TEST_F(Tools, RetrieveMatchesTitlesExactlyCaseInsensitivelyAndFuzzily) {
  ToolEnv env(magazine());
  ToolStep s = env.act("Action 1: Retrieve[First for Women]");
  ASSERT_TRUE(s.valid) << s.observation;
  EXPECT_EQ(s.tool, "Retrieve");
  EXPECT_EQ(s.observation.rfind("First for Women is a woman's magazine published by Bauer Media Group in the USA. "
                                "The magazine was started in 1989.",
                                0),
            0u)
      << s.observation;
  EXPECT_EQ(env.act("Retrieve[first FOR women]").observation, s.observation);
  // Apostrophes, a missing "s" and the parenthetical disambiguation need not be typed.
  EXPECT_EQ(env.act("Retrieve[Arthurs Magazine]").observation.rfind("Arthur's Magazine (1844–1846) was", 0), 0u);
  EXPECT_EQ(env.act("Retrieve[Arthur Magazine]").observation.rfind("Arthur's Magazine (1844–1846) was", 0), 0u);
  EXPECT_EQ(env.act("Retrieve[Radio City]").observation.rfind("Radio City is India's first private FM", 0), 0u);

  const ToolStep miss = env.act("Retrieve[Godey's Lady's Book]");
  EXPECT_TRUE(miss.valid);
  EXPECT_EQ(miss.observation.rfind("Could not find [Godey's Lady's Book]. Similar: ['", 0), 0u) << miss.observation;
  EXPECT_EQ(miss.observation.back(), ']');
  // A failed Retrieve leaves no passage to look up in.
  EXPECT_EQ(env.act("Lookup[magazine]").observation.rfind("There is no passage", 0), 0u);
}

TEST_F(Tools, BingSearchReturnsTheBestOverlappingParagraphsFirstSentences) {
  ToolEnv env(magazine());
  const ToolStep s = env.act("BingSearch[magazine started in 1989]");
  ASSERT_TRUE(s.valid);
  EXPECT_EQ(s.observation,
            "First for Women: First for Women is a woman's magazine published by Bauer Media Group in the USA. "
            "The magazine was started in 1989.");
  EXPECT_EQ(env.act("BingSearch[zzzz qqqq]").observation, "No results found for [zzzz qqqq].");
}

TEST_F(Tools, LookupWalksTheLastPassageWithACursorPerKeyword) {
  ToolEnv env(magazine());
  EXPECT_EQ(env.act("Lookup[magazine]").observation.rfind("There is no passage", 0), 0u);
  ASSERT_TRUE(env.act("BingSearch[magazine started in 1989]").valid);
  EXPECT_EQ(env.act("Lookup[Magazine]").observation,
            "(Result 1 / 3) First for Women is a woman's magazine published by Bauer Media Group in the USA.");
  EXPECT_EQ(env.act("Lookup[magazine]").observation, "(Result 2 / 3) The magazine was started in 1989.");
  EXPECT_EQ(env.act("Lookup[englewood]").observation, "(Result 1 / 1) It is based in Englewood Cliffs, New Jersey.");
  EXPECT_EQ(env.act("Lookup[englewood]").observation, "No more results.");
  // A new keyword restarts its cursor; so does a new passage.
  EXPECT_EQ(env.act("Lookup[magazine]").observation.rfind("(Result 1 / 3)", 0), 0u);
  ASSERT_TRUE(env.act("Retrieve[Arthur's Magazine]").valid);
  EXPECT_EQ(env.act("Lookup[Poe]").observation,
            "(Result 1 / 1) Edited by T.S. Arthur, it featured work by Edgar A. Poe, J.H. Ingraham, Sarah Josepha "
            "Hale, Thomas G. Spear, and others.");
}

TEST_F(Tools, FinishThenReflectDecidesTheEpisode) {
  ToolEnv env(magazine());
  EXPECT_FALSE(env.act("Reflect[right]").valid) << "Reflect before Finish";
  const ToolStep fin = env.act("Action 3: Finish[First for Women]");
  ASSERT_TRUE(fin.valid);
  EXPECT_EQ(fin.observation, "Please reflect your answer.");
  EXPECT_TRUE(env.finished());
  EXPECT_FALSE(env.answer_correct());
  EXPECT_FALSE(env.act("Finish[again]").valid) << "Reflect must come next";

  const ToolStep wrong = env.reflect("Hmm, 1989 is later than 1844, so Reflect[wrong]");
  ASSERT_TRUE(wrong.valid) << wrong.observation;
  EXPECT_EQ(env.verdict(), "wrong");
  EXPECT_FALSE(env.finished()) << "a rejected answer hands the episode back";
  EXPECT_FALSE(env.reflect("Reflect[right]").valid) << "no Finish to reflect on";

  ASSERT_TRUE(env.act("Finish[\"Arthur's magazine\"]").valid);
  EXPECT_EQ(env.answer(), "Arthur's magazine");
  EXPECT_TRUE(env.answer_correct()) << "exact match ignores case";
  EXPECT_FALSE(env.reflect("looks fine to me").valid);
  EXPECT_EQ(env.verdict(), "");
  EXPECT_FALSE(env.reflect("Reflect[maybe]").valid);
  EXPECT_TRUE(env.reflect("My answer seems correct, so..., Reflect [Right]").valid);
  EXPECT_EQ(env.verdict(), "right");
  EXPECT_TRUE(env.finished());
  EXPECT_FALSE(env.reflect("Reflect[right]").valid) << "already accepted";
}

TEST_F(Tools, ParseActionIsTolerant) {
  auto check = [](const char* line, const char* tool, const char* arg) {
    const ParsedAction a = parse_action(line);
    EXPECT_TRUE(a.ok) << line;
    EXPECT_EQ(a.tool, tool) << line;
    EXPECT_EQ(a.arg, arg) << line;
  };
  check("Action 1: BingSearch[popular dog breeds]", "BingSearch", "popular dog breeds");
  check("BingSearch[popular dog breeds]", "BingSearch", "popular dog breeds");
  check("   Retrieve [  Milhouse ]  ", "Retrieve", "Milhouse");
  check("Action: lookup[river].", "lookup", "river");
  check("Finish[Richard Nixon", "Finish", "Richard Nixon");  // a generation cut short
  check("Finish[\"yes\"]", "Finish", "yes");
  check("Retrieve[A]\nFinish[B]", "Retrieve", "A");  // only the first line
  check("Finish[]", "Finish", "");
  EXPECT_FALSE(parse_action("").ok);
  EXPECT_FALSE(parse_action("the cat sat on the mat").ok);
  EXPECT_FALSE(parse_action("Action 2: [orphan]").ok);
  EXPECT_FALSE(parse_action("first line\nRetrieve[A]").ok);
}

TEST_F(Tools, InvalidActionsBecomeObservations) {
  ToolEnv env(builtin_question());
  for (const char* line : {"", "the cat sat", "Action 1: Teleport[Paris]", "Finish[]", "BingSearch[   ]", "[x]"}) {
    const ToolStep s = env.act(line);
    EXPECT_FALSE(s.valid) << line;
    EXPECT_TRUE(s.tool.empty()) << line;
    EXPECT_EQ(s.observation.rfind("Invalid action", 0), 0u) << line << " -> " << s.observation;
  }
  EXPECT_NE(env.act("Teleport[Paris]").observation.find("unknown tool 'Teleport'"), std::string::npos);
  EXPECT_FALSE(env.finished());
  // Tool names are case-insensitive, as the prompt itself writes "Bingsearch[...]".
  const ToolStep s = env.act("bingsearch[Eiffel Tower city]");
  EXPECT_TRUE(s.valid);
  EXPECT_EQ(s.tool, "BingSearch");
  EXPECT_EQ(env.tools().size(), 5u);
  for (const auto& t : env.tools()) EXPECT_EQ(t->description().rfind(t->name() + "[", 0), 0u);
}

TEST_F(Tools, BuiltinQuestionAnswersItselfOffline) {
  const HotpotQuestion& q = builtin_question();
  ASSERT_EQ(q.context.size(), 3u);
  ToolEnv env(q);
  EXPECT_EQ(env.act("Retrieve[Eiffel Tower]").observation.rfind("The Eiffel Tower is a wrought-iron lattice tower", 0),
            0u);
  EXPECT_EQ(env.act("Retrieve[Eifel Tower]").observation.rfind("The Eiffel Tower is", 0), 0u) << "a typo still matches";
  EXPECT_EQ(env.act("BingSearch[river of Paris]").observation.rfind("Paris: ", 0), 0u);
  EXPECT_EQ(env.act("Lookup[river]").observation,
            "(Result 1 / 1) The city stands on the river Seine, in the north of the country.");
  ASSERT_TRUE(env.act("Finish[the Seine]").valid);
  EXPECT_TRUE(env.answer_correct()) << "articles are dropped before the exact match";
}

TEST_F(Tools, QuestionSelectionByTextAndId) {
  // Text matches ignore case and punctuation; otherwise the built-in paragraphs are searched.
  const HotpotQuestion m =
      question_for_text(*questions_, "which magazine was started first arthur's magazine or first for women");
  EXPECT_EQ(m.id, kMagazineId);
  EXPECT_EQ(m.answer, "Arthur's Magazine");
  const HotpotQuestion custom = question_for_text(*questions_, "Who designed the tower?");
  EXPECT_EQ(custom.question, "Who designed the tower?");
  EXPECT_TRUE(custom.answer.empty());
  EXPECT_EQ(custom.context.size(), builtin_question().context.size());
  EXPECT_EQ(question_for_text({builtin_question()}, builtin_question().question).answer, "Seine");

  auto missing = find_question_by_id(*questions_, "no-such-id", questions_path());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("no-such-id"), std::string::npos);
  EXPECT_NE(missing.error().message.find("questions-easy-medium-hard.json"), std::string::npos);
  // It names the file's first ids and how many there are.
  const std::string first = (*questions_)[0].id;
  EXPECT_NE(missing.error().message.find("(ids: " + first + ", "), std::string::npos) << missing.error().message;
  EXPECT_NE(missing.error().message.find(fmt::format("({} questions))", questions_->size())), std::string::npos)
      << missing.error().message;
}

TEST_F(Tools, BadQuestionFilesNameTheFileAndCause) {
  const std::string dir = testing::temp_dir("tools-bad");
  auto none = load_hotpot_questions(dir + "/absent.json");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kNotFound);
  EXPECT_NE(none.error().message.find("absent.json"), std::string::npos);

  struct Case {
    const char* name;
    const char* text;
    const char* cause;
  };
  const Case cases[] = {
      {"notjson.json", "{\"easy\": [", "notjson.json: invalid JSON (parse error at line 1"},
      {"scalar.json", "42", "expected an array of questions or an object of levels"},
      {"empty.json", "[]", "holds no questions"},
      {"level.json", "{\"easy\": 3}", "\"easy\" must be an array"},
      {"noid.json", "[{\"question\": \"q\", \"context\": []}]", "[0]: \"id\""},
      {"noquestion.json", "{\"easy\": [{\"id\": \"x\", \"context\": []}]}", "easy[0]: \"question\" must be a string"},
      {"nocontext.json", "[{\"id\": \"x\", \"question\": \"q\"}]", "no \"context\""},
      {"para.json", "{\"easy\": [{\"id\": \"x\", \"question\": \"q\", \"context\": [[\"T\", \"s\"]]}]}",
       "easy[0]: \"context\" entries must be [title, [sentence, ...]]"},
      {"numpy.json",
       "{\"hard\": [{\"id\": \"x\", \"question\": \"q\", \"context\": {\"title\": \"['A' 'B\", \"sentences\": "
       "\"[]\"}}]}",
       "unterminated string literal"},
      {"counts.json",
       "{\"hard\": [{\"id\": \"x\", \"question\": \"q\", \"context\": {\"title\": \"['A' 'B']\", "
       "\"sentences\": \"[array(['s'], dtype=object)]\"}}]}",
       "2 titles but 1 sentence lists"},
      {"brackets.json",
       "{\"hard\": [{\"id\": \"x\", \"question\": \"q\", \"context\": {\"title\": \"]['A']\", \"sentences\": "
       "\"[]\"}}]}",
       "unbalanced brackets"},
  };
  for (const Case& c : cases) {
    auto r = load_hotpot_questions(write_file(c.name, c.text));
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.error().code, ErrorCode::kCorrupt) << c.name;
    EXPECT_NE(r.error().message.find(c.name), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(c.cause), std::string::npos) << r.error().message;
  }
  // The Hugging Face datasets shape parses too.
  auto hf = parse_hotpot_questions(
      R"([{"_id": "h1", "question": "q", "answer": "a", "context": {"title": ["T"], "sentences": [["One. ", " Two."]]}}])",
      "hf.json");
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  EXPECT_EQ(hf->front().id, "h1");
  EXPECT_EQ(hf->front().context[0].sentences, (std::vector<std::string>{"One.", "Two."}));
  // numpy reprs keep Python's backslash escapes: hex bytes, unicode code points, quotes, newlines.
  auto np = parse_hotpot_questions(
      R"([{"id": "n", "question": "q", "context": {"title": "['M\\xfcller' \"O'Brien\"]",
          "sentences": "[array(['It\\'s \\u00e9t\\u00e9.', ' Two\\nlines'], dtype=object)\n array(['x'], dtype=object)]"}}])",
      "np.json");
  ASSERT_TRUE(np.ok()) << np.error().message;
  const auto& ctx = np->front().context;
  ASSERT_EQ(ctx.size(), 2u);
  EXPECT_EQ(ctx[0].title, "M\xc3\xbcller");
  EXPECT_EQ(ctx[1].title, "O'Brien");
  EXPECT_EQ(ctx[0].sentences, (std::vector<std::string>{"It's \xc3\xa9t\xc3\xa9.", "Two\nlines"}));
  EXPECT_EQ(ctx[1].sentences, (std::vector<std::string>{"x"}));
}

}  // namespace
}  // namespace lragent
