// memkit-bench: runs the benchmark suites (one per seed experiment) by name, prints a summary of
// the figures (every target, the ratio peer / memkit with its spread, met or missed), and writes
// results.json (schema 2: machine, build, peers' versions, rows with structured parameters and
// metrics) and results.csv to an output folder, rewriting them as experiments finish so an
// interrupted run keeps what it measured.
//
//   memkit-bench [--profile smoke|quick|full] [--out DIR] [--verbose] [--informational]
//                [--compare OLD/results.json] [--list] [SUITE...]
//
// Exit status: 0 when every figure met its target (or --informational), 1 when one missed,
// 2 on a usage error, 128 + the signal's number when interrupted by SIGINT or SIGTERM.
#include <pthread.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "measure.hpp"
#include "suite.hpp"

#ifndef MEMKIT_BENCH_SOURCE_DIR
#define MEMKIT_BENCH_SOURCE_DIR ""
#endif
#ifndef MEMKIT_BENCH_BUILD_TYPE
#define MEMKIT_BENCH_BUILD_TYPE ""
#endif
#ifndef MEMKIT_BENCH_CXX_FLAGS
#define MEMKIT_BENCH_CXX_FLAGS ""
#endif
#ifndef MEMKIT_BENCH_COMPILER
#define MEMKIT_BENCH_COMPILER ""
#endif

