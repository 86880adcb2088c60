// The Responses API mapping of `coli serve` (tools/coli/serve_responses.h): requests against
// hand-written chat-completions bodies, errors naming the Responses field, the event sequence
// against the order OpenAI's SDK accumulator expects, and the bounded store.
#include "tools/coli/serve_responses.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace coli::cli::serve {
namespace {

Json J(const char* text) { return Json::parse(text); }

// Compares JSON values ignoring object key order (ordered_json's == does not).
nlohmann::json U(const Json& j) { return nlohmann::json::parse(j.dump()); }
#define EXPECT_JSON_EQ(a, b) EXPECT_EQ(U(a), U(b))

ResponsesRequest Parse(const Json& body, const ResponseStore* store = nullptr) {
  ApiError error;
  std::optional<ResponsesRequest> r = ParseResponsesRequest(body, store, &error);
  EXPECT_TRUE(r.has_value()) << error.param << ": " << error.message;
  return r ? *r : ResponsesRequest{};
}

ApiError Refused(const Json& body, const ResponseStore* store = nullptr) {
  ApiError error;
  std::optional<ResponsesRequest> r = ParseResponsesRequest(body, store, &error);
  EXPECT_FALSE(r.has_value()) << body.dump();
  EXPECT_EQ(error.http_status, 400);
  return error;
}

TEST(ResponsesRequest, StringInputIsOneUserMessage) {
  ResponsesRequest r = Parse(J(R"({"model": "m", "input": "Hi", "temperature": 0,
                                   "max_output_tokens": 7})"));
  EXPECT_JSON_EQ(r.chat["messages"], J(R"([{"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(r.chat["max_completion_tokens"], 7);
  EXPECT_EQ(r.fields.max_tokens, 7);
  EXPECT_EQ(r.fields.temperature, 0.0f);
  EXPECT_EQ(r.fields.model, "m");
  EXPECT_FALSE(r.fields.stream);
  EXPECT_TRUE(r.store);
  EXPECT_EQ(r.conversation, r.chat["messages"]);
}

TEST(ResponsesRequest, InstructionsComeFirstAndPartsBecomeTextParts) {
  ResponsesRequest r = Parse(J(R"({
    "instructions": "Be brief.",
    "input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "a"},
                                        {"type": "input_text", "text": "b"}]},
      {"type": "message", "role": "user", "content": "q"},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
      {"role": "system", "content": "s"}]})"));
  EXPECT_JSON_EQ(r.chat["messages"], J(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    {"role": "system", "content": "s"}])"));
  // The conversation a follow-up continues holds no instructions.
  EXPECT_EQ(r.conversation.size(), 4u);
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
}

TEST(ResponsesRequest, FunctionCallItemsJoinOneAssistantTurnWithItsReasoning) {
  ResponsesRequest r = Parse(J(R"({"input": [
    {"role": "user", "content": "weather?"},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "I should "},
                 {"type": "reasoning_text", "text": "call it."}]},
    {"type": "function_call", "call_id": "call_a", "name": "get_weather",
     "arguments": "{\"city\":\"Paris\"}", "id": "fc_1", "status": "completed"},
    {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_a", "output": "{\"temp_c\": 21}"},
    {"type": "function_call_output", "call_id": "call_b",
     "output": [{"type": "input_text", "text": "noon"}]}]})"));
  EXPECT_JSON_EQ(r.chat["messages"], J(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "reasoning_content": "I should call it.",
     "tool_calls": [
       {"id": "call_a", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
       {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp_c\": 21}"},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "noon"}]}])"));
}

TEST(ResponsesRequest, AssistantTextThenFunctionCallIsOneTurn) {
  ResponsesRequest r = Parse(J(R"({"input": [
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "Let me look."},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "done"},
    {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"}]})"));
  EXPECT_JSON_EQ(r.chat["messages"], J(R"([
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "Let me look.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "done"},
    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}])"));
}

