// The drop-in malloc's entry points: the whole glibc allocation family and every replaceable C++
// operator new/delete, all served by memkit::general_allocator::global().
//
// The C functions follow glibc 2.36 exactly, because programs (and glibc's own tests) rely on the
// corner cases: malloc(0) returns a unique pointer; sizes above PTRDIFF_MAX fail with ENOMEM;
// realloc(p, 0) frees p and returns null; memalign/aligned_alloc round an alignment that is not a
// power of two up to the next one and treat alignments up to 16 as malloc's; posix_memalign
// rejects alignments that are not a power-of-two multiple of sizeof(void*) with EINVAL; free
// preserves errno. Every failure is null with errno = ENOMEM (or EINVAL where glibc says so) and
// leaves the caller's block untouched.
#include <malloc.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "memkit/os.hpp"
#include "../general_allocator/internal.hpp"
#include "../os/platform.hpp"
#include "runtime.hpp"

#define MEMKIT_MALLOC_EXPORT extern "C" __attribute__((visibility("default")))

// Functions glibc 2.36's headers do not declare (C23's sized frees, the removed cfree, the
// __libc_* names that some programs and tools call to reach "the real malloc").
extern "C" {
void free_sized(void* p, std::size_t size) noexcept;
void free_aligned_sized(void* p, std::size_t alignment, std::size_t size) noexcept;
void cfree(void* p) noexcept;
void* __libc_malloc(std::size_t size) noexcept;
void __libc_free(void* p) noexcept;
void* __libc_calloc(std::size_t count, std::size_t size) noexcept;
void* __libc_realloc(void* p, std::size_t size) noexcept;
void* __libc_reallocarray(void* p, std::size_t count, std::size_t size) noexcept;
void* __libc_memalign(std::size_t alignment, std::size_t size) noexcept;
void* __libc_valloc(std::size_t size) noexcept;
void* __libc_pvalloc(std::size_t size) noexcept;
}

