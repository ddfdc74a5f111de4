#include "memkit/virtual_arena.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory_resource>
#include <stdexcept>
#include <vector>

#include "memkit/dyn_array.hpp"
#include "memkit/os.hpp"
#if !MEMKIT_WINDOWS
#include <sys/resource.h>
#include <unistd.h>

#include "support/rlimit.hpp"
#endif

namespace os = memkit::os;
using memkit::virtual_arena;
using memkit::virtual_arena_options;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

bool aligned_to(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

#if !MEMKIT_WINDOWS
using memkit::testing::limit_data_growth;
#endif

class virtual_arena_test : public ::testing::Test {
 protected:
  void TearDown() override { os::testing::clear_injected_failures(); }
};

TEST_F(virtual_arena_test, reserves_without_committing) {
  virtual_arena arena(64 * MiB);
  EXPECT_EQ(arena.reserved(), 64 * MiB);
  EXPECT_EQ(arena.committed(), 0u);
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.high_water(), 0u);
  EXPECT_NE(arena.base(), nullptr);
  EXPECT_TRUE(aligned_to(arena.base(), os::page_size()));
  EXPECT_EQ(arena.commit_step(), virtual_arena::default_commit_step);
  EXPECT_TRUE(arena.options().prefault);  // the measured default
}

TEST_F(virtual_arena_test, reservation_is_rounded_up_to_pages) {
  virtual_arena arena(1);
  EXPECT_EQ(arena.reserved(), os::page_size());
}

