// response_format (ABI 1.4) in the kimi_k3 plugin on the tiny fixture (random weights: left to
// itself the model never writes JSON, so every check here fails when enforcement is off).
// Through host::Plugin / Model / Session (the host's own wrappers over the C table). The
// validator is independent of common/grammar: nlohmann's parser, then the schema's rules checked
// by hand (SchemaErrors). Covered: plain text and chat, greedy and seeded, the same request
// without the constraint is not valid JSON, thinking on (free reasoning, JSON answer), the end
// of message only after a complete value, raw logprobs, json_object, a constrained row on a
// speculative-decoding model (no drafts, same tokens), batched rows, bad formats refused by path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/plugin.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Bounded in every direction: enums, strings with maxLength, arrays with maxItems, a nested
// object, booleans.
constexpr char kSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "size": {
      "type": "object",
      "properties": {"n": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
      "required": ["n", "ok"],
      "additionalProperties": false
    }
  },
  "required": ["name", "color", "tags", "size"],
  "additionalProperties": false
})";

std::string SchemaFormat() {
  Json f = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "thing"}, {"strict", true}, {"schema", Json::parse(kSchema)}}}};
  return f.dump();
}

// Code points of a UTF-8 string (maxLength counts characters).
size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// Why `text` is not a valid instance of kSchema ("" when it is). Independent of common/grammar.
std::string SchemaErrors(const std::string& text) {
  const Json v = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return "not JSON: " + text;
  if (!v.is_object()) return "not an object";
  if (v.size() != 4) return "expected exactly name, color, tags, size";
  for (const char* key : {"name", "color", "tags", "size"}) {
    if (!v.contains(key)) return std::string("missing ") + key;
  }
  if (!v["name"].is_string() || CodePoints(v["name"].get<std::string>()) > 8) return "bad name";
  if (v["color"] != "red" && v["color"] != "green" && v["color"] != "blue") return "bad color";
  if (!v["tags"].is_array() || v["tags"].size() > 3) return "bad tags";
  for (const Json& t : v["tags"]) {
    if (!t.is_string() || CodePoints(t.get<std::string>()) > 4) return "bad tag";
  }
  const Json& size = v["size"];
  if (!size.is_object() || size.size() != 2 || !size.contains("n") || !size.contains("ok")) {
    return "bad size";
  }
  if (size["n"] != 1 && size["n"] != 2 && size["n"] != 3) return "bad size.n";
  if (!size["ok"].is_boolean()) return "bad size.ok";
  return "";
}

struct Output {
  std::string text;       // plain text: the streamed bytes; chat: content events
  std::string reasoning;  // chat: reasoning events
  std::vector<host::StepResult> steps;
  int32_t finish = COLI_FINISH_NONE;
  bool end_of_message = false;
};

