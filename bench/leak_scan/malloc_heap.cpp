// memkit-leak-scan-malloc-heap: what a heap checker's leak check costs per GiB of live heap, for
// memkit's drop-in and the peers a user compares it with, each as the user meets it.
//
// The heaps of memkit-leak-scan-bench (heap_shapes.hpp: same flags, sizes, seed and contents),
// allocated with plain malloc, so that whatever malloc the process runs on holds them; then one leak
// check per --repeat, timed. The checker is found at run time:
//   memkit    memkit_malloc_report_leaks (dlsym): libmemkit_malloc.so preloaded in debug mode
//             (tools/memkit-run --debug -- PROGRAM); called with a descriptor to /dev/null
//   lsan      __lsan_do_recoverable_leak_check: this file built with clang++ -fsanitize=leak; its
//             report sent to /dev/null with __sanitizer_set_report_fd
//   valgrind  VALGRIND_DO_LEAK_CHECK under valgrind --tool=memcheck (--leak-check=full sets how
//             much it prints; its report goes to valgrind's log, --log-file)
// Every check prints its full report, as at exit: the printing is part of the work for each.
//
// Figures, per GiB of live heap, the minimum and maximum of the repeats:
//   CPU    the process's CPU time (CLOCK_PROCESS_CPUTIME_ID, every thread) plus the CPU time of
//          the child tasks it reaped meanwhile (getrusage RUSAGE_CHILDREN). LeakSanitizer's check
//          runs in a task that StopTheWorld clones with CLONE_VM but without CLONE_THREAD (it must
//          be out of the thread group to ptrace the threads; compiler-rt's
//          sanitizer_stoptheworld_linux_libcdep.cpp) and reaps with waitpid(__WALL): the scan's
//          CPU time is not the process's but lands in RUSAGE_CHILDREN; the process's own part is
//          the report it prints after the scan, and the calling thread's sched_yield spin until
//          the tracer stops it. Printed apart as "in child tasks". (The symbolizer LeakSanitizer
//          starts for its first report, llvm-symbolizer, lives to the end of the process, so its
//          CPU time is counted by neither; its wall time is.) memkit scans and reports on the
//          calling thread; valgrind's leak check runs in valgrind's core, which is this process:
//          for both the child part is zero.
//   wall   CLOCK_MONOTONIC around the call: what the user waits for (under valgrind the check is
//          native code, so CPU and wall agree on a quiet machine).
// The lost-block count: memkit's and LeakSanitizer's from one more check per heap, untimed,
// reported into a memory file and read back (memkit: definitely + indirectly lost from its
// summary line; LeakSanitizer: the allocations of its SUMMARY line); valgrind's from
// VALGRIND_COUNT_LEAK_BLOCKS after the last timed check (definitely + indirectly lost), with its
// possibly lost (blocks reached only through interior pointers) apart. --no-count skips the
// extra checks.
//
// Same work for every checker: the lost heaps must hold no address the process still keeps. The
// stack below the check is cleared of the fill's dead frames (heap_shapes.hpp); stdout's buffer is
// static, not a malloc block whose one-past-the-end pointer would be a heap block's address; and
// under valgrind the heap is moved from the low addresses where valgrind puts it, among numbers
// that look like pointers into it (see valgrind_heap_start; --low-heap leaves it there, as a
// user's program has it: the lost heaps then come out mostly "possibly lost").
//
//   memkit-leak-scan-malloc-heap [--gib G] [--block B] [--repeat N] [--only NAME] [--no-count]
//                                [--low-heap]
// tools/leak-scan-peers builds it for each checker, runs it and tabulates the figures.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <strings.h>
#include <utility>
#include <vector>

#include "heap_shapes.hpp"

#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define LEAK_SCAN_HAVE_VALGRIND 1
#else
#define LEAK_SCAN_HAVE_VALGRIND 0
#endif

// LeakSanitizer's interface, present when the program is built with -fsanitize=leak (or address).
extern "C" {
__attribute__((weak)) int __lsan_do_recoverable_leak_check();
__attribute__((weak)) void __sanitizer_set_report_fd(void* fd);
}

using namespace leak_scan_heap;