TEST_F(virtual_arena_test, allocations_are_contiguous_aligned_and_writable) {
  virtual_arena arena(16 * MiB, {.commit_step = 64 * 1024});
  std::vector<char*> blocks;
  for (int i = 0; i < 1000; ++i) {
    auto* p = static_cast<char*>(arena.allocate(40, 8));
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned_to(p, 8));
    std::memset(p, i & 0xFF, 40);
    blocks.push_back(p);
  }
  for (std::size_t i = 1; i < blocks.size(); ++i) EXPECT_EQ(blocks[i], blocks[i - 1] + 40);
  for (std::size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(blocks[i][39], static_cast<char>(i & 0xFF));
  EXPECT_EQ(arena.used(), 40'000u);
  EXPECT_EQ(arena.committed(), 64u * 1024);  // one step covers it
  EXPECT_TRUE(arena.owns(blocks.front()));
  EXPECT_FALSE(arena.owns(&blocks));
}

TEST_F(virtual_arena_test, commits_in_steps) {
  virtual_arena arena(64 * MiB, {.commit_step = 1 * MiB});
  EXPECT_EQ(arena.commit_step(), 1 * MiB);
  ASSERT_NE(arena.allocate(1), nullptr);
  EXPECT_EQ(arena.committed(), 1 * MiB);
  ASSERT_NE(arena.allocate(1 * MiB), nullptr);
  EXPECT_EQ(arena.committed(), 2 * MiB);
  ASSERT_NE(arena.allocate(5 * MiB + 3), nullptr);  // a request larger than a step
  EXPECT_EQ(arena.committed(), 7 * MiB);
  EXPECT_GE(arena.available_committed(), 0u);
}

TEST_F(virtual_arena_test, every_power_of_two_alignment_is_honoured) {
  virtual_arena arena(64 * MiB);
  for (std::size_t alignment = 1; alignment <= 4 * MiB; alignment *= 2) {
    ASSERT_NE(arena.allocate(3, 1), nullptr);  // misalign the cursor
    void* p = arena.allocate(24, alignment);
    ASSERT_NE(p, nullptr) << alignment;
    EXPECT_TRUE(aligned_to(p, alignment)) << alignment;
  }
}

TEST_F(virtual_arena_test, bad_alignment_zero_size_and_overflow_fail_cleanly) {
  virtual_arena arena(1 * MiB);
  EXPECT_EQ(arena.allocate(8, 3), nullptr);
  EXPECT_EQ(arena.allocate(8, 0), nullptr);
  EXPECT_EQ(arena.used(), 0u);
  void* a = arena.allocate(0);
  void* b = arena.allocate(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);  // zero-size requests behave as one byte: distinct pointers
  const auto before = arena.statistics();
  EXPECT_EQ(arena.allocate(std::numeric_limits<std::size_t>::max()), nullptr);
  EXPECT_EQ(arena.allocate(std::numeric_limits<std::size_t>::max() - 8, 16), nullptr);
  EXPECT_EQ(arena.allocate(8, std::size_t{1} << 63), nullptr);
  EXPECT_EQ(arena.allocate_array<std::uint64_t>(std::numeric_limits<std::size_t>::max() / 4), nullptr);
  EXPECT_EQ(arena.last_error(), ENOMEM);
  EXPECT_EQ(arena.used(), before.used);
  EXPECT_EQ(arena.committed(), before.committed);
}

TEST_F(virtual_arena_test, exhausting_the_reservation_returns_null_and_leaves_the_arena_unchanged) {
  virtual_arena arena(1 * MiB);
  void* all = arena.allocate(1 * MiB - 64, 1);
  ASSERT_NE(all, nullptr);
  const auto before = arena.statistics();
  EXPECT_EQ(arena.allocate(65, 1), nullptr);
  EXPECT_EQ(arena.last_error(), ENOMEM);
  EXPECT_EQ(arena.used(), before.used);
  EXPECT_EQ(arena.committed(), before.committed);
  EXPECT_NE(arena.allocate(64, 1), nullptr);  // exactly the rest still fits
  EXPECT_EQ(arena.allocate(1, 1), nullptr);
}

TEST_F(virtual_arena_test, a_failed_commit_returns_null_and_leaves_the_arena_unchanged) {
  virtual_arena arena(64 * MiB, {.commit_step = 1 * MiB});
  ASSERT_NE(arena.allocate(100), nullptr);
  const auto before = arena.statistics();
  os::testing::inject_failure(os::testing::operation::commit, 1, EAGAIN);
  EXPECT_EQ(arena.allocate(2 * MiB), nullptr);
  EXPECT_EQ(arena.last_error(), EAGAIN);
  EXPECT_EQ(arena.used(), before.used);
  EXPECT_EQ(arena.committed(), before.committed);
  // The failure was transient: the same request now succeeds.
  EXPECT_NE(arena.allocate(2 * MiB), nullptr);
}

TEST_F(virtual_arena_test, a_failed_prefault_gives_the_step_back) {
  virtual_arena arena(64 * MiB, {.commit_step = 1 * MiB, .prefault = true});
  os::testing::inject_failure(os::testing::operation::prefault, 1);
  EXPECT_EQ(arena.allocate(10), nullptr);
  EXPECT_EQ(arena.committed(), 0u);
  EXPECT_EQ(arena.last_error(), ENOMEM);
  EXPECT_NE(arena.allocate(10), nullptr);
  EXPECT_EQ(arena.committed(), 1 * MiB);
}

TEST_F(virtual_arena_test, prefault_makes_the_step_resident) {
  const std::size_t step = 32 * MiB;
  virtual_arena arena(256 * MiB, {.commit_step = step, .prefault_step = step, .prefault = true});
  auto before = os::current_resident_bytes();
  ASSERT_TRUE(before.ok());
  ASSERT_NE(arena.allocate(16), nullptr);
  auto after = os::current_resident_bytes();
  ASSERT_TRUE(after.ok());
  EXPECT_GE(after.value(), before.value() + step / 2);
}

TEST_F(virtual_arena_test, prefault_runs_one_prefault_step_ahead_within_a_larger_commit_step) {
  virtual_arena arena(256 * MiB, {.commit_step = 8 * MiB, .prefault_step = 256 * 1024});
  EXPECT_EQ(arena.prefault_step(), 256u * 1024);
  ASSERT_NE(arena.allocate(100), nullptr);
  EXPECT_EQ(arena.committed(), 8 * MiB);
  EXPECT_EQ(arena.ready(), 256u * 1024);
  ASSERT_NE(arena.allocate(300 * 1024), nullptr);
  EXPECT_EQ(arena.committed(), 8 * MiB);
  EXPECT_EQ(arena.ready(), 512u * 1024);
  // A failed prefault inside the committed step: null, nothing changes.
  const auto before = arena.statistics();
  os::testing::inject_failure(os::testing::operation::prefault, 1);
  EXPECT_EQ(arena.allocate(1 * MiB), nullptr);
  EXPECT_EQ(arena.last_error(), ENOMEM);
  EXPECT_EQ(arena.used(), before.used);
  EXPECT_EQ(arena.committed(), before.committed);
  EXPECT_EQ(arena.ready(), 512u * 1024);
  // Without prefault, everything committed is ready.
  virtual_arena lazy(64 * MiB, {.commit_step = 4 * MiB, .prefault = false});
  ASSERT_NE(lazy.allocate(1), nullptr);
  EXPECT_EQ(lazy.ready(), 4 * MiB);
}

TEST_F(virtual_arena_test, marks_rewind_and_scopes_free_in_stack_order) {
  virtual_arena arena(16 * MiB);
  ASSERT_NE(arena.allocate(100), nullptr);
  const auto m = arena.mark();
  void* scratch = arena.allocate(5000);
  ASSERT_NE(scratch, nullptr);
  arena.rewind(m);
  EXPECT_EQ(arena.used(), m.offset);
  EXPECT_EQ(arena.allocate(5000), scratch);  // the same memory comes back
  arena.rewind(m);
  {
    virtual_arena::scope scope(arena);
    EXPECT_EQ(&scope.arena(), &arena);
    ASSERT_NE(arena.allocate(1 * MiB), nullptr);
    EXPECT_GE(arena.used(), 1 * MiB);
  }
  EXPECT_EQ(arena.used(), m.offset);
  EXPECT_GE(arena.high_water(), 1 * MiB + 100);
}

TEST_F(virtual_arena_test, rewinding_ahead_of_the_cursor_is_a_contract_violation) {
  virtual_arena arena(1 * MiB);
  EXPECT_DEATH(arena.rewind(virtual_arena::marker{4096}), "ahead of the cursor");
}

TEST_F(virtual_arena_test, reset_keeps_the_retained_amount_and_decommits_the_rest) {
  virtual_arena arena(256 * MiB, {.commit_step = 1 * MiB, .retained_on_reset = 2 * MiB});
  void* p = arena.allocate(64 * MiB);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 64 * MiB);
  auto touched = os::current_resident_bytes();
  ASSERT_TRUE(touched.ok());
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.committed(), 2 * MiB);
  EXPECT_EQ(arena.high_water(), 64 * MiB);
  auto after = os::current_resident_bytes();
  ASSERT_TRUE(after.ok());
  EXPECT_LE(after.value() + 48 * MiB, touched.value());
  // The memory is usable again, and the decommitted part comes back zero-filled.
  auto* again = static_cast<unsigned char*>(arena.allocate(64 * MiB));
  ASSERT_EQ(static_cast<void*>(again), p);
  EXPECT_EQ(again[64 * MiB - 1], 0);
}

