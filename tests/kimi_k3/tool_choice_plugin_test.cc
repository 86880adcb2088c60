// tool_choice "required" / a named function enforced by the kimi_k3 plugin on the tiny fixture
// (random weights: left to itself the model never writes a tool call, so every positive check
// here fails when enforcement is off; `WithoutToolChoiceTheTinyModelNeverCalls` is the control).
// The constraint is the host's ABI 1.4 response_format extension {"type":"coli_tool_calls",…}
// (host/engine.cc ToolCallFormatOf, docs/status/constrained.md). What the test reads are the
// plugin's ordinary tool-call events (the chat parser's), validated independently of
// common/grammar: nlohmann's parser, then each function's schema rules checked by hand.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
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
  // The arguments object, or (a call whose raw json block is not the compact serialisation, as
  // the parser's tool-call-delta mode reports it) its text, which must parse to one.
  const Json a = call["arguments"].is_string()
                     ? Json::parse(call["arguments"].get<std::string>(), nullptr, false)
                     : call["arguments"];
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
  std::vector<int32_t> ids;  // every token generated
};

// Steering: from step `at` on, script[i] (when >= 0) gets a +30 logit_bias at step at + i — a
// caller's ordinary knob, used to make the random tiny model open a call itself (left alone it
// never does); kOrdinary puts -30 on every special token instead (any ordinary token, the
// model's choice). A constraint masks before the bias, so a steered token it forbids stays out.
constexpr int32_t kOrdinary = -2;
struct Steer {
  int at = 0;
  std::vector<int32_t> script;
};

class K3ToolChoiceTest : public k3::abi_test::TinyHostModelTest {
 public:
  static host::Model* model() { return model_; }
  // Every special id of the fixture's tokenizer (named and reserved).
  static const std::vector<int32_t>& SpecialIds() {
    static const std::vector<int32_t> ids = [] {
      std::vector<int32_t> out;
      auto t = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
      EXPECT_OK(t.status());
      if (!t.ok()) return out;
      for (int32_t id = 0; id < (*t)->vocab_size(); ++id) {
        if ((*t)->IsSpecial(id)) out.push_back(id);
      }
      return out;
    }();
    return ids;
  }