class K3ConstrainedTest : public k3::abi_test::TinyHostModelTest {
 protected:
  static std::vector<int32_t> Tokens(const std::string& text) {
    auto ids = model_->Tokenize(text, false);
    EXPECT_OK(ids.status());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  // Prefills `prompt` (chat when parse_mode != 0) and steps until a finish or `max_steps`.
  static Output Generate(host::Session* session, const std::vector<int32_t>& prompt,
                         int32_t parse_mode, const std::string& format, const host::Sampling& knobs,
                         uint64_t seed, int max_steps = 400) {
    Output run;
    EXPECT_OK(session->Prefill(prompt, parse_mode, seed, nullptr, nullptr, format).status());
    for (int i = 0; i < max_steps; ++i) {
      auto step = session->Step(knobs);
      EXPECT_OK(step.status());
      if (!step.ok()) break;
      if (parse_mode == 0) run.text += step->text;
      for (const host::ChatEvent& e : step->events) {
        if (e.channel == COLI_CHANNEL_CONTENT) run.text += e.text;
        if (e.channel == COLI_CHANNEL_REASONING) run.reasoning += e.text;
        if (e.end_of_message) run.end_of_message = true;
      }
      run.finish = step->finish;
      run.steps.push_back(*std::move(step));
      if (run.finish != COLI_FINISH_NONE) break;
    }
    return run;
  }

  static Output Plain(const std::string& format, const host::Sampling& knobs, uint64_t seed = 0) {
    auto session = model_->NewSession();
    EXPECT_OK(session.status());
    return Generate(session->get(), Tokens("Describe a thing as JSON:"), 0, format, knobs, seed);
  }

  static Output Chat(const std::string& format, bool thinking, const host::Sampling& knobs,
                     uint64_t seed = 0, int max_steps = 400) {
    Json body = {{"messages", {{{"role", "user"}, {"content", "Describe a thing."}}}},
                 {"enable_thinking", thinking}};
    if (!format.empty()) body["response_format"] = Json::parse(format);
    auto rendered = model_->RenderChat(body.dump(), true);
    EXPECT_OK(rendered.status());
    auto session = model_->NewSession();
    EXPECT_OK(session.status());
    return Generate(session->get(), rendered->tokens, rendered->chat_parse_mode, format, knobs,
                    seed, max_steps);
  }

  static bool IsSpecial(int32_t id) {
    for (const host::SpecialToken& t : model_->info().special_tokens) {
      if (t.id == id) return true;
    }
    return IsStop(id);
  }
  static bool IsStop(int32_t id) {
    const std::vector<int32_t>& stops = model_->info().stop_ids;
    return std::find(stops.begin(), stops.end(), id) != stops.end();
  }
};

const host::Sampling kGreedy = {.logprobs = 2};
const host::Sampling kSampled = {.temperature = 1.0f, .logprobs = 2};

TEST_F(K3ConstrainedTest, PlainTextOutputMatchesTheSchemaGreedyAndSeeded) {
  for (const auto& [knobs, seed] :
       {std::pair{kGreedy, uint64_t{0}}, std::pair{kSampled, uint64_t{7}},
        std::pair{kSampled, uint64_t{8}}}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << knobs.temperature << " seed " << seed);
    const Output run = Plain(SchemaFormat(), knobs, seed);
    EXPECT_EQ(run.finish, COLI_FINISH_STOP) << run.text;
    EXPECT_EQ(SchemaErrors(run.text), "");
    // The same seed and knobs give the same output.
    EXPECT_EQ(Plain(SchemaFormat(), knobs, seed).text, run.text);
  }
}

TEST_F(K3ConstrainedTest, WithoutTheConstraintTheTinyModelWritesNoJson) {
  for (const auto& [knobs, seed] :
       {std::pair{kGreedy, uint64_t{0}}, std::pair{kSampled, uint64_t{7}}}) {
    const Output plain = Plain("", knobs, seed);
    EXPECT_NE(SchemaErrors(plain.text), "") << plain.text;
    const Output chat = Chat("", false, knobs, seed, 120);
    EXPECT_NE(SchemaErrors(chat.text), "") << chat.text;
  }
}

TEST_F(K3ConstrainedTest, LogprobsStayThoseOfTheRawLogits) {
  const Output free_run = Plain("", kGreedy);
  const Output constrained = Plain(SchemaFormat(), kGreedy);
  ASSERT_FALSE(free_run.steps.empty());
  ASSERT_FALSE(constrained.steps.empty());
  // Same prompt, so the first step sees the same logits: same top logprobs, bit for bit.
  const host::StepResult& a = free_run.steps[0];
  const host::StepResult& b = constrained.steps[0];
  ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
  for (size_t k = 0; k < a.top_logprobs.size(); ++k) {
    EXPECT_EQ(a.top_logprobs[k].id, b.top_logprobs[k].id);
    EXPECT_EQ(a.top_logprobs[k].logprob, b.top_logprobs[k].logprob);
  }
  // The constrained first token ('{') is not the raw favourite: its reported logprob is lower
  // than the raw best, i.e. it is not renormalised over the allowed tokens.
  EXPECT_EQ(constrained.text.substr(0, 1), "{");
  EXPECT_NE(b.token, b.top_logprobs[0].id);
  EXPECT_LT(b.logprob, b.top_logprobs[0].logprob);
  EXPECT_LT(b.logprob, std::log(0.5f));
}

