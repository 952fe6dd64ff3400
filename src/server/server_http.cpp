// Server's HTTP side: the OpenAI-compatible routes, each turning a request body into
// Server::complete's work and its answer into JSON or server-sent events (server.cpp queues them,
// server_engine.cpp runs them).
#include <cerrno>
#include <cstring>
#include <random>
#include <tuple>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <fmt/core.h>
#include <httplib.h>

#include "engine/guide/grammar.h"
#include "server/client_socket.h"
#include "server/server_internal.h"

namespace lragent::server {
namespace routes {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const Error& e) { send_json(res, http_status(e.code), error_json(e)); }

// httplib reads a body sent as application/x-www-form-urlencoded (what `curl -d` sends) as form
// fields and refuses one over 8 KB with 413; read through a ContentReader, any body up to the
// payload limit arrives as is.
void post_route(httplib::Server& svr, const char* route,
                std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)> handler) {
  svr.Post(route, [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                 const httplib::ContentReader& read) {
    std::string body;
    // Without Content-Length or Transfer-Encoding a request has no body (RFC 9112 6.3); httplib
    // would read until the client closes, which `curl -X POST URL` never does (5 s, then a bare 400).
    if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
      // A multipart form's parts are read and dropped: the empty body is then refused as no JSON.
      const bool ok = req.is_multipart_form_data()
                          ? read([](const httplib::MultipartFormData&) { return true; },
                                 [](const char*, size_t) { return true; })
                          : read([&](const char* data, size_t n) {
                              body.append(data, n);
                              return true;
                            });
      if (!ok) return;  // res.status says why (413: over the payload limit); the error handler writes the body
    }
    handler(req, body, res);
  });
}

bool is_cors_preflight(const httplib::Request& req) {
  return req.method == "OPTIONS" && req.has_header("Origin") && req.has_header("Access-Control-Request-Method");
}

std::string random_hex() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}", rng());
}

std::string random_id(const char* prefix) { return fmt::format("{}-{}", prefix, random_hex()); }

}  // namespace routes

using nlohmann::json;
using namespace routes;

namespace {

// Whether the client of a plain (non-streaming) request is still there: its connection's socket,
// found among the process's descriptors; null when it cannot be found (then nobody is asked).
AliveFn connection_alive(const httplib::Request& http) {
  const int fd = find_client_socket(http.remote_addr, http.remote_port, http.local_port);
  if (fd < 0) return {};
  return [fd] { return client_still_there(fd); };
}

// Whether a streaming response's client is still there (its sink can take more).
AliveFn sink_alive(httplib::DataSink& sink) {
  return [&sink] { return !sink.is_writable || sink.is_writable(); };
}

// A typed event as the Responses and Messages streams send it: `event: TYPE` / `data: JSON`.
bool write_event(httplib::DataSink& sink, const json& e) {
  const std::string line = "event: " + e.value("type", "") + "\ndata: " + dump(e) + "\n\n";
  return sink.write(line.data(), line.size());
}

}  // namespace

Result<int> Server::bind(const std::string& host, int port) {
  int bound = -1;
  if (port == 0) {
    bound = http_->svr.bind_to_any_port(host);
  } else if (http_->svr.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound < 0)
    return make_error(ErrorCode::kIo, "cannot listen on {}:{} (in use, or not an address of this machine): pick "
                      "another --port or --host", host, port);
  // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the library):
  // a burst of clients connecting at once overflows it and the kernel drops their handshakes
  // (with SYN cookies some read "connection reset by peer"). listen() again on the listening
  // socket only raises its backlog (capped by net.core.somaxconn; uvicorn, vLLM's server, asks 2048).
  if (::listen(http_->socket, 4096) != 0)
    return make_error(ErrorCode::kIo, "cannot raise the listen backlog of {}:{}: {}", host, bound, std::strerror(errno));
  http_->bound = true;
  return bound;
}

Status Server::serve() {
  if (!http_->bound) return make_error(ErrorCode::kInternal, "Server::serve before bind");
  if (http_->stop_requested) return Status::Ok();
  const bool ok = http_->svr.listen_after_bind();
  if (!ok && !http_->stop_requested) return make_error(ErrorCode::kIo, "the server's socket failed");
  return Status::Ok();
}

