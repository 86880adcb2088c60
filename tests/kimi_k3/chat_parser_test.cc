// XTML output parsing (plugins/kimi_k3/chat_parser.h) on token sequences of the tiny fixture's
// vocabulary. Generated sequences are written as text with the specials by name and turned into
// ids segment by segment (chat_test_util.h), exactly as a model emitting those tokens would.
#include "plugins/kimi_k3/chat_parser.h"

#include <string>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kimi_k3/chat_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::k3::testing::EncodeExpected;
using ::coli::k3::testing::SplitExpected;
using ::coli::k3::testing::TinyTokenizer;
using ::coli::testing::StatusIs;

struct Parsed {
  std::string reasoning, content;
  std::vector<std::string> calls;
  bool ended = false;
  bool moved = false;
  std::vector<ChatEvent> events;
};

void Collect(const std::vector<ChatEvent>& events, Parsed* p) {
  for (const ChatEvent& e : events) {
    p->events.push_back(e);
    if (e.end_of_message) p->ended = true;
    switch (e.channel) {
      case ChatChannel::kReasoning: p->reasoning += e.text; break;
      case ChatChannel::kContent:
        if (e.moved_from_reasoning) p->moved = true;
        p->content += e.text;
        break;
      case ChatChannel::kToolCall: p->calls.push_back(e.text); break;
      case ChatChannel::kToolCallDelta:  // only with set_tool_call_deltas (chat_parser_stream_test)
        ADD_FAILURE() << "a tool-call delta with deltas off: " << e.text;
        break;
      case ChatChannel::kNone: break;
    }
  }
}

std::vector<int32_t> Ids(const std::string& generated) {
  return EncodeExpected(SplitExpected(generated), TinyTokenizer());
}

Parsed Parse(const std::vector<int32_t>& ids, int32_t mode) {
  auto parser = OutputParser::Create(TinyTokenizer(), mode);
  EXPECT_TRUE(parser.ok()) << parser.status();
  Parsed p;
  for (int32_t id : ids) {
    Collect(parser->Feed(id), &p);
    if (parser->ended()) break;
  }
  Collect(parser->Finish(), &p);
  return p;
}

Parsed Parse(const std::string& generated, int32_t mode = kParseInThink) {
  return Parse(Ids(generated), mode);
}

TEST(ChatParser, ReasoningThenContentThenEnd) {
  Parsed p = Parse(
      "Let me think.<|close|>think<|sep|><|open|>response<|sep|>The answer is 42."
      "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>ignored after end");
  EXPECT_EQ(p.reasoning, "Let me think.");
  EXPECT_EQ(p.content, "The answer is 42.");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_TRUE(p.ended);
  EXPECT_FALSE(p.moved);
}

TEST(ChatParser, NonThinkingPromptStartsInContent) {
  Parsed p = Parse("Hi there<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
                   kParseInResponse);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Hi there");
  EXPECT_TRUE(p.ended);
}

TEST(ChatParser, ToolCallsRebuiltFromTypedArgumentsAndRawJson) {
  Parsed p = Parse(
      "need weather<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"centre\"<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|open|>argument key=\"scale\" type=\"number\"<|sep|>1e-07<|close|>argument<|sep|>"
      "<|open|>argument key=\"metric\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
      "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"b\": [1, 2]}<|close|>argument<|sep|>"
      "<|open|>argument key=\"bad\" type=\"number\"<|sep|>many<|close|>argument<|sep|>"
      "<|close|>call<|sep|>"
      "<|open|>call tool=\"a&amp;b\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>"
      "{\"q\": 1}<|close|>json<|sep|><|close|>call<|sep|>"
      "<|open|>call tool=\"raw\" index=\"3\"<|sep|><|open|>json type=\"object\"<|sep|>"
      "not json<|close|>json<|sep|><|close|>call<|sep|>"
      "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(p.reasoning, "need weather");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0],
            R"({"name":"get_weather","arguments":{"city":"Paris \"centre\"","days":3,)"
            R"("scale":1e-07,"metric":true,"opts":{"b":[1,2]},"bad":"many"}})");
  EXPECT_EQ(p.calls[1], R"({"name":"a&b","arguments":{"q":1}})");
  EXPECT_EQ(p.calls[2], R"({"name":"raw","arguments":"not json"})");
  EXPECT_TRUE(p.ended);
}

