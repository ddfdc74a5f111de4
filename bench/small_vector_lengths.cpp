// Suite "small-vector" (seed 003, "Memory allocation made right"): build and drop one vector per
// length of a fixed workload of 100 lengths drawn from a chi-squared distribution with 8 degrees
// of freedom, pushing back 0..length-1, for inline capacities N = 8, 12, 16, 32. Subjects:
// memkit::small_vector<T, N>, boost::container::small_vector<T, N>, absl::InlinedVector<T, N>,
// std::vector<T> with reserve(N) and std::vector<T> without. Elements: int (the article's) and a
// 32-byte struct.
//
// How it measures, and why. The loops are a few instructions per element, so where their code and
// data land matters as much as the code itself: on the 2-core VMs this runs on, the same machine
// code ran 10-60% slower or faster with the code layout of the build, the stack offset of the
// vectors, and the load other processes put on the machine. The suite defends against each, the
// same way for every subject:
// - layout within a build: every subject's loop is its own out-of-line function, aligned to 64
//   bytes, in a file compiled with -falign-loops=64 (bench/CMakeLists.txt), so each loop starts on
//   a cache line and its layout depends on its own code only, not on the code before it;
// - address bits and stack offsets: the timing runs in several child processes (each with its own
//   address-space randomization), and within each, at eight stack shifts of 1040 bytes;
// - machine load: thread CPU time, many short samples with the subjects interleaved (so a burst
//   of load hits all of them), medians per stack shift, and a ratio per process between subjects
//   measured side by side; the figure is the median of the per-process ratios, and the lowest and
//   highest per-process ratios are printed with it;
// - and a measure that none of this affects: when valgrind is installed (quick and full
//   profiles), each subject's loop runs once more under callgrind and the suite reports the
//   instructions it executed per pass (including malloc and free).
// The peers are used as a normal user would use them: default-constructed, push_back, destroyed,
// compiled with the same flags in the same file.

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "measure.hpp"
#include "memkit/small_vector.hpp"
#include "suite.hpp"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define MEMKIT_BENCH_HAVE_CALLGRIND_H 1
#else
#define MEMKIT_BENCH_HAVE_CALLGRIND_H 0
#endif
#if MEMKIT_BENCH_HAVE_BOOST
#include <boost/container/small_vector.hpp>
#endif
#if MEMKIT_BENCH_HAVE_ABSL
#include <absl/container/inlined_vector.h>
#endif

// Each subject's measured loop: out of line and on a cache-line boundary (see the file comment).
// The plain layout (MEMKIT_BENCH_ALIGN_LOOPS=OFF) drops the alignment, so a run can show whether
// a subject's speed depends on where its loop lands.
#if MEMKIT_BENCH_PLAIN_LAYOUT
#define MEMKIT_BENCH_KERNEL __attribute__((noinline))
#else
#define MEMKIT_BENCH_KERNEL __attribute__((noinline, aligned(64)))
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
template <class Element>
const char* element_key() {
  return sizeof(Element) == sizeof(int) ? "int" : "wide";
}

// How each subject makes its empty container.
template <class Container>
struct make_default {
  static Container make() { return Container(); }
};
template <class Element, std::size_t N>
struct make_reserved {
  static std::vector<Element> make() {
    std::vector<Element> v;
    v.reserve(N);
    return v;
  }
};

// `passes` passes: for each length, a fresh container filled with push_back and dropped.
template <class Make>
MEMKIT_BENCH_KERNEL void run_passes(int passes) {
  const std::vector<int>& lengths = workload();
  for (int p = 0; p < passes; ++p) {
    for (int length : lengths) {
      auto v = Make::make();
      for (int i = 0; i < length; ++i) v.push_back(i);
      do_not_optimize(v.data());
      clobber_memory();
    }
  }
}

// CPU time of this thread, in nanoseconds. The suite measures CPU time rather than wall time
// because the machines it runs on are shared: time spent descheduled is not the subject's.
double thread_cpu_nanoseconds() noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

