// Suite "malloc-workloads" (issue 4): the allocation patterns general-purpose allocator benchmarks
// use, each run in a child process on every malloc peer by LD_PRELOAD (glibc at its defaults and
// tuned, jemalloc, mimalloc, tcmalloc and memkit's drop-in), and on memkit's C++ API linked
// directly. Each is measured as wall time of the workload, peak RSS net of the process's baseline
// and minor page faults, except producer-consumer, which runs for a fixed time and is measured in
// frees per second (reported as time per free).
//
// Allocator state changes results (glibc's mmap threshold moves after the first large free; caches
// and thread heaps fill), so every workload runs in a warm process, after a warm-up phase that is
// the same for every allocator (see warm_up), and that is the figure quoted against the targets.
// The same workload in a fresh process is kept beside it as information (fewer repetitions).
//
//   larson             server churn: threads replace random blocks in their own arrays; every
//                      epoch, new threads take over the arrays (and free what dead threads
//                      allocated), as in Larson and Krishnan's benchmark
//   producer-consumer  follows xmalloc-test (Lever and Boreham, as mimalloc-bench runs it with
//                      -w 2 -s 64): writers allocate 64-byte blocks and hand them in batches of
//                      4096 to readers that free them (every free is a cross-thread free)
//   glibc-simple       follows glibc's bench-malloc-simple (mimalloc-bench's glibc-simple): one
//                      thread allocates and frees n small blocks at a time in a tight loop
//   random-lifetimes   many small objects of random sizes (mostly tiny, some large) replaced at
//                      random, so lifetimes are random and the heap fragments
//   realloc-strings    dozens of strings grown in turns by small appends, realloc on each
//   large              64 KiB..8 MiB blocks, every page written, a few alive at a time
//   false-sharing      objects handed to threads that free them and then allocate and write
//                      small objects hard (Hoard's cache-scratch): an allocator that lets two
//                      threads' objects share a cache line shows it here
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "measure.hpp"
#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"
#include "peers.hpp"
#include "suite.hpp"

namespace memkit::bench {
namespace {

// ---- heaps -------------------------------------------------------------------------------------

// Whatever malloc the process runs on.
struct c_heap {
  static void* allocate(std::size_t n) noexcept { return std::malloc(n); }
  static void release(void* p, std::size_t) noexcept { std::free(p); }
  static void* grow(void* p, std::size_t, std::size_t n) noexcept { return std::realloc(p, n); }
};

// memkit's C++ API: sized deallocate and reallocate of the allocator interface.
struct memkit_heap {
  static general_allocator& heap() noexcept { return general_allocator::global(); }
  static void* allocate(std::size_t n) noexcept { return heap().allocate(n); }
  static void release(void* p, std::size_t n) noexcept { heap().deallocate(p, n); }
  static void* grow(void* p, std::size_t old_size, std::size_t n) noexcept {
    return heap().reallocate(p, old_size, old_size, n);
  }
};

// splitmix64: fast, good enough, the same sequence for every allocator.
struct random_source {
  std::uint64_t state;
  explicit random_source(std::uint64_t seed) noexcept : state(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t bound) noexcept { return static_cast<std::size_t>(next() % bound); }
  std::size_t between(std::size_t low, std::size_t high) noexcept { return low + below(high - low + 1); }
};

[[noreturn]] void out_of_memory() {
  std::fprintf(stderr, "malloc-workloads: allocation failed\n");
  std::_Exit(3);
}

template <class Heap>
void* must_allocate(std::size_t n) {
  void* p = Heap::allocate(n);
  if (p == nullptr) out_of_memory();
  return p;
}

// ---- workloads (scale: 1 = the quick profile) -------------------------------------------------

// What a workload reports: nothing for those measured as the child's time of the whole call; its
// own time and operation count for those that run for a fixed time and count what they did.
struct outcome {
  double ns = 0;
  std::uint64_t operations = 0;
};

template <class Heap>
outcome larson(double scale) {
  constexpr int threads = 4;
  constexpr std::size_t slots = 4000;
  const int epochs = 4;
  const auto operations = static_cast<std::size_t>(250000 * scale);  // per thread per epoch
  struct block {
    void* p = nullptr;
    std::size_t size = 0;
  };
  std::vector<std::vector<block>> arrays(threads, std::vector<block>(slots));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t, epoch] {
        random_source random(static_cast<std::uint64_t>(epoch * threads + t + 1));
        auto& mine = arrays[static_cast<std::size_t>(t)];
        for (std::size_t i = 0; i < operations; ++i) {
          block& b = mine[random.below(slots)];
          if (b.p != nullptr) Heap::release(b.p, b.size);
          b.size = random.between(16, 512);
          b.p = must_allocate<Heap>(b.size);
          static_cast<unsigned char*>(b.p)[0] = static_cast<unsigned char>(i);
        }
      });
    }
    for (auto& w : workers) w.join();  // the next epoch's threads inherit (and free) the blocks
  }
  for (auto& array : arrays)
    for (auto& b : array)
      if (b.p != nullptr) Heap::release(b.p, b.size);
  return {};
}

