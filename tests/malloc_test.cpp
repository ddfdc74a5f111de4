// The drop-in malloc's C and C++ entry points (src/malloc/). This executable links the static form
// (memkit_malloc_static), so every allocation in it, GoogleTest's included, goes through memkit;
// the edge cases are checked against what glibc 2.36 does, which the drop-in promises to match.
#include <gtest/gtest.h>

#if !defined(MEMKIT_MALLOC_TESTS)

TEST(malloc_dropin, not_built_in_sanitizer_builds) {
  GTEST_SKIP() << "the drop-in malloc is not built when a sanitizer owns malloc";
}

#else

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"

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
void memkit_malloc_print_statistics(int fd) noexcept;
}

namespace {

using memkit::general_allocator;

// Sizes through a volatile so the compiler neither folds the calls nor warns about huge requests.
std::size_t opaque(std::size_t n) {
  volatile std::size_t v = n;
  return v;
}

// realloc and reallocarray through volatile pointers: the tests use the old block after a failed
// call on purpose, which GCC's -Wuse-after-free cannot tell from a bug.
void* (*volatile realloc_opaque)(void*, std::size_t) = &std::realloc;
void* (*volatile reallocarray_opaque)(void*, std::size_t, std::size_t) = &reallocarray;

const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
const std::size_t huge = opaque(SIZE_MAX);
const std::size_t above_ptrdiff = opaque(std::size_t{PTRDIFF_MAX} + 1);

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

bool memkit_owns(const void* p) { return general_allocator::global().owns(p); }

std::uint64_t frees_so_far() { return general_allocator::global().statistics().frees; }

// ---- malloc / free ---------------------------------------------------------------------------

TEST(malloc_dropin, the_process_runs_on_memkit) {
  void* p = std::malloc(opaque(100));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(memkit_owns(p));
  std::free(p);
  auto* q = new int(7);
  EXPECT_TRUE(memkit_owns(q));
  delete q;
}

// malloc and operator new take their page from the thread's direct entries without testing the
// mode: switching the global allocator to debug mode (as a program linking the static form may)
// must still send every new small block through debug mode, even where the thread's pages have
// free blocks, and switching it off must serve them plainly again. In a child process, so the
// mode never leaks into other tests.
TEST(malloc_dropin, debug_mode_switched_on_later_covers_every_small_block) {
  EXPECT_EXIT(
      {
        void* warm = std::malloc(opaque(100));   // the thread's 112-byte page ...
        std::free(std::malloc(opaque(100)));     // ... now has free blocks
        general_allocator& g = general_allocator::global();
        general_allocator::options o = g.current_options();
        o.debug = true;
        g.configure(o);
        void* p = std::malloc(opaque(100));
        void* q = ::operator new(opaque(100));
        void* r = std::malloc(opaque(0));
        // Debug blocks report exactly the requested size; plain ones their block size (112, 16).
        const bool recorded = malloc_usable_size(p) == 100 && malloc_usable_size(q) == 100 &&
                              malloc_usable_size(r) < 16;
        std::free(p);
        ::operator delete(q);
        std::free(r);
        o.debug = false;
        g.configure(o);
        void* plain = std::malloc(opaque(100));
        const bool plain_again = malloc_usable_size(plain) == 112;
        std::free(plain);
        std::free(warm);
        std::_Exit(recorded ? (plain_again ? 0 : 2) : 1);
      },
      testing::ExitedWithCode(0), "");
}

TEST(malloc_dropin, malloc_zero_returns_a_unique_freeable_pointer) {
  void* a = std::malloc(opaque(0));
  void* b = std::malloc(opaque(0));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  std::free(a);
  std::free(b);
}

TEST(malloc_dropin, every_size_is_aligned_for_max_align_t_and_writable) {
  std::vector<unsigned char*> blocks;
  for (std::size_t size = 1; size <= 4096; size += (size < 256 ? 1 : 37)) {
    auto* p = static_cast<unsigned char*>(std::malloc(opaque(size)));
    ASSERT_NE(p, nullptr) << size;
    EXPECT_TRUE(aligned(p, alignof(std::max_align_t))) << size;
    std::memset(p, static_cast<int>(size & 0xFF), size);
    blocks.push_back(p);
  }
  std::size_t size = 1;
  for (auto* p : blocks) {
    EXPECT_EQ(p[0], static_cast<unsigned char>(size & 0xFF));
    EXPECT_EQ(p[size - 1], static_cast<unsigned char>(size & 0xFF));
    std::free(p);
    size += (size < 256 ? 1 : 37);
  }
}

TEST(malloc_dropin, sizes_above_ptrdiff_max_fail_with_enomem) {
  for (std::size_t size : {huge, above_ptrdiff, huge - page}) {
    errno = 0;
    EXPECT_EQ(std::malloc(size), nullptr) << size;
    EXPECT_EQ(errno, ENOMEM) << size;
  }
}

TEST(malloc_dropin, a_request_the_system_cannot_back_fails_with_enomem) {
  // Below PTRDIFF_MAX but far beyond any machine's address space.
  errno = 0;
  EXPECT_EQ(std::malloc(opaque(std::size_t{1} << 62)), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(malloc_dropin, large_blocks_work_and_are_zero_from_calloc) {
  const std::size_t size = opaque(std::size_t{32} << 20);
  auto* p = static_cast<unsigned char*>(std::malloc(size));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0xAB, size);
  std::free(p);
  auto* z = static_cast<unsigned char*>(std::calloc(1, size));
  ASSERT_NE(z, nullptr);
  for (std::size_t i = 0; i < size; i += 4093) ASSERT_EQ(z[i], 0) << i;
  EXPECT_EQ(z[size - 1], 0);
  std::free(z);
}

TEST(malloc_dropin, free_of_null_is_a_no_op_and_free_keeps_errno) {
  errno = EDOM;
  std::free(nullptr);
  EXPECT_EQ(errno, EDOM);
  void* big = std::malloc(opaque(8u << 20));
  ASSERT_NE(big, nullptr);
  errno = ERANGE;
  std::free(big);
  EXPECT_EQ(errno, ERANGE);
}

// ---- calloc ------------------------------------------------------------------------------------

TEST(malloc_dropin, calloc_zeroes_reused_memory) {
  for (std::size_t size : {std::size_t{8}, std::size_t{48}, std::size_t{1000}, std::size_t{70000}}) {
    // Dirty blocks of this size first, so calloc is likely to get recycled memory.
    std::vector<void*> dirty;
    for (int i = 0; i < 64; ++i) {
      void* p = std::malloc(opaque(size));
      ASSERT_NE(p, nullptr);
      std::memset(p, 0xFF, size);
      dirty.push_back(p);
    }
    for (void* p : dirty) std::free(p);
    for (int i = 0; i < 64; ++i) {
      auto* z = static_cast<unsigned char*>(std::calloc(opaque(size), 1));
      ASSERT_NE(z, nullptr);
      for (std::size_t b = 0; b < size; ++b) ASSERT_EQ(z[b], 0) << size << " byte " << b;
      dirty[static_cast<std::size_t>(i)] = z;
    }
    for (void* p : dirty) std::free(p);
  }
}

TEST(malloc_dropin, calloc_overflow_fails_with_enomem) {
  errno = 0;
  EXPECT_EQ(std::calloc(opaque(SIZE_MAX / 2), 3), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(std::calloc(opaque(std::size_t{1} << 32), std::size_t{1} << 32), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(std::calloc(1, above_ptrdiff), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(malloc_dropin, calloc_of_zero_returns_a_pointer) {
  void* a = std::calloc(opaque(0), 0);
  void* b = std::calloc(opaque(0), 16);
  void* c = std::calloc(opaque(16), 0);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_NE(c, nullptr);
  std::free(a);
  std::free(b);
  std::free(c);
}

// ---- realloc / reallocarray ----------------------------------------------------------------------

TEST(malloc_dropin, realloc_of_null_allocates) {
  void* p = realloc_opaque(nullptr, opaque(40));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(memkit_owns(p));
  std::free(p);
  void* z = realloc_opaque(nullptr, opaque(0));  // glibc: malloc(0)
  EXPECT_NE(z, nullptr);
  std::free(z);
}

TEST(malloc_dropin, realloc_to_zero_frees_and_returns_null_like_glibc) {
  void* p = std::malloc(opaque(100));
  ASSERT_NE(p, nullptr);
  const auto before = frees_so_far();
  errno = 0;
  EXPECT_EQ(realloc_opaque(p, opaque(0)), nullptr);
  EXPECT_EQ(errno, 0);
  EXPECT_EQ(frees_so_far(), before + 1);
}

TEST(malloc_dropin, realloc_keeps_contents_through_growth_and_shrinking) {
  auto* p = static_cast<unsigned char*>(std::malloc(opaque(10)));
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 10; ++i) p[i] = static_cast<unsigned char>(i + 1);
  std::size_t size = 10;
  for (std::size_t next : {std::size_t{24}, std::size_t{200}, std::size_t{5000}, std::size_t{1} << 20,
                           std::size_t{4} << 20, std::size_t{3000}, std::size_t{16}, std::size_t{10}}) {
    p = static_cast<unsigned char*>(realloc_opaque(p, opaque(next)));
    ASSERT_NE(p, nullptr) << next;
    for (int i = 0; i < 10; ++i) ASSERT_EQ(p[i], i + 1) << "after realloc to " << next;
    if (next > size) std::memset(p + size, 0x5A, next - size);
    size = next;
  }
  std::free(p);
}

TEST(malloc_dropin, realloc_failure_keeps_the_old_block) {
  auto* p = static_cast<char*>(std::malloc(opaque(64)));
  ASSERT_NE(p, nullptr);
  std::strcpy(p, "still here");
  for (std::size_t size : {huge, above_ptrdiff, std::size_t{1} << 62}) {
    errno = 0;
    EXPECT_EQ(realloc_opaque(p, opaque(size)), nullptr) << size;
    EXPECT_EQ(errno, ENOMEM) << size;
    EXPECT_STREQ(p, "still here");
  }
  EXPECT_TRUE(memkit_owns(p));
  std::free(p);
}

// A C program growing a buffer by realloc: above general_allocator::growth_threshold the block
// has a range of its own and never changes address again (so nothing is copied), and a failure of
// the system (injected into every os call) is null + ENOMEM with the block intact.
TEST(malloc_dropin, realloc_grows_large_buffers_in_place_and_fails_cleanly) {
  std::size_t size = 4096;
  auto* p = static_cast<unsigned char*>(std::malloc(opaque(size)));
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, size);
  std::size_t moves_above_threshold = 0;
  while (size < (std::size_t{256} << 20)) {
    const std::size_t next = size + size / 2;
    auto* q = static_cast<unsigned char*>(realloc_opaque(p, opaque(next)));
    ASSERT_NE(q, nullptr);
    if (q != p && size >= general_allocator::growth_threshold) ++moves_above_threshold;
    std::memset(q + size, 7, next - size);
    p = q;
    size = next;
  }
  EXPECT_EQ(moves_above_threshold, 0u);
  for (std::size_t i = 0; i < size; i += 4093) ASSERT_EQ(p[i], 7) << i;
  using op = memkit::os::testing::operation;
  for (op o : {op::reserve, op::commit, op::map}) memkit::os::testing::fail_after(o, 0);
  errno = 0;
  void* failed = realloc_opaque(p, opaque(std::size_t{64} << 30));  // beyond the reservation
  const int error = errno;
  memkit::os::testing::clear_injected_failures();
  EXPECT_EQ(failed, nullptr);
  EXPECT_EQ(error, ENOMEM);
  for (std::size_t i = 0; i < size; i += 4093) ASSERT_EQ(p[i], 7) << i;
  EXPECT_TRUE(memkit_owns(p));
  std::free(p);
}

TEST(malloc_dropin, reallocarray_checks_overflow_and_keeps_the_block) {
  auto* p = static_cast<int*>(reallocarray_opaque(nullptr, opaque(4), sizeof(int)));
  ASSERT_NE(p, nullptr);
  p[3] = 42;
  errno = 0;
  EXPECT_EQ(reallocarray_opaque(p, opaque(SIZE_MAX / 2), 3), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(p[3], 42);
  p = static_cast<int*>(reallocarray_opaque(p, opaque(1000), sizeof(int)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p[3], 42);
  const auto before = frees_so_far();
  errno = 0;
  EXPECT_EQ(reallocarray_opaque(p, opaque(0), sizeof(int)), nullptr);  // realloc(p, 0): freed
  EXPECT_EQ(errno, 0);
  EXPECT_EQ(frees_so_far(), before + 1);
}

// ---- aligned allocation ------------------------------------------------------------------------

TEST(malloc_dropin, posix_memalign_rejects_bad_alignments_with_einval) {
  for (std::size_t alignment : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{4},
                                std::size_t{3}, std::size_t{12}, std::size_t{24}, std::size_t{48},
                                std::size_t{4097}, SIZE_MAX / 2 + 2, SIZE_MAX}) {
    void* out = reinterpret_cast<void*>(0x1);
    errno = 0;
    EXPECT_EQ(posix_memalign(&out, opaque(alignment), 10), EINVAL) << alignment;
    EXPECT_EQ(out, reinterpret_cast<void*>(0x1)) << "left untouched, alignment " << alignment;
    EXPECT_EQ(errno, 0) << "errno is not the channel, alignment " << alignment;
  }
}

TEST(malloc_dropin, posix_memalign_aligns_every_power_of_two) {
  for (std::size_t alignment = sizeof(void*); alignment <= (std::size_t{4} << 20); alignment *= 2) {
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, alignment - 1, alignment * 3 + 5}) {
      void* out = nullptr;
      ASSERT_EQ(posix_memalign(&out, opaque(alignment), opaque(size)), 0) << alignment << " " << size;
      ASSERT_NE(out, nullptr);
      EXPECT_TRUE(aligned(out, alignment)) << alignment;
      EXPECT_GE(malloc_usable_size(out), size);
      if (size != 0) std::memset(out, 0x33, size);
      std::free(out);
    }
  }
}

TEST(malloc_dropin, posix_memalign_reports_enomem_and_leaves_the_output_alone) {
  void* out = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(posix_memalign(&out, 64, huge), ENOMEM);
  EXPECT_EQ(out, reinterpret_cast<void*>(0x1));
  EXPECT_EQ(posix_memalign(&out, 64, std::size_t{1} << 62), ENOMEM);
  EXPECT_EQ(out, reinterpret_cast<void*>(0x1));
}

TEST(malloc_dropin, memalign_and_aligned_alloc_follow_glibc_2_36) {
  // Alignments up to 16 are malloc's; other non-powers of two round up to the next power of two;
  // beyond SIZE_MAX / 2 + 1 no power of two exists: EINVAL.
  struct expectation {
    std::size_t requested;
    std::size_t at_least;
  };
  for (auto [requested, at_least] : {expectation{0, 16}, expectation{1, 16}, expectation{3, 16},
                                     expectation{8, 16}, expectation{16, 16}, expectation{24, 32},
                                     expectation{33, 64}, expectation{48, 64}, expectation{64, 64},
                                     expectation{100, 128}, expectation{4096, 4096},
                                     expectation{6000, 8192}, expectation{1 << 21, 1 << 21}}) {
    for (auto* function : {&memalign, &aligned_alloc, &__libc_memalign}) {
      errno = 0;
      void* p = function(opaque(requested), 100);
      ASSERT_NE(p, nullptr) << requested;
      EXPECT_TRUE(aligned(p, at_least)) << requested;
      EXPECT_EQ(errno, 0);
      std::free(p);
    }
  }
  for (std::size_t impossible : {SIZE_MAX / 2 + 2, SIZE_MAX}) {
    for (auto* function : {&memalign, &aligned_alloc}) {
      errno = 0;
      EXPECT_EQ(function(opaque(impossible), 10), nullptr);
      EXPECT_EQ(errno, EINVAL);
    }
  }
  errno = 0;
  EXPECT_EQ(memalign(64, huge - 10), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(aligned_alloc(4096, above_ptrdiff), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(malloc_dropin, valloc_and_pvalloc_are_page_aligned) {
  for (auto* function : {&valloc, &pvalloc, &__libc_valloc, &__libc_pvalloc}) {
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, page - 1, page, page + 1, 10 * page}) {
      void* p = function(opaque(size));
      ASSERT_NE(p, nullptr) << size;
      EXPECT_TRUE(aligned(p, page)) << size;
      EXPECT_GE(malloc_usable_size(p), size);
      std::free(p);
    }
  }
  // pvalloc rounds the size up to whole pages.
  void* p = pvalloc(opaque(1));
  ASSERT_NE(p, nullptr);
  EXPECT_GE(malloc_usable_size(p), page);
  std::memset(p, 1, page);
  std::free(p);
  for (auto* function : {&valloc, &pvalloc}) {
    errno = 0;
    EXPECT_EQ(function(opaque(SIZE_MAX - 100)), nullptr);
    EXPECT_EQ(errno, ENOMEM);
  }
}

// ---- usable size, the other frees, the glibc names ---------------------------------------------

TEST(malloc_dropin, usable_size_covers_the_request_and_may_be_written) {
  EXPECT_EQ(malloc_usable_size(nullptr), 0u);
  for (std::size_t size : {std::size_t{1}, std::size_t{13}, std::size_t{128}, std::size_t{1000},
                           std::size_t{65536}, std::size_t{3} << 20}) {
    void* p = std::malloc(opaque(size));
    ASSERT_NE(p, nullptr);
    const std::size_t usable = malloc_usable_size(p);
    EXPECT_GE(usable, size);
    std::memset(p, 0x11, usable);  // the whole usable size belongs to the caller
    void* q = realloc_opaque(p, usable);  // and realloc to it keeps the block valid
    ASSERT_NE(q, nullptr);
    std::free(q);
  }
}

TEST(malloc_dropin, sized_frees_and_cfree_free) {
  const auto before = frees_so_far();
  free_sized(std::malloc(opaque(40)), 40);
  void* aligned_block = aligned_alloc(256, 512);
  ASSERT_NE(aligned_block, nullptr);
  free_aligned_sized(aligned_block, 256, 512);
  cfree(std::malloc(opaque(8)));
  free_sized(nullptr, 0);
  free_aligned_sized(nullptr, 64, 0);
  cfree(nullptr);
  EXPECT_EQ(frees_so_far(), before + 3);
}

TEST(malloc_dropin, libc_names_are_the_same_allocator) {
  void* a = __libc_malloc(opaque(10));
  auto* b = static_cast<unsigned char*>(__libc_calloc(opaque(4), 4));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(memkit_owns(a));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b[i], 0);
  a = __libc_realloc(a, opaque(1000));
  ASSERT_NE(a, nullptr);
  errno = 0;
  EXPECT_EQ(__libc_reallocarray(a, opaque(SIZE_MAX / 2), 4), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  __libc_free(a);
  std::free(b);  // one allocator behind both names
  errno = 0;
  EXPECT_EQ(__libc_malloc(huge), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(malloc_dropin, malloc_stats_and_malloc_trim_speak_for_memkit) {
  testing::internal::CaptureStderr();
  malloc_stats();
  memkit_malloc_print_statistics(STDERR_FILENO);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("memkit"), std::string::npos) << printed;
  const int trimmed = malloc_trim(0);
  EXPECT_TRUE(trimmed == 0 || trimmed == 1);
}

TEST(malloc_dropin, malloc_trim_gives_retained_memory_back) {
  void* p = std::malloc(opaque(std::size_t{8} << 20));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, std::size_t{8} << 20);
  std::free(p);  // kept for reuse for a while...
  const std::size_t held = mallinfo2().fordblks;
  EXPECT_EQ(malloc_trim(0), held != 0 ? 1 : 0) << "1 exactly when memory was held";
  EXPECT_LT(mallinfo2().fordblks, std::size_t{8} << 20) << "...until malloc_trim returns it";
}

TEST(malloc_dropin, mallinfo2_reports_memkit_use) {
  const std::size_t size = opaque(std::size_t{6} << 20);  // a huge block: its own mapping
  const struct mallinfo2 before = mallinfo2();
  void* p = std::malloc(size);
  ASSERT_NE(p, nullptr);
  const struct mallinfo2 during = mallinfo2();
  EXPECT_GE(during.uordblks, before.uordblks + size);
  EXPECT_GE(during.hblkhd, size);
  EXPECT_GE(during.hblks, 1u);
  EXPECT_GE(during.arena, during.uordblks);
  std::free(p);
  EXPECT_LT(mallinfo2().uordblks, during.uordblks);
}

// ---- operator new / delete ---------------------------------------------------------------------

struct alignas(256) over_aligned {
  unsigned char bytes[256];
};

TEST(malloc_dropin, every_new_form_comes_from_memkit_and_is_aligned) {
  void* plain = ::operator new(opaque(24));
  void* array = ::operator new[](opaque(24));
  void* nothrow = ::operator new(opaque(24), std::nothrow);
  void* nothrow_array = ::operator new[](opaque(24), std::nothrow);
  void* aligned_one = ::operator new(opaque(24), std::align_val_t{512});
  void* aligned_array = ::operator new[](opaque(24), std::align_val_t{512});
  void* aligned_nothrow = ::operator new(opaque(24), std::align_val_t{4096}, std::nothrow);
  void* aligned_nothrow_array = ::operator new[](opaque(24), std::align_val_t{4096}, std::nothrow);
  for (void* p : {plain, array, nothrow, nothrow_array, aligned_one, aligned_array, aligned_nothrow,
                  aligned_nothrow_array}) {
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(memkit_owns(p));
    EXPECT_TRUE(aligned(p, alignof(std::max_align_t)));
  }
  EXPECT_TRUE(aligned(aligned_one, 512));
  EXPECT_TRUE(aligned(aligned_array, 512));
  EXPECT_TRUE(aligned(aligned_nothrow, 4096));
  EXPECT_TRUE(aligned(aligned_nothrow_array, 4096));
  const auto before = frees_so_far();
  ::operator delete(plain);
  ::operator delete(nothrow, std::nothrow);
  ::operator delete[](nothrow_array, std::nothrow);
  ::operator delete[](aligned_array, std::align_val_t{512});
  ::operator delete(aligned_nothrow, std::align_val_t{4096}, std::nothrow);
#if defined(__cpp_sized_deallocation)  // Clang declares the sized forms only with -fsized-deallocation
  ::operator delete[](array, 24);
  ::operator delete(aligned_one, 24, std::align_val_t{512});
  ::operator delete[](aligned_nothrow_array, 24, std::align_val_t{4096});
#else
  ::operator delete[](array);
  ::operator delete(aligned_one, std::align_val_t{512});
  ::operator delete[](aligned_nothrow_array, std::align_val_t{4096});
#endif
  EXPECT_EQ(frees_so_far(), before + 8);

  auto* objects = new over_aligned[3];
  EXPECT_TRUE(aligned(objects, 256));
  EXPECT_TRUE(memkit_owns(objects));
  delete[] objects;
  ::operator delete(::operator new(0));  // size 0 is a valid, unique request
  ::operator delete(nullptr);
  ::operator delete[](nullptr, std::align_val_t{64});
}

int handler_calls = 0;
void count_then_give_up() {
  if (++handler_calls == 3) std::set_new_handler(nullptr);
}
void throwing_handler() {
  ++handler_calls;
  throw std::bad_alloc();
}

class new_handler_test : public ::testing::Test {
 protected:
  void SetUp() override { handler_calls = 0; }
  void TearDown() override { std::set_new_handler(nullptr); }
};

TEST_F(new_handler_test, operator_new_calls_the_handler_until_it_is_removed_then_throws) {
  std::set_new_handler(count_then_give_up);
  EXPECT_THROW((void)::operator new(opaque(std::size_t{1} << 62)), std::bad_alloc);
  EXPECT_EQ(handler_calls, 3);
  std::set_new_handler(count_then_give_up);
  handler_calls = 0;
  EXPECT_THROW((void)::operator new[](huge, std::align_val_t{64}), std::bad_alloc);
  EXPECT_EQ(handler_calls, 3);
}

TEST_F(new_handler_test, operator_new_without_a_handler_throws_bad_alloc) {
  EXPECT_THROW((void)::operator new(huge), std::bad_alloc);
  EXPECT_THROW((void)::operator new[](above_ptrdiff), std::bad_alloc);
  EXPECT_THROW((void)::operator new(huge, std::align_val_t{128}), std::bad_alloc);
}

TEST_F(new_handler_test, nothrow_new_returns_null_after_the_handler_gives_up) {
  EXPECT_EQ(::operator new(huge, std::nothrow), nullptr);
  std::set_new_handler(count_then_give_up);
  EXPECT_EQ(::operator new[](huge, std::nothrow), nullptr);
  EXPECT_EQ(handler_calls, 3);
  std::set_new_handler(throwing_handler);
  handler_calls = 0;
  EXPECT_EQ(::operator new(huge, std::align_val_t{64}, std::nothrow), nullptr);
  EXPECT_EQ(handler_calls, 1);
}

void clear_os_failures() {
  ++handler_calls;
  memkit::os::testing::clear_injected_failures();
}

TEST_F(new_handler_test, operator_new_retries_after_the_handler_made_memory_available) {
  // The os layer refuses memory until the handler "frees some" (clears the injected failures);
  // the request (larger than anything the allocator retains) must then succeed on the retry.
  using memkit::os::testing::operation;
  for (auto op : {operation::reserve, operation::commit, operation::map})
    memkit::os::testing::inject_failure(op, 1000);
  std::set_new_handler(clear_os_failures);
  void* p = ::operator new(opaque(std::size_t{256} << 20));
  memkit::os::testing::clear_injected_failures();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(handler_calls, 1);
  ::operator delete(p);
}

// ---- threads and dlopen -----------------------------------------------------------------------

TEST(malloc_dropin, blocks_cross_threads_and_outlive_their_thread) {
  constexpr int threads = 4;
  constexpr int blocks = 2000;
  std::vector<std::vector<unsigned char*>> made(threads);
  std::vector<std::thread> makers;
  for (int t = 0; t < threads; ++t) {
    makers.emplace_back([&made, t] {
      for (int i = 0; i < blocks; ++i) {
        const std::size_t size = 1 + static_cast<std::size_t>((i * 37 + t) % 3000);
        auto* p = static_cast<unsigned char*>(std::malloc(size));
        if (p == nullptr) return;
        std::memset(p, t + 1, size);
        made[static_cast<std::size_t>(t)].push_back(p);
      }
    });
  }
  for (auto& m : makers) m.join();  // the allocating threads are gone...
  std::vector<std::thread> freers;
  for (int t = 0; t < threads; ++t) {
    // ...and other threads check and free what they made.
    freers.emplace_back([&made, t] {
      auto& mine = made[static_cast<std::size_t>((t + 1) % threads)];
      for (auto* p : mine) {
        if (p[0] != ((t + 1) % threads) + 1) std::abort();
        std::free(p);
      }
    });
  }
  for (auto& f : freers) f.join();
  for (auto& m : made) EXPECT_EQ(m.size(), static_cast<std::size_t>(blocks));
}

TEST(malloc_dropin, heaps_of_exited_threads_are_reused) {
  // One thread after the other, each allocating and leaving blocks behind: a heap per thread
  // ever created would grow without bound; adoption keeps the count at the number of threads
  // alive at once.
  const auto before = general_allocator::global().statistics().heaps;
  std::vector<void*> left;
  for (int i = 0; i < 100; ++i) {
    std::thread([&left, i] {
      void* keep = std::malloc(static_cast<std::size_t>(24 + i));
      for (int j = 0; j < 50; ++j) std::free(std::malloc(static_cast<std::size_t>(8 * j + 8)));
      left.push_back(keep);
    }).join();
  }
  for (void* p : left) std::free(p);
  EXPECT_LE(general_allocator::global().statistics().heaps, before + 2);
}

TEST(malloc_dropin, a_dlopened_library_shares_the_heap) {
  for (int round = 0; round < 3; ++round) {
    void* library = ::dlopen(MEMKIT_MALLOC_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library, nullptr) << ::dlerror();
    using copy_fn = char* (*)();
    using free_fn = void (*)(void*);
    using scratch_fn = std::size_t (*)(std::size_t);
    auto copy = reinterpret_cast<copy_fn>(::dlsym(library, "plugin_copy_greeting"));
    auto release = reinterpret_cast<free_fn>(::dlsym(library, "plugin_free"));
    auto scratch = reinterpret_cast<scratch_fn>(::dlsym(library, "plugin_thread_scratch"));
    ASSERT_NE(copy, nullptr);
    ASSERT_NE(release, nullptr);
    ASSERT_NE(scratch, nullptr);
    char* text = copy();  // allocated inside the library...
    ASSERT_NE(text, nullptr);
    EXPECT_STREQ(text, "hello from the plugin");
    EXPECT_TRUE(memkit_owns(text));
    std::free(text);  // ...freed outside
    release(std::malloc(opaque(77)));  // and the other way round
    std::thread worker([scratch] {
      for (std::size_t size = 16; size <= 65536; size *= 4) EXPECT_EQ(scratch(size), size);
    });
    worker.join();
    EXPECT_EQ(::dlclose(library), 0);
  }
}

}  // namespace

#endif  // MEMKIT_MALLOC_TESTS
