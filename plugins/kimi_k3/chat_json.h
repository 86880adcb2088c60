// plugins/kimi_k3/chat_json: JSON text exactly as Python's `json` module writes and reads it.
//
// Moonshot's XTML renderer (spec §6.2, §6.5) serialises tool declarations, response schemas and
// typed tool-call arguments with Python's `json.dumps`, so an engine that wants the vendor's token
// ids must reproduce that text byte for byte:
//
//   Json v = Json::parse(R"({"z": 1, "a": [1e5, -0.0, "é"]})");
//   PyJsonDumps(v, PyJsonStyle::kSpaced);         // {"z": 1, "a": [100000.0, -0.0, "é"]}
//   PyJsonDumps(v, PyJsonStyle::kCompactSorted);  // {"a":[100000.0,-0.0,"é"],"z":1}
//
// Floats use Python's repr (shortest round trip; exponent form below 1e-4 and from 1e16 on,
// e.g. `1e-07`, `1e+16`); integers stay integers; non-ASCII is kept (ensure_ascii=False); control
// characters are escaped as Python does. `ParsePyJson` reads JSON text as `json.loads` does,
// including the `NaN`, `Infinity` and `-Infinity` tokens, keeping object key order (a duplicated
// key keeps its first position and its last value).
#ifndef COLI_PLUGINS_KIMI_K3_CHAT_JSON_H_
#define COLI_PLUGINS_KIMI_K3_CHAT_JSON_H_

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace coli::k3 {

// Order-preserving JSON that keeps the integer/float distinction.
using Json = nlohmann::ordered_json;

enum class PyJsonStyle {
  kSpaced,         // json.dumps(v, ensure_ascii=False): ", " and ": ", keys in stored order
  kCompactSorted,  // json.dumps(deep_sort(v), ensure_ascii=False, separators=(",", ":"))
};

// Python's repr(float): "100000.0", "1e-07", "-0.0", "1.5e+300"; "NaN", "Infinity" and
// "-Infinity" for the non-finite values (json.dumps spelling).
std::string PyFloatRepr(double value);

// Serialises `value` as Python's json.dumps would. Never fails for a Json built by nlohmann
// (strings are expected to be UTF-8 already).
std::string PyJsonDumps(const Json& value, PyJsonStyle style);

// Appends `s`'s bytes as JSON string content without the quotes, escaped as json.dumps
// (ensure_ascii=False) and nlohmann's dump escape them: `"`, `\`, the short forms `\n \r \t \b
// \f`, other C0 controls as `\u00xx`, everything else as is. Byte by byte, so it commutes with
// any split of `s` (tokens may end inside a UTF-8 character).
void AppendJsonStringBody(std::string_view s, std::string* out);

// Parses `text` as Python's json.loads would (NaN/Infinity accepted). INVALID_ARGUMENT with the
// byte offset on malformed input. Integers outside int64/uint64 become floats (Python keeps big
// integers exact; that is the one documented difference).
absl::StatusOr<Json> ParsePyJson(std::string_view text);

// Concatenates strings, string_views and numbers. (Debian's Abseil has its own string_view, so
// absl::StrCat does not take std::string_view arguments; the chat code uses this instead.)
template <typename... Parts>
std::string Cat(const Parts&... parts) {
  std::string out;
  auto add = [&out](const auto& part) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(part)>>) {
      out += std::to_string(part);
    } else {
      out += std::string_view(part);
    }
  };
  (add(parts), ...);
  return out;
}

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CHAT_JSON_H_