TEST(ResponsesRequest, ToolsToolChoiceFormatAndEffortMapToTheChatFields) {
  ResponsesRequest r = Parse(J(R"({"input": "x",
    "tools": [{"type": "function", "name": "f", "description": "d",
               "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
    "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"},
                        "strict": true}},
    "reasoning": {"effort": "low", "summary": "auto"},
    "seed": 5, "top_p": 0.5, "metadata": {"k": "v"}, "user": "u1", "store": false,
    "stream": true})"));
  EXPECT_JSON_EQ(r.chat["tools"], J(R"([{"type": "function", "function": {"name": "f",
      "description": "d", "parameters": {"type": "object"}, "strict": true}}])"));
  EXPECT_JSON_EQ(r.chat["tool_choice"], J(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(r.chat["parallel_tool_calls"], false);
  EXPECT_JSON_EQ(r.chat["response_format"], J(R"({"type": "json_schema", "json_schema":
      {"name": "s", "schema": {"type": "object"}, "strict": true}})"));
  EXPECT_EQ(r.chat["reasoning_effort"], "low");
  EXPECT_TRUE(r.fields.has_seed);
  EXPECT_EQ(r.fields.seed, 5u);
  EXPECT_FLOAT_EQ(r.fields.top_p, 0.5f);
  EXPECT_TRUE(r.fields.stream);
  EXPECT_FALSE(r.store);
  // The response object repeats the request's own (Responses-shaped) fields.
  Json o = NewResponseObject(r, "kimi", 123);
  EXPECT_EQ(o["object"], "response");
  EXPECT_EQ(o["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(o["created_at"], 123);
  EXPECT_EQ(o["status"], "in_progress");
  EXPECT_EQ(o["model"], "kimi");
  EXPECT_EQ(o["tools"][0]["name"], "f");
  EXPECT_EQ(o["tool_choice"]["name"], "f");
  EXPECT_EQ(o["text"]["format"]["name"], "s");
  EXPECT_JSON_EQ(o["reasoning"], J(R"({"effort": "low", "summary": "auto"})"));
  EXPECT_JSON_EQ(o["metadata"], J(R"({"k": "v"})"));
  EXPECT_EQ(o["user"], "u1");
  EXPECT_EQ(o["store"], false);
  EXPECT_EQ(o["parallel_tool_calls"], false);
  EXPECT_EQ(o["top_p"], 0.5);
  EXPECT_EQ(o["temperature"], 1.0);
  EXPECT_JSON_EQ(o["output"], Json::array());
  EXPECT_FALSE(o.contains("output_text"));  // the SDK computes it
}

TEST(ResponsesRequest, TextAndJsonObjectFormats) {
  EXPECT_JSON_EQ(Parse(J(R"({"input": "x", "text": {"format": {"type": "json_object"}}})"))
                     .chat["response_format"],
                 J(R"({"type": "json_object"})"));
  EXPECT_JSON_EQ(
      Parse(J(R"({"input": "x", "text": {"format": {"type": "text"}}})")).chat["response_format"],
      J(R"({"type": "text"})"));
}

TEST(ResponsesRequest, RefusalsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"input": "x", "frobnicate": 1})", "frobnicate"},
      {R"({"input": "x", "conversation": "c"})", "conversation"},
      {R"({"input": "x", "background": "yes"})", "background"},
      {R"({"input": "x", "background": true, "store": false})", "background"},
      {R"({"input": "x", "include": ["reasoning.encrypted_content"]})", "include"},
      {R"({"input": "x", "include": "message.output_text.logprobs"})", "include"},
      {R"({"input": "x", "include": [7]})", "include"},
      {R"({"input": "x", "truncation": "auto"})", "truncation"},
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [{"type": "image_generation_call", "id": "x"}]})", "input[0].type"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"role": "user"}]})", "input[0].content"},
      {R"({"input": [{"role": "user", "content": "a"}, {"role": "user", "content":
          [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "u"}]}]})",
       "input[1].content[1].type"},
      {R"({"input": [{"role": "user", "content": "a", "name": "n"}]})", "input[0].name"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
       "input[0].call_id"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c"}]})", "input[0].output"},
      {R"({"input": [{"role": "user", "content": "a"}, {"type": "reasoning", "summary": []}]})",
       "input[1]"},
      {R"({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"},
                     {"role": "assistant", "content": "a"}]})",
       "input[0].encrypted_content"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name"},
      {R"({"input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice"},
      {R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type"},
      {R"({"input": "x", "text": {"verbosity": "low"}})", "text.verbosity"},
      {R"({"input": "x", "reasoning": {"summary": "detailed"}})", "reasoning.summary"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"input": "x", "temperature": 3})", "temperature"},
      {R"({"input": "x", "stream": "yes"})", "stream"},
      {R"({"input": "x", "metadata": {"k": 1}})", "metadata.k"},
      {R"({"input": "x", "store": "no"})", "store"},
      {R"({"input": "x", "top_logprobs": 21})", "top_logprobs"},
      {R"({"input": "x", "top_logprobs": -1})", "top_logprobs"},
      {R"({"input": "x", "top_logprobs": 1.5})", "top_logprobs"},
      {R"({"input": "x", "top_logprobs": "3"})", "top_logprobs"},
      {R"({"input": "x", "top_logprobs": true})", "top_logprobs"},
  };
  for (const Case& c : cases) {
    ApiError e = Refused(J(c.body));
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  // A chat-path message restated in this API's terms.
  ApiError e = Refused(J(R"({"input": "x", "max_output_tokens": 0})"));
  EXPECT_NE(e.message.find("max_output_tokens"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("max_completion_tokens"), std::string::npos) << e.message;
}

TEST(ResponsesRequest, HostErrorsAreRestatedForTheInputItems) {
  ResponsesRequest r = Parse(J(R"({"instructions": "sys", "input": [
    {"role": "user", "content": "u"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"},
    {"type": "function_call_output", "call_id": "c1", "output": "o"}]})"));
  auto restated = [&](const std::string& param) {
    ApiError e = BadField(param, "render_chat: " + param + ": bad");
    return ToResponsesError(e, r);
  };
  EXPECT_EQ(restated("messages[1].role").param, "input[0].role");
  EXPECT_EQ(restated("messages[2].tool_calls[0].function.arguments").param, "input[1].arguments");
  EXPECT_EQ(restated("messages[3].content").param, "input[2].output");
  EXPECT_EQ(restated("messages[0].content").param, "instructions");
  EXPECT_EQ(restated("messages").param, "input");
  EXPECT_EQ(restated("response_format.type").param, "text.format.type");
  EXPECT_EQ(restated("reasoning_effort").param, "reasoning.effort");
  EXPECT_EQ(restated("tools[1].function.parameters").param, "tools[1].parameters");
  EXPECT_EQ(restated("messages[2].tool_calls[0].function.arguments").message,
            "render_chat: input[1].arguments: bad");
}

TEST(ResponsesRequest, PreviousResponseContinuesItsConversation) {
  ResponseStore store;
  store.Put("resp_1", J(R"({"id": "resp_1"})"),
            J(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])"));
  ResponsesRequest r = Parse(
      J(R"({"previous_response_id": "resp_1", "instructions": "sys", "input": "c"})"), &store);
  EXPECT_JSON_EQ(r.chat["messages"], J(R"([{"role": "system", "content": "sys"},
      {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}])"));
  EXPECT_EQ(r.conversation.size(), 3u);
  EXPECT_EQ(NewResponseObject(r, "m", 0)["previous_response_id"], "resp_1");
  // Error paths after the stored part still point at this request's items.
  EXPECT_EQ(ToResponsesError(BadField("messages[3].content", "x"), r).param, "input");
  EXPECT_EQ(ToResponsesError(BadField("messages[1].content", "x"), r).param,
            "previous_response_id");

  ApiError e = Refused(J(R"({"previous_response_id": "resp_2", "input": "c"})"), &store);
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_EQ(e.code, "previous_response_not_found");
  EXPECT_JSON_EQ(Refused(J(R"({"previous_response_id": "resp_1", "input": "c"})"), nullptr).param,
                 "previous_response_id");
}

// The Vercel AI SDK's Responses provider sends stored reasoning and messages back as
// {"type": "item_reference", "id": ...} (store is on by default): each becomes the stored item.
TEST(ResponsesRequest, ItemReferencesBecomeTheStoredItems) {
  ResponseStore store;
  store.Put("resp_1", J(R"({"id": "resp_1", "output": [
      {"id": "rs_1", "type": "reasoning", "summary": [], "status": "completed",
       "content": [{"type": "reasoning_text", "text": "Think."}]},
      {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
       "name": "f", "arguments": "{}"}]})"),
            Json::array(), J(R"([{"id": "msg_in", "type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": "q"}]}])"));
  store.Put("resp_2", J(R"({"id": "resp_2", "output": [
      {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
       "content": [{"type": "output_text", "text": "Done.", "annotations": [], "logprobs": []}]}]})"),
            Json::array());
  ResponsesRequest r = Parse(J(R"({"input": [
    {"type": "item_reference", "id": "msg_in"},
    {"type": "item_reference", "id": "rs_1"},
    {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
    {"type": "item_reference", "id": "msg_2"},
    {"role": "user", "content": "again"}]})"),
                             &store);
  EXPECT_JSON_EQ(r.chat["messages"], J(R"([
    {"role": "user", "content": [{"type": "text", "text": "q"}]},
    {"role": "assistant", "content": null, "reasoning_content": "Think.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
    {"role": "user", "content": "again"}])"));
  // GET .../input_items lists the items themselves, not the references.
  ASSERT_EQ(r.input_items.size(), 6u);
  EXPECT_EQ(r.input_items[1]["type"], "reasoning");
  EXPECT_EQ(r.input_items[4]["id"], "msg_2");

  ApiError e = Refused(J(R"({"input": [{"type": "item_reference", "id": "rs_gone"}]})"), &store);
  EXPECT_EQ(e.param, "input[0].id");
  EXPECT_NE(e.message.find("rs_gone"), std::string::npos) << e.message;
  EXPECT_EQ(Refused(J(R"({"input": [{"type": "item_reference", "id": "rs_1"}]})"), nullptr).param,
            "input[0].id");
  EXPECT_EQ(Refused(J(R"({"input": [{"type": "item_reference"}]})"), &store).param, "input[0].id");
  EXPECT_EQ(Refused(J(R"({"input": [{"type": "item_reference", "id": 7}]})"), &store).param,
            "input[0].id");
  EXPECT_EQ(
      Refused(J(R"({"input": [{"type": "item_reference", "id": "rs_1", "x": 1}]})"), &store).param,
      "input[0].x");
}

