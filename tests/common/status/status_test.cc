#include "common/status/status.h"

#include "common/status/status_matchers.h"
#include "gtest/gtest.h"

namespace coli {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  COLI_ASSIGN_OR_RETURN(int half, Half(x));
  COLI_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  COLI_RETURN_IF_ERROR(Half(x));
  COLI_RETURN_IF_ERROR(absl::OkStatus());
  return absl::OkStatus();
}

TEST(Status, AssignOrReturnPropagatesValueAndError) {
  ASSERT_OK_AND_ASSIGN(int q, Quarter(8));
  EXPECT_EQ(q, 2);
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 is odd")));
}

TEST(Status, ReturnIfErrorStopsAtFirstError) {
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(5), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Status, AnnotatePrefixesContextAndKeepsCode) {
  absl::Status s = Annotate(absl::DataLossError("truncated"), "file 'a.safetensors'");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, "file 'a.safetensors': truncated"));
  EXPECT_THAT(Annotate(absl::OkStatus(), "x"), IsOk());
}

}  // namespace
}  // namespace coli
