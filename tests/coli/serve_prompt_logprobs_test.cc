// vLLM's prompt_logprobs shape as `coli serve` builds it from the host's entries
// (tools/coli/serve_openai.h VllmPromptLogprobs): the prompt token first, the k most likely with
// ranks 1..k, and the prompt token's rank counted as vLLM counts it — tokens whose logprob is at
// least its own, itself included (`(logprobs >= token_logprob).sum()`), so ties count — or null
// when the host's alternatives cannot tell.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tools/coli/serve_openai.h"

namespace coli::cli::serve {
namespace {

struct Alt {
  int32_t id;
  float logprob;
  std::string text;
};

v1::TokenLogprobs Position(Alt token, const std::vector<Alt>& alternatives) {
  v1::TokenLogprobs e;
  auto fill = [](const Alt& a, v1::TokenLogprob* t) {
    t->set_id(a.id);
    t->set_logprob(a.logprob);
    t->set_text(a.text);
  };
  fill(token, e.mutable_sampled());
  for (const Alt& a : alternatives) fill(a, e.add_top());
  return e;
}

// The ids of a position's entries, in the order the JSON lists them.
std::vector<std::string> Keys(const Json& position) {
  std::vector<std::string> keys;
  for (auto it = position.begin(); it != position.end(); ++it) keys.push_back(it.key());
  return keys;
}

constexpr int64_t kVocab = 512;

// Five alternatives, descending, with a tie at -2.
const std::vector<Alt> kAlternatives = {
    {10, -1.0f, "a"}, {11, -2.0f, "b"}, {12, -2.0f, "c"}, {13, -3.0f, "d"}, {14, -4.0f, "e"}};

TEST(VllmPromptLogprobs, TheFirstPromptTokenIsNullAndEachPositionFollows) {
  const Json out = VllmPromptLogprobs(
      {Position({11, -2.0f, "b"}, kAlternatives), Position({13, -3.0f, "d"}, kAlternatives)}, 0,
      kVocab);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].is_null());
  EXPECT_EQ(Keys(out[1]), std::vector<std::string>({"11"}));
  EXPECT_EQ(Keys(out[2]), std::vector<std::string>({"13"}));
  EXPECT_FLOAT_EQ(out[2]["13"]["logprob"].get<float>(), -3.0f);
  EXPECT_EQ(out[2]["13"]["decoded_token"], "d");
}

TEST(VllmPromptLogprobs, AShownTokenKeepsItsFirstPlaceAndTakesItsListedRank) {
  // Token 12 is the third alternative: with k = 3 it is shown, rank 3 (vLLM's dict overwrites
  // the counted rank with the top-k one), and listed once, first.
  const Json out = VllmPromptLogprobs({Position({12, -2.0f, "c"}, kAlternatives)}, 3, kVocab);
  EXPECT_EQ(Keys(out[1]), std::vector<std::string>({"12", "10", "11"}));
  EXPECT_EQ(out[1]["12"]["rank"], 3);
  EXPECT_EQ(out[1]["10"]["rank"], 1);
  EXPECT_EQ(out[1]["11"]["rank"], 2);
}

TEST(VllmPromptLogprobs, AHiddenTokenCountsEveryTokenAtLeastAsLikelyTiesIncluded) {
  // Token 11 ties token 12 at -2: vLLM counts 10, 11 and 12, so rank 3 (not its place, 2).
  const Json tied = VllmPromptLogprobs({Position({11, -2.0f, "b"}, kAlternatives)}, 1, kVocab);
  EXPECT_EQ(Keys(tied[1]), std::vector<std::string>({"11", "10"}));
  EXPECT_EQ(tied[1]["11"]["rank"], 3);
  EXPECT_EQ(tied[1]["10"]["rank"], 1);
  // Shown (k = 2) it takes its place in the top list instead, as vLLM's dict does.
  const Json shown = VllmPromptLogprobs({Position({11, -2.0f, "b"}, kAlternatives)}, 2, kVocab);
  EXPECT_EQ(shown[1]["11"]["rank"], 2);
  // Token 13, fourth: rank 4.
  const Json fourth = VllmPromptLogprobs({Position({13, -3.0f, "d"}, kAlternatives)}, 0, kVocab);
  EXPECT_EQ(fourth[1]["13"]["rank"], 4);
}

TEST(VllmPromptLogprobs, ARankTheAlternativesCannotTellIsNull) {
  // Less likely than every alternative: somewhere beyond them.
  const Json beyond = VllmPromptLogprobs({Position({99, -9.0f, "z"}, kAlternatives)}, 2, kVocab);
  EXPECT_EQ(Keys(beyond[1]), std::vector<std::string>({"99", "10", "11"}));
  EXPECT_TRUE(beyond[1]["99"]["rank"].is_null());
  // The last alternative: a token past them may tie it.
  const Json last = VllmPromptLogprobs({Position({14, -4.0f, "e"}, kAlternatives)}, 0, kVocab);
  EXPECT_TRUE(last[1]["14"]["rank"].is_null());
  // Unless the alternatives are the whole vocabulary.
  const Json whole = VllmPromptLogprobs({Position({14, -4.0f, "e"}, kAlternatives)}, 0,
                                        static_cast<int64_t>(kAlternatives.size()));
  EXPECT_EQ(whole[1]["14"]["rank"], 5);
}

TEST(VllmPromptLogprobs, APartialCharacterDecodesToTheReplacementCharacter) {
  const Json out = VllmPromptLogprobs(
      {Position({160, -1.5f, "\xE4"}, {{160, -1.5f, "\xE4"}, {161, -2.0f, "\xC3\xA9"}})}, 2,
      kVocab);
  EXPECT_EQ(out[1]["160"]["decoded_token"], "\xEF\xBF\xBD");
  EXPECT_EQ(out[1]["161"]["decoded_token"], "\xC3\xA9");
  EXPECT_EQ(out[1]["160"]["rank"], 1);
}

}  // namespace
}  // namespace coli::cli::serve
