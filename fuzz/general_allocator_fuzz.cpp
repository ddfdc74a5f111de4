// libFuzzer harness for general_allocator: random sequences of its C++ API (allocate,
// allocate_zeroed, allocate_at_least, free, sized deallocate, resize, reallocate,
// reallocate_unsized, purge) and of the drop-in's C functions, checked against a model after every
// step: contents written on allocation and checked before free, alignment, no two live blocks
// overlapping, usable size at least the request, and the statistics' live block count equal to
// the model's.
//
// The drop-in's entry points (src/malloc/entry_points.cpp) serve general_allocator::global()
// only, and a harness must keep no state across inputs, so the C functions are driven here with
// the same semantics over a private instance: malloc, calloc, realloc, reallocarray,
// posix_memalign, aligned_alloc, memalign, free, free_sized and malloc_usable_size follow glibc
// exactly as entry_points.cpp does (the helpers below restate its rules, not its code paths).
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_support.hpp"
#include "memkit/general_allocator.hpp"

namespace {

using memkit::general_allocator;
using memkit::fuzzing::block_model;
using memkit::fuzzing::input;

constexpr std::size_t malloc_alignment = alignof(std::max_align_t);
constexpr std::size_t largest_request = PTRDIFF_MAX;

// glibc's rules, as the drop-in implements them.
struct c_functions {
  general_allocator& g;

  void* malloc(std::size_t size) const noexcept {
    if (size > largest_request) {
      errno = ENOMEM;
      return nullptr;
    }
    return g.allocate(size, malloc_alignment);
  }
  void* calloc(std::size_t count, std::size_t size) const noexcept {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, size, &bytes) || bytes > largest_request) {
      errno = ENOMEM;
      return nullptr;
    }
    return g.allocate_zeroed(bytes, malloc_alignment);
  }
  void* realloc(void* p, std::size_t size) const noexcept {
    if (p == nullptr) return malloc(size);
    if (size == 0) {
      g.free(p);
      return nullptr;
    }
    if (size > largest_request) {
      errno = ENOMEM;
      return nullptr;
    }
    return g.reallocate_unsized(p, size);
  }
  void* reallocarray(void* p, std::size_t count, std::size_t size) const noexcept {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, size, &bytes)) {
      errno = ENOMEM;
      return nullptr;
    }
    return realloc(p, bytes);
  }
  void* memalign(std::size_t alignment, std::size_t size) const noexcept {
    if (alignment <= malloc_alignment) return malloc(size);
    if (alignment > SIZE_MAX / 2 + 1) {
      errno = EINVAL;
      return nullptr;
    }
    if (!memkit::detail::is_power_of_two(alignment)) {
      std::size_t rounded = malloc_alignment * 2;
      while (rounded < alignment) rounded <<= 1;
      alignment = rounded;
    }
    if (size > largest_request - alignment) {
      errno = ENOMEM;
      return nullptr;
    }
    return g.allocate(size, alignment);
  }
  void* aligned_alloc(std::size_t alignment, std::size_t size) const noexcept { return memalign(alignment, size); }
  int posix_memalign(void** out, std::size_t alignment, std::size_t size) const noexcept {
    if (alignment == 0 || alignment % sizeof(void*) != 0 ||
        !memkit::detail::is_power_of_two(alignment / sizeof(void*)))
      return EINVAL;
    void* p = memalign(alignment, size);
    if (p == nullptr) return ENOMEM;
    *out = p;
    return 0;
  }
  void free(void* p) const noexcept {
    if (p != nullptr) g.free(p);
  }
  void free_sized(void* p, std::size_t size) const noexcept { g.deallocate(p, size); }
  std::size_t malloc_usable_size(const void* p) const noexcept { return p == nullptr ? 0 : g.usable_size(p); }
};

// The alignment the model expects from a memalign-family call.
std::size_t effective_alignment(std::size_t alignment) {
  if (alignment <= malloc_alignment) return malloc_alignment;
  std::size_t rounded = 1;
  while (rounded < alignment) rounded <<= 1;
  return rounded;
}

struct harness {
  general_allocator& g;
  c_functions c{g};
  block_model model;
  bool debug;
  bool quarantine;
  // Largest ordinary request. Debug mode fills and checks every freed byte and moves every
  // reallocated block, so multi-megabyte blocks there cost milliseconds each: its inputs ask for
  // at most 512 KiB, and the other inputs cover the large blocks.
  std::size_t large;
  // Largest successful calloc or realloc, whose sizes are products: zeroing a reused block, debug
  // mode's fill of a new one and a C realloc's populating of the pages a large block grows by each
  // touch every page, and products of hundreds of megabytes took most of the harness's time.
  // Requests beyond it that must fail (overflow, beyond max_allocation_size) are still made.
  std::size_t largest_product;

