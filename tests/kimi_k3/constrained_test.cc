// plugins/kimi_k3/constrained: the answer constraint's phases on the tiny fixture's tokenizer
// (768 ids, XTML specials). The reference for the answer's allowed set is independent of
// common/grammar: for a schema that is one enum of strings, a token is allowed exactly when the
// output so far plus its bytes is a prefix of one of the literals' JSON texts, and the stop
// tokens exactly when the output is one whole literal. The XTML transitions are checked against
// the tokenizer's own encoding of the tags.
#include "plugins/kimi_k3/constrained.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/grammar/json_constraint.h"
#include "common/status/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/chat_parser.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

class ConstrainedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
    ASSERT_OK(t.status());
    tokenizer_ = std::move(t).value();
    auto ids = FindStructuralIds(*tokenizer_);
    ASSERT_OK(ids.status());
    ids_ = *ids;
    stops_ = {ids_.end_of_msg};
    auto vocab = ConstraintVocab::Build(*tokenizer_, tokenizer_->vocab_size(), stops_);
    ASSERT_OK(vocab.status());
    vocab_ = std::move(vocab).value();
  }

  static std::shared_ptr<const grammar::JsonConstraint> Enum(const std::string& literals) {
    auto c = grammar::JsonConstraint::FromResponseFormat(
        R"({"type":"json_schema","json_schema":{"name":"e","schema":{"enum":[)" + literals +
        "]}}}");
    EXPECT_OK(c.status());
    return c.ok() ? *c : nullptr;
  }
  std::vector<int32_t> Encode(const std::string& text) const {
    return tokenizer_->Encode(text, false);
  }
  bool Special(int32_t id) const { return tokenizer_->IsSpecial(id); }
  bool IsStop(int32_t id) const {
    return std::find(stops_.begin(), stops_.end(), id) != stops_.end();
  }

  // Walks the answer of `c` (already answering) to one of `texts` (JSON texts of the literals)
  // taking the longest allowed token each step, checking the allowed set against the reference
  // at every step. Returns the output.
  std::string WalkLiteral(AnswerConstraint* c, const std::vector<std::string>& texts, bool chat) {
    std::string out;
    for (int step = 0; step < 64; ++step) {
      std::vector<uint8_t> allowed;
      c->Allowed(&allowed);
      EXPECT_EQ(allowed.size(), static_cast<size_t>(tokenizer_->vocab_size()));
      const bool whole = std::find(texts.begin(), texts.end(), out) != texts.end();
      int32_t longest = -1;
      for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
        bool want = false;
        if (Special(id)) {
          want = whole && (IsStop(id) || (chat && id == ids_.close));
        } else {
          const std::string next = out + std::string(tokenizer_->TokenBytes(id));
          for (const std::string& t : texts)
            want |= t.compare(0, next.size(), next) == 0 && next.size() <= t.size();
        }
        EXPECT_EQ(allowed[id] != 0, want) << "step " << step << " id " << id << " output '" << out
                                          << "' token '" << tokenizer_->TokenBytes(id) << "'";
        if (want && !Special(id) &&
            (longest < 0 ||
             tokenizer_->TokenBytes(id).size() > tokenizer_->TokenBytes(longest).size())) {
          longest = id;
        }
      }
      if (whole) return out;
      if (longest < 0) {
        ADD_FAILURE() << "nothing allowed after '" << out << "'";
        return out;
      }
      c->Accept(longest);
      out += std::string(tokenizer_->TokenBytes(longest));
    }
    ADD_FAILURE() << "the literal never completed: '" << out << "'";
    return out;
  }

  // Expects exactly `ids` to be forced, one by one, accepting each.
  void ExpectForced(AnswerConstraint* c, const std::vector<int32_t>& ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<uint8_t> allowed;
      c->Allowed(&allowed);
      EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1) << "forced step " << i;
      EXPECT_EQ(allowed[ids[i]], 1) << "forced step " << i << " id " << ids[i];
      c->Accept(ids[i]);
    }
  }

  std::unique_ptr<tok::Tokenizer> tokenizer_;
  StructuralIds ids_;
  std::vector<int32_t> stops_;
  std::unique_ptr<ConstraintVocab> vocab_;
};