namespace memkit::bench {
namespace {

constexpr int schema_version = 2;

std::string self_path;

struct suite_results {
  std::string suite;
  std::string description;
  std::vector<row> rows;
  std::vector<figure> figures;
  std::vector<std::string> notes;
  std::vector<std::pair<std::string, std::string>> facts;
  double seconds = 0;
  bool finished = false;
};

// Everything the run measured so far; the interruption handler writes it out.
struct run_state {
  std::mutex mutex;
  std::string out;
  bench::profile profile = profile::quick;
  std::vector<suite_results> suites;  // reserved up front: never reallocates during the run
  nlohmann::json machine;
  nlohmann::json build;
  nlohmann::json peers;
  double estimated_seconds = 0;
  clock::time_point started = clock::now();
  clock::time_point last_write = clock::now();
  bool informational = false;
};
run_state state;

// ---- presentation ----------------------------------------------------------------------------

bool lower_is_better(const std::string& unit, const std::string& name) {
  if (unit == "1/s" || name.find("per_s") != std::string::npos) return false;
  return unit == "ns" || unit == "s" || unit == "ms" || unit == "us" || unit == "bytes" ||
         unit == "pages" || unit == "faults" || unit == "instructions";
}

// "memkit faster" / "memkit slower" (or smaller/larger for memory) for a peer / memkit ratio.
std::string verdict_words(double ratio, const std::string& quantity) {
  const bool memory = quantity == "memory" || quantity == "faults";
  if (!(ratio > 0) || !std::isfinite(ratio)) return "not comparable";
  if (ratio >= 1) return memory ? "memkit smaller" : "memkit faster";
  return memory ? "memkit larger" : "memkit slower";
}

std::string format_ratio(double r) {
  char text[32];
  std::snprintf(text, sizeof text, r >= 100 ? "%.0f" : r >= 10 ? "%.1f" : "%.2f", r);
  return text;
}

std::string spread_text(double low, double high) {
  if (std::isnan(low) || std::isnan(high)) return "";
  return " (" + format_ratio(low) + "-" + format_ratio(high) + ")";
}

std::string figure_text(const figure& f) {
  std::string text;
  if (!f.peer.empty()) {
    // The figure's name says what is divided by what ("peer / memkit ..."), so the line carries the
    // ratio, its range and the verdict in words.
    text = format_ratio(f.measured) + "x" + spread_text(f.low, f.high) + ", " + verdict_words(f.measured, f.quantity);
  } else {
    text = format_number(f.measured) + f.unit + spread_text(f.low, f.high);
  }
  return text;
}

std::string format_metric(const metric& m) {
  if (m.unit == "bytes") return format_bytes(m.value);
  if (m.unit == "ns") return format_nanoseconds(m.value);
  if (m.unit == "x") return format_number(m.value) + "x";
  return format_number(m.value) + (m.unit.empty() ? "" : " " + m.unit);
}

std::string parameters_text(const row& r) {
  std::string text;
  for (auto& [k, v] : r.parameters) text += (text.empty() ? "" : ", ") + k + "=" + v;
  return text;
}

bool is_memkit_subject(const std::string& subject) {
  for (const char* name : {"memkit", "dyn_array", "virtual_arena", "block_heap", "small_vector<",
                           "general_allocator"})
    if (subject.find(name) != std::string::npos && subject.find("std::") != 0 &&
        subject.find("boost") != 0 && subject.find("absl") != 0)
      return true;
  return false;
}

// --verbose: each experiment as a table of raw rows; within one parameter set, a peer's first
// metric is also shown as peer / memkit against the set's first memkit subject.
void print_tables(const suite_results& results) {
  std::vector<std::string> experiments;
  for (auto& r : results.rows)
    if (std::find(experiments.begin(), experiments.end(), r.experiment) == experiments.end())
      experiments.push_back(r.experiment);
  for (auto& experiment : experiments) {
    std::printf("\n== %s / %s\n", results.suite.c_str(), experiment.c_str());
    std::string last_parameters = "\x01";
    const row* memkit_row = nullptr;
    for (auto& r : results.rows) {
      if (r.experiment != experiment) continue;
      std::string parameters = parameters_text(r);
      if (parameters != last_parameters) {
        std::printf("  %s\n", parameters.empty() ? "(no parameters)" : parameters.c_str());
        last_parameters = parameters;
        memkit_row = nullptr;
        for (auto& other : results.rows)
          if (other.experiment == experiment && parameters_text(other) == parameters &&
              !other.metrics.empty() && is_memkit_subject(other.subject)) {
            memkit_row = &other;
            break;
          }
      }
      std::printf("    %-34s", r.subject.c_str());
      for (auto& m : r.metrics) {
        std::printf("  %s=%s", m.name.c_str(), format_metric(m).c_str());
        if (!std::isnan(m.low)) std::printf(" [%s..%s]", format_metric({m.name, m.low, m.unit}).c_str(),
                                            format_metric({m.name, m.high, m.unit}).c_str());
      }
      if (memkit_row != nullptr && memkit_row != &r && !r.metrics.empty() && !is_memkit_subject(r.subject) &&
          r.metrics[0].name == memkit_row->metrics[0].name && memkit_row->metrics[0].value != 0 &&
          r.metrics[0].value != 0) {
        const auto& m = r.metrics[0];
        double ratio = lower_is_better(m.unit, m.name) ? m.value / memkit_row->metrics[0].value
                                                       : memkit_row->metrics[0].value / m.value;
        std::printf("  (%s / %s %sx, %s)", r.subject.c_str(), memkit_row->subject.c_str(),
                    format_ratio(ratio).c_str(), verdict_words(ratio, m.unit == "bytes" ? "memory" : "time").c_str());
      }
      if (!r.note.empty()) std::printf("  [%s]", r.note.c_str());
      std::printf("\n");
    }
  }
  for (auto& n : results.notes) std::printf("  note: %s\n", n.c_str());
}

std::string duration_text(double seconds) {
  char text[32];
  if (seconds < 60) std::snprintf(text, sizeof text, "%.0f s", seconds);
  else std::snprintf(text, sizeof text, "%d min %02d s", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return text;
}

// The short summary of one suite: its figures, one line each.
void print_suite_summary(const suite_results& s) {
  std::size_t met = 0;
  for (auto& f : s.figures) met += f.met() ? 1 : 0;
  std::printf("\n== %s: %zu rows, %zu of %zu figures met, %s\n", s.suite.c_str(), s.rows.size(), met,
              s.figures.size(), duration_text(s.seconds).c_str());
  for (auto& f : s.figures) {
    std::printf("  %-6s %s: %s  [target %s %s%s]\n", f.met() ? "met" : "MISSED", f.name.c_str(),
                figure_text(f).c_str(), f.relation.c_str(), format_number(f.target).c_str(), f.unit.c_str());
  }
  for (auto& n : s.notes)
    if (n.rfind("suite failed", 0) == 0 || n.find("not installed") != std::string::npos)
      std::printf("  note: %s\n", n.c_str());
}

// ---- machine and build -----------------------------------------------------------------------

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

nlohmann::json describe_machine() {
  nlohmann::json m;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      m["cpu"] = trim(line.substr(line.find(':') + 2));
      break;
    }
  }
  m["cores"] = std::thread::hardware_concurrency();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal:", 0) == 0) m["memory_bytes"] = std::strtod(line.c_str() + 9, nullptr) * 1024;
  }
  utsname u{};
  if (::uname(&u) == 0) m["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  std::string thp = read_first_line("/sys/kernel/mm/transparent_hugepage/enabled");
  auto open = thp.find('['), close = thp.find(']');
  m["transparent_huge_pages"] = open != std::string::npos && close > open ? thp.substr(open + 1, close - open - 1) : "unknown";
  m["page_size"] = ::sysconf(_SC_PAGESIZE);
  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) == 3) m["load_average_at_start"] = {load[0], load[1], load[2]};
  return m;
}

