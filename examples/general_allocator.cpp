// memkit::general_allocator in a few lines: a private allocator used like malloc and through the
// allocator interface, its statistics, and the debug mode's reports (shown here in
// report-and-continue mode, so the program keeps running after each report).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "memkit/general_allocator.hpp"

namespace {

// Functions with names of their own, so the stack traces below have something to show.
[[gnu::noinline]] char* make_greeting(memkit::general_allocator& heap) {
  auto* text = static_cast<char*>(heap.allocate(32));
  std::strcpy(text, "hello, general_allocator");
  return text;
}

[[gnu::noinline]] void release(memkit::general_allocator& heap, void* p) { heap.free(p); }

// Allocates a block and drops the only pointer to it. Out of line, so no copy of the pointer stays
// in main's frame or registers: the leak scan, conservative like LeakSanitizer's, would count such
// a copy as a reference and call the block still reachable.
[[gnu::noinline]] void lose_a_block(memkit::general_allocator& heap) {
  char* volatile lost = make_greeting(heap);  // not a tail call: the pointer dies in this frame
  (void)lost;
}
}  // namespace

int main() {
  // 1. Release mode: malloc-like use, sizes not needed to free, in-place growth.
  memkit::general_allocator heap;
  char* greeting = make_greeting(heap);
  std::printf("%s (usable size %zu)\n", greeting, heap.usable_size(greeting));
  greeting = static_cast<char*>(heap.reallocate_unsized(greeting, 4000));  // moves to a bigger class
  std::printf("after reallocate: %s\n", greeting);
  heap.free(greeting);

  // Standard containers through std_allocator.
  std::vector<int, memkit::std_allocator<int>> numbers{memkit::std_allocator<int>(heap)};
  for (int i = 0; i < 1000; ++i) numbers.push_back(i);

  const auto stats = heap.statistics();
  std::printf("live %zu bytes, %llu allocations, %llu frees\n", stats.live_bytes,
              static_cast<unsigned long long>(stats.allocations),
              static_cast<unsigned long long>(stats.frees));
  std::fflush(stdout);  // the allocator writes straight to the file descriptor
  heap.print_statistics(STDOUT_FILENO);

  // 2. Debug mode: each problem is reported in one line followed by stack traces. A program
  //    normally aborts on the first report (the default); this one continues to show them all.
  memkit::general_allocator::options options;
  options.debug = true;
  options.abort_on_error = false;
  options.report_fd = STDOUT_FILENO;
  memkit::general_allocator checked(options);
  std::fflush(stdout);

  char* block = make_greeting(checked);
  release(checked, block);
  release(checked, block);  // double free: allocation, first free and second free traces

  char* other = make_greeting(checked);
  release(checked, other + 4);  // interior pointer
  other[32] = '!';              // one byte past the end: the canary is overwritten
  release(checked, other);

  auto* buffer = static_cast<char*>(checked.allocate(100000));
  buffer[-1] = '!';  // one byte before the start: the guard before the block is overwritten
  release(checked, buffer);

  int on_stack = 0;
  release(checked, &on_stack);  // not from this allocator

  char* reused = make_greeting(checked);
  release(checked, reused);
  reused[10] = 'x';                        // written after free
  char* again = make_greeting(checked);    // detected when the block is handed out again
  release(checked, again);

  lose_a_block(checked);  // never freed
  const std::size_t leaks = checked.report_leaks(STDOUT_FILENO);
  std::printf("%zu leak(s) reported\n", leaks);
  return leaks == 1 ? 0 : 1;
}
