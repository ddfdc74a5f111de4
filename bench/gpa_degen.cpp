// Suite "gpa-degen" (seed 001, Zig PR #17383): the worst case that made Zig's
// GeneralPurposeAllocator walk a list on every free. Each round keeps one 128-byte allocation and
// allocates and frees the other (page size / 128 - 1) slots of its bucket, so an allocator that
// keeps one bucket per round alive and searches them degrades with the round count. The seed ran
// 5,000 rounds; the same program at 200,000 rounds shows whether time per operation stays flat.
//
// Every subject runs in a fresh child process (memkit-bench --child gpa-degen ...), the peers and
// the drop-in by LD_PRELOAD of their malloc, memkit's C++ API directly, so each measurement starts
// from an empty heap as the seed's program did. The child times the allocation loop only.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "measure.hpp"
#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"
#include "peers.hpp"
#include "suite.hpp"

namespace memkit::bench {
namespace {

constexpr std::size_t allocation_size = 128;

// Through whatever malloc the process runs on (the preloaded one, or glibc's).
struct c_heap {
  static void* allocate(std::size_t n) noexcept { return std::malloc(n); }
  static void release(void* p, std::size_t) noexcept { std::free(p); }
};

// Through memkit's C++ API: the sized deallocate of the allocator interface.
struct memkit_heap {
  static general_allocator& heap() noexcept { return general_allocator::global(); }
  static void* allocate(std::size_t n) noexcept { return heap().allocate(n); }
  static void release(void* p, std::size_t n) noexcept { heap().deallocate(p, n); }
};

// The seed's program. Returns the nanoseconds it took, or a negative number when an allocation
// failed.
template <class Heap>
double run_degen(std::size_t rounds) {
  const std::size_t slot_count = os::page_size() / allocation_size;
  std::vector<void*> kept(rounds, nullptr);  // sized before the clock starts
  // One allocation before the clock starts, so that every subject begins with its per-thread state
  // set up (a preloaded malloc has served the process's start-up already; the C++ API has not).
  void* warm = Heap::allocate(allocation_size);
  if (warm == nullptr) return -1;
  do_not_optimize(warm);
  Heap::release(warm, allocation_size);
  auto start = clock::now();
  for (std::size_t i = 0; i < rounds; ++i) {
    void* keep = Heap::allocate(allocation_size);
    if (keep == nullptr) return -1;
    static_cast<unsigned char*>(keep)[0] = 1;
    kept[i] = keep;
    for (std::size_t j = 0; j + 1 < slot_count; ++j) {
      void* p = Heap::allocate(allocation_size);
      if (p == nullptr) return -1;
      do_not_optimize(p);  // keeps the compiler from pairing away malloc and free
      Heap::release(p, allocation_size);
    }
  }
  for (void* p : kept) Heap::release(p, allocation_size);
  return nanoseconds(start, clock::now());
}

// Operations (allocations plus frees) the program performs for `rounds`.
double operations(std::size_t rounds) {
  const std::size_t slot_count = os::page_size() / allocation_size;
  return static_cast<double>(rounds) * static_cast<double>(2 * slot_count);
}

// Child: `degen ROUNDS malloc|memkit` prints ns=, ops=, peak_rss=.
int child(const std::vector<std::string>& args) {
  if (args.size() != 3 || args[0] != "degen") {
    std::fprintf(stderr, "gpa-degen child: expected 'degen ROUNDS malloc|memkit'\n");
    return 2;
  }
  const auto rounds = static_cast<std::size_t>(std::strtoull(args[1].c_str(), nullptr, 10));
  double ns = -1;
  if (args[2] == "malloc") {
    ns = run_degen<c_heap>(rounds);
  } else if (args[2] == "memkit") {
    ns = run_degen<memkit_heap>(rounds);
  } else {
    std::fprintf(stderr, "gpa-degen child: unknown mode '%s'\n", args[2].c_str());
    return 2;
  }
  if (ns < 0) return 3;
  auto peak = os::peak_resident_bytes();
  std::printf("ns=%.0f\nops=%.0f\npeak_rss=%zu\n", ns, operations(rounds),
              peak.ok() ? peak.value() : std::size_t{0});
  return 0;
}

// One subject: how its child is started.
struct subject {
  std::string name;
  std::string mode;                   // child mode: "malloc" or "memkit"
  std::vector<std::string> environment;
  bool available = true;
  std::string missing_note;           // why it is not available
  bool small_rounds_only = false;     // too slow to run the large round count in this profile
};

// Per-operation times of one subject, by round count (0 when it failed or is missing).
struct measurement {
  double small_rounds_ns = 0;
  double large_rounds_ns = 0;
  double large_low = 0, large_high = 0;  // range over the repetitions at the large round count
};

void run(context& ctx) {
  const std::size_t small_rounds = 5000;
  const std::size_t large_rounds = ctx.pick<std::size_t>(20000, 200000, 200000);
  const int repetitions = ctx.pick(1, 7, 11);

  const malloc_peer dropin_peer = memkit_malloc();
  const std::string& memkit_library = dropin_peer.preload_path;
  const bool have_dropin = dropin_peer.installed;
  const std::string preload = "LD_PRELOAD=" + memkit_library;
  const std::string dropin_missing = "libmemkit_malloc.so not built";

  std::vector<subject> subjects;
  for (auto& peer : malloc_peers()) {
    subjects.push_back({peer.name, "malloc", peer.environment(), peer.installed, "not installed"});
    // glibc at its best reasonable configuration beside its defaults (bench/support/peers.hpp).
    if (peer.name == "glibc") subjects.push_back({glibc_tuned().name, "malloc", glibc_tuned().environment(), true, ""});
  }
  subjects.push_back({dropin_peer.name, "malloc", {preload}, have_dropin, dropin_missing});
  subjects.push_back({"memkit (C++ API)", "memkit", {}, true, ""});
  // Debug mode through the drop-in, as `memkit-run --debug` runs a program. No leak report: the
  // child's own leftovers (stdio buffers) are not what is measured.
  subjects.push_back({"memkit debug, capture off", "malloc",
                      {preload, "MEMKIT_DEBUG=1", "MEMKIT_STACK_TRACES=0", "MEMKIT_LEAKS=0"},
                      have_dropin, dropin_missing});
  // A stack walk per allocation and per free costs microseconds: outside the full profile this
  // subject runs the seed's 5,000 rounds only.
  subjects.push_back({"memkit debug, capture on", "malloc",
                      {preload, "MEMKIT_DEBUG=1", "MEMKIT_STACK_TRACES=1", "MEMKIT_LEAKS=0"},
                      have_dropin, dropin_missing, ctx.profile() != profile::full});

  std::vector<measurement> results(subjects.size());
  const std::size_t steps = subjects.size() * 2;
  std::size_t step = 0;
  // Repetitions are interleaved (every subject once, then every subject again, ...) so that the
  // load of a shared machine, which drifts over a run, weighs on all subjects alike.
  for (std::size_t rounds : {small_rounds, large_rounds}) {
    auto runs = [&](const subject& who) {
      return who.available && !(who.small_rounds_only && rounds != small_rounds);
    };
    std::vector<std::vector<double>> per_op(subjects.size()), rss(subjects.size());
    std::vector<std::string> failure(subjects.size());
    for (int i = 0; i < repetitions; ++i) {
      for (std::size_t s = 0; s < subjects.size(); ++s) {
        auto& who = subjects[s];
        if (!runs(who) || !failure[s].empty()) continue;
        ctx.progress(who.name + " #" + std::to_string(i + 1), step, steps);
        auto out = ctx.run_self({"degen", std::to_string(rounds), who.mode}, who.environment);
        double ns = out.number("ns"), ops = out.number("ops");
        if (!out.ok() || ns < 0 || ops <= 0) {
          failure[s] = "child failed (exit " + std::to_string(out.exit_code) + ", signal " +
                       std::to_string(out.signal) + ")";
          continue;
        }
        per_op[s].push_back(ns / ops);
        rss[s].push_back(out.number("peak_rss", 0));
      }
    }
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      auto& who = subjects[s];
      ++step;
      row r{"time per operation", who.name, {{"rounds", std::to_string(rounds)},
            {"size", std::to_string(allocation_size)},
            {"slots", std::to_string(os::page_size() / allocation_size)}}, {}, {}};
      if (!runs(who)) {
        r.note = who.available ? "not run in this profile (see --profile full)" : who.missing_note;
      } else if (!failure[s].empty()) {
        r.note = failure[s];
      } else {
        const spread time = spread_of(per_op[s]);
        const double value = time.median;
        r.metrics = {{"time", value, "ns", time.low, time.high, time.repetitions}, {"peak_rss", median(rss[s]), "bytes"}};
        (rounds == small_rounds ? results[s].small_rounds_ns : results[s].large_rounds_ns) = value;
        if (rounds != small_rounds) {
          results[s].large_low = time.low;
          results[s].large_high = time.high;
        }
      }
      ctx.record(std::move(r));
    }
  }