 protected:
  // A chat with both tools offered and `tool_choice` in the body (rendered by the plugin's
  // template), generated under `format` ("" = none).
  static Output Chat(const Json& tool_choice, const std::string& format, bool thinking,
                     const host::Sampling& knobs, uint64_t seed, int max_steps = 600,
                     const std::vector<Steer>& steers = {}, host::Model* model = nullptr,
                     const std::string& user = "Weather in Paris?",
                     std::map<std::string, double>* stats = nullptr) {
    if (model == nullptr) model = model_;
    Json body = {{"messages", {{{"role", "user"}, {"content", user}}}},
                 {"tools", Tools()},
                 {"enable_thinking", thinking}};
    if (!tool_choice.is_null()) body["tool_choice"] = tool_choice;
    auto rendered = model->RenderChat(body.dump(), true);
    EXPECT_OK(rendered.status());
    auto session = model->NewSession();
    EXPECT_OK(session.status());
    Output run;
    EXPECT_OK(
        (*session)
            ->Prefill(rendered->tokens, rendered->chat_parse_mode, seed, nullptr, nullptr, format)
            .status());
    for (int i = 0; i < max_steps; ++i) {
      host::Sampling step_knobs = knobs;
      auto add_bias = [&](int32_t id, float bias) {
        auto b = std::find_if(step_knobs.logit_bias.begin(), step_knobs.logit_bias.end(),
                              [&](const coli_logit_bias_t& b) { return b.id == id; });
        if (b == step_knobs.logit_bias.end()) {
          step_knobs.logit_bias.push_back({id, bias});
        } else {
          b->bias += bias;
        }
      };
      for (const Steer& steer : steers) {
        const int k = i - steer.at;
        if (k < 0 || k >= static_cast<int>(steer.script.size())) continue;
        if (steer.script[k] == kOrdinary) {
          for (int32_t id : SpecialIds()) add_bias(id, -30.0f);
        } else if (steer.script[k] >= 0) {
          add_bias(steer.script[k], 30.0f);
        }
      }
      auto step = (*session)->Step(step_knobs);
      EXPECT_OK(step.status());
      if (!step.ok()) break;
      run.ids.push_back(step->token);
      for (const host::ChatEvent& e : step->events) {
        if (e.channel == COLI_CHANNEL_TOOL_CALL) run.calls.push_back(e.text);
        if (e.channel == COLI_CHANNEL_CONTENT) run.content += e.text;
        if (e.channel == COLI_CHANNEL_REASONING) run.reasoning += e.text;
        if (e.end_of_message) run.end_of_message = true;
      }
      run.finish = step->finish;
      if (run.finish != COLI_FINISH_NONE) break;
    }
    if (stats != nullptr) {
      auto s = (*session)->Stats();
      EXPECT_OK(s.status());
      if (s.ok()) *stats = *s;
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

// ---- tool_choice "auto": lazy, a call the model opens itself is constrained ----

// The host's encoding of tool_choice auto (ToolCallFormatOf): every tool, mode "auto".
std::string AutoFormat(bool single = false) {
  Json f = Json::parse(Format("auto", {"get_weather", "pick"}));
  if (single) f["single"] = true;
  return f.dump();
}

int32_t Special(const std::string& text) {
  for (const host::SpecialToken& t : K3ToolChoiceTest::model()->info().special_tokens) {
    if (t.text == text) return t.id;
  }
  ADD_FAILURE() << "no special token " << text;
  return -1;
}

std::vector<int32_t> Ids(const std::string& text) {
  auto ids = K3ToolChoiceTest::model()->Tokenize(text, false);
  EXPECT_OK(ids.status());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// A whole call written by steering, except its name (4 free steps) and its arguments (8 free
// steps): what a model that opens a call on its own writes, with the parts a constraint would
// choose left to the random model. Without enforcement the call the parser reports has a name
// that is not a tool's and arguments that are not valid; with it, the constraint takes over at
// `call ` and every later steered token it forbids is masked away.
std::vector<int32_t> SteeredCall() {
  const int32_t open = Special("<|open|>"), close = Special("<|close|>"), sep = Special("<|sep|>");
  std::vector<int32_t> s = {open};
  for (int32_t id : Ids("call tool=\"")) s.push_back(id);
  for (int i = 0; i < 4; ++i) s.push_back(kOrdinary);
  for (int32_t id : Ids("\" index=\"1\"")) s.push_back(id);
  s.push_back(sep);
  s.push_back(open);
  for (int32_t id : Ids("json type=\"object\"")) s.push_back(id);
  s.push_back(sep);
  for (int i = 0; i < 8; ++i) s.push_back(kOrdinary);
  s.push_back(close);
  for (int32_t id : Ids("json")) s.push_back(id);
  s.push_back(sep);
  s.push_back(close);
  for (int32_t id : Ids("call")) s.push_back(id);
  s.push_back(sep);
  return s;
}

// The typed-argument form, the one the renderer writes (so the one K3 is trained on): a model
// that writes `argument` elements gets each key's schema for its value. `argument` is steered
// at every step (+30; a constraint allows it only where an element's header starts), the rest
// is the random model's: its keys, types, values and when it closes the call.
TEST_F(K3ToolChoiceTest, ACallInTheTypedFormGetsEachKeysSchema) {
  const std::vector<int32_t> argument = Ids("argument");
  ASSERT_FALSE(argument.empty());
  const std::vector<Steer> steer = {{0, std::vector<int32_t>(200, argument[0])}};
  for (const std::string name : {"pick", "get_weather"}) {
    for (uint64_t seed : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << name << " seed " << seed);
      const Json choice = {{"type", "function"}, {"function", {{"name", name}}}};
      const Output run = Chat(choice, Format("named", {name}), false,
                              Knobs(seed == 0 ? 0.0f : 1.0f), seed, 200, steer);
      ASSERT_EQ(run.calls.size(), 1u) << "content: " << run.content;
      EXPECT_EQ(CallErrors(run.calls[0], {name}), "");
      auto text = model()->Detokenize(run.ids);
      ASSERT_OK(text.status());
      // Written as one element per key (the required ones at least), no json block.
      for (const char* header :
           name == "pick" ? std::vector<const char*>{"argument key=\"n\" type=\"number\"",
                                                     "argument key=\"ok\" type=\"boolean\""}
                          : std::vector<const char*>{"argument key=\"city\" type=\"string\"",
                                                     "argument key=\"unit\" type=\"string\""}) {
        EXPECT_THAT(*text, HasSubstr(header));
      }
      EXPECT_THAT(*text, ::testing::Not(HasSubstr("json type=")));
    }
  }
}

TEST_F(K3ToolChoiceTest, AutoConstrainsCallsTheModelOpensItself) {
  int unconstrained_calls = 0, unconstrained_invalid = 0, constrained_calls = 0;
  struct Case {
    bool thinking;
    uint64_t seed;
  };
  for (const Case c :
       {Case{false, 0}, Case{false, 1}, Case{false, 2}, Case{true, 0}, Case{true, 3}}) {
    {
      const bool thinking = c.thinking;
      const uint64_t seed = c.seed;
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " thinking " << thinking);
      const host::Sampling knobs = Knobs(seed == 0 ? 0.0f : 1.0f);
      const std::vector<Steer> steer = {{5, SteeredCall()}};
      // The control: the same steering without enforcement opens calls that do not validate.
      const Output free = Chat("auto", "", thinking, knobs, seed, 130, steer);
      for (const std::string& call : free.calls) {
        ++unconstrained_calls;
        if (!CallErrors(call, {"get_weather", "pick"}).empty()) ++unconstrained_invalid;
      }
      const Output run = Chat("auto", AutoFormat(), thinking, knobs, seed, 130, steer);
      ASSERT_GE(run.calls.size(), 1u) << "content: " << run.content;
      for (const std::string& call : run.calls) {
        EXPECT_EQ(CallErrors(call, {"get_weather", "pick"}), "");
      }
      constrained_calls += static_cast<int>(run.calls.size());
      // Up to the call's opener the two runs are the same tokens.
      ASSERT_GE(run.ids.size(), 7u);
      EXPECT_EQ(std::vector<int32_t>(run.ids.begin(), run.ids.begin() + 7),
                std::vector<int32_t>(free.ids.begin(), free.ids.begin() + 7));
      // Seeded runs repeat.
      if (seed == 1) {
        EXPECT_EQ(Chat("auto", AutoFormat(), thinking, knobs, seed, 130, steer).ids, run.ids);
      }
    }
  }
  // The control must show that the test means something: unconstrained, the opened calls the
  // parser reports are not valid calls of the tools.
  EXPECT_GE(unconstrained_calls, 4);
  EXPECT_EQ(unconstrained_invalid, unconstrained_calls);
  EXPECT_GE(constrained_calls, 5);
}

TEST_F(K3ToolChoiceTest, AutoWithoutACallIsBitIdenticalToNoConstraint) {
  // Not steered, and steered into <|open|> runs that are not calls (`tools`, `ca` then free):
  // the constraint watches them but changes nothing.
  const int32_t open = Special("<|open|>"), sep = Special("<|sep|>");
  std::vector<int32_t> tools = {open};
  for (int32_t id : Ids("tools")) tools.push_back(id);
  tools.push_back(sep);
  std::vector<int32_t> ca = {open};
  for (int32_t id : Ids("ca")) ca.push_back(id);
  struct Case {
    bool thinking;
    uint64_t seed;
  };
  for (const Case c : {Case{false, 0}, Case{false, 1}, Case{true, 3}}) {
    for (const std::vector<Steer>& steer :
         {std::vector<Steer>{}, std::vector<Steer>{{3, tools}, {20, ca}, {40, ca}}}) {
      {
        const bool thinking = c.thinking;
        const uint64_t seed = c.seed;
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " thinking " << thinking
                                          << " steered " << !steer.empty());
        const host::Sampling knobs = Knobs(seed == 0 ? 0.0f : 1.0f);
        const Output free = Chat("auto", "", thinking, knobs, seed, 80, steer);
        const Output run = Chat("auto", AutoFormat(), thinking, knobs, seed, 80, steer);
        EXPECT_TRUE(run.calls.empty());
        EXPECT_EQ(run.ids, free.ids);
        EXPECT_EQ(run.content, free.content);
        EXPECT_EQ(run.reasoning, free.reasoning);
      }
    }
  }
}

TEST_F(K3ToolChoiceTest, AutoSingleAllowsAtMostOneCall) {
  // Two steered calls; parallel_tool_calls false keeps the second from opening.
  const std::vector<Steer> steer = {{2, SteeredCall()}, {150, SteeredCall()}};
  int two = 0;
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Output many = Chat("auto", AutoFormat(false), false, Knobs(1.0f), seed, 300, steer);
    for (const std::string& call : many.calls) {
      EXPECT_EQ(CallErrors(call, {"get_weather", "pick"}), "");
    }
    two += many.calls.size() >= 2 ? 1 : 0;
    const Output one = Chat("auto", AutoFormat(true), false, Knobs(1.0f), seed, 300, steer);
    ASSERT_EQ(one.calls.size(), 1u);
    EXPECT_EQ(CallErrors(one.calls[0], {"get_weather", "pick"}), "");
  }
  EXPECT_GE(two, 1);  // without "single" the second steered call does open
}