TEST(ResponsesRequest, LogprobsMapToTheChatFields) {
  // OpenAI's switch: include message.output_text.logprobs; top_logprobs sets the alternatives.
  ResponsesRequest r =
      Parse(J(R"({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 4})"));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.chat["logprobs"], true);
  EXPECT_EQ(r.chat["top_logprobs"], 4);
  EXPECT_EQ(r.fields.top_logprobs, 4);
  Json object = NewResponseObject(r, "m", 0);
  EXPECT_EQ(object["top_logprobs"], 4);
  EXPECT_EQ(object["background"], false);
  // include alone: the sampled token's logprob, no alternatives.
  r = Parse(J(R"({"input": "x", "include": ["message.output_text.logprobs"]})"));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.fields.top_logprobs, 0);
  EXPECT_TRUE(NewResponseObject(r, "m", 0)["top_logprobs"].is_null());
  // top_logprobs > 0 alone asks for them too; 0 alone (or an empty include) does not.
  r = Parse(J(R"({"input": "x", "top_logprobs": 20})"));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.fields.top_logprobs, 20);
  for (const char* body : {R"({"input": "x", "top_logprobs": 0})", R"({"input": "x"})",
                           R"({"input": "x", "include": []})"}) {
    r = Parse(J(body));
    EXPECT_FALSE(r.logprobs) << body;
    EXPECT_EQ(r.fields.top_logprobs, -1) << body;
    EXPECT_FALSE(r.chat.contains("logprobs")) << body;
  }
}

