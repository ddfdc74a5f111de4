// The os layer's view of the process's own address space (src/os/process.hpp, internal), which
// debug mode's leak scan walks: regions with their access, copies that do not fault, residency.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../src/os/process.hpp"
#include "memkit/os.hpp"

namespace {

using memkit::os::page_size;
namespace process = memkit::os::process;

int data_segment_word = 42;  // in the data segment: a private writable region

struct snapshot {
  std::vector<process::region> regions;
  std::size_t stop_after = SIZE_MAX;
};

snapshot walk(std::size_t stop_after = SIZE_MAX) {
  snapshot s;
  s.stop_after = stop_after;
  const auto status = process::for_each_region(
      [](const process::region& r, void* context) {
        auto* out = static_cast<snapshot*>(context);
        out->regions.push_back(r);
        return out->regions.size() < out->stop_after;
      },
      &s);
  EXPECT_TRUE(status.ok()) << memkit::os::error_message(status.error());
  return s;
}

const process::region* containing(const snapshot& s, const void* address) {
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  for (const auto& r : s.regions) {
    if (a >= r.begin && a < r.end) return &r;
  }
  return nullptr;
}

TEST(os_process, regions_cover_the_data_segment_the_stack_and_a_mapping_in_address_order) {
  int on_stack = 1;
  auto mapped = memkit::os::map(4 * page_size());
  ASSERT_TRUE(mapped.ok());
  auto reserved = memkit::os::reserve(16 * page_size());
  ASSERT_TRUE(reserved.ok());
  const snapshot s = walk();
  ASSERT_FALSE(s.regions.empty());
  for (std::size_t i = 0; i < s.regions.size(); ++i) {
    EXPECT_LT(s.regions[i].begin, s.regions[i].end);
    if (i > 0) {
      EXPECT_LE(s.regions[i - 1].end, s.regions[i].begin) << "sorted, never overlapping";
    }
    EXPECT_NE(s.regions[i].name, nullptr);
  }
  for (const void* address : {static_cast<const void*>(&data_segment_word), static_cast<const void*>(&on_stack),
                              static_cast<const void*>(mapped.value())}) {
    const process::region* r = containing(s, address);
    ASSERT_NE(r, nullptr) << address;
    EXPECT_TRUE(r->readable && r->writable && r->is_private) << address;
  }
  // A reservation is no data: listed unreadable (POSIX), or not listed at all (Windows lists
  // committed memory only).
  if (const process::region* r = containing(s, reserved.value())) {
    EXPECT_FALSE(r->readable);
  }
  (void)memkit::os::release(mapped.value(), 4 * page_size());
  (void)memkit::os::release(reserved.value(), 16 * page_size());
}

TEST(os_process, the_walk_stops_when_the_visitor_says_so) {
  const snapshot all = walk();
  ASSERT_GE(all.regions.size(), 3u);
  const snapshot two = walk(2);
  ASSERT_EQ(two.regions.size(), 2u);
  EXPECT_EQ(two.regions[0].begin, all.regions[0].begin);
}

TEST(os_process, read_memory_copies_and_stops_at_the_first_unmapped_page) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(2 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  for (std::size_t i = 0; i < 2 * page; ++i) bytes[i] = static_cast<unsigned char>(i * 7);
  std::vector<unsigned char> copy(2 * page);
  const auto whole = process::read_memory(bytes, copy.data(), 2 * page);
  if (!whole.ok()) GTEST_SKIP() << "no safe copy on this system: " << memkit::os::error_message(whole.error());
  EXPECT_EQ(whole.value(), 2 * page);
  EXPECT_EQ(std::memcmp(copy.data(), bytes, 2 * page), 0);
  // The second page made inaccessible: the copy ends where it starts.
  ASSERT_TRUE(memkit::os::decommit(bytes + page, page).ok());
  const auto partial = process::read_memory(bytes, copy.data(), 2 * page);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial.value(), page);
  auto reserved = memkit::os::reserve(page);  // some unreadable memory
  ASSERT_TRUE(reserved.ok());
  const auto none = process::read_memory(reserved.value(), copy.data(), page);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value(), 0u) << "an unreadable first page: nothing copied, no fault";
  (void)memkit::os::release(reserved.value(), page);
  (void)memkit::os::release(mapped.value(), 2 * page);
}

TEST(os_process, resident_pages_marks_the_pages_written) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(4 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  bytes[0] = 1;
  bytes[2 * page] = 1;
  unsigned char resident[4] = {9, 9, 9, 9};
  ASSERT_TRUE(process::resident_pages(bytes, 4 * page, resident).ok());
  EXPECT_EQ(resident[0], 1);
  EXPECT_EQ(resident[2], 1);
#if defined(__linux__)
  // Linux tells pages never touched apart (Windows counts every committed page as resident).
  EXPECT_EQ(resident[1], 0);
  EXPECT_EQ(resident[3], 0);
#endif
  (void)memkit::os::release(mapped.value(), 4 * page);
#if defined(__linux__)
  // Linux's mincore fails on a range that is not mapped.
  EXPECT_FALSE(process::resident_pages(bytes, 4 * page, resident).ok());
#endif
}

}  // namespace
