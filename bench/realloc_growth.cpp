// Suite "realloc-growth": what a C program that grows its buffers with realloc gets from each malloc.
// One buffer grown from 4 KiB to the final size (1 GiB in the full profile) by 1.5x steps, writing
// the new part each step; and 8 buffers grown together, round robin, to an eighth of it each.
// Every malloc runs the same code in a child process (glibc, jemalloc, mimalloc, tcmalloc and
// memkit's drop-in by LD_PRELOAD), and every child is warm: it first allocates, writes and frees
// large blocks, which is what raises glibc's mmap threshold in long-running programs. Per subject:
// time, bytes copied (a realloc that changed the address counts the old size), page faults.
// The bound is committing and writing the same pages once: a fresh mapping written once, and one
// populated first (MAP_POPULATE); the faster of the two.
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "measure.hpp"
#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"
#include "peers.hpp"
#include "suite.hpp"

namespace memkit::bench {
namespace {

constexpr std::size_t start_bytes = std::size_t{4} << 10;
// Copies of blocks at least this large are what memkit promises never to make.
constexpr std::size_t copy_threshold = general_allocator::growth_threshold;

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt + usage.ru_majflt;
}

// The long-running state: large blocks allocated, written and freed, of sizes up to 32 MiB
// (glibc's largest dynamic mmap threshold), then a few small ones kept live.
void warm_up() {
  std::vector<void*> keep;
  for (std::size_t mib : {1, 3, 8, 32, 5, 16, 2}) {
    void* p = std::malloc(mib << 20);
    if (p == nullptr) std::exit(3);
    std::memset(p, 1, mib << 20);
    do_not_optimize(p);
    std::free(p);
    keep.push_back(std::malloc(100 * mib));
  }
  for (void* p : keep) std::free(p);
}

struct growth_counts {
  std::uint64_t copied = 0;        // bytes of blocks that changed address
  std::uint64_t copied_large = 0;  // of those, blocks of at least copy_threshold
  std::uint64_t moves = 0;         // reallocs that changed the address
  std::uint64_t steps = 0;
};

// One 1.5x step of buffer `p` (holding `size` bytes) to `next`; writes the new part.
bool grow(char*& p, std::size_t& size, std::size_t next, growth_counts& counts) {
  char* q = static_cast<char*>(std::realloc(p, next));
  if (q == nullptr) return false;
  ++counts.steps;
  if (q != p) {
    ++counts.moves;
    counts.copied += size;
    if (size >= copy_threshold) counts.copied_large += size;
  }
  std::memset(q + size, static_cast<int>(next & 0xff), next - size);
  p = q;
  size = next;
  return true;
}

std::size_t next_size(std::size_t size, std::size_t final_bytes) {
  const std::size_t next = size + size / 2;
  return next < final_bytes ? next : final_bytes;
}

// Child: `growth one|eight FINAL` or `bound fault|populate FINAL`; prints ns=, copied=, faults=.
int child(const std::vector<std::string>& args) {
  if (args.size() != 3) {
    std::fprintf(stderr, "realloc-growth child: expected 'growth one|eight FINAL' or 'bound fault|populate FINAL'\n");
    return 2;
  }
  const std::size_t final_bytes = std::strtoull(args[2].c_str(), nullptr, 10);
  warm_up();
  growth_counts counts;
  const long faults_before = minor_faults();
  const auto start = clock::now();
  if (args[0] == "bound") {
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (args[1] == "populate" ? MAP_POPULATE : 0);
    void* p = ::mmap(nullptr, final_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return 3;
    std::memset(p, 1, final_bytes);
    do_not_optimize(p);
    const double ns = nanoseconds(start, clock::now());
    const long faults = minor_faults() - faults_before;
    ::munmap(p, final_bytes);
    std::printf("ns=%.0f\ncopied=0\ncopied_large=0\nmoves=0\nfaults=%ld\n", ns, faults);
    return 0;
  }
  const std::size_t buffers = args[1] == "eight" ? 8 : 1;
  const std::size_t each = final_bytes / buffers;
  std::vector<char*> p(buffers);
  std::vector<std::size_t> size(buffers, start_bytes);
  for (auto& b : p) {
    b = static_cast<char*>(std::malloc(start_bytes));
    if (b == nullptr) return 3;
    std::memset(b, 1, start_bytes);
  }
  for (bool growing = true; growing;) {
    growing = false;
    for (std::size_t i = 0; i < buffers; ++i) {
      if (size[i] >= each) continue;
      if (!grow(p[i], size[i], next_size(size[i], each), counts)) return 4;
      growing = true;
    }
  }
  const double ns = nanoseconds(start, clock::now());
  const long faults = minor_faults() - faults_before;
  for (char* b : p) std::free(b);
  std::printf("ns=%.0f\ncopied=%llu\ncopied_large=%llu\nmoves=%llu\nfaults=%ld\n", ns,
              static_cast<unsigned long long>(counts.copied),
              static_cast<unsigned long long>(counts.copied_large),
              static_cast<unsigned long long>(counts.moves), faults);
  return 0;
}

struct subject {
  std::string name;
  std::vector<std::string> args;  // child arguments before FINAL
  std::vector<std::string> environment;
  bool available = true;
  std::string note;
};

struct samples {
  std::vector<double> ns;
  double copied = 0, copied_large = 0, moves = 0, faults = 0;
  std::string failure;
};

void run(context& ctx) {
  const std::size_t final_bytes = ctx.pick(std::size_t{32} << 20, std::size_t{256} << 20, std::size_t{1} << 30);
  const int repetitions = ctx.pick(1, 3, 5);
  const malloc_peer dropin = memkit_malloc();
  for (const char* experiment : {"one", "eight"}) {
    std::vector<subject> subjects;
    for (auto& peer : malloc_peers())
      subjects.push_back({peer.name, {"growth", experiment}, peer.environment(), peer.installed, "not installed"});
    subjects.push_back({dropin.name, {"growth", experiment}, dropin.environment(), dropin.installed,
                        "libmemkit_malloc.so not built"});
    subjects.push_back({"bound: fresh mapping written once", {"bound", "fault"}, {}, true, ""});
    subjects.push_back({"bound: MAP_POPULATE, then written", {"bound", "populate"}, {}, true, ""});
    std::vector<samples> results(subjects.size());
    // Interleaved: every subject once, then every subject again.
    for (int r = 0; r < repetitions; ++r) {
      for (std::size_t s = 0; s < subjects.size(); ++s) {
        if (!subjects[s].available || !results[s].failure.empty()) continue;
        ctx.progress(std::string(experiment) + " / " + subjects[s].name,
                     static_cast<std::size_t>(r) * subjects.size() + s,
                     subjects.size() * static_cast<std::size_t>(repetitions));
        auto args = subjects[s].args;
        args.push_back(std::to_string(final_bytes));
        auto out = ctx.run_self(args, subjects[s].environment);
        if (!out.ok() || out.number("ns") <= 0) {
          results[s].failure = "child failed (exit " + std::to_string(out.exit_code) + ", signal " +
                               std::to_string(out.signal) + ")";
          continue;
        }
        results[s].ns.push_back(out.number("ns"));
        results[s].copied = out.number("copied", 0);
        results[s].copied_large = out.number("copied_large", 0);
        results[s].moves = out.number("moves", 0);
        results[s].faults = out.number("faults", 0);
      }
    }
    const std::string experiment_name = std::string(experiment) == "one" ? "one buffer" : "8 buffers";
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      row out{experiment_name, subjects[s].name,
              {{"final", format_bytes(static_cast<double>(final_bytes))}, {"step", "1.5x"},
               {"buffers", std::string(experiment) == "one" ? "1" : "8"}},
              {}, {}};
      const samples& got = results[s];
      if (!subjects[s].available) {
        out.note = subjects[s].note;
      } else if (!got.failure.empty()) {
        out.note = got.failure;
      } else {
        out.metrics = {{"time", median(got.ns), "ns"},
                       {"time_min", *std::min_element(got.ns.begin(), got.ns.end()), "ns"},
                       {"time_max", *std::max_element(got.ns.begin(), got.ns.end()), "ns"},
                       {"bytes_copied", got.copied, "bytes"},
                       {"bytes_copied_128k_up", got.copied_large, "bytes"},
                       {"moves", got.moves, ""},
                       {"page_faults", got.faults, ""}};
      }
      ctx.record(std::move(out));
    }
    // Ratios peer / memkit from the same run, median with the spread of the repetitions.
    const std::size_t memkit = subjects.size() - 3;
    if (results[memkit].ns.empty()) {
      ctx.note(experiment_name + ": memkit's drop-in not measured");
      continue;
    }
    const double memkit_ns = median(results[memkit].ns);
    const double memkit_min = *std::min_element(results[memkit].ns.begin(), results[memkit].ns.end());
    const double memkit_max = *std::max_element(results[memkit].ns.begin(), results[memkit].ns.end());
    double bound_ns = 0, bound_min = 0, bound_max = 0;
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      if (s == memkit || results[s].ns.empty()) continue;
      const double peer_ns = median(results[s].ns);
      const double peer_min = *std::min_element(results[s].ns.begin(), results[s].ns.end());
      const double peer_max = *std::max_element(results[s].ns.begin(), results[s].ns.end());
      const double ratio = peer_ns / memkit_ns;
      char text[300];
      std::snprintf(text, sizeof text, "%s: %s / memkit (LD_PRELOAD) time %.2fx (%.2f-%.2f), memkit %s",
                    experiment_name.c_str(), subjects[s].name.c_str(), ratio, peer_min / memkit_max,
                    peer_max / memkit_min, ratio >= 1 ? "faster" : "slower");
      ctx.note(text);
      if (s > memkit && (bound_ns == 0 || peer_ns < bound_ns)) {
        bound_ns = peer_ns;
        bound_min = peer_min;
        bound_max = peer_max;
      }
    }
    (void)bound_min;
    (void)bound_max;
    if (std::string(experiment) == "one") {
      ctx.check({"realloc growth 4 KiB -> " + format_bytes(static_cast<double>(final_bytes)) +
                     ", memkit (LD_PRELOAD): bytes copied in blocks of 128 KiB and more",
                 results[memkit].copied_large, "<=", 0, "bytes"});
      if (bound_ns > 0) {
        ctx.check({"realloc growth 4 KiB -> " + format_bytes(static_cast<double>(final_bytes)) +
                       ", bound (pages committed and written once) / memkit (LD_PRELOAD) time",
                   bound_ns / memkit_ns, ">=", 1 / 1.2, "x"});
      }
    }
  }
  ctx.note("each child is warm: it first writes and frees blocks of 1-32 MiB; time = median of " +
           std::to_string(repetitions) + " children (min-max in the rows), faults = minor + major "
           "page faults of the growth, bytes copied = old sizes of reallocs that changed the address");
}

}  // namespace

MEMKIT_BENCH_SUITE(realloc_growth, "realloc-growth",
                   "issue: buffers grown by realloc (4 KiB to 1 GiB by 1.5x, one and 8 at once) under "
                   "every malloc, in warm children; time, bytes copied, page faults vs the bound",
                   run, child);

}  // namespace memkit::bench