TEST(ResponsesRequest, BackgroundIsStoredAndMayStream) {
  ResponsesRequest r = Parse(J(R"({"input": "x", "background": true})"));
  EXPECT_TRUE(r.background);
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.fields.stream);
  EXPECT_EQ(NewResponseObject(r, "m", 0)["background"], true);
  r = Parse(J(R"({"input": "x", "background": true, "stream": true})"));
  EXPECT_TRUE(r.background);
  EXPECT_TRUE(r.fields.stream);
  EXPECT_FALSE(Parse(J(R"({"input": "x", "background": false, "stream": true})")).background);
  // A response that has not finished (or was cancelled) cannot be continued.
  ResponseStore store;
  store.Put("resp_q", J(R"({"id": "resp_q", "status": "in_progress"})"), nullptr);
  ApiError e = Refused(J(R"({"previous_response_id": "resp_q", "input": "c"})"), &store);
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_NE(e.message.find("in_progress"), std::string::npos) << e.message;
}

TEST(InputItems, EveryItemGetsAnIdAStatusAndPartsAsTheApiListsThem) {
  Json one = InputItemsOf(Json("Hi"));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["id"].get<std::string>().rfind("msg_", 0), 0u);
  one[0].erase("id");
  EXPECT_JSON_EQ(one, J(R"([{"type": "message", "role": "user", "status": "completed",
                             "content": [{"type": "input_text", "text": "Hi"}]}])"));

  Json items = InputItemsOf(J(R"([
    {"role": "user", "content": "q"},
    {"type": "message", "role": "assistant", "id": "msg_given", "content": "a"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": null},
    {"type": "function_call_output", "call_id": "c1", "output": "o", "status": "incomplete"}])"));
  ASSERT_EQ(items.size(), 5u);
  const char* prefixes[] = {"msg_", "msg_given", "rs_", "fc_", "fco_"};
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i]["id"].get<std::string>().rfind(prefixes[i], 0), 0u) << items[i].dump();
    items[i].erase("id");
  }
  EXPECT_JSON_EQ(items, J(R"([
    {"type": "message", "role": "user", "status": "completed",
     "content": [{"type": "input_text", "text": "q"}]},
    {"type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "a", "annotations": []}]},
    {"type": "reasoning", "summary": [], "status": "completed",
     "content": [{"type": "reasoning_text", "text": "r"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}",
     "status": "completed"},
    {"type": "function_call_output", "call_id": "c1", "output": "o", "status": "incomplete"}])"));
  // The request keeps them for the store.
  EXPECT_EQ(Parse(J(R"({"input": [{"role": "user", "content": "q", "id": "msg_7"}]})"))
                .input_items[0]["id"],
            "msg_7");
}

std::vector<std::string> Ids(const Json& page) {
  std::vector<std::string> ids;
  for (const Json& item : page["data"]) ids.push_back(item["id"].get<std::string>());
  return ids;
}

TEST(InputItems, PagesInEitherOrderAfterACursor) {
  Json items = Json::array();
  for (const char* id : {"a", "b", "c", "d", "e"}) items.push_back(Json{{"id", id}});
  ApiError error;
  // The default: newest first, 20 at most.
  std::optional<Json> page = ListInputItems(items, "", "", "", &error);
  ASSERT_TRUE(page.has_value());
  EXPECT_EQ(Ids(*page), (std::vector<std::string>{"e", "d", "c", "b", "a"}));
  EXPECT_EQ((*page)["object"], "list");
  EXPECT_EQ((*page)["first_id"], "e");
  EXPECT_EQ((*page)["last_id"], "a");
  EXPECT_EQ((*page)["has_more"], false);
  // Walking asc pages of 2 with `after` = the last id: every item once, has_more until the end.
  std::vector<std::string> walked;
  std::string after;
  for (int i = 0; i < 3; ++i) {
    page = ListInputItems(items, "2", "asc", after, &error);
    ASSERT_TRUE(page.has_value()) << error.message;
    for (const std::string& id : Ids(*page)) walked.push_back(id);
    EXPECT_EQ((*page)["has_more"], i < 2) << i;
    after = (*page)["last_id"].get<std::string>();
  }
  EXPECT_EQ(walked, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  page = ListInputItems(items, "3", "desc", "d", &error);
  ASSERT_TRUE(page.has_value());
  EXPECT_EQ(Ids(*page), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ((*page)["has_more"], false);
  page = ListInputItems(items, "", "desc", "a", &error);  // after the last: an empty page
  ASSERT_TRUE(page.has_value());
  EXPECT_TRUE((*page)["data"].empty());
  EXPECT_TRUE((*page)["first_id"].is_null());
  EXPECT_EQ((*page)["has_more"], false);

  struct Bad {
    const char *limit, *order, *after, *param;
  };
  for (const Bad& b :
       {Bad{"0", "", "", "limit"}, Bad{"101", "", "", "limit"}, Bad{"x", "", "", "limit"},
        Bad{"-1", "", "", "limit"}, Bad{"99999999999", "", "", "limit"}, Bad{"", "up", "", "order"},
        Bad{"", "", "zz", "after"}}) {
    ApiError e;
    EXPECT_FALSE(ListInputItems(items, b.limit, b.order, b.after, &e).has_value()) << b.param;
    EXPECT_EQ(e.param, b.param);
    EXPECT_EQ(e.http_status, 400);
  }
}

// Every value of a rich request replaced by every JSON type: a refusal or a mapping, never an
// exception (nlohmann throws on a wrong-typed get) or a crash.
void Replace(const Json& node, Json& root, Json& at, int* calls) {
  static const Json kValues[] = {nullptr,          Json(1),        Json(-1),
                                 Json(1.5),        Json("s"),      Json(true),
                                 Json::array(),    Json::object(), Json::array({1, "x"}),
                                 Json{{"type", 1}}};
  for (const Json& v : kValues) {
    Json saved = at;
    at = v;
    ApiError error;
    EXPECT_NO_THROW(ParseResponsesRequest(root, nullptr, &error)) << root.dump();
    ++*calls;
    at = saved;
  }
  if (node.is_object()) {
    for (auto it = at.begin(); it != at.end(); ++it) Replace(node[it.key()], root, *it, calls);
  } else if (node.is_array()) {
    for (size_t i = 0; i < at.size(); ++i) Replace(node[i], root, at[i], calls);
  }
}

TEST(ResponsesRequest, WrongTypesAnywhereAreRefusedNotThrown) {
  const Json body = J(R"({"model": "m", "instructions": "i", "max_output_tokens": 5,
    "temperature": 0.5, "top_p": 0.9, "seed": 1, "store": true, "stream": false,
    "metadata": {"k": "v"}, "user": "u", "parallel_tool_calls": true,
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {}}],
    "tool_choice": {"type": "function", "name": "f"},
    "stream_options": {"include_obfuscation": false},
    "include": ["message.output_text.logprobs"], "top_logprobs": 2, "background": false,
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]},
              {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}],
               "content": [{"type": "reasoning_text", "text": "r"}]},
              {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c",
               "output": [{"type": "input_text", "text": "o"}]}]})");
  Parse(body);  // the unmodified body maps
  Json root = body;
  int calls = 0;
  Replace(body, root, root, &calls);
  EXPECT_GT(calls, 500);
}

