// libFuzzer target: Kimi K3's chat format on arbitrary input — the XTML renderer of OpenAI chat
// bodies (any API client sends them) and the parser of generated output (any token sequence a
// model can sample).
//
// First byte even: the rest is an HTTP body for ParseRequestBody + BuildChatSegments. Checked: a
// refusal has a message; a render's text is its segments joined, no segment is empty, and every
// special segment is one of XTML's markers (user text never becomes structure).
// First byte odd: the rest is a token stream for OutputParser (mode 1–3 and tool-call deltas on
// or off from the first byte):
// a byte with the top bit set is a structural token (open / close / sep / end_of_msg), otherwise
// its low 4 bits + 1 give the length of an ordinary token taken from the following bytes. Checked:
// every tool call is a JSON object with a string "name" and "arguments"; the visible text
// (reasoning and content, not counting the think-skip fallback's re-report) is never longer than
// the ordinary bytes fed; nothing is fed after the message ended. Built and run by scripts/fuzz.sh.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/chat_parser.h"
#include "tests/fuzz/fuzz_check.h"

using ::coli::fuzz::Check;
namespace k3 = ::coli::k3;

namespace {

void Render(std::string_view body) {
  auto request = k3::ParseRequestBody(body);
  if (!request.ok()) {
    Check(!request.status().message().empty(), "a refused body names why");
    return;
  }
  for (bool generation_prompt : {true, false}) {
    auto chat = k3::BuildChatSegments(*request, generation_prompt);
    if (!chat.ok()) {
      Check(!chat.status().message().empty(), "a refused request names why");
      return;
    }
    std::string joined;
    for (const k3::Segment& s : chat->segments) {
      Check(!s.text.empty(), "no empty segment");
      if (s.special) {
        Check(s.text == k3::kOpenToken || s.text == k3::kCloseToken || s.text == k3::kSepToken ||
                  s.text == k3::kEndOfMsgToken || s.text == k3::kBosToken,
              "a special segment is one XTML marker");
      }
      joined += s.text;
    }
    Check(joined == chat->text, "the text is the segments joined");
  }
}

void Parse(int32_t mode, bool deltas, std::string_view stream) {
  const k3::StructuralIds ids{.open = 1, .close = 2, .sep = 3, .end_of_msg = 4};
  const std::string_view names[] = {k3::kOpenToken, k3::kCloseToken, k3::kSepToken,
                                    k3::kEndOfMsgToken};
  k3::OutputParser parser(ids, static_cast<k3::ParseMode>(mode));
  parser.set_tool_call_deltas(deltas);
  size_t plain = 0, visible = 0;
  // Per call index: the joined pieces, and whether its name came.
  std::vector<std::string> pieces;
  int64_t completed = 0;
  auto take = [&](const std::vector<k3::ChatEvent>& events) {
    for (const k3::ChatEvent& e : events) {
      if (e.channel == k3::ChatChannel::kToolCall) {
        const auto call = nlohmann::ordered_json::parse(e.text, nullptr, false);
        Check(call.is_object() && call.contains("name") && call["name"].is_string() &&
                  call.contains("arguments"),
              "a tool call is {name, arguments}");
        if (deltas) {
          Check(completed < static_cast<int64_t>(pieces.size()), "a call's deltas came first");
          const auto& args = call["arguments"];
          const std::string whole =
              args.is_string()
                  ? args.get<std::string>()
                  : args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
          Check(pieces[completed] == whole, "the pieces join to the complete call's arguments");
        }
        ++completed;
      } else if (e.channel == k3::ChatChannel::kToolCallDelta) {
        Check(deltas, "no delta unless asked for");
        const auto d = nlohmann::json::parse(e.text, nullptr, false);
        Check(d.is_object() && d.contains("index") && d["index"].is_number_integer() &&
                  d.contains("arguments") && d["arguments"].is_string(),
              "a delta is {index, name?, arguments}");
        const int64_t index = d["index"].get<int64_t>();
        Check(index == completed, "deltas belong to the call being generated");
        const bool first = static_cast<int64_t>(pieces.size()) == index;
        Check(first || static_cast<int64_t>(pieces.size()) == index + 1, "indexes in order");
        if (first) pieces.emplace_back();
        Check(d.contains("name") == first, "the name comes with the first piece only");
        const std::string piece = d["arguments"].get<std::string>();
        Check(::coli::fuzz::WellFormedUtf8(piece), "a piece is well-formed UTF-8");
        pieces.back() += piece;
      } else {
        Check(::coli::fuzz::WellFormedUtf8(e.text), "a delta is well-formed UTF-8");
        if (!e.moved_from_reasoning) visible += e.text.size();
      }
    }
  };
  size_t i = 0;
  while (i < stream.size() && !parser.ended()) {
    const auto b = static_cast<uint8_t>(stream[i++]);
    if (b & 0x80) {
      const int k = (b >> 5) & 3;
      take(parser.Feed(k + 1, names[k], true));
    } else {
      const std::string_view bytes = stream.substr(i, (b & 0x0F) + 1);
      i += bytes.size();
      if (bytes.empty()) break;
      plain += bytes.size();
      take(parser.Feed(100 + (b & 0x70), bytes, false));
    }
  }
  take(parser.Finish());
  Check(visible <= 3 * plain, "visible text: at most U+FFFD for every ordinary byte fed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    Render(rest);
  } else {
    Parse(1 + (data[0] / 2) % 3, (data[0] & 0x40) != 0, rest);
  }
  return 0;
}
