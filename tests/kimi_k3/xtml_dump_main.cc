// tests/kimi_k3/xtml_dump_main: prints the XTML segments plugins/kimi_k3/chat renders for each of
// a file's chat-completions requests, for the differential test against the independent Python
// renderer (tools/xtml_ref/diff_test.py, ctest `xtml_differential`).
//
//   xtml_dump requests.json > segments.jsonl
//
// The file holds one JSON array of request objects. Each request is re-serialised and read back
// with ParseRequestBody (the gateway's path), then rendered with BuildChatSegments; one line per
// request is printed, in order: `[[text, special], ...]` or `{"error": "<status message>"}`.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/chat_json.h"

namespace {

// One output line for one request.
std::string DumpOne(const coli::k3::Json& request_value) {
  using coli::k3::Json;
  auto request = coli::k3::ParseRequestBody(request_value.dump());
  if (!request.ok()) {
    return Json{{"error", std::string(request.status().message())}}.dump();
  }
  auto chat = coli::k3::BuildChatSegments(*request);
  if (!chat.ok()) {
    return Json{{"error", std::string(chat.status().message())}}.dump();
  }
  Json out = Json::array();
  for (const auto& segment : chat->segments) {
    out.push_back(Json::array({segment.text, segment.special}));
  }
  // Replace (not throw on) invalid UTF-8 so one bad segment cannot hide the others.
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: xtml_dump REQUESTS.json\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "xtml_dump: cannot open '%s'\n", argv[1]);
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  coli::k3::Json requests = coli::k3::Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!requests.is_array()) {
    std::fprintf(stderr, "xtml_dump: '%s' is not a JSON array of requests\n", argv[1]);
    return 2;
  }
  for (const auto& request : requests) {
    std::cout << DumpOne(request) << '\n';
  }
  return 0;
}
