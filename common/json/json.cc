#include "common/json/json.h"

#include <cctype>
#include <exception>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/cat.h"

namespace coli::json {

using ::coli::internal_cat::Cat;
namespace {

using Json = nlohmann::json;

// Thrown from the parser callback to stop parsing early; never leaves this file.
struct StopParse {};

// Tracks where the parser is, so duplicate keys and excessive depth can be reported with
// their path. nlohmann calls the callback in document order.
class PathTracker {
 public:
  bool OnEvent(Json::parse_event_t event, const Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (frames_.size() >= static_cast<size_t>(kMaxDepth)) {
          error_ = Cat("nesting deeper than ", kMaxDepth, " levels");
          throw StopParse{};
        }
        frames_.push_back(Frame{event == Json::parse_event_t::object_start, {}, {}, 0});
        break;
      case Json::parse_event_t::key: {
        Frame& top = frames_.back();
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!top.keys.insert(key).second) {
          error_ = Cat(JoinKey(ContainerPath(), key), ": duplicate key \"", key, "\"");
          throw StopParse{};
        }
        top.last_key = key;
        break;
      }
      case Json::parse_event_t::value:
        if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().index;
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().index;
        break;
    }
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string> keys;
    std::string last_key;
    size_t index;
  };
  // Path of the innermost open container (the one whose content is being parsed).
  std::string ContainerPath() const {
    std::string path;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      path = frames_[i].is_object ? JoinKey(path, frames_[i].last_key)
                                  : JoinIndex(path, frames_[i].index);
    }
    return path;
  }

  std::vector<Frame> frames_;
  std::string error_;
};

bool IsIdentifier(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string Prefixed(std::string_view source, std::string_view rest) {
  return source.empty() ? std::string(rest) : Cat(source, ": ", rest);
}

}  // namespace

absl::StatusOr<Json> Parse(std::string_view text, std::string_view source_name) {
  PathTracker tracker;
  Json::parser_callback_t callback = [&tracker](int /*depth*/, Json::parse_event_t event,
                                                Json& parsed) {
    return tracker.OnEvent(event, parsed);
  };
  try {
    return Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const StopParse&) {
    return absl::InvalidArgumentError(Prefixed(source_name, tracker.error()));
  } catch (const Json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    std::string_view what = e.what();
    if (size_t pos = what.find("] "); pos != std::string_view::npos) what.remove_prefix(pos + 2);
    return absl::InvalidArgumentError(Prefixed(source_name, what));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(Prefixed(source_name, Cat("invalid JSON: ", e.what())));
  }
}

std::string_view TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::string:
      return "string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    default:
      return "binary";
  }
}

std::string JoinKey(std::string_view path, std::string_view key) {
  if (IsIdentifier(key)) return path.empty() ? std::string(key) : Cat(path, ".", key);
  return Cat(path, "[\"", key, "\"]");
}

std::string JoinIndex(std::string_view path, size_t index) { return Cat(path, "[", index, "]"); }

Cursor Cursor::Root(const Json& doc, std::string source) {
  return Cursor(&doc, "", std::move(source));
}

bool Cursor::Has(std::string_view key) const {
  return value_->is_object() && value_->find(key) != value_->end();
}

absl::Status Cursor::Error(std::string_view message) const {
  // At the root the source alone names the place ("config.json: expected object ...").
  if (path_.empty()) {
    return absl::InvalidArgumentError(source_.empty() ? Cat("(root): ", message)
                                                      : Prefixed(source_, message));
  }
  return absl::InvalidArgumentError(Prefixed(source_, Cat(path_, ": ", message)));
}

absl::Status Cursor::ExpectType(std::string_view expected) const {
  return Error(Cat("expected ", expected, ", got ", TypeName(*value_)));
}

absl::StatusOr<int64_t> Cursor::AsInt() const {
  if (value_->is_number_unsigned()) {
    uint64_t v = value_->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(Cat("integer ", v, " is out of range"));
    }
    return static_cast<int64_t>(v);
  }
  if (value_->is_number_integer()) return value_->get<int64_t>();
  return ExpectType("integer");
}

absl::StatusOr<double> Cursor::AsDouble() const {
  if (value_->is_number()) return value_->get<double>();
  return ExpectType("number");
}

absl::StatusOr<bool> Cursor::AsBool() const {
  if (value_->is_boolean()) return value_->get<bool>();
  return ExpectType("boolean");
}

