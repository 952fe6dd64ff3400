// Element types of tensors as stored in files and caches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/result.h"

namespace lragent {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses the safetensors dtype spelling; unknown names (e.g. "F8_E4M3") are kUnsupported.
Result<DType> dtype_from_safetensors(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Round-to-nearest-even, NaN kept quiet.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of type `src_type` at `src` to f32. Supports f32/f16/bf16/f64/ints.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace lragent