TEST_F(K3ConstrainedTest, ChatAnswerMatchesTheSchemaAndEndsTheMessageAfterIt) {
  for (const auto& [knobs, seed] :
       {std::pair{kGreedy, uint64_t{0}}, std::pair{kSampled, uint64_t{3}}}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << knobs.temperature);
    const Output run = Chat(SchemaFormat(), false, knobs, seed);
    EXPECT_EQ(run.finish, COLI_FINISH_STOP);
    EXPECT_TRUE(run.end_of_message);
    EXPECT_EQ(run.reasoning, "");
    EXPECT_EQ(SchemaErrors(run.text), "");
    // The answer is ordinary tokens up to the first special one (<|close|> of the well-formed
    // end, or the stop), which comes only once the value is complete: no content after it, and
    // the last token is a stop.
    const std::vector<host::StepResult>& steps = run.steps;
    size_t first_special = steps.size();
    for (size_t i = 0; i < steps.size(); ++i) {
      if (IsSpecial(steps[i].token)) {
        first_special = i;
        break;
      }
    }
    ASSERT_LT(first_special, steps.size());
    std::string before;
    for (size_t i = 0; i < first_special; ++i) {
      for (const auto& e : steps[i].events) before += e.text;
    }
    EXPECT_EQ(SchemaErrors(before), "") << "the answer was not complete at its end";
    for (size_t i = first_special; i < steps.size(); ++i) {
      for (const auto& e : steps[i].events) {
        EXPECT_NE(e.channel, COLI_CHANNEL_CONTENT) << "content after the answer ended";
      }
    }
    EXPECT_TRUE(IsStop(steps.back().token));
  }
}

TEST_F(K3ConstrainedTest, ThinkingReasonsFreelyThenAnswersInJson) {
  // Seeded: the tiny model (768 ids) samples <|close|> by itself after ~100 tokens of free
  // reasoning; the rest of `think<|sep|><|open|>response<|sep|>` is then forced.
  const host::Sampling knobs = {.temperature = 1.0f, .logprobs = 0};
  const Output run = Chat(SchemaFormat(), true, knobs, 11, 800);
  EXPECT_EQ(run.finish, COLI_FINISH_STOP);
  EXPECT_TRUE(run.end_of_message);
  EXPECT_FALSE(run.reasoning.empty());
  // The reasoning is free text: not a JSON value (the constraint never applied to it).
  EXPECT_TRUE(Json::parse(run.reasoning, nullptr, false).is_discarded()) << run.reasoning;
  EXPECT_EQ(SchemaErrors(run.text), "") << "reasoning: " << run.reasoning;
}

TEST_F(K3ConstrainedTest, JsonObjectGivesAnObject) {
  // Any object: strings and nesting are unbounded, so ending is up to the model; a mild bias on
  // the tokens that close things (" } ,) lets the random model finish its object.
  const std::string format = R"({"type":"json_object"})";
  for (auto [knobs, seed] : {std::pair{kGreedy, uint64_t{0}}, std::pair{kSampled, uint64_t{5}}}) {
    for (const char* closer : {"\"", "}", ","}) {
      auto id = model_->Tokenize(closer, false);
      ASSERT_OK(id.status());
      ASSERT_EQ(id->size(), 1u) << closer;
      knobs.logit_bias.push_back({(*id)[0], 2.0f});
    }
    const Output run = Chat(format, false, knobs, seed, 1500);
    ASSERT_EQ(run.finish, COLI_FINISH_STOP) << run.text;
    const Json v = Json::parse(run.text, nullptr, false);
    EXPECT_FALSE(v.is_discarded()) << run.text;
    EXPECT_TRUE(v.is_object()) << run.text;
  }
}

TEST_F(K3ConstrainedTest, TextFormatIsNoConstraint) {
  const Output free_run = Plain("", kGreedy);
  const Output text = Plain(R"({"type":"text"})", kGreedy);
  ASSERT_EQ(free_run.steps.size(), text.steps.size());
  for (size_t i = 0; i < text.steps.size(); ++i) {
    EXPECT_EQ(text.steps[i].token, free_run.steps[i].token);
  }
}

TEST_F(K3ConstrainedTest, BadFormatsAreRefusedByPathBeforeAnyWork) {
  auto session = model_->NewSession();
  ASSERT_OK(session.status());
  const std::vector<int32_t> prompt = Tokens("hi");
  const std::string unsupported =
      R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object",)"
      R"("properties":{"a":{"type":"integer","not":{"const":3}}}}}})";
  EXPECT_THAT((*session)->Prefill(prompt, 0, 0, nullptr, nullptr, unsupported).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("response_format.json_schema.schema.properties.a.not")));
  EXPECT_THAT((*session)->Prefill(prompt, 0, 0, nullptr, nullptr, "{not json").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format")));
  EXPECT_THAT((*session)->Prefill(prompt, 0, 0, nullptr, nullptr, R"({"type":"yaml"})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format")));
  // The session was untouched: nothing was computed, decode still refuses.
  auto record = (*session)->Record();
  ASSERT_OK(record.status());
  EXPECT_TRUE(record->empty());
}