TEST_F(virtual_arena_test, reset_with_everything_retained_decommits_nothing) {
  virtual_arena arena(64 * MiB, {.retained_on_reset = std::numeric_limits<std::size_t>::max()});
  ASSERT_NE(arena.allocate(8 * MiB), nullptr);
  const std::size_t committed = arena.committed();
  arena.reset();
  EXPECT_EQ(arena.committed(), committed);
  EXPECT_EQ(arena.used(), 0u);
}

TEST_F(virtual_arena_test, a_failed_decommit_on_reset_keeps_memory_committed_and_usable) {
  virtual_arena arena(64 * MiB);
  ASSERT_NE(arena.allocate(8 * MiB), nullptr);
  const std::size_t committed = arena.committed();
  os::testing::inject_failure(os::testing::operation::decommit, 1, EAGAIN);
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.committed(), committed);
  EXPECT_EQ(arena.last_error(), EAGAIN);
  auto* p = static_cast<char*>(arena.allocate(8 * MiB));
  ASSERT_NE(p, nullptr);
  p[8 * MiB - 1] = 1;
}

TEST_F(virtual_arena_test, the_most_recent_allocation_grows_and_shrinks_in_place) {
  virtual_arena arena(64 * MiB, {.commit_step = 1 * MiB});
  ASSERT_NE(arena.allocate(10), nullptr);
  auto* p = static_cast<char*>(arena.allocate(100));
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, 100);
  EXPECT_TRUE(arena.resize(p, 100, 10 * MiB));  // crosses several commit steps
  EXPECT_EQ(p[99], 7);
  p[10 * MiB - 1] = 1;
  EXPECT_TRUE(arena.resize(p, 10 * MiB, 50));
  EXPECT_EQ(arena.used(), static_cast<std::size_t>(p + 50 - static_cast<char*>(arena.base())));
  void* next = arena.allocate(1, 1);
  EXPECT_EQ(next, p + 50);
  // p is no longer the most recent: growing fails, shrinking still succeeds.
  EXPECT_FALSE(arena.resize(p, 50, 60));
  EXPECT_TRUE(arena.resize(p, 50, 40));
  EXPECT_FALSE(arena.resize(next, 1, 128 * MiB));  // beyond the reservation
}

