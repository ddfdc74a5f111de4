// memkit-leak-scan-bench: what debug mode's leak report costs per GiB of live heap.
//
// A private general_allocator in debug mode holds `--gib` GiB in blocks of `--block` bytes; the
// program then times report_leaks(), which scans the process's roots and every reachable block.
// Seven heaps (heap_shapes.hpp says what each holds), each in the same process one after the
// other: pointers, mixed, data, graph (one root left: reached through the blocks), and lost,
// lostmixed, lostdata (every block lost, so the report also classifies cliques, groups by stack
// and prints the groups).
// Prints seconds per GiB for each, the minimum and maximum of --repeat runs: the thread's CPU time
// (what the scan costs; a shared machine's wall clock adds the time other processes ran), split
// as the leak summary splits it into the scan and the report (grouping by stack, writing), and
// the wall clock.
//
// `--block 0` makes the heap of an interpreter instead: blocks of 16-256 bytes, most of them small
// (on average about 80 bytes, as python3's objects with PYTHONMALLOC=malloc), so per-block work,
// not per-word work, is what the figures show.
//
// malloc_heap.cpp builds the same heaps with plain malloc and times the peers' checks
// (LeakSanitizer, valgrind memcheck) and memkit's drop-in on them; tools/leak-scan-peers runs it.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "heap_shapes.hpp"
#include "memkit/general_allocator.hpp"

using namespace leak_scan_heap;

int main(int argc, char** argv) {
  const options o = parse_options(argc, argv);
  std::mt19937_64 random(42);
  std::size_t allocated = 0;
  const std::vector<std::size_t> sizes = block_sizes(o, random, allocated);
  const std::size_t count = sizes.size();
  const int null_fd = ::open("/dev/null", O_WRONLY);

  memkit::general_allocator::options ho;
  ho.debug = true;
  ho.report_fd = null_fd;
  memkit::general_allocator heap(ho);
  std::vector<void**> blocks(count);
  for (std::size_t i = 0; i < count; ++i) {
    void**& b = blocks[i];
    b = static_cast<void**>(heap.allocate(sizes[i]));
    if (b == nullptr) {
      std::fprintf(stderr, "out of memory\n");
      return 1;
    }
  }
  const double live_gib = gib_of(allocated);
  print_live_heap(o, sizes, allocated, "debug mode, stack traces on");

  for_each_content(o, blocks, sizes, random, [&](const content& c) {
    figures seconds;
    figures cpu;
    figures scan_cpu;     // of which the scan (marking)
    figures writing_cpu;  // and the grouping and writing of the report
    std::size_t lost_min = SIZE_MAX;
    std::size_t lost_max = 0;
    for (int r = 0; r < o.repeat; ++r) {
      const double start = now_seconds(CLOCK_MONOTONIC);
      const double start_cpu = now_seconds(CLOCK_THREAD_CPUTIME_ID);
      memkit::general_allocator::leak_summary summary;
      const std::size_t lost = heap.report_leaks(null_fd, summary);
      scan_cpu.add(static_cast<double>(summary.scan_cpu_ns) * 1e-9);
      writing_cpu.add(static_cast<double>(summary.writing_cpu_ns) * 1e-9);
      lost_min = std::min(lost_min, lost);
      lost_max = std::max(lost_max, lost);
      cpu.add(now_seconds(CLOCK_THREAD_CPUTIME_ID) - start_cpu);
      seconds.add(now_seconds(CLOCK_MONOTONIC) - start);
    }
    std::printf("%-9s CPU %.3f-%.3f s per GiB of live heap (scan %.3f-%.3f, report %.3f-%.3f), wall %.3f-%.3f s per "
                "GiB (%zu-%zu blocks reported lost)\n",
                c.name, cpu.min / live_gib, cpu.max / live_gib, scan_cpu.min / live_gib, scan_cpu.max / live_gib,
                writing_cpu.min / live_gib, writing_cpu.max / live_gib, seconds.min / live_gib, seconds.max / live_gib,
                lost_min, lost_max);
  });
  for (std::size_t i = 0; i < count; ++i) heap.deallocate(blocks[i], sizes[i]);
  return 0;
}
