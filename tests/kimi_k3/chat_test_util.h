// Helpers shared by the kimi_k3_chat tests: the tiny fixture's tokenizer and an independent
// reader of hand-written expected renderings.
//
// Expected renderings are written as text with the special tokens spelled by name, e.g.
//   <|open|>message role="user"<|sep|>hello<|close|>message<|sep|><|end_of_msg|>
// `SplitExpected` reads such text into the segments spec §6.1 prescribes (open tag: `<|open|>`,
// tag name, per attribute ` key` `="` value `"`, `<|sep|>`; close tag: `<|close|>` name `<|sep|>`;
// bodies one text segment each). It reads the text; it shares no code with the renderer.
#ifndef COLI_TESTS_KIMI_K3_CHAT_TEST_UTIL_H_
#define COLI_TESTS_KIMI_K3_CHAT_TEST_UTIL_H_

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/chat.h"

namespace coli::k3::testing {

// The tokenizer of build/fixtures/k3_tiny (target k3_tiny_fixture): 512 BPE tokens learned on
// English/Chinese text + the K3 specials at 512.. (`<|open|>` 515 ...).
inline const tok::Tokenizer& TinyTokenizer() {
  static const tok::Tokenizer* tokenizer = [] {
    // COLI_K3_TINY_DIR is compiled in by tests/kimi_k3/chat.cmake; COLI_BINARY_DIR wins.
    const char* bin = std::getenv("COLI_BINARY_DIR");
    const std::string dir =
        bin != nullptr ? std::string(bin) + "/fixtures/k3_tiny" : std::string(COLI_K3_TINY_DIR);
    auto loaded = tok::Tokenizer::LoadDir(dir);
    if (!loaded.ok()) {
      ADD_FAILURE() << "cannot load the tiny fixture tokenizer from " << dir << ": "
                    << loaded.status() << " (build target k3_tiny_fixture)";
      return static_cast<const tok::Tokenizer*>(nullptr);
    }
    return static_cast<const tok::Tokenizer*>(loaded->release());
  }();
  if (tokenizer == nullptr) std::abort();
  return *tokenizer;
}

inline std::vector<Segment> SplitExpected(std::string_view text) {
  static constexpr std::string_view kSpecials[] = {"<|open|>", "<|close|>", "<|sep|>",
                                                   "<|end_of_msg|>", "[BOS]"};
  std::vector<Segment> out;
  auto text_seg = [&](std::string_view t) {
    if (!t.empty()) out.push_back({std::string(t), false});
  };
  auto special_at = [&](size_t pos) -> std::string_view {
    for (std::string_view s : kSpecials) {
      if (text.substr(pos, s.size()) == s) return s;
    }
    return {};
  };
  size_t pos = 0;
  while (pos < text.size()) {
    std::string_view sp = special_at(pos);
    if (sp.empty()) {  // a body: up to the next special
      size_t end = pos;
      while (end < text.size() && special_at(end).empty()) ++end;
      text_seg(text.substr(pos, end - pos));
      pos = end;
      continue;
    }
    out.push_back({std::string(sp), true});
    pos += sp.size();
    if (sp == "<|open|>" || sp == "<|close|>") {
      const size_t sep = text.find("<|sep|>", pos);
      EXPECT_NE(sep, std::string_view::npos) << "tag without <|sep|> in expected text";
      std::string_view run = text.substr(pos, sep - pos);
      const size_t space = std::min(run.find(' '), run.size());
      text_seg(run.substr(0, space));  // the tag name
      std::string_view rest = run.substr(space);
      while (!rest.empty()) {  // ` key="value"` at a time; values never hold a raw quote
        const size_t eq = rest.find("=\"");
        const size_t close = rest.find('"', eq + 2);
        EXPECT_TRUE(eq != std::string_view::npos && close != std::string_view::npos) << run;
        if (eq == std::string_view::npos || close == std::string_view::npos) break;
        text_seg(rest.substr(0, eq));
        text_seg("=\"");
        text_seg(rest.substr(eq + 2, close - eq - 2));
        text_seg("\"");
        rest = rest.substr(close + 1);
      }
      out.push_back({"<|sep|>", true});
      pos = sep + 7;
    }
  }
  return out;
}

// Encodes each segment on its own: specials by name, text with special matching off.
inline std::vector<int32_t> EncodeExpected(const std::vector<Segment>& segments,
                                           const tok::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const Segment& s : segments) {
    if (s.special) {
      auto id = tokenizer.TokenId(s.text);
      EXPECT_TRUE(id.has_value()) << s.text;
      ids.push_back(id.value_or(-1));
    } else {
      auto piece = tokenizer.Encode(s.text, false);
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
  }
  return ids;
}

}  // namespace coli::k3::testing

#endif  // COLI_TESTS_KIMI_K3_CHAT_TEST_UTIL_H_
