// Cross-origin requests (CORS), as vLLM's server answers them (Starlette's CORSMiddleware with
// vLLM's --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials; every
// origin, method and header allowed by default), so that a web page on another origin can call
// the server from a browser: a preflight (OPTIONS with Origin and Access-Control-Request-Method)
// is answered before the routes and the API key (a browser sends none with it), and every answer
// to a request with an Origin carries Access-Control-Allow-Origin when that origin is allowed.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace lragent::server {

struct CorsOptions {
  std::vector<std::string> allowed_origins = {"*"};  // "*": any
  std::vector<std::string> allowed_methods = {"*"};  // "*": DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT
  std::vector<std::string> allowed_headers = {"*"};  // "*": whatever a preflight asks for
  bool allow_credentials = false;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The headers of the answer to a request (not a preflight) whose Origin header is `origin`
// (empty: none, no headers); `has_cookie`: it sends a Cookie (an allowed origin is then named, not "*").
HeaderList cors_headers(const CorsOptions& o, std::string_view origin, bool has_cookie);

// The answer to a preflight from `origin` asking for `method` and `request_headers` (its
// Access-Control-Request-Headers, comma-separated; may be empty): 200 "OK", or 400 "Disallowed
// CORS origin, method, headers" (those that fail), with its headers either way.
struct CorsPreflight {
  int status = 200;
  std::string body;
  HeaderList headers;
};
CorsPreflight cors_preflight(const CorsOptions& o, std::string_view origin, std::string_view method,
                             std::string_view request_headers);

// A flag's list: a JSON array of strings (vLLM's form, '["https://a.example", "https://b.example"]')
// or comma-separated values. kInvalidArgument names `flag`.
Result<std::vector<std::string>> parse_cors_list(std::string_view text, std::string_view flag);

}  // namespace lragent::server