nlohmann::json describe_build() {
  nlohmann::json b;
  b["compiler"] = std::string(MEMKIT_BENCH_COMPILER) + " (" + __VERSION__ + ")";
  b["build_type"] = MEMKIT_BENCH_BUILD_TYPE;
  b["cxx_flags"] = trim(MEMKIT_BENCH_CXX_FLAGS);
  std::string source = MEMKIT_BENCH_SOURCE_DIR;
  if (!source.empty() && ::access("/usr/bin/git", X_OK) == 0) {
    auto commit = run_program("/usr/bin/git", {"-C", source, "rev-parse", "HEAD"});
    if (commit.ok()) b["git_commit"] = trim(commit.output);
    auto dirty = run_program("/usr/bin/git", {"-C", source, "status", "--porcelain", "--untracked-files=no"});
    if (dirty.ok()) b["git_dirty"] = !trim(dirty.output).empty();
  }
  return b;
}

// The Debian package version of every peer library (and of what the build used).
nlohmann::json describe_peers() {
  nlohmann::json p = nlohmann::json::object();
  const std::vector<std::string> packages = {"libc6", "libjemalloc2", "libmimalloc2.0", "libgoogle-perftools4",
                                             "libtcmalloc-minimal4", "libboost-dev", "libabsl-dev",
                                             "libstdc++6", "g++", "clang"};
  if (::access("/usr/bin/dpkg-query", X_OK) != 0) return p;
  for (auto& package : packages) {
    auto r = run_program("/usr/bin/dpkg-query", {"-W", "-f=${Version}", package});
    p[package] = r.ok() && !r.output.empty() ? trim(r.output) : "not installed";
  }
  return p;
}

