// Measuring helpers shared by the suites: a clock, an optimization barrier, medians, and a
// log-linear latency histogram that gives percentiles without storing every sample.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace memkit::bench {

using clock = std::chrono::steady_clock;

// Nanoseconds between two time points.
inline double nanoseconds(clock::time_point from, clock::time_point to) noexcept {
  return std::chrono::duration<double, std::nano>(to - from).count();
}

// Keeps the compiler from deleting a computation whose result is otherwise unused.
template <class T>
inline void do_not_optimize(T const& value) noexcept {
  asm volatile("" : : "r,m"(value) : "memory");
}

// Makes the compiler assume memory was read and written (forces stores to happen).
inline void clobber_memory() noexcept { asm volatile("" : : : "memory"); }

// Median of the values (by copy; the input is left alone). 0 for an empty input.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  if (values.size() % 2 == 1) return *mid;
  double upper = *mid;
  double lower = *std::max_element(values.begin(), mid);
  return (lower + upper) / 2;
}

// Runs `measure` (returning one figure) `repetitions` times and returns the median.
template <class F>
double median_of(int repetitions, F&& measure) {
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(repetitions));
  for (int i = 0; i < repetitions; ++i) values.push_back(static_cast<double>(measure()));
  return median(std::move(values));
}

// The median of repeated measurements with their range (min and max).
struct spread {
  double median = 0;
  double low = 0;
  double high = 0;
  int repetitions = 0;
};

// The median, min and max of the values. All zero for an empty input.
inline spread spread_of(const std::vector<double>& values) {
  spread s;
  if (values.empty()) return s;
  s.median = median(values);
  s.low = *std::min_element(values.begin(), values.end());
  s.high = *std::max_element(values.begin(), values.end());
  s.repetitions = static_cast<int>(values.size());
  return s;
}

// Runs `measure` `repetitions` times and returns the median with its range.
template <class F>
spread measure_spread(int repetitions, F&& measure) {
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(repetitions));
  for (int i = 0; i < repetitions; ++i) values.push_back(static_cast<double>(measure()));
  return spread_of(values);
}

// A log-linear histogram of non-negative integer samples (nanoseconds, typically): 32 linear
// sub-buckets per power of two, so any percentile is within about 3% of the exact value, in a
// fixed 16 KiB whatever the sample count. min and max are exact.
class log_histogram {
 public:
  static constexpr int sub_bucket_bits = 5;
  static constexpr std::size_t bucket_count = (64 - sub_bucket_bits + 1) << sub_bucket_bits;

  // Adds one sample.
  void add(std::uint64_t value) noexcept {
    ++counts_[index_of(value)];
    ++total_;
    min_ = std::min(min_, value);
    max_ = std::max(max_, value);
  }
  // Number of samples.
  std::uint64_t count() const noexcept { return total_; }
  // Smallest sample (0 when empty).
  std::uint64_t min() const noexcept { return total_ == 0 ? 0 : min_; }
  // Largest sample.
  std::uint64_t max() const noexcept { return max_; }
  // The value below which `fraction` (0..1) of the samples lie, as the upper edge of its bucket
  // (clamped to max()).
  std::uint64_t percentile(double fraction) const noexcept {
    if (total_ == 0) return 0;
    auto rank = static_cast<std::uint64_t>(fraction * static_cast<double>(total_));
    if (rank >= total_) rank = total_ - 1;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < bucket_count; ++i) {
      seen += counts_[i];
      if (seen > rank) return std::min(upper_edge(i), max_);
    }
    return max_;
  }
  // Counts per power-of-two range [2^k, 2^(k+1)), for printing a coarse histogram.
  std::vector<std::uint64_t> power_of_two_counts() const {
    std::vector<std::uint64_t> out(65, 0);
    for (std::size_t i = 0; i < bucket_count; ++i) {
      if (counts_[i] == 0) continue;
      std::uint64_t lower = lower_edge(i);
      out[lower == 0 ? 0 : static_cast<std::size_t>(std::bit_width(lower))] += counts_[i];
    }
    while (out.size() > 1 && out.back() == 0) out.pop_back();
    return out;
  }

 private:
  static std::size_t index_of(std::uint64_t v) noexcept {
    constexpr std::uint64_t linear_limit = 1u << sub_bucket_bits;
    if (v < linear_limit) return static_cast<std::size_t>(v);
    int shift = std::bit_width(v) - 1 - sub_bucket_bits;
    auto sub = static_cast<std::size_t>((v >> shift) & (linear_limit - 1));
    return (static_cast<std::size_t>(shift + 1) << sub_bucket_bits) + sub;
  }
  static std::uint64_t lower_edge(std::size_t i) noexcept {
    constexpr std::uint64_t linear_limit = 1u << sub_bucket_bits;
    if (i < linear_limit) return i;
    int shift = static_cast<int>(i >> sub_bucket_bits) - 1;
    return (linear_limit + (i & (linear_limit - 1))) << shift;
  }
  static std::uint64_t upper_edge(std::size_t i) noexcept {
    constexpr std::uint64_t linear_limit = 1u << sub_bucket_bits;
    if (i < linear_limit) return i;
    int shift = static_cast<int>(i >> sub_bucket_bits) - 1;
    return lower_edge(i) + (std::uint64_t{1} << shift) - 1;
  }

  std::array<std::uint64_t, bucket_count> counts_{};
  std::uint64_t total_ = 0;
  std::uint64_t min_ = UINT64_MAX;
  std::uint64_t max_ = 0;
};

// What one measured phase of a process cost in memory: its peak resident size net of a baseline
// and the page faults it took. Start one with begin_memory_phase() right before the phase (it
// resets the kernel's high-water mark, so the peak read at the end is the phase's own) and read
// it with end_memory_phase() right after.
struct memory_phase {
  double baseline_rss = 0;     // bytes resident when the phase began
  double peak_rss = 0;         // bytes, the high-water mark during the phase (VmHWM)
  double minor_faults = 0;     // ru_minflt taken during the phase
  bool peak_is_phase_own = false;  // false: the kernel refused the reset, the peak may be older
  double start_faults = 0;
  // The peak net of `baseline` (bytes resident before whatever work is to be charged), never
  // below zero.
  double peak_over(double baseline) const noexcept { return peak_rss > baseline ? peak_rss - baseline : 0; }
  // The peak net of the resident size when the phase began.
  double growth() const noexcept { return peak_over(baseline_rss); }
};
// Bytes resident now (VmRSS), 0 when unknown.
double resident_bytes() noexcept;
// Resets the high-water mark and records the baseline and the fault count.
memory_phase begin_memory_phase() noexcept;
// Reads the high-water mark and the faults taken since begin_memory_phase().
void end_memory_phase(memory_phase& phase) noexcept;

// "12.3 MiB", "512 B": bytes for people.
std::string format_bytes(double bytes);
// "1.23 ms", "45 ns": durations for people.
std::string format_nanoseconds(double ns);
// A number with up to 4 significant digits, or with a thousands-free compact suffix (1.2e8).
std::string format_number(double value);

}  // namespace memkit::bench
