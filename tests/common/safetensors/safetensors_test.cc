#include "common/safetensors/safetensors.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/io/io.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/io/test_files.h"

namespace coli::st {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

using ::coli::test_files::Pattern;
using ::coli::test_files::TempDir;
using ::coli::test_files::WriteRaw;

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file written by hand (so malformed headers can be made).
std::string RawFile(const std::string& header_json, const std::string& data) {
  return LengthPrefix(header_json.size()) + header_json + data;
}

// ---- Fixtures: tensors whose byte ranges start and end off 4 KiB boundaries ------------------

struct FixtureTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

size_t Bytes(DType dtype, const std::vector<int64_t>& shape) {
  size_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<FixtureTensor> MakeTensors(const std::string& prefix, uint32_t seed) {
  std::vector<std::pair<DType, std::vector<int64_t>>> specs = {
      {DType::kBF16, {37, 101}},                      // 7474 bytes: ends off 4 KiB
      {DType::kF32, {3, 1365}},                       // 16380 bytes
      {DType::kU8, {4097}},                           // 4097
      {DType::kI64, {2, 2}},     {DType::kF16, {0}},  // empty tensor
      {DType::kU8, {8192}},      {DType::kF8E4M3, {5, 7, 3}},
  };
  std::vector<FixtureTensor> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& [dtype, shape] = specs[i];
    out.push_back({prefix + ".t" + std::to_string(i), dtype, shape,
                   Pattern(Bytes(dtype, shape), seed * 100 + static_cast<uint32_t>(i))});
  }
  return out;
}

void WriteShard(const std::string& path, const std::vector<FixtureTensor>& tensors) {
  Writer w;
  for (const FixtureTensor& t : tensors) ASSERT_OK(w.Add(t.name, t.dtype, t.shape, t.bytes));
  ASSERT_OK(w.Write(path));
}

// Three shards plus an index in `dir` (shard k holds the tensors "layers.k.*").
std::map<std::string, FixtureTensor> WriteThreeShards(const std::string& dir,
                                                      std::vector<std::string> shard_dirs = {}) {
  std::map<std::string, FixtureTensor> all;
  std::map<std::string, std::string> weight_map;
  for (int k = 0; k < 3; ++k) {
    std::string shard = "model-0000" + std::to_string(k + 1) + "-of-000003.safetensors";
    std::vector<FixtureTensor> tensors =
        MakeTensors("layers." + std::to_string(k), static_cast<uint32_t>(k + 1));
    std::string where = shard_dirs.empty() ? dir : shard_dirs[static_cast<size_t>(k)];
    WriteShard(where + "/" + shard, tensors);
    for (const FixtureTensor& t : tensors) {
      weight_map[t.name] = shard;
      all[t.name] = t;
    }
  }
  EXPECT_OK(WriteIndex(dir + "/model.safetensors.index.json", weight_map, 0));
  return all;
}

// ---- DType -----------------------------------------------------------------------------------

TEST(SafetensorsDType, NamesAndSizes) {
  const std::vector<std::tuple<DType, std::string, size_t>> expected = {
      {DType::kBF16, "BF16", 2},      {DType::kF16, "F16", 2},        {DType::kF32, "F32", 4},
      {DType::kF64, "F64", 8},        {DType::kU8, "U8", 1},          {DType::kI8, "I8", 1},
      {DType::kI16, "I16", 2},        {DType::kI32, "I32", 4},        {DType::kI64, "I64", 8},
      {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kBool, "BOOL", 1}};
  for (const auto& [dtype, name, size] : expected) {
    EXPECT_EQ(DTypeName(dtype), name);
    EXPECT_EQ(DTypeSize(dtype), size) << name;
    EXPECT_EQ(ParseDType(name), dtype);
  }
  EXPECT_EQ(ParseDType("bf16"), std::nullopt);
  EXPECT_EQ(ParseDType("F8_E4M3FN"), std::nullopt);
  int64_t shape[] = {2, 3};
  EXPECT_EQ(DescribeTensor(DType::kBF16, shape), "BF16 [2, 3]");
}

// ---- Writer ----------------------------------------------------------------------------------

TEST(SafetensorsWriter, HeaderPaddedToEightAndLayoutInAddOrder) {
  Writer w;
  w.SetMetadata({{"format", "pt"}});
  ASSERT_OK(w.Add("b", DType::kU8, {3}, "xyz"));
  ASSERT_OK(w.Add("a", DType::kI16, {2}, std::string("\x01\x00\x02\x00", 4)));
  ASSERT_OK_AND_ASSIGN(std::string file, w.Serialize());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(file.size(), 8 + n + 7);
  EXPECT_EQ(file.substr(8 + n), std::string("xyz\x01\x00\x02\x00", 7));
  const std::string header = file.substr(8, n);
  EXPECT_THAT(header, HasSubstr(R"("__metadata__":{"format":"pt"})"));
  EXPECT_THAT(header, HasSubstr(R"("b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]})"));
  EXPECT_THAT(header, HasSubstr(R"("a":{"dtype":"I16","shape":[2],"data_offsets":[3,7]})"));
  ASSERT_OK_AND_ASSIGN(Header parsed, ParseFileBytes(file, "mem"));
  EXPECT_EQ(parsed.metadata.at("format"), "pt");
  ASSERT_EQ(parsed.tensors.size(), 2u);
  EXPECT_EQ(parsed.tensors[0].name, "b");
  EXPECT_EQ(parsed.tensors[0].file_offset, 8 + n);
  EXPECT_EQ(parsed.tensors[1].name, "a");
  EXPECT_EQ(parsed.tensors[1].file_offset, 8 + n + 3);
  EXPECT_EQ(parsed.tensors[1].numel(), 2);
}

