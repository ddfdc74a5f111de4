// The heaps the leak-scan benchmarks build: flags, block sizes, contents and roots, shared by
// leak_scan.cpp (memkit's C++ API) and malloc_heap.cpp (plain malloc under a checker), so that both
// scan the same heap, block for block and word for word (same sizes, same seed, same draws).
// Header-only and free of memkit: malloc_heap.cpp must not link it.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace leak_scan_heap {

// --gib G --block B --repeat N --only NAME (pairs; anything else is ignored).
struct options {
  double gib = 1.0;
  std::size_t block = 4096;  // 0: blocks of 16-256 bytes, see block_sizes()
  int repeat = 3;
  std::string only;  // just that heap content
};

inline options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--gib") o.gib = std::atof(argv[i + 1]);
    else if (flag == "--block") o.block = static_cast<std::size_t>(std::atol(argv[i + 1]));
    else if (flag == "--repeat") o.repeat = std::atoi(argv[i + 1]);
    else if (flag == "--only") o.only = argv[i + 1];
  }
  return o;
}

// The size of every block, their sum at least --gib GiB (--block 0), or as many --block-byte
// blocks as fit in it. Small blocks: sizes 16-256 in steps of 16, the smaller ones likelier
// (about 80 bytes on average, as python3's objects with PYTHONMALLOC=malloc).
inline std::vector<std::size_t> block_sizes(const options& o, std::mt19937_64& random, std::size_t& allocated) {
  const auto total = static_cast<std::size_t>(o.gib * static_cast<double>(std::size_t{1} << 30));
  std::vector<std::size_t> sizes;
  allocated = 0;
  if (o.block == 0) {
    while (allocated < total) {
      std::size_t size = 16;
      while (size < 256 && random() % 16 < 11) size += 16 * (1 + random() % 3);
      size = std::min<std::size_t>(size, 256);
      sizes.push_back(size);
      allocated += size;
    }
  } else {
    sizes.assign(total / o.block, o.block);
    allocated = sizes.size() * o.block;
  }
  return sizes;
}

inline double gib_of(std::size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << 30);
}

// "live heap: ..." and `what` (how the heap is checked), one line.
inline void print_live_heap(const options& o, const std::vector<std::size_t>& sizes, std::size_t allocated,
                            const char* what) {
  const std::size_t count = sizes.size();
  if (o.block == 0) {
    std::printf("live heap: %zu blocks of 16-256 bytes (%.1f on average) = %.2f GiB (%s)\n", count,
                static_cast<double>(allocated) / static_cast<double>(count), gib_of(allocated), what);
  } else {
    std::printf("live heap: %zu blocks of %zu bytes = %.2f GiB (%s)\n", count, o.block, gib_of(allocated), what);
  }
}

// What a heap's words hold.
enum class fill { pointers, mixed, data };
// Which blocks the process still points to from outside the heap (the array of block addresses).
enum class roots { all, first, none };

struct content {
  const char* name;
  enum fill fill;
  enum roots roots;
};

// The seven heaps, in the order they are built and checked:
//   pointers   every word of every block points into another block (the most lookups a scan
//              can do; all blocks reachable from the array of block addresses)
//   mixed      one word in eight points into another block, the rest are numbers
//   data       blocks full of numbers that are not addresses (the scan's filter alone)
//   graph      the pointer heap with one root left (the first block's address): the rest is
//              reached through the blocks, as in a program's heap, not straight from the roots
//              (the few blocks no pointer reaches are lost and reported)
//   lost       the pointer heap with the root array cleared: every block lost, so the report
//              also classifies cliques, groups by stack and prints the groups
//   lostmixed  the mixed heap, every block lost: cliques of many sizes, most of them small
//   lostdata   the data heap, every block lost: every block a clique of its own
inline constexpr content contents[] = {
    {"pointers", fill::pointers, roots::all}, {"mixed", fill::mixed, roots::all},
    {"data", fill::data, roots::all},         {"graph", fill::pointers, roots::first},
    {"lost", fill::pointers, roots::none},    {"lostmixed", fill::mixed, roots::none},
    {"lostdata", fill::data, roots::none},
};

