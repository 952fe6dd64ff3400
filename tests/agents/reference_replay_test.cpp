// `lragent replay` against an independent numpy reference (tests/agents/reference_replay.py):
// every KV sharing mode x every tinystories-656k adapter set, on a script cut from a real agent
// trajectory. The comparison itself lives in tests/agents/check_replay.py; this wrapper runs it.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace lragent {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command; returns the exit code and appends stdout+stderr to *out.
int run_shell(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ReferenceReplay, AllModesAndAdapterSetsMatchNumpyReference) {
  // Everything it needs is installed (scripts/setup.sh: python3-numpy), built or beside the
  // checkout (../shared) wherever the tests run: a missing piece fails the test, it is no skip.
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  std::string probe;
  ASSERT_EQ(run_shell(std::string(kPython) + " -c 'import numpy'", &probe), 0)
      << kPython << " lacks numpy (apt-get install python3-numpy): " << probe;
  const std::string bin = testing::lragent_bin();
  const std::string shared = testing::shared_dir();
  ASSERT_TRUE(fs::exists(bin)) << bin << " is missing (build the lragent target)";
  ASSERT_TRUE(fs::exists(testing::tinystories_dir() + "/model.safetensors")) << testing::tinystories_dir() << " is missing";
  ASSERT_TRUE(fs::exists(shared + "/data/agent-trajectories/13b_hotpotqa_200.json"))
      << shared << "/data/agent-trajectories is missing";

  const std::string script = testing::source_dir() + "/tests/agents/check_replay.py";
  const std::string cmd = std::string(kPython) + " " + quote(script) + " --lragent " + quote(bin) + " --shared " +
                          quote(shared);
  std::string out;
  const int code = run_shell(cmd, &out);
  EXPECT_EQ(code, 0) << cmd << "\n" << out;
  // The driver's last line is the tally ("N passed, 0 failed").
  EXPECT_NE(out.find(" passed, 0 failed"), std::string::npos) << out;
  if (code == 0) std::printf("%s", out.c_str());
}

}  // namespace
}  // namespace lragent
