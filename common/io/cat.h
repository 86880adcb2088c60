// coli::internal_cat::Cat: absl::StrCat that also takes std::string_view.
//
// Debian's Abseil (20220623) is built with its own absl::string_view, which std::string_view
// does not convert to; the public interfaces of coli use std::string_view. Header-only.
#ifndef COLI_COMMON_IO_CAT_H_
#define COLI_COMMON_IO_CAT_H_

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace coli::internal_cat {

inline absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }
template <typename T>
const T& Av(const T& v) {
  return v;
}
template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(Av(args)...);
}

}  // namespace coli::internal_cat

#endif  // COLI_COMMON_IO_CAT_H_