// Fills every block with `f`, drawing from `random` (addresses point anywhere inside a random block).
// Not inlined, so that its temporaries (block addresses) die with its frame, which scrub_stack()
// then clears, rather than linger in the frame of the caller that runs the check.
[[gnu::noinline]] inline void fill_blocks(enum fill f, const std::vector<void**>& blocks, const std::vector<std::size_t>& sizes,
                        std::mt19937_64& random) {
  const std::size_t count = blocks.size();
  auto any_address = [&]() -> void* {
    const std::size_t target = random() % count;
    return blocks[target] + random() % (sizes[target] / sizeof(void*));
  };
  auto number = [&](void** word) {  // a double, never an address
    const double value = static_cast<double>(random() % 1000000) * 0.25;
    std::memcpy(word, &value, sizeof value);
  };
  for (std::size_t i = 0; i < count; ++i) {
    void** b = blocks[i];
    const std::size_t words = sizes[i] / sizeof(void*);
    for (std::size_t w = 0; w < words; ++w) {
      if (f == fill::pointers || (f == fill::mixed && w % 8 == 0)) {  // mixed: as in a heap of small structs
        b[w] = any_address();
      } else {
        number(&b[w]);
      }
    }
  }
}

// Lost: the only copy of the block addresses is encoded, so no word of the process points to a
// block any more (but the first block's, when it is kept). restore() puts them back.
class hidden_roots {
 public:
  hidden_roots(std::vector<void**>& blocks, enum roots kept) : blocks_(blocks) {
    if (kept == roots::all) return;
    for (auto* b : blocks) hidden_.push_back(reinterpret_cast<std::uintptr_t>(b) ^ hide);
    std::fill(blocks.begin() + (kept == roots::first ? 1 : 0), blocks.end(), nullptr);
  }
  hidden_roots(const hidden_roots&) = delete;
  hidden_roots& operator=(const hidden_roots&) = delete;
  ~hidden_roots() {
    for (std::size_t i = 0; i < hidden_.size(); ++i) blocks_[i] = reinterpret_cast<void**>(hidden_[i] ^ hide);
  }

 private:
  static constexpr std::uintptr_t hide = 0xa5a5a5a5a5a5a5a5ull;
  std::vector<void**>& blocks_;
  std::vector<std::uintptr_t> hidden_;
};

// Zeroes the stack below the caller's frame and the registers a call may change: dead frames of
// the fill may hold addresses inside blocks, and the check's frames reuse those slots without
// writing all of them; the vector registers may still hold block addresses the fill or
// hidden_roots loaded (LeakSanitizer scans them). One such word turns a lost heap into a
// reachable one for a conservative scan (valgrind: "possibly lost").
[[gnu::noinline]] inline void scrub_stack() {
  char area[64 * 1024];
  std::memset(area, 0, sizeof area);
  asm volatile("" : : "r"(area) : "memory");  // the stores are kept
#if defined(__x86_64__)
  asm volatile(
      "xorl %%eax, %%eax\n\txorl %%ecx, %%ecx\n\txorl %%edx, %%edx\n\txorl %%esi, %%esi\n\t"
      "xorl %%edi, %%edi\n\txorl %%r8d, %%r8d\n\txorl %%r9d, %%r9d\n\txorl %%r10d, %%r10d\n\t"
      "xorl %%r11d, %%r11d\n\t"
      "pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1\n\tpxor %%xmm2, %%xmm2\n\tpxor %%xmm3, %%xmm3\n\t"
      "pxor %%xmm4, %%xmm4\n\tpxor %%xmm5, %%xmm5\n\tpxor %%xmm6, %%xmm6\n\tpxor %%xmm7, %%xmm7\n\t"
      "pxor %%xmm8, %%xmm8\n\tpxor %%xmm9, %%xmm9\n\tpxor %%xmm10, %%xmm10\n\tpxor %%xmm11, %%xmm11\n\t"
      "pxor %%xmm12, %%xmm12\n\tpxor %%xmm13, %%xmm13\n\tpxor %%xmm14, %%xmm14\n\tpxor %%xmm15, %%xmm15"
      :
      :
      : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",
        "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc");
#endif
}

// Builds each heap content in turn (all of them, or --only's) over the same blocks, and calls
// check(content) with the roots set as the content wants; restores the roots after each.
template <class Check>
void for_each_content(const options& o, std::vector<void**>& blocks, const std::vector<std::size_t>& sizes,
                      std::mt19937_64& random, Check check) {
  for (const content& c : contents) {
    if (!o.only.empty() && o.only != c.name) continue;
    fill_blocks(c.fill, blocks, sizes, random);
    hidden_roots hidden(blocks, c.roots);
    // Its vector, a live block, is kept in memory: in registers only, its address could be in a
    // callee-saved register that the check saves below the stack range it scans (memkit's
    // report_leaks does), and the block would be reported lost.
    asm volatile("" : : "r"(&hidden) : "memory");
    scrub_stack();
    check(c);
  }
}

inline double now_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The minimum and maximum of the repeats.
struct figures {
  double min = 1e30;
  double max = 0;
  void add(double v) {
    min = std::min(min, v);
    max = std::max(max, v);
  }
};

}  // namespace leak_scan_heap
