#include "server/cors.h"

#include <algorithm>
#include <cctype>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace lragent::server {
namespace {

constexpr int kMaxAgeSeconds = 600;  // how long a browser may keep a preflight's answer (Starlette's)
const std::vector<std::string> kAllMethods = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
// Headers a browser sends without asking (the CORS safelist), always allowed.
const std::vector<std::string> kSafelisted = {"Accept", "Accept-Language", "Content-Language", "Content-Type"};

bool has_star(const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "*") != v.end(); }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// "a, b ,c," -> {"a", "b", "c", ""}: the items between commas, trimmed (an empty text: none).
std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  for (size_t at = 0; !s.empty() && at <= s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.emplace_back(trim(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool origin_allowed(const CorsOptions& o, std::string_view origin) {
  return has_star(o.allowed_origins) ||
         std::find(o.allowed_origins.begin(), o.allowed_origins.end(), origin) != o.allowed_origins.end();
}

}  // namespace

HeaderList cors_headers(const CorsOptions& o, std::string_view origin, bool has_cookie) {
  HeaderList h;
  if (origin.empty()) return h;
  const bool any_origin = has_star(o.allowed_origins);
  // A request with credentials (a cookie) may not be answered with "*": the origin is named.
  if ((any_origin && has_cookie) || (!any_origin && origin_allowed(o, origin))) {
    h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    h.emplace_back("Vary", "Origin");
  } else if (any_origin) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  }
  if (o.allow_credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  return h;
}

CorsPreflight cors_preflight(const CorsOptions& o, std::string_view origin, std::string_view method,
                             std::string_view request_headers) {
  CorsPreflight p;
  const bool any_origin = has_star(o.allowed_origins), any_header = has_star(o.allowed_headers);
  const bool name_origin = !any_origin || o.allow_credentials;
  const std::vector<std::string>& methods = has_star(o.allowed_methods) ? kAllMethods : o.allowed_methods;
  std::vector<std::string> headers = kSafelisted;  // [allowed header names, sorted, once each]
  for (const std::string& x : o.allowed_headers)
    if (x != "*") headers.push_back(x);
  std::sort(headers.begin(), headers.end());
  headers.erase(std::unique(headers.begin(), headers.end()), headers.end());

  std::vector<std::string> failures;
  if (!origin_allowed(o, origin)) failures.push_back("origin");
  if (name_origin) {
    p.headers.emplace_back("Vary", "Origin");
    if (failures.empty()) p.headers.emplace_back("Access-Control-Allow-Origin", std::string(origin));
  } else {
    p.headers.emplace_back("Access-Control-Allow-Origin", "*");
  }
  p.headers.emplace_back("Access-Control-Allow-Methods", join(methods));
  p.headers.emplace_back("Access-Control-Max-Age", std::to_string(kMaxAgeSeconds));
  if (std::find(methods.begin(), methods.end(), method) == methods.end()) failures.push_back("method");
  const std::string_view asked = trim(request_headers);
  if (any_header) {
    if (!asked.empty()) p.headers.emplace_back("Access-Control-Allow-Headers", std::string(asked));
  } else {
    p.headers.emplace_back("Access-Control-Allow-Headers", join(headers));
    std::vector<std::string> allowed;
    for (const std::string& x : headers) allowed.push_back(lower(x));
    for (const std::string& name : split_list(asked))
      if (std::find(allowed.begin(), allowed.end(), lower(name)) == allowed.end()) {
        failures.push_back("headers");
        break;
      }
  }
  if (o.allow_credentials) p.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  p.status = failures.empty() ? 200 : 400;
  p.body = failures.empty() ? "OK" : "Disallowed CORS " + join(failures);
  return p;
}

Result<std::vector<std::string>> parse_cors_list(std::string_view text, std::string_view flag) {
  const std::string_view t = trim(text);
  std::vector<std::string> out;
  if (t.starts_with("[")) {
    const auto j = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array() ||
        !std::all_of(j.begin(), j.end(), [](const nlohmann::json& x) { return x.is_string(); }))
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: '{}' is not a JSON list of strings (e.g. '[\"https://app.example\"]'; or give them "
                        "comma-separated)",
                        flag, text);
    for (const auto& x : j) out.push_back(x.get<std::string>());
    return out;
  }
  out = split_list(t);
  out.erase(std::remove(out.begin(), out.end(), std::string()), out.end());  // "GET, POST," lists two
  return out;
}

}  // namespace lragent::server
