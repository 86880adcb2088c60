#include "host/model_options_env.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags/flags.h"
#include "common/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "nlohmann/json.hpp"

namespace coli::host {
namespace {

using google::protobuf::FieldDescriptor;

// The flags library's messages ("K3_CHUNK: '0' is outside [1, 512]"), said to be about the
// environment: the user never typed a flag of that name.
absl::Status FromEnvironment(const absl::Status& status) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", std::string(status.message())));
}

absl::Status Expected(const std::string& name, const std::string& value,
                      const std::string& wanted) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", name, "='", value, "': expected ", wanted));
}

// "4, 8 or 32".
std::string OneOf(const google::protobuf::RepeatedField<int64_t>& values) {
  std::string out;
  for (int i = 0; i < values.size(); ++i) {
    if (i > 0) out += i + 1 == values.size() ? " or " : ", ";
    absl::StrAppend(&out, values[i]);
  }
  return out;
}

std::string Real(double x) { return absl::StrCat(x); }

const FieldDescriptor* FieldOf(int number) {
  return v1::ModelOptions::descriptor()->FindFieldByNumber(number);
}

bool ValidName(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return !(name[0] >= '0' && name[0] <= '9');
}

// Whether `kind` can set `field` (every kind but LIST can travel in `extra` as text, or be a
// request default).
absl::Status CheckKindSuitsField(const v1::ModelSwitch& s) {
  if (s.field() == COLI_SWITCH_FIELD_EXTRA || s.field() == COLI_SWITCH_FIELD_REQUEST) {
    if (s.extra_key().empty()) {
      return absl::FailedPreconditionError(s.field() == COLI_SWITCH_FIELD_EXTRA
                                               ? "names no extra key"
                                               : "names no request field (extra_key)");
    }
    if (s.kind() == COLI_SWITCH_LIST) {
      return absl::FailedPreconditionError("a list can only set extra_dirs");
    }
    return absl::OkStatus();
  }
  const FieldDescriptor* f = FieldOf(s.field());
  if (f == nullptr || s.field() > COLI_SWITCH_FIELD_EXTRA) {
    return absl::FailedPreconditionError(absl::StrCat("sets unknown field ", s.field()));
  }
  bool suits = false;
  switch (s.kind()) {
    case COLI_SWITCH_INT:
      suits = !f->is_repeated() && (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ||
                                    f->cpp_type() == FieldDescriptor::CPPTYPE_INT64);
      break;
    case COLI_SWITCH_BOOL:
      suits = !f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL;
      break;
    case COLI_SWITCH_REAL:
      suits = !f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE;
      break;
    case COLI_SWITCH_STRING:
      suits = !f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
      break;
    case COLI_SWITCH_LIST:
      suits = f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
      break;
    default:
      return absl::FailedPreconditionError(absl::StrCat("has unknown kind ", s.kind()));
  }
  if (!suits) {
    return absl::FailedPreconditionError(
        absl::StrCat("kind ", s.kind(), " cannot set field '", f->name(), "'"));
  }
  if (s.kind() == COLI_SWITCH_INT && f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 &&
      (s.int_min() < std::numeric_limits<int32_t>::min() ||
       s.int_max() > std::numeric_limits<int32_t>::max())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "range [", s.int_min(), ", ", s.int_max(), "] does not fit int32 field '", f->name(), "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const v1::ModelSwitch& s) {
  if (s.kind() == COLI_SWITCH_INT) {
    if (s.int_min() > s.int_max()) return absl::FailedPreconditionError("empty integer range");
    for (int64_t v : s.int_values()) {
      if (v < s.int_min() || v > s.int_max()) {
        return absl::FailedPreconditionError(absl::StrCat("allowed value ", v, " is outside [",
                                                          s.int_min(), ", ", s.int_max(), "]"));
      }
    }
  }
  if (s.kind() == COLI_SWITCH_REAL &&
      !(std::isfinite(s.real_min()) && std::isfinite(s.real_max()) &&
        (s.real_min() < s.real_max() ||
         (s.real_min() == s.real_max() && !s.real_min_exclusive())))) {
    return absl::FailedPreconditionError("empty or infinite real range");
  }
  return absl::OkStatus();
}

// Same meaning: everything but who declares it and its help line.
bool SameMeaning(const v1::ModelSwitch& a, const v1::ModelSwitch& b) {
  v1::ModelSwitch x = a, y = b;
  x.clear_family();
  x.clear_help();
  y.clear_family();
  y.clear_help();
  return google::protobuf::util::MessageDifferencer::Equals(x, y);
}

std::string Who(const v1::ModelSwitch& s) {
  return s.family().empty() ? std::string("coli-host") : absl::StrCat("family ", s.family());
}

bool IsRequestDefault(const v1::ModelSwitch& s) { return s.field() == COLI_SWITCH_FIELD_REQUEST; }

// Checks `value` against `s` and writes it into `o`, or into `request` for a request default.
absl::Status Apply(const v1::ModelSwitch& s, const std::string& value, v1::ModelOptions* o,
                   nlohmann::json* request) {
  const std::string& name = s.name();
  const google::protobuf::Reflection* r = o->GetReflection();
  const bool typed = s.field() != COLI_SWITCH_FIELD_EXTRA && !IsRequestDefault(s);
  const FieldDescriptor* f = typed ? FieldOf(s.field()) : nullptr;
  nlohmann::json typed_value = value;  // what a request default carries
  switch (s.kind()) {
    case COLI_SWITCH_INT: {
      absl::StatusOr<int64_t> n = flags::ParseWholeNumber(name, value, s.int_min(), s.int_max());
      if (!n.ok()) {
        return s.expected().empty() ? FromEnvironment(n.status())
                                    : Expected(name, value, s.expected());
      }
      if (!s.int_values().empty() &&
          std::find(s.int_values().begin(), s.int_values().end(), *n) == s.int_values().end()) {
        return Expected(name, value, s.expected().empty() ? OneOf(s.int_values()) : s.expected());
      }
      if (f != nullptr && f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
        r->SetInt32(o, f, static_cast<int32_t>(*n));
      } else if (f != nullptr) {
        r->SetInt64(o, f, *n);
      }
      typed_value = *n;
      break;
    }
    case COLI_SWITCH_BOOL:
      if (value != "0" && value != "1") {
        return Expected(name, value, s.expected().empty() ? "0 or 1" : s.expected());
      }
      if (f != nullptr) r->SetBool(o, f, value == "1");
      typed_value = value == "1";
      break;
    case COLI_SWITCH_REAL: {
      // Finite and in range: nan passed every `x < lo || x > hi` check downstream.
      absl::StatusOr<double> x = flags::ParseRealNumber(name, value, s.real_min(), s.real_max());
      if (!x.ok()) return FromEnvironment(x.status());
      if (s.real_min_exclusive() && *x == s.real_min()) {
        return Expected(name, value,
                        s.expected().empty() ? absl::StrCat("a value above ", Real(s.real_min()))
                                             : s.expected());
      }
      if (f != nullptr) r->SetDouble(o, f, *x);
      typed_value = *x;
      break;
    }
    case COLI_SWITCH_STRING:
      if (f != nullptr) r->SetString(o, f, value);
      break;
    case COLI_SWITCH_LIST:
      for (absl::string_view item :
           absl::StrSplit(value, absl::ByAnyChar(":,"), absl::SkipEmpty())) {
        r->AddString(o, f, std::string(item));
      }
      break;
    default:
      return absl::InternalError(absl::StrCat("switch ", name, ": unknown kind ", s.kind()));
  }
  // Family-only switches travel by name in `extra`, as given; only set ones are sent (other
  // families refuse keys they do not know).
  if (s.field() == COLI_SWITCH_FIELD_EXTRA) (*o->mutable_extra())[s.extra_key()] = value;
  if (IsRequestDefault(s)) (*request)[s.extra_key()] = std::move(typed_value);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EnvironmentValues> ReadEnvironment(std::span<const v1::ModelSwitch> switches,
                                                  const EnvLookup& getenv) {
  EnvironmentValues values;
  std::map<std::string, const v1::ModelSwitch*> first;  // by name: the declaration applied
  for (const v1::ModelSwitch& s : switches) {
    const char* v = getenv(s.name().c_str());
    if (v == nullptr || *v == '\0') continue;
    const std::string value = v;
    auto [it, fresh] = first.emplace(s.name(), &s);
    if (!fresh) {
      if (SameMeaning(*it->second, s)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", s.name(), "='", value, "': declared differently by ",
          Who(*it->second), " (", SwitchTarget(*it->second), ", ", SwitchValues(*it->second),
          ") and ", Who(s), " (", SwitchTarget(s), ", ", SwitchValues(s), ")"));
    }
    COLI_RETURN_IF_ERROR(Apply(s, value, &values.options, &values.request));
  }
  return values;
}

const std::vector<v1::ModelSwitch>& HostSwitches() {
  static const std::vector<v1::ModelSwitch> switches = [] {
    v1::ModelSwitch threads;
    threads.set_name("COLI_THREADS");
    threads.set_field(COLI_SWITCH_FIELD_THREADS);
    threads.set_kind(COLI_SWITCH_INT);
    threads.set_int_min(0);
    threads.set_int_max(1024);
    threads.set_help("compute threads of the model (0 = all cores)");
    return std::vector<v1::ModelSwitch>{threads};
  }();
  return switches;
}

absl::StatusOr<v1::ModelSwitch> SwitchFromAbi(const coli_switch_t& declared,
                                              std::string_view family) {
  const std::string who = absl::StrCat("family ", std::string(family), ": switch ");
  if (declared.struct_size < COLI_SWITCH_SIZE_V1_8) {
    return absl::FailedPreconditionError(absl::StrCat(who, "struct_size ", declared.struct_size,
                                                      " is smaller than ABI 1.8 needs (",
                                                      COLI_SWITCH_SIZE_V1_8, " bytes)"));
  }
  const std::string name = declared.name != nullptr ? declared.name : "";
  if (!ValidName(name)) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, "'", name, "': a variable name is [A-Z_][A-Z0-9_]*"));
  }
  v1::ModelSwitch s;
  s.set_name(name);
  s.set_family(std::string(family));
  s.set_field(declared.field);
  s.set_kind(declared.kind);
  if (declared.extra_key != nullptr) s.set_extra_key(declared.extra_key);
  s.set_int_min(declared.int_min);
  s.set_int_max(declared.int_max);
  if (declared.int_values != nullptr) {
    s.mutable_int_values()->Add(declared.int_values, declared.int_values + declared.n_int_values);
  } else if (declared.n_int_values != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, name, ": n_int_values ", declared.n_int_values, " with no values"));
  }
  s.set_real_min(declared.real_min);
  s.set_real_max(declared.real_max);
  s.set_real_min_exclusive(declared.real_min_exclusive != 0);
  if (declared.expected != nullptr) s.set_expected(declared.expected);
  if (declared.help != nullptr) s.set_help(declared.help);
  for (absl::Status status : {CheckKindSuitsField(s), CheckRange(s)}) {
    if (!status.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(who, name, ": ", status.message()));
    }
  }
  return s;
}

