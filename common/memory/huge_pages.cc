#include "common/memory/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace coli::memory {

bool HugePagesEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("COLI_HUGEPAGES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

void* AllocateLarge(size_t bytes, size_t alignment) noexcept {
  if (alignment < 64) alignment = 64;
  if (bytes == 0) bytes = 1;
  const bool huge = bytes >= kHugePageBytes;
  if (huge) alignment = kHugePageBytes;
  // aligned_alloc wants a size that is a multiple of the alignment; whole huge pages also keep
  // the marked range inside this block.
  if (bytes > static_cast<size_t>(-1) - alignment) return nullptr;
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (p != nullptr && huge && HugePagesEnabled()) {
    // Advice only: where THP is off or unsupported the block keeps 4 KiB pages. Only the whole
    // huge pages of the requested size: a partial last one stays on 4 KiB pages, so a block
    // never holds up to 2 MiB of memory it does not use.
    (void)::madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
  }
  return p;
}

void FreeLarge(void* p) noexcept { std::free(p); }

}  // namespace coli::memory
