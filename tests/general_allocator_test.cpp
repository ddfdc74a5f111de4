#include "memkit/general_allocator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#if defined(_WIN32)
#include "../src/os/windows_api.hpp"
#include <psapi.h>  // GetProcessMemoryInfo

#include <fcntl.h>
#include <io.h>
#else
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include "memkit/os.hpp"
#include "support/rlimit.hpp"

namespace {

using memkit::general_allocator;

// A static object of "another library" that allocates from the global instance while static
// constructors run: the global instance is constant-initialized, so the order does not matter.
struct allocates_at_static_initialization {
  void* block = general_allocator::global().allocate(48);
  allocates_at_static_initialization() { std::memset(block, 0x42, 48); }
  ~allocates_at_static_initialization() { general_allocator::global().free(block); }  // at exit
} early_user;
namespace os = memkit::os;

#if defined(_WIN32)
// Wine, which runs the Windows build's tests on Linux, names itself through ntdll's
// wine_get_version.
bool running_on_wine() {
  const HMODULE ntdll = ::GetModuleHandleA("ntdll.dll");
  return ntdll != nullptr && ::GetProcAddress(ntdll, "wine_get_version") != nullptr;
}
#endif

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

class general_allocator_test : public ::testing::Test {
 protected:
  void TearDown() override { os::testing::clear_injected_failures(); }
};

void fill(void* p, std::size_t n, unsigned char seed) {
  auto* c = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) c[i] = static_cast<unsigned char>(seed + i * 7);
}

bool check(const void* p, std::size_t n, unsigned char seed) {
  auto* c = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (c[i] != static_cast<unsigned char>(seed + i * 7)) return false;
  }
  return true;
}

TEST_F(general_allocator_test, every_size_up_to_a_megabyte_is_usable_and_distinct) {
  general_allocator a;
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t size = 1; size <= (1u << 20); size = size < 256 ? size + 1 : size + size / 7) {
    void* p = a.allocate(size);
    ASSERT_NE(p, nullptr) << size;
    EXPECT_TRUE(aligned(p, memkit::default_alignment)) << size;
    EXPECT_GE(a.usable_size(p), size);
    EXPECT_TRUE(a.owns(p));
    fill(p, size, static_cast<unsigned char>(size));
    blocks.emplace_back(p, size);
  }
  for (auto [p, size] : blocks) {
    EXPECT_TRUE(check(p, size, static_cast<unsigned char>(size))) << size;
    a.free(p);
  }
}

TEST_F(general_allocator_test, every_size_class_is_reported_and_used) {
  general_allocator a;
  auto s = a.statistics();
  ASSERT_GT(s.size_class_count, 40u);
  for (std::size_t c = 0; c < s.size_class_count; ++c) {
    const std::size_t bs = s.size_classes[c].block_size;
    void* p = a.allocate(bs, bs <= 8 ? 8 : 16);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(a.usable_size(p), bs) << "class " << c;
    a.free(p);
  }
  s = a.statistics();
  for (std::size_t c = 0; c < s.size_class_count; ++c) {
    EXPECT_EQ(s.size_classes[c].allocations, 1u) << c;
    EXPECT_EQ(s.size_classes[c].frees, 1u) << c;
  }
}

TEST_F(general_allocator_test, every_power_of_two_alignment_is_honoured) {
  general_allocator a;
  for (std::size_t alignment = 1; alignment <= (std::size_t{16} << 20); alignment *= 2) {
    for (std::size_t size : {std::size_t{1}, std::size_t{24}, std::size_t{100}, std::size_t{5000},
                             std::size_t{300000}, std::size_t{3} << 20}) {
      void* p = a.allocate(size, alignment);
      ASSERT_NE(p, nullptr) << size << " @" << alignment;
      EXPECT_TRUE(aligned(p, alignment)) << size << " @" << alignment;
      EXPECT_GE(a.usable_size(p), size);
      std::memset(p, 0x5A, size);
      a.free(p);
    }
  }
  EXPECT_EQ(a.allocate(16, 3), nullptr);
  EXPECT_EQ(a.allocate(16, 0), nullptr);
}

TEST_F(general_allocator_test, freed_slots_are_reused) {
  general_allocator a;
  void* p = a.allocate(128);
  a.free(p);
  void* q = a.allocate(128);
  EXPECT_EQ(p, q);
  a.free(q);
}

TEST_F(general_allocator_test, the_seeds_degenerate_pattern_keeps_memory_bounded) {
  // Zig's gpa-degen: keep one block of each page-worth of allocations, free the rest.
  general_allocator a;
  constexpr std::size_t rounds = 20000;
  constexpr std::size_t slots = 4096 / 128;
  std::vector<void*> kept(rounds);
  for (std::size_t i = 0; i < rounds; ++i) {
    kept[i] = a.allocate(128);
    ASSERT_NE(kept[i], nullptr);
    for (std::size_t j = 0; j + 1 < slots; ++j) {
      void* p = a.allocate(128);
      ASSERT_NE(p, nullptr);
      a.free(p);
    }
  }
  // Freed slots are reused, so only the kept blocks occupy pages.
  auto s = a.statistics();
  EXPECT_LE(s.size_classes[8].pages * 65536, rounds * 128 * 2);
  for (void* p : kept) a.free(p);
  s = a.statistics();
  EXPECT_EQ(s.live_bytes, 0u);
}

TEST_F(general_allocator_test, resize_in_place_within_the_block_and_never_moves) {
  general_allocator a;
  memkit::allocator& base = a;
  void* p = base.allocate(100);
  ASSERT_NE(p, nullptr);
  const std::size_t usable = a.usable_size(p);
  EXPECT_TRUE(base.resize(p, 100, usable));
  EXPECT_TRUE(base.resize(p, usable, 1));
  EXPECT_FALSE(base.resize(p, 1, usable + 1));
  base.deallocate(p, 1);
}

TEST_F(general_allocator_test, reallocate_keeps_contents_and_old_block_on_failure) {
  general_allocator a;
  void* p = a.allocate(40);
  fill(p, 40, 3);
  void* q = a.reallocate_unsized(p, 4000);
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(check(q, 40, 3));
  void* r = a.reallocate_unsized(q, std::size_t{1} << 50);  // too big: fails, q still valid
  EXPECT_EQ(r, nullptr);
  EXPECT_TRUE(check(q, 40, 3));
  void* small = a.reallocate_unsized(q, 10);  // shrinking a lot moves to a fitting class
  ASSERT_NE(small, nullptr);
  EXPECT_TRUE(check(small, 10, 3));
  EXPECT_LE(a.usable_size(small), 16u);
  a.free(small);
  void* fresh = a.reallocate_unsized(nullptr, 77);  // null behaves as allocate
  ASSERT_NE(fresh, nullptr);
  a.free(fresh);

  memkit::allocator& base = a;
  void* s = base.allocate(64);
  fill(s, 64, 9);
  void* t = base.reallocate(s, 64, 64, 100000);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(check(t, 64, 9));
  base.deallocate(t, 100000);
}

TEST_F(general_allocator_test, huge_blocks_grow_in_place_when_they_can) {
  general_allocator a;
  const std::size_t mib = std::size_t{1} << 20;
  void* p = a.allocate(4 * mib);  // above the size classes: a mapping of its own
  ASSERT_NE(p, nullptr);
  fill(p, mib, 1);
  // The reservation is rounded up to 4 MiB (here 8 MiB with the header), so growth within it
  // never moves.
  void* q = a.reallocate_unsized(p, 7 * mib);
  EXPECT_EQ(q, p);
  EXPECT_GE(a.usable_size(q), 7 * mib);
  EXPECT_TRUE(check(q, mib, 1));
  std::memset(static_cast<char*>(q) + mib, 7, 6 * mib);
  memkit::allocator& base = a;
  EXPECT_TRUE(base.resize(q, 7 * mib, 5 * mib));  // shrinking always works in place
  // Growing far beyond: in place if the address space after it is free, else moved; either way
  // the contents survive.
  void* r = a.reallocate_unsized(q, 64 * mib);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(check(r, mib, 1));
  auto s = a.statistics();
  EXPECT_EQ(s.huge_allocations - s.huge_frees, 1u);
  EXPECT_GE(s.huge_live_bytes, 64 * mib);
  a.free(r);
  s = a.statistics();
  EXPECT_EQ(s.huge_live_bytes, 0u);
}

TEST_F(general_allocator_test, allocate_zeroed_gives_zero_bytes_even_for_reused_blocks) {
  general_allocator a;
  for (std::size_t size : {std::size_t{24}, std::size_t{3000}, std::size_t{2} << 20}) {
    void* p = a.allocate(size);
    std::memset(p, 0xFF, size);
    a.free(p);
    auto* z = static_cast<unsigned char*>(a.allocate_zeroed(size));
    ASSERT_NE(z, nullptr);
    for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(z[i], 0) << size << " " << i;
    a.free(z);
  }
}

// Options under which freed huge blocks stay cached for the whole test, whatever the machine's
// speed.
general_allocator::options long_cache() {
  general_allocator::options o;
  o.purge_delay_ms = 600000;
  o.retained_limit = std::size_t{256} << 20;
  return o;
}

// Two blocks of a size class (`bytes`, most of a segment each) in two segments, written and freed:
// the heap keeps one segment (`kept`), the other goes to the cache of empty segments (`cached`),
// resident until its purge.
void make_an_empty_segment(general_allocator& a, std::size_t bytes, void*& kept, void*& cached) {
  auto* first = static_cast<char*>(a.allocate(bytes));
  auto* second = static_cast<char*>(a.allocate(bytes));
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  std::memset(first, 0xFF, bytes);
  std::memset(second, 0xFF, bytes);
  a.free(second);
  a.free(first);
  kept = first;
  cached = second;
}
void make_an_empty_segment(general_allocator& a, std::size_t bytes) {
  void* kept = nullptr;
  void* cached = nullptr;
  make_an_empty_segment(a, bytes, kept, cached);
}

// After every block is freed: nothing live, no more resident than mapped, and purge() gives every
// cached byte back (the accounting a moved or recycled page could have left wrong).
void expect_everything_returned(general_allocator& a) {
  const auto end = a.statistics();
  EXPECT_EQ(end.huge_live_bytes, 0u);
  EXPECT_EQ(end.live_bytes, 0u);
  EXPECT_LE(end.resident_bytes, end.mapped_bytes);
  a.purge();
  EXPECT_EQ(a.statistics().retained_bytes, 0u);
}

TEST_F(general_allocator_test, freed_large_blocks_give_their_resident_pages_to_new_ones) {
  general_allocator a(long_cache());
  const std::size_t mib = std::size_t{1} << 20;
  std::vector<void*> freed;
  for (std::size_t size : {4 * mib, 5 * mib, 6 * mib}) {  // above the size classes
    void* p = a.allocate(size);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0xFF, size);
    freed.push_back(p);
  }
  for (void* p : freed) a.free(p);
  [[maybe_unused]] const auto before = a.statistics();
  // The cached block that reuses its reservation for the 10 MiB one, or a fresh one, is filled with
  // the other freed blocks' pages (on Linux), so the resident estimate does not grow by another
  // 10 MiB.
  auto* z = static_cast<unsigned char*>(a.allocate_zeroed(10 * mib));
  ASSERT_NE(z, nullptr);
  for (std::size_t i = 0; i < 10 * mib; ++i) ASSERT_EQ(z[i], 0) << i;  // dirty pages were zeroed
  [[maybe_unused]] const auto after = a.statistics();
