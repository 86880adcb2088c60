// plugin_api/cpp/switches: the environment switches a C++ family declares (ABI 1.8,
// coli_switch_t), built at compile time. The family returns them from Switches(); the table
// (plugin_table.h) hands the host pointers to them.
//
//   constexpr int64_t kBits[] = {4, 8, 32};
//   constexpr coli_switch_t kSwitches[] = {
//       abi::IntSwitch("MY_CHUNK", COLI_SWITCH_FIELD_CHUNK, 1, 512, "prefill chunk in tokens"),
//       abi::ChoiceSwitch("MY_BITS", COLI_SWITCH_FIELD_BITS, kBits, "weight bits"),
//       abi::ToExtra(abi::TextSwitch("MY_CACHE_DIR", "where the cache lives"), "cache_dir"),
//   };
//   static std::span<const coli_switch_t> Switches() { return kSwitches; }
#ifndef COLI_PLUGIN_API_CPP_SWITCHES_H_
#define COLI_PLUGIN_API_CPP_SWITCHES_H_

#include <cstdint>
#include <limits>

#include "plugin_api/coli_plugin.h"

namespace coli::abi {

constexpr coli_switch_t BaseSwitch(const char* name, int32_t field, int32_t kind,
                                   const char* help) {
  coli_switch_t s{};
  s.struct_size = sizeof(coli_switch_t);
  s.name = name;
  s.field = field;
  s.kind = kind;
  s.help = help;
  return s;
}

// A whole number in [lo, hi]; `expected`, when given, is what every refusal says it takes.
constexpr coli_switch_t IntSwitch(const char* name, int32_t field, int64_t lo, int64_t hi,
                                  const char* help, const char* expected = nullptr) {
  coli_switch_t s = BaseSwitch(name, field, COLI_SWITCH_INT, help);
  s.int_min = lo;
  s.int_max = hi;
  s.expected = expected;
  return s;
}

// One of `values` (any int32 text parses; the others are refused listing these).
template <size_t N>
constexpr coli_switch_t ChoiceSwitch(const char* name, int32_t field, const int64_t (&values)[N],
                                     const char* help) {
  coli_switch_t s = IntSwitch(name, field, std::numeric_limits<int32_t>::min(),
                              std::numeric_limits<int32_t>::max(), help);
  s.int_values = values;
  s.n_int_values = N;
  return s;
}

constexpr coli_switch_t BoolSwitch(const char* name, int32_t field, const char* help) {
  return BaseSwitch(name, field, COLI_SWITCH_BOOL, help);
}

// A finite number in [lo, hi], or (lo, hi] when `lo_exclusive` (`expected` then says what it
// takes when lo itself is given).
constexpr coli_switch_t RealSwitch(const char* name, int32_t field, double lo, double hi,
                                   const char* help, bool lo_exclusive = false,
                                   const char* expected = nullptr) {
  coli_switch_t s = BaseSwitch(name, field, COLI_SWITCH_REAL, help);
  s.real_min = lo;
  s.real_max = hi;
  s.real_min_exclusive = lo_exclusive ? 1 : 0;
  s.expected = expected;
  return s;
}

// Text passed as given (the family checks it); `values`, when given, says in listings what the
// family takes.
constexpr coli_switch_t TextSwitch(const char* name, int32_t field, const char* help,
                                   const char* values = nullptr) {
  coli_switch_t s = BaseSwitch(name, field, COLI_SWITCH_STRING, help);
  s.expected = values;
  return s;
}
constexpr coli_switch_t TextSwitch(const char* name, const char* help,
                                   const char* values = nullptr) {
  return TextSwitch(name, COLI_SWITCH_FIELD_EXTRA, help, values);
}

// ':' or ',' separated items (extra_dirs).
constexpr coli_switch_t ListSwitch(const char* name, int32_t field, const char* help) {
  return BaseSwitch(name, field, COLI_SWITCH_LIST, help);
}

// The same switch, its value sent as text under options.extra[key].
constexpr coli_switch_t ToExtra(coli_switch_t s, const char* key) {
  s.field = COLI_SWITCH_FIELD_EXTRA;
  s.extra_key = key;
  return s;
}

// The same switch as a default for the chat requests clients render (ABI 1.10): the value goes
// into each request lacking the top-level field `request_field`. Only for hosts of minor >= 10.
constexpr coli_switch_t ToRequestDefault(coli_switch_t s, const char* request_field) {
  s.field = COLI_SWITCH_FIELD_REQUEST;
  s.extra_key = request_field;
  return s;
}

}  // namespace coli::abi

#endif  // COLI_PLUGIN_API_CPP_SWITCHES_H_
