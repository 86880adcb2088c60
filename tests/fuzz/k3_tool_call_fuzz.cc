// libFuzzer target: Kimi K3's tool-call constraint (plugins/kimi_k3/constrained.h) on arbitrary
// parameters schemas (they come from API clients), walked through its allowed sets by the
// input's choice bytes, with the tiny fixture's tokenizer (768 ids, K3's XTML specials: the
// build's fixtures/k3_tiny, or the directory in COLI_FUZZ_K3_TOKENIZER).
//
// Input: a parameters schema, NUL, a mode byte (even: a named call, odd: "required"), then one
// choice byte per step (a byte < 64 takes an allowed special token when there is one; past the
// input the walk takes <|close|> / <|sep|> when allowed, so it ends). Checked:
//  - a schema the spec refuses carries a message; otherwise the constraint builds;
//  - the walk never dead-ends: while the constraint has not ended some token is allowed;
//  - Permits agrees with Allowed on the drawn token and on one other;
//  - a walk that ends gives, through the chat parser, calls whose arguments are JSON objects;
//    for a call written as typed `argument` elements: every required key is there, no undeclared
//    key in a closed object (read from the schema text), and each value without a float (a
//    float's re-serialisation may round) is accepted again by its key's schema compiled alone,
//    re-serialised by nlohmann; for a json block, the whole arguments object re-serialised
//    compactly is accepted by the parameters schema (key-sorted, as the model saw it declared).
// Built and run by scripts/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/grammar/json_constraint.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "plugins/kimi_k3/chat_parser.h"
#include "plugins/kimi_k3/constrained.h"
#include "tests/fuzz/fuzz_check.h"

using ::coli::fuzz::Check;
namespace k3 = ::coli::k3;
namespace grammar = ::coli::grammar;
namespace tok = ::coli::tok;
using Json = nlohmann::ordered_json;