#if defined(__linux__)
  EXPECT_LT(after.resident_bytes, before.resident_bytes + mib);
#endif
  fill(z, 10 * mib, 3);
  // A block made of moved pages still grows in place or moves with its contents.
  void* g = a.reallocate_unsized(z, 40 * mib);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(check(g, 10 * mib, 3));
  std::memset(static_cast<char*>(g) + 10 * mib, 1, 30 * mib);
  void* h = a.reallocate_unsized(g, 5 * mib);  // and shrinks
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(check(h, 5 * mib, 3));
  // Reused again by blocks of other sizes, after it is freed.
  a.free(h);
  for (std::size_t size : {7 * mib, 5 * mib, 4 * mib}) {
    void* p = a.allocate(size);
    ASSERT_NE(p, nullptr);
    fill(p, size, 9);
    EXPECT_TRUE(check(p, size, 9));
    a.free(p);
  }
  const auto end = a.statistics();
  EXPECT_EQ(end.huge_live_bytes, 0u);
  EXPECT_EQ(end.huge_allocations, end.huge_frees);
  EXPECT_LE(end.resident_bytes, end.mapped_bytes);
}

TEST_F(general_allocator_test, a_failed_page_move_leaves_every_block_usable) {
  const std::size_t mib = std::size_t{1} << 20;
  for (unsigned successes = 0; successes < 6; ++successes) {
    general_allocator a(long_cache());
    std::vector<void*> freed;
    for (std::size_t size : {4 * mib, 5 * mib, 6 * mib, 4 * mib, 5 * mib}) {
      void* p = a.allocate(size);
      ASSERT_NE(p, nullptr);
      std::memset(p, 0xFF, size);
      freed.push_back(p);
    }
    for (void* p : freed) a.free(p);
    os::testing::fail_after(os::testing::operation::map, successes);
    auto* z = static_cast<unsigned char*>(a.allocate_zeroed(16 * mib));
    os::testing::clear_injected_failures();
    ASSERT_NE(z, nullptr) << successes;  // a failed move falls back to fresh memory
    for (std::size_t i = 0; i < 16 * mib; i += 512) ASSERT_EQ(z[i], 0) << successes << " " << i;
    fill(z, 16 * mib, 4);
    // Whatever the cache kept is still whole.
    std::vector<void*> again;
    for (std::size_t size : {6 * mib, 5 * mib, 4 * mib, 7 * mib}) {
      void* p = a.allocate(size);
      ASSERT_NE(p, nullptr);
      fill(p, size, 6);
      again.push_back(p);
    }
    EXPECT_TRUE(check(z, 16 * mib, 4));
    for (void* p : again) {
      EXPECT_TRUE(check(p, a.usable_size(p) < mib ? a.usable_size(p) : mib, 6));
      a.free(p);
    }
    a.free(z);
    EXPECT_EQ(a.statistics().huge_live_bytes, 0u);
  }
}

TEST_F(general_allocator_test, a_freed_large_block_serves_blocks_of_the_size_classes) {
  general_allocator a(long_cache());
  const std::size_t mib = std::size_t{1} << 20;
  const std::size_t segment = 4 * mib;
  auto* big = static_cast<char*>(a.allocate(7 * mib));  // above the size classes
  ASSERT_NE(big, nullptr);
  std::memset(big, 0xFF, 7 * mib);
  char* const base = reinterpret_cast<char*>(reinterpret_cast<std::uintptr_t>(big) & ~(segment - 1));
  a.free(big);
  const auto before = a.statistics();
  EXPECT_GE(before.retained_bytes, 7 * mib);  // cached, resident
  // A block of a size class needs a segment: the freed block's first 4 MiB become it, in place,
  // with their resident pages, instead of a new mapping faulted in afresh.
  auto* p = static_cast<unsigned char*>(a.allocate(2 * mib));
  ASSERT_NE(p, nullptr);
  EXPECT_GE(reinterpret_cast<char*>(p), base);
  EXPECT_LE(reinterpret_cast<char*>(p) + 2 * mib, base + segment);
  const auto after = a.statistics();
  EXPECT_LT(after.mapped_bytes, before.mapped_bytes + segment);  // no new segment
  EXPECT_LE(after.resident_bytes, before.resident_bytes + 64 * 1024);  // the header's pages at most
  fill(p, 2 * mib, 1);
  // The rest of the freed block stays cached as a block of its own: a zeroed huge block that
  // takes its pages reads zero, and neither overwrites the other.
  auto* z = static_cast<unsigned char*>(a.allocate_zeroed(5 * mib));
  ASSERT_NE(z, nullptr);
  for (std::size_t i = 0; i < 5 * mib; i += 256) ASSERT_EQ(z[i], 0) << i;
  fill(z, 5 * mib, 2);
  EXPECT_LT(a.statistics().resident_bytes, after.resident_bytes + 3 * mib);  // took resident pages
  // Other blocks of the size classes share the segment.
  std::vector<void*> more;
  for (std::size_t size : {std::size_t{512} << 10, std::size_t{1} << 20, std::size_t{300} << 10}) {
    void* q = a.allocate(size);
    ASSERT_NE(q, nullptr);
    fill(q, size, 3);
    more.push_back(q);
  }
  EXPECT_TRUE(check(p, 2 * mib, 1));
  EXPECT_TRUE(check(z, 5 * mib, 2));
  for (void* q : more) {
    EXPECT_TRUE(check(q, std::size_t{300} << 10, 3));
    a.free(q);
  }
  a.free(p);
  a.free(z);
  expect_everything_returned(a);
}

// The system's own count of resident memory, not the allocator's: what it gives back must leave
// the process. The cached huge block's rest goes back at the purge; the 4 MiB segment made of its
// head stays, the heap's. (On Windows these are parts of one reservation, which the system frees
// only whole; they leaked there once, the allocator's statistics counting them as returned.)
TEST_F(general_allocator_test, a_cached_large_block_split_for_a_segment_gives_the_rest_back) {
  const std::size_t mib = std::size_t{1} << 20;
  general_allocator a(long_cache());
  const auto rss_before = os::current_resident_bytes();
  auto* big = static_cast<char*>(a.allocate(28 * mib));
  ASSERT_NE(big, nullptr);
  std::memset(big, 0xFF, 28 * mib);
  a.free(big);
  void* p = a.allocate(2 * mib);  // a segment of the cached block's first 4 MiB
  ASSERT_NE(p, nullptr);
  const std::uintptr_t segment_mask = ~((std::uintptr_t{4} << 20) - 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) & segment_mask, reinterpret_cast<std::uintptr_t>(big) & segment_mask);
  a.free(p);
  a.purge();
  const auto rss_after = os::current_resident_bytes();
  ASSERT_TRUE(rss_before.ok() && rss_after.ok());
  EXPECT_LT(rss_after.value(), rss_before.value() + 12 * mib);
}

// Blocks aligned beyond 4 MiB sit in a larger reservation whose ends are unmapped at once: freed
// and purged, every page of them leaves the process.
TEST_F(general_allocator_test, over_aligned_large_blocks_give_their_memory_back) {
  const std::size_t mib = std::size_t{1} << 20;
  general_allocator a;
  const auto rss_before = os::current_resident_bytes();
  for (int i = 0; i < 20; ++i) {
    void* p = a.allocate(3 * mib, 16 * mib);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned(p, 16 * mib));
    std::memset(p, 1, 3 * mib);
    a.free(p);
    a.purge();
  }
  const auto rss_after = os::current_resident_bytes();
  ASSERT_TRUE(rss_before.ok() && rss_after.ok());
  EXPECT_LT(rss_after.value(), rss_before.value() + 12 * mib);  // of 60 MiB written
}

// A freed huge block serves a later, larger one in its own reservation: no new mapping, and the
// pages it had stay where they are.
TEST_F(general_allocator_test, a_cached_large_block_serves_a_larger_one_in_place) {
  general_allocator a(long_cache());
  const std::size_t mib = std::size_t{1} << 20;
  auto* small = static_cast<char*>(a.allocate(4 * mib));
  ASSERT_NE(small, nullptr);
  std::memset(small, 0xFF, 4 * mib);
  a.free(small);
  const auto before = a.statistics();
  for (std::size_t size : {8 * mib, 16 * mib}) {
    auto* larger = static_cast<char*>(a.allocate_zeroed(size));
    ASSERT_NE(larger, nullptr) << size;
    EXPECT_EQ(larger, small) << size;
    EXPECT_EQ(a.statistics().mapped_bytes, before.mapped_bytes) << size;
    for (std::size_t i = 0; i < size; i += 4096) ASSERT_EQ(larger[i], 0) << size << " " << i;
    fill(larger, size, 7);
    EXPECT_TRUE(check(larger, size, 7));
    a.free(larger);
  }
  EXPECT_EQ(a.statistics().huge_live_bytes, 0u);
}

// Of two cached blocks that both hold a new block's pages, the one with fewer to spare serves it,
// so the other still serves a larger block without faulting or moving pages in.
TEST_F(general_allocator_test, a_new_large_block_takes_the_cached_block_whose_pages_fit_it_best) {
  general_allocator a(long_cache());
  const std::size_t mib = std::size_t{1} << 20;
  auto* eight = static_cast<char*>(a.allocate(8 * mib));
  auto* four = static_cast<char*>(a.allocate(4 * mib));
  ASSERT_NE(eight, nullptr);
  ASSERT_NE(four, nullptr);
  std::memset(eight, 0xFF, 8 * mib);
  std::memset(four, 0xFF, 4 * mib);
  a.free(four);
  a.free(eight);
  const std::size_t resident = a.statistics().resident_bytes;
  auto* p = static_cast<char*>(a.allocate(4 * mib));
  auto* q = static_cast<char*>(a.allocate(8 * mib));
  EXPECT_EQ(p, four);
  EXPECT_EQ(q, eight);
  EXPECT_EQ(a.statistics().resident_bytes, resident);  // nothing faulted in
  fill(p, 4 * mib, 1);
  fill(q, 8 * mib, 2);
  EXPECT_TRUE(check(p, 4 * mib, 1));
  EXPECT_TRUE(check(q, 8 * mib, 2));
  a.free(p);
  a.free(q);
}

