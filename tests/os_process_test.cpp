// The os layer's view of the process's own address space (src/os/process.hpp, internal), which
// debug mode's leak scan walks: regions with their access, copies and probes that do not fault,
// residency, the number of threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

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

TEST(os_process, readable_prefix_stops_before_the_first_page_that_cannot_be_read) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(3 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  ASSERT_TRUE(memkit::os::decommit(bytes + page, page).ok());  // the middle page: no access
  const auto first = process::readable_prefix(bytes, 3 * page);
  if (!first.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(first.error());
  EXPECT_EQ(first.value(), page);
  EXPECT_EQ(process::readable_prefix(bytes + 10, 3 * page - 10).value(), page - 10) << "from inside a page";
  EXPECT_EQ(process::readable_prefix(bytes, page / 2).value(), page / 2) << "never more than asked";
  EXPECT_EQ(process::readable_prefix(bytes + page, 2 * page).value(), 0u) << "an unreadable first page";
  EXPECT_EQ(process::readable_prefix(bytes + 2 * page, page).value(), page);
  (void)memkit::os::release(mapped.value(), 3 * page);
  auto reserved = memkit::os::reserve(page);
  ASSERT_TRUE(reserved.ok());
  EXPECT_EQ(process::readable_prefix(reserved.value(), page).value(), 0u);
  (void)memkit::os::release(reserved.value(), page);
}

TEST(os_process, thread_count_counts_the_threads_running) {
  std::thread([] {}).join();  // a runtime that starts a thread of its own with the first (TSan's) has now
  const auto before = process::thread_count();
  if (!before.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(before.error());
  EXPECT_GE(before.value(), 1u);
  std::atomic<bool> started{false};
  std::atomic<bool> stop{false};
  std::thread other([&] {
    started = true;
    while (!stop) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  const auto during = process::thread_count();
  stop = true;
  other.join();
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(during.value(), before.value() + 1);
}

#if !defined(_WIN32)
// Pages that are mapped and listed readable but fault when read: a private file mapping's pages
// past the end of its file (SIGBUS) and, where the kernel has them (Linux 6.13), guard regions
// inside a readable mapping (SIGSEGV; /proc/self/maps does not show them).
TEST(os_process, readable_prefix_stops_at_a_file_mappings_end_and_at_a_guard_region) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  std::vector<char> one_page(page, 'x');
  ASSERT_EQ(std::fwrite(one_page.data(), 1, page, file), page);
  ASSERT_EQ(std::fflush(file), 0);
  void* mapped = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, ::fileno(file), 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const auto file_prefix = process::readable_prefix(mapped, 3 * page);
  if (!file_prefix.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(file_prefix.error());
  EXPECT_EQ(file_prefix.value(), page) << "the pages past the file's end";
  ::munmap(mapped, 3 * page);
  std::fclose(file);

  constexpr int guard_install = 102;  // MADV_GUARD_INSTALL, in headers of Linux 6.13 and later
  void* anonymous = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anonymous, MAP_FAILED);
  auto* bytes = static_cast<unsigned char*>(anonymous);
  if (::madvise(bytes + page, page, guard_install) != 0) {
    ::munmap(anonymous, 3 * page);
    GTEST_SKIP() << "no guard regions in this kernel";
  }
  EXPECT_EQ(process::readable_prefix(bytes, 3 * page).value(), page);
  EXPECT_EQ(process::readable_prefix(bytes + 2 * page, page).value(), page);
  ::munmap(anonymous, 3 * page);
}

// The system's page, whatever MEMKIT_PAGE_SIZE makes os::page_size() (the suite also runs with
// 16 and 64 KiB): the unit in which an unreadable page is skipped.
TEST(os_process, protection_granularity_is_the_systems_page) {
  EXPECT_EQ(process::protection_granularity(), static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_LE(process::protection_granularity(), page_size());
}

void programs_own_handler(int) {}

// The probe catches its faults with handlers of its own while it runs: the program's handlers and
// its signal mask (here with both faults blocked, which would kill a process that faults) are
// what they were afterwards.
TEST(os_process, readable_prefix_leaves_the_programs_fault_handlers_and_signal_mask_as_they_were) {
  struct sigaction own {};
  own.sa_handler = programs_own_handler;
  sigemptyset(&own.sa_mask);
  struct sigaction saved_segv {};
  struct sigaction saved_bus {};
  ASSERT_EQ(::sigaction(SIGSEGV, &own, &saved_segv), 0);
  ASSERT_EQ(::sigaction(SIGBUS, &own, &saved_bus), 0);
  sigset_t blocked;
  sigset_t saved_mask;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGSEGV);
  sigaddset(&blocked, SIGBUS);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &blocked, &saved_mask), 0);

  const std::size_t page = page_size();
  auto mapped = memkit::os::map(2 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  ASSERT_TRUE(memkit::os::decommit(bytes + page, page).ok());
  const auto prefix = process::readable_prefix(bytes, 2 * page);
  (void)memkit::os::release(mapped.value(), 2 * page);

  sigset_t mask_after;
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, &saved_mask, &mask_after), 0);
  struct sigaction segv_after {};
  struct sigaction bus_after {};
  ASSERT_EQ(::sigaction(SIGSEGV, &saved_segv, &segv_after), 0);
  ASSERT_EQ(::sigaction(SIGBUS, &saved_bus, &bus_after), 0);
  if (!prefix.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(prefix.error());
  EXPECT_EQ(prefix.value(), page);
  EXPECT_EQ(sigismember(&mask_after, SIGSEGV), 1);
  EXPECT_EQ(sigismember(&mask_after, SIGBUS), 1);
  EXPECT_EQ(segv_after.sa_handler, &programs_own_handler);
  EXPECT_EQ(bus_after.sa_handler, &programs_own_handler);
}
#endif

}  // namespace
