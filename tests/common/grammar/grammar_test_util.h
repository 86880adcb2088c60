// Helpers shared by the common/grammar tests.
#ifndef COLI_TESTS_COMMON_GRAMMAR_GRAMMAR_TEST_UTIL_H_
#define COLI_TESTS_COMMON_GRAMMAR_GRAMMAR_TEST_UTIL_H_

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "common/grammar/json_constraint.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::grammar::test_util {

// The constraint of a bare schema; a test failure (and null) when it does not compile.
inline std::shared_ptr<const JsonConstraint> Schema(const std::string& s) {
  auto c = JsonConstraint::FromSchema(s);
  EXPECT_TRUE(c.ok()) << c.status() << " for " << s;
  return c.ok() ? *c : nullptr;
}

// Whether the whole of `doc` is accepted and may end there.
inline bool Complete(const std::shared_ptr<const JsonConstraint>& c, std::string_view doc) {
  JsonMatcher m(c);
  return m.Accept(doc) && m.CanEnd();
}

// Each (schema, message) is refused with INVALID_ARGUMENT whose message contains `message`.
inline void ExpectRefusals(std::span<const std::pair<const char*, const char*>> cases) {
  for (const auto& [schema, message] : cases) {
    EXPECT_THAT(JsonConstraint::FromSchema(schema).status(),
                ::coli::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          ::testing::HasSubstr(message)))
        << schema;
  }
}

}  // namespace coli::grammar::test_util

#endif  // COLI_TESTS_COMMON_GRAMMAR_GRAMMAR_TEST_UTIL_H_
