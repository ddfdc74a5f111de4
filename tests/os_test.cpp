#include "memkit/os.hpp"

#include "memkit/detail/config.hpp"

#include <gtest/gtest.h>
#if MEMKIT_WINDOWS
#include "../src/os/windows_api.hpp"  // VirtualQuery
#else
#include <sys/mman.h>
#include <sys/resource.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if !MEMKIT_WINDOWS
extern char** environ;
#endif

namespace os = memkit::os;

namespace {

// The error numbers the os layer reports for its own checks: errno values on POSIX,
// ERROR_INVALID_PARAMETER and ERROR_NOT_SUPPORTED on Windows.
constexpr int invalid_argument = MEMKIT_WINDOWS ? 87 : EINVAL;
constexpr int not_supported = MEMKIT_WINDOWS ? 50 : ENOTSUP;
constexpr int out_of_memory = MEMKIT_WINDOWS ? 8 : ENOMEM;  // the system's, not an injected one

class os_test : public ::testing::Test {
 protected:
  void TearDown() override { os::testing::clear_injected_failures(); }
};

TEST_F(os_test, page_size_is_a_power_of_two_from_the_system) {
  const std::size_t page = os::page_size();
  // The system's, or the larger one MEMKIT_PAGE_SIZE forces for testing.
#if !MEMKIT_WINDOWS
  const char* forced = std::getenv("MEMKIT_PAGE_SIZE");
  EXPECT_EQ(page, forced != nullptr ? std::strtoull(forced, nullptr, 10) : static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
#endif
  EXPECT_EQ(page & (page - 1), 0u);
  EXPECT_EQ(os::reservation_granularity() % page, 0u);
}

TEST_F(os_test, reserve_commit_write_decommit_release) {
  const std::size_t page = os::page_size();
  auto reserved = os::reserve(64 * page);
  ASSERT_TRUE(reserved.ok()) << os::error_message(reserved.error());
  auto* base = static_cast<unsigned char*>(reserved.value());
  ASSERT_TRUE(os::commit(base, 4 * page).ok());
  std::memset(base, 0xAB, 4 * page);
  EXPECT_EQ(base[4 * page - 1], 0xAB);
  ASSERT_TRUE(os::decommit(base, 4 * page).ok());
  // Committing again yields fresh zero pages: the old contents were given back.
  ASSERT_TRUE(os::commit(base, 4 * page).ok());
  EXPECT_EQ(base[0], 0);
  EXPECT_EQ(base[4 * page - 1], 0);
  EXPECT_TRUE(os::release(base, 64 * page).ok());
}

TEST_F(os_test, decommitted_memory_gives_back_resident_pages) {
  const std::size_t bytes = 64u << 20;
  auto reserved = os::reserve(bytes);
  ASSERT_TRUE(reserved.ok());
  ASSERT_TRUE(os::commit(reserved.value(), bytes).ok());
  auto before = os::current_resident_bytes();
  ASSERT_TRUE(before.ok());
  std::memset(reserved.value(), 1, bytes);
  auto touched = os::current_resident_bytes();
  ASSERT_TRUE(touched.ok());
  EXPECT_GE(touched.value(), before.value() + bytes / 2);
  ASSERT_TRUE(os::decommit(reserved.value(), bytes).ok());
  auto after = os::current_resident_bytes();
  ASSERT_TRUE(after.ok());
  EXPECT_LE(after.value(), touched.value() - bytes / 2);
  auto peak = os::peak_resident_bytes();
  ASSERT_TRUE(peak.ok());
  // The kernel batches RSS counter updates per thread, so allow a little slack.
  EXPECT_GE(peak.value() + (1u << 20), touched.value());
  EXPECT_TRUE(os::release(reserved.value(), bytes).ok());
}

// Helper run in a child by the next test: prints this process's peak resident bytes.
#if !MEMKIT_WINDOWS  // posix_spawn, pipes and /proc/self/exe: POSIX only
TEST(os_test_child, DISABLED_print_peak_resident_bytes) {
  auto peak = os::peak_resident_bytes();
  std::printf("peak=%zu\n", peak.ok() ? peak.value() : std::size_t{0});
}
#endif

#if !MEMKIT_WINDOWS  // posix_spawn, pipes and /proc/self/exe: POSIX only
TEST_F(os_test, peak_resident_bytes_of_a_spawned_child_is_its_own) {
  // Linux keeps ru_maxrss across execve, so a child spawned by a big process would report the
  // parent's size as its own peak. Make this process big, spawn this test binary running only the
  // helper above, and check the child's figure is its own.
  const std::size_t bytes = 256u << 20;
  auto m = os::map(bytes);
  ASSERT_TRUE(m.ok());
  std::memset(m.value(), 1, bytes);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  char program[] = "/proc/self/exe";
  char filter[] = "--gtest_filter=os_test_child.DISABLED_print_peak_resident_bytes";
  char disabled[] = "--gtest_also_run_disabled_tests";
  char* argv[] = {program, filter, disabled, nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, program, &actions, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string output;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) output.append(buffer, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(os::release(m.value(), bytes).ok());
  const auto at = output.find("peak=");
  ASSERT_NE(at, std::string::npos) << output;
  const std::size_t child_peak = std::strtoull(output.c_str() + at + 5, nullptr, 10);
  EXPECT_GT(child_peak, 0u);
  EXPECT_LT(child_peak, bytes / 2) << "the child reported the parent's resident size as its peak";
}
#endif

TEST_F(os_test, reserved_but_uncommitted_memory_faults) {
  // SIGSEGV normally; under AddressSanitizer its handler reports the fault and exits instead.
  EXPECT_DEATH(
      {
        auto r = os::reserve(os::page_size());
        static_cast<volatile char*>(r.value())[0] = 1;
      },
      "");
}

TEST_F(os_test, reserve_aligned_honours_alignment) {
  const std::size_t alignment = 4u << 20;
  auto r = os::reserve_aligned(alignment, alignment);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r.value()) % alignment, 0u);
  EXPECT_TRUE(os::release(r.value(), alignment).ok());
  EXPECT_EQ(os::reserve_aligned(os::page_size(), 3 * os::page_size()).error(), invalid_argument);
}

#if !MEMKIT_WINDOWS
// Huge blocks grow in place beyond their reservation into the address space after it: an aligned
// reservation keeps the padding it trimmed after the block free, so that room exists right after
// it is made, even when the previous reservation was made just above it.
TEST_F(os_test, reserve_aligned_leaves_free_address_space_after_the_block) {
  const std::size_t alignment = 4u << 20;
  auto above = os::reserve_aligned(alignment, alignment);
  ASSERT_TRUE(above.ok());
  auto r = os::reserve_aligned(alignment, alignment);
  ASSERT_TRUE(r.ok());
  const bool grown = os::extend_mapping(r.value(), alignment, alignment + os::page_size()).ok();
  EXPECT_TRUE(grown) << "the block ends against another mapping";
  EXPECT_TRUE(os::release(r.value(), grown ? alignment + os::page_size() : alignment).ok());
  EXPECT_TRUE(os::release(above.value(), alignment).ok());
}
#endif

TEST_F(os_test, bad_arguments_are_einval_not_crashes) {
  const std::size_t page = os::page_size();
  EXPECT_EQ(os::reserve(0).error(), invalid_argument);
  EXPECT_EQ(os::reserve(page + 1).error(), invalid_argument);
  EXPECT_EQ(os::map(0).error(), invalid_argument);
  auto r = os::reserve(2 * page);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(os::commit(static_cast<char*>(r.value()) + 1, page).error(), invalid_argument);
  EXPECT_EQ(os::decommit(r.value(), page - 1).error(), invalid_argument);
  EXPECT_TRUE(os::release(r.value(), 2 * page).ok());
}

TEST_F(os_test, a_huge_reservation_fails_with_enomem) {
  auto r = os::reserve(std::size_t{1} << 62);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error(), out_of_memory);
  EXPECT_STRNE(os::error_message(r.error()), "");
}