namespace {

enum class checker { memkit, lsan, valgrind };

using memkit_report_leaks = void (*)(int fd);

// CPU seconds so far: the process's own, and its reaped children's.
struct cpu_reading {
  double process = 0;
  double children = 0;
};

cpu_reading cpu_now() {
  cpu_reading r;
  r.process = now_seconds(CLOCK_PROCESS_CPUTIME_ID);
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  r.children = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
               static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  return r;
}

// MEMKIT_DEBUG as the drop-in reads it: outside debug mode its leak report is a page census.
bool memkit_debug_mode() {
  const char* value = std::getenv("MEMKIT_DEBUG");
  if (value == nullptr) return false;
  for (const char* on : {"1", "on", "yes", "true"}) {
    if (strcasecmp(value, on) == 0) return true;
  }
  return false;
}

// The end of the text written to `fd` so far (the last report's summary), NUL-terminated, in a
// static buffer; empties the file. No malloc: a block freed now could be reused, and a stale copy
// of its address stay on the stack, or its one-past-the-end address be a heap block's.
const char* take_report_tail(int fd) {
  static char tail[1 << 14];
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const off_t length = std::min<off_t>(size, sizeof tail - 1);
  const ssize_t n = length > 0 ? ::pread(fd, tail, static_cast<std::size_t>(length), size - length) : 0;
  tail[n > 0 ? n : 0] = '\0';
  if (::ftruncate(fd, 0) != 0) std::perror("ftruncate");
  ::lseek(fd, 0, SEEK_SET);
  return tail;
}

// The last occurrence of `what` in `text`, or nullptr.
const char* find_last(const char* text, const char* what) {
  const char* last = nullptr;
  for (const char* at = std::strstr(text, what); at != nullptr; at = std::strstr(at + 1, what)) last = at;
  return last;
}

// Makes the heap's blocks, sizes[i] bytes each, into `blocks`. Not inlined: the addresses it
// handles die with its frame, which scrub_stack() clears, rather than linger in main's.
[[gnu::noinline]] bool allocate_blocks(std::vector<void**>& blocks, const std::vector<std::size_t>& sizes) {
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    blocks[i] = static_cast<void**>(std::malloc(sizes[i]));
    if (blocks[i] == nullptr) return false;
  }
  return true;
}

// Where valgrind's heap goes unless --low-heap: 13.25 GiB. valgrind puts the client's heap low
// (from about 77 MiB up), where numbers every process keeps look like pointers into it: the ELF
// hashes of the symbol versions in the dynamic loader's tables (GLIBC_2.34 hashes to 0x69691b4,
// CXXABI_1.3 to 0x56bafd3); and just above a multiple of 4 GiB, two small 32-bit numbers side by
// side in the libraries' data (0x1'0000009a, found in valgrind's own preload library). One inside
// a block of a lost heap makes valgrind call that block, and every block it reaches, "possibly
// lost" (an interior pointer from the roots) instead of lost: other work than the other checkers
// do (found with valgrind's who_points_at). At 0x3'5000'0000 a false pointer would need a 32-bit
// number near 1.3 billion beside a 3.
constexpr std::uintptr_t valgrind_heap_start = std::uintptr_t{0x35} << 28;

// Maps every free range of 1 MiB or more below valgrind_heap_start, inaccessible and without
// memory behind it, so that the malloc's new pools land above.
std::vector<std::pair<void*, std::size_t>> reserve_low_addresses() {
  std::vector<std::pair<void*, std::size_t>> reserved;
  reserved.reserve(1 << 12);
  for (std::size_t length = std::size_t{1} << 30; length >= std::size_t{1} << 20 && reserved.size() < (1 << 12);) {
    void* p = ::mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      length /= 2;
    } else if (reinterpret_cast<std::uintptr_t>(p) + length > valgrind_heap_start) {
      ::munmap(p, length);
      length /= 2;
    } else {
      reserved.emplace_back(p, length);
    }
  }
  return reserved;
}

