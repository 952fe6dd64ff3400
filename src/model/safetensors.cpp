#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <set>

#include <nlohmann/json.hpp>

#include "core/text_file.h"
#include "model/config.h"

namespace lragent {
namespace {

using json = nlohmann::json;

// A header above this is not a real checkpoint (the largest real headers are a few MB);
// refusing it keeps a corrupt length from turning into a huge parse.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Names come from untrusted files: keep error messages on one line and short.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 120)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (s.size() > 120) out += "...";
  return out;
}

// Safetensors dtypes that exist in the format but that lragent does not implement.
bool is_known_unsupported_dtype(std::string_view d) {
  static constexpr std::string_view kKnown[] = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2",
                                                "F4",      "E8M0",    "U16",     "U32",     "U64",  "C64"};
  return std::find(std::begin(kKnown), std::end(kKnown), d) != std::end(kKnown);
}

// Non-negative JSON integer (floats and negatives are refused).
bool get_u64(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

Result<TensorInfo> parse_entry(const std::string& name, const json& v, uint64_t data_size, const std::string& source) {
  const std::string n = printable(name);
  if (!v.is_object()) return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' entry is not a JSON object", source, n);
  TensorInfo info;
  info.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' has no string 'dtype'", source, n);
  const auto& dname = dt->get_ref<const std::string&>();
  auto parsed = dtype_from_safetensors(dname);
  if (!parsed.ok()) {
    if (is_known_unsupported_dtype(dname))
      return make_error(ErrorCode::kUnsupported, "{}: tensor '{}' has dtype {}, which lragent does not support{}",
                        source, n, dname, dname.starts_with("F8") ? " (FP8 checkpoints are not supported)" : "");
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' has unknown dtype '{}'", source, n, printable(dname));
  }
  info.dtype = *parsed;

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array())
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' has no 'shape' array", source, n);
  if (sh->size() > Dims::kMaxRank)
    return make_error(ErrorCode::kUnsupported, "{}: tensor '{}' has rank {}; lragent's tensors have at most {} dimensions",
                      source, n, sh->size(), Dims::kMaxRank);
  // numel * element size must fit in 64 bits; dims must fit in int64 (TensorView's type).
  uint64_t nbytes = dtype_size(info.dtype);
  for (const json& d : *sh) {
    uint64_t dim = 0;
    if (!get_u64(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX))
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' has a shape entry that is not a non-negative integer",
                        source, n);
    if (__builtin_mul_overflow(nbytes, dim, &nbytes))
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' shape overflows 64-bit byte size", source, n);
    info.shape.push_back(static_cast<int64_t>(dim));
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !get_u64((*off)[0], &info.begin) ||
      !get_u64((*off)[1], &info.end))
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' needs 'data_offsets' [begin, end] of non-negative integers",
                      source, n);
  if (info.begin > info.end || info.end > data_size)
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' data_offsets [{}, {}] are outside the data section of {} bytes",
                      source, n, info.begin, info.end, data_size);
  if (info.end - info.begin != nbytes)
    return make_error(ErrorCode::kCorrupt,
                      "{}: tensor '{}' has {} bytes in data_offsets but shape {} x {} needs {} bytes", source, n,
                      info.end - info.begin, TensorView(info.dtype, info.shape, nullptr).shape_str(),
                      dtype_name(info.dtype), nbytes);
  return info;
}

}  // namespace

Result<std::vector<TensorInfo>> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                         const std::string& source,
                                                         std::map<std::string, std::string>* metadata) {
  // The JSON reader stops at a NUL: bytes after one would go unread (the format pads with spaces).
  if (const size_t nul = header_json.find('\0'); nul != std::string_view::npos)
    return make_error(ErrorCode::kCorrupt, "{}: safetensors header has a NUL byte at offset {}", source, nul);
  LRA_ASSIGN_OR_RETURN(json header, parse_json(header_json, source));
  if (!header.is_object()) return make_error(ErrorCode::kCorrupt, "{}: safetensors header is not a JSON object", source);

  std::vector<TensorInfo> tensors;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return make_error(ErrorCode::kCorrupt, "{}: __metadata__ is not a JSON object", source);
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string())
          return make_error(ErrorCode::kCorrupt, "{}: __metadata__ value for '{}' is not a string", source, printable(k));
        if (metadata) (*metadata)[k] = mv.get<std::string>();
      }
      continue;
    }
    LRA_ASSIGN_OR_RETURN(TensorInfo info, parse_entry(name, v, data_size, source));
    tensors.push_back(std::move(info));
  }

  // Overlap check over byte ranges sorted by start; empty tensors occupy no bytes.
  std::vector<const TensorInfo*> by_begin;
  for (const auto& t : tensors)
    if (t.end > t.begin) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const TensorInfo* reach = nullptr;  // the tensor ending furthest so far
  for (const TensorInfo* t : by_begin) {
    if (reach && t->begin < reach->end)
      return make_error(ErrorCode::kCorrupt, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", source,
                        printable(reach->name), reach->begin, reach->end, printable(t->name), t->begin, t->end);
    if (!reach || t->end > reach->end) reach = t;
  }
  return tensors;
}

