// Loading a tokenizer: tiktoken.model + tokenizer_config.json, or tokenizer.json.
#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/io.h"
#include "common/log/log.h"
#include "common/status/status.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace coli::tok {
namespace {

// Debian's Abseil has its own string_view: convert at the StrCat boundary.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Default number of added-token ids after the base vocabulary (tokenization_kimi.py).
constexpr int32_t kDefaultReserved = 256;

// The reason in the message (permission denied, a directory, a dangling symlink), from io.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return io::ReadFileToString(path, uint64_t{1} << 30);
}

// There, even as a dangling symlink (whose read then names the missing target).
bool Present(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(path, ec));
}

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view origin) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(Av(origin), ": invalid JSON: ", e.what()));
  }
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 (padding required, no stray characters, zero trailing bits).
bool DecodeBase64(std::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = (in[in.size() - 2] == '=') ? 2 : 1;
  for (size_t i = 0; i < in.size(); i += 4) {
    bool last = i + 4 == in.size();
    int v[4];
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && last && k >= 4 - static_cast<int>(pad)) {
        v[k] = 0;
        continue;
      }
      v[k] = Base64Value(c);
      if (v[k] < 0) return false;
    }
    uint32_t triple = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out->push_back(static_cast<char>(triple >> 16));
    if (!(last && pad == 2)) out->push_back(static_cast<char>((triple >> 8) & 0xFF));
    if (!(last && pad >= 1)) out->push_back(static_cast<char>(triple & 0xFF));
    if (last && pad == 2 && (triple & 0xFFFF) != 0) return false;
    if (last && pad == 1 && (triple & 0xFF) != 0) return false;
  }
  return true;
}

// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest map to
// U+0100 onwards in byte order.
std::array<char32_t, 256> ByteToUnicode() {
  std::array<char32_t, 256> table{};
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
  }
  return table;
}

// Maps a byte-level token string (UTF-8 of GPT-2 alphabet characters) back to raw bytes.
bool ByteLevelToBytes(std::string_view text, std::string* out) {
  static const auto kReverse = [] {
    std::array<int, 324> reverse;
    reverse.fill(-1);
    auto table = ByteToUnicode();
    for (int b = 0; b < 256; ++b) reverse[table[b]] = b;
    return reverse;
  }();
  out->clear();
  size_t i = 0;
  while (i < text.size()) {
    size_t len = Utf8SequenceLength(text.substr(i));
    if (len == 0) return false;
    char32_t c = DecodeUtf8(text.substr(i), len);
    if (c >= kReverse.size() || kReverse[c] < 0) return false;
    out->push_back(static_cast<char>(kReverse[c]));
    i += len;
  }
  return true;
}

std::string Printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60)) {
    auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7F) {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "\\x%02X", b);
    }
  }
  if (s.size() > 60) out += "...";
  return out;
}

struct ConfigInfo {
  std::vector<AddedToken> added;
  std::optional<std::string> pat_str;
  int32_t reserved = kDefaultReserved;
};

absl::StatusOr<ConfigInfo> ParseTokenizerConfig(std::string_view text, std::string_view origin) {
  ConfigInfo info;
  if (text.empty()) return info;
  std::string where = absl::StrCat(Av(origin), "tokenizer_config.json");
  COLI_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(text, where));
  if (!doc.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  if (auto it = doc.find("pat_str"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": pat_str: expected a string"));
    }
    info.pat_str = it->get<std::string>();
  }
  if (auto it = doc.find("num_reserved_special_tokens"); it != doc.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": num_reserved_special_tokens: expected an integer in [0, 1048576]"));
    }
    info.reserved = static_cast<int32_t>(it->get<int64_t>());
  }
  auto decoder = doc.find("added_tokens_decoder");
  if (decoder == doc.end() || decoder->is_null()) return info;
  if (!decoder->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": added_tokens_decoder: expected an object"));
  }
  for (const auto& [key, value] : decoder->items()) {
    std::string path = absl::StrCat(where, ": added_tokens_decoder[\"", key, "\"]");
    int64_t id = -1;
    auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || ptr != key.data() + key.size() || id < 0 || id > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": key is not a token id"));
    }
    if (!value.is_object() || !value.contains("content") || !value["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": expected {\"content\": string}"));
    }
    AddedToken token{static_cast<int32_t>(id), value["content"].get<std::string>(), true};
    if (auto s = value.find("special"); s != value.end()) {
      if (!s->is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ".special: expected a boolean"));
      }
      token.special = s->get<bool>();
    }
    info.added.push_back(std::move(token));
  }
  return info;
}

}  // namespace