// Freed huge blocks stay cached while their resident pages fit in retained_limit (not half of
// it): the limit bounds what sits empty, and refaulting them costs more than keeping them.
TEST_F(general_allocator_test, freed_large_blocks_stay_cached_up_to_the_retained_limit) {
  general_allocator::options o = long_cache();
  o.retained_limit = std::size_t{16} << 20;
  general_allocator a(o);
  const std::size_t mib = std::size_t{1} << 20;
  std::vector<char*> blocks;
  for (int i = 0; i < 3; ++i) {
    auto* p = static_cast<char*>(a.allocate(4 * mib));
    ASSERT_NE(p, nullptr);
    std::memset(p, 0xFF, 4 * mib);
    blocks.push_back(p);
  }
  const auto live = a.statistics();
  for (char* p : blocks) a.free(p);
  const auto freed = a.statistics();
  EXPECT_EQ(freed.mapped_bytes, live.mapped_bytes);  // all three cached, none unmapped
  EXPECT_EQ(freed.resident_bytes, live.resident_bytes);
  // Each serves a block again in place.
  std::vector<char*> again;
  for (int i = 0; i < 3; ++i) {
    auto* p = static_cast<char*>(a.allocate(4 * mib));
    ASSERT_NE(p, nullptr);
    EXPECT_NE(std::find(blocks.begin(), blocks.end(), p), blocks.end()) << i;
    again.push_back(p);
  }
  EXPECT_EQ(a.statistics().mapped_bytes, live.mapped_bytes);
  for (char* p : again) a.free(p);
  a.purge();  // and purge() gives them back
  EXPECT_LT(a.statistics().mapped_bytes, live.mapped_bytes);
}

TEST_F(general_allocator_test, a_cached_large_block_that_cannot_be_committed_stays_cached) {
  general_allocator a(long_cache());
  const std::size_t kib = 1024;
  // Committed only as far as its own end, below 4 MiB: becoming a segment needs one more commit.
  auto* big = static_cast<char*>(a.allocate(3700 * kib));
  ASSERT_NE(big, nullptr);
  std::memset(big, 0xFF, 3700 * kib);
  a.free(big);
  os::testing::inject_failure(os::testing::operation::commit, 1);
  void* p = a.allocate(2048 * kib);  // the failed commit falls back to a new segment
  os::testing::clear_injected_failures();
  ASSERT_NE(p, nullptr);
  fill(p, 2048 * kib, 5);
  EXPECT_TRUE(check(p, 2048 * kib, 5));
  // The freed block is still cached and whole: the next block of its size reuses it.
  auto* again = static_cast<char*>(a.allocate(3700 * kib));
  EXPECT_EQ(again, big);
  fill(again, 3700 * kib, 6);
  EXPECT_TRUE(check(again, 3700 * kib, 6));
  a.free(again);
  a.free(p);
  EXPECT_EQ(a.statistics().live_bytes, 0u);
}

TEST_F(general_allocator_test, an_empty_segment_gives_its_resident_pages_to_a_new_large_block) {
  const std::size_t mib = std::size_t{1} << 20;
  for (bool failing : {false, true}) {
    general_allocator a(long_cache());
    make_an_empty_segment(a, 3 * mib);
    const auto before = a.statistics();
    ASSERT_GE(before.retained_bytes, 6 * mib);
    if (failing) os::testing::fail_after(os::testing::operation::map, 0);  // the move fails
    auto* z = static_cast<unsigned char*>(a.allocate_zeroed(6 * mib));
    os::testing::clear_injected_failures();
    ASSERT_NE(z, nullptr) << failing;  // a failed move falls back to fresh memory
    for (std::size_t i = 0; i < 6 * mib; i += 256) ASSERT_EQ(z[i], 0) << failing << " " << i;
    fill(z, 6 * mib, 7);
    [[maybe_unused]] const auto after = a.statistics();
    if (!failing) {
      // The segment's pages moved into the block rather than 6 MiB being faulted in afresh.
#if defined(__linux__)
      EXPECT_LT(after.resident_bytes, before.resident_bytes + 4 * mib);
      EXPECT_LT(after.retained_bytes, before.retained_bytes);
#endif
    } else {
      // The segment that failed to move is unmapped (its pages were due for the purge), so that
      // it cannot fail again: its pages no longer count as retained (the block's are fresh). Blocks
      // of a size class get segments as before.
#if !defined(_WIN32)  // Windows moves no pages: after the first move it refused, none is tried
      EXPECT_LT(after.retained_bytes, before.retained_bytes);
#endif
      auto* again = static_cast<char*>(a.allocate(3 * mib));
      auto* more = static_cast<char*>(a.allocate(3 * mib));
      ASSERT_NE(again, nullptr);
      ASSERT_NE(more, nullptr);
      fill(again, 3 * mib, 8);
      fill(more, 3 * mib, 10);
      EXPECT_TRUE(check(again, 3 * mib, 8));
      EXPECT_TRUE(check(more, 3 * mib, 10));
      a.free(again);
      a.free(more);
    }
    // A block of a size class still gets a segment afterwards.
    void* p = a.allocate(2 * mib);
    ASSERT_NE(p, nullptr);
    fill(p, 2 * mib, 9);
    EXPECT_TRUE(check(z, 6 * mib, 7));
    EXPECT_TRUE(check(p, 2 * mib, 9));
    a.free(p);
    a.free(z);
    const auto end = a.statistics();
    EXPECT_EQ(end.huge_live_bytes, 0u);
    EXPECT_LE(end.resident_bytes, end.mapped_bytes);
    a.purge();
    EXPECT_EQ(a.statistics().retained_bytes, 0u);
  }
}

TEST_F(general_allocator_test, large_class_blocks_share_freed_spans_in_place) {
  general_allocator::options o;
  o.purge_delay_ms = 600000;  // nothing is purged by itself during the test
  general_allocator a(o);
  const std::size_t kib = 1024;
  // One 3 MiB block, freed: its slices serve blocks of other sizes, at its own addresses.
  auto* big = static_cast<char*>(a.allocate(3072 * kib));
  ASSERT_NE(big, nullptr);
  std::memset(big, 0x5A, 3072 * kib);
  a.free(big);
  const auto before = a.statistics();
  EXPECT_GE(before.retained_bytes, std::size_t{3} << 20);  // resident, waiting for the purge
  const std::size_t sizes[] = {1024 * kib, 700 * kib, 600 * kib, 300 * kib, 200 * kib};
  std::vector<char*> small;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    auto* p = static_cast<char*>(a.allocate(sizes[i]));
    ASSERT_NE(p, nullptr);
    EXPECT_GE(p, big);  // inside the freed span
    EXPECT_LE(p + sizes[i], big + 3072 * kib);
    EXPECT_TRUE(a.owns(p + sizes[i] - 1));  // every byte of a span block is the block's
    fill(p, sizes[i], static_cast<unsigned char>(i));
    small.push_back(p);
  }
  // They reused resident memory: nothing new became resident.
  EXPECT_EQ(a.statistics().resident_bytes, before.resident_bytes);
  for (std::size_t i = 0; i < small.size(); ++i) {
    EXPECT_TRUE(check(small[i], sizes[i], static_cast<unsigned char>(i)));  // no overlap
    a.free(small[i]);
  }
  // Back together: one 3 MiB block fits at the same place again.
  auto* again = static_cast<char*>(a.allocate(3072 * kib));
  EXPECT_EQ(again, big);
  a.free(again);
  a.purge();  // the free slices go back to the OS
  EXPECT_LT(a.statistics().retained_bytes, std::size_t{64} << 10);
}

TEST_F(general_allocator_test, huge_sizes_fail_with_null) {
  general_allocator a;
  EXPECT_EQ(a.allocate(SIZE_MAX), nullptr);
  EXPECT_EQ(a.allocate(SIZE_MAX - 4096), nullptr);
  EXPECT_EQ(a.allocate(general_allocator::max_allocation_size + 1), nullptr);
  EXPECT_EQ(a.allocate_zeroed(SIZE_MAX / 2), nullptr);
  memkit::allocator& base = a;
  EXPECT_EQ(base.allocate_at_least(SIZE_MAX).pointer, nullptr);
}

