// XTML output parsing (spec §6.3); see chat_parser.h.
#include "plugins/kimi_k3/chat_parser.h"

#include <map>

#include "common/status/status.h"
#include "common/tokenizer/utf8.h"

namespace coli::k3 {
namespace {

// "call tool=\"x\" index=\"1\"" -> name "call" and the unescaped attributes.
struct Tag {
  std::string name;
  std::map<std::string, std::string> attrs;
};

std::string Unescape(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.substr(i, 6) == "&quot;") {
      out.push_back('"');
      i += 5;
    } else if (v.substr(i, 5) == "&amp;") {
      out.push_back('&');
      i += 4;
    } else {
      out.push_back(v[i]);
    }
  }
  return out;
}

Tag ParseTag(std::string_view run) {
  Tag tag;
  size_t pos = run.find(' ');
  tag.name = std::string(run.substr(0, pos));
  while (pos != std::string_view::npos && pos < run.size()) {
    while (pos < run.size() && run[pos] == ' ') ++pos;
    const size_t eq = run.find("=\"", pos);
    if (eq == std::string_view::npos) break;
    const size_t end = run.find('"', eq + 2);
    if (end == std::string_view::npos) break;
    tag.attrs[std::string(run.substr(pos, eq - pos))] = Unescape(run.substr(eq + 2, end - eq - 2));
    pos = end + 1;
  }
  return tag;
}

// A typed argument value back to JSON; a value that does not read as its declared type is kept
// as the string the model wrote (nothing the model generated is dropped).
Json TypedValue(const std::string& type, const std::string& text) {
  if (type == "string") return text;
  absl::StatusOr<Json> parsed = ParsePyJson(text);
  if (parsed.ok()) {
    const bool matches =
        (type == "number" && parsed->is_number()) || (type == "boolean" && parsed->is_boolean()) ||
        (type == "null" && parsed->is_null()) || (type == "object" && parsed->is_object()) ||
        (type == "array" && parsed->is_array());
    if (matches) return *std::move(parsed);
  }
  return text;
}

// Compact JSON as the complete call event serialises it (and `coli serve` its arguments).
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool IsBlankAscii(std::string_view s) {
  return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

}  // namespace

int32_t ParseModeFor(const RenderedChat& chat) {
  if (!chat.add_generation_prompt && !chat.continues_final_message) return kParseOutside;
  return chat.thinking ? kParseInThink : kParseInResponse;
}

absl::StatusOr<StructuralIds> FindStructuralIds(const tok::Tokenizer& tokenizer) {
  StructuralIds ids;
  const std::pair<std::string_view, int32_t*> wanted[] = {{kOpenToken, &ids.open},
                                                          {kCloseToken, &ids.close},
                                                          {kSepToken, &ids.sep},
                                                          {kEndOfMsgToken, &ids.end_of_msg}};
  for (const auto& [name, slot] : wanted) {
    std::optional<int32_t> id = tokenizer.TokenId(name);
    if (!id || !tokenizer.IsSpecial(*id)) {
      return absl::InvalidArgumentError(
          Cat("tokenizer has no special token '", name, "' (XTML needs it)", kSpecialsHint));
    }
    *slot = *id;
  }
  return ids;
}

absl::StatusOr<OutputParser> OutputParser::Create(const tok::Tokenizer& tokenizer, int32_t mode) {
  if (mode != kParseInThink && mode != kParseInResponse && mode != kParseOutside) {
    return absl::InvalidArgumentError(Cat("chat parse mode ", mode, " is not a K3 mode"));
  }
  COLI_ASSIGN_OR_RETURN(StructuralIds ids, FindStructuralIds(tokenizer));
  OutputParser parser(ids, static_cast<ParseMode>(mode));
  parser.tokenizer_ = &tokenizer;
  return parser;
}

OutputParser::OutputParser(StructuralIds ids, ParseMode mode) : ids_(ids) {
  state_ = mode == kParseInThink      ? State::kThink
           : mode == kParseInResponse ? State::kResponse
                                      : State::kOutside;
  if (mode == kParseInResponse) saw_response_ = true;
}

std::vector<ChatEvent> OutputParser::Feed(int32_t id) {
  if (tokenizer_ == nullptr) return {};
  return Feed(id, tokenizer_->TokenBytes(id), tokenizer_->IsSpecial(id));
}

void OutputParser::Emit(ChatChannel channel, std::string* pending, bool flush,
                        std::vector<ChatEvent>* out) {
  const size_t n = flush ? pending->size() : tok::CompleteUtf8Prefix(*pending);
  if (n == 0 && pending->empty()) return;
  ChatEvent e;
  e.channel = channel;
  // Bytes of an unfinished character only: an event without text names the channel that holds
  // them, so a client whose reply is cut here (max_tokens) knows where they belong (abi.md).
  if (n == 0) {
    out->push_back(std::move(e));
    return;
  }
  // Events carry text (a proto3 string downstream): bytes that never form a character, e.g. a
  // partial one cut by a structural token, become U+FFFD as a UTF-8 decoder with replacement
  // would make them.
  e.text = tok::ReplaceInvalidUtf8(std::string_view(*pending).substr(0, n));
  pending->erase(0, n);
  out->push_back(std::move(e));
}

