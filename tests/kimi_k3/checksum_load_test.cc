// The loader checks a repacked container's per-tensor CRC-32s (st::kChecksumKey) as it reads:
// dense tensors at load (heap or K3_MMAP), the embedding once at load, routed experts the first
// time each comes from disk (the streaming store, the plain pread source). A flipped byte is a
// DATA_LOSS naming the file, the tensor and both CRCs, never a different answer; K3_VERIFY=0
// (ModelOptions::verify_checksums) and a container without checksums load as before.
//
// The expected CRCs come from the container's own header (what k3-repack wrote) and zlib's
// crc32 of the damaged bytes, not from the loader.
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/safetensors/crc32.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/repack.h"
#include "plugins/kimi_k3/session.h"
#include "tests/common/io/test_files.h"

namespace coli::k3 {
namespace {

namespace fs = std::filesystem;
using ::coli::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::vector<int32_t> kPrompt = {5, 77, 300, 12, 9, 401, 42, 250, 3, 18, 64};
constexpr char kPrefix[] = "language_model.model.";

// Where a tensor lies and the CRC its file records, from the header alone.
struct Victim {
  std::string path;
  st::TensorInfo info;
};

Victim Locate(const std::string& dir, const std::string& name) {
  auto snap = st::Snapshot::Open(dir, {.verify_checksums = true});
  EXPECT_OK(snap.status());
  auto info = (*snap)->Get(name);
  EXPECT_OK(info.status());
  EXPECT_TRUE((*info)->crc32.has_value()) << name;
  return {(*snap)->ShardPath((*info)->shard), **info};
}

// Flips one bit in the middle of the tensor; returns the CRC the damaged bytes have.
uint32_t Flip(const Victim& v) {
  std::string bytes = test_files::ReadRaw(v.path);
  bytes[v.info.file_offset + v.info.nbytes / 2] ^= 0x10;
  test_files::WriteRaw(v.path, bytes);
  return st::Crc32(0, std::string_view(bytes).substr(v.info.file_offset, v.info.nbytes));
}

ModelOptions Options(bool verify, bool mmap = false) {
  ModelOptions o;
  o.load_threads = 2;
  o.verify_checksums = verify;
  o.mmap = mmap;
  return o;
}

absl::StatusOr<std::vector<float>> Logits(const std::string& dir, const ModelOptions& o,
                                          Model::ExpertSourceFactory experts = nullptr) {
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        Model::Load(dir, o, nullptr, std::move(experts)));
  auto s = model->NewSession();
  return s->Prefill(kPrompt);
}

class ChecksumLoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    container_ = new std::string(fs::temp_directory_path() /
                                 ("k3_checksum_load_" + std::to_string(::getpid())));
    fs::remove_all(*container_);
    RepackOptions o;
    o.bits = 8;
    o.threads = 2;
    ASSERT_OK(Repack(K3_TEST_TINY, *container_, o).status());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*container_);
    delete container_;
  }
  // A fresh copy of the container for one test to damage.
  void SetUp() override {
    dir_ = *container_ + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::copy(*container_, dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string* container_;
  std::string dir_;
};
std::string* ChecksumLoadTest::container_ = nullptr;

// The named error: file, tensor, the CRC found and the one recorded.
auto NamesTheDamage(const Victim& v, uint32_t found) {
  return StatusIs(
      absl::StatusCode::kDataLoss,
      AllOf(HasSubstr("file '" + v.path + "'"), HasSubstr("tensor '" + v.info.name + "'"),
            HasSubstr("has CRC-32 " + st::Crc32Hex(found)),
            HasSubstr("the file recorded " + st::Crc32Hex(*v.info.crc32))));
}

TEST_F(ChecksumLoadTest, IntactContainerGivesTheSameLogitsWithTheCheckOnOrOff) {
  ASSERT_OK_AND_ASSIGN(std::vector<float> on, Logits(dir_, Options(true)));
  ASSERT_OK_AND_ASSIGN(std::vector<float> off, Logits(dir_, Options(false)));
  ASSERT_OK_AND_ASSIGN(std::vector<float> mapped, Logits(dir_, Options(true, /*mmap=*/true)));
  EXPECT_EQ(on, off);
  EXPECT_EQ(on, mapped);
  // A checkpoint without checksums (the BF16 source) loads with the check on.
  EXPECT_OK(Logits(K3_TEST_TINY, Options(true)).status());
}

// Each kind of tensor the loader reads whole: a U8 matrix, its F32 sidecar, a BF16 norm read as
// f32, and the embedding (read row by row at run time, so checked once at load).
TEST_F(ChecksumLoadTest, FlippedDenseByteFailsTheLoadNamingFileTensorAndBothCrcs) {
  const std::string L1 = std::string(kPrefix) + "layers.1.";
  for (const std::string& name :
       {L1 + "self_attn.q_proj.weight", L1 + "self_attn.q_proj.weight.qs",
        L1 + "input_layernorm.weight", std::string(kPrefix) + "embed_tokens.weight"}) {
    SCOPED_TRACE(name);
    const Victim v = Locate(dir_, name);
    const std::string intact = test_files::ReadRaw(v.path);
    const uint32_t found = Flip(v);
    EXPECT_THAT(Logits(dir_, Options(true)).status(), NamesTheDamage(v, found));
    // K3_MMAP: the mapped matrices are checked at load as well (the norm is read either way).
    EXPECT_THAT(Logits(dir_, Options(true, /*mmap=*/true)).status(), NamesTheDamage(v, found));
    // K3_VERIFY=0: loads as before (the damage goes unnoticed, which is what the switch says).
    EXPECT_OK(Logits(dir_, Options(false)).status());
    // K3_MMAP with K3_VERIFY unset (verify_mapped off): the mapped matrices and the embedding
    // are not read at load, so the fast start stays; a tensor read whole anyway (the norm)
    // is still checked.
    ModelOptions fast = Options(true, /*mmap=*/true);
    fast.verify_mapped = false;
    if (name == L1 + "input_layernorm.weight") {
      EXPECT_THAT(Logits(dir_, fast).status(), NamesTheDamage(v, found));
    } else {
      EXPECT_OK(Logits(dir_, fast).status());
    }
    test_files::WriteRaw(v.path, intact);
  }
  EXPECT_OK(Logits(dir_, Options(true)).status());
}

// A header whose checksum digits were damaged (not hex) is refused at the first touch of the
// shard rather than checked against garbage.
TEST_F(ChecksumLoadTest, DamagedChecksumDigitsAreRefusedNamingTheFile) {
  const Victim v = Locate(dir_, std::string(kPrefix) + "layers.1.input_layernorm.weight");
  std::string bytes = test_files::ReadRaw(v.path);
  const size_t at = bytes.find(std::string(st::kChecksumKey) + "\":\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + st::kChecksumKey.size() + 3] = 'z';
  test_files::WriteRaw(v.path, bytes);
  EXPECT_THAT(Logits(dir_, Options(true)).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(v.path), HasSubstr("not a lowercase hex digit"))));
}

