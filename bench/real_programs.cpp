// Suite "real-programs": programs from Debian's packages run whole under each malloc (glibc;
// jemalloc, mimalloc and tcmalloc preloaded; memkit's drop-in preloaded): sqlite3 building,
// indexing and querying a table, python3 running an allocation-heavy script, g++ -O2 compiling a
// template-heavy translation unit, redis-server driven by redis-benchmark on loopback, and z3
// proving a pigeonhole formula unsatisfiable.
//
// The workloads (commands, inputs, the output that must not depend on the malloc) are defined in
// bench/real_programs/workload, which tests/real_programs/run also uses to check the drop-in's
// correctness on the same programs. This file only times them: each run is the workload script in
// a fresh process tree, reaped with wait4 so its rusage gives peak RSS (the largest process of the
// tree) and page faults (summed over the tree); wall time is measured around it. Repetitions are
// interleaved across subjects. A run whose output differs from glibc's is an error row.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "measure.hpp"
#include "peers.hpp"
#include "suite.hpp"

#ifndef MEMKIT_BENCH_REAL_PROGRAMS_DIR
#define MEMKIT_BENCH_REAL_PROGRAMS_DIR ""
#endif


namespace memkit::bench {
namespace {

struct workload {
  const char* name;         // the workload script's name
  const char* experiment;   // row label
  const char* size_unit;    // what the size counts
};

const workload workloads[] = {
    {"sqlite", "sqlite3", "rows"},
    {"python", "python3", "records"},
    {"gxx", "g++ -O2", "instantiation sets"},
    {"redis", "redis-server", "requests per command"},
    {"z3", "z3", "holes (pigeonhole)"},
};

// One run of the workload script: what wait4 and the clock saw.
struct run_result {
  bool ok = false;
  std::string error;
  std::string values;  // the script's stdout (key=value lines)
  double wall_ns = 0;
  double peak_rss = 0;     // bytes, the largest process of the tree
  double page_faults = 0;  // minor + major, summed over the tree
  double number(const std::string& key) const {
    child_result parsed;
    parsed.output = values;
    return parsed.number(key);
  }
  std::string digest() const {
    child_result parsed;
    parsed.output = values;
    auto all = parsed.values();
    auto it = all.find("digest");
    return it == all.end() ? std::string() : it->second;
  }
};

std::string script_path() { return std::string(MEMKIT_BENCH_REAL_PROGRAMS_DIR) + "/workload"; }

// Runs the workload script with `extra_env` added (and no preload of the runner's own), through
// run_program, so an interrupted run ends it like any other child.
run_result run_script(const std::vector<std::string>& args, std::vector<std::string> extra_env) {
  extra_env.insert(extra_env.begin(), "LD_PRELOAD=");
  if (std::none_of(extra_env.begin(), extra_env.end(),
                   [](const std::string& e) { return e.rfind("MEMKIT_WORKLOAD_PRELOAD=", 0) == 0; }))
    extra_env.push_back("MEMKIT_WORKLOAD_PRELOAD=");
  const child_result child = run_program(script_path(), args, extra_env);
  run_result result;
  result.values = child.output;
  result.wall_ns = child.wall_ns;
  result.peak_rss = child.peak_rss;
  result.page_faults = child.page_faults;
  if (child.ok()) {
    result.ok = true;
  } else if (child.signal != 0) {
    result.error = "killed by signal " + std::to_string(child.signal);
  } else if (child.exit_code == 77) {
    result.error = "not installed";
  } else if (child.output.rfind("spawn failed", 0) == 0 || child.output.rfind("pipe failed", 0) == 0) {
    result.error = "cannot start the workload script: " + child.output;
  } else {
    result.error = "failed (exit status " + std::to_string(child.exit_code) + ")";
  }
  return result;
}

struct subject {
  std::string name;
  std::string preload;  // empty: the system's malloc
  bool available = true;
  std::string missing_note;
};

// The workload's size for this profile (the script's `sizes` prints smoke, quick, full, test).
std::string size_for(context& ctx, const workload& w) {
  auto sizes = run_program(script_path(), {"sizes", w.name});
  std::vector<std::string> words;
  std::string word;
  for (char c : sizes.output + " ") {
    if (c == ' ' || c == '\n') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (!sizes.ok() || words.size() < 3) return {};
  return ctx.pick(words[0], words[1], words[2]);
}

std::string ratio_text(const std::vector<double>& ratios) {
  char text[120];
  const double mid = median(ratios);
  std::snprintf(text, sizeof text, "%.3gx (%.3g-%.3g), memkit %s", mid,
                *std::min_element(ratios.begin(), ratios.end()),
                *std::max_element(ratios.begin(), ratios.end()), mid >= 1 ? "faster" : "slower");
  return text;
}

void run(context& ctx) {
  const int repetitions = ctx.pick(1, 3, 5);
  if (std::string(MEMKIT_BENCH_REAL_PROGRAMS_DIR).empty() || ::access(script_path().c_str(), X_OK) != 0) {
    ctx.note("bench/real_programs/workload not found at " + script_path());
    return;
  }
  std::vector<subject> subjects;
  // The smoke profile checks that every program runs and gives the same output on glibc and on
  // memkit, in seconds; the peers join from the quick profile on.
  for (auto& peer : malloc_peers())
    if (ctx.profile() != profile::smoke || peer.name == "glibc")
      subjects.push_back({peer.name, peer.preload_path, peer.installed, "not installed"});
  const malloc_peer dropin = memkit_malloc();
  subjects.push_back({dropin.name, dropin.preload_path, dropin.installed, "libmemkit_malloc.so not built"});
  const std::size_t memkit_index = subjects.size() - 1;

  char scratch_template[] = "/tmp/memkit-real-programs-XXXXXX";
  if (::mkdtemp(scratch_template) == nullptr) {
    ctx.note(std::string("cannot create a scratch directory: ") + std::strerror(errno));
    return;
  }
  const std::filesystem::path scratch = scratch_template;

  const std::size_t workload_count = std::size(workloads);
  std::size_t step = 0;
  const std::size_t steps = workload_count * subjects.size() * static_cast<std::size_t>(repetitions);
  for (const auto& w : workloads) {
    const std::string size = size_for(ctx, w);
    auto availability = run_program(script_path(), {"available", w.name});
    if (!availability.ok() || size.empty()) {
      std::string why = availability.output;
      while (!why.empty() && why.back() == '\n') why.pop_back();
      for (auto& who : subjects)
        ctx.record(row{w.experiment, who.name, {}, {}, why.empty() ? "workload unavailable" : why});
      step += subjects.size() * static_cast<std::size_t>(repetitions);
      continue;
    }
    std::vector<std::vector<run_result>> results(subjects.size());
    std::vector<std::string> failure(subjects.size());
    std::string reference_digest;  // the first successful run's (glibc's, normally)
    for (int i = 0; i < repetitions; ++i) {
      for (std::size_t s = 0; s < subjects.size(); ++s) {
        auto& who = subjects[s];
        ctx.progress(std::string(w.experiment) + " / " + who.name, step++, steps);
        if (!who.available || !failure[s].empty()) continue;
        const auto dir = scratch / (std::string(w.name) + "-" + std::to_string(s) + "-" + std::to_string(i));
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        std::vector<std::string> env;
        if (!who.preload.empty()) env.push_back("MEMKIT_WORKLOAD_PRELOAD=" + who.preload);
        auto r = run_script({"run", w.name, size, dir.string()}, env);
        std::filesystem::remove_all(dir, ec);
        if (!r.ok) {
          failure[s] = r.error;
          continue;
        }
        const std::string digest = r.digest();
        if (reference_digest.empty()) reference_digest = digest;
        if (digest.empty() || (!reference_digest.empty() && digest != reference_digest)) {
          failure[s] = "output differs from glibc's (digest " + digest.substr(0, 12) + ")";
          continue;
        }
        results[s].push_back(std::move(r));
      }
    }
    const bool rate = std::string(w.name) == "redis";
    // Per repetition, peer / memkit of the time (for redis: of the time per request, i.e.
    // memkit's requests per second over the peer's), so > 1 means memkit faster.
    auto time_of = [&](const run_result& r) {
      return rate ? 1e9 / std::max(r.number("requests_per_s"), 1.0) : r.wall_ns;
    };
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      auto& who = subjects[s];
      row r{w.experiment, who.name, {{w.size_unit, size}, {"repetitions", std::to_string(repetitions)}}, {}, {}};
      if (!who.available) {
        r.note = who.missing_note;
      } else if (!failure[s].empty()) {
        r.note = failure[s];
      } else {
        std::vector<double> wall, rss, faults, rps, server_cpu;
        for (auto& x : results[s]) {
          wall.push_back(x.wall_ns);
          rss.push_back(x.peak_rss);
          faults.push_back(x.page_faults);
          if (rate) {
            rps.push_back(x.number("requests_per_s"));
            server_cpu.push_back(x.number("server_cpu_s") * 1e9);
          }
        }
        r.metrics = {{"time", median(wall), "ns"},
                     {"time_min", *std::min_element(wall.begin(), wall.end()), "ns"},
                     {"time_max", *std::max_element(wall.begin(), wall.end()), "ns"},
                     {"peak_rss", median(rss), "bytes"},
                     {"page_faults", median(faults), ""}};
        if (rate) {
          r.metrics.push_back({"requests_per_s", median(rps), "1/s"});
          r.metrics.push_back({"server_cpu", median(server_cpu), "ns"});
        }
        if (s != memkit_index && failure[memkit_index].empty() && subjects[memkit_index].available &&
            results[memkit_index].size() == results[s].size()) {
          std::vector<double> ratios, rss_ratios, cpu_ratios;
          for (std::size_t i = 0; i < results[s].size(); ++i) {
            const auto& peer_run = results[s][i];
            const auto& memkit_run = results[memkit_index][i];
            ratios.push_back(time_of(peer_run) / time_of(memkit_run));
            rss_ratios.push_back(peer_run.peak_rss / memkit_run.peak_rss);
            if (rate && memkit_run.number("server_cpu_s") > 0)
              cpu_ratios.push_back(peer_run.number("server_cpu_s") / memkit_run.number("server_cpu_s"));
          }
          r.metrics.push_back({rate ? "time_per_request_vs_memkit" : "time_vs_memkit", median(ratios), "x"});
          r.metrics.push_back({"time_vs_memkit_min", *std::min_element(ratios.begin(), ratios.end()), "x"});
          r.metrics.push_back({"time_vs_memkit_max", *std::max_element(ratios.begin(), ratios.end()), "x"});
          r.metrics.push_back({"peak_rss_vs_memkit", median(rss_ratios), "x"});
          ctx.note(std::string(w.experiment) + ": " + who.name + " / memkit " +
                   (rate ? "time per request " : "wall time ") + ratio_text(ratios));
          if (cpu_ratios.size() == ratios.size()) {
            r.metrics.push_back({"server_cpu_vs_memkit", median(cpu_ratios), "x"});
            ctx.note(std::string(w.experiment) + ": " + who.name + " / memkit server CPU time " +
                     ratio_text(cpu_ratios));
          }
        }
      }
      ctx.record(std::move(r));
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
  ctx.note("each run: bench/real_programs/workload in a fresh process tree; time = wall time of "
           "the tree (redis: requests per second from redis-benchmark, and the server's CPU time), "
           "peak_rss = its largest "
           "process, page_faults = summed over it; median of " + std::to_string(repetitions) +
           " interleaved repetitions; ratios are peer / memkit per repetition, median (min-max)");
}

}  // namespace

MEMKIT_BENCH_SUITE(real_programs, "real-programs",
                   "sqlite3, python3, g++, redis-server, z3 from Debian run whole under each malloc; "
                   "wall time, peak RSS, page faults; outputs checked",
                   run, nullptr);

}  // namespace memkit::bench
