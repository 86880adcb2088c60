// K3_MMAP through the kimi_k3 plugin's ABI (family option "mmap", what coli's client sends for
// the K3_MMAP environment switch): the option reaches the loader, so the BF16 tiny fixture is
// refused naming K3_MMAP; a value other than 0/1 is refused naming the option. The numerics of
// a mapped container are checked at the Model level in repack_test.cc.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

class K3RepackPluginTest : public abi_test::PluginAbiTest {};

TEST_F(K3RepackPluginTest, MmapOptionReachesTheLoader) {
  EXPECT_THAT(TryOpen({{"mmap", "1"}}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("K3_MMAP=1"), HasSubstr("BF16 matrix"))));
  EXPECT_THAT(TryOpen({{"mmap", "2"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("K3_MMAP")));
  EXPECT_OK(TryOpen({{"mmap", "0"}}).status());
}

}  // namespace
}  // namespace coli::k3