void OutputParser::AppendDelta(std::string_view piece) {
  delta_args_.append(piece);
  streamed_.append(piece);
}

std::string OutputParser::StreamText(std::string* pending, bool flush, bool escape) {
  const size_t n = flush ? pending->size() : tok::CompleteUtf8Prefix(*pending);
  std::string text = tok::ReplaceInvalidUtf8(std::string_view(*pending).substr(0, n));
  pending->erase(0, n);
  if (text.empty()) return text;
  if (escape) {
    // Valid UTF-8 escapes character by character, so the escaped pieces join to the escaped
    // whole: the string's serialisation without its quotes.
    const std::string quoted = Dump(Json(text));
    AppendDelta(std::string_view(quoted).substr(1, quoted.size() - 2));
  } else {
    AppendDelta(text);
  }
  return text;
}

void OutputParser::FlushDelta(std::vector<ChatEvent>* out) {
  if (!delta_first_ && delta_args_.empty()) return;
  Json d = Json::object();
  d["index"] = tool_calls_;
  if (delta_first_) d["name"] = call_name_;
  d["arguments"] = delta_args_;
  ChatEvent e;
  e.channel = ChatChannel::kToolCallDelta;
  e.text = Dump(d);
  out->push_back(std::move(e));
  delta_first_ = false;
  delta_args_.clear();
}

void OutputParser::FlushAll(std::vector<ChatEvent>* out) {
  Emit(ChatChannel::kReasoning, &pending_reasoning_, true, out);
  Emit(ChatChannel::kContent, &pending_content_, true, out);
}

void OutputParser::OnText(std::string_view bytes, std::vector<ChatEvent>* out) {
  switch (state_) {
    case State::kThink:
      pending_reasoning_.append(bytes);
      reasoning_all_.append(bytes);
      Emit(ChatChannel::kReasoning, &pending_reasoning_, false, out);
      return;
    case State::kAfterThink:  // the model skipped the response opener: its answer is content
    case State::kResponse:
    case State::kOutside:
      pending_content_.append(bytes);
      Emit(ChatChannel::kContent, &pending_content_, false, out);
      return;
    case State::kArgument:
      if (arg_streams_) {
        stream_pending_.append(bytes);
        arg_value_ += StreamText(&stream_pending_, false, true);
      } else {
        arg_value_.append(bytes);
      }
      return;
    case State::kJson:
      json_block_.append(bytes);
      if (deltas_ && call_kind_ == CallKind::kJson) {
        stream_pending_.append(bytes);
        StreamText(&stream_pending_, false, false);
      }
      return;
    case State::kAfterResponse:
    case State::kTools:
    case State::kCall:
    case State::kDone:
      return;  // between structural elements: not visible text
  }
}

