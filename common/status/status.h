// common/status: the error macros every fallible call in coli uses.
//
// Debian's Abseil (20220623) has absl::Status and absl::StatusOr but neither
// ABSL_RETURN_IF_ERROR nor ABSL_ASSIGN_OR_RETURN, so coli carries its own:
//
//   absl::StatusOr<Header> ReadHeader(const std::string& path) {
//     COLI_ASSIGN_OR_RETURN(std::string bytes, ReadAll(path));
//     COLI_RETURN_IF_ERROR(CheckMagic(bytes));
//     return Parse(bytes);
//   }
//
// Messages name the thing that failed (file, tensor, key); helpers below prefix context.
#ifndef COLI_COMMON_STATUS_STATUS_H_
#define COLI_COMMON_STATUS_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace coli {

// Returns `status` with "`context`: " put in front of its message; OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

namespace internal_status {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal_status

}  // namespace coli

#define COLI_STATUS_CONCAT_INNER_(a, b) a##b
#define COLI_STATUS_CONCAT_(a, b) COLI_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr) and returns its status if not OK.
#define COLI_RETURN_IF_ERROR(expr)                                               \
  do {                                                                           \
    const auto& coli_status_ref_ = (expr);                                       \
    if (!::coli::internal_status::AsStatus(coli_status_ref_).ok())              \
      return ::coli::internal_status::AsStatus(coli_status_ref_);                \
  } while (0)

// `lhs` is a declaration or an assignable expression; `rexpr` yields absl::StatusOr<T>.
#define COLI_ASSIGN_OR_RETURN(lhs, rexpr) \
  COLI_ASSIGN_OR_RETURN_IMPL_(COLI_STATUS_CONCAT_(coli_statusor_, __LINE__), lhs, rexpr)

#define COLI_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // COLI_COMMON_STATUS_STATUS_H_