TEST_F(general_allocator_test, failures_set_errno_and_free_keeps_it) {
  general_allocator a;
  errno = 0;
  EXPECT_EQ(a.allocate(general_allocator::max_allocation_size + 1), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(a.allocate(64, 48), nullptr);  // not a power of two
  EXPECT_EQ(errno, EINVAL);
  os::testing::fail_after(os::testing::operation::reserve, 0);
  errno = 0;
  EXPECT_EQ(a.allocate(100), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(a.allocate(std::size_t{8} << 20), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  os::testing::clear_injected_failures();
  void* p = a.allocate(100);
  ASSERT_NE(p, nullptr);
  errno = 0;
  EXPECT_EQ(a.reallocate_unsized(p, general_allocator::max_allocation_size + 1), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  // free never changes errno, not even when it returns memory to the OS and that fails.
  void* big = a.allocate(std::size_t{8} << 20);
  ASSERT_NE(big, nullptr);
  errno = 12345;
  a.free(p);
  os::testing::fail_after(os::testing::operation::decommit, 0, EFAULT);
  a.free(big);
  os::testing::clear_injected_failures();
  EXPECT_EQ(errno, 12345);
}

TEST_F(general_allocator_test, os_failures_become_null_and_the_allocator_recovers) {
  general_allocator a;
  os::testing::fail_after(os::testing::operation::reserve, 0);
  EXPECT_EQ(a.allocate(100), nullptr);           // no segment can be reserved
  EXPECT_EQ(a.allocate(8u << 20), nullptr);      // nor a huge block
  os::testing::clear_injected_failures();
  os::testing::inject_failure(os::testing::operation::commit, 1);
  EXPECT_EQ(a.allocate(8u << 20), nullptr);      // reserved but not committed: released, null
  void* p = a.allocate(100);
  ASSERT_NE(p, nullptr);
  os::testing::clear_injected_failures();
  a.free(p);
  void* q = a.allocate(8u << 20);
  ASSERT_NE(q, nullptr);
  a.free(q);
}

TEST_F(general_allocator_test, failed_in_place_growth_keeps_the_block) {
  general_allocator a;
  const std::size_t mib = std::size_t{1} << 20;
  void* p = a.allocate(5 * mib);
  fill(p, 5 * mib, 5);
  os::testing::fail_after(os::testing::operation::map, 0);     // extend_mapping fails
  os::testing::fail_after(os::testing::operation::reserve, 0);  // and no new block either
  EXPECT_EQ(a.reallocate_unsized(p, 40 * mib), nullptr);
  os::testing::clear_injected_failures();
  EXPECT_TRUE(check(p, 5 * mib, 5));
  a.free(p);
}

// Minor page faults of this process so far. Windows counts no minor faults apart: its
// PageFaultCount counts soft and hard faults together, and the faults these tests cause (first
// writes to committed pages) are soft ones.
long minor_faults() {
#if defined(_WIN32)
  PROCESS_MEMORY_COUNTERS counters{};
  if (!::GetProcessMemoryInfo(::GetCurrentProcess(), &counters, sizeof counters)) return -1;
  return static_cast<long>(counters.PageFaultCount);
#else
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
#endif
}

// The system's page size, which the fault counts are in (MEMKIT_PAGE_SIZE changes only the os
// layer's).
std::size_t system_page_size() {
#if defined(_WIN32)
  SYSTEM_INFO info{};
  ::GetSystemInfo(&info);
  return info.dwPageSize;
#else
  return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
#endif
}

// Grows one block from 16 KiB to `final_bytes` by 1.5x steps through reallocate_unsized, writing
// the new part each step; returns it (null on failure). With `tight`, the block's own range is
// reserved without room to grow (as when address space runs short), so that growth beyond it
// has to move the block.
void* grow_by_steps(general_allocator& a, std::size_t final_bytes, bool tight = false) {
  std::size_t size = 16 << 10;
  void* p = a.allocate(size);
  if (p == nullptr) return nullptr;
  fill(p, size, 11);
  while (size < final_bytes) {
    std::size_t next = size + size / 2;
    if (next > final_bytes) next = final_bytes;
    const bool crossing = size < general_allocator::growth_threshold && next >= general_allocator::growth_threshold;
    if (tight && crossing) os::testing::inject_failure(os::testing::operation::reserve, 1);
    void* q = a.reallocate_unsized(p, next);
    if (q == nullptr) {
      a.free(p);
      return nullptr;
    }
    // The pattern continues where it stopped: check() of the whole block tells a copy that lost
    // bytes from one that kept them.
    auto* c = static_cast<unsigned char*>(q);
    for (std::size_t i = size; i < next; ++i) c[i] = static_cast<unsigned char>(11 + i * 7);
    p = q;
    size = next;
  }
  return p;
}

TEST_F(general_allocator_test, a_growing_block_moves_its_pages_not_its_bytes) {
#if defined(_WIN32)
  if (running_on_wine()) GTEST_SKIP() << "Wine counts no page faults (PageFaultCount stays 0)";
#endif
  general_allocator a;
  const std::size_t final_bytes = std::size_t{96} << 20;
  // The bound: writing the same number of pages once in a fresh mapping.
  const long before_bound = minor_faults();
  auto fresh = os::map(final_bytes);
  ASSERT_TRUE(fresh.ok());
  std::memset(fresh.value(), 1, final_bytes);
  const long bound_faults = minor_faults() - before_bound;
  ASSERT_TRUE(os::release(fresh.value(), final_bytes).ok());
  // Growth by copying would fault in every destination page again: about three times the bound
  // for 1.5x steps. Growth by committing in place and moving page tables faults each page once.
  const long before = minor_faults();
  void* p = grow_by_steps(a, final_bytes, true);  // it outgrows its first range and moves
  const long growth_faults = minor_faults() - before;
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(check(p, final_bytes, 11));
  EXPECT_LT(growth_faults, bound_faults + bound_faults / 4 + 64)
      << "growth faulted " << growth_faults << " pages, writing once " << bound_faults;
  EXPECT_GE(a.usable_size(p), final_bytes);
  a.free(p);
  EXPECT_EQ(a.statistics().huge_live_bytes, 0u);
}

TEST_F(general_allocator_test, the_allocator_interface_grows_large_buffers_in_their_reservation) {
  general_allocator a;
  memkit::allocator& base = a;
  const std::size_t kib = 1024;
  // A vector-like doubling from a class block: the first growth past growth_threshold moves the
  // block into a range of its own, and the next doubling stays where it is.
  std::size_t size = 64 * kib;
  void* p = base.allocate(size);
  fill(p, size, 21);
  void* q = base.reallocate(p, size, size, 2 * general_allocator::growth_threshold);
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(check(q, size, 21));
  size = 2 * general_allocator::growth_threshold;
  void* r = base.reallocate(q, size, size, 2 * size);
  EXPECT_EQ(r, q);
  EXPECT_TRUE(base.resize(r, 2 * size, 3 * size));  // within the reservation: in place
  EXPECT_TRUE(check(r, 64 * kib, 21));
  // A commit that fails leaves the block as it was and resize() reports it.
  os::testing::fail_after(os::testing::operation::commit, 0);
  EXPECT_FALSE(base.resize(r, 3 * size, 3 * size + 4 * (std::size_t{1} << 20)));
  os::testing::clear_injected_failures();
  EXPECT_TRUE(check(r, 64 * kib, 21));
  base.deallocate(r, 3 * size);
}

TEST_F(general_allocator_test, a_failure_at_any_step_of_growth_keeps_the_block) {
  const std::size_t mib = std::size_t{1} << 20;
  using op = os::testing::operation;
  // Each step of growing past the reservation (extend the mapping, reserve a new range, move the
  // page tables, else allocate and copy) fails in turn, with every later call of the same kind
  // failing too and the other kinds failing always: the call fails with ENOMEM and the block is
  // untouched, or it succeeds and the contents moved intact.
  for (op failing : {op::map, op::reserve, op::commit}) {
    for (unsigned after = 0; after < 4; ++after) {
      general_allocator a;
      void* p = grow_by_steps(a, 6 * mib, true);
      ASSERT_NE(p, nullptr);
      const std::size_t size = 6 * mib;
      for (op other : {op::map, op::reserve, op::commit}) {
        if (other != failing) os::testing::fail_after(other, 0);
      }
      os::testing::fail_after(failing, after);
      errno = 0;
      void* q = a.reallocate_unsized(p, 48 * mib);
      const int error = errno;
      os::testing::clear_injected_failures();
      if (q == nullptr) {
        EXPECT_EQ(error, ENOMEM);
        EXPECT_TRUE(check(p, size, 11));
        EXPECT_GE(a.usable_size(p), size);
        // Still a working block: it grows once the system lets it.
        q = a.reallocate_unsized(p, 48 * mib);
        ASSERT_NE(q, nullptr);
      }
      EXPECT_TRUE(check(q, size, 11));
      std::memset(static_cast<char*>(q) + size, 3, 48 * mib - size);
      a.free(q);
      EXPECT_EQ(a.statistics().huge_live_bytes, 0u);
    }
  }
  // A move that fails alone (the first mremap) falls back to a copy that succeeds.
  general_allocator a;
  void* p = grow_by_steps(a, 6 * mib, true);
  ASSERT_NE(p, nullptr);
  os::testing::inject_failure(op::map, 2);  // the in-place extension and the move
  void* q = a.reallocate_unsized(p, 48 * mib);
  os::testing::clear_injected_failures();
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(check(q, 6 * mib, 11));
  a.free(q);
}

TEST_F(general_allocator_test, a_growing_block_takes_the_resident_pages_of_freed_ones) {
  using op = os::testing::operation;
  const std::size_t mib = std::size_t{1} << 20;
  for (bool failing : {false, true}) {
    general_allocator a;
    // Freed huge blocks wait in the cache with their pages resident (the first segment for the
    // size classes that grow_by_steps passes through takes 4 MiB of one of them).
    void* freed[2];
    for (void*& f : freed) {
      f = a.allocate(8 * mib);
      ASSERT_NE(f, nullptr);
      std::memset(f, 0x55, 8 * mib);
    }
    for (void* f : freed) a.free(f);
    void* p = grow_by_steps(a, mib);
    ASSERT_NE(p, nullptr);
    // The bound: writing as much into a fresh mapping (sanitizers add faults of their own to
    // both).
    const long before_bound = minor_faults();
    auto fresh = os::map(11 * mib);
    ASSERT_TRUE(fresh.ok());
    std::memset(fresh.value(), 1, 11 * mib);
    const long bound = minor_faults() - before_bound;
    ASSERT_TRUE(os::release(fresh.value(), 11 * mib).ok());
    // Growing commits new pages; the cached blocks' pages move in instead of being faulted.
    if (failing) os::testing::fail_after(op::map, 1);  // the second move of a page range fails
    const long before = minor_faults();
    void* q = a.reallocate_unsized(p, 12 * mib);
    os::testing::clear_injected_failures();
    if (q == nullptr) {
      ASSERT_TRUE(failing);
      q = p;
    } else {
      EXPECT_EQ(q, p);  // in place: the block has room to grow
      std::memset(static_cast<char*>(q) + mib, 1, 11 * mib);
      const long faults = minor_faults() - before;
#if defined(_WIN32)
      // Windows cannot move pages from one address to another (os::move_pages fails with
      // ERROR_NOT_SUPPORTED): the new pages fault in afresh, about as many as the bound.
      static_cast<void>(faults);
      static_cast<void>(bound);
#else
      if (!failing) {
        // At least half of the new pages came resident.
        EXPECT_LT(faults + static_cast<long>(11 * mib / os::page_size() / 2), bound)
            << "faults " << faults << ", writing fresh pages " << bound;
      }
#endif
    }
    EXPECT_TRUE(check(q, mib, 11));
    a.free(q);
  }
}

TEST_F(general_allocator_test, a_c_realloc_populates_geometric_growth_not_far_jumps) {
#if defined(_WIN32)
  if (running_on_wine()) GTEST_SKIP() << "Wine counts no page faults (PageFaultCount stays 0)";
#endif
  const std::size_t mib = std::size_t{1} << 20;
  // Faults count the system's pages, whatever page size MEMKIT_PAGE_SIZE gives the os layer.
  const long pages_per_mib = static_cast<long>(mib / system_page_size());
  general_allocator a;
  void* p = a.reallocate_unsized(a.allocate(64 * 1024), 8 * mib);  // its own reservation
  ASSERT_NE(p, nullptr);
  fill(p, 8 * mib, 12);
  // A 1.5x step: realloc faults all the new pages in at once, before the caller writes them.
  long before = minor_faults();
  void* q = a.reallocate_unsized(p, 12 * mib);
  [[maybe_unused]] const long step = minor_faults() - before;
  ASSERT_EQ(q, p);
#if defined(__linux__)
  EXPECT_GE(step, 3 * pages_per_mib) << "pages populated by a 4 MiB step";
#endif
  // A jump to 8 times the size: only as many pages as the block had (12 MiB) are populated, the
  // rest fault in when (and if) the caller writes them.
  before = minor_faults();
  q = a.reallocate_unsized(q, 96 * mib);
  const long jump = minor_faults() - before;
  ASSERT_EQ(q, p);
  EXPECT_LT(jump, 16 * pages_per_mib) << "pages populated by a jump of 84 MiB";
  // Populating that fails leaves the pages to fault in as they are written.
  os::testing::inject_failure(os::testing::operation::prefault, 1);
  q = a.reallocate_unsized(q, 128 * mib);
  os::testing::clear_injected_failures();
  ASSERT_EQ(q, p);
  std::memset(static_cast<char*>(q) + 8 * mib, 1, 120 * mib);
  EXPECT_TRUE(check(q, 8 * mib, 12));
  a.free(q);
}

TEST_F(general_allocator_test, shrinking_a_large_block_gives_its_pages_back) {
  general_allocator a;
  const std::size_t mib = std::size_t{1} << 20;
  void* p = grow_by_steps(a, 64 * mib);
  ASSERT_NE(p, nullptr);
  const auto before = os::current_resident_bytes();
  void* q = a.reallocate_unsized(p, 4 * mib);
  EXPECT_EQ(q, p);  // huge blocks shrink in place
  const auto after = os::current_resident_bytes();
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_GE(before.value(), after.value() + 48 * mib);
  EXPECT_TRUE(check(q, 4 * mib, 11));
  // And it grows again from there.
  void* r = a.reallocate_unsized(q, 16 * mib);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(check(r, 4 * mib, 11));
  std::memset(static_cast<char*>(r) + 4 * mib, 0, 12 * mib);
  a.free(r);
}

TEST_F(general_allocator_test, growth_under_a_small_rlimit_data_fails_cleanly_in_a_child) {
#if defined(_WIN32)
  if (running_on_wine()) {
    GTEST_SKIP() << "Wine does not enforce a job object's JOB_OBJECT_LIMIT_PROCESS_MEMORY (the limit on Windows)";
  }
#endif
  EXPECT_EXIT(
      {
        general_allocator a;
        const std::size_t mib = std::size_t{1} << 20;
        void* p = grow_by_steps(a, 2 * mib);
        if (p == nullptr) _exit(3);
        if (!memkit::testing::limit_data_growth(96 * mib)) _exit(4);
        std::size_t size = 2 * mib;
        for (;;) {
          const std::size_t next = size + size / 2;
          errno = 0;
          void* q = a.reallocate_unsized(p, next);
          if (q == nullptr) break;
          auto* c = static_cast<unsigned char*>(q);
          for (std::size_t i = size; i < next; ++i) c[i] = static_cast<unsigned char>(11 + i * 7);
          p = q;
          size = next;
          if (size > 1024 * mib) _exit(5);  // the limit did not apply
        }
        // Stopped by the limit with ENOMEM; the block is intact and still usable.
        const bool clean = errno == ENOMEM && size >= 16 * mib && check(p, size, 11) &&
                           a.usable_size(p) >= size;
        a.free(p);
        _exit(clean ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(general_allocator_test, statistics_count_live_peak_and_classes) {
  general_allocator a;
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) blocks.push_back(a.allocate(48));
  void* big = a.allocate(std::size_t{5} << 20);
  auto s = a.statistics();
  EXPECT_EQ(s.allocations, 1001u);
  EXPECT_EQ(s.frees, 0u);
  EXPECT_EQ(s.size_classes[3].block_size, 48u);
  EXPECT_EQ(s.size_classes[3].live_blocks, 1000u);
  EXPECT_GE(s.size_classes[3].pages, 1u);
  EXPECT_EQ(s.huge_allocations, 1u);
  EXPECT_GE(s.live_bytes, 48000u + (std::size_t{5} << 20));
  EXPECT_GE(s.peak_live_bytes, s.live_bytes);
  EXPECT_GE(s.mapped_bytes, s.live_bytes);
  EXPECT_GE(s.resident_bytes, 48000u);
  EXPECT_EQ(s.heaps, 1u);
  const std::size_t peak = s.peak_live_bytes;
  for (void* p : blocks) a.free(p);
  a.free(big);
  s = a.statistics();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.frees, 1001u);
  EXPECT_EQ(s.peak_live_bytes, peak);
}

TEST_F(general_allocator_test, statistics_count_frees_into_the_heaps_of_exited_threads) {
  general_allocator a;
  std::vector<void*> blocks;
  std::thread([&] {
    for (int i = 0; i < 1000; ++i) blocks.push_back(a.allocate(64));
  }).join();
  for (void* p : blocks) a.free(p);  // into the exited thread's heap, which has no owner now
  auto s = a.statistics();
  EXPECT_EQ(s.allocations, 1000u);
  EXPECT_EQ(s.frees, 1000u);
  EXPECT_EQ(s.live_bytes, 0u);
  // Allocated by one thread, freed by another, both gone.
  blocks.clear();
  std::thread([&] {
    for (int i = 0; i < 1000; ++i) blocks.push_back(a.allocate(64));
  }).join();
  std::thread([&] {
    for (void* p : blocks) a.free(p);
  }).join();
  s = a.statistics();
  EXPECT_EQ(s.frees, s.allocations);
  EXPECT_EQ(s.live_bytes, 0u);
}

// statistics() is thread-safe: read while other threads allocate and free (ThreadSanitizer runs
// this test), and exact once they are done.
TEST_F(general_allocator_test, statistics_may_be_read_while_other_threads_allocate) {
  general_allocator a;
  std::atomic<int> running{2};
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t) {
    workers.emplace_back([&, t] {
      std::vector<void*> kept;
      for (int i = 0; i < 20000; ++i) {
        void* p = a.allocate(16 + static_cast<std::size_t>((i * 7919 + t) % 60000));
        if (i % 3 == 0) kept.push_back(p);
        else a.free(p);
        if (kept.size() > 200) {
          for (void* k : kept) a.free(k);
          kept.clear();
        }
      }
      for (void* k : kept) a.free(k);
      running.fetch_sub(1);
    });
  }
  std::uint64_t reads = 0;
  while (running.load() != 0) {
    const auto s = a.statistics();
    EXPECT_LE(s.frees, s.allocations);
    ++reads;
  }
  for (auto& w : workers) w.join();
  const auto s = a.statistics();
  EXPECT_GT(reads, 0u);
  EXPECT_EQ(s.frees, s.allocations);
  EXPECT_EQ(s.live_bytes, 0u);
}

TEST_F(general_allocator_test, print_statistics_writes_text) {
  general_allocator a;
  void* p = a.allocate(100);
  int fds[2];
#if defined(_WIN32)
  // The C runtime's pipe: an anonymous pipe behind two descriptors, its buffer as large as a
  // Linux pipe's (64 KiB), which holds the whole text.
  ASSERT_EQ(_pipe(fds, 65536, _O_BINARY), 0);
#else
  ASSERT_EQ(pipe(fds), 0);
#endif
  a.print_statistics(fds[1]);
  close(fds[1]);
  char text[8192] = {};
  std::size_t length = 0;
  for (ssize_t n; (n = read(fds[0], text + length, sizeof text - 1 - length)) > 0;) length += static_cast<std::size_t>(n);
  close(fds[0]);
  EXPECT_NE(std::strstr(text, "memkit general_allocator statistics"), nullptr) << text;
  EXPECT_NE(std::strstr(text, "112"), nullptr) << text;  // the class of a 100-byte block
  a.free(p);
}

TEST_F(general_allocator_test, purge_returns_resident_memory) {
  general_allocator::options o;
  o.purge_delay_ms = 60000;  // nothing is purged by time during the test
  general_allocator a(o);
  std::vector<void*> blocks;
  for (int i = 0; i < 20000; ++i) {
    void* p = a.allocate(1000);
    std::memset(p, 1, 1000);
    blocks.push_back(p);
  }
  const auto rss_before = os::current_resident_bytes();
  auto before = a.statistics();
  EXPECT_GE(before.resident_bytes, 20000u * 1000);
  for (void* p : blocks) a.free(p);
  a.purge();
  auto after = a.statistics();
  EXPECT_LT(after.resident_bytes + (15u << 20), before.resident_bytes);
  EXPECT_EQ(after.retained_bytes, 0u);
  const auto rss_after = os::current_resident_bytes();
  if (rss_before.ok() && rss_after.ok()) {
    EXPECT_LT(rss_after.value() + (12u << 20), rss_before.value());
  }
}

// Writes `count` blocks of 1,000 bytes, then frees them all.
void fill_and_empty(general_allocator& a, int count) {
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    void* p = a.allocate(1000);
    std::memset(p, 1, 1000);
    blocks.push_back(p);
  }
  for (void* p : blocks) a.free(p);
}

TEST_F(general_allocator_test, empty_pages_are_purged_after_the_delay_or_over_the_limit) {
  general_allocator::options o;
  o.purge_delay_ms = 0;
  general_allocator a(o);
  fill_and_empty(a, 20000);
  void* p = a.allocate(2000);  // a slow path: due pages are purged
  EXPECT_LT(a.statistics().retained_bytes, 1u << 20);
  a.free(p);

  general_allocator::options limited;
  limited.purge_delay_ms = 60000;
  limited.retained_limit = 1u << 20;
  general_allocator b(limited);
  fill_and_empty(b, 20000);
  void* q = b.allocate(2000);
  EXPECT_LE(b.statistics().retained_bytes, (1u << 20) + (64u << 10));
  b.free(q);
}

constexpr int three_segments = 12000;  // blocks of 1,000 bytes (1 KiB class) in three 4 MiB segments

// A heap whose blocks another thread frees in bursts empties whole segments and needs them again a
// few milliseconds later: once the program takes discarded segments back, empty segments wait
// longer (up to ten purge delays, as a free page does) before their pages go back to the OS. With
// a fixed wait of one, such a program faulted its segments in again and again; with a fixed ten, a
// program that empties its segments once held their pages ten times as long.
TEST_F(general_allocator_test, empty_segments_wait_longer_once_the_program_takes_discarded_ones_back) {
  general_allocator::options o;
  o.purge_delay_ms = 100;
  general_allocator a(o);
  fill_and_empty(a, three_segments);
  const std::size_t retained = a.statistics().retained_bytes;
  EXPECT_GE(retained, std::size_t{11} << 20);
  // A program that empties its segments once gets their pages back to the OS after one delay: a
  // slow path (a class with no page yet) purges what is due.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  void* p = a.allocate(2000);
  EXPECT_LT(a.statistics().retained_bytes, std::size_t{5} << 20);
  // It takes the discarded segments back at once (faulting their pages in again): from now on
  // they wait several delays, here two and a half of them.
  fill_and_empty(a, three_segments);
  EXPECT_GE(a.statistics().retained_bytes, std::size_t{11} << 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  void* q = a.allocate(3000);
  EXPECT_GE(a.statistics().retained_bytes, std::size_t{11} << 20);
  // Never more than ten delays.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  void* r = a.allocate(4000);
  EXPECT_LT(a.statistics().retained_bytes, std::size_t{1} << 20);
  a.free(p);
  a.free(q);
  a.free(r);
}

// And shorter again: each purge that discards empty segments after a wait in vain (the program
// did not take them back) shortens the wait by one delay, down to one. A program that refilled
// its segments in bursts for a while and then stopped gets their pages back to the OS after one
// delay again, not ten.
TEST_F(general_allocator_test, empty_segments_wait_less_again_once_the_program_stops_taking_them_back) {
  general_allocator::options o;
  o.purge_delay_ms = 20;
  general_allocator a(o);
  const auto wait_tenths_of_a_delay = [](int tenths) { std::this_thread::sleep_for(std::chrono::milliseconds(2 * tenths)); };
  // A slow path (the first block of a class) purges what is due. These are medium classes, whose
  // pages come from a segment of their own that a block of another medium class keeps in use: a
  // probe never takes a segment from the cache (which would count as taking one back).
  void* anchor = a.allocate(60000);
  const std::size_t probes[] = {9000, 11000, 13000, 15000, 18000, 22000, 26000, 30000, 36000, 44000, 52000};
  std::size_t next_probe = 0;
  const auto purge_what_is_due = [&] { a.free(a.allocate(probes[next_probe++])); };
  // Discarded after one delay, then taken back at once: the wait grows.
  fill_and_empty(a, three_segments);
  wait_tenths_of_a_delay(30);
  purge_what_is_due();
  ASSERT_LT(a.statistics().retained_bytes, std::size_t{5} << 20);
  fill_and_empty(a, three_segments);
  wait_tenths_of_a_delay(15);
  purge_what_is_due();
  ASSERT_GE(a.statistics().retained_bytes, std::size_t{11} << 20) << "the wait grew past one and a half delays";
  // Eight times: discarded once due (past ten delays, whatever the wait), and never taken back
  // (released, so the next fill maps new segments).
  for (int cycle = 0; cycle < 8; ++cycle) {
    wait_tenths_of_a_delay(105);
    purge_what_is_due();
    EXPECT_LT(a.statistics().retained_bytes, std::size_t{5} << 20) << cycle;
    a.purge();
    fill_and_empty(a, three_segments);
  }
  wait_tenths_of_a_delay(25);
  purge_what_is_due();
  EXPECT_LT(a.statistics().retained_bytes, std::size_t{5} << 20) << "one delay again";
  a.free(anchor);
}

TEST_F(general_allocator_test, owns_recognises_its_blocks_only) {
  general_allocator a;
  general_allocator b;
  void* p = a.allocate(64);
  void* big = a.allocate(1u << 21);
  int on_stack = 0;
  EXPECT_TRUE(a.owns(p));
  EXPECT_TRUE(a.owns(static_cast<char*>(p) + 10));
  EXPECT_TRUE(a.owns(big));
  EXPECT_FALSE(b.owns(p));
  EXPECT_FALSE(a.owns(&on_stack));
  EXPECT_FALSE(a.owns(nullptr));
  a.free(big);
  EXPECT_FALSE(a.owns(big));
  a.free(p);
}

TEST_F(general_allocator_test, a_destroyed_allocator_returns_everything_and_forgets_its_addresses) {
  std::vector<void*> stale;
  {
    general_allocator::options o;
    o.purge_delay_ms = 60000;  // empty segments stay cached (dirty) until the destructor
    general_allocator a(o);
    std::vector<void*> blocks;
    for (int i = 0; i < 12000; ++i) blocks.push_back(a.allocate(1000));  // three segments
    void* large = a.allocate(std::size_t{3} << 20);
    a.free(large);  // cached huge block
    for (void* p : blocks) a.free(p);
    stale = {blocks.front(), blocks.back(), large};
  }
  general_allocator b;
  for (void* p : stale) EXPECT_FALSE(b.owns(p));  // must not read unmapped headers
  EXPECT_FALSE(general_allocator::global().owns(stale[0]));
}

TEST_F(general_allocator_test, good_size_matches_usable_size) {
  general_allocator a;
  for (std::size_t size : {1u, 17u, 100u, 1000u, 70000u, 600000u, 5000000u}) {
    void* p = a.allocate(size);
    EXPECT_EQ(a.good_size(size), a.usable_size(p)) << size;
    a.free(p);
  }
}

TEST_F(general_allocator_test, blocks_freed_by_other_threads_are_reused) {
  general_allocator a;
  std::vector<void*> blocks;
  for (int i = 0; i < 10000; ++i) blocks.push_back(a.allocate(64));
  std::thread([&] {
    for (void* p : blocks) a.free(p);
  }).join();
  // The owner collects them when it refills: no new pages are needed for the same amount.
  const auto pages_before = a.statistics().size_classes[4].pages;
  for (int i = 0; i < 10000; ++i) blocks[static_cast<std::size_t>(i)] = a.allocate(64);
  EXPECT_EQ(a.statistics().size_classes[4].pages, pages_before);
  for (void* p : blocks) a.free(p);
  EXPECT_EQ(a.statistics().live_bytes, 0u);
}

TEST_F(general_allocator_test, a_heap_of_an_exited_thread_is_adopted) {
  general_allocator a;
  void* survivor = nullptr;
  std::thread([&] {
    survivor = a.allocate(200);
    std::memset(survivor, 3, 200);
  }).join();
  std::thread([&] {
    void* p = a.allocate(200);  // adopts the exited thread's heap
    EXPECT_NE(p, nullptr);
    a.free(p);
  }).join();
  EXPECT_EQ(a.statistics().heaps, 1u);
  a.free(survivor);  // freed from a third thread
}

// The global instance's fast path finds a size's page through a per-size table: every size up to
// the table's end and past it gets a block of the class good_size() names, at the alignment asked.
TEST_F(general_allocator_test, global_instance_gives_every_small_size_its_class) {
  general_allocator& g = general_allocator::global();
  std::vector<void*> blocks;
  for (std::size_t size = 1; size <= 1100; ++size) {
    for (std::size_t alignment : {std::size_t{1}, std::size_t{8}, std::size_t{16}}) {
      void* p = g.allocate(size, alignment);
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(aligned(p, size <= 8 && alignment <= 8 ? 8 : 16)) << size;
      const std::size_t expected = size <= 8 && alignment <= 8 ? 8 : g.good_size(size < 16 ? 16 : size);
      EXPECT_EQ(g.usable_size(p), expected) << size << " at " << alignment;
      std::memset(p, 0x5a, size);
      blocks.push_back(p);
    }
  }
  for (void* p : blocks) g.free(p);
}

// Blocks of full pages freed by another thread come back to the owner (the page's thread-free
// list, collected when the owner runs dry): the same number of allocations needs no new page.
// The global instance, so that its fast paths are the ones tested.
TEST_F(general_allocator_test, remote_frees_into_full_pages_are_reused_by_the_owner) {
  general_allocator& g = general_allocator::global();
  std::thread([&] {
    constexpr int count = 5000;  // several 64 KiB pages of 64-byte blocks
    std::vector<void*> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(g.allocate(64));
    for (int round = 0; round < 3; ++round) {
      std::thread([&] {
        for (void* p : blocks) g.free(p);
      }).join();
      const auto pages = g.statistics().size_classes[4].pages;
      for (int i = 0; i < count; ++i) {
        blocks[static_cast<std::size_t>(i)] = g.allocate(64);
        ASSERT_NE(blocks[static_cast<std::size_t>(i)], nullptr);
        std::memset(blocks[static_cast<std::size_t>(i)], round, 64);
      }
      EXPECT_EQ(g.statistics().size_classes[4].pages, pages) << "round " << round;
    }
    for (void* p : blocks) g.free(p);
  }).join();
}

// The owner exits while blocks freed by another thread still sit in its pages' thread-free lists;
// the next thread adopts the heap and gets them back without new pages, and nothing stays live.
TEST_F(general_allocator_test, a_thread_exiting_with_pending_remote_frees_leaves_them_reusable) {
  general_allocator a;
  constexpr int count = 5000;
  std::vector<void*> blocks;
  std::atomic<bool> allocated{false}, freed{false};
  std::thread owner([&] {
    for (int i = 0; i < count; ++i) blocks.push_back(a.allocate(64));
    allocated.store(true);
    while (!freed.load()) std::this_thread::yield();  // alive, but not allocating
  });
  while (!allocated.load()) std::this_thread::yield();
  const auto pages = a.statistics().size_classes[4].pages;  // all blocks live
  std::thread([&] {
    for (void* p : blocks) a.free(p);
  }).join();
  freed.store(true);
  owner.join();  // its exit collects what it can and releases empty pages
  std::thread([&] {
    for (int i = 0; i < count; ++i) blocks[static_cast<std::size_t>(i)] = a.allocate(64);
    EXPECT_EQ(a.statistics().heaps, 1u);  // adopted
    EXPECT_LE(a.statistics().size_classes[4].pages, pages);  // no block was lost in a page
    for (void* p : blocks) a.free(p);
  }).join();
  const auto s = a.statistics();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.size_classes[4].allocations, 2u * count);
  EXPECT_EQ(s.size_classes[4].frees, 2u * count);
}

// Blocks of an exited thread's heap freed while the heap has no owner: they wait in the pages
// (full pages are put on the heap's notified stack), and the thread that adopts the heap finds
// them; their contents until the free were intact.
TEST_F(general_allocator_test, an_abandoned_heap_takes_remote_frees_and_its_adopter_reuses_them) {
  general_allocator a;
  constexpr int count = 5000;
  std::vector<void*> blocks;
  std::thread([&] {
    for (int i = 0; i < count; ++i) {
      void* p = a.allocate(64);
      fill(p, 64, static_cast<unsigned char>(i));
      blocks.push_back(p);
    }
  }).join();  // abandoned with every block live
  const auto pages = a.statistics().size_classes[4].pages;
  for (int i = 0; i < count; ++i) {
    EXPECT_TRUE(check(blocks[static_cast<std::size_t>(i)], 64, static_cast<unsigned char>(i)));
    a.free(blocks[static_cast<std::size_t>(i)]);  // a remote free: this thread owns no heap of `a`
  }
  std::thread([&] {
    std::vector<void*> again;
    for (int i = 0; i < count; ++i) again.push_back(a.allocate(64));
    EXPECT_EQ(a.statistics().size_classes[4].pages, pages);
    for (void* p : again) a.free(p);
  }).join();
  EXPECT_EQ(a.statistics().live_bytes, 0u);
}

TEST_F(general_allocator_test, global_instance_works_from_static_constructors) {
  ASSERT_NE(early_user.block, nullptr);
  EXPECT_TRUE(general_allocator::global().owns(early_user.block));
  EXPECT_EQ(static_cast<unsigned char*>(early_user.block)[47], 0x42);
}

TEST_F(general_allocator_test, global_instance_is_usable_and_unique) {
  general_allocator& g = general_allocator::global();
  EXPECT_EQ(&g, &general_allocator::global());
  void* p = g.allocate(33);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(g.owns(p));
  g.free(p);
  g.free(nullptr);
  EXPECT_EQ(g.usable_size(nullptr), 0u);
}

#if !defined(_WIN32)  // fork: no such call on Windows (and at_fork handlers fail there)
TEST_F(general_allocator_test, a_forked_child_allocates_while_another_thread_was_busy) {
  general_allocator& g = general_allocator::global();
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) {
      void* p = g.allocate(64);
      void* q = g.allocate(std::size_t{1} << 20);  // takes the lock of the large-block cache
      g.free(p);
      g.free(q);
    }
  });
  for (int i = 0; i < 20; ++i) {
    g.prepare_fork();
    const pid_t pid = fork();
    if (pid == 0) {
      g.after_fork_child();
      for (std::size_t j = 0; j < 2000; ++j) {
        void* p = g.allocate(j * 10 + 1);
        if (p == nullptr) _exit(1);
        g.free(p);
      }
      void* big = g.allocate(std::size_t{8} << 20);
      if (big == nullptr) _exit(2);
      g.free(big);
      _exit(0);
    }
    g.after_fork_parent();
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  stop.store(true);
  busy.join();
}
#endif

TEST_F(general_allocator_test, options_are_applied_and_clamped) {
  general_allocator::options o;
  o.stack_frames = 1000;
  general_allocator a(o);
  EXPECT_EQ(a.current_options().stack_frames, general_allocator::max_stack_frames);
  o.purge_delay_ms = 0;
  a.configure(o);
  EXPECT_EQ(a.current_options().purge_delay_ms, 0u);
  EXPECT_EQ(a.current_options().stack_frames, general_allocator::max_stack_frames);
}

TEST_F(general_allocator_test, purge_from_another_thread_reaches_every_heap) {
  general_allocator::options o;
  o.purge_delay_ms = 60000;
  general_allocator a(o);
  std::vector<void*> blocks;
  for (int i = 0; i < 4000; ++i) blocks.push_back(a.allocate(2000));
  for (std::size_t i = 0; i < blocks.size(); i += 2) a.free(blocks[i]);  // pages stay in use
  std::thread([&] { a.purge(); }).join();  // asks this thread's heap to purge at its next refill
  for (std::size_t i = 1; i < blocks.size(); i += 2) a.free(blocks[i]);
  void* p = a.allocate(100);  // a refill: the requested purge runs
  EXPECT_LT(a.statistics().retained_bytes, 1u << 20);
  a.free(p);
}

TEST_F(general_allocator_test, free_pages_of_exited_threads_heaps_go_back_to_the_os) {
  general_allocator::options o;
  o.purge_delay_ms = 60000;  // nothing is due by itself during the test
  general_allocator a(o);
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 4000; ++i) blocks.push_back(a.allocate(2000));
    for (void* p : blocks) a.free(p);  // empty pages wait on the heap's purge list
  }).join();                           // the heap is abandoned with them
  EXPECT_GT(a.statistics().retained_bytes, std::size_t{1} << 20);
  a.purge();  // from another thread, while no thread has adopted the heap
  EXPECT_LT(a.statistics().retained_bytes, std::size_t{64} << 10);
}

