#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "backend/backend.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace lragent {
namespace {

namespace fs = std::filesystem;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// A safetensors file from raw parts: 8-byte little-endian `header_len` (default: the real
// length), the header text, then `data`.
std::string raw_file(const std::string& header, const std::string& data, uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header_len >> (8 * i));
  return out + header + data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Opens `bytes` written to DIR/name and returns the error (the test fails if it opens).
Error open_error(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir + "/" + name;
  write_bytes(path, bytes);
  auto f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.ok()) << name << " opened but should not";
  if (f.ok()) return Error{};
  EXPECT_TRUE(Contains(f.error().message, path)) << "error does not name the file";
  return f.error();
}

// An F32 tensor [rows, cols] filled with base, base+1, ...
Tensor iota(int64_t rows, int64_t cols, float base) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  std::iota(v.begin(), v.end(), base);
  return Tensor::from_f32(v, {rows, cols});
}

TEST(Safetensors, LoadsTinyStoriesCheckpoint) {
  auto ws = WeightStore::open_dir(testing::tinystories_dir());
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  EXPECT_EQ((*ws)->names().size(), 20u);  // lm_head, 9 per layer, final norm
  auto lm = (*ws)->get("lm_head.weight", {2048, 128});
  ASSERT_TRUE(lm.ok()) << lm.error().message;
  EXPECT_EQ(lm->dtype, DType::kF32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(lm->data) % 8, 0u);
  EXPECT_TRUE((*ws)->has("model.layers.1.self_attn.k_proj.weight"));
  auto k = (*ws)->get("model.layers.1.self_attn.k_proj.weight", {128, 128});
  ASSERT_FALSE(k.ok());
  EXPECT_TRUE(Contains(k.error().message, "has shape [64, 128], expected [128, 128]"));
  EXPECT_TRUE(Contains(k.error().message, testing::tinystories_dir()));
  auto missing = (*ws)->get("model.embed_tokens.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);

  auto file = SafetensorsFile::open(testing::tinystories_dir() + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const TensorInfo* norm = (*file)->find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->shape, std::vector<int64_t>{128});
  EXPECT_EQ(norm->end - norm->begin, 512u);
}

// LlamaModel::load reports placement progress: on the CPU (the mapped files are read in place) one
// call at the end, done == total == every tensor's bytes; the CUDA test checks the per-tensor calls.
TEST(Safetensors, LoadReportsProgressOverEveryTensor) {
  auto file = SafetensorsFile::open(testing::tinystories_dir() + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto ws = WeightStore::open_dir(testing::tinystories_dir());
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  int64_t bytes = 0;  // tinystories ties lm_head and the embedding: 20 tensors, each placed once
  for (const std::string& name : (*ws)->names()) {
    const TensorInfo* t = (*file)->find(name);
    ASSERT_NE(t, nullptr) << name;
    bytes += static_cast<int64_t>(t->end - t->begin);
  }
  auto be = make_cpu_backend(1);
  std::vector<std::pair<int64_t, int64_t>> calls;
  auto m = LlamaModel::load(testing::tinystories_dir(), *be, [&](int64_t done, int64_t total) {
    calls.emplace_back(done, total);
  });
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].first, bytes);
  EXPECT_EQ(calls[0].second, bytes);
}

// A checkpoint whose weight has the right shape but an integer dtype (valid safetensors) is
// refused by name at load: before, the CPU and CUDA backends read its bytes as floats (on the GPU
// past the end of the upload).
TEST(Safetensors, ModelWeightsMustBeFloat) {
  const std::string dir = testing::temp_dir("int-weights");
  for (const char* f : {"config.json", "tokenizer.json"})
    fs::copy_file(testing::tinystories_dir() + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  auto src = SafetensorsFile::open(testing::tinystories_dir() + "/model.safetensors");
  ASSERT_TRUE(src.ok()) << src.error().message;
  std::vector<Tensor> keep;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const TensorInfo& info : (*src)->tensors()) {
    if (info.name == "model.norm.weight") {
      keep.push_back(Tensor::zeros(DType::kI32, info.shape));
      views.emplace_back(info.name, keep.back().view());
    } else {
      views.emplace_back(info.name, (*src)->view(info));
    }
  }
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", views).ok());
  auto be = make_cpu_backend(1);
  auto m = LlamaModel::load(dir, *be);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(m.error().message, "tensor model.norm.weight in " + dir + " is I32"));
  EXPECT_TRUE(Contains(m.error().message, "must be F32, F16 or BF16"));
}