absl::StatusOr<std::string> Cursor::AsString() const {
  if (value_->is_string()) return value_->get<std::string>();
  return ExpectType("string");
}

namespace {
template <typename T, typename Fn>
absl::StatusOr<std::vector<T>> ConvertArray(const Cursor& array, Fn convert) {
  if (!array.is_array()) {
    return array.Error(Cat("expected array, got ", TypeName(array.value())));
  }
  std::vector<T> out;
  out.reserve(array.value().size());
  for (size_t i = 0; i < array.value().size(); ++i) {
    absl::StatusOr<Cursor> element = array.At(i);
    if (!element.ok()) return element.status();
    absl::StatusOr<T> v = convert(*element);
    if (!v.ok()) return v.status();
    out.push_back(std::move(*v));
  }
  return out;
}
}  // namespace

absl::StatusOr<std::vector<int64_t>> Cursor::AsIntArray() const {
  return ConvertArray<int64_t>(*this, [](const Cursor& c) { return c.AsInt(); });
}
absl::StatusOr<std::vector<double>> Cursor::AsDoubleArray() const {
  return ConvertArray<double>(*this, [](const Cursor& c) { return c.AsDouble(); });
}
absl::StatusOr<std::vector<std::string>> Cursor::AsStringArray() const {
  return ConvertArray<std::string>(*this, [](const Cursor& c) { return c.AsString(); });
}

absl::StatusOr<const Json*> Cursor::Lookup(std::string_view key) const {
  if (!value_->is_object()) return ExpectType("object");
  auto it = value_->find(key);
  if (it == value_->end()) return nullptr;
  return &*it;
}

absl::StatusOr<Cursor> Cursor::Member(std::string_view key) const {
  absl::StatusOr<const Json*> found = Lookup(key);
  if (!found.ok()) return found.status();
  if (*found == nullptr) {
    return Child(value_, JoinKey(path_, key)).Error("required key is missing");
  }
  return Child(*found, JoinKey(path_, key));
}

absl::StatusOr<std::optional<Cursor>> Cursor::OptionalMember(std::string_view key) const {
  absl::StatusOr<const Json*> found = Lookup(key);
  if (!found.ok()) return found.status();
  if (*found == nullptr || (*found)->is_null()) return std::optional<Cursor>();
  return std::optional<Cursor>(Child(*found, JoinKey(path_, key)));
}

namespace {
// Required getter: Member(key) then a conversion.
template <typename T, typename Fn>
absl::StatusOr<T> Required(const Cursor& c, std::string_view key, Fn convert) {
  absl::StatusOr<Cursor> member = c.Member(key);
  if (!member.ok()) return member.status();
  return convert(*member);
}
// Optional getter: OptionalMember(key) then a conversion when present.
template <typename T, typename Fn>
absl::StatusOr<std::optional<T>> Optional(const Cursor& c, std::string_view key, Fn convert) {
  absl::StatusOr<std::optional<Cursor>> member = c.OptionalMember(key);
  if (!member.ok()) return member.status();
  if (!member->has_value()) return std::optional<T>();
  absl::StatusOr<T> v = convert(**member);
  if (!v.ok()) return v.status();
  return std::optional<T>(std::move(*v));
}
template <typename T>
absl::StatusOr<T> OrDefault(absl::StatusOr<std::optional<T>> v, T fallback) {
  if (!v.ok()) return v.status();
  return v->has_value() ? std::move(**v) : std::move(fallback);
}
}  // namespace

absl::StatusOr<Cursor> Cursor::Object(std::string_view key) const {
  return Required<Cursor>(*this, key, [](const Cursor& c) -> absl::StatusOr<Cursor> {
    if (!c.is_object()) return c.ExpectType("object");
    return c;
  });
}
absl::StatusOr<Cursor> Cursor::Array(std::string_view key) const {
  return Required<Cursor>(*this, key, [](const Cursor& c) -> absl::StatusOr<Cursor> {
    if (!c.is_array()) return c.ExpectType("array");
    return c;
  });
}
absl::StatusOr<int64_t> Cursor::Int(std::string_view key) const {
  return Required<int64_t>(*this, key, [](const Cursor& c) { return c.AsInt(); });
}
absl::StatusOr<double> Cursor::Double(std::string_view key) const {
  return Required<double>(*this, key, [](const Cursor& c) { return c.AsDouble(); });
}
absl::StatusOr<bool> Cursor::Bool(std::string_view key) const {
  return Required<bool>(*this, key, [](const Cursor& c) { return c.AsBool(); });
}
absl::StatusOr<std::string> Cursor::String(std::string_view key) const {
  return Required<std::string>(*this, key, [](const Cursor& c) { return c.AsString(); });
}
absl::StatusOr<std::vector<int64_t>> Cursor::IntArray(std::string_view key) const {
  return Required<std::vector<int64_t>>(*this, key, [](const Cursor& c) { return c.AsIntArray(); });
}
absl::StatusOr<std::vector<double>> Cursor::DoubleArray(std::string_view key) const {
  return Required<std::vector<double>>(*this, key,
                                       [](const Cursor& c) { return c.AsDoubleArray(); });
}
absl::StatusOr<std::vector<std::string>> Cursor::StringArray(std::string_view key) const {
  return Required<std::vector<std::string>>(*this, key,
                                            [](const Cursor& c) { return c.AsStringArray(); });
}

