// common/json: thin, non-throwing helpers over nlohmann_json with the JSON path in every error.
//
//   COLI_ASSIGN_OR_RETURN(nlohmann::json doc, coli::json::Parse(text, "config.json"));
//   coli::json::Cursor cfg = coli::json::Cursor::Root(doc, "config.json");
//   COLI_ASSIGN_OR_RETURN(coli::json::Cursor text, cfg.Object("text_config"));
//   COLI_ASSIGN_OR_RETURN(int64_t hidden, text.Int("hidden_size"));
//   COLI_ASSIGN_OR_RETURN(std::vector<int64_t> kda, text.Object("linear_attn_config")
//                                                      ->IntArray("kda_layers"));
//   // error: "config.json: text_config.linear_attn_config.kda_layers[3]: expected integer,
//   //         got string"
//
// Parse() also refuses what nlohmann silently accepts: duplicate object keys (the last one
// would win) and nesting deeper than kMaxDepth. Nothing here throws; every nlohmann call that
// can throw is wrapped.
#ifndef COLI_COMMON_JSON_JSON_H_
#define COLI_COMMON_JSON_JSON_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace coli::json {

// Deepest nesting of arrays/objects Parse() accepts (model configs need < 10).
inline constexpr int kMaxDepth = 128;

// Parses `text` as one JSON value. Errors are INVALID_ARGUMENT and read
// "<source_name>: line L, column C: <what>" (source_name is usually the file name; may be
// empty). Duplicate keys are refused with their path ("weight_map[\"a.b\"]: duplicate key").
absl::StatusOr<nlohmann::json> Parse(std::string_view text, std::string_view source_name = "");

// "string", "integer", "number", "boolean", "null", "object", "array" (for messages).
std::string_view TypeName(const nlohmann::json& value);

// Appends one object key to a path: `a` + `b` -> "a.b"; keys that are not plain identifiers
// are quoted: `weight_map` + `model.norm` -> "weight_map[\"model.norm\"]".
std::string JoinKey(std::string_view path, std::string_view key);
// Appends one array index: `kda_layers` + 3 -> "kda_layers[3]".
std::string JoinIndex(std::string_view path, size_t index);

// A read-only position inside a parsed document that remembers its path. It borrows the
// document: the nlohmann::json it was made from must outlive it. Cheap to copy.
//
// Every getter returns INVALID_ARGUMENT naming the full path ("<source>: <path>: ...") when
// the key is missing (required getters) or the value has the wrong type or range. Optional
// getters treat a missing key and JSON null alike.
class Cursor {
 public:
  // The document root; `source` (a file name, may be empty) prefixes every error message.
  static Cursor Root(const nlohmann::json& doc, std::string source = "");

  const nlohmann::json& value() const { return *value_; }
  // The path from the root, e.g. "text_config.linear_attn_config" ("" at the root).
  const std::string& path() const { return path_; }
  const std::string& source() const { return source_; }

  bool is_object() const { return value_->is_object(); }
  bool is_array() const { return value_->is_array(); }
  bool is_null() const { return value_->is_null(); }
  // True when this is an object holding `key` (with any value, null included).
  bool Has(std::string_view key) const;

  // An error naming this position: "<source>: <path>: <message>".
  absl::Status Error(std::string_view message) const;

  // This value itself, converted. Integers must be JSON integers within int64 range;
  // Double accepts integers and floats; Bool accepts only true/false.
  absl::StatusOr<int64_t> AsInt() const;
  absl::StatusOr<double> AsDouble() const;
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<std::string> AsString() const;
  absl::StatusOr<std::vector<int64_t>> AsIntArray() const;
  absl::StatusOr<std::vector<double>> AsDoubleArray() const;
  absl::StatusOr<std::vector<std::string>> AsStringArray() const;

  // Members of an object (this must be an object). Required: missing key is an error.
  absl::StatusOr<Cursor> Member(std::string_view key) const;  // any type
  absl::StatusOr<Cursor> Object(std::string_view key) const;
  absl::StatusOr<Cursor> Array(std::string_view key) const;
  absl::StatusOr<int64_t> Int(std::string_view key) const;
  absl::StatusOr<double> Double(std::string_view key) const;
  absl::StatusOr<bool> Bool(std::string_view key) const;
  absl::StatusOr<std::string> String(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> IntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> DoubleArray(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> StringArray(std::string_view key) const;

  // Optional members: std::nullopt when missing or null; an error when present with the
  // wrong type.
  absl::StatusOr<std::optional<Cursor>> OptionalMember(std::string_view key) const;
  absl::StatusOr<std::optional<Cursor>> OptionalObject(std::string_view key) const;
  absl::StatusOr<std::optional<int64_t>> OptionalInt(std::string_view key) const;
  absl::StatusOr<std::optional<double>> OptionalDouble(std::string_view key) const;
  absl::StatusOr<std::optional<bool>> OptionalBool(std::string_view key) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view key) const;
  absl::StatusOr<std::optional<std::vector<int64_t>>> OptionalIntArray(std::string_view key) const;

  // Optional members with a default for the missing/null case.
  absl::StatusOr<int64_t> IntOr(std::string_view key, int64_t fallback) const;
  absl::StatusOr<double> DoubleOr(std::string_view key, double fallback) const;
  absl::StatusOr<bool> BoolOr(std::string_view key, bool fallback) const;
  absl::StatusOr<std::string> StringOr(std::string_view key, std::string_view fallback) const;

  // Elements of an array (this must be an array).
  absl::StatusOr<size_t> Size() const;
  absl::StatusOr<Cursor> At(size_t index) const;
  absl::StatusOr<std::vector<Cursor>> Elements() const;

  // The keys of an object in document order (nlohmann::json keeps them sorted).
  absl::StatusOr<std::vector<std::string>> Keys() const;

  // This must be an object whose every key is in `allowed`; otherwise INVALID_ARGUMENT
  // naming the path of the first unknown key (in key order), e.g.
  // "config.json: text_config.rope_scalling: unknown key".
  absl::Status CheckKeys(std::span<const std::string_view> allowed) const;
  absl::Status CheckKeys(std::initializer_list<std::string_view> allowed) const;

 private:
  Cursor(const nlohmann::json* value, std::string path, std::string source)
      : value_(value), path_(std::move(path)), source_(std::move(source)) {}
  Cursor Child(const nlohmann::json* value, std::string path) const {
    return Cursor(value, std::move(path), source_);
  }
  absl::Status ExpectType(std::string_view expected) const;
  absl::StatusOr<const nlohmann::json*> Lookup(std::string_view key) const;

  const nlohmann::json* value_;
  std::string path_;
  std::string source_;
};

}  // namespace coli::json

#endif  // COLI_COMMON_JSON_JSON_H_
