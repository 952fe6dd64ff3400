// `lragent run-batch`: vLLM's `vllm run-batch` (OpenAI's batch file format) on the server's
// engine. Each input line is a request {"custom_id", "method": "POST", "url", "body"}; each
// output line, in the input's order, its answer {"id", "custom_id", "response": {"status_code",
// "request_id", "body"}, "error"}. The requests go to the server (serve's engine, every serve flag
// but the HTTP front end's) through its own HTTP routes on a loopback port, so a batch line is
// answered exactly as `lragent serve` answers that request, and the requests run batched together
// (continuous batching, shared trajectories), --max-concurrency at a time.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/serve_setup.h"
#include "core/text_file.h"

namespace lragent::cli {
namespace {

using nlohmann::json;

struct BatchFlags {
  ServeFlags engine;
  std::string input, output;
  int max_concurrency = 64;
};

// The routes a batch line may name (OpenAI's batch endpoints that lragent serves).
constexpr const char* kUrls[] = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"};

struct BatchLine {
  int line = 0;  // 1-based, in the input file
  std::string custom_id, url;
  json body;
};

// Reads and checks the whole input before any model loads: a malformed line stops the run with
// its line number (vLLM's run-batch stops at it too), having answered nothing.
Result<std::vector<BatchLine>> read_batch(const std::string& path) {
  LRA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  std::vector<BatchLine> out;
  std::set<std::string> ids;
  int number = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string_view raw(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++number;
    if (raw.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto bad = [&](std::string_view what) {
      return make_error(ErrorCode::kInvalidArgument, "{}, line {}: {} (a line is {{\"custom_id\": \"...\", \"method\": "
                                                     "\"POST\", \"url\": \"/v1/chat/completions\", \"body\": {{...}}}})",
                        path, number, what);
    };
    json j = json::parse(raw, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    BatchLine b;
    b.line = number;
    if (!j.contains("custom_id") || !j["custom_id"].is_string()) return bad("no \"custom_id\" string");
    b.custom_id = j["custom_id"].get<std::string>();
    if (!ids.insert(b.custom_id).second)
      return bad(fmt::format("custom_id \"{}\" is given twice (each request's must be unique)", b.custom_id));
    if (j.value("method", json()) != "POST") return bad("\"method\" must be \"POST\"");
    if (!j.contains("url") || !j["url"].is_string()) return bad("no \"url\" string");
    b.url = j["url"].get<std::string>();
    if (!j.contains("body") || !j["body"].is_object()) return bad("no \"body\" object");
    b.body = std::move(j["body"]);
    out.push_back(std::move(b));
  }
  if (out.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: no requests in it", path);
  return out;
}

std::string random_hex(std::mt19937_64& rng) { return fmt::format("{:016x}{:016x}", rng(), rng()); }

// One line's answer. Errors of the request itself (a bad body, a prompt too long) are answers
// too: the status and the error go in the line, as vLLM writes them, and the batch goes on.
json answer(httplib::Client& client, const BatchLine& b, std::mt19937_64& rng) {
  json out = {{"id", "lragent-" + random_hex(rng)}, {"custom_id", b.custom_id}};
  const std::string request_id = "lragent-batch-" + random_hex(rng);
  auto failed = [&](int status, const std::string& type, const std::string& message) {
    out["response"] = {{"status_code", status}, {"request_id", request_id}, {"body", nullptr}};
    out["error"] = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
    return out;
  };
  if (std::find(std::begin(kUrls), std::end(kUrls), b.url) == std::end(kUrls))
    return failed(400, "BadRequestError",
                  fmt::format("URL {} was used. Supported endpoints: {}", b.url, fmt::join(kUrls, ", ")));
  if (b.body.value("stream", false) == true)
    return failed(400, "BadRequestError", "\"stream\": true is not available in a batch: each answer is written whole");
  auto r = client.Post(b.url, b.body.dump(), "application/json");
  if (!r) return failed(500, "InternalServerError", "the engine did not answer: " + httplib::to_string(r.error()));
  json body = json::parse(r->body, nullptr, false);
  if (r->status != 200) {
    const json& e = body.is_object() && body.contains("error") && body["error"].is_object() ? body["error"] : json();
    return failed(r->status, e.value("type", std::string("BadRequestError")), e.value("message", r->body));
  }
  out["response"] = {{"status_code", 200}, {"request_id", request_id}, {"body", std::move(body)}};
  out["error"] = nullptr;
  return out;
}

// Progress on stderr: one rewritten line on a terminal, a line every tenth otherwise.
void show_progress(size_t done, size_t total, size_t failed, std::chrono::steady_clock::time_point t0) {
  static const bool tty = isatty(STDERR_FILENO) != 0;
  if (!tty && done != total && done % std::max<size_t>(1, total / 10) != 0) return;
  constexpr size_t kWidth = 24;
  const size_t fill = done * kWidth / total;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "{}[{}{}] {}/{} requests, {} failed, {:.1f} s{}", tty ? "\r\033[K" : "", std::string(fill, '#'),
             std::string(kWidth - fill, '.'), done, total, failed, s, tty && done < total ? "" : "\n");
}

int run_batch(const BatchFlags& f) {
  auto lines = read_batch(f.input);
  if (!lines.ok()) return report(lines.error());
  std::ofstream out(f.output, std::ios::binary | std::ios::trunc);
  if (!out) return report(make_error(ErrorCode::kIo, "{}: cannot write the output file", f.output));
  ServeFlags engine = f.engine;
  engine.quiet = true;  // no access log: the progress line says how the batch goes
  auto built = build_server(engine, server::CorsOptions{});
  if (!built.ok()) return report(built.error());
  server::Server& s = *built->server;
  auto port = s.bind("127.0.0.1", 0);
  if (!port.ok()) return report(port.error());
  std::thread serving([&s] { (void)s.serve(); });
  fmt::print(stderr, "run-batch: {} requests from {} on {} ({} at a time)\n", lines->size(), f.input,
             fmt::join(s.model_names(), ", "), std::min<size_t>(lines->size(), static_cast<size_t>(f.max_concurrency)));

  // Workers take lines in order; answers are written in the input's order as soon as every
  // earlier one is, so an interrupted run keeps what it finished.
  const size_t n = lines->size();
  std::vector<std::optional<json>> answers(n);
  std::mutex mu;
  std::atomic<size_t> next{0};
  size_t written = 0, failed = 0;
  bool write_failed = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto work = [&](uint64_t seed) {
    httplib::Client client("127.0.0.1", *port);
    client.set_read_timeout(24 * 3600, 0);  // a long generation is no failure
    client.set_write_timeout(600, 0);
    std::mt19937_64 rng(seed);
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      json a = answer(client, (*lines)[i], rng);
      std::lock_guard<std::mutex> lock(mu);
      if (!a["error"].is_null()) ++failed;
      answers[i] = std::move(a);
      for (; written < n && answers[written]; ++written) {
        out << answers[written]->dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
        answers[written].reset();
        show_progress(written + 1, n, failed, t0);
      }
      out.flush();
      if (!out) write_failed = true;
    }
  };
  std::vector<std::thread> workers;
  const uint64_t seed = std::random_device{}();
  for (size_t w = 0; w < std::min<size_t>(n, static_cast<size_t>(f.max_concurrency)); ++w)
    workers.emplace_back(work, seed + w);
  for (std::thread& t : workers) t.join();
  s.stop();
  serving.join();
  if (write_failed) return report(make_error(ErrorCode::kIo, "{}: writing the answers failed (disk full?)", f.output));
  fmt::print(stderr, "wrote {} answers to {} ({} failed requests, their errors in their lines)\n", n, f.output, failed);
  return 0;
}

}  // namespace

void register_run_batch(CLI::App& app, std::function<int()>& action) {
  static BatchFlags flags;
  BatchFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand(
      "run-batch",
      "Run a file of OpenAI API requests offline (vLLM's run-batch, OpenAI's batch file format): each line "
      "{\"custom_id\", \"method\": \"POST\", \"url\": /v1/completions | /v1/chat/completions | /v1/responses | "
      "/v1/messages, \"body\": the request}; each output line, in the same order, {\"id\", \"custom_id\", "
      "\"response\": {\"status_code\", \"request_id\", \"body\": the answer}, \"error\"}. A request's own error "
      "(HTTP 4xx as `lragent serve` would answer it) is written in its line and the batch goes on. The requests run "
      "batched together on the engine `lragent serve` runs, taking all of its engine flags");
  cmd->add_option("-i,--input-file", f->input, "The requests, one JSON object a line (JSONL)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output-file", f->output, "Where the answers go, one JSON object a line (overwritten)")->required();
  cmd->add_option("--max-concurrency", f->max_concurrency,
                  "Requests sent at once (the engine batches them, up to --max-num-seqs running)")
      ->default_val(64)
      ->check(cli::in_range(1, 4096));
  add_engine_flags(cmd, &f->engine);
  cmd->callback([f, &action] { action = [f] { return run_batch(*f); }; });
}

}  // namespace lragent::cli