// ---- output ----------------------------------------------------------------------------------

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// Writes results.json and results.csv (through temporary files, so a reader never sees half of
// one). Called with state.mutex held.
void write_outputs(const std::string& status) {
  nlohmann::json json;
  json["schema_version"] = schema_version;
  json["tool"] = "memkit-bench";
  json["profile"] = profile_name(state.profile);
  char stamp[64];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  json["date"] = stamp;
  json["status"] = status;  // "running", "complete", "interrupted by SIGINT", ...
  json["informational"] = state.informational;
  json["estimated_seconds"] = state.estimated_seconds;
  json["elapsed_seconds"] = nanoseconds(state.started, clock::now()) / 1e9;
  json["machine"] = state.machine;
  // The load as this file was written (at the end, once the run is over): a shared machine's load
  // drifts, and a reader of the figures should see both ends.
  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) == 3) json["machine"]["load_average_at_end"] = {load[0], load[1], load[2]};
  json["build"] = state.build;
  json["peers"] = state.peers;
  json["suites"] = nlohmann::json::array();
  const std::string csv_path = state.out + "/results.csv";
  std::ofstream csv(csv_path + ".tmp");
  csv << "suite,experiment,subject,parameters,metric,value,unit,low,high,repetitions,note\n";
  for (auto& s : state.suites) {
    nlohmann::json suite_json;
    suite_json["name"] = s.suite;
    suite_json["description"] = s.description;
    suite_json["finished"] = s.finished;
    suite_json["seconds"] = s.seconds;
    suite_json["rows"] = nlohmann::json::array();
    for (auto& r : s.rows) {
      nlohmann::json row_json;
      row_json["experiment"] = r.experiment;
      row_json["subject"] = r.subject;
      row_json["parameters"] = nlohmann::json::object();
      for (auto& [k, v] : r.parameters) row_json["parameters"][k] = v;
      row_json["metrics"] = nlohmann::json::object();
      for (auto& m : r.metrics) {
        nlohmann::json mj = {{"value", number_or_null(m.value)}, {"unit", m.unit}};
        if (!std::isnan(m.low)) mj["low"] = number_or_null(m.low);
        if (!std::isnan(m.high)) mj["high"] = number_or_null(m.high);
        if (m.repetitions > 0) mj["repetitions"] = m.repetitions;
        row_json["metrics"][m.name] = mj;
      }
      if (!r.note.empty()) row_json["note"] = r.note;
      suite_json["rows"].push_back(row_json);
      std::string parameters = parameters_text(r);
      auto line_start = csv_escape(s.suite) + ',' + csv_escape(r.experiment) + ',' + csv_escape(r.subject) + ',' +
                        csv_escape(parameters) + ',';
      if (r.metrics.empty()) csv << line_start << ",,,,,," << csv_escape(r.note) << '\n';
      for (auto& m : r.metrics) {
        csv << line_start << csv_escape(m.name) << ',' << m.value << ',' << csv_escape(m.unit) << ',';
        if (!std::isnan(m.low)) csv << m.low;
        csv << ',';
        if (!std::isnan(m.high)) csv << m.high;
        csv << ',';
        if (m.repetitions > 0) csv << m.repetitions;
        csv << ',' << csv_escape(r.note) << '\n';
      }
    }
    suite_json["figures"] = nlohmann::json::array();
    for (auto& f : s.figures) {
      nlohmann::json fj = {{"name", f.name},       {"measured", number_or_null(f.measured)},
                           {"relation", f.relation}, {"target", f.target},
                           {"unit", f.unit},       {"met", f.met()},
                           {"low", number_or_null(f.low)}, {"high", number_or_null(f.high)},
                           {"text", figure_text(f)}};
      if (!f.peer.empty()) {
        fj["peer"] = f.peer;
        fj["subject"] = f.subject;
        fj["quantity"] = f.quantity;
        fj["ratio"] = "peer/memkit";
        fj["verdict"] = verdict_words(f.measured, f.quantity);
      }
      if (!f.seed_quote.empty()) fj["seed_quote"] = f.seed_quote;
      suite_json["figures"].push_back(fj);
    }
    suite_json["notes"] = s.notes;
    suite_json["facts"] = nlohmann::json::object();
    for (auto& [k, v] : s.facts) suite_json["facts"][k] = v;
    json["suites"].push_back(suite_json);
  }
  csv.close();
  std::filesystem::rename(csv_path + ".tmp", csv_path);
  const std::string json_path = state.out + "/results.json";
  std::ofstream(json_path + ".tmp") << json.dump(1) << '\n';
  std::filesystem::rename(json_path + ".tmp", json_path);
  state.last_write = clock::now();
}

