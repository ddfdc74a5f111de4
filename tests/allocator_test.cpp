#include "memkit/allocator.hpp"
#include "memkit/general_allocator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include "support/test_allocator.hpp"

namespace {

using memkit::testing::test_allocator;

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

TEST(allocator, malloc_allocator_honours_every_power_of_two_alignment) {
  memkit::allocator& a = memkit::malloc_allocator::instance();
  for (std::size_t alignment = 1; alignment <= 8192; alignment *= 2) {
    void* p = a.allocate(100, alignment);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned(p, alignment)) << alignment;
    std::memset(p, 0x5A, 100);
    a.deallocate(p, 100, alignment);
  }
}

TEST(allocator, invalid_alignment_and_impossible_sizes_fail_with_null) {
  memkit::allocator& a = memkit::malloc_allocator::instance();
  EXPECT_EQ(a.allocate(16, 3), nullptr);
  EXPECT_EQ(a.allocate(16, 0), nullptr);
  EXPECT_EQ(a.allocate(SIZE_MAX - 4096), nullptr);
  EXPECT_EQ(a.allocate_at_least(16, 12).pointer, nullptr);
  EXPECT_FALSE(a.resize(nullptr, 1, 2));
}

TEST(allocator, zero_size_yields_a_usable_unique_block) {
  memkit::allocator& a = memkit::malloc_allocator::instance();
  void* p = a.allocate(0);
  void* q = a.allocate(0);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_NE(p, q);
  a.deallocate(p, 0);
  a.deallocate(q, 0);
  a.deallocate(nullptr, 0);  // a no-op
}

TEST(allocator, allocate_at_least_reports_usable_size) {
  memkit::allocator& a = memkit::malloc_allocator::instance();
  auto block = a.allocate_at_least(20);
  ASSERT_NE(block.pointer, nullptr);
  EXPECT_GE(block.size, 20u);
  std::memset(block.pointer, 1, block.size);  // all of it is usable
  a.deallocate(block.pointer, block.size);
}

TEST(allocator, reallocate_keeps_used_bytes_and_leaves_the_block_on_failure) {
  test_allocator a;
  auto* p = static_cast<char*>(a.allocate(64));
  ASSERT_NE(p, nullptr);
  std::memcpy(p, "memkit", 7);
  a.allow_resize(false);
  a.fail_all(true);
  EXPECT_EQ(a.reallocate(p, 64, 7, 1 << 20), nullptr);
  EXPECT_STREQ(p, "memkit");  // still owned and intact
  a.fail_all(false);
  auto* q = static_cast<char*>(a.reallocate(p, 64, 7, 1 << 20));
  ASSERT_NE(q, nullptr);
  EXPECT_STREQ(q, "memkit");
  EXPECT_EQ(a.live_blocks(), 1u);
  a.deallocate(q, 1 << 20);
}

// malloc_allocator grows small blocks through malloc + copy + free and larger ones through
// realloc, and shrinks through realloc: every path keeps the used bytes and hands back a block of
// the new size.
TEST(allocator, malloc_allocator_reallocate_keeps_used_bytes_on_every_path) {
  memkit::allocator& a = memkit::malloc_allocator::instance();
  std::size_t size = 8;
  auto* p = static_cast<unsigned char*>(a.allocate(size));
  ASSERT_NE(p, nullptr);
  for (std::size_t i = 0; i < size; ++i) p[i] = static_cast<unsigned char>(i);
  for (std::size_t new_size : {24u, 100u, 1000u, 1024u, 1500u, 70000u, 600u, 16u}) {
    const std::size_t used = std::min(size, new_size);
    p = static_cast<unsigned char*>(a.reallocate(p, size, used, new_size));
    ASSERT_NE(p, nullptr) << new_size;
    for (std::size_t i = 0; i < used; ++i) ASSERT_EQ(p[i], static_cast<unsigned char>(i)) << new_size << " at " << i;
    for (std::size_t i = used; i < new_size; ++i) p[i] = static_cast<unsigned char>(i);  // all of it is usable
    size = new_size;
  }
  a.deallocate(p, size);
}

TEST(allocator, reallocate_of_null_allocates) {
  test_allocator a;
  void* p = a.reallocate(nullptr, 0, 0, 32);
  ASSERT_NE(p, nullptr);
  a.deallocate(p, 32);
}

// An allocator that implements only the two required hooks still gets a correct resize (refuses
// unless nothing changes) and reallocate (allocate + copy + deallocate).
class minimal_allocator final : public memkit::allocator {
 public:
  int allocations = 0;
  int deallocations = 0;

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override {
    ++allocations;
    return memkit::malloc_allocator::instance().allocate(size, alignment);
  }
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override {
    ++deallocations;
    memkit::malloc_allocator::instance().deallocate(p, size, alignment);
  }
};

TEST(allocator, defaults_for_optional_hooks_are_correct) {
  minimal_allocator a;
  auto* p = static_cast<int*>(a.allocate(4 * sizeof(int)));
  for (int i = 0; i < 4; ++i) p[i] = i;
  EXPECT_FALSE(a.resize(p, 16, 32));
  EXPECT_TRUE(a.resize(p, 16, 16));
  auto* q = static_cast<int*>(a.reallocate(p, 16, 16, 64));
  ASSERT_NE(q, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], i);
  EXPECT_EQ(a.allocations, 2);
  EXPECT_EQ(a.deallocations, 1);
  auto feedback = a.allocate_at_least(10);
  EXPECT_EQ(feedback.size, 10u);
  a.deallocate(feedback.pointer, 10);
  a.deallocate(q, 64);
  EXPECT_TRUE(a.is_equal(a));
  minimal_allocator other;
  EXPECT_FALSE(a.is_equal(other));
}