namespace {

using memkit::malloc_runtime::error_number;
using memkit::malloc_runtime::heap;

// What malloc guarantees on x86-64 glibc (alignof(max_align_t)); smaller requests get it too.
constexpr std::size_t malloc_alignment = alignof(std::max_align_t);
// glibc refuses anything larger: no object may be larger than PTRDIFF_MAX.
constexpr std::size_t largest_request = PTRDIFF_MAX;

[[gnu::always_inline]] inline void* fail(int error) noexcept {
  error_number() = error;
  return nullptr;
}

// The general allocator already follows the C error convention (null with errno = ENOMEM), so
// its result is returned as it is: its slow paths are tail calls and malloc's fast path needs no
// stack frame. Sizes above largest_request fail there too (max_allocation_size is below it).
static_assert(memkit::general_allocator::max_allocation_size <= largest_request);
[[gnu::noinline]] void* allocate_first(std::size_t size, std::size_t alignment) noexcept {
  return heap().allocate(size, alignment);  // heap() reads the environment first
}
[[gnu::always_inline]] inline void* allocate(std::size_t size, std::size_t alignment) noexcept {
  memkit::general_allocator* allocator = memkit::malloc_runtime::started.load(std::memory_order_acquire);
  if (MEMKIT_UNLIKELY(allocator == nullptr)) return allocate_first(size, alignment);
  return allocator->allocate(size, alignment);
}

// malloc's sizes up to direct_max when the thread's direct entry has no free block: the thread's
// first allocation (no heap yet, perhaps the process's first, which reads the environment), a
// class whose queue needs a page, or debug mode (whose entries are always empty).
[[gnu::noinline]] void* allocate_small_missed(memkit::gpa::heap* h, std::size_t size) noexcept {
  if (MEMKIT_UNLIKELY(memkit::malloc_runtime::started.load(std::memory_order_acquire) == nullptr))
    return allocate_first(size, malloc_alignment);
  return memkit::global_impl.allocate_direct_miss(h, size, malloc_alignment);
}

// malloc: the general allocator's fast path for the global instance, with no test of its own. The
// thread's direct entries are empty until the environment has been read and the thread has a
// heap, and stay empty in debug mode, so those cases take the miss path.
[[gnu::always_inline]] inline void* allocate_default(std::size_t size) noexcept {
  if (MEMKIT_LIKELY(size <= memkit::gpa::direct_max)) {
    memkit::gpa::heap* h = memkit::gpa::direct_heap;
    memkit::gpa::page* pg = h->direct[(size + 15) >> 4];
    if (MEMKIT_LIKELY(pg->free != nullptr)) return memkit::gpa::pop_free_block(pg);
    return allocate_small_missed(h, size);
  }
  return allocate(size, malloc_alignment);
}

// glibc's free never changes errno (since 2.33); general_allocator::free keeps it too. A block
// to free was allocated, so the environment has been read already: the free skips heap()'s check.
[[gnu::always_inline]] inline void release(void* p) noexcept {
  if (p == nullptr) return;
  memkit::general_allocator::global().free(p, memkit::general_allocator::allocation_family::malloc);
}

using family = memkit::general_allocator::allocation_family;

// operator delete and delete[]: debug mode checks that the block came from the matching new and,
// for the sized ones, that the size is the one it was allocated with.
[[gnu::always_inline]] inline void release_as(void* p, family f) noexcept {
  if (p == nullptr) return;
  memkit::general_allocator::global().free(p, f);
}

[[gnu::always_inline]] inline void release_as(void* p, family f, std::size_t size, std::size_t alignment = 0) noexcept {
  if (p == nullptr) return;
  memkit::general_allocator::global().free(p, f, size, alignment);
}

inline void* reallocate(void* p, std::size_t size) noexcept {
  if (p == nullptr) return allocate_default(size);
  if (size == 0) {  // glibc: REALLOC_ZERO_BYTES_FREES
    release(p);
    return nullptr;
  }
  if (MEMKIT_UNLIKELY(size > largest_request)) return fail(ENOMEM);
  return heap().reallocate_unsized(p, size);  // on failure p is still the caller's
}

inline void* allocate_zeroed(std::size_t count, std::size_t size) noexcept {
  std::size_t bytes = 0;
  if (MEMKIT_UNLIKELY(memkit::os::multiply_overflows(count, size, bytes))) return fail(ENOMEM);
  if (MEMKIT_UNLIKELY(bytes > largest_request)) return fail(ENOMEM);
  return heap().allocate_zeroed(bytes, malloc_alignment);  // skips the memset on fresh pages
}

inline void* reallocate_array(void* p, std::size_t count, std::size_t size) noexcept {
  std::size_t bytes = 0;
  if (MEMKIT_UNLIKELY(memkit::os::multiply_overflows(count, size, bytes))) return fail(ENOMEM);
  return reallocate(p, bytes);
}

// glibc's _mid_memalign: small alignments are malloc's; alignments that cannot be a power of two
// fail with EINVAL; other non-powers of two are rounded up to the next power of two.
inline void* allocate_aligned(std::size_t alignment, std::size_t size) noexcept {
  if (alignment <= malloc_alignment) return allocate_default(size);
  if (MEMKIT_UNLIKELY(alignment > SIZE_MAX / 2 + 1)) return fail(EINVAL);
  if (MEMKIT_UNLIKELY(!memkit::detail::is_power_of_two(alignment))) {
    std::size_t rounded = malloc_alignment * 2;
    while (rounded < alignment) rounded <<= 1;
    alignment = rounded;
  }
  if (MEMKIT_UNLIKELY(size > largest_request - alignment)) return fail(ENOMEM);
  return allocate(size, alignment);
}

inline int allocate_aligned_posix(void** out, std::size_t alignment, std::size_t size) noexcept {
  if (alignment == 0 || alignment % sizeof(void*) != 0 ||
      !memkit::detail::is_power_of_two(alignment / sizeof(void*)))
    return EINVAL;
  void* p = allocate_aligned(alignment, size);
  if (p == nullptr) return ENOMEM;  // *out untouched, as glibc
  *out = p;
  return 0;
}

inline void* allocate_page_aligned(std::size_t size) noexcept {
  return allocate_aligned(memkit::os::page_size(), size);
}

inline void* allocate_whole_pages(std::size_t size) noexcept {
  const std::size_t page = memkit::os::page_size();
  std::size_t rounded = 0;
  if (MEMKIT_UNLIKELY(memkit::os::add_overflows(size, page - 1, rounded))) return fail(ENOMEM);
  return allocate_aligned(page, rounded & ~(page - 1));
}

inline std::size_t usable_size(const void* p) noexcept {
  return p == nullptr ? 0 : heap().usable_size(p);
}

}  // namespace

