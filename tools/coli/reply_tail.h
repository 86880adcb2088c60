// tools/coli/reply_tail: did a reply end inside a UTF-8 character? The host's streaming decoder
// holds a character's first bytes back until the character completes, so a reply cut there (by
// max_tokens, the context or a stop) lost them. coli run, coli chat and coli serve end such a
// reply with U+FFFD instead, as a UTF-8 decoder with replacement shows a truncated sequence
// (Python's, llama.cpp's JSON).
//
//   ReplyTail tail(FirstSpecialId(model_info));
//   tail.Push(token.id());                          // every generated token
//   ...                                             // the reply ended (not on a stop token)
//   reply += ReplyTail::Marker(detokenize(tail.ids()));  // the tokens' own bytes, unreplaced
#ifndef COLI_TOOLS_COLI_REPLY_TAIL_H_
#define COLI_TOOLS_COLI_REPLY_TAIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coli/v1/coli.pb.h"

namespace coli::client {

class ReplyTail {
 public:
  // An unfinished character has at most 3 bytes, and every token at least one.
  static constexpr size_t kTokens = 4;

  explicit ReplyTail(int32_t first_special) : first_special_(first_special) {}

  // Keeps the last kTokens ids. A special token clears them: text after it starts afresh (the
  // model's parser flushed any unfinished character before it).
  void Push(int32_t id);
  const std::vector<int32_t>& ids() const { return ids_; }
  bool empty() const { return ids_.empty(); }

  // U+FFFD when `bytes` (the tail's tokens detokenized) end inside a character, else "".
  static std::string Marker(std::string_view bytes);

 private:
  int32_t first_special_;
  std::vector<int32_t> ids_;
};

// The lowest special-token id of a model (its vocabulary size when it lists none).
int32_t FirstSpecialId(const v1::ModelInfo& info);

}  // namespace coli::client

#endif  // COLI_TOOLS_COLI_REPLY_TAIL_H_
