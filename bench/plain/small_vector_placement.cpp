// A placement sweep for small_vector's push_back: how fast each subject's loop runs at every
// position its code can take relative to the 64-byte lines the front end fetches.
//
// The small-vector suite's workload (100 lengths from a chi-squared distribution with 8 degrees of
// freedom, each pushed back into a fresh container and dropped) runs in one kernel per subject and
// offset K: the kernel starts on a 64-byte line, then K bytes of no-ops (K = 0, 4, ..., 60), then
// the loops, in a file compiled without loop, jump or label alignment (bench/CMakeLists.txt), so
// the loops land at every 4-byte offset within a line. A push_back loop of a few instructions runs
// up to about 1.5x slower when it straddles two lines, for memkit and Boost alike, so one
// placement says little; this reports the whole range.
//
// Per inline capacity N (int elements), Boost / memkit:
//   typical  the median time over the 16 placements (where the code lands at random), per
//            repetition; the median over repetitions with the lowest and highest repetition;
//   best     each subject at its fastest placement;
//   worst    each subject at its slowest placement.
// Above 1 means memkit faster. Subjects and offsets are interleaved in every repetition.
//
//   memkit-bench-placement [repetitions=15] [passes=400]
// MEMKIT_PLACEMENT_VERBOSE=1 also prints each subject's median time at every offset.
#include <time.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "memkit/small_vector.hpp"

#if __has_include(<boost/container/small_vector.hpp>)
#include <boost/container/small_vector.hpp>
#define MEMKIT_PLACEMENT_HAVE_BOOST 1
#else
#define MEMKIT_PLACEMENT_HAVE_BOOST 0
#endif

namespace {

const std::vector<int>& workload() {
  static const std::vector<int> lengths = [] {
    std::vector<int> out;
    std::mt19937 generator(20210710);  // the suite's seed
    std::chi_squared_distribution<float> distribution(8.0f);
    for (int i = 0; i < 100; ++i) out.push_back(static_cast<int>(distribution(generator)));
    return out;
  }();
  return lengths;
}

double thread_cpu_nanoseconds() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

constexpr int offsets = 16;  // K = 0, 4, ..., 60

// One subject at offset K: K bytes of no-ops, then the workload's loops.
template <class Container, int K>
__attribute__((noinline, aligned(64))) void run_passes(const std::vector<int>& lengths, int passes) {
  if constexpr (K > 0) asm volatile(".skip %c0, 0x90" : : "i"(K));
  for (int p = 0; p < passes; ++p) {
    for (int length : lengths) {
      Container v;
      for (int i = 0; i < length; ++i) v.push_back(i);
      asm volatile("" : : "r"(v.data()) : "memory");
    }
  }
}

template <class Container, int K>
double nanoseconds_per_pass(const std::vector<int>& lengths, int passes) {
  const double start = thread_cpu_nanoseconds();
  run_passes<Container, K>(lengths, passes);
  return (thread_cpu_nanoseconds() - start) / passes;
}

using times = std::array<std::vector<double>, offsets>;  // per offset, one time per repetition

template <class Container, int... K>
void time_all_offsets(std::integer_sequence<int, K...>, times& out, const std::vector<int>& lengths, int passes) {
  ((out[K].push_back(nanoseconds_per_pass<Container, K * 4>(lengths, passes))), ...);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

const char* verdict(double ratio) { return ratio >= 1 ? "memkit faster" : "memkit slower"; }

template <std::size_t N>
void sweep(int repetitions, int passes) {
#if MEMKIT_PLACEMENT_HAVE_BOOST
  using mine_type = memkit::small_vector<int, N>;
  using peer_type = boost::container::small_vector<int, N>;
  const std::vector<int>& lengths = workload();
  times mine, peer;
  constexpr auto all = std::make_integer_sequence<int, offsets>{};
  time_all_offsets<mine_type>(all, mine, lengths, passes / 10 + 1);  // warm-up, discarded
  time_all_offsets<peer_type>(all, peer, lengths, passes / 10 + 1);
  for (auto& t : mine) t.clear();
  for (auto& t : peer) t.clear();
  for (int r = 0; r < repetitions; ++r) {
    if (r % 2 == 0) {
      time_all_offsets<mine_type>(all, mine, lengths, passes);
      time_all_offsets<peer_type>(all, peer, lengths, passes);
    } else {
      time_all_offsets<peer_type>(all, peer, lengths, passes);
      time_all_offsets<mine_type>(all, mine, lengths, passes);
    }
  }
  // The typical placement (median over placements), per repetition. A median, not a mean: a
  // subject can be several times slower at a few placements, and those would decide a mean.
  std::vector<double> typical_ratios;
  for (int r = 0; r < repetitions; ++r) {
    std::vector<double> m, p;
    for (int k = 0; k < offsets; ++k) m.push_back(mine[k][r]), p.push_back(peer[k][r]);
    typical_ratios.push_back(median(p) / median(m));
  }
  // Each subject's best and worst placement, by its median time there.
  double mine_best = 1e300, mine_worst = 0, peer_best = 1e300, peer_worst = 0;
  int mine_slow = 0, peer_slow = 0;
  std::array<double, offsets> mine_median{}, peer_median{};
  for (int k = 0; k < offsets; ++k) {
    mine_median[k] = median(mine[k]);
    peer_median[k] = median(peer[k]);
    mine_best = std::min(mine_best, mine_median[k]), mine_worst = std::max(mine_worst, mine_median[k]);
    peer_best = std::min(peer_best, peer_median[k]), peer_worst = std::max(peer_worst, peer_median[k]);
  }
  // Placements more than 15% slower than the subject's best: where its loop straddles a line.
  for (int k = 0; k < offsets; ++k) {
    mine_slow += mine_median[k] > 1.15 * mine_best;
    peer_slow += peer_median[k] > 1.15 * peer_best;
  }
  const double typical = median(typical_ratios);
  std::printf("small_vector<int, %2zu>: boost/memkit typical of %d placements %.2fx (%.2f-%.2f) %s; "
              "best %.2fx %s, worst %.2fx %s; slow placements memkit %d, boost %d; memkit %.0f-%.0f ns, "
              "boost %.0f-%.0f ns per pass\n",
              N, offsets, typical, *std::min_element(typical_ratios.begin(), typical_ratios.end()),
              *std::max_element(typical_ratios.begin(), typical_ratios.end()), verdict(typical),
              peer_best / mine_best, verdict(peer_best / mine_best), peer_worst / mine_worst,
              verdict(peer_worst / mine_worst), mine_slow, peer_slow, mine_best, mine_worst, peer_best, peer_worst);
  if (std::getenv("MEMKIT_PLACEMENT_VERBOSE") != nullptr) {
    for (int k = 0; k < offsets; ++k)
      std::printf("  K = %2d: memkit %.0f ns, boost %.0f ns\n", k * 4, mine_median[k], peer_median[k]);
  }
#else
  (void)repetitions, (void)passes;
#endif
}

}  // namespace

int main(int argc, char** argv) {
#if MEMKIT_PLACEMENT_HAVE_BOOST
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 15;
  const int passes = argc > 2 ? std::atoi(argv[2]) : 400;
  sweep<8>(repetitions, passes);
  sweep<12>(repetitions, passes);
  sweep<16>(repetitions, passes);
  sweep<32>(repetitions, passes);
  return 0;
#else
  (void)argc, (void)argv;
  std::puts("boost::container::small_vector: not installed");
  return 0;
#endif
}
