// common/tokenizer: byte-level BPE tokenizers (tiktoken rank-BPE and Hugging Face merges-BPE),
// exact against OpenAI's tiktoken, for any model family.
//
//   COLI_ASSIGN_OR_RETURN(auto tok, coli::tok::Tokenizer::LoadDir("/models/Kimi-K3"));
//   std::vector<int32_t> ids = tok->Encode("user text <|open|>", /*allow_special=*/false);
//   std::vector<int32_t> open = tok->Encode("<|open|>", /*allow_special=*/true);  // {163587}
//   COLI_ASSIGN_OR_RETURN(std::string bytes, tok->Decode(ids));
//
// What a directory may hold (first match wins):
//  * `tiktoken.model` — lines `<base64 token bytes> <rank>`; ranks must be exactly 0..N-1
//    and every single byte must be a token. Specials come from `tokenizer_config.json`
//    `added_tokens_decoder` ({"163584": {"content": "[BOS]", "special": true}, ...}); ids
//    N .. N+R-1 (R = `num_reserved_special_tokens` of the config, default 256 as in the
//    vendor's tokenization_kimi.py) that have no name are `<|reserved_token_<id>|>`. The split
//    pattern is the config's `pat_str` when present (a coli extension, used for non-Kimi
//    vocabularies), otherwise Kimi's (spec §5.2): every shipped Kimi directory has none.
//  * `tokenizer.json` — model.type BPE over the GPT-2 byte-to-unicode alphabet with a
//    ByteLevel pre-tokenizer (alone, or after a Split regex). Empty `merges` means rank-BPE
//    with rank = id (what tools/tokenizer/tiktoken_to_tokenizer_json.py writes); otherwise
//    Hugging Face merges-BPE (lowest merge rank first, leftmost on ties).
// The family is named by the split pattern (see pretokenizer.h): `\p{Han}` in it means Kimi.
//
// Encoding (spec §5.3, §5.4):
//  * Input bytes that are not valid UTF-8 are replaced by U+FFFD per maximal subpart first
//    (utf8.h): tiktoken only accepts text, and that is how bytes become its text.
//  * Special tokens are matched only when `allow_special` is true (then every added token is
//    recognised; at one position the longest wins). Otherwise `<|open|>` is ordinary text.
//  * Rank-BPE is tiktoken's: merge the adjacent pair whose concatenation has the lowest rank,
//    leftmost on ties; O(n log n) per piece, so 1 MB of one character stays fast.
//  * tiktoken.model directories also apply the vendor's long-input slicing
//    (tokenization_kimi.py): the text goes to the encoder in <= 400,000-character slices,
//    and runs of more than 25,000 consecutive (Python isspace) whitespace or non-whitespace
//    characters are cut. This only changes ids for such inputs; set_vendor_slicing(false)
//    turns it off (pure tiktoken behaviour).
//
// A loaded Tokenizer is immutable and thread-safe.
#ifndef COLI_COMMON_TOKENIZER_TOKENIZER_H_
#define COLI_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/pretokenizer.h"

namespace coli::tok {

// One added (special or reserved) token, as read from the configuration.
struct AddedToken {
  int32_t id;
  std::string content;
  bool special = true;
};

class Tokenizer {
 public:
  // `dir` holds tiktoken.model or tokenizer.json, plus (optionally) tokenizer_config.json.
  // Errors name the file and line/key: NOT_FOUND when neither vocabulary file exists,
  // DATA_LOSS for a corrupt vocabulary, INVALID_ARGUMENT for inconsistent configuration,
  // UNIMPLEMENTED for tokenizer.json features coli does not support.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadDir(const std::string& dir);

  // From already-read file contents (the directory loader uses these; tests use them too).
  // `config_json` may be empty (no tokenizer_config.json). `origin` names the files in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTiktoken(std::string_view model_text,
                                                                 std::string_view config_json,
                                                                 std::string_view origin);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(
      std::string_view tokenizer_json, std::string_view config_json, std::string_view origin);

  ~Tokenizer();

