// Anthropic's Messages API mapped onto the chat path (tools/coli/serve_messages.h): requests as
// Anthropic documents them become the chat body the model family renders; a finished choice
// becomes Anthropic's message, its deltas Anthropic's event sequence.
#include "tools/coli/serve_messages.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::cli::serve {
namespace {

using ::testing::HasSubstr;

Json Parse(const char* text) { return Json::parse(text); }
// Key order aside (Json keeps it; Anthropic's clients do not read it).
nlohmann::json Unordered(const Json& j) { return nlohmann::json::parse(j.dump()); }

MessagesRequest MapOk(const Json& body) {
  ApiError error;
  std::optional<MessagesRequest> r = ParseMessagesRequest(body, /*count_only=*/false, &error);
  EXPECT_TRUE(r.has_value()) << error.param << ": " << error.message;
  return r.value_or(MessagesRequest{});
}

ApiError MapFails(const Json& body, bool count_only = false) {
  ApiError error;
  EXPECT_FALSE(ParseMessagesRequest(body, count_only, &error).has_value()) << body.dump();
  return error;
}

TEST(MessagesRequestTest, ATurnWithToolsBecomesTheChatBody) {
  // The shape of Anthropic's tool-use documentation: a call and its result in the history.
  const MessagesRequest r = MapOk(Parse(R"({
    "model": "m", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief."}],
    "temperature": 0.5, "top_k": 5, "stop_sequences": ["a", "b", "c", "d", "e"],
    "tools": [{"name": "get_weather", "description": "Weather of a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "15C"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": true},
        {"type": "text", "text": "And tomorrow?"}]}]})"));
  const Json expected = Parse(R"({
    "model": "m", "max_tokens": 100,
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "Let me look.", "reasoning_content": "Use the tool.",
       "tool_calls": [{"id": "toolu_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "15C"},
      {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: down"},
      {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
      "description": "Weather of a city"}}],
    "tool_choice": "required", "parallel_tool_calls": false, "enable_thinking": false,
    "temperature": 0.5, "top_k": 5})");
  EXPECT_EQ(Unordered(r.chat), Unordered(expected));
  EXPECT_EQ(r.fields.max_tokens, 100);
  EXPECT_FLOAT_EQ(r.fields.temperature, 0.5f);
  EXPECT_EQ(r.fields.top_k, 5);
  // Anthropic takes more than OpenAI's four stop sequences.
  EXPECT_EQ(r.fields.stop, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
}

TEST(MessagesRequestTest, ALastAssistantMessageIsContinued) {
  const MessagesRequest r = MapOk(Parse(R"({"model": "m", "max_tokens": 10, "messages": [
      {"role": "user", "content": "JSON please"},
      {"role": "assistant", "content": [{"type": "text", "text": "{\"a\":"}]}]})"));
  EXPECT_EQ(r.chat["continue_final_message"], true);
  EXPECT_EQ(r.chat["messages"].back(), Parse(R"({"role": "assistant", "content": "{\"a\":"})"));
  EXPECT_FALSE(MapOk(Parse(R"({"model": "m", "max_tokens": 10, "messages": [
      {"role": "user", "content": "hi"}]})"))
                   .chat.contains("continue_final_message"));
}