TEST(Safetensors, RoundTripsEveryDtype) {
  const std::string dir = testing::temp_dir("st-roundtrip");
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                       DType::kI32, DType::kI16, DType::kI8,   DType::kU8,  DType::kBool};
  std::vector<Tensor> owned;
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (DType t : all) {
    Tensor x = Tensor::empty(t, {3, 5});  // [3, 5] bytes 0, 1, 2, ... (bools as 0/1)
    auto* bytes = static_cast<uint8_t*>(x.view().data);
    for (size_t i = 0; i < x.view().nbytes(); ++i) bytes[i] = static_cast<uint8_t>(t == DType::kBool ? i % 2 : i * 7);
    tensors.emplace_back(std::string("t_") + dtype_name(t), x.view());
    owned.push_back(std::move(x));
  }
  owned.push_back(Tensor::empty(DType::kF32, {}));  // a scalar
  owned.back().f32()[0] = 2.5f;
  tensors.emplace_back("scalar", owned.back().view());
  owned.push_back(Tensor::empty(DType::kBF16, {0, 4}));  // an empty tensor
  tensors.emplace_back("empty", owned.back().view());

  const std::string path = dir + "/all.safetensors";
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}}).ok());
  const std::string bytes = testing::read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "header must be padded to 8 bytes";

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->tensors().size(), tensors.size());
  EXPECT_EQ((*f)->metadata().at("note"), "round trip");
  for (const auto& [name, src] : tensors) {
    const TensorInfo* info = (*f)->find(name);
    ASSERT_NE(info, nullptr) << name;
    TensorView v = (*f)->view(*info);
    EXPECT_EQ(v.dtype, src.dtype) << name;
    EXPECT_EQ(v.shape, src.shape) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u) << name << " is misaligned";
    EXPECT_EQ(std::memcmp(v.data, src.data, src.nbytes()), 0) << name;
  }
  EXPECT_EQ(*(*f)->view(*(*f)->find("scalar")).f32(), 2.5f);
}

TEST(Safetensors, RealignsDataAfterUnpaddedHeader) {
  // Older writers did not pad the header: the data section then starts at an odd address.
  const std::string dir = testing::temp_dir("st-unpadded");
  float v[2] = {1.5f, -3.0f};
  std::string data(reinterpret_cast<const char*>(v), sizeof(v));
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 8, 0u);
  write_bytes(dir + "/odd.safetensors", raw_file(header, data));
  auto f = SafetensorsFile::open(dir + "/odd.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  TensorView x = (*f)->view(*(*f)->find("x"));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % 8, 0u);
  EXPECT_EQ(x.f32()[1], -3.0f);
}

TEST(Safetensors, OpensShardedCheckpoint) {
  const std::string dir = testing::temp_dir("st-sharded");
  Tensor a = iota(2, 3, 0.f), b = iota(4, 2, 100.f);
  ASSERT_TRUE(write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"a", a.view()}}).ok());
  ASSERT_TRUE(write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"b", b.view()}}).ok());
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"metadata":{"total_size":56},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
              R"("b":"model-00002-of-00002.safetensors"}})");
  auto ws = WeightStore::open_dir(dir);
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  EXPECT_EQ((*ws)->names(), (std::vector<std::string>{"a", "b"}));
  auto bv = (*ws)->get("b", {4, 2});
  ASSERT_TRUE(bv.ok()) << bv.error().message;
  EXPECT_EQ(bv->f32()[7], 107.f);
  EXPECT_EQ((*ws)->get("a")->f32()[5], 5.f);
}