TEST(ResponseStore, EvictsTheOldestByCountAndBytes) {
  ResponseStore store(2, 1 << 20);
  for (const char* id : {"a", "b", "c"}) store.Put(id, Json{{"id", id}}, Json::array());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.Response("a").has_value());
  EXPECT_EQ((*store.Response("c"))["id"], "c");
  EXPECT_TRUE(store.Erase("b"));
  EXPECT_FALSE(store.Erase("b"));
  EXPECT_FALSE(store.Conversation("b").has_value());
  // Input items are kept beside the response; a null conversation (a background response
  // that has not finished) is not one a follow-up can continue.
  store.Put("d", Json{{"id", "d"}}, nullptr, J(R"([{"id": "msg_1"}])"));
  EXPECT_TRUE(store.Response("d").has_value());
  EXPECT_FALSE(store.Conversation("d").has_value());
  EXPECT_JSON_EQ(*store.InputItems("d"), J(R"([{"id": "msg_1"}])"));
  EXPECT_FALSE(store.InputItems("a").has_value());

  ResponseStore small(100, 200);
  const std::string big(150, 'x');
  small.Put("x", Json{{"t", big}}, Json::array());
  small.Put("y", Json{{"t", big}}, Json::array());  // over 200 bytes together: x goes
  EXPECT_FALSE(small.Response("x").has_value());
  EXPECT_TRUE(small.Response("y").has_value());
}

struct Recorder {
  std::vector<Json> events;
  ResponseBuilder::Sink Sink() {
    ResponseBuilder::Sink s;
    s.send = [this](const Json& e) {
      events.push_back(e);
      return true;
    };
    s.alive = [] { return true; };
    return s;
  }
  std::vector<std::string> Types() const {
    std::vector<std::string> t;
    for (const Json& e : events) t.push_back(e["type"].get<std::string>());
    return t;
  }
};

