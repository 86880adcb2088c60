#include "tools/coli/reply_tail.h"

#include <algorithm>

#include "common/tokenizer/utf8.h"

namespace coli::client {

void ReplyTail::Push(int32_t id) {
  if (id >= first_special_) return ids_.clear();
  ids_.push_back(id);
  if (ids_.size() > kTokens) ids_.erase(ids_.begin());
}

std::string ReplyTail::Marker(std::string_view bytes) {
  return tok::CompleteUtf8Prefix(bytes) < bytes.size() ? "\xEF\xBF\xBD" : "";
}

int32_t FirstSpecialId(const v1::ModelInfo& info) {
  int32_t first = info.vocab_size();
  for (const auto& s : info.special_tokens()) first = std::min(first, s.id());
  return first;
}

}  // namespace coli::client