TEST_F(K3ConstrainedTest, BatchedRowsEqualLoneRuns) {
  // Two constrained sessions and one free one stepped together in one decode call.
  const std::vector<int32_t> prompt = Tokens("Describe a thing as JSON:");
  std::vector<std::unique_ptr<host::Session>> sessions;
  const std::string formats[] = {SchemaFormat(), "", SchemaFormat()};
  const host::Sampling knobs[] = {kGreedy, kGreedy, kSampled};
  const uint64_t seeds[] = {0, 0, 7};
  for (int i = 0; i < 3; ++i) {
    auto s = model_->NewSession();
    ASSERT_OK(s.status());
    ASSERT_OK((*s)->Prefill(prompt, 0, seeds[i], nullptr, nullptr, formats[i]).status());
    sessions.push_back(std::move(s).value());
  }
  std::vector<std::string> texts(3);
  std::vector<bool> done(3, false);
  for (int step = 0; step < 400; ++step) {
    std::vector<host::Session*> live;
    std::vector<host::Sampling> live_knobs;
    std::vector<int> index;
    for (int i = 0; i < 3; ++i) {
      if (done[i] || (i == 1 && step >= 40)) continue;
      live.push_back(sessions[i].get());
      live_knobs.push_back(knobs[i]);
      index.push_back(i);
    }
    if (live.empty()) break;
    auto results = host::Session::StepBatch(live, live_knobs);
    ASSERT_OK(results.status());
    for (size_t r = 0; r < index.size(); ++r) {
      texts[index[r]] += (*results)[r].text;
      if ((*results)[r].finish != COLI_FINISH_NONE) done[index[r]] = true;
    }
  }
  EXPECT_EQ(texts[0], Plain(SchemaFormat(), kGreedy).text);
  EXPECT_EQ(texts[2], Plain(SchemaFormat(), kSampled, 7).text);
  EXPECT_EQ(SchemaErrors(texts[0]), "");
  EXPECT_EQ(SchemaErrors(texts[2]), "");
}

// Constrained rows speculate: the draft is verified under the mask (a copy of the constraint
// and the sampler per draft row), so the output is the run without speculation's, token for
// token. The prompt quotes the value the constrained run writes, so prompt lookup drafts it.
TEST_F(K3ConstrainedTest, ConstrainedRowsSpeculateAndMatchTheRunWithoutSpec) {
  auto spec_model = OpenTiny({{"spec", "4"}});
  ASSERT_OK(spec_model.status());
  double drafts = 0, accepted = 0;
  for (const auto& [knobs, seed] : {std::pair{kGreedy, uint64_t{0}}, std::pair{kSampled, uint64_t{7}}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Output first = Plain(SchemaFormat(), knobs, seed);
    ASSERT_EQ(SchemaErrors(first.text), "");
    // A prompt holding that value twice: the constrained run writes it again.
    const std::vector<int32_t> prompt =
        Tokens("Describe a thing as JSON: " + first.text + "\nAgain: " + first.text + "\nOnce more:");
    auto plain = model_->NewSession();
    ASSERT_OK(plain.status());
    const Output off = Generate(plain->get(), prompt, 0, SchemaFormat(), knobs, seed);
    auto session = (*spec_model)->NewSession();
    ASSERT_OK(session.status());
    const Output on = Generate(session->get(), prompt, 0, SchemaFormat(), knobs, seed);
    ASSERT_EQ(on.steps.size(), off.steps.size());
    for (size_t i = 0; i < on.steps.size(); ++i) {
      EXPECT_EQ(on.steps[i].token, off.steps[i].token) << "step " << i;
      EXPECT_EQ(on.steps[i].logprob, off.steps[i].logprob) << "step " << i;
    }
    EXPECT_EQ(on.text, off.text);
    EXPECT_EQ(SchemaErrors(on.text), "");
    auto stats = (*session)->Stats();
    ASSERT_OK(stats.status());
    drafts += (*stats)["spec_drafts"];
    accepted += (*stats)["spec_accepted_tokens"];
    // Every verified token was the one the row then drew (a verify that drew other tokens than
    // the masked step would still give the same output, through rewinds to the record).
    EXPECT_EQ((*stats)["spec_rewinds"], 0);
  }
  EXPECT_GT(drafts, 0);
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace coli::k3