TEST(ChatParser, ToolCallAcceptedOnlyWhenItsCloseTagArrives) {
  const std::string head =
      "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"x\" type=\"string\"<|sep|>"
      "v<|close|>argument<|sep|>";
  std::vector<int32_t> ids = Ids(head);
  // Cut off (max_tokens) before <|close|>call<|sep|>: no call, no leak into content.
  Parsed cut = Parse(ids, kParseInThink);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "");
  EXPECT_FALSE(cut.ended);
  // <|close|> and "call" alone are not enough either: the <|sep|> completes the tag.
  std::vector<int32_t> almost = Ids(head + "<|close|>call<|sep|>");
  almost.pop_back();
  EXPECT_TRUE(Parse(almost, kParseInThink).calls.empty());
  std::vector<int32_t> full = Ids(head + "<|close|>call<|sep|>");
  EXPECT_EQ(Parse(full, kParseInThink).calls.size(), 1u);
}

TEST(ChatParser, SkippedThinkChannelStillYieldsContent) {
  // The response opener without a think close.
  Parsed a = Parse("<|open|>response<|sep|>Answer A<|close|>response<|sep|><|end_of_msg|>");
  EXPECT_EQ(a.reasoning, "");
  EXPECT_EQ(a.content, "Answer A");
  // The think close without a response opener.
  Parsed b = Parse("<|close|>think<|sep|>Answer B<|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(b.content, "Answer B");
  // No structure at all: the model ended its message inside the think channel.
  Parsed c = Parse("Answer C<|end_of_msg|>");
  EXPECT_EQ(c.reasoning, "Answer C");
  EXPECT_EQ(c.content, "Answer C");
  EXPECT_TRUE(c.moved);
  EXPECT_TRUE(c.ended);
}

TEST(ChatParser, LengthCutInsideThinkIsNotMovedToContent) {
  Parsed p = Parse("still thinking");
  EXPECT_EQ(p.reasoning, "still thinking");
  EXPECT_EQ(p.content, "");
  EXPECT_FALSE(p.ended);
}

TEST(ChatParser, MarkersGeneratedAsOrdinaryTokensAreText) {
  // The bytes "<|close|>think<|sep|>" generated as ordinary tokens do not close the channel.
  const tok::Tokenizer& t = TinyTokenizer();
  std::vector<int32_t> ids = t.Encode("a<|close|>think<|sep|>b", /*allow_special=*/false);
  std::vector<int32_t> tail = Ids("<|close|>think<|sep|><|open|>response<|sep|>c<|end_of_msg|>");
  ids.insert(ids.end(), tail.begin(), tail.end());
  Parsed p = Parse(ids, kParseInThink);
  EXPECT_EQ(p.reasoning, "a<|close|>think<|sep|>b");
  EXPECT_EQ(p.content, "c");
}

TEST(ChatParser, StructuralRunsNeverLeakIntoVisibleText) {
  Parsed p = Parse(
      "r<|close|>think<|sep|><|open|>response<|sep|>x<|close|>response<|sep|>"
      "<|open|>tools<|sep|>\n<|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|>\n"
      "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(p.reasoning, "r");
  EXPECT_EQ(p.content, "x");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], R"({"name":"f","arguments":{}})");
  // A run abandoned by another special (<|open|> then <|open|>) is dropped, not shown.
  std::vector<int32_t> abandoned = {*TinyTokenizer().TokenId("<|open|>")};
  for (int32_t id : TinyTokenizer().Encode("response", false)) abandoned.push_back(id);
  for (int32_t id : Ids("<|open|>response<|sep|>y<|end_of_msg|>")) abandoned.push_back(id);
  Parsed q = Parse(abandoned, kParseInThink);
  EXPECT_EQ(q.content, "y");
  EXPECT_EQ(q.reasoning, "");
}