TEST_F(virtual_arena_test, deallocate_frees_only_the_most_recent_allocation) {
  virtual_arena arena(1 * MiB);
  void* a = arena.allocate(64);
  void* b = arena.allocate(64);
  const std::size_t used = arena.used();
  arena.deallocate(a, 64);  // not the most recent: a no-op
  EXPECT_EQ(arena.used(), used);
  arena.deallocate(b, 64);
  arena.deallocate(a, 64);  // now it is
  EXPECT_EQ(arena.used(), 0u);
  arena.deallocate(nullptr, 8);
}

TEST_F(virtual_arena_test, works_through_the_allocator_interface) {
  virtual_arena arena(64 * MiB);
  memkit::allocator& a = arena;
  auto* p = static_cast<char*>(a.allocate(32));
  ASSERT_NE(p, nullptr);
  std::memcpy(p, "0123456789abcdef0123456789abcdef", 32);
  EXPECT_TRUE(a.resize(p, 32, 4096));  // most recent: in place
  void* moved = a.reallocate(p, 4096, 32, 8192);
  EXPECT_EQ(moved, p);  // still most recent: grows in place
  void* other = a.allocate(16);
  ASSERT_NE(other, nullptr);
  auto* copy = static_cast<char*>(a.reallocate(p, 8192, 32, 16384));
  ASSERT_NE(copy, nullptr);
  EXPECT_NE(copy, p);  // not the most recent any more: moved, used bytes copied
  EXPECT_EQ(std::memcmp(copy, "0123456789abcdef0123456789abcdef", 32), 0);
  a.deallocate(copy, 16384);
  EXPECT_TRUE(a.is_equal(arena));
  // And through std::pmr.
  memkit::allocator_resource resource(arena);
  std::pmr::vector<int> v(&resource);
  for (int i = 0; i < 10000; ++i) v.push_back(i);
  EXPECT_EQ(v[9999], 9999);
}

TEST_F(virtual_arena_test, create_constructs_objects) {
  struct point {
    int x, y;
  };
  virtual_arena arena(1 * MiB);
  point* p = arena.create<point>(point{3, 4});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->x + p->y, 7);
  EXPECT_TRUE(aligned_to(p, alignof(point)));
}

