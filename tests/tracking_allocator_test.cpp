// Behaviour of memkit::tracking_allocator: counters, live and peak bytes, the histogram, budgets,
// fail-the-N-th-allocation, mismatch checks, leak reports (with stack traces), and exact counts
// when threads share one tracker.
#include "memkit/tracking_allocator.hpp"

#include <gtest/gtest.h>
#if MEMKIT_WINDOWS
#include <fcntl.h>
#include <io.h>
#else
#include <unistd.h>
#endif

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "memkit/small_vector.hpp"
#include "memkit/vector.hpp"
#include "memkit/virtual_arena.hpp"
#include "support/in_order.hpp"
#include "support/test_allocator.hpp"

namespace {

using memkit::tracking_allocator;
using memkit::tracking_options;

// Collects what is written to a pipe (for leak reports and diagnostics). The C runtime's
// descriptors on Windows, POSIX ones elsewhere; the pipe holds 1 MiB on Windows, 64 KiB on Linux.
class captured_output {
 public:
#if MEMKIT_WINDOWS
  captured_output() { EXPECT_EQ(::_pipe(fds_, 1u << 20, _O_BINARY), 0); }
  static void close_descriptor(int fd) { ::_close(fd); }
  static int read_descriptor(int fd, char* buffer, unsigned bytes) { return ::_read(fd, buffer, bytes); }
#else
  captured_output() { EXPECT_EQ(::pipe(fds_), 0); }
  static void close_descriptor(int fd) { ::close(fd); }
  static int read_descriptor(int fd, char* buffer, unsigned bytes) { return static_cast<int>(::read(fd, buffer, bytes)); }
#endif
  ~captured_output() {
    close_descriptor(fds_[0]);
    if (fds_[1] >= 0) close_descriptor(fds_[1]);
  }
  int fd() const { return fds_[1]; }
  std::string read_all() {
    close_descriptor(fds_[1]);
    fds_[1] = -1;
    std::string out;
    char buffer[4096];
    int n;
    while ((n = read_descriptor(fds_[0], buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<std::size_t>(n));
    return out;
  }

 private:
  int fds_[2] = {-1, -1};
};

TEST(tracking_allocator, counts_every_operation_and_live_and_peak_bytes) {
  memkit::testing::test_allocator upstream;
  tracking_allocator tracker(upstream);
  void* a = tracker.allocate(100);
  void* b = tracker.allocate(3000, 64);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto s = tracker.statistics();
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.live_blocks, 2u);
  EXPECT_EQ(s.live_bytes, 3100u);
  EXPECT_EQ(s.peak_bytes, 3100u);
  EXPECT_EQ(s.size_histogram[6], 1u);   // 100 in [64, 128)
  EXPECT_EQ(s.size_histogram[11], 1u);  // 3000 in [2048, 4096)
  tracker.deallocate(b, 3000, 64);
  void* c = tracker.reallocate(a, 100, 100, 200);
  ASSERT_NE(c, nullptr);
  (void)tracker.resize(c, 200, 150);
  s = tracker.statistics();
  EXPECT_EQ(s.deallocations, 1u);
  EXPECT_EQ(s.reallocations, 1u);
  EXPECT_EQ(s.resize_attempts, 1u);
  EXPECT_EQ(s.resizes_in_place, 1u);  // shrinking in place always works over malloc
  EXPECT_EQ(s.live_bytes, 150u);
  EXPECT_EQ(s.peak_bytes, 3100u);
  EXPECT_EQ(s.total_bytes, 3200u);
  tracker.deallocate(c, 150);
  s = tracker.statistics();
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(upstream.live_blocks(), 0u);
  const std::string report = tracker.report();
  EXPECT_NE(report.find("allocations     2"), std::string::npos) << report;
  EXPECT_NE(report.find("peak 3.0 KiB"), std::string::npos) << report;
  EXPECT_NE(report.find(">= 64 B"), std::string::npos) << report;
}

TEST(tracking_allocator, sees_what_a_vector_does) {
  tracking_allocator tracker(memkit::malloc_allocator::instance());
  {
    memkit::vector<int> v(tracker);
    for (int i = 0; i < 100000; ++i) v.push_back(i);
    auto s = tracker.statistics();
    EXPECT_GE(s.allocations, 1u);
    EXPECT_GE(s.reallocations, 1u);  // ints are trivially relocatable: growth goes through reallocate
    EXPECT_GE(s.allocations + s.reallocations + s.resizes_in_place, 10u);  // about log2(100000 / 4) growths
    EXPECT_GE(s.live_bytes, 400000u);
  }
  EXPECT_EQ(tracker.statistics().live_blocks, 0u);
  EXPECT_EQ(tracker.statistics().errors, 0u);
}

TEST(tracking_allocator, counts_in_place_growth_through_an_arena) {
  memkit::virtual_arena arena(std::size_t{1} << 28);
  tracking_allocator tracker(arena);
  memkit::vector<int> v(tracker);
  for (int i = 0; i < 100000; ++i) v.push_back(i);
  auto s = tracker.statistics();
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.reallocations_in_place, s.reallocations);  // the arena's last block never moves
  EXPECT_GE(s.reallocations_in_place, 10u);
  // Elements that are not trivially relocatable grow through resize, also in place.
  memkit::vector<std::string> names(tracker);
  for (int i = 0; i < 1000; ++i) names.emplace_back("name");
  s = tracker.statistics();
  EXPECT_GE(s.resizes_in_place, 5u);
  EXPECT_EQ(s.resizes_in_place, s.resize_attempts);
}

TEST(tracking_allocator, budget_refuses_requests_beyond_it) {
  tracking_allocator tracker(memkit::malloc_allocator::instance(), {.budget = 1000});
  void* a = tracker.allocate(600);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(tracker.allocate(600), nullptr);
  EXPECT_FALSE(tracker.resize(a, 600, 1200));
  EXPECT_EQ(tracker.reallocate(a, 600, 600, 1200), nullptr);
  EXPECT_EQ(tracker.statistics().budget_refusals, 3u);
  void* b = tracker.allocate(400);
  EXPECT_NE(b, nullptr);
  tracker.deallocate(b, 400);
  tracker.deallocate(a, 600);
  // Containers turn refusals into try_ failures or bad_alloc, unchanged.
  memkit::vector<int> v(tracker);
  EXPECT_TRUE(v.try_resize(200));
  EXPECT_FALSE(v.try_resize(300));
  EXPECT_EQ(v.size(), 200u);
  EXPECT_THROW(v.reserve(1000), std::bad_alloc);
  tracker.set_budget(1 << 20);
  EXPECT_EQ(tracker.budget(), 1u << 20);
  EXPECT_TRUE(v.try_resize(1000));
}

TEST(tracking_allocator, size_feedback_never_exceeds_the_budget) {
  tracking_allocator tracker(memkit::malloc_allocator::instance(), {.budget = 100});
  auto block = tracker.allocate_at_least(100);
  ASSERT_NE(block.pointer, nullptr);
  EXPECT_EQ(block.size, 100u);
  tracker.deallocate(block.pointer, block.size);
}

TEST(tracking_allocator, fails_the_nth_allocation_so_error_paths_can_be_tested) {
  tracking_allocator tracker(memkit::malloc_allocator::instance());
  for (std::uint64_t n = 1; n <= 5; ++n) {
    tracker.fail_nth_allocation(n);
    std::vector<void*> blocks;
    for (std::uint64_t i = 1; i <= 5; ++i) {
      void* p = tracker.allocate(16);
      EXPECT_EQ(p == nullptr, i == n) << "n=" << n << " i=" << i;
      if (p != nullptr) blocks.push_back(p);
    }
    for (void* p : blocks) tracker.deallocate(p, 16);
  }
  EXPECT_EQ(tracker.statistics().injected_failures, 5u);
  // A user's own code under test: every failure point handled.
  for (std::uint64_t n = 1; n <= 12; ++n) {
    tracker.fail_nth_allocation(n);
    memkit::vector<std::string> names(tracker);
    bool complete = true;
    for (int i = 0; i < 300 && complete; ++i) complete = names.try_push_back("name");
    EXPECT_TRUE(names.size() == 300 || !complete);
  }
  tracker.fail_nth_allocation(0);
  tracker.fail_all_allocations(true);
  EXPECT_EQ(tracker.allocate(1), nullptr);
  tracker.fail_all_allocations(false);
  EXPECT_EQ(tracker.statistics().live_blocks, 0u);
}

TEST(tracking_allocator, counts_failures_of_the_wrapped_allocator) {
  memkit::testing::test_allocator upstream;
  tracking_allocator tracker(upstream);
  upstream.fail_all(true);
  EXPECT_EQ(tracker.allocate(8), nullptr);
  EXPECT_EQ(tracker.statistics().failed_allocations, 1u);
  EXPECT_EQ(tracker.statistics().allocations, 0u);
}

TEST(tracking_allocator, detects_mismatched_and_unknown_deallocations) {
  tracking_allocator tracker(memkit::malloc_allocator::instance(), {.abort_on_error = false});
  void* p = tracker.allocate(64, 16);
  int local = 0;
  tracker.deallocate(&local, 4);
  EXPECT_EQ(tracker.statistics().errors, 1u);
  EXPECT_NE(tracker.last_error().find("did not allocate"), std::string::npos) << tracker.last_error();
  tracker.deallocate(p, 32, 16);
  EXPECT_EQ(tracker.statistics().errors, 2u);
  EXPECT_NE(tracker.last_error().find("size 32"), std::string::npos) << tracker.last_error();
  // The block was freed with its real size anyway, so a second free is an unknown pointer.
  tracker.deallocate(p, 64, 16);
  EXPECT_EQ(tracker.statistics().errors, 3u);
  void* q = tracker.allocate(64, 16);
  tracker.deallocate(q, 64, 32);
  EXPECT_NE(tracker.last_error().find("alignment 32"), std::string::npos) << tracker.last_error();
  EXPECT_FALSE(tracker.resize(&local, 4, 8));
  EXPECT_EQ(tracker.statistics().errors, 5u);
}

TEST(tracking_allocator_death, a_mismatched_free_aborts_with_both_stack_traces) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        tracking_allocator tracker(memkit::malloc_allocator::instance(), {.capture_stack_traces = true});
        void* p = tracker.allocate(64);
        tracker.deallocate(p, 200);
      },
      memkit::testing::contains_in_order(
          {"deallocate of ", " with size 200, but allocation #1 was 64 bytes", "allocated at", "mismatched call"}));
  EXPECT_DEATH(
      {
        tracking_allocator tracker(memkit::malloc_allocator::instance());
        int x = 0;
        tracker.deallocate(&x, 4);
      },
      "did not allocate");
}

