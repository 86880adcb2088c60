// Tool-call deltas of the XTML output parser (plugins/kimi_k3/chat_parser.h,
// ABI 1.5): a call streams as kToolCallDelta events whose "arguments" pieces
// join to exactly the complete call's arguments text (what `coli serve` sends
// as function.arguments), UTF-8 characters are never split, and with deltas off
// nothing changes. Token streams are fed byte chunk by byte chunk (the parser's
// tokenizer-free entry), so chunk edges fall anywhere, mid-character included.
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/chat_json.h"
#include "plugins/kimi_k3/chat_parser.h"

namespace coli::k3 {
namespace {

constexpr StructuralIds kIds{/*open=*/1, /*close=*/2, /*sep=*/3,
                             /*end_of_msg=*/4};
constexpr int32_t kText = 100;

// One generated token: a structural id, or text bytes.
struct Token {
  int32_t id;
  std::string bytes;
};

std::string Dump(const Json &j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The arguments text `coli serve` sends for a complete call
// (tools/coli/serve.cc ToolCallFromDelta): a string as it is, anything else as
// compact JSON.
std::string ArgumentsText(const std::string &call_text) {
  const Json call = Json::parse(call_text);
  const Json &a = call.at("arguments");
  return a.is_string() ? a.get<std::string>() : Dump(a);
}

struct Parsed {
  std::vector<ChatEvent> events;
  std::vector<std::string> calls;
};

Parsed Feed(const std::vector<Token> &tokens, bool deltas) {
  OutputParser parser(kIds, kParseInResponse);
  parser.set_tool_call_deltas(deltas);
  Parsed run;
  for (const Token &t : tokens) {
    for (ChatEvent &e : parser.Feed(t.id, t.bytes, t.id != kText)) {
      if (e.channel == ChatChannel::kToolCall) run.calls.push_back(e.text);
      run.events.push_back(std::move(e));
    }
  }
  for (ChatEvent &e : parser.Finish()) run.events.push_back(std::move(e));
  return run;
}

// Checks the delta contract on one run; returns the number of delta events.
int CheckDeltas(const Parsed &run, bool input_valid_utf8, const std::string &context) {
  std::string joined, name;
  bool open = false;
  int index = -1, deltas = 0;
  size_t calls = 0;
  for (const ChatEvent &e : run.events) {
    if (e.channel == ChatChannel::kToolCallDelta) {
      ++deltas;
      const Json d = Json::parse(e.text);
      const std::string piece = d.at("arguments").get<std::string>();
      EXPECT_TRUE(tok::IsValidUtf8(piece)) << context;
      if (input_valid_utf8) {
        // A split character would show as U+FFFD in the event's JSON.
        EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << context << " piece " << piece;
      }
      if (d.contains("name")) {  // a call opens
        open = true;
        joined.clear();
        name = d["name"].get<std::string>();
        index = d.at("index").get<int>();
        EXPECT_EQ(index, static_cast<int>(calls)) << context;
      } else {
        EXPECT_TRUE(open) << "a delta before its call's first one: " << context;
        EXPECT_EQ(d.at("index").get<int>(), index) << context;
      }
      joined += piece;
    } else if (e.channel == ChatChannel::kToolCall) {
      EXPECT_TRUE(open) << "a complete call without deltas: " << context;
      EXPECT_EQ(joined, ArgumentsText(e.text)) << context << "\ncall: " << e.text;
      EXPECT_EQ(Json::parse(e.text).at("name").get<std::string>(), name) << context;
      open = false;
      ++calls;
    }
  }
  EXPECT_EQ(calls, run.calls.size());
  return deltas;
}

// Builders of generated sequences.
void Tag(std::vector<Token> *out, bool close, const std::string &run) {
  out->push_back({close ? kIds.close : kIds.open, ""});
  out->push_back({kText, run});
  out->push_back({kIds.sep, ""});
}

// Text as tokens of 1..max_chunk bytes (cut anywhere, mid-character too).
void Text(std::vector<Token> *out, const std::string &text, std::mt19937 *rng, int max_chunk) {
  std::uniform_int_distribution<int> len(1, max_chunk);
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min(text.size() - i, static_cast<size_t>(len(*rng)));
    out->push_back({kText, text.substr(i, n)});
    i += n;
  }
}

std::string AttrEscape(const std::string &v) {
  std::string out;
  for (char c : v) {
    if (c == '"') {
      out += "&quot;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

TEST(ChatParserDeltas, TypedCallStreamsInPiecesThatJoinToTheArguments) {
  std::vector<Token> t;
  std::mt19937 rng(1);
  Tag(&t, false, "tools");
  Tag(&t, false, "call tool=\"write_file\" index=\"1\"");
  Tag(&t, false, "argument key=\"path\" type=\"string\"");
  Text(&t, "notes/a \"b\".txt", &rng, 1);
  Tag(&t, true, "argument");
  Tag(&t, false, "argument key=\"lines\" type=\"number\"");
  Text(&t, "12", &rng, 1);
  Tag(&t, true, "argument");
  Tag(&t, true, "call");
  Tag(&t, true, "tools");
  const Parsed run = Feed(t, true);
  ASSERT_EQ(run.calls.size(), 1u);
  EXPECT_EQ(run.calls[0],
            R"({"name":"write_file","arguments":{"path":"notes/a \"b\".txt","lines":12}})");
  std::vector<std::string> pieces;
  for (const ChatEvent &e : run.events) {
    if (e.channel == ChatChannel::kToolCallDelta) {
      pieces.push_back(Json::parse(e.text)["arguments"].get<std::string>());
    }
  }
  // The name first (empty arguments), the key and opening quote, one piece per
  // character of the path (escaped), then the number whole, the closing brace.
  ASSERT_GT(pieces.size(), 10u);
  EXPECT_EQ(run.events.front().text, R"({"index":0,"name":"write_file","arguments":""})");
  EXPECT_EQ(pieces[1], R"({"path":")");
  EXPECT_EQ(CheckDeltas(run, true, "typed"), static_cast<int>(pieces.size()));
  // Delta-off parsing of the same tokens gives the same complete call and no
  // delta.
  const Parsed old = Feed(t, false);
  EXPECT_EQ(old.calls, run.calls);
  for (const ChatEvent &e : old.events) EXPECT_NE(e.channel, ChatChannel::kToolCallDelta);
}

TEST(ChatParserDeltas, RawJsonBlockStreamsItsBytesAsGenerated) {
  std::vector<Token> t;
  std::mt19937 rng(2);
  const std::string block = "{\"city\": \"Z\xC3\xBCrich \xF0\x9F\x98\x80\", \"days\": 3}";
  Tag(&t, false, "tools");
  Tag(&t, false, "call tool=\"get_weather\"");
  Tag(&t, false, "json");
  Text(&t, block, &rng, 1);  // byte by byte: every multi-byte character is cut
  Tag(&t, true, "json");
  Tag(&t, true, "call");
  const Parsed run = Feed(t, true);
  ASSERT_EQ(run.calls.size(), 1u);
  // Not compact JSON: the call carries the text as generated (which the deltas
  // spelled).
  EXPECT_EQ(Json::parse(run.calls[0])["arguments"], block);
  EXPECT_GT(CheckDeltas(run, true, "json"), 5);
  // A compact block keeps the parsed object, as without deltas.
  std::vector<Token> c;
  Tag(&c, false, "tools");
  Tag(&c, false, "call tool=\"f\"");
  Tag(&c, false, "json");
  Text(&c, R"({"a":[1,"x"]})", &rng, 2);
  Tag(&c, true, "json");
  Tag(&c, true, "call");
  const Parsed compact = Feed(c, true);
  EXPECT_EQ(compact.calls, Feed(c, false).calls);
  EXPECT_TRUE(Json::parse(compact.calls.at(0))["arguments"].is_object());
  CheckDeltas(compact, true, "compact json");
}

TEST(ChatParserDeltas, CallWithoutArgumentsStreamsAnEmptyObject) {
  std::vector<Token> t;
  Tag(&t, false, "tools");
  Tag(&t, false, "call tool=\"now\"");
  Tag(&t, true, "call");
  const Parsed run = Feed(t, true);
  ASSERT_EQ(run.calls.size(), 1u);
  EXPECT_EQ(run.calls[0], R"({"name":"now","arguments":{}})");
  EXPECT_EQ(CheckDeltas(run, true, "empty"),
            2);  // the name, then "{}" with the close
}

// Tags that would leave a call whose pieces are out (found by k3_chat_fuzz): with deltas on, a
// call (or response, think, tools) opened inside it, or tools closed, is dropped and the call
// goes on: one name, pieces joining to the complete call's arguments, the next call the next
// index. Without deltas those tags leave the call, which is never reported, as before.
TEST(ChatParserDeltas, TagsInsideACallAreDroppedOnceItsPiecesAreOut) {
  std::vector<Token> t;
  std::mt19937 rng(5);
  Tag(&t, false, "tools");
  Tag(&t, false, "call tool=\"f\"");
  Tag(&t, false, "argument key=\"a\" type=\"string\"");
  Text(&t, "x\"y", &rng, 2);
  Tag(&t, false, "call tool=\"g\"");
  Text(&t, "z", &rng, 1);
  Tag(&t, false, "response");
  Tag(&t, true, "tools");
  Tag(&t, true, "argument");
  Tag(&t, true, "call");
  Tag(&t, false, "call tool=\"h\"");
  Tag(&t, true, "call");
  const Parsed run = Feed(t, true);
  ASSERT_EQ(run.calls.size(), 2u);
  EXPECT_EQ(run.calls[0], R"({"name":"f","arguments":{"a":"x\"yz"}})");
  EXPECT_EQ(run.calls[1], R"({"name":"h","arguments":{}})");
  int names = 0;
  for (const ChatEvent &e : run.events) {
    if (e.channel == ChatChannel::kToolCallDelta) names += Json::parse(e.text).contains("name");
  }
  EXPECT_EQ(names, 2);
  CheckDeltas(run, true, "tags inside a call");
  // Without deltas the response opener leaves the unfinished call, which is never reported.
  const Parsed plain = Feed(t, false);
  ASSERT_EQ(plain.calls.size(), 1u);
  EXPECT_EQ(Json::parse(plain.calls[0])["name"], "h");
}

TEST(ChatParserDeltas, RepeatedKeyCarriesTheStreamedText) {
  std::vector<Token> t;
  std::mt19937 rng(3);
  Tag(&t, false, "tools");
  Tag(&t, false, "call tool=\"f\"");
  for (const char *v : {"1", "2"}) {
    Tag(&t, false, "argument key=\"k\" type=\"number\"");
    Text(&t, v, &rng, 1);
    Tag(&t, true, "argument");
  }
  Tag(&t, true, "call");
  const Parsed run = Feed(t, true);
  ASSERT_EQ(run.calls.size(), 1u);
  EXPECT_EQ(Json::parse(run.calls[0])["arguments"], R"({"k":1,"k":2})");
  CheckDeltas(run, true, "repeated key");
}

// Random generated messages: 1-3 calls of typed arguments (every type, strings
// with quotes, backslashes, control characters, non-ASCII, sometimes invalid
// bytes; keys that repeat) or one raw block (compact, pretty or not JSON), cut
// into tokens of 1-6 bytes.
TEST(ChatParserDeltas, DeltasJoinToTheCompleteArgumentsOverGeneratedSequences) {
  std::mt19937 rng(20261130);
  const std::vector<std::string> alphabet = {"a",
                                             "Z",
                                             " ",
                                             "\"",
                                             "\\",
                                             "\\n",
                                             "\n",
                                             "\t",
                                             "\r",
                                             std::string(1, '\x01'),
                                             "\x1f",
                                             "\x7f",
                                             "/",
                                             "<",
                                             "&",
                                             "\xC3\xA9",
                                             "\xE4\xB8\xAD",
                                             "\xF0\x9F\x98\x80",
                                             "\xE2\x80\xA8",
                                             "{",
                                             "}"};
  const std::vector<std::string> invalid = {"\xFF", "\xE4\xB8", "\xC3", "\x80"};
  const std::vector<std::string> keys = {"path", "a\"b", "c\\d", "\xC3\xBC", "", "content"};
  struct Typed {
    const char *type;
    std::vector<std::string> values;
  };
  const std::vector<Typed> typed = {
      {"number", {"3", "-1.5", "1e3", "0.1", "12345678901234567890", "abc", " 7 "}},
      {"boolean", {"true", "false", "True", "maybe"}},
      {"null", {"null", "None", "x"}},
      {"object", {"{\"x\": [1, 2]}", "{}", "{\"\xC3\xA9\": \"\\u00e9\"}", "[1]"}},
      {"array", {"[1, \"a\\\"b\", null]", "[]", "{}"}},
      {"integer", {"5", "-2"}},
  };
  int deltas = 0, compared = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<Token> t;
    bool valid = true, repeated = false;
    std::string plan;  // what was generated, for failure messages
    Text(&t, "Sure.", &rng, 3);
    Tag(&t, true, "response");
    Tag(&t, false, "tools");
    const int n_calls = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < n_calls; ++c) {
      const std::string name = c % 2 ? "f\xC3\xA9" : "write_file";
      Tag(&t, false, "call tool=\"" + name + "\" index=\"" + std::to_string(c + 1) + "\"");
      const int kind = static_cast<int>(rng() % 4);
      if (kind == 3) {  // one raw block
        Json obj = {{"a", "x\"\\\n\xC3\xA9"}, {"b", {1, 2.5, nullptr}}};
        const int style = static_cast<int>(rng() % 3);
        const std::string block = style == 0   ? Dump(obj)
                                  : style == 1 ? obj.dump(2)
                                               : "not json \xE4\xB8\xAD \"";
        plan += " json" + std::to_string(style);
        Tag(&t, false, "json");
        Text(&t, block, &rng, 6);
        Tag(&t, true, "json");
      } else {
        std::vector<std::string> used;
        const int n_args = static_cast<int>(rng() % 5);
        for (int a = 0; a < n_args; ++a) {
          const std::string key = keys[rng() % keys.size()];
          for (const std::string &u : used) repeated |= u == key;
          used.push_back(key);
          std::string type = "string", value;
          if (rng() % 2) {
            const Typed &ty = typed[rng() % typed.size()];
            type = ty.type;
            value = ty.values[rng() % ty.values.size()];
          } else {
            const int len = static_cast<int>(rng() % 12);
            for (int i = 0; i < len; ++i) value += alphabet[rng() % alphabet.size()];
            if (rng() % 8 == 0) {
              value += invalid[rng() % invalid.size()] + "q";
              valid = false;
            }
          }
          plan += " " + type;
          const bool untyped = type == "string" && rng() % 4 == 0;  // no type attr = string
          Tag(&t, false,
              "argument key=\"" + AttrEscape(key) + "\"" +
                  (untyped ? "" : " type=\"" + type + "\""));
          Text(&t, value, &rng, 6);
          Tag(&t, true, "argument");
        }
      }
      Tag(&t, true, "call");
    }
    Tag(&t, true, "tools");
    Tag(&t, true, "message");
    t.push_back({kIds.end_of_msg, ""});
    const std::string context = "iteration " + std::to_string(iter) + ":" + plan;
    const Parsed run = Feed(t, true);
    ASSERT_EQ(run.calls.size(), static_cast<size_t>(n_calls)) << context;
    deltas += CheckDeltas(run, valid, context);
    if (valid && !repeated) {
      // Nothing the object cannot say: the complete calls are those of
      // delta-off parsing, except a raw block that is not compact JSON, which
      // carries its text.
      const Parsed old = Feed(t, false);
      ASSERT_EQ(old.calls.size(), run.calls.size()) << context;
      for (size_t i = 0; i < old.calls.size(); ++i) {
        const Json a = Json::parse(run.calls[i])["arguments"];
        const Json b = Json::parse(old.calls[i])["arguments"];
        if (a == b) {
          EXPECT_EQ(run.calls[i], old.calls[i]) << context;
          ++compared;
        } else {
          EXPECT_TRUE(a.is_string() && b.is_object()) << context;  // a pretty raw block
        }
      }
    }
  }
  EXPECT_GT(deltas, 4000);  // the sequences really streamed
  EXPECT_GT(compared,
            300);  // and most calls were compared with delta-off parsing
}

TEST(ChatParserDeltas, AnUnfinishedCallStreamsButNeverCompletes) {
  std::vector<Token> t;
  std::mt19937 rng(4);
  Tag(&t, false, "tools");
  Tag(&t, false, "call tool=\"f\"");
  Tag(&t, false, "argument key=\"s\"");
  Text(&t, "abc\xE4\xB8", &rng, 1);  // generation stops mid-character
  const Parsed run = Feed(t, true);
  EXPECT_TRUE(run.calls.empty());
  std::string joined;
  for (const ChatEvent &e : run.events) {
    ASSERT_EQ(e.channel, ChatChannel::kToolCallDelta);
    joined += Json::parse(e.text)["arguments"].get<std::string>();
  }
  EXPECT_EQ(joined,
            R"({"s":"abc)");  // the partial character is held back, not replaced
}

}  // namespace
}  // namespace coli::k3