TEST(ChatParser, OtherSpecialTokensAreNotText) {
  const tok::Tokenizer& t = TinyTokenizer();
  std::vector<int32_t> ids = Ids("<|open|>response<|sep|>a");
  ids.push_back(*t.TokenId("[EOS]"));
  ids.push_back(*t.TokenId("[PAD]"));
  std::vector<int32_t> tail = Ids("b<|end_of_msg|>");
  ids.insert(ids.end(), tail.begin(), tail.end());
  Parsed p = Parse(ids, kParseInThink);
  EXPECT_EQ(p.content, "ab");
}

TEST(ChatParser, DeltasNeverSplitAUtf8Character) {
  auto ids = FindStructuralIds(TinyTokenizer());
  ASSERT_TRUE(ids.ok());
  OutputParser parser(*ids, kParseInResponse);
  Parsed p;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC in three tokens of one byte each
  // While the character is unfinished each token brings one event without text that names the
  // channel holding its bytes (a reply cut there knows where they belong).
  Collect(parser.Feed(1000, euro.substr(0, 1), false), &p);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].channel, ChatChannel::kContent);
  EXPECT_EQ(p.events[0].text, "");
  Collect(parser.Feed(1001, euro.substr(1, 1), false), &p);
  ASSERT_EQ(p.events.size(), 2u);
  EXPECT_EQ(p.events[1].channel, ChatChannel::kContent);
  EXPECT_EQ(p.events[1].text, "");
  Collect(parser.Feed(1002, euro.substr(2, 1) + "x", false), &p);
  ASSERT_EQ(p.events.size(), 3u);
  EXPECT_EQ(p.events[2].text, euro + "x");
  // An incomplete tail is still delivered when generation stops, as U+FFFD: events are text.
  Collect(parser.Feed(1003, "\xE4", false), &p);
  Collect(parser.Finish(), &p);
  EXPECT_EQ(p.content, euro + "x\xEF\xBF\xBD");
  // A stray continuation byte inside complete text, and a partial character cut by a tag.
  OutputParser q(*ids, kParseInThink);
  Parsed r;
  Collect(q.Feed(1004, "a\x80" "b\xE2\x82", false), &r);
  Collect(q.Feed(ids->close, "", true), &r);
  Collect(q.Feed(1005, "think", false), &r);
  Collect(q.Feed(ids->sep, "", true), &r);
  EXPECT_EQ(r.reasoning, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST(ChatParser, NoGenerationPromptModeTreatsTextAsContent) {
  Parsed p = Parse("plain<|end_of_msg|>", kParseOutside);
  EXPECT_EQ(p.content, "plain");
  EXPECT_TRUE(p.ended);
}

TEST(ChatParser, ModeFromRender) {
  RenderedChat chat;
  chat.thinking = true;
  EXPECT_EQ(ParseModeFor(chat), kParseInThink);
  chat.thinking = false;
  EXPECT_EQ(ParseModeFor(chat), kParseInResponse);
  chat.add_generation_prompt = false;
  EXPECT_EQ(ParseModeFor(chat), kParseOutside);
  EXPECT_THAT(OutputParser::Create(TinyTokenizer(), 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(OutputParser::Create(TinyTokenizer(), 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ChatParser, RenderedAssistantTurnParsesBackToItsMessage) {
  // Round trip: render an assistant turn with reasoning, content and a typed call, cut the
  // prompt prefix off, and parse the rest as if the model had generated it.
  const Json req = Json::parse(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","reasoning_content":"think","content":"answer","tool_calls":[
       {"id":"1","function":{"name":"f","arguments":{"k":"v","n":2.5,"l":[true,null]}}}]}],
      "chat_template_kwargs":{"add_generation_prompt":false}})");
  auto r = RenderChat(req, TinyTokenizer());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string text = r->text;
  const std::string cue = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
  const size_t at = text.find(cue);
  ASSERT_NE(at, std::string::npos);
  Parsed p = Parse(text.substr(at + cue.size()), kParseInThink);
  EXPECT_EQ(p.reasoning, "think");
  EXPECT_EQ(p.content, "answer");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], R"({"name":"f","arguments":{"k":"v","n":2.5,"l":[true,null]}})");
  EXPECT_TRUE(p.ended);
}

}  // namespace
}  // namespace coli::k3