// ---- progress --------------------------------------------------------------------------------

// Rough wall-clock seconds of each suite per profile (smoke, quick, full) on a quiet 2-core machine;
// a previous run's times in the same folder replace them.
std::map<std::string, std::array<double, 3>> estimates = {
    {"block-heap", {3, 50, 1850}},       {"gpa-degen", {2, 30, 300}},
    {"malloc-workloads", {5, 170, 900}}, {"real-programs", {10, 90, 600}},
    {"reserve-commit", {8, 90, 1500}},   {"small-vector", {5, 40, 300}},
    {"vector-growth", {3, 60, 300}},     {"realloc-growth", {5, 60, 300}},
};

double estimate_of(const std::string& suite, bench::profile p, const nlohmann::json& previous) {
  if (previous.is_object() && previous.value("profile", "") == profile_name(p) && previous.contains("suites")) {
    for (auto& s : previous["suites"])
      if (s.value("name", "") == suite && s.value("finished", false)) return s.value("seconds", 0.0);
  }
  auto it = estimates.find(suite);
  if (it == estimates.end()) return p == profile::smoke ? 5 : p == profile::quick ? 60 : 600;
  return it->second[static_cast<std::size_t>(p)];
}

class runner_context final : public context {
 public:
  runner_context(bench::profile p, std::string out, std::size_t index, bool show_progress, double suite_estimate,
                 double remaining_after)
      : profile_(p), out_(std::move(out)), index_(index), show_progress_(show_progress),
        suite_estimate_(suite_estimate), remaining_after_(remaining_after) {}

  bench::profile profile() const noexcept override { return profile_; }
  void record(row r) override {
    std::lock_guard lock(state.mutex);
    results().rows.push_back(std::move(r));
    // Rows arrive in bursts; rewriting the files at most every two seconds keeps that cheap, and
    // the interruption handler writes whatever came after.
    if (nanoseconds(state.last_write, clock::now()) > 2e9) write_outputs("running");
  }
  void check(figure f) override {
    std::lock_guard lock(state.mutex);
    results().figures.push_back(std::move(f));
  }
  void note(std::string text) override {
    std::lock_guard lock(state.mutex);
    results().notes.push_back(std::move(text));
  }
  void describe(std::string key, std::string value) override {
    std::lock_guard lock(state.mutex);
    results().facts.emplace_back(std::move(key), std::move(value));
  }
  void progress(std::string_view step, std::size_t done, std::size_t total) override {
    if (!show_progress_) return;
    double fraction = total == 0 ? 0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
    double elapsed = nanoseconds(started_, clock::now()) / 1e9;
    // Within a suite: the estimate, or the pace so far once a tenth is done.
    double suite_left = fraction > 0.1 ? elapsed / fraction * (1 - fraction) : std::max(0.0, suite_estimate_ - elapsed);
    std::fprintf(stderr, "\r\033[K[%s] %.*s %zu/%zu  ~%s left", results().suite.c_str(), static_cast<int>(step.size()),
                 step.data(), done, total, duration_text(suite_left + remaining_after_).c_str());
    std::fflush(stderr);
  }
  child_result run_self(const std::vector<std::string>& args, const std::vector<std::string>& env) override {
    std::vector<std::string> full{"--child", results().suite};
    full.insert(full.end(), args.begin(), args.end());
    return run_program(self_path, full, env);
  }
  const std::string& output_directory() const noexcept override { return out_; }

 private:
  suite_results& results() { return state.suites[index_]; }

  bench::profile profile_;
  std::string out_;
  std::size_t index_;
  bool show_progress_;
  double suite_estimate_;
  double remaining_after_;
  clock::time_point started_ = clock::now();
};

// ---- figures and comparison ------------------------------------------------------------------

std::size_t missed_figures() {
  std::size_t missed = 0;
  for (auto& s : state.suites)
    for (auto& f : s.figures) missed += f.met() ? 0 : 1;
  return missed;
}

