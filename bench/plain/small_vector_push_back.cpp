// A plain harness for small_vector's push_back: the small-vector suite's workload (100 lengths
// drawn from a chi-squared distribution with 8 degrees of freedom, each pushed back into a fresh
// container and dropped) with none of the suite's layout defenses. Every subject's loop is inlined
// into main, compiled with the build's ordinary flags: no loop or function alignment, no separate
// kernel functions. Speed that holds here does not depend on where the compiler put the code.
//
// Subjects are interleaved in every repetition; the figure is Boost / memkit per repetition
// (median, lowest, highest), above 1 meaning memkit faster.
//
//   memkit-bench-plain [repetitions=15] [passes=2000]
//   memkit-bench-plain count memkit16|boost16|memkit32|boost32 [passes=100]
// The count form runs one subject's loop, out of line, for instruction counts that machine load
// does not change:
//   valgrind --tool=callgrind --toggle-collect='*count_passes*' memkit-bench-plain count memkit16
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include "memkit/small_vector.hpp"

#if __has_include(<boost/container/small_vector.hpp>)
#include <boost/container/small_vector.hpp>
#define MEMKIT_PLAIN_HAVE_BOOST 1
#else
#define MEMKIT_PLAIN_HAVE_BOOST 0
#endif

namespace {

std::vector<int> workload() {
  std::vector<int> out;
  std::mt19937 generator(20210710);  // the suite's seed
  std::chi_squared_distribution<float> distribution(8.0f);
  for (int i = 0; i < 100; ++i) out.push_back(static_cast<int>(distribution(generator)));
  return out;
}

double thread_cpu_nanoseconds() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

template <class T>
inline void keep(T* p) noexcept {
  asm volatile("" : : "r"(p) : "memory");
}

// One subject's timing: the loop is inlined where this is called.
template <class Container>
[[gnu::always_inline]] inline double time_passes(const std::vector<int>& lengths, int passes) {
  const double start = thread_cpu_nanoseconds();
  for (int p = 0; p < passes; ++p) {
    for (int length : lengths) {
      Container v;
      for (int i = 0; i < length; ++i) v.push_back(i);
      keep(v.data());
    }
  }
  return (thread_cpu_nanoseconds() - start) / passes;
}

// The count form's loop: the same work, in a function of its own so callgrind can count just it.
template <class Container>
[[gnu::noinline]] void count_passes(const std::vector<int>& lengths, int passes) {
  for (int p = 0; p < passes; ++p) {
    for (int length : lengths) {
      Container v;
      for (int i = 0; i < length; ++i) v.push_back(i);
      keep(v.data());
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void report(const char* what, const std::vector<double>& peer, const std::vector<double>& mine) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < peer.size(); ++i) ratios.push_back(peer[i] / mine[i]);
  const double m = median(ratios);
  std::printf("%-34s boost/memkit %.2fx (%.2f-%.2f) memkit %s; memkit %.0f ns, boost %.0f ns per pass\n",
              what, m, *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()), m >= 1 ? "faster" : "slower", median(mine),
              median(peer));
}

}  // namespace

int main(int argc, char** argv) {
#if MEMKIT_PLAIN_HAVE_BOOST
  if (argc > 2 && std::string_view(argv[1]) == "count") {
    const std::string_view subject = argv[2];
    const int passes = argc > 3 ? std::atoi(argv[3]) : 100;
    const std::vector<int> lengths = workload();
    if (subject == "memkit16") count_passes<memkit::small_vector<int, 16>>(lengths, passes);
    else if (subject == "boost16") count_passes<boost::container::small_vector<int, 16>>(lengths, passes);
    else if (subject == "memkit32") count_passes<memkit::small_vector<int, 32>>(lengths, passes);
    else if (subject == "boost32") count_passes<boost::container::small_vector<int, 32>>(lengths, passes);
    else return 2;
    return 0;
  }
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 15;
  const int passes = argc > 2 ? std::atoi(argv[2]) : 2000;
  const std::vector<int> lengths = workload();
  std::vector<double> m16, b16, m32, b32;
  // Warm-up, untimed: first touches of the heap and the code.
  time_passes<memkit::small_vector<int, 16>>(lengths, passes / 10 + 1);
  time_passes<boost::container::small_vector<int, 16>>(lengths, passes / 10 + 1);
  for (int r = 0; r < repetitions; ++r) {
    // Alternate which subject goes first, so a burst of load does not always hit the same one.
    if (r % 2 == 0) {
      m16.push_back(time_passes<memkit::small_vector<int, 16>>(lengths, passes));
      b16.push_back(time_passes<boost::container::small_vector<int, 16>>(lengths, passes));
      m32.push_back(time_passes<memkit::small_vector<int, 32>>(lengths, passes));
      b32.push_back(time_passes<boost::container::small_vector<int, 32>>(lengths, passes));
    } else {
      b32.push_back(time_passes<boost::container::small_vector<int, 32>>(lengths, passes));
      m32.push_back(time_passes<memkit::small_vector<int, 32>>(lengths, passes));
      b16.push_back(time_passes<boost::container::small_vector<int, 16>>(lengths, passes));
      m16.push_back(time_passes<memkit::small_vector<int, 16>>(lengths, passes));
    }
  }
  report("small_vector<int, 16> push_back", b16, m16);
  report("small_vector<int, 32> push_back", b32, m32);
  return 0;
#else
  (void)argc, (void)argv;
  std::puts("boost::container::small_vector: not installed");
  return 0;
#endif
}
