// plugin_api/cpp: small C++ helpers on both sides of the C ABI (header-only, absl only).
//
//   auto args = coli::abi::Init<coli_prefill_args_t>();        // zeroed, struct_size set
//   args.tokens = ids.data(); args.n_tokens = ids.size();
//   coli::abi::ErrorText err;                                    // caller-owned message buffer
//   absl::Status s = err.ToStatus(api->prefill(session, &args, &result, err.get()));
//
// Plugin side, every entry body is guarded so no exception crosses the boundary:
//
//   coli_status_t MyPrefill(coli_session_t* s, const coli_prefill_args_t* a,
//                           coli_prefill_result_t* r, coli_error_t* e) {
//     return coli::abi::Guard(e, [&] { return Impl(s)->Prefill(*a, r); });
//   }
#ifndef COLI_PLUGIN_API_CPP_ABI_UTIL_H_
#define COLI_PLUGIN_API_CPP_ABI_UTIL_H_

#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "plugin_api/coli_plugin.h"

namespace coli::abi {

// A zero-initialised ABI struct with struct_size set.
template <typename T>
T Init() {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  std::memset(&value, 0, sizeof(T));
  value.struct_size = sizeof(T);
  return value;
}

// True when a struct the other side filled (or sized) reaches `Member`'s end: only then may the
// field be read or written.
#define COLI_ABI_HAS_FIELD(ptr, Type, member) \
  ((ptr)->struct_size >= offsetof(Type, member) + sizeof(((Type*)nullptr)->member))

inline coli_string_t Str(std::string_view s) { return coli_string_t{s.data(), s.size()}; }
inline std::string_view View(coli_string_t s) {
  return s.data == nullptr ? std::string_view() : std::string_view(s.data, s.size);
}

inline coli_status_t ToCode(absl::StatusCode code) { return static_cast<coli_status_t>(code); }
inline absl::StatusCode FromCode(coli_status_t code) {
  if (code < 0 || code > COLI_STATUS_UNAUTHENTICATED) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(code);
}

// Writes `message` into a caller-owned error buffer (NUL-terminated, truncated to fit).
inline void WriteError(coli_error_t* error, std::string_view message) {
  if (error == nullptr || error->struct_size < sizeof(coli_error_t)) return;
  error->length = message.size();
  if (error->message == nullptr || error->capacity == 0) return;
  size_t n = message.size() < error->capacity - 1 ? message.size() : error->capacity - 1;
  std::memcpy(error->message, message.data(), n);
  error->message[n] = '\0';
}

// Plugin side: a Status to a code plus the message in the caller's buffer.
inline coli_status_t FromStatus(const absl::Status& status, coli_error_t* error) {
  if (!status.ok())
    WriteError(error, std::string_view(status.message().data(), status.message().size()));
  return ToCode(status.code());
}

// Plugin side: runs `body` (returning absl::Status) and never lets an exception escape.
template <typename Body>
coli_status_t Guard(coli_error_t* error, Body&& body) noexcept {
  try {
    return FromStatus(body(), error);
  } catch (const std::exception& e) {
    return FromStatus(absl::InternalError(absl::StrCat("plugin threw: ", e.what())), error);
  } catch (...) {
    return FromStatus(absl::InternalError("plugin threw a non-standard exception"), error);
  }
}

// Host side: a caller-owned message buffer and the conversion back to absl::Status.
class ErrorText {
 public:
  ErrorText() {
    error_ = Init<coli_error_t>();
    error_.message = buffer_;
    error_.capacity = sizeof(buffer_);
    buffer_[0] = '\0';
  }
  ErrorText(const ErrorText&) = delete;
  ErrorText& operator=(const ErrorText&) = delete;

  coli_error_t* get() { return &error_; }
  std::string_view message() const {
    size_t n = error_.length < sizeof(buffer_) ? error_.length : sizeof(buffer_) - 1;
    return std::string_view(buffer_, n);
  }
  absl::Status ToStatus(coli_status_t code) const {
    if (code == COLI_STATUS_OK) return absl::OkStatus();
    std::string_view text = message();
    if (text.empty()) text = "plugin gave no message";
    return absl::Status(FromCode(code), absl::string_view(text.data(), text.size()));
  }

 private:
  coli_error_t error_;
  char buffer_[2048];
};

// Plugin side: copies `values` into a caller-owned buffer (see the buffer rules in the header).
inline void FillTokens(coli_token_buffer_t* out, std::span<const int32_t> values) {
  size_t n = values.size() < out->capacity ? values.size() : out->capacity;
  if (n > 0) std::memcpy(out->ids, values.data(), n * sizeof(int32_t));
  out->count = values.size();
}
inline void FillBytes(coli_byte_buffer_t* out, std::string_view bytes) {
  size_t n = bytes.size() < out->capacity ? bytes.size() : out->capacity;
  if (n > 0) std::memcpy(out->data, bytes.data(), n);
  out->count = bytes.size();
}

namespace internal {
template <typename Buffer, typename Container, typename Call>
absl::StatusOr<Container> ReadGrowing(Call&& call, size_t first_capacity) {
  Container values(first_capacity, typename Container::value_type());
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto buffer = Init<Buffer>();
    if constexpr (std::is_same_v<Buffer, coli_token_buffer_t>) {
      buffer.ids = values.data();
    } else {
      buffer.data = values.data();
    }
    buffer.capacity = values.size();
    absl::Status status = call(&buffer);
    if (!status.ok()) return status;
    const bool fits = buffer.count <= buffer.capacity;
    values.resize(buffer.count);
    if (fits) return values;
  }
  return absl::InternalError("plugin kept asking for a larger output buffer");
}
}  // namespace internal

// Host side: calls `call(coli_token_buffer_t*)` (returning absl::Status) and grows the buffer
// once when the plugin needed more room.
template <typename Call>
absl::StatusOr<std::vector<int32_t>> ReadTokens(Call&& call, size_t first_capacity = 256) {
  return internal::ReadGrowing<coli_token_buffer_t, std::vector<int32_t>>(std::forward<Call>(call),
                                                                          first_capacity);
}

// The same for bytes (`call(coli_byte_buffer_t*)`).
template <typename Call>
absl::StatusOr<std::string> ReadBytes(Call&& call, size_t first_capacity = 1024) {
  return internal::ReadGrowing<coli_byte_buffer_t, std::string>(std::forward<Call>(call),
                                                                first_capacity);
}

}  // namespace coli::abi

#endif  // COLI_PLUGIN_API_CPP_ABI_UTIL_H_