void Server::stop() {
  if (!http_) return;
  http_->stop_requested = true;
  if (http_->svr.is_running()) {
    http_->svr.stop();
  } else if (http_->bound && http_->socket >= 0) {
    // Not listening yet (serve() may be about to): httplib's stop() does nothing then, and the
    // listen would go on for ever. A socket shut down makes its accept fail, so serve() returns.
    ::shutdown(http_->socket, SHUT_RDWR);
  }
}

void Server::install_routes() {
  httplib::Server& svr = http_->svr;
  svr.set_payload_max_length(opts_.max_body_bytes);
  const size_t threads = static_cast<size_t>(std::max(opts_.http_threads, 2));
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_keep_alive_timeout(opts_.keep_alive_seconds);
  // SO_REUSEADDR (a restarted server can listen at once) but not httplib's default SO_REUSEPORT,
  // with which a second server on a busy port would start and take half of its connections.
  svr.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    http_->socket = sock;  // the one bound last is the one that listens (bind() raises its backlog)
  });
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A browser's CORS preflight carries no API key: it is answered first, as vLLM answers it.
    if (is_cors_preflight(req)) {
      const CorsPreflight p = cors_preflight(opts_.cors, req.get_header_value("Origin"),
                                             req.get_header_value("Access-Control-Request-Method"),
                                             req.get_header_value("Access-Control-Request-Headers"));
      res.status = p.status;
      res.set_content(p.body, "text/plain; charset=utf-8");
      for (const auto& [name, value] : p.headers) res.set_header(name, value);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opts_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    // Anthropic's clients send the key as x-api-key.
    if (req.get_header_value("Authorization") == "Bearer " + opts_.api_key || req.get_header_value("x-api-key") == opts_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_json(res, 401,
              json{{"error", {{"message", "missing or wrong API key: send \"Authorization: Bearer <key>\" (or "
                                          "\"x-api-key: <key>\") with the server's --api-key"},
                              {"type", "authentication_error"},
                              {"param", nullptr},
                              {"code", 401}}}});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (res.status == 404)
      msg = fmt::format("no route {} {}: the server answers GET /health, GET /version, GET|POST /ping, GET /v1/models, "
                        "POST /v1/completions, "
                        "POST /v1/chat/completions, POST /v1/responses, GET|DELETE /v1/responses/{{id}}, "
                        "POST /v1/responses/{{id}}/cancel, POST /v1/messages, POST /v1/messages/count_tokens, POST /tokenize, "
                        "POST /detokenize, GET /lragent/sessions, GET /metrics",
                        req.method, req.path);
    else if (res.status == 413)
      msg = "the request body is larger than the server accepts";
    else
      msg = fmt::format("HTTP {}", res.status);
    const int status = res.status;
    const char* type = status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
    send_json(res, status, json{{"error", {{"message", msg}, {"type", type}, {"param", nullptr}, {"code", status}}}});
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, Error{ErrorCode::kInternal, fmt::format("internal error: {}", what)});
  });
  // Counted before the answer is written (the logger runs after it: a client could read
  // /metrics before its own request was counted).
  svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Every answer to a browser's cross-origin request says whether its page may read it (a
    // streamed one too: this runs before the headers are written).
    if (req.has_header("Origin") && !is_cors_preflight(req))
      for (const auto& [name, value] : cors_headers(opts_.cors, req.get_header_value("Origin"), req.has_header("Cookie")))
        res.set_header(name, value);
    // Known routes by name; anything else as "other" (a scan of random paths must not grow the
    // metrics without bound).
    static const char* const kRoutes[] = {"/health", "/version", "/ping", "/v1/models", "/v1/completions", "/v1/chat/completions",
                                          "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
                                          "/lragent/sessions", "/tokenize", "/detokenize", "/metrics",
                                          "/v1/load_lora_adapter", "/v1/unload_lora_adapter"};
    std::string route = "other";
    for (const char* r : kRoutes)
      if (req.path == r) route = r;
    if (req.path.rfind("/v1/responses/", 0) == 0)
      route = req.path.ends_with("/cancel") ? "/v1/responses/{id}/cancel" : "/v1/responses/{id}";
    metrics_.record_http(route, res.status);
    // Every answer names its request (a completion's handler set it to the id it is named by).
    if (opts_.request_id_headers && !res.has_header("X-Request-Id")) {
      const std::string given = req.get_header_value("X-Request-Id");
      res.set_header("X-Request-Id", valid_request_id(given) ? given : random_hex());
    }
  });
  if (opts_.log) {
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      opts_.log(fmt::format("{} {} {} {}", req.remote_addr, req.method, req.path, res.status));
    });
  }

  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, json{{"status", "ok"}}); });
  // vLLM's: its version (here lragent's), and /ping, which load balancers (SageMaker's) ask as /health.
  svr.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, json{{"version", LRAGENT_VERSION}});
  });
  auto ping = [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, json{{"status", "ok"}}); };
  svr.Get("/ping", ping);
  svr.Post("/ping", ping);
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    std::vector<std::string> names, roots;
    {
      std::lock_guard<std::mutex> lock(names_mu_);
      names = names_;
      roots = roots_;
    }
    // The base model under each of its served names (as vLLM lists them), then the adapters.
    auto card = [&](const std::string& id, const std::string& root, const json& parent) {
      data.push_back({{"id", id},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "lragent"},
                      {"root", root},
                      {"parent", parent},
                      {"max_model_len", opts_.max_model_len}});
    };
    for (size_t i = 0; i < names.size(); ++i) {
      card(names[i], roots[i], i == 0 ? json(nullptr) : json(names[0]));
      if (i == 0)
        for (const std::string& alias : opts_.base_aliases)
          if (alias != names[0]) card(alias, roots[0], nullptr);
    }
    send_json(res, 200, json{{"object", "list"}, {"data", data}});
  });
  svr.Get("/lragent/sessions", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    json list = json::array();
    for (const SessionPool::Info& s : sessions_) {
      json computed = json::object();
      for (size_t a = 0; a < s.agents.size(); ++a) computed[s.agents[a]] = s.computed[a];
      list.push_back({{"id", s.id},
                      {"running", s.running},
                      {"tokens", s.tokens},
                      {"agents", s.agents},
                      {"computed_tokens", computed},
                      {"cache", {{"base_bytes", s.bytes.base}, {"lr_bytes", s.bytes.lr}, {"full_bytes", s.bytes.full},
                                 {"total_bytes", s.bytes.total()}}}});
    }
    send_json(res, 200, json{{"kv_share", share_mode_name(share_mode())},
                             {"sessions", list},
                             {"evicted_sessions", sessions_kv_.evicted},
                             {"preempted_requests", sessions_kv_.preempted},
                             {"copied_sessions", sessions_kv_.copied},
                             // the one KV memory of every trajectory (null with an arena each):
                             // bytes in use, a page shared by copies once
                             {"kv_memory", sessions_kv_.arena_capacity < 0
                                               ? json(nullptr)
                                               : json{{"used_bytes", sessions_kv_.arena_used},
                                                      {"bytes", sessions_kv_.arena_capacity}}}});
  });
  // A known route with the wrong method: 405, as vLLM answers.
  auto wrong_method = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      send_json(res, 405, json{{"error", {{"message", fmt::format("{} takes {}, not {}", req.path, allow, req.method)},
                                          {"type", "invalid_request_error"}, {"param", nullptr}, {"code", 405}}}});
    };
  };
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                            "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/v1/load_lora_adapter",
                            "/v1/unload_lora_adapter"}) {
    svr.Get(route, wrong_method("POST"));
    svr.Put(route, wrong_method("POST"));
    svr.Delete(route, wrong_method("POST"));
    svr.Patch(route, wrong_method("POST"));
  }
  for (const char* route : {"/v1/models", "/health", "/lragent/sessions", "/metrics"}) {
    svr.Post(route, wrong_method("GET"));
    svr.Put(route, wrong_method("GET"));
    svr.Delete(route, wrong_method("GET"));
    svr.Patch(route, wrong_method("GET"));
  }
  // Never waits for the engine: the figures are those the last request left (metrics.h).
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    metrics_.set_stored_responses(static_cast<int64_t>(responses_->size()), static_cast<int64_t>(responses_->bytes()));
    res.status = 200;
    res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  post_route(svr, "/tokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    auto parsed = parse_tokenize_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    if (auto agent = agent_for(parsed->model); !agent.ok()) return send_error(res, agent.error());
    if (!tok_) return send_error(res, Error{ErrorCode::kInvalidArgument, "this model has no tokenizer.json to tokenize with"});
    std::string text = parsed->prompt;
    if (parsed->chat) {
      auto rendered = render_chat(parsed->messages, parsed->add_generation_prompt, parsed->enable_thinking, parsed->tools,
                                  parsed->template_kwargs, parsed->continue_final_message, parsed->chat_template);
      if (!rendered.ok()) return send_error(res, rendered.error());
      text = std::move(*rendered);
    }
    auto ids = tok_->encode(text, parsed->add_special_tokens);
    if (!ids.ok()) return send_error(res, ids.error());
    json strs = nullptr;
    if (parsed->return_token_strs) {
      strs = json::array();
      for (int32_t id : *ids) strs.push_back(tok_->id_to_token(id));
    }
    send_json(res, 200, json{{"count", ids->size()}, {"max_model_len", opts_.max_model_len}, {"tokens", *ids},
                             {"token_strs", std::move(strs)}});
  });
  post_route(svr, "/detokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    auto parsed = parse_detokenize_request(body);
    if (!parsed.ok()) return send_error(res, parsed.error());
    if (auto agent = agent_for(parsed->model); !agent.ok()) return send_error(res, agent.error());
    if (!tok_) return send_error(res, Error{ErrorCode::kInvalidArgument, "this model has no tokenizer.json to decode with"});
    if (Status in_vocab = check_vocab(parsed->tokens, "tokens"); !in_vocab.ok()) return send_error(res, in_vocab.error());
    send_json(res, 200, json{{"prompt", tok_->decode(parsed->tokens)}});
  });
  post_route(svr, "/v1/completions", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    auto parsed = parse_completion_request(body, opts_.sampling_defaults);
    if (!parsed.ok()) return send_error(res, parsed.error());
    respond(std::move(*parsed), /*chat=*/false, http, res);
  });
  post_route(svr, "/v1/chat/completions", [this](const httplib::Request& http, const std::string& body, httplib::Response& res) {
    // Before the body's own errors (unless the request may bring its own template).
    if (!opts_.chat_template && !opts_.trust_request_chat_template) return send_error(res, no_chat_template());
    ChatParsing parsing;
    auto req = chat_completion_request(body, &parsing);
    if (!req.ok()) return send_error(res, req.error());
    respond(std::move(*req), /*chat=*/true, http, res, parsing);
  });
  install_responses_routes();
  install_messages_routes();
  install_lora_routes();
}