void print_final_summary() {
  std::size_t total = 0;
  for (auto& s : state.suites) total += s.figures.size();
  std::size_t missed = missed_figures();
  std::printf("\n== summary: %zu of %zu figures met their targets", total - missed, total);
  if (missed != 0) std::printf(", %zu missed%s", missed, state.informational ? " (--informational: exit status 0)" : "");
  std::printf("\n   ratios are peer / memkit: above 1, memkit is faster (or smaller); ranges are min-max over repetitions\n");
}

// A figure's name without a trailing parenthesis ("worst count (10)" -> "worst count").
std::string name_stem(const std::string& name) {
  if (name.empty() || name.back() != ')') return name;
  const auto open = name.rfind(" (");
  return open == std::string::npos ? name : name.substr(0, open);
}

// --compare: per figure in both runs, old, new, the change, and whether it exceeds the runs' spread.
int compare_with(const std::string& old_path) {
  std::ifstream in(old_path);
  if (!in) {
    std::fprintf(stderr, "memkit-bench: cannot read %s\n", old_path.c_str());
    return 1;
  }
  nlohmann::json old;
  try {
    in >> old;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memkit-bench: %s is not JSON: %s\n", old_path.c_str(), e.what());
    return 1;
  }
  // Pointers into `old`, which outlives the map.
  std::map<std::string, const nlohmann::json*> old_figures;
  if (old.contains("suites") && old["suites"].is_array())
    for (const auto& s : old["suites"])
      if (s.contains("figures") && s["figures"].is_array())
        for (const auto& f : s["figures"])
          if (f.is_object()) {
            old_figures[s.value("name", "") + "\n" + f.value("name", "")] = &f;
            // Also under the name without a trailing "(...)" that names what varies by run
            // ("worst size (MEM_1B)"), unless that is ambiguous.
            const std::string stem = s.value("name", "") + "\n" + name_stem(f.value("name", ""));
            old_figures.emplace("~" + stem, &f);
          }
  std::printf("\n== compared with %s (%s, %s)\n", old_path.c_str(), old.value("date", "?").c_str(),
              old.value("profile", "?").c_str());
  std::printf("  %-9s %10s %10s %8s  figure\n", "", "old", "new", "change");
  std::size_t shown = 0;
  for (auto& s : state.suites) {
    for (auto& f : s.figures) {
      auto it = old_figures.find(s.suite + "\n" + f.name);
      if (it == old_figures.end()) it = old_figures.find("~" + s.suite + "\n" + name_stem(f.name));
      if (it == old_figures.end() || !(*it->second)["measured"].is_number()) {
        std::printf("  %-9s %10s %10s %8s  %s: %s\n", "new", "-", format_number(f.measured).c_str(), "", s.suite.c_str(),
                    f.name.c_str());
        continue;
      }
      const nlohmann::json& o = *it->second;
      double before = o["measured"].get<double>();
      double change = before != 0 ? (f.measured - before) / std::fabs(before) * 100 : 0;
      // Two runs differ beyond noise when their min-max ranges do not overlap; without ranges,
      // when the change exceeds 10%.
      bool have_ranges = o.contains("low") && o["low"].is_number() && o.contains("high") && o["high"].is_number() &&
                         !std::isnan(f.low) && !std::isnan(f.high);
      bool significant = have_ranges ? (f.low > o["high"].get<double>() || f.high < o["low"].get<double>())
                                     : std::fabs(change) > 10;
      std::printf("  %-9s %10s %10s %+7.1f%%  %s: %s%s\n", significant ? "CHANGED" : "", format_number(before).c_str(),
                  format_number(f.measured).c_str(), change, s.suite.c_str(), f.name.c_str(),
                  have_ranges ? "" : " (no spread stored: marked beyond 10%)");
      ++shown;
    }
  }
  std::printf("  %zu figures in both runs; CHANGED: the two runs' ranges do not overlap\n", shown);
  return 0;
}

// ---- interruption ----------------------------------------------------------------------------