Status SafetensorsFile::init(const uint8_t* bytes, size_t size) {
  if (size < 8)
    return make_error(ErrorCode::kCorrupt, "{}: file is {} bytes, too short for a safetensors header length", path_,
                      size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > size - 8)
    return make_error(ErrorCode::kCorrupt, "{}: header length {} is larger than the {} bytes after it (truncated file?)",
                      path_, header_len, size - 8);
  if (header_len > kMaxHeaderBytes)
    return make_error(ErrorCode::kCorrupt, "{}: header length {} exceeds the 100 MB sanity limit", path_, header_len);
  const uint64_t data_size = size - 8 - header_len;
  const std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  LRA_ASSIGN_OR_RETURN(tensors_, parse_safetensors_header(header, data_size, path_, &metadata_));

  data_ = bytes + 8 + header_len;
  if (reinterpret_cast<uintptr_t>(data_) % 8 != 0 && data_size > 0) {
    try {
      owned_ = Tensor::empty(DType::kU8, {static_cast<int64_t>(data_size)});
    } catch (const std::bad_alloc&) {
      return make_error(ErrorCode::kOutOfMemory, "{}: cannot allocate {} bytes to realign the unaligned data section",
                        path_, data_size);
    }
    std::memcpy(owned_.view().data, data_, data_size);
    data_ = static_cast<const uint8_t*>(owned_.view().data);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    // Typed views read elements through T*: an unaligned start would be undefined behaviour.
    // Writers sort tensors by element size, so real files never hit this.
    if (t.begin % dtype_size(t.dtype) != 0)
      return make_error(ErrorCode::kUnsupported, "{}: tensor '{}' starts at data offset {}, not a multiple of its {}-byte {} elements",
                        path_, printable(t.name), t.begin, dtype_size(t.dtype), dtype_name(t.dtype));
    index_[t.name] = i;
  }
  return Status::Ok();
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return make_error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, "{}: cannot open: {}", path, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(ErrorCode::kIo, "{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kIo, "{}: not a regular file", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error(ErrorCode::kIo, "{}: mmap of {} bytes failed: {}", path, size, std::strerror(err));
    }
    f->map_ = p;
    f->map_size_ = size;
  }
  ::close(fd);  // the mapping keeps the file contents reachable
  LRA_RETURN_IF_ERROR(f->init(static_cast<const uint8_t*>(f->map_), size));
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_buffer(const void* data, size_t size,
                                                                      const std::string& source) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = source;
  LRA_RETURN_IF_ERROR(f->init(static_cast<const uint8_t*>(data), size));
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  // The mapping is read-only; the const_cast only fits TensorView's mutable data pointer.
  return TensorView(info.dtype, info.shape, const_cast<uint8_t*>(data_ + info.begin));
}

// ---- WeightStore ----------------------------------------------------------------------------

Result<std::unique_ptr<WeightStore>> WeightStore::open_file(const std::string& path) {
  LRA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  std::unique_ptr<WeightStore> ws(new WeightStore());
  ws->source_ = path;
  for (const TensorInfo& t : file->tensors()) ws->where_[t.name] = {0, &t};
  ws->files_.push_back(std::move(file));
  return ws;
}