Result<CompletionRequest> Server::chat_completion_request(std::string_view body, ChatParsing* parsing) const {
  LRA_ASSIGN_OR_RETURN(ChatRequest parsed, parse_chat_request(body, tool_call_format(), opts_.sampling_defaults));
  LRA_ASSIGN_OR_RETURN(std::string text, render_chat(parsed.messages, parsed.add_generation_prompt, parsed.enable_thinking,
                                                     parsed.tools, parsed.template_kwargs, parsed.continue_final_message,
                                                     parsed.chat_template));
  CompletionRequest req = std::move(parsed.req);
  PromptInput p;
  p.text = std::move(text);
  p.add_special_tokens = false;  // the template wrote BOS (or wants none), as vLLM tokenizes chat
  req.prompts = {std::move(p)};
  *parsing = ChatParsing{};
  parsing->tool_calls = parsed.tool_calls;
  // Qwen3 thinks unless the request turned it off (its template then closes an empty block).
  // A continued message goes on from its text, past any thinking: all of it is the answer.
  if (opts_.reasoning_parser && !parsed.continue_final_message)
    parsing->reasoning = *opts_.reasoning_parser != ReasoningFormat::kQwen3 || parsed.enable_thinking;
  if (req.thinking_token_budget >= 0 && !opts_.reasoning_parser)
    return make_error(ErrorCode::kInvalidArgument,
                      "'thinking_token_budget' needs to know where a model's thinking ends: serve it with "
                      "--reasoning-parser qwen3 or deepseek_r1");
  if (!parsing->reasoning.value_or(false)) req.thinking_token_budget = -1;  // no thinking to bound
  // A thinking model's structured output (a forced call too) is enforced once it has reasoned.
  if (parsing->reasoning.value_or(false) && !req.guided_from.empty()) {
    if (req.guided_grammar.empty()) req.guided_regex = after_reasoning(req.guided_regex);
    else req.guided_grammar = guide::grammar_after_reasoning(req.guided_grammar, req.guided_grammar_root, &req.guided_grammar_root);
  }
  return req;
}