TEST_F(virtual_arena_test, moves_transfer_the_reservation) {
  virtual_arena a(16 * MiB);
  auto* p = static_cast<int*>(a.allocate(sizeof(int)));
  *p = 42;
  virtual_arena b(std::move(a));
  EXPECT_EQ(a.reserved(), 0u);  // NOLINT: moved-from state is specified: empty
  EXPECT_EQ(a.allocate(1), nullptr);
  EXPECT_EQ(*p, 42);
  EXPECT_TRUE(b.owns(p));
  virtual_arena c(1 * MiB);
  c = std::move(b);
  EXPECT_EQ(*p, 42);
  EXPECT_EQ(c.reserved(), 16 * MiB);
}

TEST_F(virtual_arena_test, empty_arena_fails_every_allocation) {
  virtual_arena empty;
  EXPECT_EQ(empty.allocate(1), nullptr);
  EXPECT_FALSE(empty.commit_ahead(1));
  EXPECT_TRUE(empty.commit_ahead(0));
  empty.reset();
  virtual_arena zero(0);
  EXPECT_EQ(zero.allocate(1), nullptr);
  EXPECT_EQ(zero.reserved(), 0u);
}

TEST_F(virtual_arena_test, failed_reservation_throws_or_returns_nullopt) {
  EXPECT_THROW(virtual_arena{std::size_t{1} << 62}, std::bad_alloc);
  EXPECT_THROW(virtual_arena{std::numeric_limits<std::size_t>::max()}, std::length_error);
  EXPECT_FALSE(virtual_arena::try_create(std::size_t{1} << 62).has_value());
  os::testing::inject_failure(os::testing::operation::reserve, 1);
  EXPECT_FALSE(virtual_arena::try_create(1 * MiB).has_value());
  auto ok = virtual_arena::try_create(1 * MiB);
  ASSERT_TRUE(ok.has_value());
  EXPECT_NE(ok->allocate(8), nullptr);
}

TEST_F(virtual_arena_test, commit_ahead_and_decommit_unused) {
  virtual_arena arena(64 * MiB, {.commit_step = 1 * MiB});
  EXPECT_TRUE(arena.commit_ahead(10 * MiB));
  EXPECT_EQ(arena.committed(), 10 * MiB);
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_FALSE(arena.commit_ahead(65 * MiB));
  ASSERT_NE(arena.allocate(5000), nullptr);
  EXPECT_TRUE(arena.decommit_unused());
  EXPECT_EQ(arena.committed(), memkit::detail::align_up(5000, os::page_size()));  // the used bytes' pages
  os::testing::inject_failure(os::testing::operation::commit, 1);
  EXPECT_FALSE(arena.commit_ahead(1 * MiB));
  EXPECT_EQ(arena.used(), 5000u);
}

TEST_F(virtual_arena_test, huge_page_option_aligns_steps_to_huge_pages) {
  const std::size_t huge = os::huge_page_size();
  if (huge == 0) GTEST_SKIP() << "no transparent huge pages here";
  virtual_arena arena(64 * MiB, {.commit_step = 4096, .huge_pages = true});
  EXPECT_EQ(arena.commit_step(), huge);
  EXPECT_TRUE(aligned_to(arena.base(), huge));
  auto* p = static_cast<char*>(arena.allocate(3 * huge));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 3 * huge);
  arena.reset();
  EXPECT_NE(arena.allocate(huge), nullptr);
}

