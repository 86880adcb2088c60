#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/log/log.h"
#include "common/tokenizer/utf8.h"

namespace coli::tok {

const char kKimiPattern[] =
    R"([\p{Han}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|)"
    R"(\s+(?!\S)|)"
    R"(\s+)";

const char kO200kPattern[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char kCl100kPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Debian's Abseil has its own string_view: convert at the StrCat boundary.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Unicode White_Space (what `\s` means in Rust's regex), as PCRE2 class members.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F})"
    R"(\x{205F}\x{3000})";

// Kimi's two intersections and their complement forms (see the header comment).
constexpr std::string_view kKimiUpper = R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]])";
constexpr std::string_view kKimiUpperPcre2 = R"([^\p{sc:Han}\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}])";
constexpr std::string_view kKimiLower = R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]])";
constexpr std::string_view kKimiLowerPcre2 =
    R"([^\p{sc:Han}\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}])";

bool IsGeneralCategory(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "L",  "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "L&", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl",
      "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",
      "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn", "Any"};
  for (std::string_view n : kNames) {
    if (n == name) return true;
  }
  return false;
}

// Per-thread PCRE2 scratch: match data (one ovector pair is all we read), a JIT stack large
// enough for long backtracking runs, and a match context pointing at it.
struct Scratch {
  pcre2_match_data* match_data = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  Scratch() {
    match_data = pcre2_match_data_create(1, nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    // The default limit (10 million backtracking steps) can be reached by one letter rule on
    // a run of tens of millions of capitals; the patterns are linear per match, so lift it.
    if (context) pcre2_set_match_limit(context, UINT32_MAX);
  }
  ~Scratch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(match_data);
  }
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string_view PatternFamilyName(PatternFamily family) {
  switch (family) {
    case PatternFamily::kKimi:
      return "kimi";
    case PatternFamily::kO200k:
      return "o200k";
    case PatternFamily::kCl100k:
      return "cl100k";
    case PatternFamily::kGpt2:
      return "gpt2";
    case PatternFamily::kCustom:
      break;
  }
  return "custom";
}

PatternFamily DetectFamily(std::string_view pattern) {
  if (pattern == kO200kPattern) return PatternFamily::kO200k;
  if (pattern == kCl100kPattern) return PatternFamily::kCl100k;
  if (pattern == kGpt2Pattern) return PatternFamily::kGpt2;
  // The seed's rule: a Split regex mentioning \p{Han} is the Kimi family.
  if (pattern.find(R"(\p{Han})") != std::string_view::npos) return PatternFamily::kKimi;
  return PatternFamily::kCustom;
}

absl::StatusOr<std::string> TranslateToPcre2(std::string_view pattern) {
  std::string source = absl::StrReplaceAll(
      Av(pattern), {{Av(kKimiUpper), Av(kKimiUpperPcre2)}, {Av(kKimiLower), Av(kKimiLowerPcre2)}});
  if (source.find("&&") != std::string::npos) {
    return absl::UnimplementedError(absl::StrCat(
        "pre-tokenizer pattern uses class intersection '&&' in a form coli cannot translate "
        "to PCRE2: ",
        Av(pattern)));
  }
  std::string out;
  out.reserve(source.size() + 256);
  bool in_class = false;
  size_t class_start = 0;  // index in `source` just after '[' or '[^'
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\\' && i + 1 < source.size()) {
      char e = source[i + 1];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", Av(kWhiteSpace), in_class ? "" : "]");
        ++i;
        continue;
      }
      if (e == 'S') {
        if (in_class) {
          return absl::UnimplementedError(absl::StrCat(
              "pre-tokenizer pattern uses \\S inside a character class: ", Av(pattern)));
        }
        absl::StrAppend(&out, "[^", Av(kWhiteSpace), "]");
        ++i;
        continue;
      }
      if ((e == 'p' || e == 'P') && i + 2 < source.size() && source[i + 2] == '{') {
        size_t close = source.find('}', i + 3);
        if (close == std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("pre-tokenizer pattern has an unterminated \\p{: ", Av(pattern)));
        }
        std::string_view name(source.data() + i + 3, close - (i + 3));
        bool keep = IsGeneralCategory(name) || name.find(':') != std::string_view::npos ||
                    name.find('=') != std::string_view::npos;
        absl::StrAppend(&out, "\\", absl::string_view(&e, 1), "{", keep ? "" : "sc:", Av(name), "}");
        i = close;
        continue;
      }
      out.push_back(c);
      out.push_back(e);
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < source.size() && source[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    if (in_class && c == ']' && i != class_start) {
      in_class = false;
    } else if (in_class && c == '[') {
      return absl::UnimplementedError(
          absl::StrCat("pre-tokenizer pattern nests character classes: ", Av(pattern)));
    }
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromPattern(std::string_view pattern) {
  auto translated = TranslateToPcre2(pattern);
  if (!translated.ok()) return translated.status();
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  p->pattern_ = std::string(pattern);
  p->pcre2_pattern_ = *std::move(translated);
  p->family_ = DetectFamily(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p->pcre2_pattern_.data()),
                                   p->pcre2_pattern_.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &error,
                                   &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokenizer pattern does not compile (", Pcre2Error(error),
                     " at offset ", offset, " of PCRE2 form '", p->pcre2_pattern_, "')"));
  }
  p->code_ = code;
  int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  p->jit_ = jit == 0;
  if (!p->jit_) {
    COLI_LOG(kWarning) << "tokenizer: PCRE2 JIT unavailable (" << Pcre2Error(jit)
                       << "); using the interpreter";
  }
  return p;
}

PreTokenizer::~PreTokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void PreTokenizer::ForEachPiece(std::string_view text, bool keep_gaps,
                                absl::FunctionRef<void(std::string_view)> fn) const {
  auto* code = static_cast<pcre2_code*>(code_);
  Scratch& scratch = ThreadScratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t length = text.size();
  size_t pos = 0;
  while (pos < length) {
    int rc = -1;
    if (jit_) {
      rc = pcre2_jit_match(code, subject, length, pos, 0, scratch.match_data, scratch.context);
    }
    if (!jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) {
      // The interpreter keeps its backtracking state on the heap, so it survives inputs that
      // exhaust the JIT stack.
      rc = pcre2_match(code, subject, length, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       scratch.match_data, scratch.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    size_t start, end;
    if (rc < 0) {
      // Should not happen for any shipped pattern; never lose text: one character as a piece.
      COLI_LOG(kError) << "tokenizer: pre-tokenizer match failed at byte " << pos << ": "
                       << Pcre2Error(rc);
      start = pos;
      size_t n = Utf8SequenceLength(text.substr(pos));
      end = pos + (n == 0 ? 1 : n);
    } else {
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data);
      start = ovector[0];
      end = ovector[1];
    }
    if (keep_gaps && start > pos) fn(text.substr(pos, start - pos));
    if (end == start) {
      // An empty match (only custom patterns can produce one): step over one character.
      size_t n = Utf8SequenceLength(text.substr(end));
      size_t next = end + (n == 0 ? 1 : n);
      if (keep_gaps && next > end) fn(text.substr(end, next - end));
      pos = next;
      continue;
    }
    fn(text.substr(start, end - start));
    pos = end;
  }
  if (keep_gaps && pos < length) fn(text.substr(pos));
}

}  // namespace coli::tok