TEST(SafetensorsWriter, RefusesBadTensors) {
  Writer w;
  EXPECT_THAT(w.Add("x", DType::kF32, {2}, "abc"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 'x'")));
  EXPECT_THAT(w.Add("", DType::kU8, {0}, ""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(w.Add("__metadata__", DType::kU8, {0}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(w.Add("neg", DType::kU8, {-1}, ""), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(w.Add("y", DType::kU8, {1}, "a"));
  EXPECT_THAT(w.Add("y", DType::kU8, {1}, "b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("already added")));
}

// ---- Reading: the same bytes through pread, mmap and O_DIRECT --------------------------------

// Reads every tensor (and sub-ranges of it) through the four paths and compares with the bytes
// the fixture wrote.
void ExpectAllPathsAgree(Snapshot& snap, const std::map<std::string, FixtureTensor>& expected) {
  ASSERT_EQ(snap.Names().size(), expected.size());
  std::map<int, std::unique_ptr<io::MappedFile>> maps;
  std::map<int, std::unique_ptr<io::DirectReader>> direct;
  for (const auto& [name, want] : expected) {
    ASSERT_OK_AND_ASSIGN(const TensorInfo* t, snap.Get(name));
    EXPECT_EQ(t->dtype, want.dtype) << name;
    EXPECT_EQ(t->shape, want.shape) << name;
    ASSERT_EQ(t->nbytes, want.bytes.size()) << name;
    // pread
    std::string by_pread(t->nbytes, '\0');
    ASSERT_OK(snap.Read(*t, by_pread.data()));
    EXPECT_TRUE(by_pread == want.bytes) << "pread " << name;
    // mmap
    if (!maps.count(t->shard)) {
      ASSERT_OK_AND_ASSIGN(maps[t->shard], io::MappedFile::Map(snap.ShardPath(t->shard)));
    }
    const io::MappedFile& m = *maps[t->shard];
    ASSERT_LE(t->file_offset + t->nbytes, m.size());
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>(m.data()) + t->file_offset, t->nbytes) ==
                want.bytes)
        << "mmap " << name;
    // O_DIRECT (whole tensor, then a range starting and ending off 4 KiB inside it)
    if (!direct.count(t->shard)) {
      ASSERT_OK_AND_ASSIGN(direct[t->shard], io::DirectReader::Open(snap.ShardPath(t->shard)));
      EXPECT_TRUE(direct[t->shard]->is_direct()) << direct[t->shard]->fallback_reason();
    }
    const io::DirectReader& d = *direct[t->shard];
    io::AlignedBuffer buffer;
    ASSERT_OK_AND_ASSIGN(const uint8_t* p, d.ReadInto(t->file_offset, t->nbytes, &buffer));
    if (t->nbytes > 0) {
      EXPECT_TRUE(std::string(reinterpret_cast<const char*>(p), t->nbytes) == want.bytes)
          << "O_DIRECT " << name;
    }
    if (t->nbytes > 10) {
      std::string part(t->nbytes - 10, '\0');
      ASSERT_OK(d.Read(t->file_offset + 3, part.size(), part.data()));
      EXPECT_TRUE(part == want.bytes.substr(3, part.size())) << "O_DIRECT part " << name;
      EXPECT_NE((t->file_offset + 3) % io::kDirectAlignment, 0u);
    }
  }
}

TEST(SafetensorsSnapshot, SingleFileAllReadPathsAgree) {
  TempDir dir;
  std::map<std::string, FixtureTensor> expected;
  for (FixtureTensor& t : MakeTensors("m", 7)) expected[t.name] = t;
  WriteShard(dir.File("one.safetensors"), MakeTensors("m", 7));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.File("one.safetensors")));
  EXPECT_EQ(snap->num_shards(), 1);
  EXPECT_TRUE(snap->IsShardOpen(0));
  ExpectAllPathsAgree(*snap, expected);
  // Some ranges really are off 4 KiB boundaries at both ends.
  int off_both = 0;
  for (const auto& [name, t] : expected) {
    const TensorInfo* info = *snap->Get(name);
    off_both += info->file_offset % 4096 != 0 && (info->file_offset + info->nbytes) % 4096 != 0;
  }
  EXPECT_GE(off_both, 3);
}

TEST(SafetensorsSnapshot, FolderWithModelSafetensors) {
  TempDir dir;
  WriteShard(dir.File("model.safetensors"), MakeTensors("m", 8));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_TRUE(snap->Contains("m.t0"));
  EXPECT_FALSE(snap->Contains("m.t99"));
  ASSERT_OK_AND_ASSIGN(const TensorInfo* absent, snap->Find("m.t99"));
  EXPECT_EQ(absent, nullptr);
  EXPECT_THAT(snap->Get("m.t99"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'m.t99'")));
}

TEST(SafetensorsSnapshot, ThreeShardsAllReadPathsAgree) {
  TempDir dir;
  std::map<std::string, FixtureTensor> expected = WriteThreeShards(dir.path());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_EQ(snap->num_shards(), 3);
  for (int s = 0; s < 3; ++s) EXPECT_FALSE(snap->IsShardOpen(s)) << "opened before use";
  EXPECT_EQ(snap->ShardNameOf("layers.1.t0"), "model-00002-of-000003.safetensors");
  ExpectAllPathsAgree(*snap, expected);
  // Opening through the index file itself works too.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> by_index,
                       Snapshot::Open(dir.File("model.safetensors.index.json")));
  ASSERT_OK_AND_ASSIGN(const TensorInfo* t, by_index->Get("layers.2.t1"));
  EXPECT_EQ(by_index->ShardPath(t->shard), dir.File("model-00003-of-000003.safetensors"));
}

TEST(SafetensorsSnapshot, OnlyTheShardAskedForIsOpened) {
  TempDir dir;
  WriteThreeShards(dir.path());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_TRUE(snap->Contains("layers.2.t3"));  // from the index alone
  EXPECT_FALSE(snap->IsShardOpen(2));
  ASSERT_OK_AND_ASSIGN(const TensorInfo* t, snap->Get("layers.1.t3"));
  EXPECT_EQ(t->shard, 1);
  EXPECT_FALSE(snap->IsShardOpen(0));
  EXPECT_TRUE(snap->IsShardOpen(1));
  EXPECT_FALSE(snap->IsShardOpen(2));
}

TEST(SafetensorsSnapshot, ConcurrentLookupsOpenEachShardOnce) {
  TempDir dir;
  std::map<std::string, FixtureTensor> expected = WriteThreeShards(dir.path());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  std::vector<std::string> names = snap->Names();
  std::vector<std::thread> threads;
  std::vector<int> errors(4, 0);
  std::vector<std::map<std::string, const TensorInfo*>> seen(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string& name = names[(i + static_cast<size_t>(t) * 5) % names.size()];
        absl::StatusOr<const TensorInfo*> info = snap->Get(name);
        if (!info.ok()) {
          ++errors[t];
          continue;
        }
        seen[t][name] = *info;
        std::string bytes((*info)->nbytes, '\0');
        if (!snap->Read(**info, bytes.data()).ok() || bytes != expected.at(name).bytes) ++errors[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(errors, ::testing::Each(0));
  for (int t = 1; t < 4; ++t) EXPECT_EQ(seen[t], seen[0]);  // one TensorInfo per name
}

TEST(SafetensorsSnapshot, GarbageShardNeverAskedForIsNeverOpened) {
  // The vision shards of the real snapshot: named by the index, never read by a text engine.
  TempDir dir;
  std::map<std::string, std::string> weight_map;
  WriteShard(dir.File("text.safetensors"), MakeTensors("text", 1));
  for (const FixtureTensor& t : MakeTensors("text", 1)) weight_map[t.name] = "text.safetensors";
  weight_map["vision_tower.w"] = "vision.safetensors";
  WriteRaw(dir.File("vision.safetensors"), "this is not a safetensors file at all");
  ASSERT_OK(WriteIndex(dir.File("model.safetensors.index.json"), weight_map, 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  ASSERT_OK_AND_ASSIGN(const TensorInfo* t, snap->Get("text.t0"));
  std::vector<uint8_t> buf(t->nbytes);
  EXPECT_OK(snap->Read(*t, buf.data()));
  EXPECT_TRUE(snap->Contains("vision_tower.w"));
  const int vision = snap->ShardPath(0).ends_with("vision.safetensors") ? 0 : 1;
  EXPECT_FALSE(snap->IsShardOpen(vision));
  // Asked for, it is opened and refused with a message naming the file and the tensor.
  EXPECT_THAT(snap->Get("vision_tower.w"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("vision.safetensors"), HasSubstr("'vision_tower.w'"))));
  EXPECT_FALSE(snap->IsShardOpen(vision));
}

TEST(SafetensorsSnapshot, ExpectChecksDtypeAndShape) {
  TempDir dir;
  WriteShard(dir.File("m.safetensors"), MakeTensors("m", 9));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.File("m.safetensors")));
  int64_t right[] = {37, 101};
  EXPECT_OK(snap->Expect("m.t0", DType::kBF16, right));
  int64_t wrong[] = {128};
  EXPECT_THAT(snap->Expect("m.t0", DType::kF32, wrong),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("tensor 'm.t0': expected F32 [128], got BF16 [37, 101]"),
                             HasSubstr("m.safetensors"))));
  EXPECT_THAT(snap->Expect("nope", DType::kF32, wrong), StatusIs(absl::StatusCode::kNotFound));
}

TEST(SafetensorsSnapshot, ReadAsF32ConvertsBf16F16F32) {
  TempDir dir;
  Writer w;
  // Independent reference values: bit patterns with known IEEE meanings.
  const uint16_t bf16[] = {0x3f80, 0xc000, 0x0000, 0x8000, 0x7f80, 0x3eaa};
  const float bf16_want[] = {1.0f,       -2.0f, 0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                             0.33203125f};
  const uint16_t f16[] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7c00, 0x3555, 0x7bff, 0x8400};
  const float f16_want[] = {1.0f,
                            -2.0f,
                            5.9604644775390625e-08f,
                            6.0975551605224609e-05f,
                            std::numeric_limits<float>::infinity(),
                            0.333251953125f,
                            65504.0f,
                            -6.103515625e-05f};
  const float f32[] = {1.5f, -3.25f, 1e-30f};
  ASSERT_OK(w.Add("bf16", DType::kBF16, {6}, std::string(reinterpret_cast<const char*>(bf16), 12)));
  ASSERT_OK(w.Add("f16", DType::kF16, {8}, std::string(reinterpret_cast<const char*>(f16), 16)));
  ASSERT_OK(w.Add("f32", DType::kF32, {3}, std::string(reinterpret_cast<const char*>(f32), 12)));
  ASSERT_OK(w.Add("nan", DType::kF16, {1}, std::string("\x00\x7e", 2)));
  ASSERT_OK(w.Add("u8", DType::kU8, {1}, "a"));
  ASSERT_OK(w.Write(dir.File("c.safetensors")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.File("c.safetensors")));
  ASSERT_OK_AND_ASSIGN(std::vector<float> got, snap->ReadAsF32(**snap->Get("bf16")));
  EXPECT_THAT(got, ElementsAre(bf16_want[0], bf16_want[1], bf16_want[2], bf16_want[3], bf16_want[4],
                               bf16_want[5]));
  EXPECT_TRUE(std::signbit(got[3]));
  ASSERT_OK_AND_ASSIGN(got, snap->ReadAsF32(**snap->Get("f16")));
  EXPECT_THAT(got, ElementsAre(f16_want[0], f16_want[1], f16_want[2], f16_want[3], f16_want[4],
                               f16_want[5], f16_want[6], f16_want[7]));
  ASSERT_OK_AND_ASSIGN(got, snap->ReadAsF32(**snap->Get("f32")));
  EXPECT_THAT(got, ElementsAre(1.5f, -3.25f, 1e-30f));
  ASSERT_OK_AND_ASSIGN(got, snap->ReadAsF32(**snap->Get("nan")));
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_THAT(snap->ReadAsF32(**snap->Get("u8")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'u8'")));
}

TEST(SafetensorsSnapshot, ContiguousRangeOfAnExpert) {
  TempDir dir;
  Writer w;
  // One expert's six tensors back to back, in the checkpoint's order (spec §2.4).
  const char* parts[] = {"w1_packed", "w1_scale", "w2_packed", "w2_scale", "w3_packed", "w3_scale"};
  ASSERT_OK(w.Add("other", DType::kU8, {5}, "12345"));
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK(w.Add(std::string("experts.0.") + parts[i], DType::kU8, {100 + i},
                    Pattern(static_cast<size_t>(100 + i), static_cast<uint32_t>(i))));
  }
  ASSERT_OK(w.Write(dir.File("e.safetensors")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.File("e.safetensors")));
  std::vector<const TensorInfo*> six;
  for (const char* p : parts) six.push_back(*snap->Get(std::string("experts.0.") + p));
  ASSERT_OK_AND_ASSIGN(std::optional<Snapshot::Range> range, snap->ContiguousRange(six));
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->shard, 0);
  EXPECT_EQ(range->file_offset, six[0]->file_offset);
  EXPECT_EQ(range->nbytes, 100u + 101 + 102 + 103 + 104 + 105);
  std::swap(six[1], six[2]);
  ASSERT_OK_AND_ASSIGN(range, snap->ContiguousRange(six));
  EXPECT_FALSE(range.has_value());
  std::vector<const TensorInfo*> gap = {*snap->Get("other"), six[2]};
  ASSERT_OK_AND_ASSIGN(range, snap->ContiguousRange(gap));
  EXPECT_FALSE(range.has_value());
  EXPECT_THAT(snap->ContiguousRange({}), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<const TensorInfo*> null_entry = {nullptr};
  EXPECT_THAT(snap->ContiguousRange(null_entry), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SafetensorsSnapshot, ContiguousRangeNeverSpansShards) {
  TempDir dir;
  WriteThreeShards(dir.path());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  std::vector<const TensorInfo*> two = {*snap->Get("layers.0.t6"), *snap->Get("layers.1.t0")};
  ASSERT_OK_AND_ASSIGN(std::optional<Snapshot::Range> range, snap->ContiguousRange(two));
  EXPECT_FALSE(range.has_value());
}

// ---- K3_DIRS: shards spread over several folders ---------------------------------------------

TEST(SafetensorsSnapshot, ShardsSpreadOverExtraDirs) {
  TempDir dir;
  std::string main = dir.Sub("main"), d2 = dir.Sub("d2"), d3 = dir.Sub("d3");
  std::map<std::string, FixtureTensor> expected = WriteThreeShards(main, {main, d2, d3});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap,
                       Snapshot::Open(main, SnapshotOptions{{d2, d3, d2 + "/"}}));
  ASSERT_OK_AND_ASSIGN(const TensorInfo* t, snap->Get("layers.2.t0"));
  EXPECT_EQ(snap->ShardPath(t->shard), d3 + "/model-00003-of-000003.safetensors");
  ExpectAllPathsAgree(*snap, expected);
}

TEST(SafetensorsSnapshot, ShardInTwoFoldersIsRefused) {
  TempDir dir;
  std::string main = dir.Sub("main"), d2 = dir.Sub("d2");
  WriteThreeShards(main);
  fs::copy_file(main + "/model-00002-of-000003.safetensors",
                d2 + "/model-00002-of-000003.safetensors");
  EXPECT_THAT(Snapshot::Open(main, SnapshotOptions{{d2}}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("model-00002-of-000003.safetensors"), HasSubstr(main),
                             HasSubstr(d2))));
}

TEST(SafetensorsSnapshot, ExtraDirThatIsNotAFolder) {
  TempDir dir;
  WriteThreeShards(dir.path());
  EXPECT_THAT(Snapshot::Open(dir.path(), SnapshotOptions{{dir.File("nowhere")}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nowhere")));
}

// ---- Bad input: each case names the file and the tensor ---------------------------------------

// Writes `bytes` as <dir>/<name>, opens it as a snapshot and expects DATA_LOSS whose message
// names the file and contains every one of `parts`.
void ExpectCorrupt(const std::string& name, const std::string& bytes,
                   const std::vector<std::string>& parts) {
  TempDir dir;
  WriteRaw(dir.File(name), bytes);
  absl::StatusOr<std::unique_ptr<Snapshot>> snap = Snapshot::Open(dir.File(name));
  ASSERT_THAT(snap, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(dir.File(name))));
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(snap.status().message()), HasSubstr(part));
  }
}

TEST(SafetensorsBadInput, TruncatedFile) {
  Writer w;
  ASSERT_OK(w.Add("w", DType::kF32, {100}, Pattern(400, 1)));
  ASSERT_OK_AND_ASSIGN(std::string file, w.Serialize());
  ExpectCorrupt("cut.safetensors", file.substr(0, file.size() - 10),
                {"tensor 'w'", "past the end"});
  ExpectCorrupt("tiny.safetensors", "\x10\x00\x00", {"truncated"});
}

TEST(SafetensorsBadInput, HeaderLengthPastEnd) {
  ExpectCorrupt("h.safetensors", LengthPrefix(1000) + "{}", {"header length 1000", "past the end"});
}

TEST(SafetensorsBadInput, HeaderLongerThan100MiB) {
  ExpectCorrupt("big.safetensors", LengthPrefix((uint64_t{100} << 20) + 1) + "{}", {"100 MiB"});
}

TEST(SafetensorsBadInput, InvalidJson) {
  ExpectCorrupt("j.safetensors", RawFile("{\"w\": {\"dtype\": \n \"F32\",, }", ""), {"line 2"});
  ExpectCorrupt("arr.safetensors", RawFile("[1, 2]", ""), {"expected an object, got array"});
}

TEST(SafetensorsBadInput, DuplicateTensorInHeader) {
  const std::string entry = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  ExpectCorrupt("d.safetensors", RawFile("{\"w\":" + entry + ",\"w\":" + entry + "}", "a"),
                {"duplicate key \"w\""});
}

TEST(SafetensorsBadInput, UnknownDtype) {
  ExpectCorrupt("u.safetensors",
                RawFile(R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,2]}})", "ab"),
                {"tensor 'w'", "unknown dtype 'F12'"});
}

TEST(SafetensorsBadInput, ShapeSizeMismatch) {
  ExpectCorrupt(
      "s.safetensors",
      RawFile(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", Pattern(10, 1)),
      {"tensor 'w'", "BF16 [2, 3] needs 12 bytes"});
  // A shape whose byte count does not fit in 64 bits.
  ExpectCorrupt(
      "o.safetensors",
      RawFile(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
      {"tensor 'w'", "more than 2^64"});
}

TEST(SafetensorsBadInput, MalformedEntries) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", "is not a range"},
      {R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", "negative"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "[begin, end]"},
      {R"({"w":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", "shape: expected array"},
      {R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", "shape[0]: expected integer"},
      {R"({"w":{"dtype":"U8","shape":[1]}})", "data_offsets: required key is missing"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", "x: unknown key"},
      {R"({"w":[1]})", "expected an object"},
      {R"({"__metadata__":{"a":1}})", "__metadata__: value of 'a' must be a string"},
      {R"({"__metadata__":[]})", "__metadata__"},
      {R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "empty name"},
  };
  for (const auto& [header, message] : cases) {
    EXPECT_THAT(ParseFileBytes(RawFile(header, "a"), "bad.safetensors"),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("bad.safetensors"), HasSubstr(message))))
        << header;
  }
}

TEST(SafetensorsBadInput, OverlappingRanges) {
  ExpectCorrupt("ov.safetensors",
                RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                        Pattern(6, 1)),
                {"tensor 'b'", "overlaps tensor 'a'"});
  // Empty tensors occupy no bytes and may sit anywhere inside the data region.
  EXPECT_OK(ParseFileBytes(RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                   R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
                                   "abcd"),
                           "ok"));
}