std::atomic<bool> finishing{false};
bool show_progress_line = false;

// Waits for SIGINT/SIGTERM (blocked in every other thread), ends the running child, writes what
// was measured and exits with 128 + the signal's number.
void watch_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int signal = 0;
  if (sigwait(&set, &signal) != 0) return;
  if (int child = running_child(); child > 0) ::kill(child, SIGTERM);
  std::lock_guard lock(state.mutex);
  if (finishing.load()) std::_Exit(128 + signal);
  const char* name = signal == SIGINT ? "SIGINT" : "SIGTERM";
  if (show_progress_line) std::fprintf(stderr, "\r\033[K");
  std::printf("\n== interrupted by %s: writing what was measured\n", name);
  for (auto& s : state.suites)
    if (!s.rows.empty() || !s.figures.empty()) print_suite_summary(s);
  write_outputs(std::string("interrupted by ") + name);
  std::printf("wrote %s/results.json and %s/results.csv (partial)\n", state.out.c_str(), state.out.c_str());
  std::fflush(stdout);
  std::_Exit(128 + signal);
}

// ---- command line ----------------------------------------------------------------------------

int usage(int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: memkit-bench [--profile smoke|quick|full] [--out DIR] [--verbose] [--informational]\n"
               "                    [--compare OLD/results.json] [--list] [SUITE...]\n"
               "  Runs the named suites (all when none is named), prints every figure against its target\n"
               "  as peer / memkit with its min-max spread, and writes DIR/results.json and DIR/results.csv\n"
               "  (DIR defaults to bench-results/<profile>) as experiments finish.\n"
               "  --profile        smoke: seconds (CI); quick: about 10 minutes (default); full: the seeds' sizes\n"
               "  --verbose        also prints every raw row\n"
               "  --informational  targets are information only: exit status 0 even when a figure misses\n"
               "  --compare FILE   prints, per figure, the old value, the new one and the change\n"
               "  --list           lists the suites and exits\n"
               "  Exit status: 0 all figures met, 1 a figure missed, 2 usage, 128+N interrupted by signal N.\n");
  return code;
}