// The streaming store checks an expert the first time it is read; a damaged one fails every
// call that needs it (it is never cached), the others are served, and a re-read of an expert
// that passed is not checked again.
TEST_F(ChecksumLoadTest, StoreChecksAnExpertsFirstReadAndNeverCachesADamagedOne) {
  const int layer = 3;
  const Victim v =
      Locate(dir_, std::string(kPrefix) + "layers.3.block_sparse_moe.experts.5.w2.weight_packed");
  const uint32_t found = Flip(v);
  ASSERT_OK_AND_ASSIGN(auto snap, st::Snapshot::Open(dir_, {.verify_checksums = true}));
  ASSERT_OK_AND_ASSIGN(ExpertStoreLayout layout, DiscoverExpertLayout(snap.get()));
  ExpertStoreOptions options;
  options.usage_path = "";
  options.expert_gb = 1.5 * static_cast<double>(layout.ExpertBytes()) *
                      static_cast<double>(layout.moe_layers.size()) / 1e9;  // 1 slot per layer
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snap.get(), layout, options));
  auto nothing = [](int, const ExpertWeights&) { return absl::OkStatus(); };
  const int32_t damaged[] = {5}, good[] = {4}, other[] = {6};
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_THAT(store->ForEachExpert(layer, damaged, nothing), NamesTheDamage(v, found));
  }
  store->TakeStats();
  EXPECT_OK(store->ForEachExpert(layer, good, nothing));
  ExpertStoreStats first = store->TakeStats();
  EXPECT_EQ(first.misses, 1u);
  EXPECT_EQ(first.bytes_verified, layout.ExpertBytes());
  EXPECT_OK(store->ForEachExpert(layer, other, nothing));  // evicts expert 4 (1 slot)
  store->TakeStats();
  EXPECT_OK(store->ForEachExpert(layer, good, nothing));
  ExpertStoreStats again = store->TakeStats();
  EXPECT_EQ(again.misses, 1u);
  EXPECT_EQ(again.bytes_verified, 0u);
  EXPECT_THAT(store->ForEachExpert(layer, damaged, nothing), NamesTheDamage(v, found));

  // verify_checksums = false in the store (K3_VERIFY=0): read as before.
  options.verify_checksums = false;
  ASSERT_OK_AND_ASSIGN(auto unchecked, StreamingExpertStore::Open(snap.get(), layout, options));
  EXPECT_OK(unchecked->ForEachExpert(layer, damaged, nothing));
}

