// k3_tool_choice_bench: the per-step cost of the lazy tool-call constraint (tool_choice auto,
// plugins/kimi_k3/constrained.h) at a real vocabulary size (not a test: performance lives
// outside ctest).
//
//   build/bin/k3_tool_choice_bench TOKENIZER_DIR [TOOLS]
//
// TOKENIZER_DIR holds tiktoken.model + tokenizer_config.json with K3's XTML specials, e.g. the
// 163,840-token fixture build/fixtures/tiktoken/kimi. TOOLS (default 8) offered tools. Prints
// the ms of one Allowed (the whole-vocabulary mask) and one Permits (the check of a drawn
// token) while watching, inside an opened <|open|> run (the redraw mask), inside a call's
// header, and in the typed-argument body (between elements, an element's header, a raw string
// argument's value).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "plugins/kimi_k3/chat_parser.h"
#include "plugins/kimi_k3/constrained.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: k3_tool_choice_bench TOKENIZER_DIR [TOOLS]\n");
    return 2;
  }
  const int n_tools = argc > 2 ? std::atoi(argv[2]) : 8;
  auto tokenizer = coli::tok::Tokenizer::LoadDir(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  auto ids = coli::k3::FindStructuralIds(**tokenizer);
  if (!ids.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ids.status().message()).c_str());
    return 1;
  }
  const std::vector<int32_t> stops = {ids->end_of_msg};
  const auto t0 = Clock::now();
  auto vocab = coli::k3::ConstraintVocab::Build(**tokenizer, (*tokenizer)->vocab_size(), stops);
  if (!vocab.ok()) return 1;
  std::printf("vocabulary %d tokens, constraint vocabulary built in %.1f ms, %d tools\n",
              (*tokenizer)->vocab_size(), MsSince(t0), n_tools);
  std::string format = R"({"type":"coli_tool_calls","mode":"auto","tools":[)";
  for (int i = 0; i < n_tools; ++i) {
    format += std::string(i ? "," : "") + R"({"name":"tool_)" + std::to_string(i) +
              R"(","parameters":{"type":"object","properties":{"city":{"type":"string"}}}})";
  }
  format += "]}";
  auto spec = coli::k3::ParseToolCallSpec(format);
  if (!spec.ok()) return 1;
  auto c = coli::k3::AnswerConstraint::CreateToolCalls(*spec, **vocab, coli::k3::kParseInResponse);
  if (!c.ok()) return 1;
  std::vector<uint8_t> allowed;
  auto measure = [&](const char* state) {
    constexpr int kMasks = 5, kChecks = 1000;
    const auto a = Clock::now();
    for (int i = 0; i < kMasks; ++i) c->Allowed(&allowed);
    const double mask_ms = MsSince(a) / kMasks;
    size_t n = 0;
    for (uint8_t x : allowed) n += x;
    const auto b = Clock::now();
    int permitted = 0;
    for (int i = 0; i < kChecks; ++i) {
      permitted += c->Permits(static_cast<int32_t>(i * 7919 % (*tokenizer)->vocab_size()));
    }
    std::printf("%-36s mask %7.2f ms (%zu allowed)  Permits %8.4f ms (%d of %d)\n", state, mask_ms,
                n, MsSince(b) / kChecks, permitted, kChecks);
  };
  measure("watching, no run open");
  c->Accept(ids->open);
  measure("watching, after <|open|>");
  for (int32_t id : (*tokenizer)->Encode("call tool=\"tool_", false)) c->Accept(id);
  measure("call header, after `call tool=\"tool_`");
  // The call's body in the typed-argument form.
  for (int32_t id : (*tokenizer)->Encode("3\" index=\"1\"", false)) c->Accept(id);
  c->Accept(ids->sep);
  measure("call body (between elements)");
  c->Accept(ids->open);
  measure("element header, start");
  for (int32_t id : (*tokenizer)->Encode("argument key=\"ci", false)) c->Accept(id);
  measure("element header, in the key");
  for (int32_t id : (*tokenizer)->Encode("ty\" type=\"string\"", false)) c->Accept(id);
  c->Accept(ids->sep);
  measure("string argument, start");
  for (int32_t id : (*tokenizer)->Encode("Paris, \"France", false)) c->Accept(id);
  measure("string argument, after text");
  return 0;
}
