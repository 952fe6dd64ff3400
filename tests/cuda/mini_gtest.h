// Minimal GoogleTest subset (TEST, EXPECT_*/ASSERT_* with <<, GTEST_SKIP, main) used ONLY by
// scripts/gpu-check.sh's fallback build when the device image has no GTest. The CMake build
// always uses the real GoogleTest.
#pragma once

#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace mini_gtest {

struct TestInfo {
  std::string name;
  std::function<void()> fn;
};
inline std::vector<TestInfo>& registry() {
  static std::vector<TestInfo> r;
  return r;
}
struct State {
  bool failed = false, skipped = false;
};
inline State& state() {
  static State s;
  return s;
}
struct Registrar {
  Registrar(const char* suite, const char* name, std::function<void()> fn) {
    registry().push_back({std::string(suite) + "." + name, std::move(fn)});
  }
};
struct Reporter {
  std::ostringstream os;
  const char* file;
  int line;
  bool skip;
  Reporter(const char* f, int l, const char* what, bool is_skip) : file(f), line(l), skip(is_skip) {
    if (what) os << what << " ";
  }
  ~Reporter() {
    if (skip) {
      state().skipped = true;
      std::cout << "  SKIPPED: " << os.str() << "\n";
    } else {
      state().failed = true;
      std::cout << file << ":" << line << ": Failure: " << os.str() << "\n";
    }
  }
  std::ostream& stream() { return os; }
};
struct Voidify {
  void operator=(std::ostream&) {}
};

inline int run_all(int argc, char** argv) {
  std::string filter;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--gtest_filter=", 15) == 0) filter = argv[i] + 15;
  int failed = 0, run = 0;
  for (auto& t : registry()) {
    if (!filter.empty() && filter != "*" && t.name.find(filter) == std::string::npos) continue;
    state() = State{};
    std::cout << "[ RUN      ] " << t.name << std::endl;
    t.fn();
    ++run;
    if (state().failed) ++failed;
    std::cout << (state().failed ? "[  FAILED  ] " : state().skipped ? "[  SKIPPED ] " : "[       OK ] ") << t.name
              << std::endl;
  }
  std::cout << "[==========] " << run << " tests, " << failed << " failed" << std::endl;
  return failed ? 1 : 0;
}

}  // namespace mini_gtest

#define MINI_GTEST_CONCAT2(a, b) a##b
#define MINI_GTEST_CONCAT(a, b) MINI_GTEST_CONCAT2(a, b)
#define TEST(suite, name)                                                                          \
  static void MINI_GTEST_CONCAT(suite##_##name, _body)();                                          \
  static ::mini_gtest::Registrar MINI_GTEST_CONCAT(suite##_##name, _reg)(#suite, #name,           \
                                                                         &MINI_GTEST_CONCAT(suite##_##name, _body)); \
  static void MINI_GTEST_CONCAT(suite##_##name, _body)()
#define MINI_GTEST_CHECK(cond, text, fatal) \
  if (cond)                                 \
    ;                                       \
  else                                      \
    fatal ::mini_gtest::Voidify() = ::mini_gtest::Reporter(__FILE__, __LINE__, text, false).stream()
#define EXPECT_TRUE(c) MINI_GTEST_CHECK((c), #c, )
#define ASSERT_TRUE(c) MINI_GTEST_CHECK((c), #c, return)
#define EXPECT_FALSE(c) MINI_GTEST_CHECK(!(c), "!(" #c ")", )
#define EXPECT_EQ(a, b) MINI_GTEST_CHECK((a) == (b), #a " == " #b, )
#define ASSERT_EQ(a, b) MINI_GTEST_CHECK((a) == (b), #a " == " #b, return)
#define EXPECT_LE(a, b) MINI_GTEST_CHECK((a) <= (b), #a " <= " #b, )
#define ASSERT_LE(a, b) MINI_GTEST_CHECK((a) <= (b), #a " <= " #b, return)
#define EXPECT_LT(a, b) MINI_GTEST_CHECK((a) < (b), #a " < " #b, )
#define EXPECT_GT(a, b) MINI_GTEST_CHECK((a) > (b), #a " > " #b, )
#define ADD_FAILURE() ::mini_gtest::Voidify() = ::mini_gtest::Reporter(__FILE__, __LINE__, "", false).stream()
#define GTEST_SKIP() return ::mini_gtest::Voidify() = ::mini_gtest::Reporter(__FILE__, __LINE__, "", true).stream()
#define SCOPED_TRACE(x) (void)0

int main(int argc, char** argv) { return ::mini_gtest::run_all(argc, argv); }