TEST_F(general_allocator_test, works_with_std_containers) {
  general_allocator a;
  {
    std::vector<int, memkit::std_allocator<int>> v{memkit::std_allocator<int>(a)};
    for (int i = 0; i < 100000; ++i) v.push_back(i);
    EXPECT_EQ(v[99999], 99999);
    // The elements live in this allocator's memory, not the default heap's.
    EXPECT_TRUE(a.owns(v.data()));
    EXPECT_TRUE(a.owns(&v.back()));
    EXPECT_FALSE(memkit::general_allocator::global().owns(v.data()));
    const auto s = a.statistics();
    EXPECT_GE(s.live_bytes, v.capacity() * sizeof(int));
    EXPECT_GE(s.allocations, 2u);  // the vector grew at least once
  }
  // Every growth step gave its old buffer back, and the destructor the last one.
  const auto s = a.statistics();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.allocations, s.frees);
}

}  // namespace

namespace {

// Contract violations take the same misuse channel as the allocators' reports: one line on the
// error stream in the documented format, then abort.
TEST(misuse_channel, a_violated_contract_is_reported_with_its_condition_and_place_then_aborts) {
  const int limit = 3;
#if defined(GTEST_USES_SIMPLE_RE) && GTEST_USES_SIMPLE_RE
  // GoogleTest's own simple regular expressions (where there are no POSIX ones, as on Windows)
  // know \d but no brackets.
  EXPECT_DEATH(MEMKIT_CHECK(limit > 5, "the limit must exceed five"),
               "^memkit: contract violated: the limit must exceed five \\(limit > 5\\) at .*"
               "general_allocator_test\\.cpp:\\d+\n");
#else
  EXPECT_DEATH(MEMKIT_CHECK(limit > 5, "the limit must exceed five"),
               "^memkit: contract violated: the limit must exceed five \\(limit > 5\\) at .*"
               "general_allocator_test\\.cpp:[0-9]+\n");
#endif
}

}  // namespace