// ---- the C family ------------------------------------------------------------------------------

MEMKIT_MALLOC_EXPORT void* malloc(std::size_t size) noexcept { return allocate_default(size); }
MEMKIT_MALLOC_EXPORT void free(void* p) noexcept { release(p); }
MEMKIT_MALLOC_EXPORT void* calloc(std::size_t count, std::size_t size) noexcept {
  return allocate_zeroed(count, size);
}
MEMKIT_MALLOC_EXPORT void* realloc(void* p, std::size_t size) noexcept { return reallocate(p, size); }
MEMKIT_MALLOC_EXPORT void* reallocarray(void* p, std::size_t count, std::size_t size) noexcept {
  return reallocate_array(p, count, size);
}
MEMKIT_MALLOC_EXPORT int posix_memalign(void** out, std::size_t alignment, std::size_t size) noexcept {
  return allocate_aligned_posix(out, alignment, size);
}
// glibc 2.36 makes aligned_alloc the same function as memalign (no EINVAL for odd alignments).
MEMKIT_MALLOC_EXPORT void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept {
  return allocate_aligned(alignment, size);
}
MEMKIT_MALLOC_EXPORT void* memalign(std::size_t alignment, std::size_t size) noexcept {
  return allocate_aligned(alignment, size);
}
MEMKIT_MALLOC_EXPORT void* valloc(std::size_t size) noexcept { return allocate_page_aligned(size); }
MEMKIT_MALLOC_EXPORT void* pvalloc(std::size_t size) noexcept { return allocate_whole_pages(size); }
MEMKIT_MALLOC_EXPORT std::size_t malloc_usable_size(void* p) noexcept { return usable_size(p); }
// C23: the size (and alignment) must be the ones the block was requested with. The general
// allocator finds both itself; debug mode checks the size, as it does a sized delete's (the
// alignment is not compared: see debug.cpp's is_other_alignment).
MEMKIT_MALLOC_EXPORT void free_sized(void* p, std::size_t size) noexcept { release_as(p, family::malloc, size); }
MEMKIT_MALLOC_EXPORT void free_aligned_sized(void* p, std::size_t, std::size_t size) noexcept {
  release_as(p, family::malloc, size);
}
MEMKIT_MALLOC_EXPORT void cfree(void* p) noexcept { release(p); }

// glibc's own names for the same functions.
MEMKIT_MALLOC_EXPORT void* __libc_malloc(std::size_t size) noexcept { return allocate_default(size); }
MEMKIT_MALLOC_EXPORT void __libc_free(void* p) noexcept { release(p); }
MEMKIT_MALLOC_EXPORT void* __libc_calloc(std::size_t count, std::size_t size) noexcept {
  return allocate_zeroed(count, size);
}
MEMKIT_MALLOC_EXPORT void* __libc_realloc(void* p, std::size_t size) noexcept { return reallocate(p, size); }
MEMKIT_MALLOC_EXPORT void* __libc_reallocarray(void* p, std::size_t count, std::size_t size) noexcept {
  return reallocate_array(p, count, size);
}
MEMKIT_MALLOC_EXPORT void* __libc_memalign(std::size_t alignment, std::size_t size) noexcept {
  return allocate_aligned(alignment, size);
}
MEMKIT_MALLOC_EXPORT void* __libc_valloc(std::size_t size) noexcept { return allocate_page_aligned(size); }
MEMKIT_MALLOC_EXPORT void* __libc_pvalloc(std::size_t size) noexcept { return allocate_whole_pages(size); }

