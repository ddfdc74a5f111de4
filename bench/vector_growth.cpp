// Suite "vector-growth" (seed 004, "Custom Vector Allocation"): 10 million push_backs of the
// article's 8-int pattern into 1, 2 and 3 vectors at once, so that growth (not the push itself)
// decides the time, measured in a long-running process: every child first allocates, writes and
// frees large blocks (which is what makes glibc's realloc copy large blocks later). Subjects:
// std::vector, with and without reserve() of the final size; memkit::vector on its default
// allocator, on general_allocator::global(), on malloc_allocator (realloc) under glibc, jemalloc
// and mimalloc (LD_PRELOAD), on a virtual_arena per vector, and on an allocator that cannot grow
// in place (allocate, copy, free: std::vector's strategy). A second experiment interleaves
// unrelated malloc allocations with the pushes. Growth is counted through a wrapper allocator:
// in-place growths, and bytes copied (a growth that changed the address counts the bytes in use).
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "measure.hpp"
#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"
#include "memkit/vector.hpp"
#include "memkit/virtual_arena.hpp"
#include "peers.hpp"
#include "suite.hpp"

namespace memkit::bench {
namespace {

constexpr int pattern[] = {0, 1, 2, 3, 4, 5, 6, 7};
constexpr int pattern_length = sizeof(pattern) / sizeof(*pattern);

// malloc without in-place growth: resize always refuses and reallocate falls back to the
// interface's default (allocate, copy the used bytes, free), i.e. std::vector's strategy.
class copying_malloc final : public allocator {
 protected:
  void* do_allocate(std::size_t size, std::size_t) noexcept override { return std::malloc(size); }
  void do_deallocate(void* p, std::size_t, std::size_t) noexcept override { std::free(p); }
};

// Forwards to another allocator and counts how growth happened (for the untimed run).
class counting_allocator final : public allocator {
 public:
  explicit counting_allocator(allocator& upstream) : upstream_(upstream) {}
  std::uint64_t allocations = 0;      // new blocks (first allocation, or growth by copying)
  std::uint64_t resizes_in_place = 0;
  std::uint64_t reallocations = 0;
  std::uint64_t reallocations_in_place = 0;  // realloc kept the address
  std::uint64_t bytes_copied = 0;            // bytes in use of blocks that changed address
  std::uint64_t growths() const noexcept { return allocations + resizes_in_place + reallocations; }
  std::uint64_t in_place() const noexcept { return resizes_in_place + reallocations_in_place; }

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override {
    ++allocations;
    return upstream_.allocate(size, alignment);
  }
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override {
    ++allocations;
    return upstream_.allocate_at_least(size, alignment);
  }
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override {
    upstream_.deallocate(p, size, alignment);
  }
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size, std::size_t alignment) noexcept override {
    const bool ok = upstream_.resize(p, old_size, new_size, alignment);
    resizes_in_place += ok ? 1 : 0;
    return ok;
  }
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used, std::size_t new_size,
                      std::size_t alignment) noexcept override {
    void* q = upstream_.reallocate(p, old_size, used, new_size, alignment);
    ++reallocations;
    reallocations_in_place += q == p ? 1 : 0;
    if (q != nullptr && q != p) bytes_copied += used;
    return q;
  }

 private:
  allocator& upstream_;
};

// Unrelated allocations between pushes: a ring of live blocks of assorted sizes.
class unrelated_allocations {
 public:
  void step(int i) {
    const std::size_t slot = next_++ % ring_.size();
    std::free(ring_[slot]);
    ring_[slot] = std::malloc(32 + static_cast<std::size_t>(i) * 7919 % 2000);
    do_not_optimize(ring_[slot]);
  }
  ~unrelated_allocations() {
    for (void* p : ring_) std::free(p);
  }

 private:
  std::vector<void*> ring_ = std::vector<void*>(256, nullptr);
  std::size_t next_ = 0;
};

// The article's loop over `count` vectors; with `unrelated`, one unrelated allocation every 32
// iterations.
template <class Vector>
void push_pattern(std::vector<Vector>& vectors, int iterations, unrelated_allocations* unrelated) {
  int pattern_index = 0;
  const std::size_t count = vectors.size();
  for (int i = 0; i != iterations; ++i) {
    const int value = pattern[pattern_index];
    vectors[0].push_back(value);
    if (count > 1) vectors[1].push_back(value);
    if (count > 2) vectors[2].push_back(value);
    if (++pattern_index == pattern_length) pattern_index = 0;
    if (unrelated != nullptr && (i & 31) == 0) unrelated->step(i);
  }
  for (auto& v : vectors) do_not_optimize(v.data());
}