// Windows moves no pages (os::move_pages fails with ERROR_NOT_SUPPORTED, and the allocator stops
// trying), so a huge block never takes an empty segment's pages there: the race below cannot occur.
#if !defined(_WIN32)
// The seam in src/general_allocator/internal.hpp: called just before a huge block short of
// resident pages takes the lock to take an empty segment's page area.
namespace memkit::gpa::testing {
extern void (*before_taking_dirty_segment)() noexcept;
}  // namespace memkit::gpa::testing
#endif

namespace {

#if !defined(_WIN32)  // no page moves on Windows (above)
general_allocator* raced_allocator = nullptr;
void* raced_blocks[2] = {nullptr, nullptr};

// What another thread can do between a huge block's look at the count of empty segments and its
// taking one: take the last of them (two blocks of a size class: the first fills the heap's own
// empty segment, the second takes the one waiting for its purge).
void take_the_empty_segments() noexcept {
  memkit::gpa::testing::before_taking_dirty_segment = nullptr;
  for (void*& p : raced_blocks) {
    p = raced_allocator->allocate(std::size_t{3} << 20);
    if (p != nullptr) std::memset(p, 0x5A, std::size_t{3} << 20);
  }
}

TEST_F(general_allocator_test, a_large_block_that_finds_the_empty_segments_gone_counts_no_pages_from_them) {
  const std::size_t kib = 1024;
  general_allocator a(long_cache());
  make_an_empty_segment(a, 3072 * kib);
  raced_allocator = &a;
  memkit::gpa::testing::before_taking_dirty_segment = take_the_empty_segments;
  // More than a segment's page area: the block would take the empty segment's whole.
  auto* z = static_cast<unsigned char*>(a.allocate_zeroed(4400 * kib));
  memkit::gpa::testing::before_taking_dirty_segment = nullptr;
  ASSERT_NE(z, nullptr);
  ASSERT_NE(raced_blocks[0], nullptr);
  ASSERT_NE(raced_blocks[1], nullptr);
  for (std::size_t i = 0; i < 4400 * kib; i += 64) ASSERT_EQ(z[i], 0) << i;
  fill(z, 4400 * kib, 3);
  // Nothing moved into the block, so its pages are its own, faulted in now: resident_bytes (an
  // upper bound) counts them as well as the two blocks that took the segments.
  const auto written = a.statistics();
  EXPECT_GE(written.resident_bytes, (4400 + 2 * 3072) * kib);
  EXPECT_LE(written.resident_bytes, written.mapped_bytes);
  // The block grows in place over pages it holds read-write, and every byte of it can be written.
  auto* grown = static_cast<unsigned char*>(a.reallocate_unsized(z, 4600 * kib));
  ASSERT_NE(grown, nullptr);
  EXPECT_TRUE(check(grown, 4400 * kib, 3));
  fill(grown, 4600 * kib, 4);
  EXPECT_TRUE(check(grown, 4600 * kib, 4));
  a.free(grown);
  for (void*& p : raced_blocks) {
    a.free(p);
    p = nullptr;
  }
  a.purge();
  const auto end = a.statistics();
  EXPECT_EQ(end.huge_live_bytes, 0u);
  EXPECT_LE(end.resident_bytes, end.mapped_bytes);
  EXPECT_EQ(end.retained_bytes, 0u);
}
#endif

std::uintptr_t segment_of(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) & ~((std::uintptr_t{4} << 20) - 1);
}