int run(int argc, char** argv) {
  self_path = "/proc/self/exe";
  if (::access(self_path.c_str(), X_OK) != 0) self_path = argv[0];
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 2 && args[0] == "--child") {
    for (auto& s : registered_suites()) {
      if (s.name == args[1] && s.child) return s.child({args.begin() + 2, args.end()});
    }
    std::fprintf(stderr, "memkit-bench: no child entry for suite '%s'\n", args[1].c_str());
    return 2;
  }
  bench::profile selected = profile::quick;
  std::string out, compare;
  bool verbose = false, informational = false;
  std::vector<std::string> wanted;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return usage(0);
    if (a == "--list") {
      for (auto& s : registered_suites()) std::printf("%-20s %s\n", s.name.c_str(), s.description.c_str());
      return 0;
    }
    if ((a == "--profile" || a == "--out" || a == "--compare") && i + 1 >= args.size()) return usage(2);
    if (a == "--profile") {
      const std::string& p = args[++i];
      if (p == "smoke") selected = profile::smoke;
      else if (p == "quick") selected = profile::quick;
      else if (p == "full") selected = profile::full;
      else {
        std::fprintf(stderr, "memkit-bench: unknown profile '%s'\n", p.c_str());
        return usage(2);
      }
    } else if (a == "--out") {
      out = args[++i];
    } else if (a == "--compare") {
      compare = args[++i];
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--informational" || a == "--no-targets") {
      informational = true;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "memkit-bench: unknown option '%s'\n", a.c_str());
      return usage(2);
    } else {
      wanted.push_back(a);
    }
  }
  std::set<std::string> known;
  for (auto& s : registered_suites()) known.insert(s.name);
  for (auto& w : wanted) {
    if (!known.count(w)) {
      std::fprintf(stderr, "memkit-bench: no suite named '%s' (see --list)\n", w.c_str());
      return 2;
    }
  }
  if (!compare.empty() && ::access(compare.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "memkit-bench: cannot read %s\n", compare.c_str());
    return 2;
  }
  if (out.empty()) out = std::string("bench-results/") + profile_name(selected);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "memkit-bench: cannot create %s: %s\n", out.c_str(), ec.message().c_str());
    return 1;
  }

  // SIGINT/SIGTERM go to one thread that writes the partial results (see watch_signals).
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  std::thread(watch_signals).detach();

  nlohmann::json previous;
  try {
    std::ifstream old(out + "/results.json");
    if (old) old >> previous;
  } catch (const std::exception&) {
    previous = nullptr;
  }

  const char* ci = std::getenv("CI");
  const bool show_progress = ::isatty(STDERR_FILENO) != 0 && !(ci != nullptr && std::strcmp(ci, "true") == 0);
  show_progress_line = show_progress;
  std::vector<const suite*> chosen;
  for (auto& s : registered_suites())
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), s.name) != wanted.end()) chosen.push_back(&s);
  std::vector<double> suite_estimates;
  double total_estimate = 0;
  for (auto* s : chosen) {
    suite_estimates.push_back(estimate_of(s->name, selected, previous));
    total_estimate += suite_estimates.back();
  }
  {
    std::lock_guard lock(state.mutex);
    state.out = out;
    state.profile = selected;
    state.informational = informational;
    state.estimated_seconds = total_estimate;
    state.suites.reserve(chosen.size());
    state.machine = describe_machine();
    state.build = describe_build();
    state.peers = describe_peers();
  }
  std::printf("memkit-bench: profile %s, %zu suites, about %s on a quiet 2-core machine; results in %s\n",
              profile_name(selected), chosen.size(), duration_text(total_estimate).c_str(), out.c_str());
  std::printf("  machine: %s, %d cores, %s, %s, THP %s\n", state.machine.value("cpu", "?").c_str(),
              state.machine.value("cores", 0), format_bytes(state.machine.value("memory_bytes", 0.0)).c_str(),
              state.machine.value("kernel", "?").c_str(), state.machine.value("transparent_huge_pages", "?").c_str());
  std::fflush(stdout);

  double remaining = total_estimate;
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    const suite& s = *chosen[i];
    remaining -= suite_estimates[i];
    {
      std::lock_guard lock(state.mutex);
      state.suites.push_back({s.name, s.description, {}, {}, {}, {}, 0, false});
    }
    if (show_progress)
      std::fprintf(stderr, "\r\033[K[%s] starting (%zu/%zu), ~%s left", s.name.c_str(), i + 1, chosen.size(),
                   duration_text(remaining + suite_estimates[i]).c_str());
    runner_context ctx(selected, out, state.suites.size() - 1, show_progress, suite_estimates[i], remaining);
    auto start = clock::now();
    try {
      s.run(ctx);
    } catch (const std::exception& e) {
      ctx.note(std::string("suite failed: ") + e.what());
    }
    if (show_progress) std::fprintf(stderr, "\r\033[K");
    std::lock_guard lock(state.mutex);
    auto& results = state.suites.back();
    results.seconds = nanoseconds(start, clock::now()) / 1e9;
    results.finished = true;
    if (verbose) print_tables(results);
    print_suite_summary(results);
    write_outputs("running");
    std::fflush(stdout);
  }
  std::lock_guard lock(state.mutex);
  finishing.store(true);
  print_final_summary();
  write_outputs("complete");
  std::printf("wrote %s/results.json and %s/results.csv (raw rows: --verbose, or the files)\n", out.c_str(),
              out.c_str());
  if (!compare.empty()) compare_with(compare);
  std::fflush(stdout);
  return missed_figures() != 0 && !informational ? 1 : 0;
}

}  // namespace
}  // namespace memkit::bench

int main(int argc, char** argv) { return memkit::bench::run(argc, argv); }