TEST(tracking_allocator, reports_leaks_at_destruction_with_stack_traces) {
  captured_output output;
  void* leaked = nullptr;
  {
    tracking_allocator tracker(memkit::malloc_allocator::instance(),
                               {.capture_stack_traces = true, .report_fd = output.fd(), .name = "parser"});
    void* freed = tracker.allocate(10);
    leaked = tracker.allocate(48);
    tracker.deallocate(freed, 10);
    auto live = tracker.live_blocks();
    ASSERT_EQ(live.size(), 1u);
    EXPECT_EQ(live[0].pointer, leaked);
    EXPECT_EQ(live[0].size, 48u);
    EXPECT_EQ(live[0].sequence, 2u);
  }
  const std::string report = output.read_all();
  EXPECT_NE(report.find("memkit::parser: 1 block(s) leaked, 48 B"), std::string::npos) << report;
  EXPECT_NE(report.find("allocation #2"), std::string::npos) << report;
  EXPECT_NE(report.find("#0 0x"), std::string::npos) << "a stack trace follows:\n" << report;
  memkit::malloc_allocator::instance().deallocate(leaked, 48);
}

TEST(tracking_allocator, stays_silent_without_leaks_and_when_told_to) {
  captured_output output;
  {
    tracking_allocator quiet(memkit::malloc_allocator::instance(),
                             {.report_leaks_at_destruction = false, .report_fd = output.fd()});
    void* p = quiet.allocate(8);
    memkit::malloc_allocator::instance().deallocate(p, 8);  // the test takes the block back
    tracking_allocator clean(memkit::malloc_allocator::instance(), {.report_fd = output.fd()});
    clean.deallocate(clean.allocate(8), 8);
  }
  EXPECT_EQ(output.read_all(), "");
}