Json Skeleton() { return NewResponseObject(Parse(J(R"({"input": "x"})")), "m", 1); }

Json ToolCall(const char* id, const char* name, const char* args) {
  return Json{{"index", 0},
              {"id", id},
              {"type", "function"},
              {"function", {{"name", name}, {"arguments", args}}}};
}

TEST(ResponseBuilder, StreamsItemsInTheOrderTheSdkAccumulates) {
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("reasoning", "th"));
  ASSERT_TRUE(b.Delta("reasoning", "ink"));
  ASSERT_TRUE(b.Delta("tick", nullptr));
  ASSERT_TRUE(b.Delta("content", "Hel"));
  ASSERT_TRUE(b.Delta("content", "lo"));
  ASSERT_TRUE(b.Delta("tool_call", ToolCall("call_1", "f", "{\"a\":1}")));
  ASSERT_TRUE(b.Finish({"tool_calls", 10, 7, 3, 4}));
  const std::vector<std::string> want = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
  };
  EXPECT_EQ(rec.Types(), want);
  for (size_t i = 0; i < rec.events.size(); ++i) {
    EXPECT_EQ(rec.events[i]["sequence_number"], static_cast<int64_t>(i));
  }
  EXPECT_EQ(rec.events[0]["response"]["status"], "in_progress");
  EXPECT_JSON_EQ(rec.events[0]["response"]["output"], Json::array());
  // Indices and ids tie each delta to its item.
  EXPECT_EQ(rec.events[4]["output_index"], 0);
  EXPECT_EQ(rec.events[4]["item_id"], rec.events[2]["item"]["id"]);
  EXPECT_EQ(rec.events[6]["text"], "think");
  EXPECT_EQ(rec.events[11]["output_index"], 1);
  EXPECT_EQ(rec.events[11]["content_index"], 0);
  EXPECT_EQ(rec.events[11]["delta"], "Hel");
  EXPECT_EQ(rec.events[13]["text"], "Hello");
  EXPECT_EQ(rec.events[16]["item"]["arguments"], "");
  EXPECT_EQ(rec.events[18]["arguments"], "{\"a\":1}");
  EXPECT_EQ(rec.events[18]["name"], "f");

  const Json& r = b.response();
  EXPECT_EQ(rec.events.back()["response"], r);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["incomplete_details"], nullptr);
  ASSERT_EQ(r["output"].size(), 3u);
  Json reasoning = J(R"({"type": "reasoning", "summary": [], "status": "completed",
      "content": [{"type": "reasoning_text", "text": "think"}]})");
  reasoning["id"] = r["output"][0]["id"];
  EXPECT_JSON_EQ(r["output"][0], reasoning);
  EXPECT_EQ(r["output"][0]["id"].get<std::string>().rfind("rs_", 0), 0u);
  EXPECT_EQ(r["output"][1]["type"], "message");
  EXPECT_EQ(r["output"][1]["role"], "assistant");
  EXPECT_EQ(r["output"][1]["status"], "completed");
  EXPECT_JSON_EQ(r["output"][1]["content"], J(R"([{"type": "output_text", "annotations": [],
      "logprobs": [], "text": "Hello"}])"));
  EXPECT_EQ(r["output"][2]["type"], "function_call");
  EXPECT_EQ(r["output"][2]["call_id"], "call_1");
  EXPECT_EQ(r["output"][2]["name"], "f");
  EXPECT_EQ(r["output"][2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(r["output"][2]["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_JSON_EQ(r["usage"], J(R"({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
      "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 3},
      "total_tokens": 17})"));
  EXPECT_JSON_EQ(b.ChatMessage(), J(R"({"role": "assistant", "content": "Hello",
      "reasoning_content": "think", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "f", "arguments": "{\"a\":1}"}}]})"));
}

// A call the host streams (ABI 1.5): the item opens at the first piece with empty arguments,
// each piece is one function_call_arguments.delta, and the whole call closes it, as OpenAI
// streams a function call.
TEST(ResponseBuilder, StreamedToolCallSendsOneArgumentsDeltaPerPiece) {
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("content", "Sure."));
  Json first = ToolCall("call_1", "write_file", "");
  ASSERT_TRUE(b.Delta("tool_call_delta", first));
  for (const char* piece : {"{\"path\":\"", "a\\\"b", "\"}"}) {
    ASSERT_TRUE(
        b.Delta("tool_call_delta", Json{{"index", 0}, {"function", {{"arguments", piece}}}}));
  }
  // Snapshots (GET of a background response) show the arguments so far.
  const Json during = b.Snapshot()["output"][1];
  EXPECT_EQ(during["status"], "in_progress");
  EXPECT_EQ(during["arguments"], "{\"path\":\"a\\\"b\"}");
  ASSERT_TRUE(b.Delta("tool_call_done", ToolCall("call_1", "write_file", "{\"path\":\"a\\\"b\"}")));
  ASSERT_TRUE(b.Finish({"tool_calls", 10, 7, 3, 4}));
  const std::vector<std::string> want = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
  };
  EXPECT_EQ(rec.Types(), want);
  const Json& added = rec.events[8];
  EXPECT_EQ(added["item"]["type"], "function_call");
  EXPECT_EQ(added["item"]["arguments"], "");
  EXPECT_EQ(added["item"]["status"], "in_progress");
  EXPECT_EQ(added["item"]["call_id"], "call_1");
  EXPECT_EQ(added["item"]["name"], "write_file");
  std::string joined;
  for (int i = 9; i <= 11; ++i) {
    EXPECT_EQ(rec.events[i]["item_id"], added["item"]["id"]);
    EXPECT_EQ(rec.events[i]["output_index"], 1);
    joined += rec.events[i]["delta"].get<std::string>();
  }
  EXPECT_EQ(joined, "{\"path\":\"a\\\"b\"}");
  EXPECT_EQ(rec.events[12]["arguments"], joined);
  EXPECT_EQ(rec.events[12]["name"], "write_file");
  EXPECT_EQ(rec.events[13]["item"]["status"], "completed");
  EXPECT_EQ(rec.events[13]["item"]["arguments"], joined);
  const Json& r = b.response();
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][1], rec.events[13]["item"]);
  EXPECT_EQ(b.ChatMessage()["tool_calls"][0]["function"]["arguments"], joined);
}