absl::StatusOr<std::optional<Cursor>> Cursor::OptionalObject(std::string_view key) const {
  return Optional<Cursor>(*this, key, [](const Cursor& c) -> absl::StatusOr<Cursor> {
    if (!c.is_object()) return c.ExpectType("object");
    return c;
  });
}
absl::StatusOr<std::optional<int64_t>> Cursor::OptionalInt(std::string_view key) const {
  return Optional<int64_t>(*this, key, [](const Cursor& c) { return c.AsInt(); });
}
absl::StatusOr<std::optional<double>> Cursor::OptionalDouble(std::string_view key) const {
  return Optional<double>(*this, key, [](const Cursor& c) { return c.AsDouble(); });
}
absl::StatusOr<std::optional<bool>> Cursor::OptionalBool(std::string_view key) const {
  return Optional<bool>(*this, key, [](const Cursor& c) { return c.AsBool(); });
}
absl::StatusOr<std::optional<std::string>> Cursor::OptionalString(std::string_view key) const {
  return Optional<std::string>(*this, key, [](const Cursor& c) { return c.AsString(); });
}
absl::StatusOr<std::optional<std::vector<int64_t>>> Cursor::OptionalIntArray(
    std::string_view key) const {
  return Optional<std::vector<int64_t>>(*this, key, [](const Cursor& c) { return c.AsIntArray(); });
}

absl::StatusOr<int64_t> Cursor::IntOr(std::string_view key, int64_t fallback) const {
  return OrDefault(OptionalInt(key), fallback);
}
absl::StatusOr<double> Cursor::DoubleOr(std::string_view key, double fallback) const {
  return OrDefault(OptionalDouble(key), fallback);
}
absl::StatusOr<bool> Cursor::BoolOr(std::string_view key, bool fallback) const {
  return OrDefault(OptionalBool(key), fallback);
}
absl::StatusOr<std::string> Cursor::StringOr(std::string_view key,
                                             std::string_view fallback) const {
  return OrDefault(OptionalString(key), std::string(fallback));
}

absl::StatusOr<size_t> Cursor::Size() const {
  if (!value_->is_array()) return ExpectType("array");
  return value_->size();
}

absl::StatusOr<Cursor> Cursor::At(size_t index) const {
  if (!value_->is_array()) return ExpectType("array");
  if (index >= value_->size()) {
    return Error(Cat("index ", index, " out of range (size ", value_->size(), ")"));
  }
  return Child(&(*value_)[index], JoinIndex(path_, index));
}

absl::StatusOr<std::vector<Cursor>> Cursor::Elements() const {
  if (!value_->is_array()) return ExpectType("array");
  std::vector<Cursor> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) {
    out.push_back(Child(&(*value_)[i], JoinIndex(path_, i)));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> Cursor::Keys() const {
  if (!value_->is_object()) return ExpectType("object");
  std::vector<std::string> keys;
  keys.reserve(value_->size());
  for (auto it = value_->begin(); it != value_->end(); ++it) keys.push_back(it.key());
  return keys;
}

absl::Status Cursor::CheckKeys(std::span<const std::string_view> allowed) const {
  if (!value_->is_object()) return ExpectType("object");
  for (auto it = value_->begin(); it != value_->end(); ++it) {
    bool known = false;
    for (std::string_view a : allowed) known = known || a == it.key();
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return Child(&it.value(), JoinKey(path_, it.key()))
          .Error(Cat("unknown key (allowed: ", list, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Cursor::CheckKeys(std::initializer_list<std::string_view> allowed) const {
  return CheckKeys(std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

}  // namespace coli::json