TEST(Safetensors, ShardedIndexErrorsNameIndexAndShard) {
  const std::string dir = testing::temp_dir("st-badindex");
  Tensor a = iota(2, 2, 0.f);
  ASSERT_TRUE(write_safetensors(dir + "/s1.safetensors", {{"a", a.view()}}).ok());
  const std::string index = dir + "/model.safetensors.index.json";

  write_bytes(index, R"({"weight_map":{"a":"s1.safetensors","ghost":"s1.safetensors"}})");
  auto missing_tensor = WeightStore::open_dir(dir);
  ASSERT_FALSE(missing_tensor.ok());
  EXPECT_TRUE(Contains(missing_tensor.error().message, "'ghost' is listed in the index but missing from shard s1.safetensors"));
  EXPECT_TRUE(Contains(missing_tensor.error().message, index));

  write_bytes(index, R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  auto missing_shard = WeightStore::open_dir(dir);
  ASSERT_FALSE(missing_shard.ok());
  EXPECT_EQ(missing_shard.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(missing_shard.error().message, "shard s2.safetensors"));
  EXPECT_TRUE(Contains(missing_shard.error().message, "not found"));

  write_bytes(index, R"({"weight_map":{"a":"../s1.safetensors"}})");
  auto escape = WeightStore::open_dir(dir);
  ASSERT_FALSE(escape.ok());
  EXPECT_TRUE(Contains(escape.error().message, "must be a relative path inside"));

  write_bytes(index, R"({"weight_map": ["a"]})");
  auto no_map = WeightStore::open_dir(dir);
  ASSERT_FALSE(no_map.ok());
  EXPECT_TRUE(Contains(no_map.error().message, "no 'weight_map' object"));
}

TEST(Safetensors, MissingDirectoryOrFileIsNotFoundWithHint) {
  auto gone = WeightStore::open_dir("/nonexistent/lragent-model");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(gone.error().message, "/nonexistent/lragent-model"));

  const std::string empty = testing::temp_dir("st-emptydir");
  auto none = WeightStore::open_dir(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(none.error().message, "no model.safetensors or model.safetensors.index.json in " + empty);
  std::ofstream(empty + "/pytorch_model.bin") << "pickle";
  auto bin = WeightStore::open_dir(empty);
  ASSERT_FALSE(bin.ok());
  EXPECT_TRUE(Contains(bin.error().message, "pytorch_model.bin checkpoint, which is not supported: save it as safetensors"));
  fs::remove(empty + "/pytorch_model.bin");

  auto file = SafetensorsFile::open(empty + "/nope.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(file.error().message, "nope.safetensors"));
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  const std::string dir = testing::temp_dir("st-corrupt");
  const std::string data16(16, '\x01');
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";

  // A valid file cut short: the data section no longer holds the tensor.
  Tensor a = iota(4, 4, 0.f);
  ASSERT_TRUE(write_safetensors(dir + "/full.safetensors", {{"a", a.view()}}).ok());
  std::string full = testing::read_file(dir + "/full.safetensors");
  EXPECT_TRUE(Contains(open_error(dir, "cut.safetensors", full.substr(0, full.size() - 10)).message,
              "outside the data section"));
  EXPECT_TRUE(Contains(open_error(dir, "tiny.safetensors", full.substr(0, 5)).message, "too short"));
  EXPECT_TRUE(Contains(open_error(dir, "halfheader.safetensors", full.substr(0, 20)).message,
              "header length"));

  Error e = open_error(dir, "biglen.safetensors", raw_file("{" + ok_entry + "}", data16, 1u << 20));
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(Contains(e.message, "header length 1048576 is larger than"));

  e = open_error(dir, "badjson.safetensors", raw_file("{\"x\": [1, 2", data16));
  EXPECT_TRUE(Contains(e.message, "invalid JSON"));

  // The JSON reader would stop at the NUL and never read what follows it.
  e = open_error(dir, "nul.safetensors", raw_file("{" + ok_entry + std::string("}\0garbage", 9), data16));
  EXPECT_TRUE(Contains(e.message, "header has a NUL byte at offset"));

  e = open_error(dir, "notobject.safetensors", raw_file("[1, 2]", ""));
  EXPECT_TRUE(Contains(e.message, "header is not a JSON object"));

  e = open_error(dir, "range.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})", data16));
  EXPECT_TRUE(Contains(e.message, "data_offsets [8, 24] are outside the data section of 16 bytes"));

  e = open_error(dir, "overlap.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", data16));
  EXPECT_TRUE(Contains(e.message, "'x' [0, 8) and 'y' [4, 12) overlap"));

  e = open_error(dir, "size.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", data16));
  EXPECT_TRUE(Contains(e.message, "has 16 bytes in data_offsets but shape [3, 2] x F32 needs 24 bytes"));

  e = open_error(dir, "dtype.safetensors",
                 raw_file(R"({"x":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", data16));
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(Contains(e.message, "unknown dtype 'Q4'"));

  e = open_error(dir, "fp8.safetensors",
                 raw_file(R"({"x":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]}})", data16));
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "FP8"));

  e = open_error(dir, "negshape.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data16));
  EXPECT_TRUE(Contains(e.message, "not a non-negative integer"));

  e = open_error(dir, "overflow.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", data16));
  EXPECT_TRUE(Contains(e.message, "overflows"));

  // Tensors hold at most Dims::kMaxRank (8) extents: a rank-9 shape is refused, not truncated.
  e = open_error(dir, "rank9.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[1,1,1,1,1,1,1,2,2],"data_offsets":[0,16]}})", data16));
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "tensor 'x' has rank 9; lragent's tensors have at most 8 dimensions")) << e.message;

  e = open_error(dir, "nooffsets.safetensors", raw_file(R"({"x":{"dtype":"F32","shape":[4]}})", data16));
  EXPECT_TRUE(Contains(e.message, "'x' needs 'data_offsets'"));

  e = open_error(dir, "meta.safetensors", raw_file(R"({"__metadata__":{"n":3},)" + ok_entry + "}", data16));
  EXPECT_TRUE(Contains(e.message, "__metadata__ value for 'n' is not a string"));

  e = open_error(dir, "unaligned.safetensors",
                 raw_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})", data16));
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "not a multiple of its 4-byte F32 elements"));
}