#if !MEMKIT_WINDOWS  // RLIMIT_DATA and fork-based death tests: POSIX only
TEST_F(virtual_arena_test, a_commit_beyond_an_address_space_limit_returns_null_in_a_child) {
  EXPECT_EXIT(
      {
        // Reserve first (MAP_NORESERVE mappings still count toward RLIMIT_AS, so reserve within it).
        virtual_arena arena(512 * MiB, {.commit_step = 1 * MiB});
        // RLIMIT_DATA counts private writable mappings: committing beyond it fails with ENOMEM.
        // Allow 64 MiB more than the process already has (sanitizers map a lot of their own).
        if (!limit_data_growth(64 * MiB)) _exit(4);
        void* small = arena.allocate(1024);
        if (small == nullptr) _exit(5);
        void* big = arena.allocate(256 * MiB);
        const bool clean = big == nullptr && arena.last_error() == ENOMEM && arena.used() == 1024;
        _exit(clean ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}
#endif

#if !MEMKIT_WINDOWS  // RLIMIT_AS, /proc and fork-based death tests: POSIX only
TEST_F(virtual_arena_test, a_reservation_beyond_rlimit_as_fails_cleanly_in_a_child) {
  EXPECT_EXIT(
      {
        // Allow 256 MiB more address space than the process has (sanitizers reserve a lot).
        std::FILE* status = std::fopen("/proc/self/status", "r");
        unsigned long long size_kib = 0;
        char line[256];
        while (status != nullptr && std::fgets(line, sizeof line, status) != nullptr) {
          if (std::sscanf(line, "VmSize: %llu kB", &size_kib) == 1) break;
        }
        if (status != nullptr) std::fclose(status);
        rlimit limit{};
        if (size_kib == 0 || getrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
        limit.rlim_cur = static_cast<rlim_t>(size_kib * 1024 + 256 * MiB);
        if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(4);
        const bool refused = !virtual_arena::try_create(1024 * MiB).has_value();
        bool threw = false;
        try {
          virtual_arena arena(1024 * MiB);
        } catch (const std::bad_alloc&) {
          threw = true;
        }
        auto fits = virtual_arena::try_create(64 * MiB);
        const bool small_works = fits.has_value() && fits->allocate(4096) != nullptr;
        _exit(refused && threw && small_works ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}
#endif

// Addresses a released arena gave back are reused by the next reservation, with whatever shadow
// state AddressSanitizer still holds for them. A dyn_array (inline code, built with the caller's
// flags) poisons its unused capacity; when memkit's library is built without ASan under a program
// built with it, the arena's own poisoning compiles to nothing, and the next arena used to hand out
// blocks that were still poisoned (found by fuzz/virtual_arena_fuzz.cpp). The asan preset runs this
// test a second time against a library built without ASan (virtual_arena_test_library_without_asan).
TEST_F(virtual_arena_test, handed_out_memory_is_writable_where_a_released_array_was_poisoned) {
  constexpr std::size_t elements = 2 * MiB;  // 8 MiB of std::uint32_t
  void* first_base = nullptr;
  {
    memkit::dyn_array<std::uint32_t> array(elements, {.commit_step = 64 * 1024, .prefault_step = 16 * 1024});
    array.reserve(elements / 2);  // the unused capacity (4 MiB) is poisoned
    array.push_back(1);
    first_base = array.data();
  }
  virtual_arena arena(elements * sizeof(std::uint32_t), {.commit_step = 64 * 1024, .prefault_step = 16 * 1024});
  if (arena.base() != first_base) GTEST_SKIP() << "the system placed the second reservation elsewhere";
  ASSERT_NE(arena.allocate(8), nullptr);
  auto* block = static_cast<unsigned char*>(arena.allocate(MiB));
  ASSERT_NE(block, nullptr);
  std::memset(block, 0xab, MiB);  // use-after-poison here when stale poison survives
  EXPECT_EQ(block[MiB - 1], 0xab);
  ASSERT_TRUE(arena.resize(block, MiB, 2 * MiB));
  std::memset(block + MiB, 0xcd, MiB);
  EXPECT_EQ(block[2 * MiB - 1], 0xcd);
}

#if MEMKIT_HAS_ASAN
TEST_F(virtual_arena_test, use_after_rewind_is_reported_by_asan) {
  EXPECT_DEATH(
      {
        virtual_arena arena(1 * MiB);
        const auto m = arena.mark();
        auto* p = static_cast<volatile char*>(arena.allocate(64));
        arena.rewind(m);
        p[0] = 1;
      },
      "use-after-poison");
}
#endif

}  // namespace