// A generation that stops inside a streamed call: the item ends incomplete with the pieces that
// came, and the stored turn leaves it out (its arguments are not whole).
TEST(ResponseBuilder, StreamedToolCallCutShortEndsIncomplete) {
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("tool_call_delta", ToolCall("call_1", "f", "{\"a\":")));
  ASSERT_TRUE(b.Finish({"length", 10, 7, 3, 4}));
  const std::vector<std::string> want = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.output_item.done",
      "response.incomplete",
  };
  EXPECT_EQ(rec.Types(), want);
  EXPECT_EQ(rec.events[4]["item"]["status"], "incomplete");
  EXPECT_EQ(rec.events[4]["item"]["arguments"], "{\"a\":");
  EXPECT_FALSE(b.ChatMessage().contains("tool_calls"));
}

TEST(ResponseBuilder, LengthIsIncompleteWithTheReason) {
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("content", "abc"));
  ASSERT_TRUE(b.Finish({"length", 5, 3, 0, 0}));
  EXPECT_EQ(rec.Types().back(), "response.incomplete");
  EXPECT_EQ(b.response()["status"], "incomplete");
  EXPECT_JSON_EQ(b.response()["incomplete_details"], J(R"({"reason": "max_output_tokens"})"));
  EXPECT_EQ(b.response()["output"][0]["status"], "incomplete");
}

TEST(ResponseBuilder, FailureAndDisconnect) {
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("content", "a"));
  ApiError e;
  e.http_status = 500;
  e.message = "host died";
  ASSERT_TRUE(b.Fail(e));
  EXPECT_EQ(rec.Types().back(), "response.failed");
  EXPECT_EQ(b.response()["status"], "failed");
  EXPECT_JSON_EQ(b.response()["error"], J(R"({"code": "server_error", "message": "host died"})"));

  ResponseBuilder::Sink gone;
  gone.send = [](const Json&) { return false; };
  gone.alive = [] { return false; };
  ResponseBuilder g(Skeleton(), gone);
  EXPECT_FALSE(g.Start());
  EXPECT_FALSE(g.Delta("tick", nullptr));
  EXPECT_FALSE(g.Delta("content", "x"));
}

