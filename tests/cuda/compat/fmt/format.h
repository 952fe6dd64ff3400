// Fallback stand-in for <fmt/format.h>, used ONLY by scripts/gpu-check.sh's direct nvcc build
// when the device image has no fmt headers. core/result.h names fmt::format_string and
// fmt::format in a template that the CUDA test never instantiates; this makes it parse.
#pragma once

#include <string>

namespace fmt {
template <typename... Args>
using format_string = const char*;
template <typename... Args>
std::string format(const char* f, Args&&...) {
  return f;
}
}  // namespace fmt