// Checks the result, so a broken container cannot look fast.
template <class Vector>
bool correct(const std::vector<Vector>& vectors, int iterations) {
  for (const auto& v : vectors) {
    if (v.size() != static_cast<std::size_t>(iterations)) return false;
    if (iterations > 9 && v[9] != pattern[9 % pattern_length]) return false;
  }
  return true;
}

// One timed run: nanoseconds (negative: wrong result) and how growth happened.
struct outcome {
  double nanoseconds = 0;
  bool counted = false;  // false for std::vector (no memkit allocator to count through)
  std::uint64_t growths = 0;
  std::uint64_t in_place = 0;
  std::uint64_t bytes_copied = 0;
  long page_faults = 0;
  std::size_t peak_rss = 0;  // above the resident size before the loop
};

// CPU time of this thread (page faults included), in nanoseconds: time spent descheduled on a
// shared machine is not the subject's.
double thread_cpu_nanoseconds() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

long page_faults() noexcept {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt + usage.ru_majflt;
}

// Resets the process's peak resident size (VmHWM) to its current size, so that the peak read
// after the loop is the loop's own. False where the kernel does not offer it.
bool reset_peak_resident() noexcept {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

template <class Vector, class Make>
outcome time_once(int count, int iterations, bool interleave, Make&& make) {
  std::vector<Vector> vectors;
  vectors.reserve(static_cast<std::size_t>(count));
  for (int k = 0; k < count; ++k) vectors.push_back(make(k));
  std::optional<unrelated_allocations> unrelated;
  if (interleave) unrelated.emplace();
  outcome out;
  reset_peak_resident();
  const auto baseline = os::current_resident_bytes();
  const long faults = page_faults();
  const double start = thread_cpu_nanoseconds();
  push_pattern(vectors, iterations, unrelated ? &*unrelated : nullptr);
  const double elapsed = thread_cpu_nanoseconds() - start;
  out.page_faults = page_faults() - faults;
  const auto peak = os::peak_resident_bytes();
  if (baseline.ok() && peak.ok() && peak.value() > baseline.value()) out.peak_rss = peak.value() - baseline.value();
  out.nanoseconds = correct(vectors, iterations) ? elapsed : -1;
  return out;
}

// memkit::vector through a counting wrapper: one extra virtual call per growth (about 23 per
// vector), nothing per push_back.
outcome time_memkit(int count, int iterations, bool interleave, const std::function<allocator&(int)>& upstream) {
  std::vector<std::unique_ptr<counting_allocator>> counters;
  for (int k = 0; k < count; ++k) counters.push_back(std::make_unique<counting_allocator>(upstream(k)));
  outcome out = time_once<memkit::vector<int>>(count, iterations, interleave, [&](int k) {
    return memkit::vector<int>(*counters[static_cast<std::size_t>(k)]);
  });
  out.counted = true;
  for (const auto& c : counters) {
    out.growths += c->growths();
    out.in_place += c->in_place();
    out.bytes_copied += c->bytes_copied;
  }
  return out;
}

constexpr std::size_t arena_reservation = std::size_t{256} << 20;  // 10M ints end in a 64 MiB buffer

// What a child runs; peers of malloc_allocator run the same code under another malloc.
enum class kind { std_vector, std_vector_reserved, copying, default_allocator, general, malloc, arena };

outcome run_kind(kind k, int count, int iterations, bool interleave) {
  switch (k) {
    case kind::std_vector:
      return time_once<std::vector<int>>(count, iterations, interleave, [](int) { return std::vector<int>(); });
    case kind::std_vector_reserved:
      return time_once<std::vector<int>>(count, iterations, interleave, [iterations](int) {
        std::vector<int> v;
        v.reserve(static_cast<std::size_t>(iterations));
        return v;
      });
    case kind::copying: {
      copying_malloc copying;
      return time_memkit(count, iterations, interleave, [&](int) -> allocator& { return copying; });
    }
    case kind::default_allocator:
      return time_memkit(count, iterations, interleave, [](int) -> allocator& { return memkit::default_allocator(); });
    case kind::general:
      return time_memkit(count, iterations, interleave, [](int) -> allocator& { return general_allocator::global(); });
    case kind::malloc:
      return time_memkit(count, iterations, interleave, [](int) -> allocator& { return malloc_allocator::instance(); });
    case kind::arena: {
      std::vector<virtual_arena> arenas;
      for (int k2 = 0; k2 < count; ++k2) arenas.emplace_back(arena_reservation);
      return time_memkit(count, iterations, interleave,
                         [&](int k2) -> allocator& { return arenas[static_cast<std::size_t>(k2)]; });
    }
  }
  return {};
}

struct subject {
  std::string name;
  kind what;
  std::vector<std::string> environment;  // LD_PRELOAD for malloc peers
  bool available = true;
};

std::vector<subject> subjects() {
  std::vector<subject> out = {
      {"memkit::vector, default allocator", kind::default_allocator, {}},
      {"std::vector", kind::std_vector, {}},
      {"std::vector, reserve(final size)", kind::std_vector_reserved, {}},
      {"memkit::vector, general_allocator::global()", kind::general, {}},
  };
  for (const auto& peer : malloc_peers()) {
    if (peer.name == "tcmalloc") continue;
    out.push_back({"memkit::vector, malloc_allocator, " + peer.name + " realloc", kind::malloc, peer.environment(),
                   peer.installed});
  }
  out.push_back({"memkit::vector, virtual_arena per vector", kind::arena, {}});
  out.push_back({"memkit::vector, no in-place growth", kind::copying, {}});
  return out;
}

// The long-running state: large blocks allocated, written and freed (sizes up to 32 MiB, glibc's
// largest dynamic mmap threshold), through malloc and memkit's allocators alike.
void warm_up() {
  for (std::size_t mib : {1, 3, 8, 32, 5, 16, 2}) {
    void* p = std::malloc(mib << 20);
    if (p != nullptr) std::memset(p, 1, mib << 20);
    do_not_optimize(p);
    std::free(p);
    void* q = general_allocator::global().allocate(mib << 20);
    if (q != nullptr) std::memset(q, 1, mib << 20);
    do_not_optimize(q);
    general_allocator::global().free(q);
  }
}

// One measurement in a child: args = kind, vector count, interleave (0/1), iterations.
int child(const std::vector<std::string>& args) {
  if (args.size() != 4) return 2;
  const int k = std::stoi(args[0]);
  if (k < 0 || k > static_cast<int>(kind::arena)) return 2;
  warm_up();
  const outcome o = run_kind(static_cast<kind>(k), std::stoi(args[1]), std::stoi(args[3]), args[2] == "1");
  std::printf("ns=%.0f\ncounted=%d\ngrowths=%llu\nin_place=%llu\ncopied=%llu\nfaults=%ld\npeak_rss=%zu\n",
              o.nanoseconds, o.counted ? 1 : 0, static_cast<unsigned long long>(o.growths),
              static_cast<unsigned long long>(o.in_place), static_cast<unsigned long long>(o.bytes_copied),
              o.page_faults, o.peak_rss);
  return o.nanoseconds < 0 ? 1 : 0;
}

void run(context& ctx) {
  const int iterations = ctx.pick(1'000'000, 10'000'000, 10'000'000);
  const int repetitions = ctx.pick(1, 3, 9);
  const auto list = subjects();
  std::size_t done = 0;
  const std::size_t total = 6;
  for (bool interleave : {false, true}) {
    const std::string experiment = interleave ? "push-back-with-unrelated-allocations" : "push-back-8-int-pattern";
    for (int count = 1; count <= 3; ++count) {
      ctx.progress(experiment, done++, total);
      std::vector<std::vector<double>> samples(list.size());
      std::vector<child_result> last(list.size());
      std::vector<std::string> failures(list.size());
      for (int r = 0; r < repetitions; ++r) {
        for (std::size_t k = 0; k < list.size(); ++k) {
          const std::size_t s = (k + static_cast<std::size_t>(r)) % list.size();  // rotate the order
          if (!list[s].available) continue;
          const child_result c = ctx.run_self({std::to_string(static_cast<int>(list[s].what)), std::to_string(count),
                                               interleave ? "1" : "0", std::to_string(iterations)},
                                              list[s].environment);
          if (!c.ok()) {
            failures[s] = c.exit_code == 1 ? "WRONG RESULT" : "child failed";
            continue;
          }
          samples[s].push_back(c.number("ns"));
          last[s] = c;
        }
      }
      std::vector<double> medians(list.size()), lows(list.size()), highs(list.size());
      for (std::size_t s = 0; s < list.size(); ++s) {
        row out{experiment, list[s].name,
                {{"vectors", std::to_string(count)}, {"push_backs per vector", format_number(iterations)}}, {}, {}};
        if (!list[s].available) {
          out.note = "not installed";
          ctx.record(out);
          continue;
        }
        if (samples[s].empty()) {
          out.note = failures[s];
          ctx.record(out);
          continue;
        }
        medians[s] = median(samples[s]);
        lows[s] = *std::min_element(samples[s].begin(), samples[s].end());
        highs[s] = *std::max_element(samples[s].begin(), samples[s].end());
        out.metrics = {{"cpu_time", medians[s], "ns"},
                       {"cpu_time_min", lows[s], "ns"},
                       {"cpu_time_max", highs[s], "ns"},
                       {"per_push_back", medians[s] / (static_cast<double>(iterations) * count), "ns"},
                       {"page_faults", last[s].number("faults", 0), ""},
                       {"peak_rss", last[s].number("peak_rss", 0), "bytes"}};
        if (last[s].number("counted", 0) != 0) {
          const double growths = last[s].number("growths", 0);
          out.metrics.push_back({"growths", growths, ""});
          out.metrics.push_back({"in_place", last[s].number("in_place", 0), ""});
          out.metrics.push_back({"bytes_copied", last[s].number("copied", 0), "bytes"});
        } else {
          out.note = "std::allocator cannot grow in place: every growth copies";
        }
        if (!failures[s].empty()) out.note = failures[s];
        ctx.record(out);
      }
      // Ratios peer / memkit (the default allocator), with the spread of the repetitions.
      if (medians[0] <= 0) continue;
      for (std::size_t s = 1; s < list.size(); ++s) {
        if (medians[s] <= 0) continue;
        const double ratio = medians[s] / medians[0];
        char text[300];
        std::snprintf(text, sizeof text, "%s, %d vector(s): %s / memkit::vector (default) %.2fx (%.2f-%.2f), memkit %s",
                      experiment.c_str(), count, list[s].name.c_str(), ratio, lows[s] / highs[0], highs[s] / lows[0],
                      ratio >= 1 ? "faster" : "slower");
        ctx.note(text);
      }
      if (!interleave) {
        if (medians[1] > 0) {
          const double target = count == 1 ? 2.5 : 2.0;
          ctx.check({"std::vector / memkit::vector (default allocator), " + std::to_string(count) +
                         " vector(s), seed 004 push_back workload, warm process",
                     medians[1] / medians[0], ">=", target, "x"});
        }
        if (medians[2] > 0) {
          ctx.check({"std::vector with reserve / memkit::vector (default allocator), " + std::to_string(count) +
                         " vector(s), warm process",
                     medians[2] / medians[0], ">=", 1 / 1.2, "x"});
        }
      }
    }
  }
  ctx.note("each measurement runs in a child process that first writes and frees blocks of 1-32 MiB through malloc "
           "and general_allocator (a long-running process's state); cpu_time is the thread's CPU time for the "
           "push_back loop (page faults included), median and min-max of the repetitions; peak_rss is the loop's "
           "own peak above the resident size before it");
  ctx.note("growths, in_place and bytes_copied are counted through a wrapper allocator (one virtual call per "
           "growth); bytes_copied counts the bytes in use of every growth that changed the buffer's address");
  ctx.note("the article (2014, Linux): std::vector 0.0579 s, cVector with realloc 0.0236 s on 1 vector (2.45x); "
           "1.74x on 2, 2.09x on 3");
}

}  // namespace

MEMKIT_BENCH_SUITE(vector_growth, "vector-growth",
                   "seed 004: 10M push_backs into 1-3 vectors in a warm process; std::vector (with and without reserve) vs memkit::vector on each allocator and on jemalloc/mimalloc realloc",
                   run, child);

}  // namespace memkit::bench
