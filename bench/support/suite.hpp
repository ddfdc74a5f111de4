// The benchmark runner's suite interface. A suite is one file under bench/ that registers itself
// with MEMKIT_BENCH_SUITE and reports rows (one subject measured under one set of parameters) and
// figures (a ratio against a peer, checked against the target the project set). The runner
// (tools/memkit_bench.cpp) prints tables, a figure summary, and writes JSON and CSV.
#pragma once

#include <cmath>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memkit::bench {

// How much a run measures. smoke: seconds, for CI; quick: the default, minutes; full: the seeds'
// sizes, bounded by the machine's memory.
enum class profile { smoke, quick, full };

// "smoke", "quick" or "full".
const char* profile_name(profile p) noexcept;

// One measured quantity.
struct metric {
  std::string name;   // e.g. "time", "peak_rss", "appends_per_s"
  double value = 0;   // in `unit` (the median when the metric was repeated)
  std::string unit;   // e.g. "ns", "bytes", "1/s", "x"
  // Optional: the spread over `repetitions` measurements (min and max); NaN when not repeated.
  double low = NAN;
  double high = NAN;
  int repetitions = 0;
};

// One subject measured in one configuration.
struct row {
  std::string experiment;  // e.g. "append-throughput"
  std::string subject;     // e.g. "memkit::dyn_array", "std::vector"
  std::vector<std::pair<std::string, std::string>> parameters;  // e.g. {"elements", "100000000"}
  std::vector<metric> metrics;
  std::string note;  // e.g. "not installed", "does not fit in memory"
};

// A target from an issue, checked against what this run measured.
struct figure {
  std::string name;        // what is compared, e.g. "dyn_array vs std::vector append throughput"
  double measured = 0;     // the ratio or value measured in this run
  std::string relation;    // ">=" or "<="
  double target = 0;       // the bound
  std::string unit;        // "x" for ratios
  bool met() const noexcept { return relation == ">=" ? measured >= target : measured <= target; }

  // Optional fields (a figure that leaves them out is printed as given).
  // When `peer` is set, `measured` is peer / memkit for `quantity` ("time": above 1 means memkit
  // faster; "memory" or "faults": above 1 means memkit uses less), and the runner prints it with
  // the words "memkit faster" / "memkit slower" (or "smaller" / "larger").
  std::string peer;                // e.g. "std::vector"
  std::string subject;             // the memkit side, e.g. "memkit::dyn_array"
  std::string quantity;            // "time" (also when empty), "memory" or "faults"
  double low = NAN;                // spread of `measured` over repetitions (min), NaN if unknown
  double high = NAN;               // spread of `measured` over repetitions (max)
  std::string seed_quote;          // the seed's own figure, exactly, with units and machine
};

// A figure comparing memkit with a peer: `ratio` is peer / memkit (the cost of the peer over
// memkit's: above 1, memkit is faster or smaller), `low`/`high` its spread over repetitions.
figure peer_figure(std::string name, std::string subject, std::string peer, double ratio, double low,
                   double high, double target, std::string quantity = "time");

// Output of a child process run by run_self() or run_program().
struct child_result {
  int exit_code = -1;    // exit status, or -1 when killed by a signal
  int signal = 0;        // the signal that ended it, or 0
  std::string output;    // everything it wrote to stdout
  double wall_ns = 0;     // from start to reaping, run_program() only
  double peak_rss = 0;    // bytes, its largest process (with its children), run_program() only
  double page_faults = 0; // minor + major, summed over it and its children, run_program() only
  // Parses "key=value" lines of output into a map (other lines are ignored).
  std::map<std::string, std::string> values() const;
  // The value of "key" as a number, or `fallback` when missing.
  double number(const std::string& key, double fallback = -1) const;
  bool ok() const noexcept { return exit_code == 0 && signal == 0; }
};

// What a suite gets from the runner.
class context {
 public:
  virtual ~context() = default;
  // The profile chosen on the command line.
  virtual bench::profile profile() const noexcept = 0;
  // Picks the value for the current profile.
  template <class T>
  T pick(T smoke, T quick, T full) const {
    return profile() == profile::smoke ? smoke : profile() == profile::quick ? quick : full;
  }
  // Records one measured row.
  virtual void record(row r) = 0;
  // Records a figure (target check).
  virtual void check(figure f) = 0;
  // Adds a line of explanation under the suite's tables (e.g. "jemalloc: not installed").
  virtual void note(std::string text) = 0;
  // Records a fact about how this run measured (e.g. "bound: populated mapping"), kept in the
  // JSON under the suite's "parameters" and shown in the report. The default keeps it as a note.
  virtual void describe(std::string key, std::string value) { note(key + ": " + value); }
  // Shows progress on a terminal (nothing when stderr is not a terminal).
  virtual void progress(std::string_view step, std::size_t done, std::size_t total) = 0;
  // Runs this executable as `memkit-bench --child <suite> args...` and collects its stdout. `env`
  // entries ("NAME=value") are added to the environment (LD_PRELOAD for malloc peers, say).
  virtual child_result run_self(const std::vector<std::string>& args,
                                const std::vector<std::string>& env = {}) = 0;
  // The folder this run writes its results to (suites may add files, e.g. the seed's CSVs).
  virtual const std::string& output_directory() const noexcept = 0;
};

// A suite: `run` measures in the runner's process; `child`, when set, is what a child process
// started with run_self() executes (it prints key=value lines and returns an exit code).
struct suite {
  std::string name;         // command-line name, e.g. "reserve-commit"
  std::string description;  // one line: the seed and what it measures
  std::function<void(context&)> run;
  std::function<int(const std::vector<std::string>&)> child;
};

// Runs `program` with `args` (and `env` entries "NAME=value" added to this process's environment),
// waits for it, and collects its stdout. stderr is inherited. For executables other than the
// runner itself (e.g. a suite's code built at another optimization level); see context::run_self.
child_result run_program(const std::string& program, const std::vector<std::string>& args,
                         const std::vector<std::string>& env = {});

// The process id of the child that run_program() is waiting for, 0 when none. The runner's
// interruption handler ends it so an interrupted run does not leave it behind.
int running_child() noexcept;

// Adds a suite to the registry; returns a token so registration can happen at static
// initialization.
int register_suite(suite s);

// All registered suites, in name order.
const std::vector<suite>& registered_suites();

}  // namespace memkit::bench

// Registers a suite defined in this file. Usage:
//   MEMKIT_BENCH_SUITE(reserve_commit, "reserve-commit", "seed 000: ...", run_fn, child_fn)
#define MEMKIT_BENCH_SUITE(identifier, name, description, run_function, child_function)      \
  [[maybe_unused]] static const int memkit_bench_suite_##identifier =                        \
      ::memkit::bench::register_suite({name, description, run_function, child_function})
