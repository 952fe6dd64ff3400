// libFuzzer target: arbitrary bytes as a `--config` flags file (core/config_file.h). The parser
// must answer (entries or an error naming a line), never crash or throw; what it reads must be
// well formed (keys of the flag alphabet, each once, a scalar with one value), and writing the
// entries back as double-quoted YAML must read back as the same entries.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "core/config_file.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "config file invariant broken: %s\n", what);
    std::abort();
  }
}

std::string quoted(const std::string& v) {
  std::string q = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      q += buf;
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = lragent::parse_config_file(text, "fuzz.yaml");
  if (!r.ok()) {
    check(r.error().message.rfind("fuzz.yaml, line ", 0) == 0, "an error names the file and line");
    return 0;
  }
  std::set<std::string> keys;
  std::string again;
  for (const lragent::ConfigEntry& e : *r) {
    check(!e.key.empty() && e.key.front() != '-', "a key is a flag's name without dashes");
    for (char c : e.key) check(c == '-' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'), "key alphabet");
    check(keys.insert(e.key).second, "a key once");
    check(e.list || e.values.size() == 1, "a scalar has one value");
    check(e.line >= 1, "a line number");
    again += e.key + ":";
    if (!e.list) {
      again += " " + quoted(e.values.front()) + "\n";
    } else if (e.values.empty()) {
      again += " []\n";
    } else {
      again += "\n";
      for (const std::string& v : e.values) again += "  - " + quoted(v) + "\n";
    }
  }
  auto back = lragent::parse_config_file(again, "again.yaml");
  check(back.ok(), "the entries written back are read");
  check(back->size() == r->size(), "as many entries read back");
  for (size_t i = 0; i < r->size(); ++i) {
    check((*back)[i].key == (*r)[i].key, "the same key read back");
    check((*back)[i].values == (*r)[i].values, "the same values read back");
    check((*back)[i].list == (*r)[i].list, "a list read back as a list");
  }
  return 0;
}
