// Python-compatible JSON writing and reading for the XTML renderer (see chat_json.h).
#include "plugins/kimi_k3/chat_json.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace coli::k3 {

void AppendJsonStringBody(std::string_view s, std::string* out) {
  for (unsigned char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
}

namespace {

void AppendPyString(std::string_view s, std::string* out) {
  out->push_back('"');
  AppendJsonStringBody(s, out);
  out->push_back('"');
}

void Dump(const Json& v, PyJsonStyle style, std::string* out) {
  const bool spaced = style == PyJsonStyle::kSpaced;
  const char* item_sep = spaced ? ", " : ",";
  const char* key_sep = spaced ? ": " : ":";
  switch (v.type()) {
    case Json::value_t::null: out->append("null"); return;
    case Json::value_t::boolean: out->append(v.get<bool>() ? "true" : "false"); return;
    case Json::value_t::number_integer: out->append(std::to_string(v.get<int64_t>())); return;
    case Json::value_t::number_unsigned: out->append(std::to_string(v.get<uint64_t>())); return;
    case Json::value_t::number_float: out->append(PyFloatRepr(v.get<double>())); return;
    case Json::value_t::string: AppendPyString(v.get_ref<const std::string&>(), out); return;
    case Json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out->append(item_sep);
        first = false;
        Dump(item, style, out);
      }
      out->push_back(']');
      return;
    }
    case Json::value_t::object: {
      std::vector<std::pair<const std::string*, const Json*>> items;
      for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(&it.key(), &it.value());
      if (style == PyJsonStyle::kCompactSorted) {
        // Python sorts str keys by code point; UTF-8 byte order is the same order.
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return *a.first < *b.first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto& [key, value] : items) {
        if (!first) out->append(item_sep);
        first = false;
        AppendPyString(*key, out);
        out->append(key_sep);
        Dump(*value, style, out);
      }
      out->push_back('}');
      return;
    }
    case Json::value_t::binary:
    case Json::value_t::discarded:
      out->append("null");
      return;
  }
}

// A recursive-descent reader of Python's json.loads grammar.
class PyJsonReader {
 public:
  explicit PyJsonReader(std::string_view text) : s_(text) {}

  absl::StatusOr<Json> ReadDocument() {
    SkipWs();
    Json value;
    if (!ReadValue(0, &value)) return Error();
    SkipWs();
    if (pos_ != s_.size()) {
      error_ = "extra data";
      return Error();
    }
    return value;
  }

 private:
  static constexpr int kMaxDepth = 512;

  absl::Status Error() const {
    return absl::InvalidArgumentError(Cat("invalid JSON at byte ", pos_, ": ", error_));
  }
  bool Fail(const char* what) {
    error_ = what;
    return false;
  }
  void SkipWs() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool ReadValue(int depth, Json* out) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    if (pos_ >= s_.size()) return Fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return ReadObject(depth, out);
    if (c == '[') return ReadArray(depth, out);
    if (c == '"') {
      std::string str;
      if (!ReadString(&str)) return false;
      *out = std::move(str);
      return true;
    }
    if (Literal("null")) { *out = nullptr; return true; }
    if (Literal("true")) { *out = true; return true; }
    if (Literal("false")) { *out = false; return true; }
    if (Literal("NaN")) { *out = std::numeric_limits<double>::quiet_NaN(); return true; }
    if (Literal("Infinity")) { *out = std::numeric_limits<double>::infinity(); return true; }
    if (Literal("-Infinity")) { *out = -std::numeric_limits<double>::infinity(); return true; }
    return ReadNumber(out);
  }

  bool ReadObject(int depth, Json* out) {
    ++pos_;  // '{'
    *out = Json::object();
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWs();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a property name");
      std::string key;
      if (!ReadString(&key)) return false;
      SkipWs();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      SkipWs();
      Json value;
      if (!ReadValue(depth + 1, &value)) return false;
      // ordered_json's operator[] keeps a repeated key at its first position: Python's dict
      // does the same while taking the last value.
      (*out)[key] = std::move(value);
      SkipWs();
      if (pos_ >= s_.size()) return Fail("unexpected end in object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  bool ReadArray(int depth, Json* out) {
    ++pos_;  // '['
    *out = Json::array();
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWs();
      Json value;
      if (!ReadValue(depth + 1, &value)) return false;
      out->push_back(std::move(value));
      SkipWs();
      if (pos_ >= s_.size()) return Fail("unexpected end in array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  bool ReadHex4(uint32_t* v) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      *v <<= 4;
      if (c >= '0' && c <= '9') *v |= c - '0';
      else if (c >= 'a' && c <= 'f') *v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') *v |= c - 'A' + 10;
      else return Fail("bad \\u escape");
    }
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool ReadString(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("control character in string");
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!ReadHex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (s_.substr(pos_, 2) != "\\u") return Fail("lone surrogate");
            pos_ += 2;
            if (!ReadHex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return Fail("lone surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Fail("lone surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Fail("invalid escape");
      }
    }
  }

  bool ReadNumber(Json* out) {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      pos_ = start;
      return Fail("expected a value");
    }
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    bool is_float = false;
    if (pos_ + 1 < s_.size() && s_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      is_float = true;
      pos_ += 2;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) ++p;
      if (p < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p]))) {
        is_float = true;
        pos_ = p;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      }
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (!is_float) {
      if (*first == '-') {
        int64_t v = 0;
        auto r = std::from_chars(first, last, v);
        if (r.ec == std::errc() && r.ptr == last) {
          *out = v;
          return true;
        }
      } else {
        uint64_t v = 0;
        auto r = std::from_chars(first, last, v);
        if (r.ec == std::errc() && r.ptr == last) {
          if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            *out = static_cast<int64_t>(v);
          } else {
            *out = v;
          }
          return true;
        }
      }
    }
    double d = 0;
    auto r = std::from_chars(first, last, d);
    if (r.ptr != last) return Fail("bad number");
    if (r.ec == std::errc::result_out_of_range) {
      // Python's float() gives inf for overflow and (signed) 0.0 for underflow.
      const bool negative = *first == '-';
      const bool overflow = std::strtod(std::string(first, last).c_str(), nullptr) != 0;
      d = overflow ? (negative ? -HUGE_VAL : HUGE_VAL) : (negative ? -0.0 : 0.0);
    }
    *out = d;
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  const char* error_ = "";
};

}  // namespace

std::string PyFloatRepr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits, as Python's repr uses (David Gay's mode 0).
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e-07"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string out = sign;
  // Python (float_repr_style 'short') switches to exponent form when the decimal point would
  // sit more than 16 digits right or 4 zeros left of the first digit.
  if (exponent >= 16 || exponent < -4) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  exponent < 0 ? -exponent : exponent);
    out += exp_buf;
    return out;
  }
  if (exponent >= 0) {
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits) {
      out += digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
    return out;
  }
  out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  return out;
}

std::string PyJsonDumps(const Json& value, PyJsonStyle style) {
  std::string out;
  Dump(value, style, &out);
  return out;
}

absl::StatusOr<Json> ParsePyJson(std::string_view text) {
  PyJsonReader reader(text);
  return reader.ReadDocument();
}

}  // namespace coli::k3