// glibc's malloc_stats prints its arenas to stderr; here it prints memkit's statistics instead.
MEMKIT_MALLOC_EXPORT void malloc_stats() noexcept { heap().print_statistics(STDERR_FILENO); }
// Returns retained empty memory to the OS now (it would go after the purge delay anyway). glibc
// answers 1 when it released memory; the general allocator does not say, so 1 when any was held.
MEMKIT_MALLOC_EXPORT int malloc_trim(std::size_t) noexcept {
  auto& allocator = heap();
  const bool held = allocator.statistics().retained_bytes != 0;
  allocator.purge();
  return held ? 1 : 0;
}

// glibc's heap summary, filled from memkit's counters so that tools which poll it (monitoring
// agents, test harnesses checking for growth) see this allocator rather than glibc's idle arena.
MEMKIT_MALLOC_EXPORT struct mallinfo2 mallinfo2() noexcept {
  const auto s = heap().statistics();
  struct mallinfo2 info {};
  info.arena = s.mapped_bytes;                                       // address space from the OS
  info.hblks = static_cast<std::size_t>(s.huge_allocations - s.huge_frees);  // own mappings
  info.hblkhd = s.huge_live_bytes;                                  // bytes in them
  info.usmblks = s.peak_live_bytes;                                  // highest use seen
  info.uordblks = s.live_bytes;                                      // in use
  info.fordblks = s.retained_bytes;                                  // held empty
  info.keepcost = s.retained_bytes;                                  // what malloc_trim frees
  return info;
}
// The int-sized original, saturated rather than wrapped, as glibc does.
MEMKIT_MALLOC_EXPORT struct mallinfo mallinfo() noexcept {
  const struct mallinfo2 wide = mallinfo2();
  auto narrow = [](std::size_t v) { return v > INT_MAX ? INT_MAX : static_cast<int>(v); };
  struct mallinfo info {};
  info.arena = narrow(wide.arena);
  info.hblks = narrow(wide.hblks);
  info.hblkhd = narrow(wide.hblkhd);
  info.usmblks = narrow(wide.usmblks);
  info.uordblks = narrow(wide.uordblks);
  info.fordblks = narrow(wide.fordblks);
  info.keepcost = narrow(wide.keepcost);
  return info;
}

// ---- C++ operator new / delete -----------------------------------------------------------------