TEST(ResponseBuilder, WithoutASinkNoEventsAndTheThinkSkipFallbackIsNotReasoning) {
  ResponseBuilder b(Skeleton());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("reasoning", "same"));
  ASSERT_TRUE(b.Delta("content", "same"));
  ASSERT_TRUE(b.Finish({"stop", 1, 2, 1, 0}));
  ASSERT_EQ(b.response()["output"].size(), 1u);
  EXPECT_EQ(b.response()["output"][0]["type"], "message");
  EXPECT_EQ(b.response()["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_JSON_EQ(b.ChatMessage(), J(R"({"role": "assistant", "content": "same"})"));
}

TEST(ResponseBuilder, ToolCallOnlyTurnHasNullContent) {
  ResponseBuilder b(Skeleton());
  ASSERT_TRUE(b.Delta("tool_call", ToolCall("call_9", "g", "{}")));
  ASSERT_TRUE(b.Finish({"tool_calls", 1, 1, 0, 0}));
  EXPECT_JSON_EQ(b.ChatMessage(), J(R"({"role": "assistant", "content": null, "tool_calls":
      [{"id": "call_9", "type": "function", "function": {"name": "g", "arguments": "{}"}}]})"));
}

// A chat-path logprob entry as Gateway::LogprobEntry makes it.
Json Entry(const char* token, double logprob, const char* alt, double alt_logprob) {
  auto bytes = [](const std::string& t) {
    Json b = Json::array();
    for (unsigned char c : t) b.push_back(static_cast<int>(c));
    return b;
  };
  return Json{
      {"token", token},
      {"logprob", logprob},
      {"bytes", bytes(token)},
      {"top_logprobs",
       Json::array({Json{{"token", alt}, {"logprob", alt_logprob}, {"bytes", bytes(alt)}}})}};
}

// The stream events' form of entries (no bytes), as the SDK's ResponseTextDeltaEvent has it.
Json Short(std::initializer_list<Json> entries) {
  Json out = Json::array();
  for (const Json& e : entries) {
    out.push_back(
        Json{{"token", e["token"]},
             {"logprob", e["logprob"]},
             {"top_logprobs", Json::array({Json{{"token", e["top_logprobs"][0]["token"]},
                                                {"logprob", e["top_logprobs"][0]["logprob"]}}})}});
  }
  return out;
}

TEST(ResponseBuilder, LogprobsRideOnTheirTokensDeltasAndFillThePart) {
  const Json e0 = Entry("<", -2.0, "x", -3.0);  // its text held back (a possible stop)
  const Json e1 = Entry("Hel", -0.5, "He", -1.5);
  const Json e2 = Entry("lo", -0.25, "l", -2.5);
  const Json e3 = Entry("!", -0.125, ".", -4.0);  // after the last text: cut by a stop
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink(), /*logprobs=*/true);
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("reasoning", "r"));  // reasoning tokens carry none
  ASSERT_TRUE(b.Delta("logprob", e0));     // before any message item exists
  ASSERT_TRUE(b.Delta("content", "<Hel"));
  ASSERT_TRUE(b.Delta("logprob", e1));
  ASSERT_TRUE(b.Delta("content", "lo"));
  ASSERT_TRUE(b.Delta("logprob", e2));
  ASSERT_TRUE(b.Delta("tick", nullptr));
  ASSERT_TRUE(b.Delta("logprob", e3));
  ASSERT_TRUE(b.Finish({"stop", 5, 5, 1, 0}));

  std::vector<Json> deltas;
  for (const Json& e : rec.events) {
    if (e["type"] == "response.output_text.delta") deltas.push_back(e);
  }
  ASSERT_EQ(deltas.size(), 3u);
  EXPECT_EQ(deltas[0]["delta"], "<Hel");
  EXPECT_JSON_EQ(deltas[0]["logprobs"], Short({e0, e1}));
  EXPECT_EQ(deltas[1]["delta"], "lo");
  EXPECT_JSON_EQ(deltas[1]["logprobs"], Short({e2}));
  EXPECT_EQ(deltas[2]["delta"], "");
  EXPECT_JSON_EQ(deltas[2]["logprobs"], Short({e3}));
  for (size_t i = 0; i < rec.events.size(); ++i) {
    EXPECT_EQ(rec.events[i]["sequence_number"], static_cast<int64_t>(i));
  }
  // The part holds every entry with its bytes; the done events repeat them.
  const Json& output = b.response()["output"];
  ASSERT_EQ(output.size(), 2u);
  EXPECT_JSON_EQ(output[1]["content"][0]["logprobs"], Json::array({e0, e1, e2, e3}));
  EXPECT_EQ(output[1]["content"][0]["text"], "<Hello");
  for (const Json& e : rec.events) {
    if (e["type"] == "response.output_text.done") {
      EXPECT_JSON_EQ(e["logprobs"], Short({e0, e1, e2, e3}));
    }
    if (e["type"] == "response.content_part.done" && e["part"]["type"] == "output_text") {
      EXPECT_JSON_EQ(e["part"]["logprobs"], Json::array({e0, e1, e2, e3}));
    }
  }
  EXPECT_JSON_EQ(output[0]["content"][0], J(R"({"type": "reasoning_text", "text": "r"})"));
}

TEST(ResponseBuilder, WithoutLogprobsDeltasGoAtOnceAndEntriesAreIgnored) {
  Recorder rec;
  ResponseBuilder b(Skeleton(), rec.Sink());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("content", "a"));
  EXPECT_EQ(rec.events.back()["type"], "response.output_text.delta");  // not held
  EXPECT_JSON_EQ(rec.events.back()["logprobs"], Json::array());
  ASSERT_TRUE(b.Delta("logprob", Entry("a", -1, "b", -2)));
  ASSERT_TRUE(b.Finish({"stop", 1, 1, 0, 0}));
  EXPECT_JSON_EQ(b.response()["output"][0]["content"][0]["logprobs"], Json::array());
}

TEST(ResponseBuilder, CancelledBackgroundResponse) {
  ResponseBuilder b(Skeleton(), {}, /*logprobs=*/true);
  ASSERT_TRUE(b.Delta("content", "par"));
  ASSERT_TRUE(b.Delta("logprob", Entry("par", -1, "x", -2)));
  b.Cancel();
  EXPECT_EQ(b.response()["status"], "cancelled");
  EXPECT_EQ(b.response()["output"][0]["status"], "incomplete");
  EXPECT_EQ(b.response()["output"][0]["content"][0]["text"], "par");
}

TEST(SseEventFrame, NamesTheEvent) {
  EXPECT_EQ(SseEventFrame(Json{{"type", "response.created"}, {"sequence_number", 0}}),
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}"
            "\n\n");
}

}  // namespace
}  // namespace coli::cli::serve