// Stack placements per process: the stack shifted by k * 1040 bytes (a different cache-line and
// 4 KiB offset each; some offsets slowed every subject by 1.7x through 4 KiB aliasing).
constexpr int placements = 8;

template <class Make>
[[gnu::noinline]] double nanoseconds_per_pass_here(int passes) {
  const double start = thread_cpu_nanoseconds();
  run_passes<Make>(passes);
  return (thread_cpu_nanoseconds() - start) / passes;
}

template <class Make>
double nanoseconds_per_pass(int placement, int passes) {
  void* shift = __builtin_alloca(static_cast<std::size_t>(placement) * 1040 + 16);
  do_not_optimize(shift);
  return nanoseconds_per_pass_here<Make>(passes);
}

struct subject {
  const char* name;
  const char* key;  // for child processes' output and command lines
  bool installed;
  double (*measure)(int placement, int passes);
  void (*run)(int passes);
};

template <class Make>
subject make_subject(const char* name, const char* key) {
  return {name, key, true, &nanoseconds_per_pass<Make>, &run_passes<Make>};
}

// The subjects of one configuration; memkit first (the baseline of every ratio).
template <class Element, std::size_t N>
std::vector<subject> subjects() {
  std::vector<subject> out;
  out.push_back(make_subject<make_default<memkit::small_vector<Element, N>>>("memkit::small_vector", "memkit"));
#if MEMKIT_BENCH_HAVE_BOOST
  out.push_back(make_subject<make_default<boost::container::small_vector<Element, N>>>("boost::container::small_vector", "boost"));
#else
  out.push_back({"boost::container::small_vector", "boost", false, nullptr, nullptr});
#endif
#if MEMKIT_BENCH_HAVE_ABSL
  out.push_back(make_subject<make_default<absl::InlinedVector<Element, N>>>("absl::InlinedVector", "absl"));
#else
  out.push_back({"absl::InlinedVector", "absl", false, nullptr, nullptr});
#endif
  out.push_back(make_subject<make_reserved<Element, N>>("std::vector + reserve(N)", "std-reserve"));
  out.push_back(make_subject<make_default<std::vector<Element>>>("std::vector", "std"));
  return out;
}

// The configurations, in report order.
struct configuration {
  const char* element;  // element_key
  const char* element_name;
  std::size_t n;
  std::vector<subject> (*subjects)();
};
template <class Element, std::size_t N>
configuration make_configuration() {
  return {element_key<Element>(), element_name<Element>(), N, &subjects<Element, N>};
}
const std::vector<configuration>& configurations() {
  static const std::vector<configuration> all = {
      make_configuration<int, 8>(),  make_configuration<int, 12>(),  make_configuration<int, 16>(),
      make_configuration<int, 32>(), make_configuration<wide, 8>(), make_configuration<wide, 12>(),
      make_configuration<wide, 16>(), make_configuration<wide, 32>()};
  return all;
}

std::string time_key(const configuration& c, const subject& s) {
  return std::string(c.element) + "/" + std::to_string(c.n) + "/" + s.key;
}

// Per-process parameters of the timing.
struct timing_plan {
  int passes;       // passes per sample
  int repetitions;  // samples per subject (a multiple of `placements`)
};
timing_plan plan_for(profile p) {
  switch (p) {
    case profile::smoke: return {50, placements * 2};
    case profile::quick: return {300, placements * 6};
    case profile::full: return {1000, placements * 20};
  }
  return {300, placements * 6};
}
int processes_for(profile p) {
  switch (p) {
    case profile::smoke: return 2;
    case profile::quick: return 5;
    case profile::full: return 9;
  }
  return 5;
}