  // Token ids of `text` (any bytes; see the file comment for invalid UTF-8).
  std::vector<int32_t> Encode(std::string_view text, bool allow_special) const;
  // The bytes of `ids` concatenated (specials as their text). INVALID_ARGUMENT naming the
  // first id outside [0, vocab_size()).
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const;
  // The id of an added token by name ("<|open|>") or of a base token by its exact bytes.
  std::optional<int32_t> TokenId(std::string_view special_or_token) const;
  // True for added tokens (named or reserved) whose configuration marks them special.
  bool IsSpecial(int32_t id) const;
  // True for every added token id (special or not); recognised in text only when allowed.
  bool IsAdded(int32_t id) const;
  // The bytes of one token (specials: their text); empty for ids outside the vocabulary.
  std::string_view TokenBytes(int32_t id) const;
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  // Number of BPE (non-added) tokens.
  int32_t num_base_tokens() const { return num_base_; }

  PatternFamily family() const { return split_->family(); }
  const PreTokenizer& pre_tokenizer() const { return *split_; }
  bool merges_bpe() const { return merges_bpe_; }
  bool vendor_slicing() const { return vendor_slicing_; }
  void set_vendor_slicing(bool on) { vendor_slicing_ = on; }

  // BPE of one pre-token piece (no splitting, no specials); appends ids to *out.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;

 private:
  Tokenizer() = default;
  absl::Status Finish(std::string_view origin);
  absl::Status AddSpecials(std::vector<AddedToken> added, int32_t reserved,
                           std::string_view origin);
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeSlice(std::string_view text, bool allow_special, std::vector<int32_t>* out) const;
  void RankBpe(std::string_view piece, std::vector<int32_t>* out) const;
  void MergesBpe(std::string_view piece, std::vector<int32_t>* out) const;
  int32_t Rank(std::string_view bytes) const;

  std::vector<std::string> tokens_;  // id -> bytes (added tokens: their text)
  std::vector<uint8_t> kind_;        // 0 base, 1 added non-special, 2 added special
  int32_t num_base_ = 0;
  absl::flat_hash_map<std::string_view, int32_t> base_;   // bytes -> id, base tokens
  absl::flat_hash_map<std::string_view, int32_t> added_;  // text -> id, added tokens
  std::vector<int32_t> pair_rank_;   // 65536 entries: rank of each two-byte token, or -1
  int32_t byte_token_[256] = {};
  size_t max_token_bytes_ = 0;
  // Specials by first byte, longest first, for matching in text.
  std::vector<std::vector<int32_t>> specials_by_first_byte_;
  // Merges-BPE: (left id, right id) -> (merge rank, merged id).
  bool merges_bpe_ = false;
  bool ignore_merges_ = false;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  bool keep_gaps_ = false;  // HF Split keeps unmatched text; tiktoken drops it
  bool vendor_slicing_ = false;
  std::unique_ptr<PreTokenizer> split_;

  friend class TokenizerBuilder;
};

// Token-by-token UTF-8 output that never emits a partial character.
//
//   StreamDecoder stream(*tok);
//   for (int32_t id : generated) std::fputs(stream.Push(id).c_str(), stdout);
//   std::fputs(stream.Flush().c_str(), stdout);
//
// Push() returns the bytes completed so far; a character split across tokens waits for its
// last byte. With `replace_invalid` (the default) output is always valid UTF-8: bytes that
// can never complete a character become U+FFFD per maximal subpart, exactly as decoding the
// whole byte stream with replacement would (Python errors="replace"). Without it, bytes pass
// through unchanged and the concatenated output equals Decode(ids). Flush() emits whatever is
// still pending (an incomplete tail) so nothing is lost at the end of a stream. Ids outside the
// vocabulary contribute no bytes.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool replace_invalid = true);
  std::string Push(int32_t id);
  std::string Flush();

 private:
  std::string Emit(bool final);
  const Tokenizer& tokenizer_;
  bool replace_invalid_;
  std::string pending_;
};

}  // namespace coli::tok

#endif  // COLI_COMMON_TOKENIZER_TOKENIZER_H_
