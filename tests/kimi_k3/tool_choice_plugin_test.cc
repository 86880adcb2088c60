// tool_choice "required" / a named function enforced by the kimi_k3 plugin on the tiny fixture
// (random weights: left to itself the model never writes a tool call, so every positive check
// here fails when enforcement is off; `WithoutToolChoiceTheTinyModelNeverCalls` is the control).
// The constraint is the host's ABI 1.4 response_format extension {"type":"coli_tool_calls",…}
// (host/engine.cc ToolCallFormatOf, docs/status/constrained.md). What the test reads are the
// plugin's ordinary tool-call events (the chat parser's), validated independently of
// common/grammar: nlohmann's parser, then each function's schema rules checked by hand.
#include <algorithm>
#include <cstdint>
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

// Two bounded functions (every argument object ends).
const Json kWeatherParams = Json::parse(R"({
  "type": "object",
  "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
  "required": ["city", "unit"], "additionalProperties": false})");
const Json kPickParams = Json::parse(R"({
  "type": "object",
  "properties": {"n": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
  "required": ["n", "ok"], "additionalProperties": false})");

Json Tools() {
  return Json::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"}, {"parameters", kWeatherParams}}}},
       {{"type", "function"}, {"function", {{"name", "pick"}, {"parameters", kPickParams}}}}});
}

// The host's encoding of a tool_choice (what ToolCallFormatOf sends for these tools).
std::string Format(const std::string& mode, const std::vector<std::string>& names) {
  Json tools = Json::array();
  for (const std::string& n : names) {
    tools.push_back({{"name", n},
                     {"strict", false},
                     {"parameters", n == "pick" ? kPickParams : kWeatherParams}});
  }
  return Json{{"type", "coli_tool_calls"}, {"mode", mode}, {"tools", tools}}.dump();
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// Why `call` (a tool-call event's JSON) is not a valid call of one of `names` ("" when it is).
std::string CallErrors(const std::string& call_text, const std::vector<std::string>& names) {
  const Json call = Json::parse(call_text, nullptr, /*allow_exceptions=*/false);
  if (call.is_discarded() || !call.is_object()) return "not a JSON object: " + call_text;
  if (!call.contains("name") || !call["name"].is_string()) return "no name: " + call_text;
  const std::string name = call["name"];
  if (std::find(names.begin(), names.end(), name) == names.end()) return "wrong name " + name;
  const Json& a = call["arguments"];
  if (!a.is_object()) return "arguments not an object: " + call_text;
  if (name == "get_weather") {
    if (a.size() != 2 || !a.contains("city") || !a.contains("unit")) return "bad keys " + a.dump();
    if (!a["city"].is_string() || CodePoints(a["city"].get<std::string>()) > 10) return "bad city";
    if (a["unit"] != "c" && a["unit"] != "f") return "bad unit";
  } else {
    if (a.size() != 2 || !a.contains("n") || !a.contains("ok")) return "bad keys " + a.dump();
    if (a["n"] != 1 && a["n"] != 2 && a["n"] != 3) return "bad n";
    if (!a["ok"].is_boolean()) return "bad ok";
  }
  return "";
}

struct Output {
  std::vector<std::string> calls;  // tool-call events
  std::string content, reasoning;
  int32_t finish = COLI_FINISH_NONE;
  bool end_of_message = false;
};

class K3ToolChoiceTest : public k3::abi_test::TinyHostModelTest {
 protected:
  // A chat with both tools offered and `tool_choice` in the body (rendered by the plugin's
  // template), generated under `format` ("" = none).
  static Output Chat(const Json& tool_choice, const std::string& format, bool thinking,
                     const host::Sampling& knobs, uint64_t seed, int max_steps = 600) {
    Json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                 {"tools", Tools()},
                 {"enable_thinking", thinking}};
    if (!tool_choice.is_null()) body["tool_choice"] = tool_choice;
    auto rendered = model_->RenderChat(body.dump(), true);
    EXPECT_OK(rendered.status());
    auto session = model_->NewSession();
    EXPECT_OK(session.status());
    Output run;
    EXPECT_OK(
        (*session)
            ->Prefill(rendered->tokens, rendered->chat_parse_mode, seed, nullptr, nullptr, format)
            .status());
    for (int i = 0; i < max_steps; ++i) {
      auto step = (*session)->Step(knobs);
      EXPECT_OK(step.status());
      if (!step.ok()) break;
      for (const host::ChatEvent& e : step->events) {
        if (e.channel == COLI_CHANNEL_TOOL_CALL) run.calls.push_back(e.text);
        if (e.channel == COLI_CHANNEL_CONTENT) run.content += e.text;
        if (e.channel == COLI_CHANNEL_REASONING) run.reasoning += e.text;
        if (e.end_of_message) run.end_of_message = true;
      }
      run.finish = step->finish;
      if (run.finish != COLI_FINISH_NONE) break;
    }
    return run;
  }

  // Thinking runs: a mild bias on <|close|> so the random model's free reasoning ends within the
  // step budget (it is the only special token the think phase allows; inside arguments it is
  // allowed only once they can end).
  static host::Sampling Knobs(float temperature) {
    host::Sampling k;
    k.temperature = temperature;
    for (const host::SpecialToken& t : model_->info().special_tokens) {
      if (t.text == "<|close|>") k.logit_bias.push_back({t.id, 4.0f});
    }
    return k;
  }
};

