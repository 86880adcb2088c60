// Large heap blocks that the kernel may back with 2 MiB transparent huge pages.
//
// Weights and expert slots are streamed from memory once per token; with 4 KiB pages every
// 4 KiB of a stream costs a TLB entry and the hardware prefetchers stop at each page boundary.
// Many distributions ship THP in "madvise" mode, where only regions marked MADV_HUGEPAGE get huge
// pages, so blocks of at least kHugePageBytes are 2 MiB aligned and their whole huge pages are
// marked before their first touch (a partial last one keeps 4 KiB pages). COLI_HUGEPAGES=0 turns
// the marking off (plain 4 KiB pages, same alignment); smaller blocks are plain aligned
// allocations.
//
//   std::vector<uint8_t, coli::memory::HugePageAllocator<uint8_t>> weights(bytes);
//   void* p = coli::memory::AllocateLarge(bytes, 4096);  ...  coli::memory::FreeLarge(p);
#ifndef COLI_COMMON_MEMORY_HUGE_PAGES_H_
#define COLI_COMMON_MEMORY_HUGE_PAGES_H_

#include <cstddef>
#include <new>

namespace coli::memory {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Whether large blocks are marked MADV_HUGEPAGE (COLI_HUGEPAGES, read once; default on).
bool HugePagesEnabled();

// `bytes` (>= 1) aligned to max(alignment, 64), and to 2 MiB (marked for huge pages) when bytes
// >= kHugePageBytes. `alignment` is a power of two <= kHugePageBytes. Null when out of memory.
// Release with FreeLarge.
void* AllocateLarge(size_t bytes, size_t alignment = 64) noexcept;
void FreeLarge(void* p) noexcept;

// std::allocator-compatible; element storage comes from AllocateLarge.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    void* p =
        AllocateLarge(n * sizeof(T) == 0 ? 1 : n * sizeof(T), alignof(T) < 64 ? 64 : alignof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { FreeLarge(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace coli::memory

#endif  // COLI_COMMON_MEMORY_HUGE_PAGES_H_
