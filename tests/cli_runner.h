// Runs the built `lragent` binary for CLI tests: exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "test_util.h"

namespace lragent::testing {

struct CliRun {
  int code = -1;  // exit code; 128 + signal when it crashed
  std::string out, err;
};

// Single-quotes a shell argument.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `lragent ARGS` (ARGS already shell-quoted where needed).
inline CliRun run_lragent(const std::string& args) {
  const std::string err_file = temp_dir("cli-stderr") + "/err.txt";
  const std::string cmd = shell_quote(lragent_bin()) + " " + args + " 2>" + shell_quote(err_file);
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = read_file(err_file);
  return r;
}

}  // namespace lragent::testing