// tool_choice "none" (the renderer tells the model it must not call): the same watching with no
// call allowed. Steered into a call, the model cannot open it; not steered, nothing changes.
TEST_F(K3ToolChoiceTest, NoneKeepsTheModelFromOpeningACall) {
  const std::string none = R"({"type":"coli_tool_calls","mode":"none","tools":[]})";
  for (uint64_t seed : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const host::Sampling knobs = Knobs(seed == 0 ? 0.0f : 1.0f);
    const std::vector<Steer> steer = {{3, SteeredCall()}};
    EXPECT_FALSE(Chat("none", "", false, knobs, seed, 80, steer).calls.empty());  // control
    EXPECT_TRUE(Chat("none", none, false, knobs, seed, 80, steer).calls.empty());
    EXPECT_EQ(Chat("none", none, false, knobs, seed, 60).ids,
              Chat("none", "", false, knobs, seed, 60).ids);
  }
}

TEST_F(K3ToolChoiceTest, AutoStrictToolWithRefusedSchemaIsRefusedElseAnyObject) {
  Json format = Json::parse(AutoFormat());
  format["tools"][1]["parameters"] = {
      {"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"not", {{"const", 2}}}}}}}};
  auto session = model_->NewSession();
  ASSERT_OK(session.status());
  auto rendered = model_->RenderChat(
      Json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", Tools()}}.dump(), true);
  ASSERT_OK(rendered.status());
  format["tools"][1]["strict"] = true;
  EXPECT_THAT(
      (*session)
          ->Prefill(rendered->tokens, rendered->chat_parse_mode, 0, nullptr, nullptr, format.dump())
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("function 'pick' parameters (strict): "
                                                             "schema.properties.n.not")));
  // Not strict: its calls' arguments are any JSON object (steered calls still parse).
  // A mild bias on `"`, `}` and `,` (as the json_object tests): any object may grow without
  // bound, and the random model would otherwise rarely close one.
  format["tools"][1]["strict"] = false;
  host::Sampling knobs = Knobs(1.0f);
  for (const char* t : {"\"", "}", ","}) knobs.logit_bias.push_back({Ids(t).at(0), 3.0f});
  int picks = 0;
  for (uint64_t seed : {1, 2, 3, 4}) {
    const Output run = Chat("auto", format.dump(), false, knobs, seed, 200, {{2, SteeredCall()}});
    ASSERT_GE(run.calls.size(), 1u) << "seed " << seed;
    for (const std::string& text : run.calls) {
      const Json call = Json::parse(text);
      const Json args = call["arguments"].is_string()
                            ? Json::parse(call["arguments"].get<std::string>(), nullptr, false)
                            : call["arguments"];
      ASSERT_TRUE(args.is_object()) << text;
      if (call["name"] == "get_weather") {
        EXPECT_EQ(CallErrors(text, {"get_weather"}), "");
      }
      EXPECT_TRUE(call["name"] == "get_weather" || call["name"] == "pick") << text;
      picks += call["name"] == "pick" ? 1 : 0;
    }
  }
  EXPECT_GE(picks, 1);  // the relaxed tool was called (any object) at least once
}

TEST_F(K3ToolChoiceTest, AutoBesideAResponseFormatGivesTheValueOrValidCalls) {
  // The extension carries the response_format: the answer is its value, or (when the model
  // closes the response at its first byte) tool calls instead; either way valid.
  const Json schema = {{"type", "object"},
                       {"properties", {{"answer", {{"enum", {"yes", "no"}}}}}},
                       {"required", {"answer"}},
                       {"additionalProperties", false}};
  Json format = Json::parse(AutoFormat());
  format["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "a"}, {"schema", schema}}}};
  const int32_t close = Special("<|close|>");
  int values = 0, calls = 0;
  for (uint64_t seed : {0, 1, 2}) {
    for (const bool steer_calls : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " calls " << steer_calls);
      std::vector<Steer> steer;
      if (steer_calls) steer.push_back({0, {close}});
      host::Sampling knobs;  // no bias on <|close|> (it would choose the calls)
      knobs.temperature = seed == 0 ? 0.0f : 1.0f;
      const Output run = Chat("auto", format.dump(), false, knobs, seed, 200, steer);
      EXPECT_TRUE(run.end_of_message);
      if (run.calls.empty()) {
        const Json value = Json::parse(run.content, nullptr, false);
        ASSERT_TRUE(value.is_object()) << run.content;
        EXPECT_EQ(value.size(), 1u);
        EXPECT_TRUE(value["answer"] == "yes" || value["answer"] == "no") << run.content;
        ++values;
      } else {
        EXPECT_EQ(run.content, "");
        for (const std::string& call : run.calls) {
          EXPECT_EQ(CallErrors(call, {"get_weather", "pick"}), "");
        }
        ++calls;
      }
      if (steer_calls) {
        EXPECT_FALSE(run.calls.empty());
      }
    }
  }
  EXPECT_GE(values, 1);
  EXPECT_GE(calls, 3);
}

// Rows with the lazy tool-call constraint speculate, verified under the mask: the same tokens
// as without speculation. A static bias (the node test's, same seeds) makes the model open
// calls; its biased text repeats, so prompt lookup drafts.
TEST_F(K3ToolChoiceTest, AutoSpeculationGivesTheSameTokens) {
  auto spec_model = OpenTiny({{"spec", "4"}});
  ASSERT_OK(spec_model.status());
  host::Sampling knobs;
  knobs.temperature = 1;
  for (int32_t id : Ids("call to")) knobs.logit_bias.push_back({id, 12.0f});
  knobs.logit_bias.push_back({Special("<|open|>"), 12.0f});
  const std::string user = "Weather in Paris?";
  double drafts = 0, accepted = 0;
  int calls = 0;
  for (uint64_t seed : {43, 150}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Output off = Chat("auto", AutoFormat(), false, knobs, seed, 300, {}, model_, user);
    std::map<std::string, double> stats;
    const Output on =
        Chat("auto", AutoFormat(), false, knobs, seed, 300, {}, spec_model->get(), user, &stats);
    EXPECT_EQ(on.ids, off.ids);
    EXPECT_EQ(on.calls, off.calls);
    for (const std::string& call : on.calls) {
      EXPECT_EQ(CallErrors(call, {"get_weather", "pick"}), "");
    }
    calls += static_cast<int>(on.calls.size());
    drafts += stats["spec_drafts"];
    accepted += stats["spec_accepted_tokens"];
    EXPECT_EQ(stats["spec_rewinds"], 0);
  }
  // A steered greedy call too (its per-step knobs re-create the sampler: buffered tokens the
  // new knobs do not draw are rewound, so only the tokens are compared).
  const Output off =
      Chat("auto", AutoFormat(), false, Knobs(0.0f), 0, 120, {{2, SteeredCall()}}, model_, user);
  const Output on = Chat("auto", AutoFormat(), false, Knobs(0.0f), 0, 120, {{2, SteeredCall()}},
                         spec_model->get(), user);
  EXPECT_EQ(on.ids, off.ids);
  EXPECT_GE(on.calls.size(), 1u);
  EXPECT_GE(calls, 1);
  EXPECT_GT(drafts, 0);
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace coli::k3
