// GoogleTest matchers for absl::Status / absl::StatusOr (test-only).
//
//   EXPECT_THAT(ReadHeader(path), IsOk());
//   EXPECT_THAT(ReadHeader(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor 'w'")));
//   ASSERT_OK_AND_ASSIGN(Header h, ReadHeader(path));
#ifndef COLI_COMMON_STATUS_STATUS_MATCHERS_H_
#define COLI_COMMON_STATUS_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::testing {

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::coli::internal_status::AsStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(code)) {
  const absl::Status& s = ::coli::internal_status::AsStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has status code " + ::testing::PrintToString(code) + " and a matching message") {
  const absl::Status& s = ::coli::internal_status::AsStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::Matches(message_matcher)(std::string(s.message()));
}

}  // namespace coli::testing

#define COLI_MATCHERS_CONCAT_INNER_(a, b) a##b
#define COLI_MATCHERS_CONCAT_(a, b) COLI_MATCHERS_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::coli::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::coli::testing::IsOk())

#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(COLI_MATCHERS_CONCAT_(coli_test_statusor_, __LINE__), lhs, rexpr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  ASSERT_TRUE(statusor.ok()) << statusor.status();       \
  lhs = std::move(statusor).value()

#endif  // COLI_COMMON_STATUS_STATUS_MATCHERS_H_