  auto find = [&](const std::string& name) -> const measurement* {
    for (std::size_t s = 0; s < subjects.size(); ++s)
      if (subjects[s].name == name && results[s].small_rounds_ns > 0 && results[s].large_rounds_ns > 0)
        return &results[s];
    return nullptr;
  };
  const std::string large = std::to_string(large_rounds / 1000) + "k";
  for (const char* name : {"memkit (LD_PRELOAD)", "memkit (C++ API)", "memkit debug, capture off"}) {
    if (auto* m = find(name))
      ctx.check({std::string(name) + ": per-op time at " + large + " / at 5k rounds",
                 m->large_rounds_ns / m->small_rounds_ns, "<=", 1.1, "x"});
  }
  // The same ratio for the peers, for context: the 200k-round run keeps 40 times more memory
  // live (each kept block is a fresh line, every 32nd a fresh page), which costs every allocator
  // something that is not a search.
  std::string peer_ratios;
  for (auto& peer : malloc_peers()) {
    if (auto* m = find(peer.name)) {
      char text[64];
      std::snprintf(text, sizeof text, "%s%s %.3gx", peer_ratios.empty() ? "" : ", ",
                    peer.name.c_str(), m->large_rounds_ns / m->small_rounds_ns);
      peer_ratios += text;
    }
  }
  if (!peer_ratios.empty()) ctx.note("per-op time at " + large + " / at 5k rounds for the peers: " + peer_ratios);
  const measurement* dropin = find("memkit (LD_PRELOAD)");
  const measurement* mimalloc = find("mimalloc");
  if (dropin != nullptr && mimalloc != nullptr)
    ctx.check(peer_figure("mimalloc / memkit (LD_PRELOAD), per-op time at " + large + " rounds", "memkit (LD_PRELOAD)",
                          "mimalloc", mimalloc->large_rounds_ns / dropin->large_rounds_ns,
                          mimalloc->large_low / dropin->large_high, mimalloc->large_high / dropin->large_low, 1.0));
  else
    ctx.note("memkit vs mimalloc not compared: one of them is missing");
  for (const char* peer : {"glibc", "glibc (tuned)", "jemalloc", "tcmalloc"}) {
    const measurement* m = find(peer);
    if (m == nullptr || dropin == nullptr) continue;
    const double ratio = m->large_rounds_ns / dropin->large_rounds_ns;
    char text[240];
    std::snprintf(text, sizeof text, "%s / memkit (LD_PRELOAD), per-op time at %s rounds: %.3gx (%.3g-%.3g), %s", peer,
                  large.c_str(), ratio, m->large_low / dropin->large_high, m->large_high / dropin->large_low,
                  ratio >= 1 ? "memkit faster" : "memkit slower");
    ctx.note(text);
  }
  if (auto* debug = find("memkit debug, capture off"); debug != nullptr && dropin != nullptr)
    ctx.check({"debug (all checks, capture off) vs release, per-op time at " + large + " rounds",
               debug->large_rounds_ns / dropin->large_rounds_ns, "<=", 5.0, "x"});
  // Stack capture has no target; its cost is reported at the largest round count it ran.
  for (std::size_t s = 0; s < subjects.size(); ++s) {
    if (subjects[s].name != "memkit debug, capture on") continue;
    const std::size_t d = static_cast<std::size_t>(std::find_if(subjects.begin(), subjects.end(),
        [](const subject& x) { return x.name == "memkit (LD_PRELOAD)"; }) - subjects.begin());
    const bool large_ran = results[s].large_rounds_ns > 0 && results[d].large_rounds_ns > 0;
    const double capture = large_ran ? results[s].large_rounds_ns : results[s].small_rounds_ns;
    const double release = large_ran ? results[d].large_rounds_ns : results[d].small_rounds_ns;
    if (capture <= 0 || release <= 0) break;
    char text[200];
    std::snprintf(text, sizeof text,
                  "debug with stack capture: %.0f ns per operation, %.1fx release, at %s rounds "
                  "(no target; reported as the issue asks)",
                  capture, capture / release, large_ran ? large.c_str() : "5k");
    ctx.note(text);
  }
  ctx.note("per-op = (allocations + frees) / time of the loop in a fresh child process; peers "
           "and the drop-in by LD_PRELOAD; median of " + std::to_string(repetitions) + " runs");
}

}  // namespace

MEMKIT_BENCH_SUITE(gpa_degen, "gpa-degen",
                   "seed 001: Zig GPA's worst case (keep 1 of each bucket), 5k vs 200k rounds, "
                   "memkit vs glibc/jemalloc/mimalloc/tcmalloc and debug mode",
                   run, child);

}  // namespace memkit::bench