// Takes what is left below valgrind_heap_start in the malloc's existing pools, in the smallest
// blocks, chained through their first word; returns the chain. Gives up after 64 MiB of them (the
// address space was not all reserved): the heap then stays partly low.
void* fill_low_pools() {
  void* chain = nullptr;
  for (std::size_t n = 0;; ++n) {
    void* p = n < (std::size_t{1} << 22) ? std::malloc(16) : nullptr;
    if (p == nullptr || reinterpret_cast<std::uintptr_t>(p) >= valgrind_heap_start) {
      if (p == nullptr) std::fprintf(stderr, "valgrind: the heap could not be moved above %#zx\n",
                                     static_cast<std::size_t>(valgrind_heap_start));
      std::free(p);
      return chain;
    }
    *static_cast<void**>(p) = chain;
    chain = p;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // stdout's buffer would otherwise be a malloc block, and the FILE's pointer one past its end the
  // address of the next block of its size class: one of the heap's when --block is its size
  // (LeakSanitizer's allocator), which would make that block, and all it points to, reachable.
  static char stdout_buffer[1 << 12];
  std::setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
  // This program's own flags stand alone; the shared ones come in pairs.
  bool count_lost = true;
  bool reserve_low = true;
  int shared = 1;  // argv is compacted in place (a vector would be a malloc block)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-count") == 0) count_lost = false;
    else if (std::strcmp(argv[i], "--low-heap") == 0) reserve_low = false;
    else argv[shared++] = argv[i];
  }
  const options o = parse_options(shared, argv);
  const int null_fd = ::open("/dev/null", O_WRONLY);
  const int text_fd = ::memfd_create("leak-report", MFD_CLOEXEC);  // reports read back for the counts
  if (null_fd < 0 || text_fd < 0) {
    std::perror("open");
    return 1;
  }

  checker which{};
  const char* description = nullptr;
  auto memkit_report = reinterpret_cast<memkit_report_leaks>(dlsym(RTLD_DEFAULT, "memkit_malloc_report_leaks"));
  if (memkit_report != nullptr) {
    if (!memkit_debug_mode()) {
      std::fprintf(stderr, "memkit's drop-in is preloaded but not in debug mode: run under tools/memkit-run --debug\n");
      return 2;
    }
    which = checker::memkit;
    description = "memkit: memkit_malloc_report_leaks of the preloaded libmemkit_malloc.so, debug mode";
  } else if (__lsan_do_recoverable_leak_check != nullptr) {
    which = checker::lsan;
    description = "LeakSanitizer: __lsan_do_recoverable_leak_check";
    if (__sanitizer_set_report_fd != nullptr) __sanitizer_set_report_fd(reinterpret_cast<void*>(std::intptr_t{null_fd}));
#if LEAK_SCAN_HAVE_VALGRIND
  } else if (RUNNING_ON_VALGRIND) {
    which = checker::valgrind;
    description = "valgrind memcheck: VALGRIND_DO_LEAK_CHECK";
#endif
  } else {
    std::fprintf(stderr,
                 "no leak checker: run this program under one of\n"
                 "  tools/memkit-run --debug -- %s ...   (memkit's drop-in)\n"
                 "  valgrind --tool=memcheck --leak-check=full %s ...%s\n"
                 "or build it with clang++ -fsanitize=leak (LeakSanitizer)\n",
                 argv[0], argv[0],
                 LEAK_SCAN_HAVE_VALGRIND ? "" : "   (not in this build: it had no <valgrind/memcheck.h>)");
    return 2;
  }
  std::printf("checker: %s\n", description);

  // The draws and sizes of memkit-leak-scan-bench, block for block.
  std::mt19937_64 random(42);
  std::size_t allocated = 0;
  const std::vector<std::size_t> sizes = block_sizes(o, random, allocated);
  const std::size_t count = sizes.size();
  std::vector<void**> blocks(count);
  // Under valgrind, the heap goes high unless --low-heap (see valgrind_heap_start); the address
  // space and pool space taken for that are given back once the blocks are made.
  std::vector<std::pair<void*, std::size_t>> reserved;
  void* fillers = nullptr;
  if (which == checker::valgrind && reserve_low) {
    reserved = reserve_low_addresses();
    fillers = fill_low_pools();
  }
  if (!allocate_blocks(blocks, sizes)) {
    std::fprintf(stderr, "out of memory\n");
    return 1;
  }
  for (const auto& [address, length] : reserved) ::munmap(address, length);
  while (fillers != nullptr) {
    void* next = *static_cast<void**>(fillers);
    std::free(fillers);
    fillers = next;
  }
  const double live_gib = gib_of(allocated);
  print_live_heap(o, sizes, allocated, "malloc");
  std::fflush(stdout);

  // One leak check; true when the checker says it found leaks (memkit's says nothing: false).
  auto check = [&](int fd) -> bool {
    switch (which) {
      case checker::memkit:
        memkit_report(fd);
        return false;
      case checker::lsan:
        return __lsan_do_recoverable_leak_check() != 0;
      case checker::valgrind:
#if LEAK_SCAN_HAVE_VALGRIND
        VALGRIND_DO_LEAK_CHECK;
#endif
        return false;
    }
    return false;
  };

  for_each_content(o, blocks, sizes, random, [&](const content& c) {
    figures cpu;
    figures seconds;
    figures children;
    for (int r = 0; r < o.repeat; ++r) {
      const double start = now_seconds(CLOCK_MONOTONIC);
      const cpu_reading start_cpu = cpu_now();
      check(null_fd);
      const cpu_reading end_cpu = cpu_now();
      seconds.add(now_seconds(CLOCK_MONOTONIC) - start);
      cpu.add(end_cpu.process - start_cpu.process + end_cpu.children - start_cpu.children);
      children.add(end_cpu.children - start_cpu.children);
    }
    // What the checker found, in its own terms.
    char found[160] = "lost blocks not counted";
    if (which == checker::valgrind) {
#if LEAK_SCAN_HAVE_VALGRIND
      unsigned long leaked = 0, dubious = 0, reachable = 0, suppressed = 0;
      VALGRIND_COUNT_LEAK_BLOCKS(leaked, dubious, reachable, suppressed);
      (void)suppressed;  // no suppressions here
      std::snprintf(found, sizeof found, "%lu blocks reported lost, %lu possibly lost, %lu reachable", leaked,
                    dubious, reachable);
#endif
    } else if (count_lost) {
      long long lost = -1;
      if (which == checker::memkit) {
        check(text_fd);
        const char* at = find_last(take_report_tail(text_fd), "leak summary: ");
        long long definitely = 0;
        long long indirectly = 0;
        if (at == nullptr) {
          lost = 0;  // no summary: nothing lost
        } else if (std::sscanf(at,
                               "leak summary: definitely lost: %*u bytes in %lld blocks; indirectly lost: %*u bytes "
                               "in %lld blocks",
                               &definitely, &indirectly) == 2) {
          lost = definitely + indirectly;
        }
      } else {
        if (__sanitizer_set_report_fd != nullptr) {
          __sanitizer_set_report_fd(reinterpret_cast<void*>(std::intptr_t{text_fd}));
        }
        const bool leaks = check(text_fd);
        if (__sanitizer_set_report_fd != nullptr) {
          __sanitizer_set_report_fd(reinterpret_cast<void*>(std::intptr_t{null_fd}));
        }
        const char* at = find_last(take_report_tail(text_fd), "SUMMARY: LeakSanitizer: ");
        long long allocations = 0;
        if (!leaks) {
          lost = 0;
        } else if (at != nullptr &&
                   std::sscanf(at, "SUMMARY: LeakSanitizer: %*u byte(s) leaked in %lld allocation(s)",
                               &allocations) == 1) {
          lost = allocations;
        }
      }
      if (lost >= 0) std::snprintf(found, sizeof found, "%lld blocks reported lost", lost);
      else std::snprintf(found, sizeof found, "lost blocks: no count in the report");
    }
    std::printf("%-9s CPU %.3f-%.3f s per GiB of live heap, wall %.3f-%.3f s per GiB (%s; CPU in child tasks "
                "%.3f-%.3f s per GiB)\n",
                c.name, cpu.min / live_gib, cpu.max / live_gib, seconds.min / live_gib, seconds.max / live_gib,
                found, children.min / live_gib, children.max / live_gib);
    std::fflush(stdout);
  });
  // Nothing left for the checker's own check at exit.
  for (std::size_t i = 0; i < count; ++i) std::free(blocks[i]);
  return 0;
}