TEST(MessagesRequestTest, OutputConfigBecomesResponseFormatAndEffort) {
  const Json schema = Parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  Json body = Parse(R"({"model": "m", "max_tokens": 10, "messages": [{"role": "user",
                        "content": "hi"}], "output_config": {"effort": "medium"}})");
  body["output_config"]["format"] = Json{{"type", "json_schema"}, {"schema", schema}};
  MessagesRequest r = MapOk(body);
  EXPECT_EQ(
      r.chat["response_format"],
      (Json{{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", schema}}}}));
  EXPECT_EQ(r.chat["reasoning_effort"], "high");
  body.erase("output_config");
  body["output_format"] = Json{{"type", "json_schema"}, {"schema", schema}};  // the older beta
  EXPECT_EQ(MapOk(body).chat["response_format"]["json_schema"]["schema"], schema);
  body.erase("output_format");
  body["output_config"] = Parse(R"({"format": {"type": "text"}})");
  EXPECT_EQ(MapFails(body).param, "output_config.format");
  body["output_config"] = Parse(R"({"effort": "extreme"})");
  EXPECT_EQ(MapFails(body).param, "output_config.effort");
}

TEST(MessagesRequestTest, PlainTextDocumentsAreText) {
  const MessagesRequest r = MapOk(Parse(R"({"model": "m", "max_tokens": 10, "messages": [
      {"role": "user", "content": [
        {"type": "document", "title": "Notes", "source": {"type": "text",
         "media_type": "text/plain", "data": "Line one."}},
        {"type": "document", "source": {"type": "content", "content": [
         {"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}},
        {"type": "text", "text": "Summarise."}]}]})"));
  EXPECT_EQ(r.chat["messages"][0]["content"],
            Parse(R"([{"type": "text", "text": "Notes\n\nLine one."},
                      {"type": "text", "text": "A\nB"},
                      {"type": "text", "text": "Summarise."}])"));
  const ApiError pdf = MapFails(Parse(R"({"model": "m", "max_tokens": 10, "messages": [
      {"role": "user", "content": [{"type": "document", "source": {"type": "base64",
       "media_type": "application/pdf", "data": "JVBE"}}]}]})"));
  EXPECT_EQ(pdf.param, "messages[0].content[0].source");
  EXPECT_EQ(MapFails(Parse(R"({"model": "m", "max_tokens": 10, "messages": [{"role": "user",
      "content": "hi"}], "mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]})"))
                .param,
            "mcp_servers");
}

TEST(MessagesRequestTest, ToolChoiceAndThinkingMap) {
  auto with = [](const char* extra) {
    Json body = Parse(R"({"model": "m", "max_tokens": 2000,
                          "messages": [{"role": "user", "content": "hi"}]})");
    body.update(Json::parse(extra));
    return MapOk(body).chat;
  };
  EXPECT_EQ(with(R"({"tool_choice": {"type": "auto"}})")["tool_choice"], "auto");
  EXPECT_EQ(with(R"({"tool_choice": {"type": "none"}})")["tool_choice"], "none");
  EXPECT_EQ(with(R"({"tool_choice": {"type": "tool", "name": "f"}})")["tool_choice"],
            Parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_FALSE(with(R"({"tool_choice": {"type": "auto"}})").contains("parallel_tool_calls"));
  EXPECT_EQ(with("{}")["enable_thinking"], false);  // absent: off, as in Anthropic's API
  EXPECT_EQ(with(R"({"thinking": {"type": "enabled", "budget_tokens": 1024}})")["enable_thinking"],
            true);
  // The budget picks K3's thinking effort; output_config.effort wins.
  EXPECT_EQ(with(R"({"thinking": {"type": "enabled", "budget_tokens": 1024}})")["reasoning_effort"],
            "low");
  EXPECT_EQ(with(R"({"max_tokens": 64000, "thinking": {"type": "enabled", "budget_tokens": 8000}})")
                ["reasoning_effort"],
            "high");
  EXPECT_EQ(
      with(R"({"max_tokens": 64000, "thinking": {"type": "enabled", "budget_tokens": 32000}})")
          ["reasoning_effort"],
      "max");
  EXPECT_EQ(with(R"({"thinking": {"type": "enabled", "budget_tokens": 1024},
                     "output_config": {"effort": "max"}})")["reasoning_effort"],
            "max");
  EXPECT_FALSE(with(R"({"thinking": {"type": "adaptive"}})").contains("reasoning_effort"));
  EXPECT_EQ(with(R"({"thinking": {"type": "adaptive"}})")["enable_thinking"], true);
  EXPECT_EQ(with(R"({"thinking": {"type": "disabled"}})")["enable_thinking"], false);
}

TEST(MessagesRequestTest, BadRequestsNameTheField) {
  const Json base = Parse(R"({"model": "m", "max_tokens": 10,
                              "messages": [{"role": "user", "content": "hi"}]})");
  auto fails = [&](const char* patch, bool count_only = false) {
    Json body = base;
    body.merge_patch(Json::parse(patch));
    return MapFails(body, count_only);
  };
  EXPECT_EQ(fails(R"({"max_tokens": null})").param, "max_tokens");
  EXPECT_EQ(fails(R"({"max_tokens": 0})").param, "max_tokens");
  EXPECT_EQ(fails(R"({"messages": []})").param, "messages");
  EXPECT_EQ(fails(R"({"messages": [{"role": "system", "content": "x"}]})").param,
            "messages[0].role");
  const ApiError image = fails(R"({"messages": [{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]})");
  EXPECT_EQ(image.param, "messages[0].content[0]");
  EXPECT_THAT(image.message, HasSubstr("'image'"));
  const ApiError spaced = fails(R"({"messages": [{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "So "}]})");
  EXPECT_EQ(spaced.param, "messages[1].content");
  EXPECT_THAT(spaced.message, HasSubstr("trailing whitespace"));
  EXPECT_EQ(fails(R"({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024},
                      "messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "{"}]})")
                .param,
            "thinking");
  EXPECT_EQ(fails(R"({"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": [{"type": "tool_use",
                                    "id": "t", "name": "f", "input": {}}]}]})")
                .param,
            "messages[1].content[0]");
  EXPECT_EQ(fails(R"({"temperature": 1.5})").param, "temperature");
  EXPECT_EQ(fails(R"({"top_k": -1})").param, "top_k");
  EXPECT_EQ(fails(R"({"stop_sequences": ["", "x"]})").param, "stop_sequences[0]");
  EXPECT_EQ(fails(R"({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})").param,
            "tools[0].type");
  EXPECT_EQ(fails(R"({"tools": [{"name": "f"}]})").param, "tools[0].input_schema");
  EXPECT_EQ(fails(R"({"tool_choice": {"type": "required"}})").param, "tool_choice");
  EXPECT_EQ(fails(R"({"thinking": {"type": "enabled", "budget_tokens": 100}})").param,
            "thinking.budget_tokens");
  EXPECT_EQ(fails(R"({"max_tokens": 2000, "thinking": {"type": "enabled",
                      "budget_tokens": 2000}})")
                .param,
            "thinking.budget_tokens");
  EXPECT_EQ(fails(R"({"system": [{"type": "image"}]})").param, "system[0]");
  // count_tokens needs no max_tokens, but the rest is checked the same.
  Json no_max = base;
  no_max.erase("max_tokens");
  ApiError error;
  EXPECT_TRUE(ParseMessagesRequest(no_max, /*count_only=*/true, &error).has_value());
  EXPECT_EQ(fails(R"({"max_tokens": null, "messages": 3})", true).param, "messages");
}