TEST_F(ConstrainedTest, PlainTextAllowsExactlyThePrefixesOfTheLiterals) {
  auto c = AnswerConstraint::Create(Enum(R"("hello world","help")"), *vocab_, 0);
  ASSERT_OK(c.status());
  EXPECT_TRUE(c->answering());
  const std::string out = WalkLiteral(&*c, {R"("hello world")", R"("help")"}, false);
  EXPECT_TRUE(out == R"("hello world")" || out == R"("help")") << out;
  // Complete and nothing may follow: only the stop tokens.
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), static_cast<long>(stops_.size()));
  c->Accept(stops_[0]);
  EXPECT_TRUE(c->ended());
}

TEST_F(ConstrainedTest, ThinkingIsFreeTextThenTheResponseOpenerIsForced) {
  auto c = AnswerConstraint::Create(Enum(R"("yes")"), *vocab_, kParseInThink);
  ASSERT_OK(c.status());
  EXPECT_FALSE(c->answering());
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    // Every ordinary token (JSON or not), and of the specials only <|close|>: no stop, no opener.
    EXPECT_EQ(allowed[id] != 0, !Special(id) || id == ids_.close) << id;
  }
  for (int32_t id : Encode("not json {[ at all")) c->Accept(id);
  EXPECT_FALSE(c->answering());
  c->Accept(ids_.close);
  std::vector<int32_t> opener = Encode("think");
  opener.push_back(ids_.sep);
  opener.push_back(ids_.open);
  for (int32_t id : Encode("response")) opener.push_back(id);
  opener.push_back(ids_.sep);
  ExpectForced(&*c, opener);
  EXPECT_TRUE(c->answering());
  EXPECT_EQ(WalkLiteral(&*c, {R"("yes")"}, true), R"("yes")");
}

TEST_F(ConstrainedTest, ChatAnswerEndsWithTheWellFormedCloseOrTheStop) {
  for (bool by_close : {true, false}) {
    auto c = AnswerConstraint::Create(Enum(R"("ok")"), *vocab_, kParseInResponse);
    ASSERT_OK(c.status());
    EXPECT_TRUE(c->answering());
    EXPECT_EQ(WalkLiteral(&*c, {R"("ok")"}, true), R"("ok")");
    if (by_close) {
      c->Accept(ids_.close);
      std::vector<int32_t> tail = Encode("response");
      tail.push_back(ids_.sep);
      tail.push_back(ids_.close);
      for (int32_t id : Encode("message")) tail.push_back(id);
      tail.push_back(ids_.sep);
      tail.push_back(ids_.end_of_msg);
      ExpectForced(&*c, tail);
    } else {
      c->Accept(ids_.end_of_msg);
    }
    EXPECT_TRUE(c->ended());
    // After the end nothing is masked any more.
    std::vector<uint8_t> allowed;
    c->Allowed(&allowed);
    EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), tokenizer_->vocab_size());
  }
}

TEST_F(ConstrainedTest, MaskSetsMinusInfinityExactlyWhereDisallowed) {
  auto c = AnswerConstraint::Create(Enum(R"("ab")"), *vocab_, 0);
  ASSERT_OK(c.status());
  std::vector<float> logits(tokenizer_->vocab_size(), 1.5f);
  ASSERT_OK(c->Mask(logits));
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (allowed[i]) {
      EXPECT_EQ(logits[i], 1.5f);
    } else {
      EXPECT_TRUE(std::isinf(logits[i]) && logits[i] < 0);
    }
  }
  std::vector<float> short_row(10, 0.0f);
  EXPECT_THAT(c->Mask(short_row),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("10 logits for a vocabulary of")));
}

TEST_F(ConstrainedTest, BadInputsAreRefusedByName) {
  EXPECT_THAT(AnswerConstraint::Create(Enum(R"("a")"), *vocab_, 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chat parse mode 7")));
  EXPECT_THAT(AnswerConstraint::Create(nullptr, *vocab_, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format")));
  const std::vector<int32_t> bad_stop = {9999};
  EXPECT_THAT(ConstraintVocab::Build(*tokenizer_, tokenizer_->vocab_size(), bad_stop).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stop token id 9999")));
}

}  // namespace
}  // namespace coli::k3
