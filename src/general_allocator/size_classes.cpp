// Size classes: compile-time checks of the class table's properties the allocator relies on.
//
// Class 0 holds 8-byte blocks; classes 1..8 are multiples of 16 up to 128; above that there are
// four classes per power of two, so the rounding waste is at most 25% (12.5% on average). Two
// properties matter beyond the waste:
//  - class_of() is a table lookup up to 8 KiB and a few bit operations above, with no loop, so the
//    fast path is O(1);
//  - a request rounded up to a multiple of a power of two A (A <= 64 KiB) lands in a class whose
//    block size is a multiple of A, so its blocks, laid out from a 64 KiB-aligned page start, are
//    all A-aligned: aligned allocations need no padding and no interior pointers.
#include "internal.hpp"

namespace memkit::gpa {

namespace {

// The class of the smallest request of `size` (a multiple of 16) or less, computed the slow way.
constexpr std::uint8_t class_for(std::size_t size) noexcept {
  std::size_t c = 1;
  while (class_block_size(c) < size) ++c;
  return static_cast<std::uint8_t>(c);
}

constexpr class_table make_small_class_table() noexcept {
  class_table t{};
  t.entries[0] = 1;  // size 0 is served as 1 byte by the callers; keep the entry valid anyway
  for (std::size_t i = 1; i <= small_table_max / 16; ++i) t.entries[i] = class_for(i * 16);
  return t;
}

}  // namespace

constexpr class_table small_class_table = make_small_class_table();

namespace {

constexpr std::size_t lowest_bit(std::size_t x) noexcept { return x & (~x + 1); }

constexpr bool classes_are_increasing() noexcept {
  for (std::size_t c = 1; c < class_count; ++c) {
    if (class_block_size(c) <= class_block_size(c - 1)) return false;
  }
  return class_block_size(class_count - 1) == large_max;
}

constexpr bool aligned_requests_get_aligned_blocks() noexcept {
  for (std::size_t a = 16; a <= max_class_alignment; a *= 2) {
    for (std::size_t c = 1; c < class_count; ++c) {
      // The smallest multiple of `a` that lands in class c, if any, must get an a-aligned block.
      const std::size_t first = (class_block_size(c - 1) / a + 1) * a;
      const std::size_t bs = class_block_size(c);
      if (first <= bs && lowest_bit(bs) < a) return false;
    }
  }
  return true;
}

static_assert(classes_are_increasing(), "size classes must grow and end at large_max");
static_assert(aligned_requests_get_aligned_blocks(),
              "a size rounded up to alignment A must land in a class of A-aligned blocks");

}  // namespace
}  // namespace memkit::gpa