TEST(allocator, default_allocator_can_be_replaced_and_restored) {
  test_allocator replacement;
  memkit::allocator& previous = memkit::set_default_allocator(replacement);
  EXPECT_EQ(&memkit::default_allocator(), &replacement);
  void* p = memkit::default_allocator().allocate(8);
  EXPECT_EQ(replacement.live_blocks(), 1u);
  memkit::default_allocator().deallocate(p, 8);
  EXPECT_EQ(&memkit::set_default_allocator(previous), &replacement);
  EXPECT_TRUE(memkit::default_allocator().is_equal(memkit::hybrid_allocator::instance()));
}

// The default allocator: small blocks from malloc, large ones from general_allocator::global(),
// where they grow in place; a block crossing the threshold moves with its used bytes.
TEST(allocator, hybrid_allocator_sends_large_blocks_to_the_general_allocator) {
  memkit::allocator& a = memkit::hybrid_allocator::instance();
  auto& gpa = memkit::general_allocator::global();
  const std::size_t large = memkit::hybrid_allocator::large_block_threshold;
  void* small = a.allocate(100);
  ASSERT_NE(small, nullptr);
  std::memset(small, 5, 100);
  // Growing across the threshold copies the used bytes into a general_allocator block.
  void* big = a.reallocate(small, 100, 100, large);
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(gpa.owns(big));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(static_cast<unsigned char*>(big)[i], 5);
  // resize() never crosses the threshold: the owner follows from the size.
  EXPECT_FALSE(a.resize(big, large, large - 1));
  // Doubling from there stays in place: the block has a reservation of its own.
  void* bigger = a.reallocate(big, large, 100, 2 * large);
  ASSERT_NE(bigger, nullptr);
  void* biggest = a.reallocate(bigger, 2 * large, 100, 4 * large);
  EXPECT_EQ(biggest, bigger);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(static_cast<unsigned char*>(biggest)[i], 5);
  // Shrinking back below the threshold returns to malloc.
  void* back = a.reallocate(biggest, 4 * large, 100, 200);
  ASSERT_NE(back, nullptr);
  EXPECT_FALSE(gpa.owns(back) && back == biggest);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(static_cast<unsigned char*>(back)[i], 5);
  a.deallocate(back, 200);
  memkit::allocation at_least = a.allocate_at_least(large + 1);
  ASSERT_NE(at_least.pointer, nullptr);
  EXPECT_GE(at_least.size, large + 1);
  a.deallocate(at_least.pointer, at_least.size);
  void* aligned = a.allocate(64, 256);
  ASSERT_NE(aligned, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(aligned) % 256, 0u);
  a.deallocate(aligned, 64, 256);
  EXPECT_TRUE(a.is_equal(memkit::hybrid_allocator::instance()));
  EXPECT_FALSE(a.is_equal(memkit::malloc_allocator::instance()));
}

TEST(std_allocator, standard_containers_allocate_through_a_memkit_allocator) {
  test_allocator a;
  {
    std::vector<int, memkit::std_allocator<int>> v{memkit::std_allocator<int>(a)};
    for (int i = 0; i < 1000; ++i) v.push_back(i);
    std::map<int, std::string, std::less<>,
             memkit::std_allocator<std::pair<const int, std::string>>>
        m{memkit::std_allocator<std::pair<const int, std::string>>(a)};
    m[1] = "one";
    EXPECT_GT(a.live_blocks(), 1u);
    EXPECT_EQ(v[999], 999);
  }
  EXPECT_EQ(a.live_blocks(), 0u);
}

TEST(std_allocator, failure_throws_bad_alloc_and_overflow_throws_bad_array_new_length) {
  test_allocator a;
  a.fail_all(true);
  std::vector<int, memkit::std_allocator<int>> v{memkit::std_allocator<int>(a)};
  EXPECT_THROW(v.push_back(1), std::bad_alloc);
  memkit::std_allocator<double> typed(a);
  EXPECT_THROW((void)typed.allocate(SIZE_MAX / 4), std::bad_array_new_length);
}

TEST(std_allocator, equality_follows_the_underlying_allocator) {
  test_allocator a, b;
  EXPECT_EQ(memkit::std_allocator<int>(a), memkit::std_allocator<long>(a));
  EXPECT_NE(memkit::std_allocator<int>(a), memkit::std_allocator<int>(b));
}

TEST(allocator_resource, pmr_containers_use_a_memkit_allocator) {
  test_allocator a;
  memkit::allocator_resource resource(a);
  {
    std::pmr::vector<std::pmr::string> strings(&resource);
    for (int i = 0; i < 100; ++i) strings.emplace_back(std::string(40, 'x'));
    EXPECT_GT(a.live_blocks(), 0u);
  }
  EXPECT_EQ(a.live_blocks(), 0u);
  a.fail_all(true);
  EXPECT_THROW((void)resource.allocate(64), std::bad_alloc);
  memkit::allocator_resource same(a);
  EXPECT_TRUE(resource.is_equal(same));
  EXPECT_FALSE(resource.is_equal(*std::pmr::new_delete_resource()));
}

TEST(resource_allocator, memkit_allocations_come_from_a_memory_resource) {
  std::byte buffer[256];
  std::pmr::monotonic_buffer_resource monotonic(buffer, sizeof buffer,
                                                std::pmr::null_memory_resource());
  memkit::resource_allocator a(monotonic);
  void* p = a.allocate(128, 16);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p >= buffer && p < buffer + sizeof buffer);
  // The resource throws when exhausted; the memkit side sees null, never an exception.
  EXPECT_EQ(a.allocate(1024), nullptr);
  a.deallocate(p, 128, 16);
  memkit::resource_allocator same(monotonic);
  EXPECT_TRUE(a.is_equal(same));
}

}  // namespace