ToolCallFormat Server::tool_call_format() const {
  if (opts_.tool_call_parser) return *opts_.tool_call_parser;
  return opts_.chat_template ? opts_.chat_template->tool_call_format : ToolCallFormat::kHermes;
}

void Server::respond(CompletionRequest req, bool chat, const httplib::Request& http, httplib::Response& res,
                     const ChatParsing& parsing) {
  // vLLM's: the client names the request (X-Request-Id, else the body's request_id) or it is random.
  const std::string header_id = http.get_header_value("X-Request-Id");
  const std::string base =
      valid_request_id(header_id) ? header_id : !req.request_id.empty() ? req.request_id : random_hex();
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + base;
  if (opts_.request_id_headers) res.set_header("X-Request-Id", base);
  const int64_t created = unix_now();
  // Errors found before the first byte (unknown model, too long) are HTTP errors, also when
  // streaming; later ones are an error event there.
  auto prepared = prepare(req);
  if (!prepared.ok()) return send_error(res, prepared.error());
  const std::string model = prepared->agent;
  auto usage_of = [](const std::vector<CompletionChoice>& cs) {
    const auto [prompt, completion] = count_tokens(cs);
    return json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  };
  auto stop_reason = [](const CompletionChoice& c) {
    return c.stop_reason ? json(*c.stop_reason) : c.stop_token ? json(*c.stop_token) : json(nullptr);
  };
  const bool want_logprobs = req.logprobs >= 0;
  // Tokens named by id: logprobs_json writes "token_id:<id>" when it has no tokenizer.
  const Tokenizer* lp_tok = req.return_tokens_as_token_ids || opts_.return_tokens_as_token_ids ? nullptr : tok_;
  // The logprobs object of tokens [from, end) of a choice (null when not asked for); `offset`:
  // the completions API's text offset, continued across a stream's events.
  auto logprobs_of = [lp_tok, chat, want_logprobs](std::span<const int32_t> ids, std::span<const StepLogprobs> lps,
                                                   size_t* offset) {
    return want_logprobs ? logprobs_json(lp_tok, chat, ids, lps, offset) : json(nullptr);
  };
  // A whole choice (non-streaming), or a stream's last event for it (no text; the log-probabilities
  // of its tokens from `sent` on, which no earlier event carried).
  auto choice_json = [chat, parsing, stop_reason, logprobs_of](size_t index, const CompletionChoice& c, bool whole, size_t sent,
                                                      size_t* offset) {
    const size_t from = std::min(sent, c.logprobs.size());
    json j = {{"index", index},
              {"logprobs", logprobs_of(std::span(c.token_ids).subspan(std::min(sent, c.token_ids.size())),
                                       std::span(c.logprobs).subspan(from), offset)},
              {"finish_reason", c.finish_reason},
              {"stop_reason", stop_reason(c)}};
    if (chat) {
      if (whole) {
        put_chat_message(j, c.text, parsing);
      } else {
        j["delta"] = json::object();
      }
    } else {
      j["text"] = whole ? c.text : "";
    }
    return j;
  };
  auto lragent_json = [this](const std::vector<CompletionChoice>& cs) {
    json per = json::array();
    for (const CompletionChoice& c : cs) {
      per.push_back({{"trajectory", c.trajectory}, {"reused_tokens", c.reused_tokens},
                     {"prefilled_tokens", c.prefilled_tokens}, {"token_ids", c.token_ids}});
      if (c.drafts.passes > 0)  // speculative decoding ran (--speculative-config)
        per.back()["speculative"] = c.drafts;
    }
    return json{{"kv_share", share_mode_name(share_mode())}, {"choices", per}};
  };
  if (!req.stream) {
    // The client is asked while its request waits and runs, as a streaming one is: gone (a
    // client-side timeout, a killed agent), its request stops ("abort") instead of running on.
    auto r = run(*prepared, {}, connection_alive(http));
    if (!r.ok()) return send_error(res, r.error());
    json choices = json::array();
    for (size_t i = 0; i < r->size(); ++i) {
      size_t offset = 0;
      const CompletionChoice& c = (*r)[i];
      choices.push_back(choice_json(i, c, true, 0, &offset));
      const std::vector<int32_t>& prompt = prepared->ids[c.prompt_index];
      if (!chat && req.echo && want_logprobs)  // the legacy form: the prompt's tokens lead
        choices.back()["logprobs"] = echo_logprobs_json(lp_tok, prompt, c.prompt_logprobs, req.logprobs, c.token_ids, c.logprobs);
      if (!chat && req.show_prompt_logprobs) choices.back()["prompt_logprobs"] = prompt_logprobs_json(tok_, prompt, c.prompt_logprobs);
    }
    json body = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                 {"model", model}, {"choices", choices}, {"usage", usage_of(*r)}, {"lragent", lragent_json(*r)}};
    if (chat && req.show_prompt_logprobs && !r->empty())  // vLLM's chat: once, for the one prompt
      body["prompt_logprobs"] = prompt_logprobs_json(tok_, prepared->ids.front(), r->front().prompt_logprobs);
    return send_json(res, 200, body);
  }
  auto p = std::make_shared<const Prepared>(std::move(*prepared));  // the provider is copied: share the ids
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, p, chat, parsing, id, created, model, usage_of,
                                                         choice_json, logprobs_of, lp_tok,
                                                         lragent_json](size_t, httplib::DataSink& sink) {
    auto send = [&sink](const json& j) {
      const std::string line = "data: " + dump(j) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    // Per choice: tokens whose log-probabilities went out, and the characters of text streamed
    // (each event's text_offset starts there, as vLLM's previous_text_lens).
    std::vector<size_t> sent, offset;
    // A chunk of one choice's events; with continuous_usage_stats it carries that choice's usage
    // so far (`completion`: its tokens; -1: those sent).
    auto chunk = [&](json choices, size_t index = 0, int64_t completion = -1) {
      json j = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                {"model", model}, {"choices", std::move(choices)}};
      if (p->req.continuous_usage && !j["choices"].empty()) {
        const int64_t prompt = static_cast<int64_t>(p->ids[index / static_cast<size_t>(p->req.n)].size());
        if (completion < 0) completion = index < sent.size() ? static_cast<int64_t>(sent[index]) : 0;
        j["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
      }
      return j;
    };
    auto piece = [chat](size_t index, json delta, json logprobs) {
      json j = {{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}};
      if (chat) j["delta"] = std::move(delta);
      else j["text"] = std::move(delta);
      return j;
    };
    std::vector<bool> opened;  // chat: the choice's first event (its role) went out
    auto open = [&](size_t index) {
      if (!chat) return true;
      if (opened.size() <= index) opened.resize(index + 1, false);
      if (opened[index]) return true;
      opened[index] = true;
      return send(chunk(json::array({piece(index, {{"role", "assistant"}, {"content", ""}}, nullptr)}), index, 0));
    };
    std::vector<ChatStream> texts;  // per choice: reasoning and tool calls parsed out (chat)
    auto grow = [&](size_t index) {
      if (sent.size() > index) return;
      sent.resize(index + 1, 0);
      offset.resize(index + 1, 0);
      texts.resize(index + 1, ChatStream(parsing, /*call_deltas=*/true));
    };
    // A chat delta: the reasoning when there is some, the content when there is some (or nothing
    // else to carry the event's log-probabilities).
    auto chat_delta = [](const ChatStream::Delta& d) {
      json delta = json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = delta["reasoning"] = d.reasoning;
      if (!d.content.empty() || (d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.content;
      if (!d.tool_calls.empty()) delta["tool_calls"] = d.tool_calls;
      return delta;
    };
    // While no piece comes (the request waits or computes its prompt) the socket is checked, so a
    // client that left before its request ran does not cost it a slot and its compute.
    const AliveFn alive = sink_alive(sink);
    auto r = run(*p, [&](const CompletionDelta& d) {
      if (!open(d.index)) return false;
      grow(d.index);
      sent[d.index] += d.token_ids.size();
      size_t at = offset[d.index];
      json lp;
      if (d.echo_logprobs) {  // the choice's first piece: the prompt's tokens lead, offsets as unstreamed
        const std::vector<int32_t>& prompt = p->ids[d.index / static_cast<size_t>(p->req.n)];
        lp = echo_logprobs_json(lp_tok, prompt, *d.echo_logprobs, p->req.logprobs, d.token_ids, d.logprobs,
                                &offset[d.index]);
      } else {
        lp = logprobs_of(d.token_ids, d.logprobs, &at);
        offset[d.index] += utf8_chars(d.text);
      }
      const ChatStream::Delta shown = texts[d.index].push(d.text);
      // Held back (a tag or a tool call may be starting): no event unless log-probabilities are due.
      if (shown.content.empty() && shown.reasoning.empty() && shown.tool_calls.empty() && lp.is_null()) return true;
      return send(chunk(json::array({piece(d.index, chat ? chat_delta(shown) : json(shown.content), std::move(lp))}), d.index));
    }, alive);
    if (!r.ok()) {
      send(error_json(r.error()));
    } else {
      for (size_t i = 0; i < r->size(); ++i) {
        open(i);
        grow(i);
        json last = choice_json(i, (*r)[i], false, sent[i], &offset[i]);
        ChatStream::End end = texts[i].finish();
        const int64_t done_tokens = (*r)[i].completion_tokens;
        if (chat && (!end.rest.content.empty() || !end.rest.reasoning.empty()))
          send(chunk(json::array({piece(i, chat_delta(end.rest), nullptr)}), i, done_tokens));
        if (!end.tool_call_deltas.empty())
          send(chunk(json::array({piece(i, {{"tool_calls", end.tool_call_deltas}}, nullptr)}), i, done_tokens));
        if (!end.tool_calls.empty()) last["finish_reason"] = "tool_calls";
        send(chunk(json::array({std::move(last)}), i, done_tokens));
      }
      if (p->req.include_usage) {
        json last = chunk(json::array());
        last["usage"] = usage_of(*r);
        last["lragent"] = lragent_json(*r);
        send(last);
      }
    }
    const std::string done = "data: [DONE]\n\n";
    sink.write(done.data(), done.size());
    sink.done();
    return true;
  });
}

void Server::send_event_log(httplib::Response& res, std::shared_ptr<EventLog> log, size_t from) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, log, from](size_t, httplib::DataSink& sink) {
    const AliveFn alive = sink_alive(sink);
    for (size_t at = from;;) {
      std::vector<json> events;
      const bool closed = log->read(at, kAlivePoll, &events);
      for (const json& e : events)
        if (!write_event(sink, e)) return false;
      at += events.size();
      if (closed) break;
      // A client gone, or a server stopping (which waits for this thread), ends the stream; the
      // response runs on.
      if (!alive() || http_->stop_requested.load()) return false;
    }
    sink.done();
    return true;
  });
}