std::vector<v1::ModelSwitch> WithHostSwitches(std::span<const v1::ModelSwitch> family_switches) {
  std::vector<v1::ModelSwitch> all = HostSwitches();
  all.insert(all.end(), family_switches.begin(), family_switches.end());
  return all;
}

absl::StatusOr<EnvironmentValues> ReadEnvironment(std::span<const v1::ModelSwitch> switches) {
  return ReadEnvironment(switches, [](const char* name) { return std::getenv(name); });
}

absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(std::span<const v1::ModelSwitch> switches,
                                                     const EnvLookup& getenv) {
  COLI_ASSIGN_OR_RETURN(EnvironmentValues values, ReadEnvironment(switches, getenv));
  return std::move(values.options);
}

absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(std::span<const v1::ModelSwitch> switches) {
  return ModelOptionsFromEnv(switches, [](const char* name) { return std::getenv(name); });
}

std::string SwitchValues(const v1::ModelSwitch& s) {
  switch (s.kind()) {
    case COLI_SWITCH_INT: {
      if (!s.int_values().empty()) return OneOf(s.int_values());
      const bool open = s.int_max() >= std::numeric_limits<int32_t>::max();
      return open ? absl::StrCat(s.int_min(), " or more")
                  : absl::StrCat(s.int_min(), "…", s.int_max());
    }
    case COLI_SWITCH_BOOL:
      return "0 or 1";
    case COLI_SWITCH_REAL:
      return absl::StrCat(s.real_min_exclusive() ? "(" : "[", Real(s.real_min()), ", ",
                          Real(s.real_max()), "]");
    case COLI_SWITCH_STRING:
      return s.expected().empty() ? "text" : s.expected();
    case COLI_SWITCH_LIST:
      return s.expected().empty() ? "list (':' or ',')" : s.expected();
  }
  return "?";
}

