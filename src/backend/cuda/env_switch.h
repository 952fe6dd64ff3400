// Switches for measuring on the device (launch structures, kernel variants): read from the
// environment by the launchers and the backend alike (host code of .cu and .cpp files).
#pragma once

#include <cstdlib>

namespace lragent::cuda {

// On unless the variable NAME is set to 0 (callers cache it: read once per process).
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return !v || std::atoi(v) != 0;
}

}  // namespace lragent::cuda
