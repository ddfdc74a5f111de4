// Suite "vector-growth" (seed 004, "Custom Vector Allocation"): 10 million push_backs of the
// article's 8-int pattern into 1, 2 and 3 vectors at once, so that growth (not the push itself)
// decides the time. Subjects: std::vector<int>; memkit::vector<int> whose allocator cannot grow
// in place (allocate, copy, free: what std::vector does); memkit::vector<int> on
// malloc_allocator (resize within malloc's usable size, then realloc, which on glibc moves large
// blocks with mremap instead of copying); memkit::vector<int> on a virtual_arena per vector
// (always in place). A second experiment interleaves unrelated malloc allocations with the
// pushes, which is what keeps realloc from growing in place in real programs. A separate,
// untimed run through a counting allocator reports how often growth happened in place.
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
#include "memkit/vector.hpp"
#include "memkit/virtual_arena.hpp"
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
};

struct subject {
  std::string name;
  std::function<outcome(int count, int iterations, bool interleave)> run;
};

// CPU time of this thread (page faults included), in nanoseconds: time spent descheduled on a
// shared machine is not the subject's.
double thread_cpu_nanoseconds() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

template <class Vector, class Make>
double time_once(int count, int iterations, bool interleave, Make&& make) {
  std::vector<Vector> vectors;
  vectors.reserve(static_cast<std::size_t>(count));
  for (int k = 0; k < count; ++k) vectors.push_back(make(k));
  std::optional<unrelated_allocations> unrelated;
  if (interleave) unrelated.emplace();
  const double start = thread_cpu_nanoseconds();
  push_pattern(vectors, iterations, unrelated ? &*unrelated : nullptr);
  const double elapsed = thread_cpu_nanoseconds() - start;
  return correct(vectors, iterations) ? elapsed : -1;
}

// memkit::vector through a counting wrapper: one extra virtual call per growth (about 23 per
// vector), nothing per push_back.
outcome time_memkit(int count, int iterations, bool interleave, const std::function<allocator&(int)>& upstream) {
  std::vector<std::unique_ptr<counting_allocator>> counters;
  for (int k = 0; k < count; ++k) counters.push_back(std::make_unique<counting_allocator>(upstream(k)));
  outcome out;
  out.nanoseconds = time_once<memkit::vector<int>>(count, iterations, interleave, [&](int k) {
    return memkit::vector<int>(*counters[static_cast<std::size_t>(k)]);
  });
  out.counted = true;
  for (const auto& c : counters) {
    out.growths += c->growths();
    out.in_place += c->in_place();
  }
  return out;
}

std::vector<subject> subjects(std::size_t arena_reservation) {
  std::vector<subject> out;
  out.push_back({"std::vector", [](int count, int iterations, bool interleave) {
                   outcome o;
                   o.nanoseconds = time_once<std::vector<int>>(count, iterations, interleave,
                                                               [](int) { return std::vector<int>(); });
                   return o;
                 }});
  out.push_back({"memkit::vector, no in-place growth", [](int count, int iterations, bool interleave) {
                   copying_malloc copying;
                   return time_memkit(count, iterations, interleave, [&](int) -> allocator& { return copying; });
                 }});
  out.push_back({"memkit::vector, malloc_allocator (realloc)", [](int count, int iterations, bool interleave) {
                   return time_memkit(count, iterations, interleave,
                                      [](int) -> allocator& { return malloc_allocator::instance(); });
                 }});
  out.push_back({"memkit::vector, virtual_arena per vector", [arena_reservation](int count, int iterations, bool interleave) {
                   std::vector<virtual_arena> arenas;
                   for (int k = 0; k < count; ++k) arenas.emplace_back(arena_reservation);
                   return time_memkit(count, iterations, interleave,
                                      [&](int k) -> allocator& { return arenas[static_cast<std::size_t>(k)]; });
                 }});
  return out;
}

// Touches and frees a large block once, so the virtual machine these benchmarks often run in
// has backed the process's memory before anything is timed (first-touch faults on the host
// otherwise dominate whichever subject runs first).
void warm_up_memory(std::size_t bytes) {
  void* p = std::malloc(bytes);
  if (p == nullptr) return;
  for (std::size_t i = 0; i < bytes; i += 4096) static_cast<volatile char*>(p)[i] = 1;
  std::free(p);
}

constexpr std::size_t arena_reservation = std::size_t{256} << 20;  // 10M ints end in a 64 MiB buffer