void Server::respond_events(Prepared prepared, bool stream, const httplib::Request& http, httplib::Response& res,
                            std::shared_ptr<EventAnswer> answer) {
  if (!stream) {
    auto out = run(prepared, {}, connection_alive(http));
    if (!out.ok()) return answer->send_error(res, out.error());
    if (out->empty()) return answer->send_error(res, Error{ErrorCode::kInternal, "a request ended with no completion"});
    EventAnswer::Events unsent;
    answer->begin(unsent);
    CompletionDelta whole;  // the completion as one piece
    whole.text = out->front().text;
    whole.token_ids = out->front().token_ids;
    whole.logprobs = out->front().logprobs;
    answer->push(whole, unsent);
    answer->finish(out->front(), unsent);
    return send_json(res, 200, answer->whole());
  }
  auto p = std::make_shared<const Prepared>(std::move(prepared));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, p, answer](size_t, httplib::DataSink& sink) {
    auto send = [&sink](EventAnswer::Events& events) {
      bool ok = true;
      for (const json& e : events) ok = ok && write_event(sink, e);
      events.clear();
      return ok;
    };
    EventAnswer::Events events;
    answer->begin(events);
    if (!send(events)) return false;
    const AliveFn alive = sink_alive(sink);
    auto out = run(*p, [&](const CompletionDelta& d) {
      answer->push(d, events);
      return send(events);
    }, alive);
    if (!out.ok()) {
      answer->fail(out.error(), events);
    } else if (!out->empty()) {
      answer->finish(out->front(), events);
    }
    send(events);
    sink.done();
    return true;
  });
}

}  // namespace lragent::server