TEST_F(general_allocator_test, an_empty_segment_too_big_for_a_blocks_room_waits_for_a_span_segment) {
  const std::size_t kib = 1024;
  general_allocator a(long_cache());
  // A cached huge block with 32 MiB of address space, 29 MiB of it resident, and an empty segment
  // whose 3 MiB wait for the purge, resident.
  auto* big = static_cast<char*>(a.allocate(29696 * kib));
  ASSERT_NE(big, nullptr);
  std::memset(big, 0xFF, 29696 * kib);
  void* kept = nullptr;
  void* cached = nullptr;
  make_an_empty_segment(a, 3072 * kib, kept, cached);
  a.free(big);
  const auto before = a.statistics();
  ASSERT_GE(before.retained_bytes, 35840 * kib);
  // The block reuses the cached one; the empty segment's page area does not fit in what is left of
  // its reservation, so it stays whole (a part moved would unmap the rest) and the block's last
  // pages are new.
  auto* z = static_cast<unsigned char*>(a.allocate_zeroed(32000 * kib));
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(segment_of(z), segment_of(big));
  for (std::size_t i = 0; i < 32000 * kib; i += 64) ASSERT_EQ(z[i], 0) << i;
  fill(z, 32000 * kib, 11);
  const auto after = a.statistics();
  EXPECT_GE(after.retained_bytes, 6144 * kib);  // both segments, still resident
  // Two blocks of a size class take the two segments: their pages are there.
  auto* p = static_cast<unsigned char*>(a.allocate(3072 * kib));
  auto* q = static_cast<unsigned char*>(a.allocate(3072 * kib));
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(segment_of(p), segment_of(kept));
  EXPECT_EQ(segment_of(q), segment_of(cached));
  EXPECT_LE(a.statistics().resident_bytes, after.resident_bytes + 64 * kib);
  fill(p, 3072 * kib, 12);
  fill(q, 3072 * kib, 13);
  EXPECT_TRUE(check(z, 32000 * kib, 11));
  EXPECT_TRUE(check(p, 3072 * kib, 12));
  EXPECT_TRUE(check(q, 3072 * kib, 13));
  a.free(p);
  a.free(q);
  a.free(z);
  expect_everything_returned(a);
}

TEST_F(general_allocator_test, a_failed_move_of_an_empty_segments_pages_leaves_the_donors_cached) {
  const std::size_t kib = 1024;
  for (bool failing : {false, true}) {
    general_allocator a(long_cache());
    // A cached block too small to be reused whole (it gives its pages: the new block needs more
    // than the 32 MiB it reserves) and an empty segment, both written.
    auto* donor = static_cast<char*>(a.allocate(3700 * kib));
    ASSERT_NE(donor, nullptr);
    std::memset(donor, 0xFF, 3700 * kib);
    void* kept = nullptr;
    void* cached = nullptr;
    make_an_empty_segment(a, 3072 * kib, kept, cached);
    a.free(donor);
    // The empty segment's page area moves first; when that fails (the donor's move would not),
    // the block is built afresh and the donor gave nothing.
    if (failing) os::testing::inject_failure(os::testing::operation::map, 1);
    auto* z = static_cast<unsigned char*>(a.allocate_zeroed(33792 * kib));
    os::testing::clear_injected_failures();
    ASSERT_NE(z, nullptr) << failing;
    for (std::size_t i = 0; i < 33792 * kib; i += 64) ASSERT_EQ(z[i], 0) << failing << " " << i;
    fill(z, 33792 * kib, 13);
    if (failing) {
      // The donor is still cached and whole (its pages and the free slices of the heap's segment
      // wait for their purge): a block of its size reuses it in place.
      EXPECT_GE(a.statistics().retained_bytes, (3072 + 3700) * kib);
      auto* again = static_cast<char*>(a.allocate(3700 * kib));
      EXPECT_EQ(again, donor);
      fill(again, 3700 * kib, 14);
      EXPECT_TRUE(check(again, 3700 * kib, 14));
      a.free(again);
    }
    EXPECT_TRUE(check(z, 33792 * kib, 13));
    a.free(z);
    expect_everything_returned(a);
  }
}