// One measurement in a fresh process: args = subject index, vector count, interleave (0/1),
// iterations. A fresh process gives every subject the same malloc state (glibc raises its mmap
// threshold as large blocks are freed, which would otherwise favour whichever subject runs
// later) and keeps mallopt-free defaults, like the article's separate runs.
int child(const std::vector<std::string>& args) {
  if (args.size() != 4) return 2;
  const auto list = subjects(arena_reservation);
  const std::size_t index = std::stoul(args[0]);
  if (index >= list.size()) return 2;
  const outcome o = list[index].run(std::stoi(args[1]), std::stoi(args[3]), args[2] == "1");
  std::printf("ns=%.0f\ncounted=%d\ngrowths=%llu\nin_place=%llu\n", o.nanoseconds, o.counted ? 1 : 0,
              static_cast<unsigned long long>(o.growths), static_cast<unsigned long long>(o.in_place));
  return o.nanoseconds < 0 ? 1 : 0;
}

void run(context& ctx) {
  const int iterations = ctx.pick(1'000'000, 10'000'000, 10'000'000);
  const int repetitions = ctx.pick(1, 3, 9);
  warm_up_memory(ctx.pick<std::size_t>(std::size_t{64} << 20, std::size_t{1} << 30, std::size_t{1} << 30));
  const auto list = subjects(arena_reservation);
  std::size_t done = 0;
  const std::size_t total = 6;
  for (bool interleave : {false, true}) {
    const std::string experiment = interleave ? "push-back-with-unrelated-allocations" : "push-back-8-int-pattern";
    for (int count = 1; count <= 3; ++count) {
      ctx.progress(experiment, done++, total);
      std::vector<std::vector<double>> samples(list.size());
      std::vector<outcome> last(list.size());
      std::vector<std::string> failures(list.size());
      for (int r = 0; r < repetitions; ++r) {
        for (std::size_t k = 0; k < list.size(); ++k) {
          const std::size_t s = (k + static_cast<std::size_t>(r)) % list.size();  // rotate the order
          const child_result c = ctx.run_self({std::to_string(s), std::to_string(count), interleave ? "1" : "0",
                                               std::to_string(iterations)});
          if (!c.ok()) {
            failures[s] = c.exit_code == 1 ? "WRONG RESULT" : "child failed";
            continue;
          }
          samples[s].push_back(c.number("ns"));
          last[s].counted = c.number("counted", 0) != 0;
          last[s].growths = static_cast<std::uint64_t>(c.number("growths", 0));
          last[s].in_place = static_cast<std::uint64_t>(c.number("in_place", 0));
        }
      }
      std::vector<double> medians(list.size());
      for (std::size_t s = 0; s < list.size(); ++s) {
        medians[s] = median(samples[s]);
        row out{experiment, list[s].name,
                {{"vectors", std::to_string(count)}, {"push_backs per vector", format_number(iterations)}}, {}, {}};
        out.metrics = {{"cpu_time", medians[s], "ns"},
                       {"per_push_back", medians[s] / (static_cast<double>(iterations) * count), "ns"}};
        if (last[s].counted) {
          out.metrics.push_back({"growths", static_cast<double>(last[s].growths), ""});
          out.metrics.push_back({"in_place_percent",
                                 100.0 * static_cast<double>(last[s].in_place) /
                                     static_cast<double>(std::max<std::uint64_t>(1, last[s].growths)),
                                 "%"});
        } else {
          out.note = "std::allocator cannot grow in place: every growth copies";
        }
        if (!failures[s].empty()) out.note = failures[s];
        ctx.record(out);
      }
      if (!interleave && medians[2] > 0) {
        const double target = count == 1 ? 2.0 : 1.5;
        ctx.check({"memkit::vector with realloc growth vs std::vector, " + std::to_string(count) +
                       " vector(s), seed 004 push_back workload",
                   medians[0] / medians[2], ">=", target, "x"});
      }
    }
  }
  ctx.note("each measurement runs in a fresh child process; cpu_time is the thread's CPU time for the push_back "
           "loop (page faults included), median of the repetitions");
  ctx.note("in_place_percent: growths that kept the buffer's address (resize in place, or realloc returning the "
           "same pointer), counted through a wrapper allocator (one virtual call per growth)");
  ctx.note("the article (2014, Linux): std::vector 0.0579 s, cVector with realloc 0.0236 s on 1 vector (2.45x); "
           "1.74x on 2, 2.09x on 3");
}

}  // namespace

MEMKIT_BENCH_SUITE(vector_growth, "vector-growth",
                   "seed 004: 10M push_backs into 1-3 vectors; std::vector vs memkit::vector growth by copy, realloc, arena",
                   run, child);

}  // namespace memkit::bench
