// Enforcing response_format on K3 output; see constrained.h.
#include "plugins/kimi_k3/constrained.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/chat_parser.h"

namespace coli::k3 {

absl::StatusOr<std::unique_ptr<ConstraintVocab>> ConstraintVocab::Build(
    const tok::Tokenizer& tokenizer, int32_t vocab_size, std::span<const int32_t> stop_ids) {
  std::unique_ptr<ConstraintVocab> v(new ConstraintVocab());
  v->bytes_.resize(static_cast<size_t>(std::max(vocab_size, 0)));
  const int32_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < known; ++id) {
    if (!tokenizer.IsSpecial(id)) v->bytes_[id] = std::string(tokenizer.TokenBytes(id));
  }
  for (int32_t id : stop_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("response_format: stop token id ", id, " is outside [0, ", vocab_size, ")"));
    }
    v->stop_ids_.push_back(id);
  }
  if (absl::StatusOr<StructuralIds> ids = FindStructuralIds(tokenizer); ids.ok()) {
    v->open_ = ids->open;
    v->close_ = ids->close;
    v->sep_ = ids->sep;
    v->end_of_msg_ = ids->end_of_msg;
    v->think_ = tokenizer.Encode("think", false);
    v->response_ = tokenizer.Encode("response", false);
    v->message_ = tokenizer.Encode("message", false);
  }
  v->filter_ = std::make_unique<grammar::TokenFilter>(v->bytes_);
  return v;
}

AnswerConstraint::AnswerConstraint(std::shared_ptr<const grammar::JsonConstraint> constraint,
                                   const ConstraintVocab& vocab, bool chat)
    : vocab_(&vocab), matcher_(std::move(constraint)), chat_(chat) {}

absl::StatusOr<AnswerConstraint> AnswerConstraint::Create(
    std::shared_ptr<const grammar::JsonConstraint> constraint, const ConstraintVocab& vocab,
    int32_t chat_parse_mode) {
  if (constraint == nullptr) {
    return absl::InvalidArgumentError("response_format: no constraint to enforce");
  }
  if (chat_parse_mode == 0) return AnswerConstraint(std::move(constraint), vocab, false);
  if (chat_parse_mode != kParseInThink && chat_parse_mode != kParseInResponse &&
      chat_parse_mode != kParseOutside) {
    return absl::InvalidArgumentError(
        absl::StrCat("response_format: chat parse mode ", chat_parse_mode, " is not a K3 mode"));
  }
  if (!vocab.has_structure()) {
    return absl::InvalidArgumentError(
        "response_format: the tokenizer has no XTML tokens, so a chat answer cannot be found");
  }
  // Without a generation prompt the model writes its message's structure itself; the
  // constraint then covers everything it writes, as for plain text.
  AnswerConstraint a(std::move(constraint), vocab, chat_parse_mode != kParseOutside);
  if (chat_parse_mode == kParseInThink) a.phase_ = Phase::kThink;
  return a;
}

void AnswerConstraint::Allowed(std::vector<uint8_t>* allowed) const {
  const ConstraintVocab& v = *vocab_;
  const size_t n = v.bytes_.size();
  switch (phase_) {
    case Phase::kDone:
      allowed->assign(n, 1);
      return;
    case Phase::kForced:
      allowed->assign(n, 0);
      (*allowed)[forced_[forced_pos_]] = 1;
      return;
    case Phase::kThink:
      // Free reasoning text; the only structure allowed is the <|close|> that ends it.
      allowed->resize(n);
      for (size_t i = 0; i < n; ++i) (*allowed)[i] = v.bytes_[i].empty() ? 0 : 1;
      (*allowed)[v.close_] = 1;
      return;
    case Phase::kAnswer:
      break;
  }
  if (matcher_.MustEnd()) {
    allowed->assign(n, 0);
  } else {
    v.filter_->Allowed(matcher_, allowed);
    allowed->resize(n, 0);
  }
  if (matcher_.CanEnd()) {
    for (int32_t id : v.stop_ids_) (*allowed)[id] = 1;
    if (chat_) (*allowed)[v.close_] = 1;
  }
}

absl::Status AnswerConstraint::Mask(std::span<float> logits) const {
  std::vector<uint8_t> allowed;
  Allowed(&allowed);
  if (logits.size() != allowed.size()) {
    return absl::InternalError(absl::StrCat("response_format: ", logits.size(),
                                            " logits for a vocabulary of ", allowed.size()));
  }
  bool any = false;
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (allowed[i] == 0) {
      logits[i] = kMinusInf;
    } else {
      any = true;
    }
  }
  if (!any) {
    return absl::InternalError(
        absl::StrCat("response_format: no token of the vocabulary continues "
                     "the answer after byte ",
                     matcher_.consumed()));
  }
  return absl::OkStatus();
}

void AnswerConstraint::Accept(int32_t id) {
  const ConstraintVocab& v = *vocab_;
  if (id < 0 || id >= static_cast<int32_t>(v.bytes_.size())) {
    phase_ = Phase::kDone;
    return;
  }
  const bool stop = std::find(v.stop_ids_.begin(), v.stop_ids_.end(), id) != v.stop_ids_.end();
  switch (phase_) {
    case Phase::kDone:
      return;
    case Phase::kForced:
      if (id != forced_[forced_pos_]) {
        phase_ = Phase::kDone;
        return;
      }
      if (++forced_pos_ == forced_.size()) phase_ = after_forced_;
      return;
    case Phase::kThink:
      if (id == v.close_) {
        // `think<|sep|><|open|>response<|sep|>`, then the answer.
        forced_ = v.think_;
        forced_.push_back(v.sep_);
        forced_.push_back(v.open_);
        forced_.insert(forced_.end(), v.response_.begin(), v.response_.end());
        forced_.push_back(v.sep_);
        forced_pos_ = 0;
        phase_ = Phase::kForced;
        after_forced_ = Phase::kAnswer;
      } else if (v.bytes_[id].empty()) {
        phase_ = Phase::kDone;  // not an allowed token
      }
      return;
    case Phase::kAnswer:
      break;
  }
  if (stop) {
    phase_ = Phase::kDone;
    return;
  }
  if (chat_ && id == v.close_) {
    // The well-formed end: `response<|sep|><|close|>message<|sep|><|end_of_msg|>`.
    forced_ = v.response_;
    forced_.push_back(v.sep_);
    forced_.push_back(v.close_);
    forced_.insert(forced_.end(), v.message_.begin(), v.message_.end());
    forced_.push_back(v.sep_);
    forced_.push_back(v.end_of_msg_);
    forced_pos_ = 0;
    phase_ = Phase::kForced;
    after_forced_ = Phase::kDone;
    return;
  }
  if (v.bytes_[id].empty() || !matcher_.Accept(v.bytes_[id])) phase_ = Phase::kDone;
}

}  // namespace coli::k3