// Through the forward pass: every expert of one layer damaged, so any routing meets one. The
// load succeeds (experts are read on demand) and the prefill fails naming the damage, with the
// streaming store and with the plain pread source (k3-run).
TEST_F(ChecksumLoadTest, DamagedExpertFailsThePrefillWithEitherExpertSource) {
  for (int e = 0; e < 16; ++e) {
    Flip(Locate(dir_, std::string(kPrefix) + "layers.2.block_sparse_moe.experts." +
                          std::to_string(e) + ".w1.weight_scale"));
  }
  ExpertStoreOptions store;
  store.usage_path = "";
  for (bool streaming : {true, false}) {
    SCOPED_TRACE(streaming ? "streaming store" : "pread source");
    Model::ExpertSourceFactory factory;
    if (streaming) factory = StreamingExpertSourceFactory(store, nullptr);
    const absl::Status status = Logits(dir_, Options(true), factory).status();
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss,
                                 AllOf(HasSubstr("layers.2.block_sparse_moe.experts."),
                                       HasSubstr("w1.weight_scale"),
                                       HasSubstr("its bytes changed after they were written"))));
    ExpertStoreOptions unchecked = store;
    unchecked.verify_checksums = false;
    if (streaming) factory = StreamingExpertSourceFactory(unchecked, nullptr);
    EXPECT_OK(Logits(dir_, Options(false), factory).status());
  }
}

// A shard copied in from another container (here: a --bits 4 repack of the same source) has
// intact CRCs and the names the index wants: it loaded as a silently mixed int8/int4 model and
// `--check` called it intact. Both now refuse it naming the two shards and the setting.
TEST_F(ChecksumLoadTest, ShardFromAnotherRepackIsRefusedAtLoadAndByCheck) {
  const std::string other = dir_ + "_int4";
  RepackOptions o;
  o.bits = 4;
  o.threads = 2;
  ASSERT_OK(Repack(K3_TEST_TINY, other, o).status());
  const std::string shard = "model-00003-of-000016.safetensors";
  fs::copy_file(other + "/" + shard, dir_ + "/" + shard, fs::copy_options::overwrite_existing);
  fs::remove_all(other);
  const auto mixed =
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr(shard), HasSubstr("k3_repack.bits=4"), HasSubstr("k3_repack.bits=8"),
                     HasSubstr("mixes shards of two repacks")));
  EXPECT_THAT(Logits(dir_, Options(true)).status(), mixed);
  EXPECT_THAT(Logits(dir_, Options(false)).status(), mixed);  // not a checksum: always checked
  EXPECT_THAT(CheckContainer(dir_, 2, nullptr).status(), mixed);
}

