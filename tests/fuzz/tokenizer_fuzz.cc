// libFuzzer target: the rank-BPE tokenizer on arbitrary bytes and ids, with Kimi K3's real
// vocabulary (163,840 ids, its pre-tokenizer pattern and specials: the build's
// fixtures/tiktoken/kimi, or the directory in COLI_FUZZ_TOKENIZER). Every prompt byte a user
// sends goes through Encode; every id a model samples through the decoders.
//
// Input byte 0 even: the rest is text. Checked: Encode without specials yields no added token;
// Decode(Encode(text)) is the text when it is well-formed UTF-8, and well-formed UTF-8 otherwise
// (invalid bytes become U+FFFD first); Encode with specials decodes to the same bytes.
// Input byte 0 odd: the rest is ids (3 bytes each, some past the vocabulary). Checked: Decode
// refuses exactly the sequences holding an id outside the vocabulary; the raw StreamDecoder's
// pieces join to Decode's bytes; the replacing one's pieces are well-formed UTF-8.
// Built and run by scripts/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

using ::coli::fuzz::Check;
using ::coli::fuzz::WellFormedUtf8;
namespace tok = ::coli::tok;

namespace {
std::unique_ptr<tok::Tokenizer> g_tokenizer;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("COLI_FUZZ_TOKENIZER");
  auto loaded = tok::Tokenizer::LoadDir(dir != nullptr ? dir : "build/fixtures/tiktoken/kimi");
  if (!loaded.ok()) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", std::string(loaded.status().message()).c_str());
    std::abort();
  }
  g_tokenizer = std::move(loaded).value();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const tok::Tokenizer& t = *g_tokenizer;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    const std::vector<int32_t> ids = t.Encode(rest, /*allow_special=*/false);
    for (int32_t id : ids) {
      Check(id >= 0 && id < t.vocab_size(), "an id inside the vocabulary");
      Check(!t.IsAdded(id), "no added token from text without specials");
    }
    auto text = t.Decode(ids);
    Check(text.ok(), "Encode's ids decode");
    if (WellFormedUtf8(rest)) {
      Check(*text == rest, "Decode(Encode(text)) is the text");
    } else {
      Check(WellFormedUtf8(*text), "invalid bytes come back as U+FFFD");
    }
    auto with_specials = t.Decode(t.Encode(rest, /*allow_special=*/true));
    Check(with_specials.ok() && *with_specials == *text, "specials spell their own text");
    return 0;
  }
  std::vector<int32_t> ids;
  bool outside = false;
  for (size_t i = 0; i + 3 <= rest.size(); i += 3) {
    const int32_t id = static_cast<int32_t>(static_cast<uint8_t>(rest[i]) |
                                            static_cast<uint8_t>(rest[i + 1]) << 8 |
                                            static_cast<uint8_t>(rest[i + 2]) << 16) -
                       1000;  // a few negative ids, and ids past 163,840
    outside |= id < 0 || id >= t.vocab_size();
    ids.push_back(id);
  }
  auto bytes = t.Decode(ids);
  Check(bytes.ok() != outside, "Decode refuses exactly the ids outside the vocabulary");
  tok::StreamDecoder raw(t, /*replace_invalid=*/false), replacing(t);
  std::string joined;
  for (int32_t id : ids) {
    joined += raw.Push(id);
    Check(WellFormedUtf8(replacing.Push(id)), "a replacing stream piece is well-formed UTF-8");
  }
  joined += raw.Flush();
  Check(WellFormedUtf8(replacing.Flush()), "the replacing stream's tail is well-formed UTF-8");
  if (bytes.ok()) Check(joined == *bytes, "the raw stream's pieces join to Decode's bytes");
  return 0;
}