TEST(tracking_allocator, reset_statistics_keeps_live_blocks) {
  tracking_allocator tracker(memkit::malloc_allocator::instance());
  void* p = tracker.allocate(100);
  tracker.deallocate(tracker.allocate(1000), 1000);
  tracker.reset_statistics();
  auto s = tracker.statistics();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.live_blocks, 1u);
  EXPECT_EQ(s.peak_bytes, 100u);
  tracker.deallocate(p, 100);
  EXPECT_EQ(tracker.statistics().live_bytes, 0u);
}

TEST(tracking_allocator, exact_counts_when_threads_share_it) {
  tracking_allocator tracker(memkit::malloc_allocator::instance());
  constexpr int threads = 4;
  constexpr int rounds = 2000;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&tracker, t] {
      memkit::small_vector<int, 4> v(tracker);
      std::vector<void*> held;
      for (int i = 0; i < rounds; ++i) {
        held.push_back(tracker.allocate(static_cast<std::size_t>(16 + (i + t) % 200)));
        v.push_back(i);
        if (held.size() > 16) {
          void* p = held.front();
          held.erase(held.begin());
          tracker.deallocate(p, static_cast<std::size_t>(16 + (i - 16 + t) % 200));
        }
      }
      for (std::size_t k = 0; k < held.size(); ++k) {
        const int i = rounds - static_cast<int>(held.size()) + static_cast<int>(k);
        tracker.deallocate(held[k], static_cast<std::size_t>(16 + (i + t) % 200));
      }
    });
  }
  for (auto& w : workers) w.join();
  const auto s = tracker.statistics();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.allocations, s.deallocations);
  EXPECT_GE(s.allocations, static_cast<std::uint64_t>(threads * rounds));
}

}  // namespace
