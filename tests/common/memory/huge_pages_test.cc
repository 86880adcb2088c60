// Large blocks are 2 MiB aligned and carry the kernel's huge-page advice (VmFlags "hg" in
// /proc/self/smaps), whatever the system's THP mode; small blocks stay plain.
#include "common/memory/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/io/io.h"
#include "common/kernels/kernels.h"

namespace coli::memory {
namespace {

// The VmFlags of the mapping holding `p` ("" when not found).
std::string VmFlagsOf(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = addr >= lo && addr < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line.substr(8);
  }
  return "";
}

bool HasFlag(const std::string& flags, const std::string& flag) {
  std::istringstream in(flags);
  std::string f;
  while (in >> f) {
    if (f == flag) return true;
  }
  return false;
}

TEST(HugePages, LargeBlocksAreAlignedAndAdvised) {
  ASSERT_TRUE(HugePagesEnabled());  // COLI_HUGEPAGES is unset under ctest
  void* p = AllocateLarge(5 * kHugePageBytes + 123);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  std::memset(p, 1, 5 * kHugePageBytes + 123);  // the whole rounded range is ours to touch
  const std::string flags = VmFlagsOf(p);
  ASSERT_FALSE(flags.empty()) << "no smaps entry for the block";
  EXPECT_TRUE(HasFlag(flags, "hg")) << "VmFlags:" << flags;
  // The partial last huge page is not advised (it would hold up to 2 MiB nobody uses).
  const std::string tail = VmFlagsOf(static_cast<char*>(p) + 5 * kHugePageBytes);
  ASSERT_FALSE(tail.empty());
  EXPECT_FALSE(HasFlag(tail, "hg")) << "VmFlags:" << tail;
  FreeLarge(p);
}

TEST(HugePages, SmallBlocksArePlain) {
  void* p = AllocateLarge(4096, 4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  FreeLarge(p);
  void* q = AllocateLarge(100);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 64, 0u);
  FreeLarge(q);
}

TEST(HugePages, AllocatorBacksVectors) {
  std::vector<uint8_t, HugePageAllocator<uint8_t>> v(3 * kHugePageBytes, 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(HasFlag(VmFlagsOf(v.data()), "hg"));
  EXPECT_EQ(v[3 * kHugePageBytes - 1], 7);
  std::vector<uint8_t, HugePageAllocator<uint8_t>> empty;
  EXPECT_TRUE(empty.empty());
}

// The engine's two big owners: quantized weight matrices and expert slots (O_DIRECT buffers).
TEST(HugePages, WeightsAndExpertSlotsUseThem) {
  const int64_t rows = 1024, cols = 4096;  // 4 MiB of int8
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 255) - 127.f;
  auto q = kernels::QuantizedMatrix::FromF32(w.data(), rows, cols, kernels::WeightFormat::kInt8Row);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q->data().data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(HasFlag(VmFlagsOf(q->data().data()), "hg"));

  io::AlignedBuffer slot(17 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(slot.data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(HasFlag(VmFlagsOf(slot.data()), "hg"));
  io::AlignedBuffer small(8192);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 4096, 0u);
}

}  // namespace
}  // namespace coli::memory