// Follows xmalloc-test (Lever and Boreham, "malloc() Performance in a Multithreaded Linux
// Environment", USENIX 2000; as run by mimalloc-bench with -w 2 -t 5 -s 64): writer threads
// allocate fixed-size blocks, write their first bytes and hand them over in batches through one
// shared, bounded stack to as many reader threads, which free them. It runs for a fixed time and
// counts frees: every block is freed by a thread other than the one that allocated it, and so is
// every batch record.
template <class Heap>
outcome producer_consumer(double scale) {
  constexpr int writers = 2;  // and as many readers
  constexpr std::size_t block_size = 64;
  constexpr std::size_t per_batch = 4096;
  constexpr std::size_t queued_limit = 100;  // batches waiting; writers block beyond it
  // -t 5 in the published runs; scaled down for the quick (3 s) and smoke (0.5 s) profiles.
  const double seconds = std::min(5.0, std::max(0.5, 3.0 * scale));
  struct batch {
    batch* next;
    void* blocks[per_batch];
  };
  struct alignas(64) counter {
    std::uint64_t frees = 0;
  };
  batch* stack = nullptr;  // the most recent batch is taken first, as in the published program
  std::size_t queued = 0;
  std::mutex mutex;
  std::condition_variable not_full, not_empty;
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> corrupted{0};
  counter counts[writers];

  auto writer = [&] {
    std::uint64_t round = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      auto* b = static_cast<batch*>(must_allocate<Heap>(sizeof(batch)));
      for (std::size_t i = 0; i < per_batch; ++i) {
        void* p = must_allocate<Heap>(block_size);
        std::memset(p, static_cast<int>((round + i) & 0xff), block_size);
        b->blocks[i] = p;
      }
      ++round;
      std::unique_lock lock(mutex);
      not_full.wait(lock, [&] { return queued < queued_limit || stop.load(std::memory_order_relaxed); });
      b->next = stack;
      stack = b;
      ++queued;
      not_empty.notify_one();
    }
  };
  auto reader = [&](int id) {
    for (;;) {
      batch* b;
      {
        std::unique_lock lock(mutex);
        not_empty.wait(lock, [&] { return stack != nullptr || stop.load(std::memory_order_relaxed); });
        if (stack == nullptr) return;
        if (stop.load(std::memory_order_relaxed)) return;  // what is left is freed untimed
        b = stack;
        stack = b->next;
        --queued;
        not_full.notify_one();
      }
      for (std::size_t i = 0; i < per_batch; ++i) {
        auto* p = static_cast<unsigned char*>(b->blocks[i]);
        if (p[0] != p[block_size - 1]) corrupted.fetch_add(1, std::memory_order_relaxed);
        Heap::release(p, block_size);
      }
      Heap::release(b, sizeof(batch));
      counts[id].frees += per_batch;
    }
  };
  const auto start = clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < writers; ++i) {
    threads.emplace_back(reader, i);
    threads.emplace_back(writer);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  {
    std::lock_guard lock(mutex);
    stop.store(true, std::memory_order_relaxed);
  }
  not_full.notify_all();
  not_empty.notify_all();
  for (auto& t : threads) t.join();
  const double ns = nanoseconds(start, clock::now());
  std::uint64_t frees = 0;
  for (auto& c : counts) frees += c.frees;
  while (stack != nullptr) {
    batch* b = stack;
    stack = b->next;
    for (void* p : b->blocks) Heap::release(p, block_size);
    Heap::release(b, sizeof(batch));
  }
  if (corrupted.load() != 0) {
    std::fprintf(stderr, "malloc-workloads: %zu corrupted blocks\n", corrupted.load());
    std::_Exit(4);
  }
  return {ns, frees};
}