TEST_F(os_test, injected_failures_count_down_then_stop) {
  const std::size_t page = os::page_size();
  os::testing::inject_failure(os::testing::operation::commit, 2, EAGAIN);
  auto r = os::reserve(page);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(os::commit(r.value(), page).error(), EAGAIN);
  EXPECT_EQ(os::commit(r.value(), page).error(), EAGAIN);
  EXPECT_TRUE(os::commit(r.value(), page).ok());
  os::testing::fail_after(os::testing::operation::reserve, 1);
  auto first = os::reserve(page);
  EXPECT_TRUE(first.ok());
  EXPECT_EQ(os::reserve(page).error(), ENOMEM);
  EXPECT_EQ(os::reserve(page).error(), ENOMEM);
  os::testing::clear_injected_failures();
  auto again = os::reserve(page);
  EXPECT_TRUE(again.ok());
  EXPECT_TRUE(os::release(r.value(), page).ok());
  EXPECT_TRUE(os::release(first.value(), page).ok());
  EXPECT_TRUE(os::release(again.value(), page).ok());
}

#if !MEMKIT_WINDOWS  // RLIMIT_AS: POSIX only
TEST_F(os_test, commit_fails_cleanly_under_an_address_space_limit) {
  // A child process under a small RLIMIT_AS sees ENOMEM from the system, not a crash.
  EXPECT_EXIT(
      {
        rlimit limit;
        limit.rlim_cur = limit.rlim_max = 256u << 20;
        if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
        auto r = os::reserve(std::size_t{1} << 30);
        _exit(!r.ok() && r.error() == ENOMEM ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(os_test, the_address_space_limit_is_read_as_it_is_now) {
  EXPECT_EXIT(
      {
        rlimit limit;
        if (getrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
        if (limit.rlim_cur == RLIM_INFINITY && os::address_space_limit() != SIZE_MAX) _exit(1);
        limit.rlim_cur = std::size_t{3} << 30;  // the soft limit, below any hard one
        if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < limit.rlim_cur) limit.rlim_cur = limit.rlim_max;
        if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
        _exit(os::address_space_limit() == limit.rlim_cur ? 0 : 2);  // not a stale value
      },
      ::testing::ExitedWithCode(0), "");
}
#else
TEST_F(os_test, windows_has_no_address_space_limit) { EXPECT_EQ(os::address_space_limit(), SIZE_MAX); }
#endif

// Parts of one reservation released one by one, as munmap allows: the rest stays usable, and the
// last part takes the whole reservation with it. (Windows frees address space by whole
// reservations only: its layer decommits each part and releases the reservation with the last.)
TEST_F(os_test, parts_of_a_reservation_are_released_one_by_one) {
  const std::size_t page = os::page_size();
  const std::size_t bytes = 64 * page;
  auto r = os::reserve(bytes);
  ASSERT_TRUE(r.ok());
  auto* base = static_cast<char*>(r.value());
  ASSERT_TRUE(os::commit(base, bytes).ok());
  std::memset(base, 1, bytes);
  EXPECT_TRUE(os::release(base + 60 * page, 4 * page).ok());  // the tail
  EXPECT_TRUE(os::release(base, 4 * page).ok());              // the head
#if MEMKIT_WINDOWS
  // A range beyond the reservation is refused.
  EXPECT_EQ(os::release(base + 56 * page, 8 * page + os::reservation_granularity()).error(), invalid_argument);
  MEMORY_BASIC_INFORMATION info{};
  ASSERT_NE(::VirtualQuery(base, &info, sizeof info), 0u);
  EXPECT_EQ(info.State, static_cast<DWORD>(MEM_RESERVE));  // its pages went back already
#endif
  base[4 * page] = 2;  // the middle is still usable
  base[60 * page - 1] = 3;
  EXPECT_EQ(base[4 * page] + base[60 * page - 1], 5);
  EXPECT_TRUE(os::release(base + 4 * page, 20 * page).ok());
  EXPECT_TRUE(os::release(base + 24 * page, 36 * page).ok());
#if MEMKIT_WINDOWS
  ASSERT_NE(::VirtualQuery(base, &info, sizeof info), 0u);
  EXPECT_EQ(info.State, static_cast<DWORD>(MEM_FREE)) << "the last part took the reservation with it";
#endif
}

TEST_F(os_test, map_extend_and_remap_keep_contents) {
  const std::size_t page = os::page_size();
  auto m = os::map(4 * page);
  ASSERT_TRUE(m.ok());
  auto* p = static_cast<unsigned char*>(m.value());
  p[0] = 7;
  p[4 * page - 1] = 9;
  auto moved = os::remap(p, 4 * page, 64 * page);
  ASSERT_TRUE(moved.ok());
  p = static_cast<unsigned char*>(moved.value());
  EXPECT_EQ(p[0], 7);
  EXPECT_EQ(p[4 * page - 1], 9);
  p[64 * page - 1] = 1;
  // Extending into pages that are in use elsewhere must fail without moving.
  auto blocker = os::map(page);
  ASSERT_TRUE(blocker.ok());
  if (blocker.value() == p + 64 * page) {
    EXPECT_FALSE(os::extend_mapping(p, 64 * page, 65 * page).ok());
  }
#if MEMKIT_WINDOWS
  // Windows neither extends nor shrinks a mapping.
  EXPECT_EQ(os::extend_mapping(p, 64 * page, 32 * page).error(), not_supported);
  EXPECT_TRUE(os::release(p, 64 * page).ok());
#else
  EXPECT_TRUE(os::extend_mapping(p, 64 * page, 32 * page).ok());  // shrinking always works
  EXPECT_TRUE(os::release(p, 32 * page).ok());
#endif
  EXPECT_TRUE(os::release(blocker.value(), page).ok());
}

TEST_F(os_test, unsupported_operations_are_told_apart_from_failures) {
  // The general allocator stops trying to move pages once the system says it cannot; a failure
  // for lack of room must not switch that off.
  EXPECT_TRUE(os::is_unsupported(not_supported));
  EXPECT_FALSE(os::is_unsupported(out_of_memory));
  EXPECT_FALSE(os::is_unsupported(invalid_argument));
#if MEMKIT_WINDOWS
  // What the Windows layer returns for an operation it cannot do is recognised as such.
  auto mapped = os::map(os::page_size());
  ASSERT_TRUE(mapped.ok());
  const auto extended = os::extend_mapping(mapped.value(), os::page_size(), 2 * os::page_size());
  ASSERT_FALSE(extended.ok());
  EXPECT_TRUE(os::is_unsupported(extended.error()));
  EXPECT_TRUE(os::release(mapped.value(), os::page_size()).ok());
#endif
}

TEST_F(os_test, move_pages_hands_pages_over_and_unmaps_the_source) {
  const std::size_t page = os::page_size();
  auto a = os::map(8 * page);
  auto b = os::map(8 * page);
  ASSERT_TRUE(a.ok() && b.ok());
  auto* from = static_cast<unsigned char*>(a.value());
  auto* to = static_cast<unsigned char*>(b.value());
  for (std::size_t i = 0; i < 8; ++i) from[i * page] = static_cast<unsigned char>(i + 1);
  // Bad arguments change nothing.
  EXPECT_EQ(os::move_pages(from + 1, page, to).error(), invalid_argument);
  EXPECT_EQ(os::move_pages(from, page + 1, to).error(), invalid_argument);
  EXPECT_EQ(os::move_pages(from, 0, to).error(), invalid_argument);
  EXPECT_EQ(os::move_pages(from, 4 * page, from + 2 * page).error(), invalid_argument);  // overlap
  // An injected failure leaves both ranges as they were.
  os::testing::inject_failure(os::testing::operation::map, 1);
  EXPECT_EQ(os::move_pages(from + 2 * page, 4 * page, to + page).error(), ENOMEM);
  EXPECT_EQ(from[2 * page], 3);
  EXPECT_EQ(to[page], 0);
  auto moved = os::move_pages(from + 2 * page, 4 * page, to + page);
#if defined(__linux__)
  ASSERT_TRUE(moved.ok()) << os::error_message(moved.error());
  for (std::size_t j = 0; j < 4; ++j) EXPECT_EQ(to[(1 + j) * page], 3 + j);
  EXPECT_EQ(to[0], 0);
  EXPECT_EQ(to[5 * page], 0);
  EXPECT_EQ(from[page], 2);  // the rest of the source is untouched
  EXPECT_EQ(from[6 * page], 7);
  // The source range is no longer mapped.
  unsigned char residency[4];
  EXPECT_EQ(::mincore(from + 2 * page, 4 * page, residency), -1);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_TRUE(os::release(from, 2 * page).ok());
  EXPECT_TRUE(os::release(from + 6 * page, 2 * page).ok());
#else
  EXPECT_EQ(moved.error(), not_supported);
  EXPECT_TRUE(os::release(from, 8 * page).ok());
#endif
  EXPECT_TRUE(os::release(to, 8 * page).ok());
}

TEST_F(os_test, move_and_grow_pages_moves_a_mapping_into_a_larger_committed_range) {
  const std::size_t page = os::page_size();
  auto a = os::map(4 * page);
  auto b = os::reserve(16 * page);
  ASSERT_TRUE(a.ok() && b.ok());
  auto* from = static_cast<unsigned char*>(a.value());
  auto* to = static_cast<unsigned char*>(b.value());
  for (std::size_t i = 0; i < 4; ++i) from[i * page] = static_cast<unsigned char>(i + 1);
  EXPECT_EQ(os::move_and_grow_pages(from, 4 * page, to, 2 * page).error(), invalid_argument);  // shrinks
  EXPECT_EQ(os::move_and_grow_pages(from, 4 * page, from + page, 8 * page).error(), invalid_argument);
  os::testing::inject_failure(os::testing::operation::map, 1);
  EXPECT_EQ(os::move_and_grow_pages(from, 4 * page, to, 10 * page).error(), ENOMEM);
  EXPECT_EQ(from[3 * page], 4);  // nothing moved
  auto moved = os::move_and_grow_pages(from, 4 * page, to, 10 * page);
#if defined(__linux__)
  ASSERT_TRUE(moved.ok()) << os::error_message(moved.error());
  for (std::size_t j = 0; j < 4; ++j) EXPECT_EQ(to[j * page], j + 1);
  for (std::size_t j = 4; j < 10; ++j) EXPECT_EQ(to[j * page], 0);  // grown: zero, writable
  to[9 * page] = 9;
  EXPECT_EQ(to[9 * page], 9);
  unsigned char residency[4];
  EXPECT_EQ(::mincore(from, 4 * page, residency), -1);  // the source is gone
#else
  EXPECT_EQ(moved.error(), not_supported);
  EXPECT_TRUE(os::release(from, 4 * page).ok());
#endif
  EXPECT_TRUE(os::release(to, 16 * page).ok());
}

TEST_F(os_test, prefault_populates_and_reports_injected_failure) {
  const std::size_t bytes = 16u << 20;
  auto r = os::reserve(bytes);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(os::commit(r.value(), bytes).ok());
  auto before = os::current_resident_bytes();
  ASSERT_TRUE(os::prefault(r.value(), bytes).ok());
  auto after = os::current_resident_bytes();
  EXPECT_GE(after.value(), before.value() + bytes / 2);
  os::testing::inject_failure(os::testing::operation::prefault, 1);
  EXPECT_EQ(os::prefault(r.value(), bytes).error(), ENOMEM);
  EXPECT_TRUE(os::release(r.value(), bytes).ok());
}

TEST_F(os_test, huge_page_advice_reports_its_outcome) {
  const std::size_t huge = os::huge_page_size();
  if (huge == 0) GTEST_SKIP() << "no transparent huge pages here";
  auto r = os::reserve_aligned(4 * huge, huge);
  ASSERT_TRUE(r.ok());
  auto s = os::advise_huge_pages(r.value(), 4 * huge);
  EXPECT_TRUE(s.ok() || s.error() == EINVAL) << os::error_message(s.error());
  EXPECT_TRUE(os::release(r.value(), 4 * huge).ok());
}

TEST_F(os_test, cpu_times_advance) {
  auto first = os::process_cpu_times();
  ASSERT_TRUE(first.ok());
  volatile double sink = 0;
  for (int i = 0; i < 20'000'000; ++i) sink = sink + i * 0.5;
  auto second = os::process_cpu_times();
  ASSERT_TRUE(second.ok());
  EXPECT_GT(second.value().user_ns + second.value().system_ns,
            first.value().user_ns + first.value().system_ns);
}

}  // namespace
