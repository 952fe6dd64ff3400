// HotpotQA questions with their own context paragraphs: the offline corpus that the ReAct
// tools (agents/tools.h) search instead of the web, so a workflow run needs no network.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent {

struct Paragraph {
  std::string title;
  std::vector<std::string> sentences;  // trimmed; joined with one space they give the paragraph
};

struct HotpotQuestion {
  std::string id;
  std::string level;  // "easy" / "medium" / "hard", or empty
  std::string question;
  std::string answer;  // empty when unknown (a question typed on the command line)
  std::vector<Paragraph> context;
};

// Parses a questions file. Accepted shapes:
//   {"easy": [Q...], "medium": [Q...], ...}   (a question's level defaults to its key), or [Q...]
//   Q = {"id" | "_id", "question", "answer"?, "level"?, "context"}
//   context = [[title, [sentence...]], ...]                        (HotpotQA distractor format)
//           | {"title": [title...], "sentences": [[sentence...]...]}  (Hugging Face datasets)
//           | {"title": "<numpy repr>", "sentences": "<numpy repr>"}  (the same, printed by numpy,
//             as in the "hard" split of questions-easy-medium-hard.json)
// `source` names the file in errors ("q.json: hard[3]: \"context\" ...").
Result<std::vector<HotpotQuestion>> parse_hotpot_questions(const std::string& json_text, const std::string& source);
Result<std::vector<HotpotQuestion>> load_hotpot_questions(const std::string& path);

// A small question compiled into the binary (three short paragraphs), used without a file.
const HotpotQuestion& builtin_question();

// The question with this id, or kNotFound naming `source` and the id.
Result<HotpotQuestion> find_question_by_id(const std::vector<HotpotQuestion>& questions, const std::string& id,
                                           const std::string& source);
// The question whose text equals `text` up to case, spacing and punctuation; otherwise `text`
// asked over the built-in paragraphs, with no known answer.
HotpotQuestion question_for_text(const std::vector<HotpotQuestion>& questions, const std::string& text);

// HotpotQA's answer normalisation: lowercase, punctuation and articles (a/an/the) dropped,
// whitespace collapsed. Exact match of two answers compares these.
std::string normalize_answer(std::string_view text);

}  // namespace lragent