TEST(Safetensors, RefusesImplausiblyLargeHeader) {
  // A sparse file big enough to hold a 200 MB "header" without writing it.
  const std::string path = testing::temp_dir("st-huge") + "/huge.safetensors";
  write_bytes(path, raw_file("", "", 200ull << 20));
  ASSERT_EQ(::truncate(path.c_str(), (200ll << 20) + 8), 0);
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(Contains(f.error().message, "exceeds the 100 MB sanity limit"));
  EXPECT_TRUE(Contains(f.error().message, path));
}

TEST(Safetensors, FromBufferParsesInMemoryBytes) {
  float v[4] = {1, 2, 3, 4};
  alignas(8) char buf[128];
  std::string bytes = raw_file(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}      )",
                               std::string(reinterpret_cast<const char*>(v), 16));
  ASSERT_LE(bytes.size(), sizeof(buf));
  std::memcpy(buf, bytes.data(), bytes.size());
  auto f = SafetensorsFile::from_buffer(buf, bytes.size(), "<memory>");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->view((*f)->tensors()[0]).f32()[3], 4.f);
  auto bad = SafetensorsFile::from_buffer(buf, 6, "<memory>");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.error().message, "<memory>"));
}

TEST(Safetensors, WriterRefusesDuplicateNames) {
  Tensor a = iota(1, 2, 0.f);
  const std::string path = testing::temp_dir("st-dup") + "/dup.safetensors";
  Status s = write_safetensors(path, {{"a", a.view()}, {"a", a.view()}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message.find("tensor name 'a' is reserved or repeated"), std::string::npos) << s.error().message;
  EXPECT_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace lragent