// One process's timing of every subject of one configuration: after a warm-up, for each subject, the mean over
// stack placements of the median of its samples there. Repetition r measures every subject in
// placement r % placements, in an order rotated every round so no subject always follows the
// same other one.
std::vector<double> time_configuration(const configuration& c, const timing_plan& plan) {
  const auto list = c.subjects();
  std::vector<std::vector<std::vector<double>>> samples(list.size(), std::vector<std::vector<double>>(placements));
  // One untimed sample each first: a fresh process's first passes pay for page faults and cold
  // caches (the heap's first blocks, the code), which would count against whichever runs first.
  for (const auto& s : list)
    if (s.installed) s.run(plan.passes);
  for (int r = 0; r < plan.repetitions; ++r) {
    const int placement = r % placements;
    for (std::size_t k = 0; k < list.size(); ++k) {
      const std::size_t s = (k + static_cast<std::size_t>(r / placements)) % list.size();
      if (list[s].installed) samples[s][static_cast<std::size_t>(placement)].push_back(list[s].measure(placement, plan.passes));
    }
  }
  std::vector<double> times(list.size(), 0);
  for (std::size_t s = 0; s < list.size(); ++s) {
    if (!list[s].installed) continue;
    for (const auto& at : samples[s]) times[s] += median(at) / placements;
  }
  return times;
}

// `memkit-bench --child small-vector time <profile>`: times every configuration and prints
// "<element>/<N>/<subject>=<ns per pass>" lines.
// `memkit-bench --child small-vector run <element> <N> <subject> <passes>`: runs one subject's loop
// (what callgrind counts).
int child(const std::vector<std::string>& args) {
  if (args.size() == 2 && args[0] == "time") {
    profile p = args[1] == "smoke" ? profile::smoke : args[1] == "full" ? profile::full : profile::quick;
    for (const auto& c : configurations()) {
      const auto list = c.subjects();
      const auto times = time_configuration(c, plan_for(p));
      for (std::size_t s = 0; s < list.size(); ++s)
        if (list[s].installed) std::printf("%s=%.17g\n", time_key(c, list[s]).c_str(), times[s]);
    }
    return 0;
  }
  if (args.size() == 5 && args[0] == "run") {
    for (const auto& c : configurations()) {
      if (args[1] != c.element || args[2] != std::to_string(c.n)) continue;
      for (const auto& s : c.subjects()) {
        if (args[3] != s.key || !s.installed) continue;
        s.run(std::atoi(args[4].c_str()));
        std::printf("ran=1\n");
        return 0;
      }
    }
    std::fprintf(stderr, "small-vector child: no installed subject %s/%s/%s\n", args[1].c_str(), args[2].c_str(), args[3].c_str());
    return 2;
  }
  if (args.size() == 2 && args[0] == "run-all") {
    for (const auto& c : configurations()) {
      for (const auto& s : c.subjects()) {
        if (!s.installed) continue;
        s.run(std::atoi(args[1].c_str()));
        // Under callgrind, one profile dump per subject, named by its key (a no-op otherwise).
#if MEMKIT_BENCH_HAVE_CALLGRIND_H
        CALLGRIND_DUMP_STATS_AT(time_key(c, s).c_str());
#endif
        std::printf("ran=%s\n", time_key(c, s).c_str());
      }
    }
    return 0;
  }
  std::fprintf(stderr, "small-vector child: usage: time <profile> | run <int|wide> <N> <subject> <passes> | run-all <passes>\n");
  return 2;
}

// The first executable named `name` on PATH, or empty.
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream in(path != nullptr ? path : "");
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// This executable's path (the runner starts children through /proc/self/exe, which under valgrind
// would name valgrind).
std::string own_executable() {
  char buffer[4096];
  const ssize_t length = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (length <= 0) return {};
  return std::string(buffer, static_cast<std::size_t>(length));
}

// The "totals:" figure of a callgrind output file, or -1.
double callgrind_total(const std::string& file) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("totals:", 0) == 0) return std::strtod(line.c_str() + 7, nullptr);
  }
  return -1;
}

