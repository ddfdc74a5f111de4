// memkit-leak-scan-bench: what debug mode's leak report costs per GiB of live heap.
//
// A private general_allocator in debug mode holds `--gib` GiB in blocks of `--block` bytes; the
// program then times report_leaks(), which scans the process's roots and every reachable block.
// Several heaps, each in the same process one after the other:
//   pointers   every word of every block points into another block (the most lookups a scan
//              can do; all blocks reachable from an array on the C heap)
//   mixed      one word in eight points into another block, the rest are numbers
//   data       blocks full of numbers that are not addresses (the scan's filter alone)
//   graph      the pointer heap with one root left (the first block's address): the rest is
//              reached through the blocks, as in a program's heap, not straight from the roots
//              (the few blocks no pointer reaches are lost and reported)
//   lost       the pointer heap with the root array cleared: every block lost, so the report
//              also classifies cliques, groups by stack and prints the groups
//   lostmixed  the mixed heap, every block lost: cliques of many sizes, most of them small
//   lostdata   the data heap, every block lost: every block a clique of its own
// Prints seconds per GiB for each, the minimum and maximum of --repeat runs: the thread's CPU time
// (what the scan costs; a shared machine's wall clock adds the time other processes ran) and
// the wall clock.
//
// `--block 0` makes the heap of an interpreter instead: blocks of 16-256 bytes, most of them small
// (on average about 80 bytes, as python3's objects with PYTHONMALLOC=malloc), so per-block work,
// not per-word work, is what the figures show.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memkit/general_allocator.hpp"

namespace {

double now_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct figures {
  double min = 1e30;
  double max = 0;
  void add(double v) {
    min = std::min(min, v);
    max = std::max(max, v);
  }
};

}  // namespace

int main(int argc, char** argv) {
  double gib = 1.0;
  std::size_t block = 4096;
  int repeat = 3;
  std::string only;  // --only NAME: just that heap content
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--gib") gib = std::atof(argv[i + 1]);
    else if (flag == "--block") block = static_cast<std::size_t>(std::atol(argv[i + 1]));
    else if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
    else if (flag == "--only") only = argv[i + 1];
  }
  const auto total = static_cast<std::size_t>(gib * static_cast<double>(std::size_t{1} << 30));
  std::mt19937_64 random(42);
  // Small blocks: sizes 16-256 in steps of 16, the smaller ones likelier (weight 1/size).
  std::vector<std::size_t> sizes;
  std::size_t allocated = 0;
  if (block == 0) {
    while (allocated < total) {
      std::size_t size = 16;
      while (size < 256 && random() % 16 < 11) size += 16 * (1 + random() % 3);
      size = std::min<std::size_t>(size, 256);
      sizes.push_back(size);
      allocated += size;
    }
  } else {
    sizes.assign(total / block, block);
    allocated = sizes.size() * block;
  }
  const std::size_t count = sizes.size();
  const int null_fd = ::open("/dev/null", O_WRONLY);

  memkit::general_allocator::options o;
  o.debug = true;
  o.report_fd = null_fd;
  memkit::general_allocator heap(o);
  std::vector<void**> blocks(count);
  for (std::size_t i = 0; i < count; ++i) {
    void**& b = blocks[i];
    b = static_cast<void**>(heap.allocate(sizes[i]));
    if (b == nullptr) {
      std::fprintf(stderr, "out of memory\n");
      return 1;
    }
  }
  const double live_gib = static_cast<double>(allocated) / static_cast<double>(std::size_t{1} << 30);
  if (block == 0) {
    std::printf("live heap: %zu blocks of 16-256 bytes (%.1f on average) = %.2f GiB (debug mode, stack traces on)\n",
                count, static_cast<double>(allocated) / static_cast<double>(count), live_gib);
  } else {
    std::printf("live heap: %zu blocks of %zu bytes = %.2f GiB (debug mode, stack traces on)\n", count, block, live_gib);
  }
  // An address inside a random block.
  auto any_address = [&]() -> void* {
    const std::size_t target = random() % count;
    return blocks[target] + random() % (sizes[target] / sizeof(void*));
  };

  enum class roots { all, first, none };
  auto run = [&](const char* name, auto fill, roots kept) {
    if (!only.empty() && only != name) return;
    for (std::size_t i = 0; i < count; ++i) fill(blocks[i], sizes[i] / sizeof(void*));
    // Lost: the only copy of the block addresses is encoded, so no word of the process points
    // to a block any more (but the first block's, when it is kept).
    constexpr std::uintptr_t hide = 0xa5a5a5a5a5a5a5a5ull;
    std::vector<std::uintptr_t> hidden;
    if (kept != roots::all) {
      for (auto* b : blocks) hidden.push_back(reinterpret_cast<std::uintptr_t>(b) ^ hide);
      std::fill(blocks.begin() + (kept == roots::first ? 1 : 0), blocks.end(), nullptr);
    }
    figures seconds;
    figures cpu;
    std::size_t lost_min = SIZE_MAX;
    std::size_t lost_max = 0;
    for (int r = 0; r < repeat; ++r) {
      const double start = now_seconds(CLOCK_MONOTONIC);
      const double start_cpu = now_seconds(CLOCK_THREAD_CPUTIME_ID);
      const std::size_t lost = heap.report_leaks(null_fd);
      lost_min = std::min(lost_min, lost);
      lost_max = std::max(lost_max, lost);
      cpu.add(now_seconds(CLOCK_THREAD_CPUTIME_ID) - start_cpu);
      seconds.add(now_seconds(CLOCK_MONOTONIC) - start);
    }
    for (std::size_t i = 0; i < hidden.size(); ++i) blocks[i] = reinterpret_cast<void**>(hidden[i] ^ hide);
    std::printf("%-9s CPU %.3f-%.3f s per GiB of live heap, wall %.3f-%.3f s per GiB (%zu-%zu blocks reported lost)\n",
                name, cpu.min / live_gib, cpu.max / live_gib, seconds.min / live_gib, seconds.max / live_gib, lost_min,
                lost_max);
  };
  auto pointers = [&](void** b, std::size_t words) {
    for (std::size_t w = 0; w < words; ++w) b[w] = any_address();
  };
  auto data = [&](void** b, std::size_t words) {
    for (std::size_t w = 0; w < words; ++w) {
      const double value = static_cast<double>(random() % 1000000) * 0.25;
      std::memcpy(&b[w], &value, sizeof value);
    }
  };
  auto mixed = [&](void** b, std::size_t words) {  // one word in eight an address, as in a heap of small structs
    for (std::size_t w = 0; w < words; ++w) {
      if (w % 8 == 0) {
        b[w] = any_address();
      } else {
        const double value = static_cast<double>(random() % 1000000) * 0.25;
        std::memcpy(&b[w], &value, sizeof value);
      }
    }
  };
  run("pointers", pointers, roots::all);
  run("mixed", mixed, roots::all);
  run("data", data, roots::all);
  run("graph", pointers, roots::first);
  run("lost", pointers, roots::none);
  run("lostmixed", mixed, roots::none);
  run("lostdata", data, roots::none);
  for (std::size_t i = 0; i < count; ++i) heap.deallocate(blocks[i], sizes[i]);
  return 0;
}
