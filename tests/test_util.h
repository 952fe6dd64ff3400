// Helpers shared by all tests: where fixtures live.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>
#include <string>

#include <unistd.h>

namespace lragent::testing {

// Repository root (compile-time path of the source tree; LRAGENT_SOURCE overrides it for
// binaries built on one machine and run from another checkout, e.g. the GPU machine).
inline std::string source_dir() {
  if (const char* env = std::getenv("LRAGENT_SOURCE")) return env;
  return LRAGENT_SOURCE_DIR;
}
// ../shared beside the checkout (CI places it there); LRAGENT_SHARED overrides.
inline std::string shared_dir() {
  if (const char* env = std::getenv("LRAGENT_SHARED")) return env;
  return (std::filesystem::path(source_dir()).parent_path() / "shared").string();
}
inline std::string tinystories_dir() { return shared_dir() + "/models/tinystories-656k"; }
inline std::string adapters_dir() { return shared_dir() + "/adapters/tinystories-656k"; }
// Committed fixtures and goldens.
inline std::string fixtures_dir() { return source_dir() + "/tests/fixtures"; }
// Fixtures fetched by scripts/fetch-fixtures.sh (npm tokenizers); not committed.
inline std::string fetched_fixtures_dir() { return source_dir() + "/.fixtures"; }
// The built CLI binary (set by CTest; falls back to the build tree).
inline std::string lragent_bin() {
  if (const char* env = std::getenv("LRAGENT_BIN")) return env;
  return std::string(LRAGENT_BINARY_DIR) + "/lragent";
}
// strftime of a fixed UTC time, its weekday and day of the year filled in (tests pin a chat
// template's strftime_now with it, as the golden scripts pin transformers').
inline std::string strftime_at(const std::string& format, int year, int month, int day, int hour, int minute,
                               int second) {
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  const time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
  return std::string(buf, n);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// A fresh temporary directory for one test.
inline std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("lragent-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// scripts/test.sh fetches the npm tokenizer fixtures and sets LRAGENT_REQUIRE_FIXTURES=1, so that
// there a missing fixture fails the test; elsewhere (a build without the fetch) it is a skip.
inline bool fixtures_required() { return std::getenv("LRAGENT_REQUIRE_FIXTURES") != nullptr; }
#define LRAGENT_SKIP_UNLESS_REQUIRED(msg)                                \
  do {                                                                   \
    if (::lragent::testing::fixtures_required()) FAIL() << msg;          \
    GTEST_SKIP() << msg;                                                 \
  } while (0)

// Largest |a[i] - b[i]|; infinity when the lengths differ, both are empty, or any difference is
// not finite (a NaN in either would otherwise vanish in std::max and pass any tolerance).
inline float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<float>::infinity();
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!std::isfinite(d)) return std::numeric_limits<float>::infinity();
    m = std::max(m, d);
  }
  return m;
}

}  // namespace lragent::testing