TEST_F(general_allocator_test, a_segment_of_spans_takes_a_cached_blocks_pages_before_a_clean_segment) {
  const std::size_t kib = 1024;
  general_allocator a(long_cache());
  // An empty segment whose pages went back to the OS (clean: all its pages would fault in afresh):
  // a retained limit of nothing sends them back when a huge block's free looks at the caches.
  void* trigger = a.allocate(4096 * kib);
  ASSERT_NE(trigger, nullptr);
  void* kept = nullptr;
  void* cached = nullptr;
  make_an_empty_segment(a, 3072 * kib, kept, cached);
  general_allocator::options none = long_cache();
  none.retained_limit = 0;
  a.configure(none);
  a.free(trigger);
  a.configure(long_cache());
  // The heap's own segment gets a block that leaves no room for another one of 2 MiB.
  void* filler = a.allocate(3584 * kib);
  ASSERT_NE(filler, nullptr);
  EXPECT_EQ(segment_of(filler), segment_of(kept));
  // A freed huge block, resident and cached.
  auto* big = static_cast<char*>(a.allocate(7168 * kib));
  ASSERT_NE(big, nullptr);
  std::memset(big, 0xFF, 7168 * kib);
  a.free(big);
  const auto before = a.statistics();
  // A block of a size class needs a segment: the cached block's first 4 MiB, resident, rather
  // than the clean segment.
  auto* p = static_cast<unsigned char*>(a.allocate(2048 * kib));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(segment_of(p), segment_of(big));
  EXPECT_LE(a.statistics().resident_bytes, before.resident_bytes + 64 * kib);
  fill(p, 2048 * kib, 15);
  // The next segment is the rest of the cached block, resident too, and the one after that the
  // clean segment.
  auto* q = static_cast<unsigned char*>(a.allocate(3072 * kib));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(segment_of(q), segment_of(big) + (std::uintptr_t{4} << 20));
  EXPECT_LE(a.statistics().resident_bytes, before.resident_bytes + 128 * kib);
  fill(q, 3072 * kib, 16);
  auto* r = static_cast<unsigned char*>(a.allocate(3072 * kib));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(segment_of(r), segment_of(cached));
  fill(r, 3072 * kib, 17);
  EXPECT_TRUE(check(p, 2048 * kib, 15));
  EXPECT_TRUE(check(q, 3072 * kib, 16));
  EXPECT_TRUE(check(r, 3072 * kib, 17));
  a.free(p);
  a.free(q);
  a.free(r);
  a.free(filler);
  EXPECT_EQ(a.statistics().live_bytes, 0u);
  a.purge();
  EXPECT_EQ(a.statistics().retained_bytes, 0u);
}

// An empty segment's page area moves into a huge block whole, and only into one that lacks at
// least that much: every page moved is then one the block writes instead of faulting it in. A
// block that lacks less leaves the segment resident for a segment of spans to reuse in place.
TEST_F(general_allocator_test, a_large_block_takes_an_empty_segments_pages_only_when_it_lacks_all_of_them) {
  const std::size_t kib = 1024;
  for (bool failing : {false, true}) {
    general_allocator a(long_cache());
    make_an_empty_segment(a, 3072 * kib);
    const auto start = a.statistics();
    auto* small = static_cast<unsigned char*>(a.allocate_zeroed(3700 * kib));
    ASSERT_NE(small, nullptr) << failing;
    for (std::size_t i = 0; i < 3700 * kib; i += 64) ASSERT_EQ(small[i], 0) << failing << " " << i;
    fill(small, 3700 * kib, 3);
    EXPECT_EQ(a.statistics().retained_bytes, start.retained_bytes) << failing;  // still waiting
    if (failing) os::testing::fail_after(os::testing::operation::map, 0);  // the move fails
    auto* big = static_cast<unsigned char*>(a.allocate_zeroed(4400 * kib));
    os::testing::clear_injected_failures();
    ASSERT_NE(big, nullptr) << failing;
    // The area held 0xFF: a zeroed block that takes it is cleared.
    for (std::size_t i = 0; i < 4400 * kib; i += 64) ASSERT_EQ(big[i], 0) << failing << " " << i;
    fill(big, 4400 * kib, 4);
#if defined(__linux__)
    EXPECT_LT(a.statistics().retained_bytes, start.retained_bytes) << failing;  // taken (or dropped)
#endif
    EXPECT_TRUE(check(small, 3700 * kib, 3));
    EXPECT_TRUE(check(big, 4400 * kib, 4));
    a.free(small);
    a.free(big);
    const auto end = a.statistics();
    EXPECT_EQ(end.huge_live_bytes, 0u);
    EXPECT_LE(end.resident_bytes, end.mapped_bytes);
    a.purge();
    EXPECT_EQ(a.statistics().retained_bytes, 0u);
  }
}

}  // namespace

namespace {

// A growing block short of resident pages takes them from a cached block; when that move fails,
// the block keeps its bytes, every byte it grows to can be written, and the donor keeps its own.
// Then the block grows again (in place or moved) and is freed and reused.
TEST_F(general_allocator_test, a_growing_block_whose_page_move_fails_keeps_its_bytes_and_can_grow_on) {
  const std::size_t mib = std::size_t{1} << 20;
  for (unsigned failures : {1u, 2u, 100u}) {
    general_allocator a(long_cache());
    auto* p = static_cast<unsigned char*>(a.allocate(5 * mib));
    auto* donor = static_cast<unsigned char*>(a.allocate(8 * mib));
    ASSERT_NE(p, nullptr);
    ASSERT_NE(donor, nullptr);
    fill(p, 5 * mib, 1);
    fill(donor, 8 * mib, 2);
    a.free(donor);  // cached, resident
    os::testing::fail_after(os::testing::operation::map, 0);
    if (failures != 100u) {
      os::testing::clear_injected_failures();
      os::testing::inject_failure(os::testing::operation::map, failures);
    }
    auto* q = static_cast<unsigned char*>(a.reallocate_unsized(p, 7 * mib + 512 * 1024));
    os::testing::clear_injected_failures();
    ASSERT_NE(q, nullptr) << failures;
    EXPECT_TRUE(check(q, 5 * mib, 1)) << failures;
    fill(q, 7 * mib + 512 * 1024, 3);
    auto* r = static_cast<unsigned char*>(a.reallocate_unsized(q, 30 * mib));
    ASSERT_NE(r, nullptr) << failures;
    EXPECT_TRUE(check(r, 7 * mib + 512 * 1024, 3)) << failures;
    fill(r, 30 * mib, 4);
    EXPECT_TRUE(check(r, 30 * mib, 4)) << failures;
    auto* again = static_cast<unsigned char*>(a.allocate(8 * mib));
    ASSERT_NE(again, nullptr);
    fill(again, 8 * mib, 5);
    EXPECT_TRUE(check(again, 8 * mib, 5));
    EXPECT_TRUE(check(r, 30 * mib, 4)) << failures;
    a.free(again);
    a.free(r);
    const auto end = a.statistics();
    EXPECT_EQ(end.huge_live_bytes, 0u);
    EXPECT_LE(end.resident_bytes, end.mapped_bytes);
  }
}

}  // namespace

// The seams of huge_move in src/general_allocator/internal.hpp.
namespace memkit::gpa::testing {
extern void (*before_moving_last_piece)() noexcept;
extern void (*after_moving_pieces_back)(void* reservation, std::size_t vacated) noexcept;
}  // namespace memkit::gpa::testing

namespace {

#if defined(__linux__) && defined(MAP_FIXED_NOREPLACE)  // what the test below needs
void fail_the_last_piece() noexcept { os::testing::inject_failure(os::testing::operation::map, 1); }

// What another thread can be handed once a failed move put a block's pieces back: the address
// space they left in the new reservation. Mapped here (where the system allows asking for an exact
// free address) and written, so the test can tell whether the allocator unmapped it afterwards.
void* mapped_in_the_hole = nullptr;
std::size_t hole_bytes = 0;
void map_in_the_hole(void* reservation, std::size_t vacated) noexcept {
  hole_bytes = vacated;
  if (vacated == 0) return;
  void* p = ::mmap(reservation, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED) return;
  std::memset(p, 0x5A, 4096);
  mapped_in_the_hole = p;
}
#endif

// A block made of two mappings (pages moved in from a cached block) that must move to grow, and
// whose last piece fails to move after the first one moved: the pieces go back, and the address
// space they vacated in the new reservation is no longer the allocator's. Releasing the whole new
// reservation afterwards unmapped whatever another thread had been given there meanwhile (the
// overlapping huge blocks the release soak found). The block keeps its bytes and grows by a copy.
TEST_F(general_allocator_test, a_failed_move_leaves_the_address_space_its_pieces_vacated_to_others) {
#if !defined(__linux__) || !defined(MAP_FIXED_NOREPLACE)
  GTEST_SKIP() << "moves need mremap, the check an exact free address";
#else
  const std::size_t mib = std::size_t{1} << 20;
  general_allocator a(long_cache());
  auto* p = static_cast<unsigned char*>(a.allocate(5 * mib));
  auto* donor = static_cast<unsigned char*>(a.allocate(8 * mib));
  ASSERT_NE(p, nullptr);
  ASSERT_NE(donor, nullptr);
  fill(p, 5 * mib, 1);
  fill(donor, 8 * mib, 2);
  a.free(donor);  // cached, resident: its pages move into p as p grows
  auto* q = static_cast<unsigned char*>(a.reallocate_unsized(p, 7 * mib + 512 * 1024));
  ASSERT_NE(q, nullptr);
  fill(q, 7 * mib + 512 * 1024, 3);
  mapped_in_the_hole = nullptr;
  hole_bytes = 0;
  memkit::gpa::testing::before_moving_last_piece = fail_the_last_piece;
  memkit::gpa::testing::after_moving_pieces_back = map_in_the_hole;
  os::testing::inject_failure(os::testing::operation::map, 1);  // no growth in place: it moves
  auto* r = static_cast<unsigned char*>(a.reallocate_unsized(q, 40 * mib));  // beyond its 32 MiB
  memkit::gpa::testing::before_moving_last_piece = nullptr;
  memkit::gpa::testing::after_moving_pieces_back = nullptr;
  os::testing::clear_injected_failures();
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(check(r, 7 * mib + 512 * 1024, 3));
  ASSERT_GT(hole_bytes, 0u) << "the block had one mapping: no piece moved before the last";
  ASSERT_NE(mapped_in_the_hole, nullptr) << "the vacated address space was not free";
  // Still mapped, and still holding what was written there.
  EXPECT_EQ(::msync(mapped_in_the_hole, 4096, MS_ASYNC), 0) << "the allocator unmapped another's memory";
  if (::msync(mapped_in_the_hole, 4096, MS_ASYNC) == 0) {
    EXPECT_EQ(static_cast<unsigned char*>(mapped_in_the_hole)[4095], 0x5A);
  }
  ::munmap(mapped_in_the_hole, 4096);
  fill(r, 40 * mib, 4);
  EXPECT_TRUE(check(r, 40 * mib, 4));
  a.free(r);
  EXPECT_EQ(a.statistics().huge_live_bytes, 0u);
#endif
}

}  // namespace
