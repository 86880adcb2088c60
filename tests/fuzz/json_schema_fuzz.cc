// libFuzzer target: the JSON-schema compiler and matcher of common/grammar (constrained
// decoding) on arbitrary input. A schema arrives from any API client, so compiling it must end
// quickly with a value or a clear error, and the matcher must never let through what is not
// JSON.
//
// Input: schema text, a NUL byte, then document bytes. Invariants checked:
//  - a refused schema has a message;
//  - feeding the document whole or in pieces (sizes drawn from the input) accepts the same
//    bytes and ends in the same state; a refused piece leaves the matcher unchanged;
//  - MustEnd implies CanEnd; a matcher that CAN end has read one valid JSON text (RFC 8259's
//    grammar with well-formed UTF-8, recognised by the small parser below, independent of
//    common/grammar; nlohmann's parser is not the oracle since it refuses numbers past double's
//    range, which the grammar allows);
//  - TokenFilter::Allowed over a small vocabulary cut from the document equals trying each token.
// Built and run by scripts/fuzz.sh.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/grammar/json_constraint.h"
#include "tests/fuzz/fuzz_check.h"

using ::coli::fuzz::Check;
namespace grammar = ::coli::grammar;

namespace {

// RFC 8259: a recursive-descent recogniser of one JSON text (depth-bounded).
class Rfc8259 {
 public:
  static bool Accept(std::string_view s) {
    Rfc8259 p(s);
    p.Ws();
    if (!p.Value(0)) return false;
    p.Ws();
    return p.i_ == s.size();
  }

 private:
  explicit Rfc8259(std::string_view s) : s_(s) {}
  bool At(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool Eat(char c) {
    if (!At(c)) return false;
    ++i_;
    return true;
  }
  bool Digit() const { return i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; }
  void Ws() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  bool Literal(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool Value(int depth) {
    if (depth > 256) return false;
    if (Eat('{')) {
      Ws();
      if (Eat('}')) return true;
      do {
        Ws();
        if (!String()) return false;
        Ws();
        if (!Eat(':')) return false;
        Ws();
        if (!Value(depth + 1)) return false;
        Ws();
      } while (Eat(','));
      return Eat('}');
    }
    if (Eat('[')) {
      Ws();
      if (Eat(']')) return true;
      do {
        Ws();
        if (!Value(depth + 1)) return false;
        Ws();
      } while (Eat(','));
      return Eat(']');
    }
    if (At('"')) return String();
    if (At('-') || Digit()) return Number();
    return Literal("true") || Literal("false") || Literal("null");
  }
  bool Number() {
    Eat('-');
    if (Eat('0')) {
    } else if (Digit()) {
      while (Digit()) ++i_;
    } else {
      return false;
    }
    if (Eat('.')) {
      if (!Digit()) return false;
      while (Digit()) ++i_;
    }
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!Digit()) return false;
      while (Digit()) ++i_;
    }
    return true;
  }
  bool Hex() {
    if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
    ++i_;
    return true;
  }
  bool String() {
    if (!Eat('"')) return false;
    while (i_ < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        ++i_;
        if (i_ >= s_.size()) return false;
        const char e = s_[i_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k) {
            if (!Hex()) return false;
          }
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return false;
        }
        continue;
      }
      const size_t n = ::coli::fuzz::Utf8CharLength(s_, i_);
      if (n == 0) return false;
      i_ += n;
    }
    return false;
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  const std::string_view schema = input.substr(0, cut);
  const std::string_view doc = cut == std::string_view::npos ? "" : input.substr(cut + 1);

  auto constraint = grammar::JsonConstraint::FromSchema(schema);
  if (!constraint.ok()) {
    Check(!constraint.status().message().empty(), "a refused schema names why");
    return 0;
  }
  Check(*constraint != nullptr, "a compiled schema is a constraint");

  // Whole: the longest accepted prefix, byte by byte.
  grammar::JsonMatcher whole(*constraint);
  size_t accepted = 0;
  while (accepted < doc.size() && whole.Accept(doc.substr(accepted, 1))) ++accepted;
  Check(whole.consumed() == static_cast<int64_t>(accepted), "consumed counts accepted bytes");
  if (whole.MustEnd()) Check(whole.CanEnd(), "MustEnd implies CanEnd");
  if (whole.CanEnd()) {
    Check(Rfc8259::Accept(doc.substr(0, accepted)), "a value that can end is valid JSON");
  }
  // The same prefix in one call, and a longer one refused without a change.
  grammar::JsonMatcher once(*constraint);
  Check(once.Accept(doc.substr(0, accepted)), "the prefix accepted byte by byte, in one call");
  Check(once.CanEnd() == whole.CanEnd() && once.MustEnd() == whole.MustEnd(), "same end state");
  if (accepted < doc.size()) {
    grammar::JsonMatcher full(*constraint);
    Check(!full.Accept(doc), "a document with a refused byte is refused whole");
    Check(full.consumed() == 0, "and the refusal changes nothing");
  }
  // Pieces of sizes 1..8 drawn from the document's own bytes.
  grammar::JsonMatcher pieces(*constraint);
  size_t at = 0;
  while (at < accepted) {
    const size_t n = std::min<size_t>(accepted - at, 1 + static_cast<uint8_t>(doc[at]) % 8);
    Check(pieces.Accept(doc.substr(at, n)), "every piece of an accepted prefix is accepted");
    at += n;
  }
  Check(pieces.CanEnd() == whole.CanEnd(), "pieces end like the whole");
  if (accepted < doc.size()) {
    const int64_t before = pieces.consumed();
    Check(!pieces.Accept(doc.substr(accepted, 1)), "the refused byte is refused again");
    Check(pieces.consumed() == before, "a refused piece changes nothing");
  }

  // A vocabulary of up to 48 tokens cut from the document (lengths 1..6) plus an empty one.
  std::vector<std::string> vocab = {""};
  for (size_t i = 0; i < doc.size() && vocab.size() < 48; i += 3) {
    vocab.emplace_back(doc.substr(i, 1 + static_cast<uint8_t>(doc[i]) % 6));
  }
  grammar::TokenFilter filter(vocab);
  // At a few points of the accepted prefix: Allowed equals trying every token on a copy.
  for (size_t point : {size_t{0}, accepted / 2, accepted}) {
    grammar::JsonMatcher m(*constraint);
    Check(m.Accept(doc.substr(0, point)), "a prefix of an accepted prefix is accepted");
    std::vector<uint8_t> allowed;
    filter.Allowed(m, &allowed);
    Check(allowed.size() == vocab.size(), "one flag per token");
    for (size_t t = 0; t < vocab.size(); ++t) {
      grammar::JsonMatcher probe = m;
      const bool ok = !vocab[t].empty() && probe.Accept(vocab[t]);
      Check((allowed[t] != 0) == ok, "Allowed equals trying the token");
    }
  }
  return 0;
}