// Follows glibc's bench-malloc-simple (as run by mimalloc-bench's glibc-simple): one thread
// allocates n blocks of one small size, writes every word of them and frees them in allocation
// order, for n = 25, 100, 400 and 1600 and sizes 16, 32 and 64 bytes; on the main thread, then on
// a new thread, then on the main thread again (where glibc no longer takes its single-thread
// shortcuts). Measured as time.
template <class Heap>
outcome small_loop(double scale) {
  constexpr std::size_t max_live = 1600;
  const auto pairs = static_cast<std::size_t>(500000 * scale);  // per (size, n) and pass
  void** live = static_cast<void**>(must_allocate<Heap>(max_live * sizeof(void*)));
  auto pass = [&](std::size_t size) {
    for (std::size_t n : {std::size_t{25}, std::size_t{100}, std::size_t{400}, max_live}) {
      for (std::size_t round = 0, rounds = pairs / n; round < rounds; ++round) {
        for (std::size_t i = 0; i < n; ++i) {
          auto* words = static_cast<std::uint32_t*>(must_allocate<Heap>(size));
          for (std::size_t w = 0; w < size / sizeof(std::uint32_t); ++w) words[w] = static_cast<std::uint32_t>(w);
          live[i] = words;
        }
        for (std::size_t i = 0; i < n; ++i) Heap::release(live[i], size);
      }
    }
  };
  for (std::size_t size : {std::size_t{16}, std::size_t{32}, std::size_t{64}}) {
    pass(size);
    std::thread([&] { pass(size); }).join();
    pass(size);
  }
  Heap::release(live, max_live * sizeof(void*));
  return {};
}

template <class Heap>
outcome random_lifetimes(double scale) {
  constexpr std::size_t live = 50000;
  const auto operations = static_cast<std::size_t>(2000000 * scale);
  random_source random(7);
  struct block {
    void* p = nullptr;
    std::size_t size = 0;
  };
  std::vector<block> blocks(live);
  auto pick_size = [&] {
    std::size_t bucket = random.below(100);
    if (bucket < 85) return random.between(8, 128);
    if (bucket < 99) return random.between(129, 2048);
    return random.between(2049, 32768);
  };
  for (std::size_t i = 0; i < operations; ++i) {
    block& b = blocks[random.below(live)];
    if (b.p != nullptr) Heap::release(b.p, b.size);
    b.size = pick_size();
    auto* p = static_cast<unsigned char*>(must_allocate<Heap>(b.size));
    p[0] = 1;
    p[b.size - 1] = 1;
    b.p = p;
  }
  for (auto& b : blocks)
    if (b.p != nullptr) Heap::release(b.p, b.size);
  return {};
}

template <class Heap>
outcome realloc_strings(double scale) {
  constexpr std::size_t strings = 64;
  const auto appends = static_cast<std::size_t>(2000000 * scale);
  random_source random(11);
  struct text {
    char* data = nullptr;
    std::size_t length = 0;
    std::size_t target = 0;
  };
  std::vector<text> texts(strings);
  for (auto& t : texts) t.target = random.between(64, 16384);
  for (std::size_t i = 0; i < appends; ++i) {
    text& t = texts[i % strings];
    const std::size_t chunk = random.between(1, 24);
    // Naive C string building: exactly as many bytes as needed, realloc on every append.
    void* grown = Heap::grow(t.data, t.length + (t.data != nullptr ? 1 : 0), t.length + chunk + 1);
    if (grown == nullptr) out_of_memory();
    t.data = static_cast<char*>(grown);
    std::memset(t.data + t.length, 'a' + static_cast<int>(i % 26), chunk);
    t.length += chunk;
    t.data[t.length] = '\0';
    if (t.length >= t.target) {
      do_not_optimize(t.data[t.length / 2]);
      Heap::release(t.data, t.length + 1);
      t = text{nullptr, 0, random.between(64, 16384)};
    }
  }
  for (auto& t : texts)
    if (t.data != nullptr) Heap::release(t.data, t.length + 1);
  return {};
}