// Instructions per pass of every subject's loop ("<element>/<N>/<subject>" -> count), counted by
// callgrind collecting only inside run_passes (callees such as malloc and free included). With
// callgrind's client-request header, one run dumps a profile per subject; without it, one run per
// subject. Subjects whose run failed are missing.
std::map<std::string, double> count_instructions(const std::string& valgrind, const std::string& self,
                                                 const std::string& out_dir) {
  constexpr int passes = 200;
  const std::string file = out_dir + "/small-vector-callgrind." + std::to_string(::getpid()) + ".out";
  const std::vector<std::string> options = {"-q", "--tool=callgrind", "--callgrind-out-file=" + file,
                                            "--collect-atstart=no", "--toggle-collect=*run_passes*(int)", self,
                                            "--child", "small-vector"};
  std::map<std::string, double> counts;
#if MEMKIT_BENCH_HAVE_CALLGRIND_H
  std::vector<std::string> args = options;
  args.insert(args.end(), {"run-all", std::to_string(passes)});
  child_result result = run_program(valgrind, args);
  // Dump k (file.k) holds the k-th subject the child ran, in the order of its "ran=" lines.
  std::istringstream ran(result.output);
  int dump = 0;
  for (std::string line; std::getline(ran, line);) {
    if (line.rfind("ran=", 0) != 0) continue;
    const std::string part = file + "." + std::to_string(++dump);
    const double total = result.ok() ? callgrind_total(part) : -1;
    if (total >= 0) counts[line.substr(4)] = total / passes;
    std::remove(part.c_str());
  }
  std::remove(file.c_str());
#else
  for (const auto& c : configurations()) {
    for (const auto& s : c.subjects()) {
      if (!s.installed) continue;
      std::vector<std::string> args = options;
      args.insert(args.end(), {"run", c.element, std::to_string(c.n), s.key, std::to_string(passes)});
      child_result result = run_program(valgrind, args);
      const double total = result.ok() ? callgrind_total(file) : -1;
      if (total >= 0) counts[time_key(c, s)] = total / passes;
      std::remove(file.c_str());
    }
  }
#endif
  return counts;
}