TEST(SafetensorsBadInput, RangePastEndOfFile) {
  ExpectCorrupt("r.safetensors",
                RawFile(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", Pattern(8, 1)),
                {"tensor 'w'", "run past the end of the file"});
}

TEST(SafetensorsBadInput, EmptyFile) { ExpectCorrupt("e.safetensors", "", {"empty"}); }

TEST(SafetensorsBadInput, DirectoryWhereAFileShouldBe) {
  TempDir dir;
  // A shard named by the index is a folder.
  WriteThreeShards(dir.path());
  fs::remove(dir.File("model-00002-of-000003.safetensors"));
  fs::create_directory(dir.File("model-00002-of-000003.safetensors"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_OK(snap->Get("layers.0.t0").status());
  EXPECT_THAT(snap->Get("layers.1.t0"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model-00002-of-000003.safetensors"),
                             HasSubstr("'layers.1.t0'"), HasSubstr("is a directory"))));
  // The index itself is a folder.
  TempDir dir2;
  fs::create_directory(dir2.File("model.safetensors.index.json"));
  EXPECT_THAT(Snapshot::Open(dir2.path()), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    AllOf(HasSubstr("model.safetensors.index.json"),
                                                          HasSubstr("is a directory"))));
}

TEST(SafetensorsBadInput, NoSnapshotAtPath) {
  TempDir dir;
  EXPECT_THAT(Snapshot::Open(dir.path()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.safetensors.index.json")));
  EXPECT_THAT(Snapshot::Open(dir.File("nothing.safetensors")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nothing.safetensors")));
}

TEST(SafetensorsBadInput, MissingShard) {
  TempDir dir;
  WriteThreeShards(dir.path());
  fs::remove(dir.File("model-00003-of-000003.safetensors"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_OK(snap->Get("layers.0.t0").status());  // other shards still work
  EXPECT_THAT(snap->Get("layers.2.t1"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("model-00003-of-000003.safetensors"),
                             HasSubstr("'layers.2.t1'"), HasSubstr("missing"))));
}

// A Hugging Face cache whose blob is gone leaves snapshots/<rev>/<shard> -> ../../blobs/<hash>.
TEST(SafetensorsBadInput, DanglingShardSymlinkNamesItsTarget) {
  TempDir dir;
  WriteThreeShards(dir.path());
  fs::remove(dir.File("model-00003-of-000003.safetensors"));
  fs::create_symlink("../../blobs/5eb3c1a7", dir.File("model-00003-of-000003.safetensors"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_OK(snap->Get("layers.0.t0").status());
  EXPECT_THAT(snap->Get("layers.2.t1"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("model-00003-of-000003.safetensors"),
                             HasSubstr("is a symlink to '../../blobs/5eb3c1a7', which does not "
                                       "exist"))));
}

TEST(SafetensorsBadInput, IndexTensorMissingFromShard) {
  TempDir dir;
  WriteShard(dir.File("a.safetensors"), MakeTensors("a", 1));
  std::map<std::string, std::string> weight_map;
  for (const FixtureTensor& t : MakeTensors("a", 1)) weight_map[t.name] = "a.safetensors";
  weight_map["a.ghost"] = "a.safetensors";
  ASSERT_OK(WriteIndex(dir.File("model.safetensors.index.json"), weight_map, 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_THAT(snap->Get("a.t0"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("tensor 'a.ghost'"), HasSubstr("a.safetensors"),
                             HasSubstr("does not hold it"))));
}

TEST(SafetensorsBadInput, TensorInShardButNotInIndex) {
  TempDir dir;
  WriteShard(dir.File("a.safetensors"), MakeTensors("a", 1));
  ASSERT_OK(WriteIndex(dir.File("model.safetensors.index.json"), {{"a.t0", "a.safetensors"}}, 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_THAT(snap->Get("a.t0"), StatusIs(absl::StatusCode::kDataLoss,
                                          AllOf(HasSubstr("a.safetensors"),
                                                HasSubstr("tensor 'a.t1' is not listed"))));
}

TEST(SafetensorsBadInput, DuplicateNameAcrossShards) {
  TempDir dir;
  // Shard b also holds "a.t0", which the index places in shard a.
  WriteShard(dir.File("a.safetensors"), {{"a.t0", DType::kU8, {2}, "ab"}});
  WriteShard(dir.File("b.safetensors"),
             {{"a.t0", DType::kU8, {2}, "ab"}, {"b.t0", DType::kU8, {1}, "c"}});
  ASSERT_OK(WriteIndex(dir.File("model.safetensors.index.json"),
                       {{"a.t0", "a.safetensors"}, {"b.t0", "b.safetensors"}}, 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Snapshot> snap, Snapshot::Open(dir.path()));
  EXPECT_OK(snap->Get("a.t0").status());
  EXPECT_THAT(snap->Get("b.t0"), StatusIs(absl::StatusCode::kDataLoss,
                                          AllOf(HasSubstr("b.safetensors"),
                                                HasSubstr("tensor 'a.t0' is also in shard"),
                                                HasSubstr("a.safetensors"))));
  // The index itself listing a name twice (a JSON duplicate key) is refused at Open.
  WriteRaw(dir.File("model.safetensors.index.json"),
           R"({"weight_map": {"a.t0": "a.safetensors", "b.t0": "b.safetensors",
               "a.t0": "b.safetensors"}})");
  EXPECT_THAT(Snapshot::Open(dir.path()),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("model.safetensors.index.json"),
                             HasSubstr("weight_map[\"a.t0\"]: duplicate key"))));
}

TEST(SafetensorsBadInput, MalformedIndex) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "parse error"},
      {"[]", "expected an object, got array"},
      {R"({"metadata": {}})", "weight_map: required key is missing"},
      {R"({"weight_map": {}})", "weight_map: is empty"},
      {R"({"weight_map": {"w": 3}})", "tensor 'w': shard name must be a string"},
      {R"({"weight_map": {"w": "../etc/passwd"}})", "not a plain file name"},
      {R"({"weight_map": {"w": ".."}})", "not a plain file name"},
      {R"({"weight_map": {"w": "model.safetensors.index.json"}})", "names itself"},
      {R"({"metadata": {"total_size": "x"}, "weight_map": {"w": "a"}})",
       "metadata.total_size: expected integer, got string"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(
        ParseIndex(text, "idx.json"),
        StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("idx.json"), HasSubstr(message))))
        << text;
  }
  ASSERT_OK_AND_ASSIGN(
      Index ok,
      ParseIndex(R"({"metadata": {"total_size": 12}, "weight_map": {"w": "b", "v": "a"}})",
                 "idx.json"));
  EXPECT_EQ(ok.total_size, 12u);
  EXPECT_THAT(ok.shards, ElementsAre("a", "b"));
}

// ---- PlannedWriter / SharedMapping (k3-repack) ------------------------------------------------

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(SafetensorsPlannedWriter, OutOfOrderWritesEqualTheWriter) {
  TempDir dir;
  const std::string a = Pattern(6, 1), b = Pattern(12, 2), c = Pattern(3, 3);
  Writer ref;
  ASSERT_OK(ref.Add("a", DType::kU8, {2, 3}, a));
  ASSERT_OK(ref.Add("b", DType::kF32, {3}, b));
  ASSERT_OK(ref.Add("c", DType::kU8, {3}, c));
  ASSERT_OK_AND_ASSIGN(std::string want, ref.Serialize());
  ASSERT_OK_AND_ASSIGN(auto w, PlannedWriter::Create(dir.File("x.safetensors"),
                                                     {{"a", DType::kU8, {2, 3}},
                                                      {"b", DType::kF32, {3}},
                                                      {"c", DType::kU8, {3}}}));
  EXPECT_EQ(w->data_bytes(), 21u);
  ASSERT_OK(w->WriteAt(2, 0, c));
  ASSERT_OK(w->WriteAt(1, 4, b.substr(4)));
  ASSERT_OK(w->WriteAt(0, 0, a));
  ASSERT_OK(w->WriteAt(1, 0, b.substr(0, 4)));
  ASSERT_OK(w->Finish());
  EXPECT_EQ(ReadWhole(dir.File("x.safetensors")), want);
  ASSERT_OK_AND_ASSIGN(Header h, ParseFileBytes(want, "x"));
  EXPECT_EQ(h.data_offset % 8, 0u);
}

TEST(SafetensorsPlannedWriter, RefusesHolesAndWritesOutsideATensor) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto w, PlannedWriter::Create(dir.File("y.safetensors"),
                                                     {{"a", DType::kU8, {4}}, {"b", DType::kU8, {2}}}));
  EXPECT_THAT(w->WriteAt(0, 2, "xyz"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("outside tensor a")));
  EXPECT_THAT(w->WriteAt(5, 0, "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(w->WriteAt(0, 0, "abcd"));
  EXPECT_THAT(w->Finish(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("tensor 'b' got 0 of 2 bytes")));
  EXPECT_THAT(PlannedWriter::Create(dir.File("z.safetensors"),
                                    {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeated")));
}

// Per-tensor checksums (k3-repack's shards): the CRC-32 check value of "123456789" is
// cbf43926 (the standard's test vector); in order, out of order and empty tensors; a flipped
// byte is named; a file without them, or with the wrong number of digits, is told apart.
TEST(SafetensorsChecksums, StoredPerTensorAndVerified) {
  TempDir dir;
  const std::string path = dir.File("c.safetensors");
  const std::string b = Pattern(4000, 5);
  ASSERT_OK_AND_ASSIGN(auto w, PlannedWriter::Create(path,
                                                     {{"nine", DType::kU8, {9}},
                                                      {"empty", DType::kU8, {0}},
                                                      {"b", DType::kU8, {4000}}},
                                                     {{"format", "pt"}}, /*checksums=*/true));
  ASSERT_OK(w->WriteAt(0, 0, "123456789"));
  ASSERT_OK(w->WriteAt(2, 1000, b.substr(1000)));  // out of order: read back at Finish
  ASSERT_OK(w->WriteAt(2, 0, b.substr(0, 1000)));
  ASSERT_OK(w->Finish());
  const std::string file = ReadWhole(path);
  ASSERT_OK_AND_ASSIGN(Header h, ParseFileBytes(file, "c"));
  EXPECT_EQ(h.metadata.at("format"), "pt");
  const std::string& digits = h.metadata.at(std::string(kChecksumKey));
  ASSERT_EQ(digits.size(), 24u);
  EXPECT_EQ(digits.substr(0, 8), "cbf43926");
  EXPECT_EQ(digits.substr(8, 8), "00000000");
  ASSERT_OK_AND_ASSIGN(uint64_t checked, VerifyChecksums(path));
  EXPECT_EQ(checked, 4009u);

  std::string damaged = file;
  damaged[h.data_offset + 9 + 1234] ^= 0x10;  // one bit of tensor b
  WriteRaw(path, damaged);
  EXPECT_THAT(VerifyChecksums(path),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("c.safetensors"), HasSubstr("tensor 'b'"),
                             HasSubstr("changed after they were written"))));
  WriteRaw(path, file.substr(0, file.size() - 10));  // cut short
  EXPECT_THAT(VerifyChecksums(path), StatusIs(absl::StatusCode::kDataLoss));

  Writer plain;
  ASSERT_OK(plain.Add("nine", DType::kU8, {9}, "123456789"));
  ASSERT_OK(plain.Write(path));
  EXPECT_THAT(VerifyChecksums(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("has no checksums")));
  plain.SetMetadata({{std::string(kChecksumKey), "cbf43926cbf43926"}});
  ASSERT_OK(plain.Write(path));
  EXPECT_THAT(VerifyChecksums(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("16 hex digits for 1 tensors")));
}

TEST(SafetensorsSharedMapping, MapsTheFileReadOnly) {
  TempDir dir;
  const std::string bytes = Pattern(10000, 7);
  WriteRaw(dir.File("m.bin"), bytes);
  ASSERT_OK_AND_ASSIGN(auto m, SharedMapping::Map(dir.File("m.bin")));
  ASSERT_EQ(m->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), bytes);
  EXPECT_THAT(SharedMapping::Map(dir.File("absent")).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent")));
  WriteRaw(dir.File("empty"), "");
  ASSERT_OK_AND_ASSIGN(auto e, SharedMapping::Map(dir.File("empty")));
  EXPECT_EQ(e->data(), nullptr);
}

}  // namespace
}  // namespace coli::st