  std::size_t usable(void* p) const { return g.usable_size(p); }

  void added(void* p, std::size_t size, std::size_t alignment) {
    const std::size_t u = usable(p);
    MEMKIT_FUZZ_CHECK(u >= size);
    MEMKIT_FUZZ_CHECK(g.owns(p));
    model.add(p, size, alignment, u);
  }

  void* pick(input& in) { return model.empty() ? nullptr : model.nth(in.below(model.count())); }

  // A size for a request whose every byte is written before it returns (calloc, allocate_zeroed:
  // each page of a fresh block is a fault): as in.size(), but one in eight large draws reaches
  // `large`, the others an eighth of it.
  std::size_t zeroed_size(input& in) { return in.size(in.below(8) == 0 ? large : large / 8); }

  // A size for a C request: ordinary, or one of the values near the limits.
  std::size_t c_size(input& in) {
    if (in.below(32) != 0) return in.size(large);
    static constexpr std::size_t edges[] = {PTRDIFF_MAX, std::size_t{PTRDIFF_MAX} + 1, SIZE_MAX,
                                            general_allocator::max_allocation_size + 1, SIZE_MAX / 2};
    return edges[in.below(std::size(edges))];
  }

  void step(input& in) {
    switch (in.below(16)) {
      case 0:
      case 1: {  // malloc
        const std::size_t size = c_size(in);
        void* p = c.malloc(size);
        if (size > general_allocator::max_allocation_size) MEMKIT_FUZZ_CHECK(p == nullptr && errno == ENOMEM);
        if (p == nullptr) return;
        added(p, size, malloc_alignment);
        return;
      }
      case 2: {  // calloc
        // Products distributed as zeroed_size's, and now and then any count and size (overflows,
        // edges): calloc zeroes what it returns, so its cost is its size.
        const bool any = in.below(8) == 0;
        const std::size_t size = any && in.coin() ? c_size(in) : in.below(65);
        const std::size_t count = any ? c_size(in) : size == 0 ? in.below(300) : zeroed_size(in) / size + in.below(2);
        std::size_t bytes = 0;
        const bool overflows = __builtin_mul_overflow(count, size, &bytes);
        if (!overflows && bytes > largest_product && bytes <= general_allocator::max_allocation_size) return;
        void* p = c.calloc(count, size);
        if (overflows) MEMKIT_FUZZ_CHECK(p == nullptr && errno == ENOMEM);
        if (p == nullptr) return;
        MEMKIT_FUZZ_CHECK(memkit::fuzzing::zeroed(static_cast<const unsigned char*>(p), bytes));
        added(p, bytes, malloc_alignment);
        return;
      }
      case 3:
      case 4: {  // realloc / reallocarray, on a live block or null
        void* p = in.below(8) == 0 ? nullptr : pick(in);
        const bool array = in.below(4) == 0;
        std::size_t size = 0, count = 1, element = 0;
        if (array) {
          count = in.below(4) == 0 ? c_size(in) : in.below(200);
          element = in.below(4) == 0 ? c_size(in) : in.below(33);
        } else {
          size = in.below(8) == 0 ? 0 : c_size(in);
        }
        bool overflows = false;
        if (array) overflows = __builtin_mul_overflow(count, element, &size);
        if (!overflows && size > largest_product && size <= general_allocator::max_allocation_size) return;
        const std::size_t old_size = p == nullptr ? 0 : model.at(p).size;
        if (p != nullptr) model.check_contents(p);
        void* q = array ? c.reallocarray(p, count, element) : c.realloc(p, size);
        if (overflows) {
          MEMKIT_FUZZ_CHECK(q == nullptr && errno == ENOMEM);
          return;  // p untouched, still live
        }
        if (p != nullptr && size == 0) {  // freed
          MEMKIT_FUZZ_CHECK(q == nullptr);
          model.remove_unchecked(p);
          return;
        }
        if (q == nullptr) {  // failure keeps p
          if (p != nullptr) model.check_contents(p);
          return;
        }
        if (p == nullptr) {
          added(q, size, malloc_alignment);
          return;
        }
        const std::size_t kept = old_size < size ? old_size : size;
        // A block that stays where it is keeps the alignment it had: one from the C++ API with a
        // smaller alignment than malloc's (an 8-byte block, say) is not moved just to align it.
        const std::size_t promised =
            q == p ? std::min(malloc_alignment, model.at(p).alignment) : malloc_alignment;
        MEMKIT_FUZZ_CHECK(reinterpret_cast<std::uintptr_t>(q) % promised == 0);
        MEMKIT_FUZZ_CHECK(usable(q) >= size);
        if (q == p) {
          MEMKIT_FUZZ_CHECK(memkit::fuzzing::holds_prefix(static_cast<unsigned char*>(q), old_size, kept, model.at(p).id));
          model.resize(q, size, usable(q));
        } else {
          model.moved(p, q, kept, size, malloc_alignment, usable(q));
        }
        return;
      }
      case 5: {  // posix_memalign with valid and invalid alignments
        static constexpr std::size_t alignments[] = {0, 1, 4, 8, 16, 24, 32, 48, 64, 128, 4096, 8192, 65536, 1u << 21};
        const std::size_t alignment = alignments[in.below(std::size(alignments))];
        const std::size_t size = c_size(in);
        void* out = reinterpret_cast<void*>(std::uintptr_t{0x1234});
        const int result = c.posix_memalign(&out, alignment, size);
        const bool valid = alignment != 0 && alignment % sizeof(void*) == 0 &&
                           memkit::detail::is_power_of_two(alignment / sizeof(void*));
        if (!valid) {
          MEMKIT_FUZZ_CHECK(result == EINVAL && out == reinterpret_cast<void*>(std::uintptr_t{0x1234}));
          return;
        }
        if (result != 0) {
          MEMKIT_FUZZ_CHECK(result == ENOMEM && out == reinterpret_cast<void*>(std::uintptr_t{0x1234}));
          return;
        }
        added(out, size, alignment);
        return;
      }
      case 6: {  // aligned_alloc / memalign, alignments that are powers of two or not
        const std::size_t alignment = in.below(4) == 0 ? in.below(5000) : in.alignment(16);
        const std::size_t size = c_size(in);
        void* p = in.coin() ? c.aligned_alloc(alignment, size) : c.memalign(alignment, size);
        if (p == nullptr) return;
        added(p, size, effective_alignment(alignment));
        return;
      }
      case 7:
      case 8: {  // free / free_sized / sized deallocate
        void* p = pick(in);
        if (p == nullptr) {
          c.free(nullptr);
          return;
        }
        const std::size_t size = model.at(p).size;
        const std::size_t alignment = model.at(p).alignment;
        model.remove(p);
        const int saved = errno = 12345;
        switch (in.below(3)) {
          case 0: c.free(p); break;
          case 1: c.free_sized(p, size); break;
          default: g.deallocate(p, size, alignment); break;
        }
        MEMKIT_FUZZ_CHECK(errno == saved);  // free preserves errno
        return;
      }
      case 9: {  // malloc_usable_size: the whole usable size is the caller's
        void* p = pick(in);
        if (p == nullptr) {
          MEMKIT_FUZZ_CHECK(c.malloc_usable_size(nullptr) == 0);
          return;
        }
        const std::size_t u = c.malloc_usable_size(p);
        const std::size_t size = model.at(p).size;
        MEMKIT_FUZZ_CHECK(u >= size);
        if (u > size && u - size <= 65536) {
          model.check_contents(p);
          model.resize(p, u, u);  // writes the pattern into the slack
        }
        return;
      }
      case 10:
      case 11: {  // C++ allocate / allocate_zeroed / allocate_at_least with any alignment
        const std::size_t size = in.size(large);
        const std::size_t alignment = in.alignment(in.below(8) == 0 ? 22 : 12);
        switch (in.below(3)) {
          case 0: {
            void* p = g.allocate(size, alignment);
            if (p != nullptr) added(p, size, alignment);
            return;
          }
          case 1: {
            // Seven in eight large requests shrink to an eighth of `large` (see zeroed_size).
            const std::size_t bytes = size <= large / 8 || in.below(8) == 0 ? size : in.below(large / 8 + 1);
            auto* p = static_cast<unsigned char*>(g.allocate_zeroed(bytes, alignment));
            if (p == nullptr) return;
            MEMKIT_FUZZ_CHECK(memkit::fuzzing::zeroed(p, bytes));
            added(p, bytes, alignment);
            return;
          }
          default: {
            const memkit::allocation a = static_cast<memkit::allocator&>(g).allocate_at_least(size, alignment);
            if (a.pointer == nullptr) return;
            MEMKIT_FUZZ_CHECK(a.size >= (size == 0 ? 1 : size) && a.size <= usable(a.pointer));
            added(a.pointer, a.size, alignment);  // all of it is the caller's
            return;
          }
        }
      }
      case 12: {  // resize in place (never moves)
        void* p = pick(in);
        if (p == nullptr) return;
        const memkit::fuzzing::live_block b = model.at(p);
        const std::size_t new_size = in.coin() ? in.size(large) : b.size + in.below(4096);
        model.check_contents(p);
        if (static_cast<memkit::allocator&>(g).resize(p, b.size, new_size, b.alignment)) {
          MEMKIT_FUZZ_CHECK(usable(p) >= new_size);
          const std::size_t kept = b.size < new_size ? b.size : new_size;
          MEMKIT_FUZZ_CHECK(memkit::fuzzing::holds_prefix(static_cast<unsigned char*>(p), b.size, kept, b.id));
          model.resize(p, new_size, usable(p));
        } else {
          model.check_contents(p);
        }
        return;
      }
      case 13: {  // reallocate through the interface, keeping `used` bytes, or reallocate_unsized
        void* p = pick(in);
        if (p == nullptr) return;
        const memkit::fuzzing::live_block b = model.at(p);
        const std::size_t new_size = in.size(large);
        model.check_contents(p);
        void* q = nullptr;
        std::size_t kept = b.size < new_size ? b.size : new_size;
        if (in.coin()) {
          const std::size_t used = in.below(kept + 1);
          q = static_cast<memkit::allocator&>(g).reallocate(p, b.size, used, new_size, b.alignment);
          if (q != nullptr && q != p) kept = used;
        } else {
          q = g.reallocate_unsized(p, new_size, b.alignment);
        }
        if (q == nullptr) {
          model.check_contents(p);
          return;
        }
        MEMKIT_FUZZ_CHECK(usable(q) >= new_size);
        if (q == p) {
          MEMKIT_FUZZ_CHECK(memkit::fuzzing::holds_prefix(static_cast<unsigned char*>(q), b.size, kept, b.id));
          model.resize(q, new_size, usable(q));
        } else {
          model.moved(p, q, kept, new_size, b.alignment, usable(q));
        }
        return;
      }
      case 14:
        if (in.below(8) == 0) g.purge();
        return;
      default: {  // good_size agrees with what a request gets
        const std::size_t size = in.size(1u << 20);
        const std::size_t good = g.good_size(size);
        MEMKIT_FUZZ_CHECK(good >= size);
        return;
      }
    }
  }