template <class Heap>
outcome large(double scale) {
  constexpr std::size_t window = 8;
  const auto operations = static_cast<std::size_t>(600 * scale);
  const std::size_t page = os::page_size();
  random_source random(13);
  struct block {
    unsigned char* p = nullptr;
    std::size_t size = 0;
  };
  block blocks[window];
  for (std::size_t i = 0; i < operations; ++i) {
    block& b = blocks[random.below(window)];
    if (b.p != nullptr) Heap::release(b.p, b.size);
    // Log-uniform between 64 KiB and 8 MiB.
    const double exponent = 16 + 7 * (static_cast<double>(random.below(1 << 20)) / (1 << 20));
    b.size = static_cast<std::size_t>(std::exp2(exponent));
    b.p = static_cast<unsigned char*>(must_allocate<Heap>(b.size));
    for (std::size_t offset = 0; offset < b.size; offset += page) b.p[offset] = 1;
  }
  for (auto& b : blocks)
    if (b.p != nullptr) Heap::release(b.p, b.size);
  return {};
}

template <class Heap>
outcome false_sharing(double scale) {
  constexpr int threads = 4;
  constexpr std::size_t object_size = 8;
  constexpr int writes = 200;
  const auto rounds = static_cast<std::size_t>(40000 * scale);
  // Allocated back to back by one thread, so an allocator may put them in one cache line...
  std::vector<void*> handed(threads);
  for (auto& p : handed) p = must_allocate<Heap>(object_size);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // ...then each thread frees its object and allocates its own: an allocator that reuses the
      // freed slot on the freeing thread makes the threads write to one line.
      Heap::release(handed[static_cast<std::size_t>(t)], object_size);
      for (std::size_t r = 0; r < rounds; ++r) {
        auto* p = static_cast<volatile unsigned char*>(must_allocate<Heap>(object_size));
        for (int w = 0; w < writes; ++w) p[w % object_size] = static_cast<unsigned char>(p[0] + 1);
        Heap::release(const_cast<unsigned char*>(p), object_size);
      }
    });
  }
  for (auto& w : workers) w.join();
  return {};
}

// The warm-up phase a warm process runs before its workload, the same for every allocator: on the
// main thread, 100,000 x scale random replacements in 10,000 slots (90% 8..512 B, 9.8% up to
// 64 KiB, 0.2% 64 KiB..2 MiB; the first and last byte of each written), then
// a small-block churn on two threads at once (so the allocator has seen threads, and glibc has
// left its single-thread shortcuts), then everything freed but every fourth small block, which
// stays alive through the workload as a long-running program's data would (leaving the heap
// fragmented). About a tenth of a second: small beside the workloads it precedes.
template <class Heap>
struct warm_up {
  struct block {
    void* p = nullptr;
    std::size_t size = 0;
  };
  std::vector<block> kept;

  explicit warm_up(double scale) {
    constexpr std::size_t slots = 10000;
    const auto operations = static_cast<std::size_t>(100000 * scale);
    std::vector<block> blocks(slots);
    random_source random(17);
    auto pick_size = [](random_source& r) {
      const std::size_t bucket = r.below(1000);
      if (bucket < 900) return r.between(8, 512);
      if (bucket < 998) return r.between(513, 65536);
      return r.between(65537, 2u << 20);
    };
    for (std::size_t i = 0; i < operations; ++i) {
      block& b = blocks[random.below(slots)];
      if (b.p != nullptr) Heap::release(b.p, b.size);
      b.size = pick_size(random);
      auto* p = static_cast<unsigned char*>(must_allocate<Heap>(b.size));
      p[0] = 1;
      p[b.size - 1] = 1;
      b.p = p;
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        random_source mine(static_cast<std::uint64_t>(100 + t));
        std::vector<block> local(2000);
        for (std::size_t i = 0; i < operations / 4; ++i) {
          block& b = local[mine.below(local.size())];
          if (b.p != nullptr) Heap::release(b.p, b.size);
          b.size = mine.between(8, 512);
          b.p = must_allocate<Heap>(b.size);
          static_cast<unsigned char*>(b.p)[0] = 1;
        }
        for (auto& b : local)
          if (b.p != nullptr) Heap::release(b.p, b.size);
      });
    }
    for (auto& t : threads) t.join();
    std::size_t small = 0;
    for (auto& b : blocks) {
      if (b.p == nullptr) continue;
      if (b.size <= 512 && small++ % 4 == 0) kept.push_back(b);
      else Heap::release(b.p, b.size);
    }
  }
  ~warm_up() {
    for (auto& b : kept) Heap::release(b.p, b.size);
  }
  warm_up(const warm_up&) = delete;
  warm_up& operator=(const warm_up&) = delete;
};