void OutputParser::OnTag(bool close, std::string_view run, std::vector<ChatEvent>* out) {
  FlushAll(out);
  const Tag tag = ParseTag(run);
  const std::string& name = tag.name;
  if (deltas_ && (state_ == State::kCall || state_ == State::kArgument || state_ == State::kJson)) {
    // A call whose pieces are already out stays the current call until it closes (or the
    // output ends: cut short). Any other tag inside it — a call, think, response or tools opened,
    // tools or message closed — is dropped, so the pieces always join to the arguments of the
    // call they were sent for (without deltas such a tag starts over or leaves the call, and the
    // unfinished call is never reported).
    const bool belongs = close ? (name == "argument" && state_ == State::kArgument) ||
                                     (name == "json" && state_ == State::kJson) ||
                                     (name == "call" && state_ == State::kCall)
                               : (name == "argument" || name == "json") && state_ == State::kCall;
    if (!belongs) return;
  }
  if (!close) {
    if (name == "think") {
      state_ = State::kThink;
    } else if (name == "response") {
      saw_response_ = true;
      think_closed_ = true;
      state_ = State::kResponse;
    } else if (name == "tools") {
      state_ = State::kTools;
    } else if (name == "call") {
      auto it = tag.attrs.find("tool");
      call_name_ = it == tag.attrs.end() ? "" : it->second;
      call_args_ = Json::object();
      call_has_json_ = false;
      json_block_.clear();
      state_ = State::kCall;
      call_kind_ = CallKind::kEmpty;
      stream_pending_.clear();
      streamed_.clear();
      delta_args_.clear();
      delta_first_ = deltas_;  // the first delta names the call as soon as it opens
    } else if (name == "argument" && state_ == State::kCall) {
      auto key = tag.attrs.find("key");
      auto type = tag.attrs.find("type");
      arg_key_ = key == tag.attrs.end() ? "" : key->second;
      arg_type_ = type == tag.attrs.end() ? "string" : type->second;
      arg_value_.clear();
      state_ = State::kArgument;
      arg_streams_ = false;
      if (deltas_ && call_kind_ != CallKind::kJson) {
        AppendDelta(call_kind_ == CallKind::kEmpty ? "{" : ",");
        call_kind_ = CallKind::kTyped;
        AppendDelta(Dump(Json(arg_key_)) + ":");
        // A string value streams as generated; any other type is parsed, so it goes whole
        // when its element closes (a value that does not read as its type becomes a string).
        arg_streams_ = arg_type_ == "string";
        if (arg_streams_) AppendDelta("\"");
        stream_pending_.clear();
      }
    } else if (name == "json" && state_ == State::kCall) {
      call_has_json_ = true;
      json_block_.clear();
      state_ = State::kJson;
      if (call_kind_ == CallKind::kEmpty) call_kind_ = CallKind::kJson;
      stream_pending_.clear();
    }
    return;
  }
  if (name == "think") {
    think_closed_ = true;
    if (state_ == State::kThink) state_ = State::kAfterThink;
  } else if (name == "response") {
    if (state_ == State::kResponse) state_ = State::kAfterResponse;
  } else if (name == "argument" && state_ == State::kArgument) {
    if (arg_streams_) {
      arg_value_ += StreamText(&stream_pending_, true, true);
      AppendDelta("\"");
      arg_streams_ = false;
      call_args_[arg_key_] = arg_value_;  // valid UTF-8 already (as streamed)
    } else {
      Json value = TypedValue(arg_type_, arg_value_);
      if (deltas_ && call_kind_ == CallKind::kTyped) AppendDelta(Dump(value));
      call_args_[arg_key_] = std::move(value);
    }
    state_ = State::kCall;
  } else if (name == "json" && state_ == State::kJson) {
    if (deltas_ && call_kind_ == CallKind::kJson) StreamText(&stream_pending_, true, false);
    state_ = State::kCall;
  } else if (name == "call" && state_ == State::kCall) {
    Json call = Json::object();
    call["name"] = call_name_;
    if (call_has_json_) {
      absl::StatusOr<Json> parsed = ParsePyJson(json_block_);
      if (parsed.ok() && parsed->is_object()) {
        call["arguments"] = *std::move(parsed);
      } else {
        call["arguments"] = json_block_;  // raw text, as the model wrote it
      }
    } else {
      call["arguments"] = call_args_;
    }
    if (deltas_) {
      if (call_kind_ == CallKind::kEmpty) AppendDelta("{}");
      if (call_kind_ == CallKind::kTyped) AppendDelta("}");
      // The deltas' text is the call's arguments: when the value above would serialise to
      // anything else (a raw block that is not compact JSON, a repeated key, a typed argument
      // after a raw block), the call carries the streamed text itself.
      const Json& a = call["arguments"];
      if ((a.is_string() ? a.get<std::string>() : Dump(a)) != streamed_) {
        call["arguments"] = streamed_;
      }
      FlushDelta(out);
    }
    ChatEvent e;
    e.channel = ChatChannel::kToolCall;
    e.text = call.dump(-1, ' ', false, Json::error_handler_t::replace);
    out->push_back(std::move(e));
    ++tool_calls_;
    state_ = State::kTools;
  } else if (name == "tools") {
    state_ = State::kAfterResponse;
  } else if (name == "message") {
    state_ = State::kDone;
  }
}

std::vector<ChatEvent> OutputParser::Feed(int32_t id, std::string_view bytes, bool special) {
  std::vector<ChatEvent> out = FeedToken(id, bytes, special);
  FlushDelta(&out);  // one delta per token at most: what the call gained from it
  return out;
}

std::vector<ChatEvent> OutputParser::FeedToken(int32_t id, std::string_view bytes, bool special) {
  std::vector<ChatEvent> out;
  if (ended_) return out;
  if (!special) {
    if (in_run_) {
      run_text_.append(bytes);
    } else {
      OnText(bytes, &out);
    }
    return out;
  }
  if (id == ids_.sep) {
    if (in_run_) {
      in_run_ = false;
      OnTag(run_close_, run_text_, &out);
    }
    return out;  // a stray <|sep|> is structure, never text
  }
  // Any other special token abandons an unfinished structural run (it is dropped, not shown).
  in_run_ = false;
  if (id == ids_.open || id == ids_.close) {
    in_run_ = true;
    run_close_ = id == ids_.close;
    run_text_.clear();
    return out;
  }
  if (id == ids_.end_of_msg) {
    FlushAll(&out);
    // Think-skip fallback: the model answered inside the think channel and ended its message.
    if (!saw_response_ && !think_closed_ && tool_calls_ == 0 && !IsBlankAscii(reasoning_all_)) {
      ChatEvent e;
      e.channel = ChatChannel::kContent;
      e.text = tok::ReplaceInvalidUtf8(reasoning_all_);
      e.moved_from_reasoning = true;
      out.push_back(std::move(e));
    }
    ChatEvent end;
    end.end_of_message = true;
    out.push_back(std::move(end));
    ended_ = true;
    state_ = State::kDone;
    return out;
  }
  return out;  // other specials ([EOS], reserved ids) are never visible text
}

std::vector<ChatEvent> OutputParser::Finish() {
  std::vector<ChatEvent> out;
  FlushAll(&out);
  return out;
}

}  // namespace coli::k3