namespace {

// [new.delete.single]: loop calling the new-handler until memory comes or there is no handler.
// `named`: an aligned form's std::align_val_t, 0 for the plain forms (debug mode records it).
[[gnu::noinline]] void* new_or_throw(std::size_t size, std::size_t alignment, family f, std::size_t named) {
  for (;;) {
    if (MEMKIT_LIKELY(size <= largest_request)) {
      if (void* p = heap().allocate(size, alignment, f, named)) return p;
    }
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

// The nothrow forms behave as the throwing ones, except that they answer null where those throw.
[[gnu::noinline]] void* new_or_null(std::size_t size, std::size_t alignment, family f,
                                    std::size_t named) noexcept {
  for (;;) {
    if (MEMKIT_LIKELY(size <= largest_request)) {
      if (void* p = heap().allocate(size, alignment, f, named)) return p;
    }
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) return nullptr;
    try {
      handler();
    } catch (...) {
      return nullptr;
    }
  }
}

// operator new and new[] of sizes up to direct_max: malloc's fast path; every other case (a
// direct entry without a free block, debug mode, which records the family) takes `slow`.
template <void* (*slow)(std::size_t, std::size_t, family, std::size_t)>
[[gnu::always_inline]] inline void* new_default(std::size_t size, family f) noexcept(slow == new_or_null) {
  if (MEMKIT_LIKELY(size <= memkit::gpa::direct_max)) {
    memkit::gpa::page* pg = memkit::gpa::direct_heap->direct[(size + 15) >> 4];
    if (MEMKIT_LIKELY(pg->free != nullptr)) return memkit::gpa::pop_free_block(pg);
  }
  return slow(size, malloc_alignment, f, 0);
}

[[gnu::always_inline]] inline std::size_t new_alignment(std::align_val_t alignment) noexcept {
  auto value = static_cast<std::size_t>(alignment);
  return value < malloc_alignment ? malloc_alignment : value;
}

[[gnu::always_inline]] inline std::size_t named(std::align_val_t alignment) noexcept {
  return static_cast<std::size_t>(alignment);
}

}  // namespace

#define MEMKIT_NEW_EXPORT __attribute__((visibility("default")))

MEMKIT_NEW_EXPORT void* operator new(std::size_t size) { return new_default<new_or_throw>(size, family::scalar_new); }
MEMKIT_NEW_EXPORT void* operator new[](std::size_t size) { return new_default<new_or_throw>(size, family::array_new); }
MEMKIT_NEW_EXPORT void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return new_default<new_or_null>(size, family::scalar_new);
}
MEMKIT_NEW_EXPORT void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return new_default<new_or_null>(size, family::array_new);
}
MEMKIT_NEW_EXPORT void* operator new(std::size_t size, std::align_val_t alignment) {
  return new_or_throw(size, new_alignment(alignment), family::scalar_new, named(alignment));
}
MEMKIT_NEW_EXPORT void* operator new[](std::size_t size, std::align_val_t alignment) {
  return new_or_throw(size, new_alignment(alignment), family::array_new, named(alignment));
}
MEMKIT_NEW_EXPORT void* operator new(std::size_t size, std::align_val_t alignment,
                                     const std::nothrow_t&) noexcept {
  return new_or_null(size, new_alignment(alignment), family::scalar_new, named(alignment));
}
MEMKIT_NEW_EXPORT void* operator new[](std::size_t size, std::align_val_t alignment,
                                       const std::nothrow_t&) noexcept {
  return new_or_null(size, new_alignment(alignment), family::array_new, named(alignment));
}

// Every delete form ends in the same free: the allocator finds size and alignment from the
// pointer, so the sized and aligned hints are not needed (and not trusted); debug mode checks
// them against the block's (an aligned new must meet an aligned delete of the same alignment).
MEMKIT_NEW_EXPORT void operator delete(void* p) noexcept { release_as(p, family::scalar_new); }
MEMKIT_NEW_EXPORT void operator delete[](void* p) noexcept { release_as(p, family::array_new); }
MEMKIT_NEW_EXPORT void operator delete(void* p, const std::nothrow_t&) noexcept { release_as(p, family::scalar_new); }
MEMKIT_NEW_EXPORT void operator delete[](void* p, const std::nothrow_t&) noexcept { release_as(p, family::array_new); }
MEMKIT_NEW_EXPORT void operator delete(void* p, std::size_t size) noexcept { release_as(p, family::scalar_new, size); }
MEMKIT_NEW_EXPORT void operator delete[](void* p, std::size_t size) noexcept { release_as(p, family::array_new, size); }
MEMKIT_NEW_EXPORT void operator delete(void* p, std::align_val_t alignment) noexcept {
  release_as(p, family::scalar_new, 0, named(alignment));
}
MEMKIT_NEW_EXPORT void operator delete[](void* p, std::align_val_t alignment) noexcept {
  release_as(p, family::array_new, 0, named(alignment));
}
MEMKIT_NEW_EXPORT void operator delete(void* p, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  release_as(p, family::scalar_new, 0, named(alignment));
}
MEMKIT_NEW_EXPORT void operator delete[](void* p, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  release_as(p, family::array_new, 0, named(alignment));
}
MEMKIT_NEW_EXPORT void operator delete(void* p, std::size_t size, std::align_val_t alignment) noexcept {
  release_as(p, family::scalar_new, size, named(alignment));
}
MEMKIT_NEW_EXPORT void operator delete[](void* p, std::size_t size, std::align_val_t alignment) noexcept {
  release_as(p, family::array_new, size, named(alignment));
}
