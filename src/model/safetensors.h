// safetensors reader: memory-maps one file or a sharded checkpoint
// (model.safetensors.index.json) and validates every header before use.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/tensor.h"

namespace lragent {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;
};

// Parses and validates a safetensors header (the JSON after the 8-byte length).
// `data_size` is the byte length of the data section. Checks: valid JSON object, known dtypes,
// non-negative shapes, end - begin == numel * dtype_size, offsets inside [0, data_size],
// no two tensors overlapping. `__metadata__` is returned in `metadata`.
// `source` names the file in error messages.
Result<std::vector<TensorInfo>> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                         const std::string& source,
                                                         std::map<std::string, std::string>* metadata = nullptr);

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses from an in-memory buffer (tests, fuzzing); the buffer must outlive the object.
  static Result<std::unique_ptr<SafetensorsFile>> from_buffer(const void* data, size_t size, const std::string& source);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // A view of the mapped bytes in the file dtype (read-only memory: never write through it).
  TensorView view(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  // Parses the 8-byte length and header of the file bytes and sets data_ (see owned_).
  Status init(const uint8_t* bytes, size_t size);

  std::string path_;
  void* map_ = nullptr;       // whole file mapping (nullptr for from_buffer)
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  // [data_size] u8: an aligned copy of the data section, only when the file's data section does
  // not start on an 8-byte boundary (header length not a multiple of 8), so typed views stay aligned.
  Tensor owned_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json (every shard is validated; the index must name existing
// tensors). Also used for adapter_model.safetensors via open_file().
class WeightStore {
 public:
  static Result<std::unique_ptr<WeightStore>> open_dir(const std::string& dir);
  static Result<std::unique_ptr<WeightStore>> open_file(const std::string& path);

  bool has(const std::string& name) const;
  // Errors name the tensor and the checkpoint directory.
  Result<TensorView> get(const std::string& name) const;
  // get() plus a shape check: "tensor X in DIR has shape [a, b], expected [c, d]".
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  std::vector<std::string> names() const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>> where_;  // name -> (file, info)
};

// Writes a safetensors file (tests, fixtures, synthetic models).
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace lragent
