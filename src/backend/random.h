// Counter-based random numbers shared by every backend's fill_random: element `index` of
// stream `seed` is a pure function of the two, so synthetic weights generated on a GPU equal
// the CPU's (up to the last-ulp differences of logf/cosf between host and device libm).
// Plain C++ that nvcc also compiles for the device.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LRA_HOST_DEVICE __host__ __device__
#else
#define LRA_HOST_DEVICE
#endif

namespace lragent {

LRA_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// N(0, 1) by Box-Muller from one 64-bit hash: 24 bits per uniform, u1 in (0, 1].
LRA_HOST_DEVICE inline float random_normal_at(uint64_t seed, uint64_t index) {
  const uint64_t h = splitmix64(seed * 0x2545f4914f6cdd1dull ^ splitmix64(index));
  const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>((h >> 16) & 0xffffffull) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace lragent