// Runs `function` (a workload on Heap) in this process, after the warm-up when `warm`, and prints
// what it measured.
template <class Heap>
void measure_in_process(outcome (*function)(double), double scale, bool warm, bool counted) {
  const double process_baseline = resident_bytes();  // the runner's own pages, before any work
  std::optional<warm_up<Heap>> history;
  if (warm) history.emplace(scale);
  memory_phase memory = begin_memory_phase();
  const auto start = clock::now();
  const outcome result = function(scale);
  const double ns = result.ns > 0 ? result.ns : nanoseconds(start, clock::now());
  end_memory_phase(memory);
  std::printf("ns=%.0f\npeak_rss=%.0f\npeak_rss_growth=%.0f\nminor_faults=%.0f\nbaseline_rss=%.0f\n"
              "peak_is_phase_own=%d\n",
              ns, memory.peak_over(process_baseline), memory.growth(), memory.minor_faults, process_baseline,
              memory.peak_is_phase_own ? 1 : 0);
  if (counted) std::printf("operations=%llu\n", static_cast<unsigned long long>(result.operations));
}

struct workload {
  const char* name;
  const char* parameters;
  outcome (*with_malloc)(double);
  outcome (*with_memkit)(double);
  void (*measure_malloc)(outcome (*)(double), double, bool, bool);
  void (*measure_memkit)(outcome (*)(double), double, bool, bool);
  const char* counted;  // what a fixed-time workload counts ("free"); null: measured as time
};

#define MEMKIT_WORKLOAD(name, parameters, function, counted) \
  workload { name, parameters, function<c_heap>, function<memkit_heap>, measure_in_process<c_heap>, \
             measure_in_process<memkit_heap>, counted }

const workload workloads[] = {
    MEMKIT_WORKLOAD("larson", "4 threads x 4 epochs, 4000 slots each, 16..512 B", larson, nullptr),
    MEMKIT_WORKLOAD("producer-consumer",
                    "xmalloc-test -w 2 -s 64: 2 writers, 2 readers, batches of 4096, 3 s (smoke 0.5 s, "
                    "full 5 s)",
                    producer_consumer, "free"),
    MEMKIT_WORKLOAD("glibc-simple", "one thread, n = 25..1600 blocks of 16, 32, 64 B, FIFO frees",
                    small_loop, nullptr),
    MEMKIT_WORKLOAD("random-lifetimes", "50000 live, 8 B..32 KiB (85% <= 128 B)", random_lifetimes, nullptr),
    MEMKIT_WORKLOAD("realloc-strings", "64 strings, appends of 1..24 B up to 16 KiB", realloc_strings, nullptr),
    MEMKIT_WORKLOAD("large", "8 live, 64 KiB..8 MiB, every page written", large, nullptr),
    MEMKIT_WORKLOAD("false-sharing", "4 threads, 8 B objects, 200 writes each", false_sharing, nullptr),
};

// Child: `WORKLOAD malloc|memkit SCALE fresh|warm` prints ns=, peak_rss= (net of the process's
// baseline before any work), peak_rss_growth= (net of the resident size when the workload began),
// minor_faults= and, for fixed-time workloads, operations=.
int child(const std::vector<std::string>& args) {
  if (args.size() != 4 || (args[3] != "fresh" && args[3] != "warm")) {
    std::fprintf(stderr, "malloc-workloads child: expected 'WORKLOAD malloc|memkit SCALE fresh|warm'\n");
    return 2;
  }
  const double scale = std::strtod(args[2].c_str(), nullptr);
  const bool warm = args[3] == "warm";
  for (auto& w : workloads) {
    if (args[0] != w.name) continue;
    if (args[1] == "memkit") w.measure_memkit(w.with_memkit, scale, warm, w.counted != nullptr);
    else w.measure_malloc(w.with_malloc, scale, warm, w.counted != nullptr);
    return 0;
  }
  std::fprintf(stderr, "malloc-workloads child: unknown workload '%s'\n", args[0].c_str());
  return 2;
}