  void check_statistics() const {
    const auto s = g.statistics();
    MEMKIT_FUZZ_CHECK(s.allocations >= s.frees);
    // Debug mode's quarantine holds freed blocks, which the counters still count as live.
    if (quarantine) MEMKIT_FUZZ_CHECK(s.allocations - s.frees >= model.count());
    else MEMKIT_FUZZ_CHECK(s.allocations - s.frees == model.count());
    std::size_t requested = 0;
    for (const auto& [at, b] : model.blocks()) requested += b.size;
    MEMKIT_FUZZ_CHECK(s.live_bytes >= requested || debug);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  general_allocator::options options;
  options.debug = in.below(4) == 0;
  options.capture_stack_traces = false;
  options.quarantine_bytes = in.coin() ? 0 : std::size_t{64} << 10;
  options.never_reuse_addresses = in.below(8) == 0;
  options.purge_delay_ms = UINT32_MAX;  // purging by time would make runs depend on the clock
  options.retained_limit = in.below(4) == 0 ? 0 : std::size_t{64} << 20;
  general_allocator g(options);
  harness h{g, {g}, {}, options.debug, options.debug && options.quarantine_bytes != 0,
            options.debug ? std::size_t{512} << 10 : std::size_t{4} << 20,
            options.debug ? std::size_t{512} << 10 : std::size_t{8} << 20};
  while (!in.empty()) {
    h.step(in);
    h.check_statistics();
  }
  while (!h.model.empty()) {
    void* p = h.model.nth(0);
    h.model.remove(p);
    g.free(p);
  }
  h.check_statistics();
  return 0;
}