// Two shards of one container swapped under each other's names: each passes its own CRCs, the
// loader refuses them (index cross-check), and `--check` said "N shard(s) intact". Now it checks
// the shards against the index as the loader does, and a folder without an index is not intact.
TEST_F(ChecksumLoadTest, CheckComparesShardsWithTheIndex) {
  // A shard kept in another folder (K3_DIRS) is left out, not called missing.
  const std::string elsewhere = dir_ + "_elsewhere";
  fs::create_directories(elsewhere);
  fs::rename(dir_ + "/model-00005-of-000016.safetensors",
             elsewhere + "/model-00005-of-000016.safetensors");
  EXPECT_OK(CheckContainer(dir_, 2, nullptr).status());
  fs::rename(elsewhere + "/model-00005-of-000016.safetensors",
             dir_ + "/model-00005-of-000016.safetensors");
  fs::remove_all(elsewhere);
  ASSERT_OK(CheckContainer(dir_, 2, nullptr).status());
  const std::string a = dir_ + "/model-00002-of-000016.safetensors";
  const std::string b = dir_ + "/model-00003-of-000016.safetensors";
  fs::rename(a, dir_ + "/swap");
  fs::rename(b, a);
  fs::rename(dir_ + "/swap", b);
  EXPECT_THAT(Logits(dir_, Options(true)).status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(CheckContainer(dir_, 2, nullptr).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("model-0000"), HasSubstr("model.safetensors.index.json"))));
  fs::remove(dir_ + "/model.safetensors.index.json");
  EXPECT_THAT(CheckContainer(dir_, 2, nullptr).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("its index is missing")));
}

// A container whose run was killed before the index was written (k3-repack writes it last):
// "has neither model.safetensors.index.json nor model.safetensors" said nothing about why.
TEST_F(ChecksumLoadTest, ShardsWithoutAnIndexAreCalledAnUnfinishedRepack) {
  fs::remove(dir_ + "/model.safetensors.index.json");
  EXPECT_THAT(Logits(dir_, Options(true)).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no index: the repack has not finished"),
                             HasSubstr("run k3-repack <source> '" + dir_ + "' again"))));
}

// A write to a full disk is RESOURCE_EXHAUSTED (was INTERNAL, as if it were a bug).
TEST(RepackRoomTest, WriteToAFullDiskIsResourceExhausted) {
  // The header is written at Create: /dev/full refuses it with ENOSPC.
  EXPECT_THAT(st::PlannedWriter::Create("/dev/full", {{"t", st::DType::kU8, {64}}}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("No space left on device")));
}

// A destination too small for the shards is refused before anything is written (it failed on
// the first write that did not fit, after converting what did: hours on the full model). Needs
// a small filesystem: a 1 MiB tmpfs, which needs root (skipped otherwise).
TEST(RepackRoomTest, DestinationTooSmallIsRefusedBeforeAnythingIsWritten) {
  const std::string mount_point =
      fs::temp_directory_path() / ("k3_repack_small_" + std::to_string(::getpid()));
  fs::create_directories(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=1m") != 0) {
    fs::remove(mount_point);
    GTEST_SKIP() << "cannot mount a small tmpfs (not root?): " << std::strerror(errno);
  }
  const std::string dst = mount_point + "/out";
  RepackOptions o;
  o.bits = 8;
  o.threads = 2;
  const absl::Status status = Repack(K3_TEST_TINY, dst, o).status();
  std::vector<std::string> written;
  for (const auto& e : fs::directory_iterator(dst)) {
    const std::string name = e.path().filename().string();
    if (name != ".k3-repack.lock") written.push_back(name);
  }
  ::umount(mount_point.c_str());
  fs::remove_all(mount_point);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                               AllOf(HasSubstr("'" + dst + "' is too small"),
                                     HasSubstr("still to convert need"),
                                     HasSubstr("nothing was written"))));
  EXPECT_TRUE(written.empty()) << written.front();
}

}  // namespace
}  // namespace coli::k3