namespace {

std::unique_ptr<tok::Tokenizer> g_tokenizer;
std::unique_ptr<k3::ConstraintVocab> g_vocab;
k3::StructuralIds g_ids;

bool HasFloat(const Json& v) {
  if (v.is_number_float()) return true;
  if (v.is_structured()) {
    for (const Json& e : v) {
      if (HasFloat(e)) return true;
    }
  }
  return false;
}

// Whether `schema` (with the root's $defs / definitions) accepts `text` as a whole value.
bool Accepts(Json schema, const Json& root, const std::string& text) {
  if (schema.is_boolean()) schema = Json::object();
  for (const char* defs : {"$defs", "definitions"}) {
    if (root.contains(defs) && schema.is_object() && !schema.contains(defs)) {
      schema[defs] = root[defs];
    }
  }
  auto c = grammar::JsonConstraint::FromSchema(schema.dump());
  if (!c.ok()) return true;  // not a schema that compiles alone: nothing to check here
  grammar::JsonMatcher m(*c);
  return m.Accept(text) && m.CanEnd();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("COLI_FUZZ_K3_TOKENIZER");
  auto loaded = tok::Tokenizer::LoadDir(dir != nullptr ? dir : "build/fixtures/k3_tiny");
  auto ids = loaded.ok() ? k3::FindStructuralIds(**loaded)
                         : absl::StatusOr<k3::StructuralIds>(loaded.status());
  if (!ids.ok()) {
    std::fprintf(stderr, "k3_tool_call_fuzz: %s\n", std::string(ids.status().message()).c_str());
    std::abort();
  }
  g_tokenizer = std::move(loaded).value();
  g_ids = *ids;
  const std::vector<int32_t> stops = {g_ids.end_of_msg};
  auto vocab = k3::ConstraintVocab::Build(*g_tokenizer, g_tokenizer->vocab_size(), stops);
  Check(vocab.ok(), "the constraint vocabulary builds");
  g_vocab = std::move(vocab).value();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos || nul + 1 >= input.size()) return 0;
  const Json params = Json::parse(input.substr(0, nul), nullptr, false);
  if (params.is_discarded() || !params.is_object()) return 0;
  const bool named = static_cast<uint8_t>(input[nul + 1]) % 2 == 0;
  const std::string_view choices = input.substr(nul + 2);
  const Json format = {{"type", "coli_tool_calls"},
                       {"mode", named ? "named" : "required"},
                       {"tools", Json::array({{{"name", "f"}, {"parameters", params}}})}};
  auto spec = k3::ParseToolCallSpec(format.dump());
  if (!spec.ok()) {
    Check(!spec.status().message().empty(), "a refusal says why");
    return 0;
  }
  auto c = k3::AnswerConstraint::CreateToolCalls(*spec, *g_vocab, k3::kParseInResponse);
  Check(c.ok(), "a parsed spec makes a constraint");
  const int32_t n = g_tokenizer->vocab_size();
  std::vector<int32_t> out;
  std::vector<uint8_t> allowed;
  size_t pos = 0;
  for (int step = 0; step < 1500 && !c->ended(); ++step) {
    c->Allowed(&allowed);
    std::vector<int32_t> specials, ordinary;
    for (int32_t id = 0; id < n; ++id) {
      if (allowed[id] != 0) (g_tokenizer->IsSpecial(id) ? specials : ordinary).push_back(id);
    }
    Check(!specials.empty() || !ordinary.empty(), "some token is allowed until the end");
    int32_t id;
    if (pos < choices.size()) {
      const uint8_t b = static_cast<uint8_t>(choices[pos++]);
      const bool special = ordinary.empty() || (b < 64 && !specials.empty());
      const std::vector<int32_t>& pool = special ? specials : ordinary;
      id = pool[b % pool.size()];
    } else if (allowed[g_ids.close] != 0) {
      id = g_ids.close;
    } else if (allowed[g_ids.sep] != 0) {
      id = g_ids.sep;
    } else {
      id = !ordinary.empty() ? ordinary[step % ordinary.size()] : specials[0];
    }
    Check(c->Permits(id), "Permits allows what Allowed allows");
    const int32_t other = static_cast<int32_t>((id * 7919 + step) % n);
    Check(c->Permits(other) == (allowed[other] != 0), "Permits agrees with Allowed");
    c->Accept(id);
    out.push_back(id);
  }
  if (!c->ended()) return 0;  // a long value: the walk ran out of steps
  Check(out.back() == g_ids.end_of_msg, "a finished call ends the message");
  auto parser = k3::OutputParser::Create(*g_tokenizer, k3::kParseInResponse);
  Check(parser.ok(), "the parser builds");
  std::vector<std::string> calls;
  for (int32_t id : out) {
    for (const k3::ChatEvent& e : parser->Feed(id)) {
      if (e.channel == k3::ChatChannel::kToolCall) calls.push_back(e.text);
    }
  }
  for (const k3::ChatEvent& e : parser->Finish()) {
    if (e.channel == k3::ChatChannel::kToolCall) calls.push_back(e.text);
  }
  Check(!calls.empty() && (!named || calls.size() == 1), "the calls the mode asks for");
  std::string text;
  for (int32_t id : out) text += g_tokenizer->TokenBytes(id);
  const bool typed = text.find("argument key=") != std::string::npos;
  if (typed && calls.size() > 1) return 0;  // the per-call form is not tracked past one call
  for (const std::string& call_text : calls) {
    const Json call = Json::parse(call_text, nullptr, false);
    Check(call.is_object() && call.value("name", "") == "f", "a call of the tool");
    const Json& args = call["arguments"];
    Check(args.is_object(), "the arguments are a JSON object");
    if (HasFloat(args)) continue;
    if (!typed) {
      // The json block's keys come in the order the model saw the tool declared: the renderer
      // key-sorts tool schemas (spec §6.2), and so does the spec the constraint is built from.
      const Json sorted = Json::parse(nlohmann::json::parse(params.dump()).dump());
      Check(Accepts(sorted, sorted, args.dump()), "the json block's arguments fit the schema");
      continue;
    }
    // The object's shape, read from the schema text (when the root is a plain object schema):
    // every required key, no undeclared key where none may be (additionalProperties false, or
    // absent beside declared properties: common/grammar closes such an object, as OpenAI strict).
    const Json props = params.value("properties", Json::object());
    const bool plain = props.is_object() && !params.contains("$ref") && !params.contains("anyOf") &&
                       !params.contains("oneOf") && !params.contains("allOf");
    if (plain) {
      for (const Json& r : params.value("required", Json::array())) {
        Check(!r.is_string() || args.contains(r.get<std::string>()), "every required key");
      }
      const Json additional = params.value("additionalProperties", Json(props.empty()));
      if (additional == false) {
        for (auto it = args.begin(); it != args.end(); ++it) {
          Check(props.contains(it.key()), "no undeclared key in a closed object");
        }
      }
    }
    // Each value again by its key's schema compiled alone (a `$ref` to the root would mean the
    // property there, not the parameters: not checked then).
    if (!plain || params.dump().find("\"$ref\"") != std::string::npos) continue;
    const Json additional = params.value("additionalProperties", Json(true));
    for (auto it = args.begin(); it != args.end(); ++it) {
      const Json& schema = props.contains(it.key()) ? props[it.key()] : additional;
      Check(Accepts(schema, params, it.value().dump()), "a typed value fits its key's schema");
    }
  }
  return 0;
}