struct subject {
  std::string name;
  std::string mode;
  std::vector<std::string> environment;
  bool available = true;
  std::string missing_note;
};

double geometric_mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += std::log(v);
  return values.empty() ? 0 : std::exp(sum / static_cast<double>(values.size()));
}

// The repetitions of one subject on one workload in one kind of process.
struct cell {
  std::vector<double> time, rss, growth, faults;  // time: ns, or ns per counted operation
  std::string failure;
  bool measured() const noexcept { return failure.empty() && !time.empty(); }
};

// peer / memkit of a quantity over the workloads both completed: the geometric mean of the
// medians' ratios, and of the extreme ratios (peer's lowest over memkit's highest, the reverse).
struct ratio_spread {
  double value = 0, low = 0, high = 0;
  std::size_t workloads = 0;
};

void run(context& ctx) {
  const double scale = ctx.pick(0.02, 1.0, 4.0);
  const int warm_repetitions = ctx.pick(1, 5, 7);
  // Fresh processes are information only: one per cell in the quick profile, and none for
  // producer-consumer, which runs for a fixed time and so spends almost all of it in its steady
  // state whatever state it started from.
  const int fresh_repetitions = ctx.pick(1, 1, 3);
  const malloc_peer dropin_peer = memkit_malloc();

  std::vector<subject> subjects;
  for (auto& peer : malloc_peers()) {
    subjects.push_back({peer.name, "malloc", peer.environment(), peer.installed, "not installed"});
    if (peer.name == "glibc") {
      const malloc_peer tuned = glibc_tuned();
      subjects.push_back({tuned.name, "malloc", tuned.environment(), tuned.installed, ""});
    }
  }
  subjects.push_back({dropin_peer.name, "malloc", dropin_peer.environment(), dropin_peer.installed,
                      "libmemkit_malloc.so not built"});
  subjects.push_back({"memkit (C++ API)", "memkit", {}, true, ""});

  const std::size_t workload_count = std::size(workloads);
  const char* const processes[] = {"warm", "fresh"};
  // cells[process][subject][workload]
  std::vector<std::vector<std::vector<cell>>> cells(
      2, std::vector<std::vector<cell>>(subjects.size(), std::vector<cell>(workload_count)));
  std::size_t step = 0;
  const std::size_t steps = workload_count * subjects.size() *
                            static_cast<std::size_t>(warm_repetitions + fresh_repetitions);
  // Repetitions are interleaved (every subject once, then every subject again, ...) so that the
  // load of a shared machine, which drifts over a run, weighs on all subjects alike; a round runs
  // each subject warm, then fresh while fresh repetitions remain.
  for (std::size_t w = 0; w < workload_count; ++w) {
    for (int i = 0; i < std::max(warm_repetitions, fresh_repetitions); ++i) {
      for (std::size_t s = 0; s < subjects.size(); ++s) {
        auto& who = subjects[s];
        if (!who.available) continue;
        for (std::size_t p = 0; p < 2; ++p) {
          if (i >= (p == 0 ? warm_repetitions : fresh_repetitions)) continue;
          if (p == 1 && workloads[w].counted != nullptr) continue;
          cell& c = cells[p][s][w];
          if (!c.failure.empty()) continue;
          ctx.progress(std::string(workloads[w].name) + " / " + who.name + " / " + processes[p], step++, steps);
          auto out = ctx.run_self({workloads[w].name, who.mode, std::to_string(scale), processes[p]},
                                  who.environment);
          if (!out.ok() || out.number("ns") <= 0) {
            c.failure = "child failed (exit " + std::to_string(out.exit_code) + ", signal " +
                        std::to_string(out.signal) + ")";
            continue;
          }
          double value = out.number("ns");
          if (workloads[w].counted != nullptr) {
            const double operations = out.number("operations", 0);
            if (operations <= 0) {
              c.failure = "child counted no operations";
              continue;
            }
            value /= operations;  // time per operation: lower is better, like the others
          }
          c.time.push_back(value);
          c.rss.push_back(out.number("peak_rss", 0));
          c.growth.push_back(out.number("peak_rss_growth", 0));
          c.faults.push_back(out.number("minor_faults", 0));
        }
      }
    }
    for (std::size_t p = 0; p < 2; ++p) {
      for (std::size_t s = 0; s < subjects.size(); ++s) {
        auto& who = subjects[s];
        const cell& c = cells[p][s][w];
        row r{workloads[w].name, who.name, {{"workload", workloads[w].parameters},
              {"scale", format_number(scale)}, {"process", processes[p]}}, {}, {}};
        if (!who.available) {
          r.note = who.missing_note;
        } else if (!c.measured()) {
          r.note = c.failure;
        } else {
          const spread time = spread_of(c.time), rss = spread_of(c.rss), growth = spread_of(c.growth),
                       faults = spread_of(c.faults);
          if (workloads[w].counted != nullptr) {
            r.metrics.push_back({std::string(workloads[w].counted) + "s_per_s", 1e9 / time.median, "1/s",
                                 1e9 / time.high, 1e9 / time.low, time.repetitions});
            r.metrics.push_back({"time_per_" + std::string(workloads[w].counted), time.median, "ns", time.low,
                                 time.high, time.repetitions});
          } else {
            r.metrics.push_back({"time", time.median, "ns", time.low, time.high, time.repetitions});
          }
          r.metrics.push_back({"peak_rss", rss.median, "bytes", rss.low, rss.high, rss.repetitions});
          r.metrics.push_back({"peak_rss_growth", growth.median, "bytes", growth.low, growth.high, growth.repetitions});
          r.metrics.push_back({"minor_faults", faults.median, "", faults.low, faults.high, faults.repetitions});
        }
        ctx.record(std::move(r));
      }
    }
  }

  auto index_of = [&](const std::string& name) -> int {
    for (std::size_t s = 0; s < subjects.size(); ++s)
      if (subjects[s].name == name && subjects[s].available) return static_cast<int>(s);
    return -1;
  };
  const int dropin = index_of("memkit (LD_PRELOAD)");
  const int api = index_of("memkit (C++ API)");
  using table = std::vector<double> cell::*;
  // peer / memkit over the workloads in `only` (all when empty) that both completed.
  auto compare = [&](std::size_t process, table quantity, int peer, int memkit,
                     const std::vector<std::string>& only = {}) {
    ratio_spread out;
    if (peer < 0 || memkit < 0) return out;
    std::vector<double> values, lows, highs;
    for (std::size_t w = 0; w < workload_count; ++w) {
      if (!only.empty() && std::find(only.begin(), only.end(), workloads[w].name) == only.end()) continue;
      const cell& a = cells[process][static_cast<std::size_t>(peer)][w];
      const cell& b = cells[process][static_cast<std::size_t>(memkit)][w];
      if (!a.failure.empty() || !b.failure.empty()) return ratio_spread{};
      if (a.time.empty() || b.time.empty()) continue;  // not run in this kind of process
      const spread x = spread_of(a.*quantity), y = spread_of(b.*quantity);
      if (x.low <= 0 || y.low <= 0) continue;  // nothing to compare (no growth at all)
      values.push_back(x.median / y.median);
      lows.push_back(x.low / y.high);
      highs.push_back(x.high / y.low);
    }
    out.value = geometric_mean(values);
    out.low = geometric_mean(lows);
    out.high = geometric_mean(highs);
    out.workloads = values.size();
    return out;
  };
  auto words = [](double ratio, bool memory) {
    return std::string(ratio >= 1 ? (memory ? "memkit smaller" : "memkit faster") : (memory ? "memkit larger" : "memkit slower"));
  };
  auto describe = [&](const ratio_spread& r, bool memory) {
    char text[160];
    std::snprintf(text, sizeof text, "%.3gx (%.3g-%.3g), %s", r.value, r.low, r.high, words(r.value, memory).c_str());
    return std::string(text);
  };
  // The targets, from the warm processes: each a peer / memkit ratio against the drop-in.
  struct target {
    std::string peer;
    std::vector<std::string> workloads;  // empty: the geometric mean over all
    table quantity;
    double bound;
    std::string what;
  };
  const std::vector<target> targets{
      {"mimalloc", {"producer-consumer"}, &cell::time, 1.0, "producer-consumer time per free"},
      {"mimalloc", {"glibc-simple"}, &cell::time, 1.0, "glibc-simple time"},
      {"mimalloc", {}, &cell::time, 1 / 1.05, "geometric mean time"},
      {"glibc", {}, &cell::time, 1 / 0.8, "geometric mean time"},
      // glibc at its best reasonable configuration, against the same target as its defaults.
      {"glibc (tuned)", {}, &cell::time, 1 / 0.8, "geometric mean time"},
      {"mimalloc", {}, &cell::rss, 1 / 1.1, "geometric mean peak RSS net of the process baseline"},
  };
  for (const target& t : targets) {
    const bool memory = t.quantity == &cell::rss;
    const std::string name = t.peer + " / memkit (LD_PRELOAD), " + t.what;
    const ratio_spread warm = compare(0, t.quantity, index_of(t.peer), dropin, t.workloads);
    if (warm.workloads == 0) {
      ctx.note(name + ": not measured (a subject is missing or failed)");
      continue;
    }
    ctx.check(peer_figure(name + ", warm processes", "memkit (LD_PRELOAD)", t.peer, warm.value, warm.low, warm.high,
                          t.bound, memory ? "memory" : "time"));
    const ratio_spread fresh = compare(1, t.quantity, index_of(t.peer), dropin, t.workloads);
    if (fresh.workloads > 0)
      ctx.note(name + ", fresh processes (information, no target, over " + std::to_string(fresh.workloads) +
               " workloads): " + describe(fresh, memory));
  }
  // Every peer against the drop-in and the C++ API, warm, as information.
  for (const int memkit : {dropin, api}) {
    if (memkit < 0) continue;
    std::string line = subjects[static_cast<std::size_t>(memkit)].name + ", warm processes, peer / memkit geometric mean:";
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      if (static_cast<int>(s) == dropin || static_cast<int>(s) == api) continue;
      const ratio_spread time = compare(0, &cell::time, static_cast<int>(s), memkit);
      const ratio_spread rss = compare(0, &cell::rss, static_cast<int>(s), memkit);
      const ratio_spread faults = compare(0, &cell::faults, static_cast<int>(s), memkit);
      if (time.workloads == 0) continue;
      line += " " + subjects[s].name + ": time " + describe(time, false);
      if (rss.workloads > 0) line += ", peak RSS " + describe(rss, true);
      if (faults.workloads > 0) line += ", minor faults " + describe(faults, true);
      line += ";";
    }
    ctx.note(line);
  }
  ctx.describe("glibc (tuned)", std::string("GLIBC_TUNABLES=") + glibc_tunables);
  ctx.describe("warm process",
               "before its workload the child runs a warm-up the same for every allocator: 100,000 x scale "
               "random replacements in 10,000 slots (90% 8-512 B, 9.8% up to 64 KiB, 0.2% 64 KiB-2 MiB; first and "
               "last byte written), a small-block churn on two threads at once, then everything freed but every fourth "
               "small block, which stays alive through the workload");
  ctx.describe("measured",
               "time = wall time of the workload; peak_rss = the high-water mark during the workload (reset "
               "through /proc/self/clear_refs as it starts) minus the child's resident size before any work "
               "(warm-up leftovers count, the runner's own pages do not); peak_rss_growth = the same minus the "
               "resident size as the workload starts; minor_faults = ru_minflt during the workload");
  ctx.describe("repetitions", std::to_string(warm_repetitions) + " warm and " + std::to_string(fresh_repetitions) +
                                  " fresh child processes per cell, interleaved across subjects; median with min-max");
}

}  // namespace

MEMKIT_BENCH_SUITE(malloc_workloads, "malloc-workloads",
                   "issue 4: larson, producer/consumer (xmalloc-test), glibc-simple, random lifetimes, realloc strings, large, "
                   "false sharing in warm processes; time, peak RSS and faults vs glibc (default and tuned)/jemalloc/mimalloc/tcmalloc",
                   run, child);

}  // namespace memkit::bench
