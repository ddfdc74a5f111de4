// Suite "small-vector" (seed 003, "Memory allocation made right"): build and drop one vector per
// length of a fixed workload of 100 lengths drawn from a chi-squared distribution with 8 degrees
// of freedom, pushing back 0..length-1, for inline capacities N = 8, 12, 16, 32. Subjects:
// memkit::small_vector<T, N>, boost::container::small_vector<T, N>, absl::InlinedVector<T, N>,
// std::vector<T> with reserve(N) and std::vector<T> without. Elements: int (the article's) and a
// 32-byte struct. The time is per pass over the 100 lengths (median of repetitions, subjects
// interleaved within each repetition so machine noise hits all of them alike, averaged over eight
// stack placements of the vectors).

#include <time.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "measure.hpp"
#include "memkit/small_vector.hpp"
#include "suite.hpp"

#if MEMKIT_BENCH_HAVE_BOOST
#include <boost/container/small_vector.hpp>
#endif
#if MEMKIT_BENCH_HAVE_ABSL
#include <absl/container/inlined_vector.h>
#endif

namespace memkit::bench {
namespace {

// The article's workload, with a fixed seed instead of random_device so every run (and every
// peer) sees the same lengths.
const std::vector<int>& workload() {
  static const std::vector<int> lengths = [] {
    std::vector<int> out;
    std::mt19937 generator(20210710);
    std::chi_squared_distribution<float> distribution(8.0f);
    for (int i = 0; i < 100; ++i) out.push_back(static_cast<int>(distribution(generator)));
    return out;
  }();
  return lengths;
}

// A 32-byte element, constructed from the loop index like the ints.
struct wide {
  std::int64_t values[4];
  wide(int i) noexcept : values{i, i, i, i} {}  // NOLINT: implicit, like int
};
static_assert(sizeof(wide) == 32);

template <class Element>
const char* element_name() {
  return sizeof(Element) == sizeof(int) ? "int" : "32-byte struct";
}

// One pass: for each length, a fresh container filled with push_back and dropped.
template <class Make>
void one_pass(Make&& make) {
  for (int length : workload()) {
    auto v = make();
    for (int i = 0; i < length; ++i) v.push_back(i);
    do_not_optimize(v.data());
    clobber_memory();
  }
}

// CPU time of this thread, in nanoseconds. The suite measures CPU time rather than wall time
// because the machines it runs on are shared: time spent descheduled is not the subject's.
double thread_cpu_nanoseconds() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

// Placement. The measured loops are a handful of instructions per element and a few per vector,
// and their speed depends on where things land: the same machine code ran 25-60% slower for one
// subject or another in some stack placements of the vectors (4 KiB aliasing with other stack
// data) and some code layouts (fetch-block and branch-predictor aliasing). Every subject is
// measured with the stack shifted by k * 1040 bytes for k < `placements` (a different cache-line
// and 4 KiB offset each), and its figure is the mean over placements of the per-placement
// medians. Code layout is not varied: that needs a copy of each loop per layout, and with that
// many copies GCC stops inlining some peers' push_back (its unit-growth limit), which measures
// the inliner instead of the containers. The loops keep the compiler's own alignment.
constexpr int placements = 8;

// Always out of line, so every placement runs this same code with the stack shifted.
template <class Make>
[[gnu::noinline]] double nanoseconds_per_pass_here(int passes, Make& make) {
  const double start = thread_cpu_nanoseconds();
  for (int p = 0; p < passes; ++p) one_pass(make);
  return (thread_cpu_nanoseconds() - start) / passes;
}

template <class Make>
double nanoseconds_per_pass(int placement, int passes, Make&& make) {
  void* shift = __builtin_alloca(static_cast<std::size_t>(placement) * 1040 + 16);
  do_not_optimize(shift);
  return nanoseconds_per_pass_here(passes, make);
}

struct subject {
  std::string name;
  bool installed;
  std::function<double(int placement, int passes)> measure;
};

template <class Element, std::size_t N>
std::vector<subject> subjects() {
  std::vector<subject> out;
  out.push_back({"memkit::small_vector", true, [](int placement, int passes) {
                   return nanoseconds_per_pass(placement, passes, [] { return memkit::small_vector<Element, N>(); });
                 }});
#if MEMKIT_BENCH_HAVE_BOOST
  out.push_back({"boost::container::small_vector", true, [](int placement, int passes) {
                   return nanoseconds_per_pass(placement, passes, [] { return boost::container::small_vector<Element, N>(); });
                 }});
#else
  out.push_back({"boost::container::small_vector", false, nullptr});
#endif
#if MEMKIT_BENCH_HAVE_ABSL
  out.push_back({"absl::InlinedVector", true, [](int placement, int passes) {
                   return nanoseconds_per_pass(placement, passes, [] { return absl::InlinedVector<Element, N>(); });
                 }});
#else
  out.push_back({"absl::InlinedVector", false, nullptr});
#endif
  out.push_back({"std::vector + reserve(N)", true, [](int placement, int passes) {
                   return nanoseconds_per_pass(placement, passes, [] {
                     std::vector<Element> v;
                     v.reserve(N);
                     return v;
                   });
                 }});
  out.push_back({"std::vector", true, [](int placement, int passes) {
                   return nanoseconds_per_pass(placement, passes, [] { return std::vector<Element>(); });
                 }});
  return out;
}

template <class Element, std::size_t N>
void run_one(context& ctx, std::size_t& done, std::size_t total) {
  // Many short repetitions, subjects interleaved: on a shared machine, load changes over
  // milliseconds, and short interleaved samples let every subject see the same load. Repetition r
  // measures every subject in placement r % placements.
  const int passes = ctx.pick(50, 300, 1000);
  const int repetitions = placements * ctx.pick(1, 20, 50);
  auto list = subjects<Element, N>();
  std::vector<std::vector<std::vector<double>>> samples(list.size(), std::vector<std::vector<double>>(placements));
  for (int r = 0; r < repetitions; ++r) {
    const int placement = r % placements;
    // Rotate the order too, so no subject always runs right after the same other one.
    for (std::size_t k = 0; k < list.size(); ++k) {
      const std::size_t s = (k + static_cast<std::size_t>(r / placements)) % list.size();
      if (list[s].installed) samples[s][static_cast<std::size_t>(placement)].push_back(list[s].measure(placement, passes));
    }
  }
  ctx.progress("small-vector", ++done, total);
  std::vector<double> medians(list.size(), 0);
  for (std::size_t s = 0; s < list.size(); ++s) {
    row out{"push-back-chi-squared-lengths", list[s].name, {{"N", std::to_string(N)}, {"element", element_name<Element>()}}, {}, {}};
    if (!list[s].installed) {
      out.note = "not installed";
    } else {
      // The mean over stack placements of each placement's median (see `placements`).
      for (const auto& at : samples[s]) medians[s] += median(at) / placements;
      std::size_t pushes = 0;
      for (int length : workload()) pushes += static_cast<std::size_t>(length);
      out.metrics = {{"time_per_pass", medians[s], "ns"},
                     {"time_per_push_back", medians[s] / static_cast<double>(pushes), "ns"}};
    }
    ctx.record(out);
  }
  const double memkit_time = medians[0];
  const std::string suffix = ", N = " + std::to_string(N) + " (seed 003 workload, " + element_name<Element>() + ")";
  for (std::size_t s = 1; s < 3; ++s) {
    if (list[s].installed) ctx.check({"small_vector vs " + list[s].name + suffix, medians[s] / memkit_time, ">=", 1.0, "x"});
  }
  if constexpr (sizeof(Element) != sizeof(int)) return;
  ctx.check({"small_vector vs std::vector without reserve" + suffix, medians[4] / memkit_time, ">=", 5.0, "x"});
}

void run(context& ctx) {
  std::size_t done = 0;
  const std::size_t total = 8;
  run_one<int, 8>(ctx, done, total);
  run_one<int, 12>(ctx, done, total);
  run_one<int, 16>(ctx, done, total);
  run_one<int, 32>(ctx, done, total);
  run_one<wide, 8>(ctx, done, total);
  run_one<wide, 12>(ctx, done, total);
  run_one<wide, 16>(ctx, done, total);
  run_one<wide, 32>(ctx, done, total);
  std::string lengths;
  for (int length : workload()) lengths += std::to_string(length) + " ";
  ctx.note("workload: 100 lengths from chi-squared(8), seed 20210710: " + lengths);
  ctx.note("time_per_pass: thread CPU time to build and drop one vector per length (all 100): for each of 8 "
           "stack placements of the vectors the median of many short interleaved "
           "repetitions, then the mean over placements; lower is better");
#if !MEMKIT_BENCH_HAVE_BOOST
  ctx.note("boost::container::small_vector: not installed (install libboost-dev)");
#endif
#if !MEMKIT_BENCH_HAVE_ABSL
  ctx.note("absl::InlinedVector: not installed (install libabsl-dev)");
#endif
}

}  // namespace

MEMKIT_BENCH_SUITE(small_vector, "small-vector",
                   "seed 003: push_back over chi-squared(8) lengths; small_vector vs Boost, Abseil, std::vector",
                   run, nullptr);

}  // namespace memkit::bench