TEST(MessagesErrorTest, AnthropicsErrorObject) {
  ApiError e = BadField("max_tokens", "max_tokens is required");
  EXPECT_EQ(AnthropicError(e), Parse(R"({"type": "error", "error": {
      "type": "invalid_request_error", "message": "max_tokens is required"}})"));
  e = BadField("messages[0].role", "bad role");
  EXPECT_EQ(AnthropicError(e)["error"]["message"], "messages[0].role: bad role");
  e.http_status = 404;
  EXPECT_EQ(AnthropicError(e)["error"]["type"], "not_found_error");
  const std::string openai =
      R"({"error": {"message": "invalid API key", "type": "authentication_error",
          "param": null, "code": "invalid_api_key"}})";
  EXPECT_EQ(Json::parse(AnthropicErrorBody(401, openai)),
            Parse(R"({"type": "error", "error": {"type": "authentication_error",
                                                 "message": "invalid API key"}})"));
  EXPECT_EQ(Json::parse(AnthropicErrorBody(503, openai))["error"]["type"], "overloaded_error");
  EXPECT_EQ(Json::parse(AnthropicErrorBody(429, openai))["error"]["type"], "rate_limit_error");
  EXPECT_EQ(AnthropicErrorBody(500, "not json"), "not json");
}

ChoiceResult Result(const char* finish) {
  ChoiceResult r;
  r.finish_reason = finish;
  r.prompt_tokens = 30;
  r.cached_tokens = 10;
  r.completion_tokens = 7;
  return r;
}

