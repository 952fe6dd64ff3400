// libFuzzer target: arbitrary bytes as a safetensors file and as config.json text.
// Both parsers must return an error (never crash, throw or read out of bounds), and every
// error must name its source.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/safetensors.h"

namespace {

void check_names_source(const lragent::Error& e, const std::string& source) {
  if (e.message.rfind(source, 0) != 0) __builtin_trap();  // an error that does not name its file
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source = "<fuzz>";
  auto file = lragent::SafetensorsFile::from_buffer(data, size, source);
  if (file.ok()) {
    // Read every element through a typed view so ASan/UBSan see any out-of-range or
    // misaligned tensor the validator let through.
    float out[64];  // [min(numel, 64)] converted elements
    for (const lragent::TensorInfo& t : (*file)->tensors()) {
      const lragent::TensorView v = (*file)->view(t);
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < v.nbytes(); ++i) sink = sink ^ static_cast<const uint8_t*>(v.data)[i];
      const size_t n = static_cast<size_t>(v.numel()) < 64 ? static_cast<size_t>(v.numel()) : 64;
      lragent::convert_to_f32(v.dtype, v.data, out, n);
    }
  } else {
    check_names_source(file.error(), source);
  }
  auto cfg = lragent::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), source);
  if (!cfg.ok()) check_names_source(cfg.error(), source);
  return 0;
}