std::string SwitchTarget(const v1::ModelSwitch& s) {
  if (s.field() == COLI_SWITCH_FIELD_EXTRA) return absl::StrCat("extra[", s.extra_key(), "]");
  if (IsRequestDefault(s)) return absl::StrCat("request[", s.extra_key(), "]");
  const FieldDescriptor* f = FieldOf(s.field());
  return f != nullptr ? std::string(f->name()) : absl::StrCat("field ", s.field());
}

std::string SwitchListing(std::span<const v1::ModelSwitch> switches) {
  // Columns, not bytes: "…" is three bytes and one column.
  auto columns = [](std::string_view text) {
    size_t n = 0;
    for (unsigned char c : text) n += (c & 0xC0) != 0x80;
    return n;
  };
  size_t name_width = 8, values_width = 6;
  for (const v1::ModelSwitch& s : switches) {
    name_width = std::max(name_width, columns(s.name()));
    values_width = std::max(values_width, columns(SwitchValues(s)));
  }
  auto pad = [&columns](std::string text, size_t width) {
    if (const size_t n = columns(text); n < width) text.append(width - n, ' ');
    return text;
  };
  std::string out = absl::StrCat(pad("VARIABLE", name_width), "  ", pad("VALUES", values_width),
                                 "  FAMILY: SETS — HELP\n");
  for (const v1::ModelSwitch& s : switches) {
    absl::StrAppend(&out, pad(s.name(), name_width), "  ", pad(SwitchValues(s), values_width), "  ",
                    s.family().empty() ? "coli-host" : s.family(), ": ", SwitchTarget(s),
                    s.help().empty() ? "" : " — ", s.help(), "\n");
  }
  return out;
}

}  // namespace coli::host