TEST(MessageTest, FinishedChoiceBecomesTheMessage) {
  ChoiceResult r = Result("tool_calls");
  r.reasoning = "think";
  r.content = "Looking.";
  r.tool_calls = Parse(R"([{"index": 0, "id": "call_abc", "type": "function",
                           "function": {"name": "f", "arguments": "{\"x\":1}"}}])");
  EXPECT_EQ(Unordered(MessageFromResult("msg_1", "kimi", r)), Unordered(Parse(R"({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "kimi",
    "content": [{"type": "thinking", "thinking": "think", "signature": ""},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"x": 1}}],
    "stop_reason": "tool_use", "stop_sequence": null,
    "usage": {"input_tokens": 20, "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": 10, "output_tokens": 7}})")));
  ChoiceResult stopped = Result("stop");
  stopped.content = "one";
  stopped.stop_sequence = "two";
  const Json m = MessageFromResult("msg_2", "kimi", stopped);
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "two");
  EXPECT_EQ(StopReason(Result("length")), "max_tokens");
  ChoiceResult full = Result("length");
  full.context_full = true;
  EXPECT_EQ(StopReason(full), "model_context_window_exceeded");
  EXPECT_EQ(StopReason(Result("stop")), "end_turn");
  // An empty reply still has its text block (clients read content[0].text).
  EXPECT_EQ(MessageFromResult("m", "k", Result("stop"))["content"],
            Parse(R"([{"type": "text", "text": ""}])"));
}

TEST(MessageStreamTest, DeltasBecomeAnthropicsEventSequence) {
  std::vector<Json> events;
  MessageStream s("msg_1", "kimi", [&](const Json& e) {
    events.push_back(e);
    return true;
  });
  ASSERT_TRUE(s.Start(30, 10));
  ASSERT_TRUE(s.Delta("reasoning", "hm"));
  ASSERT_TRUE(s.Delta("tick", nullptr));
  ASSERT_TRUE(s.Delta("content", "Hi"));
  ASSERT_TRUE(s.Delta("content", "!"));
  // A call the host streams, then a whole one.
  ASSERT_TRUE(s.Delta("tool_call_delta", Parse(R"({"index": 0, "id": "call_a", "type": "function",
                                                   "function": {"name": "f", "arguments": ""}})")));
  ASSERT_TRUE(
      s.Delta("tool_call_delta", Parse(R"({"index": 0, "function": {"arguments": "{\"x\""}})")));
  ASSERT_TRUE(
      s.Delta("tool_call_delta", Parse(R"({"index": 0, "function": {"arguments": ":1}"}})")));
  ASSERT_TRUE(s.Delta("tool_call_done", Parse(R"({"index": 0, "id": "call_a"})")));
  ASSERT_TRUE(s.Delta("tool_call", Parse(R"({"index": 1, "id": "call_b", "type": "function",
                                             "function": {"name": "g", "arguments": "{}"}})")));
  ASSERT_TRUE(s.Finish(Result("tool_calls")));
  std::vector<std::string> lines;
  for (const Json& e : events) lines.push_back(e.dump());
  const std::vector<std::string> expected = {
      R"({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"kimi","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":0}}})",
      R"({"type":"ping"})",
      R"({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}})",
      R"({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}})",
      R"({"type":"content_block_stop","index":0})",
      R"({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}})",
      R"({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}})",
      R"({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"!"}})",
      R"({"type":"content_block_stop","index":1})",
      R"({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_a","name":"f","input":{}}})",
      R"({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"x\""}})",
      R"({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":":1}"}})",
      R"({"type":"content_block_stop","index":2})",
      R"({"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_b","name":"g","input":{}}})",
      R"({"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{}"}})",
      R"({"type":"content_block_stop","index":3})",
      R"({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":7}})",
      R"({"type":"message_stop"})",
  };
  EXPECT_EQ(lines, expected);
}

TEST(MessageStreamTest, AGoneClientEndsTheStream) {
  int sent = 0;
  MessageStream s("m", "k", [&](const Json&) { return ++sent < 3; });
  EXPECT_TRUE(s.Start(1, 0));             // message_start, ping
  EXPECT_FALSE(s.Delta("content", "x"));  // content_block_start fails
}

TEST(StopFilterTest, NamesTheSequenceThatMatched) {
  StopFilter f({"END", "ND", "x"});
  EXPECT_EQ(f.Push("abcE"), "abc");
  EXPECT_EQ(f.matched(), "");
  EXPECT_EQ(f.Push("ND"), "");
  EXPECT_EQ(f.matched(), "END");  // the earliest in the text
}

}  // namespace
}  // namespace coli::cli::serve