void run(context& ctx) {
  const auto& configs = configurations();
  std::size_t pushes = 0;
  for (int length : workload()) pushes += static_cast<std::size_t>(length);

  // Timing: `processes` children, each timing everything; times[config][subject][process].
  const int processes = processes_for(ctx.profile());
  std::vector<std::vector<std::vector<double>>> times(configs.size());
  for (std::size_t ci = 0; ci < configs.size(); ++ci) times[ci].resize(configs[ci].subjects().size());
  int failed_children = 0;
  for (int p = 0; p < processes; ++p) {
    ctx.progress("small-vector timing (processes)", static_cast<std::size_t>(p), static_cast<std::size_t>(processes));
    child_result result = ctx.run_self({"time", profile_name(ctx.profile())});
    const auto values = result.values();
    if (!result.ok()) {
      ++failed_children;
      continue;
    }
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      const auto list = configs[ci].subjects();
      for (std::size_t s = 0; s < list.size(); ++s) {
        auto found = values.find(time_key(configs[ci], list[s]));
        if (found != values.end()) times[ci][s].push_back(std::strtod(found->second.c_str(), nullptr));
      }
    }
  }
  if (failed_children != 0) ctx.note(std::to_string(failed_children) + " timing child process(es) failed; figures use the others");

  // Instructions (callgrind), when valgrind is installed and the profile is not smoke.
  const std::string valgrind = ctx.profile() == profile::smoke ? std::string() : find_on_path("valgrind");
  const std::string self = own_executable();
  const std::map<std::string, double> instruction_counts =
      valgrind.empty() || self.empty() ? std::map<std::string, double>() : count_instructions(valgrind, self, ctx.output_directory());

  for (std::size_t ci = 0; ci < configs.size(); ++ci) {
    const configuration& c = configs[ci];
    const auto list = c.subjects();
    ctx.progress("small-vector", ci + 1, configs.size());
    std::vector<double> instructions(list.size(), -1);
    for (std::size_t s = 0; s < list.size(); ++s) {
      auto found = instruction_counts.find(time_key(c, list[s]));
      if (found != instruction_counts.end()) instructions[s] = found->second;
    }
    const std::vector<double>& memkit_times = times[ci][0];
    for (std::size_t s = 0; s < list.size(); ++s) {
      row out{"push-back-chi-squared-lengths", list[s].name, {{"N", std::to_string(c.n)}, {"element", c.element_name}}, {}, {}};
      if (!list[s].installed) {
        out.note = "not installed";
      } else if (!times[ci][s].empty()) {
        const double time = median(times[ci][s]);
        out.metrics = {{"time_per_pass", time, "ns"}, {"time_per_push_back", time / static_cast<double>(pushes), "ns"}};
        if (instructions[s] >= 0) out.metrics.push_back({"instructions_per_pass", instructions[s], ""});
        if (s != 0 && times[ci][s].size() == memkit_times.size()) {
          std::vector<double> ratios;
          for (std::size_t p = 0; p < memkit_times.size(); ++p) ratios.push_back(times[ci][s][p] / memkit_times[p]);
          out.metrics.push_back({"ratio_to_memkit_median", median(ratios), "x"});
          out.metrics.push_back({"lowest_ratio", *std::min_element(ratios.begin(), ratios.end()), "x"});
          out.metrics.push_back({"highest_ratio", *std::max_element(ratios.begin(), ratios.end()), "x"});
          const bool is_target_peer = s <= 2 || (s == 4 && std::string(c.element) == "int");
          if (is_target_peer) {
            const std::string suffix = ", N = " + std::to_string(c.n) + " (seed 003 workload, " + c.element_name + ")";
            const std::string versus = s == 4 ? std::string("std::vector without reserve") : std::string(list[s].name);
            ctx.check(peer_figure(versus + " / memkit::small_vector time" + suffix, "memkit::small_vector", versus,
                                  median(ratios), *std::min_element(ratios.begin(), ratios.end()),
                                  *std::max_element(ratios.begin(), ratios.end()), s == 4 ? 5.0 : 1.0));
          }
        }
      } else {
        out.note = "no timing (child processes failed)";
      }
      ctx.record(out);
    }
  }

  std::string lengths;
  for (int length : workload()) lengths += std::to_string(length) + " ";
  ctx.note("workload: 100 lengths from chi-squared(8), seed 20210710: " + lengths);
  const timing_plan plan = plan_for(ctx.profile());
  ctx.note("time_per_pass: thread CPU time to build and drop one vector per length (all 100); in each of " +
           std::to_string(processes) + " child processes the median of " + std::to_string(plan.repetitions / placements) +
           " interleaved samples of " + std::to_string(plan.passes) + " passes at each of " + std::to_string(placements) +
           " stack placements, averaged over placements; the row shows the median over processes. Lower is better");
  ctx.note("ratio_to_memkit_median: the subject's time over memkit's, per process (measured side by side), median over "
           "processes; lowest_ratio/highest_ratio: the extreme per-process ratios. Above 1: memkit is faster. The figures use this "
           "ratio (the ratio in parentheses is of the median times)");
  if (!instruction_counts.empty()) {
    ctx.note("instructions_per_pass: counted by callgrind in one run of the subject's loop (200 passes; malloc and free "
             "included); independent of code layout and machine load");
  } else if (ctx.profile() != profile::smoke) {
    ctx.note(valgrind.empty() ? "instructions_per_pass: not measured (valgrind not found on PATH)"
                              : "instructions_per_pass: not measured (the callgrind run failed)");
  }
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
                   run, child);

}  // namespace memkit::bench