Result<std::unique_ptr<WeightStore>> WeightStore::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(ErrorCode::kNotFound, "model directory {} does not exist or is not a directory", dir);
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  if (fs::exists(single, ec)) {
    LRA_ASSIGN_OR_RETURN(auto ws, open_file(single));
    ws->source_ = dir;
    return ws;
  }
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (!fs::exists(index_path, ec)) {
    const bool bin = fs::exists(fs::path(dir) / "pytorch_model.bin", ec) ||
                     fs::exists(fs::path(dir) / "pytorch_model.bin.index.json", ec);
    return make_error(ErrorCode::kNotFound, "no model.safetensors or model.safetensors.index.json in {}{}", dir,
                      bin ? " (it holds a pytorch_model.bin checkpoint, which is not supported: save it as safetensors, "
                            "e.g. model.save_pretrained(dir, safe_serialization=True))"
                          : "");
  }

  LRA_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  LRA_ASSIGN_OR_RETURN(nlohmann::json index, parse_json(text, index_path));
  auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || wm == index.end() || !wm->is_object())
    return make_error(ErrorCode::kCorrupt, "{}: no 'weight_map' object", index_path);

  std::unique_ptr<WeightStore> ws(new WeightStore());
  ws->source_ = dir;
  std::map<std::string, size_t> shard_index;  // shard file name -> files_ slot
  for (const auto& [tensor, shard_v] : wm->items()) {
    if (!shard_v.is_string())
      return make_error(ErrorCode::kCorrupt, "{}: weight_map entry for '{}' is not a string", index_path, printable(tensor));
    const std::string shard = shard_v.get<std::string>();
    // Shards live beside the index; refusing absolute paths and ".." keeps a hostile index in DIR.
    const fs::path rel(shard);
    if (shard.empty() || rel.is_absolute() || std::find(rel.begin(), rel.end(), "..") != rel.end())
      return make_error(ErrorCode::kCorrupt, "{}: shard name '{}' must be a relative path inside {}", index_path,
                        printable(shard), dir);
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const std::string shard_path = (fs::path(dir) / rel).string();
      if (!fs::exists(shard_path, ec))
        return make_error(ErrorCode::kNotFound, "{}: shard {} (holding '{}') not found", index_path, printable(shard),
                          printable(tensor));
      LRA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(shard_path));
      it = shard_index.emplace(shard, ws->files_.size()).first;
      ws->files_.push_back(std::move(file));
    }
    const TensorInfo* info = ws->files_[it->second]->find(tensor);
    if (!info)
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' is listed in the index but missing from shard {}",
                        index_path, printable(tensor), printable(shard));
    ws->where_[tensor] = {it->second, info};
  }
  return ws;
}

bool WeightStore::has(const std::string& name) const { return where_.count(name) != 0; }

Result<TensorView> WeightStore::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    return make_error(ErrorCode::kNotFound, "tensor '{}' not found in {}", printable(name), source_);
  return files_[it->second.first]->view(*it->second.second);
}

Result<TensorView> WeightStore::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  LRA_ASSIGN_OR_RETURN(TensorView v, get(name));
  if (v.shape != expected_shape)
    return make_error(ErrorCode::kCorrupt, "tensor {} in {} has shape {}, expected {}", printable(name), source_,
                      v.shape_str(), TensorView(v.dtype, expected_shape, nullptr).shape_str());
  return v;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, loc] : where_) out.push_back(name);
  return out;
}

// ---- writer -----------------------------------------------------------------------------------

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Data order as the reference writer: larger elements first, then by name, so every
  // tensor starts aligned to its element size.
  std::vector<const std::pair<std::string, TensorView>*> order;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.first == "__metadata__" || !seen.insert(t.first).second)
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor name '{}' is reserved or repeated", path, t.first);
    if (t.second.device != Device::kCpu || !t.second.is_contiguous() || (t.second.numel() > 0 && !t.second.data))
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' is not a contiguous CPU tensor", path, t.first);
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const size_t sa = dtype_size(a->second.dtype), sb = dtype_size(b->second.dtype);
    return sa != sb ? sa > sb : a->first < b->first;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto* t : order) {
    const uint64_t n = t->second.nbytes();
    header[t->first] = {{"dtype", dtype_name(t->second.dtype)},
                        {"shape", t->second.shape},
                        {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');  // pad with spaces so the data section is 8-aligned

  uint8_t len[8];  // [8] little-endian header length
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  // Write to a temporary name and rename, so a failed write never leaves a half file at `path`.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(ErrorCode::kIo, "{}: cannot create: {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto* t : order)
    if (ok && t->second.nbytes() > 0) ok = std::fwrite(t->second.data, 1, t->second.nbytes(), f) == t->second.nbytes();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return make_error(ErrorCode::kIo, "{}: write failed: {}", path, std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace lragent