absl::Status Tokenizer::AddSpecials(std::vector<AddedToken> added, int32_t reserved,
                                    std::string_view origin) {
  int64_t end = static_cast<int64_t>(num_base_) + reserved;
  for (const AddedToken& t : added) {
    // An added token may repeat a base token with the same bytes (GPT-2's <|endoftext|> is in
    // both lists); any other id inside the base vocabulary is a conflict.
    if (t.id < num_base_ && tokens_[t.id] != t.content) {
      return absl::InvalidArgumentError(
          absl::StrCat(Av(origin), ": added token '", Printable(t.content), "' has id ", t.id,
                       ", inside the base vocabulary [0, ", num_base_, ") where the token is '",
                       Printable(tokens_[t.id]), "'"));
    }
    if (t.content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Av(origin), ": added token id ", t.id, " has empty content"));
    }
    end = std::max<int64_t>(end, static_cast<int64_t>(t.id) + 1);
  }
  if (end > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(origin), ": added token ids reach ", end, ", beyond any sane vocabulary"));
  }
  tokens_.resize(end);
  kind_.assign(end, 0);
  std::vector<bool> named(end, false);
  for (AddedToken& t : added) {
    if (named[t.id]) {
      return absl::InvalidArgumentError(
          absl::StrCat(Av(origin), ": added token id ", t.id, " is listed twice"));
    }
    named[t.id] = true;
    tokens_[t.id] = std::move(t.content);
    kind_[t.id] = t.special ? 2 : 1;
  }
  for (int64_t id = num_base_; id < end; ++id) {
    if (!named[id]) {
      tokens_[id] = absl::StrCat("<|reserved_token_", id, "|>");
      kind_[id] = 2;
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Finish(std::string_view origin) {
  // Base lookup (views into tokens_, which no longer changes size).
  base_.clear();
  base_.reserve(num_base_);
  pair_rank_.assign(65536, -1);
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  max_token_bytes_ = 0;
  for (int32_t id = 0; id < num_base_; ++id) {
    const std::string& bytes = tokens_[id];
    if (bytes.empty()) {
      return absl::DataLossError(absl::StrCat(Av(origin), ": token id ", id, " has no bytes"));
    }
    auto [it, inserted] = base_.emplace(std::string_view(bytes), id);
    if (!inserted) {
      return absl::DataLossError(absl::StrCat(Av(origin), ": token bytes '", Printable(bytes),
                                              "' appear twice (ids ", it->second, " and ", id,
                                              ")"));
    }
    max_token_bytes_ = std::max(max_token_bytes_, bytes.size());
    if (bytes.size() == 1) byte_token_[static_cast<uint8_t>(bytes[0])] = id;
    if (bytes.size() == 2) {
      pair_rank_[(static_cast<uint8_t>(bytes[0]) << 8) | static_cast<uint8_t>(bytes[1])] = id;
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (byte_token_[b] < 0) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the vocabulary has no token for the single byte 0x%02X, so some text could not "
          "be encoded",
          std::string(origin), b));
    }
  }
  added_.clear();
  specials_by_first_byte_.assign(256, {});
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (kind_[id] == 0) continue;
    auto [it, inserted] = added_.emplace(std::string_view(tokens_[id]), id);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(Av(origin), ": added token '",
                                                     Printable(tokens_[id]), "' appears twice (ids ",
                                                     it->second, " and ", id, ")"));
    }
    specials_by_first_byte_[static_cast<uint8_t>(tokens_[id][0])].push_back(id);
  }
  for (auto& list : specials_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(),
                     [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTiktoken(std::string_view model_text,
                                                                   std::string_view config_json,
                                                                   std::string_view origin) {
  const std::string where = absl::StrCat(Av(origin), "tiktoken.model");
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  std::vector<int64_t> line_of_rank;  // 1-based line that defined each rank, 0 = none
  std::vector<std::string> by_rank;
  std::string bytes;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < model_text.size()) {
    size_t eol = model_text.find('\n', pos);
    if (eol == std::string_view::npos) eol = model_text.size();
    std::string_view line = model_text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // as tiktoken's load_tiktoken_bpe
    size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return absl::DataLossError(absl::StrCat(where, " line ", line_no,
                                              ": expected '<base64> <rank>', got '",
                                              Printable(line), "'"));
    }
    std::string_view b64 = line.substr(0, space);
    std::string_view rank_text = line.substr(space + 1);
    int64_t rank = -1;
    auto [ptr, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || ptr != rank_text.data() + rank_text.size() || rank < 0 ||
        rank >= (int64_t{1} << 24)) {
      return absl::DataLossError(absl::StrCat(where, " line ", line_no, ": bad rank '",
                                              Printable(rank_text), "'"));
    }
    if (!DecodeBase64(b64, &bytes)) {
      return absl::DataLossError(absl::StrCat(where, " line ", line_no, ": malformed base64 '",
                                              Printable(b64), "'"));
    }
    if (static_cast<size_t>(rank) >= by_rank.size()) {
      by_rank.resize(rank + 1);
      line_of_rank.resize(rank + 1, 0);
    }
    if (line_of_rank[rank] != 0) {
      return absl::DataLossError(absl::StrCat(where, " line ", line_no, ": duplicate rank ", rank,
                                              " (first on line ", line_of_rank[rank], ")"));
    }
    line_of_rank[rank] = line_no;
    by_rank[rank] = bytes;
  }
  if (by_rank.empty()) return absl::DataLossError(absl::StrCat(where, ": no tokens"));
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (line_of_rank[r] == 0) {
      return absl::DataLossError(absl::StrCat(where, ": ranks must be 0..", by_rank.size() - 1,
                                              " without gaps; rank ", r, " is missing"));
    }
  }
  tok->num_base_ = static_cast<int32_t>(by_rank.size());
  tok->tokens_ = std::move(by_rank);
  COLI_ASSIGN_OR_RETURN(ConfigInfo config, ParseTokenizerConfig(config_json, origin));
  COLI_RETURN_IF_ERROR(tok->AddSpecials(std::move(config.added), config.reserved,
                                        absl::StrCat(Av(origin), "tokenizer_config.json")));
  COLI_RETURN_IF_ERROR(tok->Finish(where));
  std::string pattern = config.pat_str.value_or(kKimiPattern);
  auto split = PreTokenizer::FromPattern(pattern);
  if (!split.ok()) return Annotate(split.status(), absl::StrCat(Av(origin), "tokenizer_config.json"));
  tok->split_ = *std::move(split);
  tok->keep_gaps_ = false;
  tok->vendor_slicing_ = true;
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(
    std::string_view tokenizer_json, std::string_view config_json, std::string_view origin) {
  const std::string where = absl::StrCat(Av(origin), "tokenizer.json");
  COLI_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(tokenizer_json, where));
  auto fail = [&](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
  };
  auto unsupported = [&](auto... parts) {
    return absl::UnimplementedError(absl::StrCat(where, ": ", parts...));
  };
  if (!doc.is_object()) return fail("not a JSON object");
  auto model_it = doc.find("model");
  if (model_it == doc.end() || !model_it->is_object()) return fail("model: expected an object");
  const nlohmann::json& model = *model_it;
  if (!model.contains("type") || model["type"] != "BPE") {
    return unsupported("model.type must be \"BPE\" (got ",
                       model.contains("type") ? model["type"].dump() : "nothing", ")");
  }
  if (model.contains("byte_fallback") && model["byte_fallback"] == true) {
    return unsupported("model.byte_fallback is not supported (byte-level BPE only)");
  }
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
    return unsupported("normalizer ", doc["normalizer"].value("type", "?"), " is not supported");
  }

  // Pre-tokenizer: ByteLevel alone, or Sequence [Split(Isolated), ByteLevel(use_regex=false)].
  std::string pattern;
  auto check_byte_level = [&](const nlohmann::json& bl, bool* use_regex) -> absl::Status {
    if (bl.value("add_prefix_space", false)) {
      return unsupported("pre_tokenizer ByteLevel.add_prefix_space=true is not supported");
    }
    *use_regex = bl.value("use_regex", true);
    return absl::OkStatus();
  };
  if (!doc.contains("pre_tokenizer") || !doc["pre_tokenizer"].is_object()) {
    return unsupported("a ByteLevel pre_tokenizer is required");
  }
  const nlohmann::json& pre = doc["pre_tokenizer"];
  std::string pre_type = pre.value("type", "");
  if (pre_type == "ByteLevel") {
    bool use_regex = true;
    COLI_RETURN_IF_ERROR(check_byte_level(pre, &use_regex));
    pattern = use_regex ? kGpt2Pattern : "(?s:.+)";
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2) {
    const nlohmann::json& split = pre["pretokenizers"][0];
    const nlohmann::json& bl = pre["pretokenizers"][1];
    if (split.value("type", "") != "Split" || bl.value("type", "") != "ByteLevel") {
      return unsupported("pre_tokenizer Sequence must be [Split, ByteLevel]");
    }
    bool use_regex = true;
    COLI_RETURN_IF_ERROR(check_byte_level(bl, &use_regex));
    if (use_regex) return unsupported("ByteLevel.use_regex=true after a Split is not supported");
    if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
      return unsupported("Split behavior must be Isolated with invert=false");
    }
    if (!split.contains("pattern") || !split["pattern"].is_object()) {
      return fail("pre_tokenizer Split.pattern: expected an object");
    }
    const nlohmann::json& p = split["pattern"];
    if (p.contains("Regex") && p["Regex"].is_string()) {
      pattern = p["Regex"].get<std::string>();
    } else {
      return unsupported("Split.pattern must be {\"Regex\": ...}");
    }
  } else {
    return unsupported("pre_tokenizer ", pre_type.empty() ? "?" : pre_type, " is not supported");
  }

  // Vocabulary.
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return fail("model.vocab: expected an object");
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  std::vector<std::string> tokens;
  std::vector<bool> has;
  std::string bytes;
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= (int64_t{1} << 24)) {
      return fail("model.vocab[\"", Printable(key), "\"]: expected a token id");
    }
    auto id = static_cast<size_t>(value.get<int64_t>());
    if (!ByteLevelToBytes(key, &bytes)) {
      return absl::DataLossError(absl::StrCat(where, ": model.vocab key '", Printable(key),
                                              "' has a character outside the byte-level alphabet"));
    }
    if (id >= tokens.size()) {
      tokens.resize(id + 1);
      has.resize(id + 1, false);
    }
    if (has[id]) return fail("model.vocab: id ", id, " is used twice");
    has[id] = true;
    tokens[id] = bytes;
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!has[id]) return fail("model.vocab: ids must be 0..", tokens.size() - 1, "; ", id,
                              " is missing");
  }
  tok->num_base_ = static_cast<int32_t>(tokens.size());
  tok->tokens_ = std::move(tokens);

  // Added tokens (tokenizer.json's own list; tokenizer_config.json repeats it).
  std::vector<AddedToken> added;
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    size_t index = 0;
    for (const nlohmann::json& t : doc["added_tokens"]) {
      std::string path = absl::StrCat("added_tokens[", index++, "]");
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        return fail(path, ": expected {\"id\": integer, \"content\": string}");
      }
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (t.value(flag, false)) return unsupported(path, ": ", flag, "=true is not supported");
      }
      int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 24)) return fail(path, ": bad id ", id);
      added.push_back({static_cast<int32_t>(id), t["content"].get<std::string>(),
                       t.value("special", true)});
    }
  }
  (void)config_json;  // HF keeps the authoritative added tokens in tokenizer.json.
  COLI_RETURN_IF_ERROR(tok->AddSpecials(std::move(added), /*reserved=*/0, where));
  COLI_RETURN_IF_ERROR(tok->Finish(where));

  // Merges.
  if (model.contains("merges") && !model["merges"].is_array()) {
    return fail("model.merges: expected an array");
  }
  const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json& merges = model.contains("merges") ? model["merges"] : empty;
  tok->merges_bpe_ = !merges.empty();
  tok->ignore_merges_ = model.value("ignore_merges", false);
  int32_t merge_rank = 0;
  std::string left_bytes, right_bytes;
  for (const nlohmann::json& m : merges) {
    std::string path = absl::StrCat("model.merges[", merge_rank, "]");
    std::string left, right;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return fail(path, ": expected \"left right\"");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return fail(path, ": expected \"left right\" or [left, right]");
    }
    if (!ByteLevelToBytes(left, &left_bytes) || !ByteLevelToBytes(right, &right_bytes)) {
      return fail(path, ": not in the byte-level alphabet");
    }
    auto l = tok->base_.find(left_bytes);
    auto r = tok->base_.find(right_bytes);
    auto merged = tok->base_.find(left_bytes + right_bytes);
    if (l == tok->base_.end() || r == tok->base_.end() || merged == tok->base_.end()) {
      return fail(path, ": '", Printable(left), "', '", Printable(right),
                  "' or their concatenation is not in model.vocab");
    }
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) |
                   static_cast<uint32_t>(r->second);
    tok->merges_.emplace(key, std::make_pair(merge_rank, merged->second));  // first one wins
    ++merge_rank;
  }

  auto split = PreTokenizer::FromPattern(pattern);
  if (!split.ok()) return Annotate(split.status(), where);
  tok->split_ = *std::move(split);
  tok->keep_gaps_ = true;
  tok->vendor_slicing_ = false;
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("tokenizer directory '", dir, "' does not exist"));
  }
  const std::string prefix = (fs::path(dir) / "").string();
  std::string config;
  if (Present(prefix + "tokenizer_config.json")) {
    COLI_ASSIGN_OR_RETURN(config, ReadFile(prefix + "tokenizer_config.json"));
  }
  if (Present(prefix + "tiktoken.model")) {
    COLI_ASSIGN_OR_RETURN(std::string model, ReadFile(prefix + "tiktoken.model"));
    return FromTiktoken(model, config, prefix);
  }
  if (Present(prefix + "tokenizer.json")) {
    COLI_ASSIGN_OR_RETURN(std::string json, ReadFile(prefix + "tokenizer.json"));
    return FromTokenizerJson(json, config, prefix);
  }
  return absl::NotFoundError(
      absl::StrCat("tokenizer directory '", dir, "' has neither tiktoken.model nor tokenizer.json"));
}

}  // namespace coli::tok