const Json kNamedPick = {{"type", "function"}, {"function", {{"name", "pick"}}}};

TEST_F(K3ToolChoiceTest, NamedFunctionGivesExactlyOneValidCallOfIt) {
  struct Case {
    float temperature;
    uint64_t seed;
    bool thinking;
  };
  for (const Case& c : {Case{0, 0, true}, Case{1, 3, true}, Case{1, 4, true}, Case{0, 0, false},
                        Case{1, 5, false}}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << c.temperature << " seed " << c.seed
                                      << " thinking " << c.thinking);
    const Output run =
        Chat(kNamedPick, Format("named", {"pick"}), c.thinking, Knobs(c.temperature), c.seed);
    ASSERT_EQ(run.calls.size(), 1u) << "content: " << run.content;
    EXPECT_EQ(CallErrors(run.calls[0], {"pick"}), "");
    EXPECT_EQ(run.content, "");
    EXPECT_TRUE(run.end_of_message);
    EXPECT_EQ(run.finish, COLI_FINISH_STOP);
    // Seeded runs repeat.
    EXPECT_EQ(
        Chat(kNamedPick, Format("named", {"pick"}), c.thinking, Knobs(c.temperature), c.seed).calls,
        run.calls);
  }
}

TEST_F(K3ToolChoiceTest, RequiredGivesAtLeastOneValidCallOfTheOfferedTools) {
  int total = 0;
  for (uint64_t seed : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Output run = Chat("required", Format("required", {"get_weather", "pick"}), true,
                            Knobs(seed == 0 ? 0.0f : 1.0f), seed);
    ASSERT_GE(run.calls.size(), 1u) << "content: " << run.content;
    for (const std::string& call : run.calls) {
      EXPECT_EQ(CallErrors(call, {"get_weather", "pick"}), "");
    }
    EXPECT_EQ(run.content, "");
    EXPECT_TRUE(run.end_of_message);
    total += static_cast<int>(run.calls.size());
  }
  EXPECT_GE(total, 4);
}

TEST_F(K3ToolChoiceTest, RequiredSingleGivesExactlyOneCall) {
  Json format = Json::parse(Format("required", {"get_weather", "pick"}));
  format["single"] = true;  // parallel_tool_calls: false
  for (uint64_t seed : {1, 2}) {
    const Output run = Chat("required", format.dump(), false, Knobs(1.0f), seed);
    ASSERT_EQ(run.calls.size(), 1u) << "seed " << seed;
    EXPECT_EQ(CallErrors(run.calls[0], {"get_weather", "pick"}), "");
    EXPECT_TRUE(run.end_of_message);
  }
}

TEST_F(K3ToolChoiceTest, WithoutToolChoiceTheTinyModelNeverCalls) {
  for (uint64_t seed : {0, 1, 2}) {
    const Output run = Chat(nullptr, "", true, Knobs(seed == 0 ? 0.0f : 1.0f), seed, 300);
    EXPECT_TRUE(run.calls.empty()) << run.calls[0];
  }
}

TEST_F(K3ToolChoiceTest, BadToolConstraintsAreRefusedByName) {
  auto session = model_->NewSession();
  ASSERT_OK(session.status());
  auto rendered = model_->RenderChat(
      Json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", Tools()}}.dump(), true);
  ASSERT_OK(rendered.status());
  auto prefill = [&](const std::string& format, int32_t mode) {
    return (*session)->Prefill(rendered->tokens, mode, 0, nullptr, nullptr, format).status();
  };
  Json bad_schema = Json::parse(Format("named", {"pick"}));
  bad_schema["tools"][0]["parameters"] = {{"type", "object"},
                                          {"patternProperties", Json::object()}};
  EXPECT_THAT(prefill(bad_schema.dump(), rendered->chat_parse_mode),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("function 'pick'")));
  Json bad_name = Json::parse(Format("required", {"pick"}));
  bad_name["tools"][0]["name"] = "a\"b";
  EXPECT_THAT(prefill(bad_name.dump(), rendered->chat_parse_mode),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("function name")));
  Json two_named = Json::parse(Format("named", {"pick", "get_weather"}));
  EXPECT_THAT(prefill(two_named.dump(), rendered->chat_parse_mode),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one tool")));
  // Plain text has no chat structure to write a call in.
  EXPECT_THAT(prefill(Format("required", {"pick"}), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tool_choice")));
}

}  // namespace
}  // namespace coli::k3
