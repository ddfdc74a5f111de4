// Debug mode of memkit::general_allocator: each report's first line and trace sections, the
// report-and-continue mode, address retirement and the leak report.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "memkit/general_allocator.hpp"

namespace {

using memkit::general_allocator;

general_allocator::options debug_options() {
  general_allocator::options o;
  o.debug = true;
  return o;
}

// Runs `body` with reports written to a pipe and returns what was written.
template <class Body>
std::string capture_report(general_allocator::options o, Body body) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  o.report_fd = fds[1];
  {
    general_allocator a(o);
    body(a);
  }
  close(fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  close(fds[0]);
  return text;
}

TEST(general_allocator_debug, double_free_reports_allocation_first_and_second_free) {
  general_allocator a(debug_options());
  void* p = a.allocate(100);
  a.free(p);
  EXPECT_DEATH(a.free(p),
               "memkit: double free of 0x[0-9a-f]+ \\(block of 100 bytes\\)\n"
               "  allocated at:\n    #0 0x[0-9a-f]+.*"
               "  first freed at:\n    #0 0x[0-9a-f]+.*"
               "  freed again at:\n    #0 0x[0-9a-f]+");
}

TEST(general_allocator_debug, double_free_of_a_large_block_is_reported) {
  general_allocator a(debug_options());
  void* p = a.allocate(std::size_t{5} << 20);
  a.free(p);
  EXPECT_DEATH(a.free(p), "memkit: double free of 0x[0-9a-f]+ \\(large block of 5242880 bytes\\)\n"
                          "  allocated at:.*first freed at:.*freed again at:");
}

TEST(general_allocator_debug, interior_pointer_is_reported_with_its_block) {
  general_allocator a(debug_options());
  auto* p = static_cast<char*>(a.allocate(100));
  EXPECT_DEATH(a.free(p + 8),
               "memkit: free of an interior pointer 0x[0-9a-f]+ \\(8 bytes into the 100-byte block at "
               "0x[0-9a-f]+\\)\n  block allocated at:\n    #0");
  a.free(p);
}

TEST(general_allocator_debug, interior_pointer_deep_into_a_large_block_is_reported_with_it) {
  general_allocator a(debug_options());
  auto* p = static_cast<char*>(a.allocate(std::size_t{10} << 20));
  // Past the first 4 MiB the pointer masks to no segment header: still named as interior.
  EXPECT_DEATH(a.free(p + (std::size_t{9} << 20)),
               "memkit: free of an interior pointer 0x[0-9a-f]+ \\(9437184 bytes into the 10485760-byte "
               "block at 0x[0-9a-f]+\\)\n  block allocated at:\n    #0");
  a.free(p);
}

TEST(general_allocator_debug, interior_pointer_past_a_spans_first_slice_is_reported_with_it) {
  general_allocator a(debug_options());
  auto* p = static_cast<char*>(a.allocate(std::size_t{1} << 20));  // a span of 64 KiB slices
  EXPECT_DEATH(a.free(p + 300000),
               "memkit: free of an interior pointer 0x[0-9a-f]+ \\(300000 bytes into the 1048576-byte block at "
               "0x[0-9a-f]+\\)\n  block allocated at:\n    #0");
  a.free(p);
}

TEST(general_allocator_debug, foreign_pointers_are_reported) {
  general_allocator a(debug_options());
  general_allocator other(debug_options());
  int on_stack = 0;
  EXPECT_DEATH(a.free(&on_stack), "memkit: free of a pointer this allocator did not allocate: 0x[0-9a-f]+\n"
                                  "  freed at:\n    #0");
  void* q = other.allocate(64);
  EXPECT_DEATH(a.free(q), "memkit: free of a pointer this allocator did not allocate");
  other.free(q);
  // Inside a page of this allocator but never handed out.
  auto* r = static_cast<char*>(a.allocate(64));
  EXPECT_DEATH(a.free(r + 4096 * 8), "memkit: free of a pointer this allocator did not allocate");
  a.free(r);
}

TEST(general_allocator_debug, overwritten_canary_is_reported_on_free) {
  general_allocator a(debug_options());
  auto* p = static_cast<char*>(a.allocate(10));
  p[10] = 'x';  // one past the end
  EXPECT_DEATH(a.free(p),
               "memkit: heap buffer overflow: the canary after the 10-byte block at 0x[0-9a-f]+ was "
               "overwritten \\(byte 0 past the end is 0x78\\)\n  block allocated at:\n    #0");
  p[10] = static_cast<char>(general_allocator::canary_byte);
  a.free(p);
}

TEST(general_allocator_debug, write_after_free_is_reported_when_the_block_is_reused) {
  general_allocator::options o = debug_options();
  o.quarantine_bytes = 0;  // reused at once
  general_allocator a(o);
  auto* p = static_cast<char*>(a.allocate(100));
  a.free(p);
  p[20] = 1;  // use after free
  EXPECT_DEATH((void)a.allocate(100),
               "memkit: use after free: the 100-byte block at 0x[0-9a-f]+ was written after it was freed "
               "\\(byte 20 is 0x01, expected 0xdf\\)\n  allocated at:.*  freed at:\n    #0");
  p[20] = static_cast<char>(general_allocator::freed_fill_byte);
}

TEST(general_allocator_debug, report_and_continue_ignores_the_bad_free) {
  general_allocator::options o = debug_options();
  o.abort_on_error = false;
  const std::string text = capture_report(o, [](general_allocator& a) {
    void* p = a.allocate(48);
    a.free(p);
    a.free(p);  // reported, ignored
    void* q = a.allocate(48);
    void* r = a.allocate(48);
    EXPECT_NE(q, r);  // the double free did not put the block on the free list twice
    a.free(q);
    a.free(r);
  });
  EXPECT_NE(text.find("memkit: double free of 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("  freed again at:\n"), std::string::npos) << text;
}

TEST(general_allocator_debug, without_capture_the_report_says_so) {
  general_allocator::options o = debug_options();
  o.abort_on_error = false;
  o.capture_stack_traces = false;
  const std::string text = capture_report(o, [](general_allocator& a) {
    void* p = a.allocate(16);
    a.free(p);
    a.free(p);
  });
  EXPECT_NE(text.find("memkit: double free of 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("(stack traces not captured"), std::string::npos) << text;
}

TEST(general_allocator_debug, usable_size_is_the_requested_size_and_resize_keeps_the_canary) {
  general_allocator a(debug_options());
  auto* p = static_cast<char*>(a.allocate(10));
  EXPECT_EQ(a.usable_size(p), 10u);
  memkit::allocator& base = a;
  // 10 bytes + 16 of canary sit in a 32-byte block: growing to 16 fits, to 17 does not.
  ASSERT_TRUE(base.resize(p, 10, 16));
  EXPECT_EQ(a.usable_size(p), 16u);
  EXPECT_FALSE(base.resize(p, 16, 17));
  std::memset(p, 1, 16);  // all 16 bytes are usable: no canary report on free
  void* q = a.reallocate_unsized(p, 5000);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(a.usable_size(q), 5000u);
  a.free(q);
}

TEST(general_allocator_debug, never_reuse_addresses_retires_freed_blocks) {
  general_allocator::options o = debug_options();
  o.never_reuse_addresses = true;
  general_allocator a(o);
  void* first = a.allocate(64);
  a.free(first);
  std::vector<void*> later;
  for (int i = 0; i < 5000; ++i) {
    void* p = a.allocate(64);
    EXPECT_NE(p, first);
    later.push_back(p);
  }
  for (void* p : later) a.free(p);
  // Long after, the double free is still recognised.
  EXPECT_DEATH(a.free(first), "memkit: double free of 0x[0-9a-f]+ \\(block of 64 bytes\\)");
}

TEST(general_allocator_debug, leak_report_lists_each_live_block_with_its_trace) {
  std::size_t count = 0;
  const std::string text = capture_report(debug_options(), [&](general_allocator& a) {
    void* p = a.allocate(100);
    void* q = a.allocate(3000);
    void* big = a.allocate(std::size_t{1} << 20);
    void* freed = a.allocate(7);
    a.free(freed);
    count = a.report_leaks(a.current_options().report_fd);
    a.free(p);
    a.free(q);
    a.free(big);
    EXPECT_EQ(a.report_leaks(a.current_options().report_fd), 0u);
  });
  EXPECT_EQ(count, 3u);
  EXPECT_NE(text.find("memkit: leak of 100 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("memkit: leak of 3000 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("memkit: leak of 1048576 bytes at 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("  allocated at:\n    #0 0x"), std::string::npos) << text;
  EXPECT_NE(text.find("memkit: 3 leaks, 1051676 bytes in total"), std::string::npos) << text;
  EXPECT_EQ(text.find("leak of 7 bytes"), std::string::npos) << text;
}

TEST(general_allocator_debug, switching_debug_on_later_still_frees_older_blocks) {
  general_allocator a;
  void* before = a.allocate(100);
  a.configure(debug_options());
  void* after = a.allocate(100);
  EXPECT_EQ(a.usable_size(after), 100u);
  a.free(before);  // a release-mode block: freed normally
  a.free(after);
  EXPECT_DEATH(a.free(after), "memkit: double free");
}

TEST(general_allocator_debug, blocks_from_before_debug_mode_are_not_counted_as_leaks) {
  general_allocator::options plain;
  std::size_t count = 99;
  const std::string text = capture_report(plain, [&](general_allocator& a) {
    void* untracked = a.allocate(48);       // no records: allocated before debug mode
    void* untracked_large = a.allocate(std::size_t{1} << 20);
    general_allocator::options o = debug_options();
    o.report_fd = a.current_options().report_fd;
    a.configure(o);
    EXPECT_EQ(a.report_leaks(o.report_fd), 0u);  // nothing traceable leaked: no output at all
    void* leak = a.allocate(20);
    count = a.report_leaks(o.report_fd);
    a.free(leak);
    a.free(untracked);
    a.free(untracked_large);
  });
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(text.find("memkit: leak of 20 bytes at 0x"), 0u) << text;
  EXPECT_NE(text.find("memkit: 1 leaks, 20 bytes in total\n"), std::string::npos) << text;
  EXPECT_NE(text.find("memkit: not counted: 2 live blocks ("), std::string::npos) << text;
  EXPECT_EQ(text.find("no debug records"), std::string::npos) << text;
}

TEST(general_allocator_debug, quarantine_catches_a_double_free_after_other_allocations) {
  general_allocator a(debug_options());
  void* p = a.allocate(48);
  a.free(p);
  // Without a quarantine the next 48-byte block would be p itself, and freeing p again would free
  // that new block: the bug would go unseen.
  std::vector<void*> later;
  for (int i = 0; i < 100; ++i) later.push_back(a.allocate(48));
  for (void* q : later) EXPECT_NE(q, p);
  EXPECT_DEATH(a.free(p), "memkit: double free of 0x[0-9a-f]+ \\(block of 48 bytes\\)\n"
                          "  allocated at:.*first freed at:.*freed again at:");
  for (void* q : later) a.free(q);
}

TEST(general_allocator_debug, write_after_free_is_reported_when_the_block_leaves_the_quarantine) {
  general_allocator::options o = debug_options();
  o.quarantine_bytes = 4096;
  general_allocator a(o);
  auto* p = static_cast<char*>(a.allocate(100));
  a.free(p);
  p[0] = 1;  // use after free, even the first word (no free-list link while quarantined)
  auto churn = [&] {
    for (int i = 0; i < 100; ++i) a.free(a.allocate(200));  // pushes p out
  };
  EXPECT_DEATH(churn(), "memkit: use after free: the 100-byte block at 0x[0-9a-f]+ was written after it "
                        "was freed \\(byte 0 is 0x01, expected 0xdf\\)\n  allocated at:.*  freed at:\n    #0");
  p[0] = static_cast<char>(general_allocator::freed_fill_byte);
}

TEST(general_allocator_debug, leak_report_checks_the_blocks_still_in_quarantine) {
  general_allocator a(debug_options());
  auto* p = static_cast<char*>(a.allocate(64));
  a.free(p);
  p[9] = 'x';  // never reused before exit: found by the report the drop-in makes at exit
  EXPECT_DEATH((void)a.report_leaks(-1), "memkit: use after free: the 64-byte block at 0x[0-9a-f]+ was "
                                          "written after it was freed \\(byte 9 is 0x78");
  p[9] = static_cast<char>(general_allocator::freed_fill_byte);
}

TEST(general_allocator_debug, quarantine_is_bounded_and_can_be_turned_off) {
  general_allocator::options o = debug_options();
  o.quarantine_bytes = 64 << 10;
  general_allocator a(o);
  // Far more freed bytes than the quarantine holds: the oldest are reused, so the memory in use
  // stays bounded.
  for (int i = 0; i < 20000; ++i) a.free(a.allocate(1000));
  EXPECT_LT(a.statistics().live_bytes, std::size_t{128} << 10);
  a.purge();  // releases the quarantine
  EXPECT_EQ(a.statistics().live_bytes, 0u);
  o.quarantine_bytes = 0;
  a.configure(o);
  void* p = a.allocate(48);
  a.free(p);
  void* q = a.allocate(48);
  EXPECT_EQ(q, p);  // reused at once
  a.free(q);
}

TEST(general_allocator_debug, blocks_cross_threads_in_debug_mode) {
  general_allocator a(debug_options());
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) blocks.push_back(a.allocate(static_cast<std::size_t>(1 + i % 500)));
  std::thread([&] {
    for (void* p : blocks) a.free(p);
  }).join();
  EXPECT_EQ(a.report_leaks(-1), 0u);
  for (int i = 0; i < 1000; ++i) blocks[static_cast<std::size_t>(i)] = a.allocate(static_cast<std::size_t>(1 + i % 500));
  for (void* p : blocks) a.free(p);
}

}  // namespace
