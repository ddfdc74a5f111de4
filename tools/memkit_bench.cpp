// memkit-bench: runs the benchmark suites (one per seed experiment) by name, prints a table per
// experiment with each subject's ratio to the first one measured, checks the project's target
// figures, and writes results.json and results.csv to an output folder.
//
//   memkit-bench [--profile smoke|quick|full] [--out DIR] [--list] [SUITE...]
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "measure.hpp"
#include "suite.hpp"

namespace memkit::bench {
namespace {

std::string self_path;

struct suite_results {
  std::string suite;
  std::vector<row> rows;
  std::vector<figure> figures;
  std::vector<std::string> notes;
};

class runner_context final : public context {
 public:
  runner_context(bench::profile p, std::string out, suite_results& results, bool terminal)
      : profile_(p), out_(std::move(out)), results_(results), terminal_(terminal) {}

  bench::profile profile() const noexcept override { return profile_; }
  void record(row r) override { results_.rows.push_back(std::move(r)); }
  void check(figure f) override { results_.figures.push_back(std::move(f)); }
  void note(std::string text) override { results_.notes.push_back(std::move(text)); }
  void progress(std::string_view step, std::size_t done, std::size_t total) override {
    if (!terminal_) return;
    std::fprintf(stderr, "\r\033[K[%s] %.*s %zu/%zu", results_.suite.c_str(),
                 static_cast<int>(step.size()), step.data(), done, total);
    std::fflush(stderr);
  }
  child_result run_self(const std::vector<std::string>& args,
                        const std::vector<std::string>& env) override {
    std::vector<std::string> full{"--child", results_.suite};
    full.insert(full.end(), args.begin(), args.end());
    return run_program(self_path, full, env);
  }
  const std::string& output_directory() const noexcept override { return out_; }

 private:
  bench::profile profile_;
  std::string out_;
  suite_results& results_;
  bool terminal_;
};

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

// Prints each experiment as a table; within one parameter set, every subject's first metric is
// also shown as a ratio to the first subject measured there (the baseline).
void print_tables(const suite_results& results) {
  std::vector<std::string> experiments;
  for (auto& r : results.rows)
    if (std::find(experiments.begin(), experiments.end(), r.experiment) == experiments.end())
      experiments.push_back(r.experiment);
  for (auto& experiment : experiments) {
    std::printf("\n== %s / %s\n", results.suite.c_str(), experiment.c_str());
    std::string last_parameters;
    const row* baseline = nullptr;
    for (auto& r : results.rows) {
      if (r.experiment != experiment) continue;
      std::string parameters = parameters_text(r);
      if (baseline == nullptr || parameters != last_parameters) {
        std::printf("  %s\n", parameters.empty() ? "(no parameters)" : parameters.c_str());
        last_parameters = parameters;
        baseline = r.metrics.empty() ? nullptr : &r;
      }
      std::printf("    %-34s", r.subject.c_str());
      for (auto& m : r.metrics) std::printf("  %s=%s", m.name.c_str(), format_metric(m).c_str());
      if (baseline != nullptr && baseline != &r && !r.metrics.empty() &&
          r.metrics[0].name == baseline->metrics[0].name && baseline->metrics[0].value != 0) {
        std::printf("  (%.3gx %s)", r.metrics[0].value / baseline->metrics[0].value,
                    baseline->subject.c_str());
      }
      if (!r.note.empty()) std::printf("  [%s]", r.note.c_str());
      std::printf("\n");
    }
  }
  for (auto& n : results.notes) std::printf("  note: %s\n", n.c_str());
}

void print_figures(const std::vector<suite_results>& all) {
  bool any = false;
  for (auto& s : all) any = any || !s.figures.empty();
  if (!any) return;
  std::printf("\n== figures (targets from the issues; ratios from this run)\n");
  for (auto& s : all) {
    for (auto& f : s.figures) {
      std::printf("  %-6s %-18s %-60s %10s  (target %s %s%s)\n", f.met() ? "met" : "MISSED",
                  s.suite.c_str(), f.name.c_str(),
                  (format_number(f.measured) + f.unit).c_str(), f.relation.c_str(),
                  format_number(f.target).c_str(), f.unit.c_str());
    }
  }
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_outputs(const std::string& dir, bench::profile p, const std::vector<suite_results>& all) {
  nlohmann::json json;
  json["profile"] = profile_name(p);
  char stamp[64];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  json["date"] = stamp;
  json["suites"] = nlohmann::json::array();
  std::ofstream csv(dir + "/results.csv");
  csv << "suite,experiment,subject,parameters,metric,value,unit,note\n";
  for (auto& s : all) {
    nlohmann::json suite_json;
    suite_json["name"] = s.suite;
    suite_json["rows"] = nlohmann::json::array();
    for (auto& r : s.rows) {
      nlohmann::json row_json;
      row_json["experiment"] = r.experiment;
      row_json["subject"] = r.subject;
      for (auto& [k, v] : r.parameters) row_json["parameters"][k] = v;
      for (auto& m : r.metrics) row_json["metrics"][m.name] = {{"value", m.value}, {"unit", m.unit}};
      if (!r.note.empty()) row_json["note"] = r.note;
      suite_json["rows"].push_back(row_json);
      std::string parameters = parameters_text(r);
      if (r.metrics.empty())
        csv << csv_escape(s.suite) << ',' << csv_escape(r.experiment) << ',' << csv_escape(r.subject)
            << ',' << csv_escape(parameters) << ",,,," << csv_escape(r.note) << '\n';
      for (auto& m : r.metrics)
        csv << csv_escape(s.suite) << ',' << csv_escape(r.experiment) << ',' << csv_escape(r.subject)
            << ',' << csv_escape(parameters) << ',' << csv_escape(m.name) << ',' << m.value << ','
            << csv_escape(m.unit) << ',' << csv_escape(r.note) << '\n';
    }
    suite_json["figures"] = nlohmann::json::array();
    for (auto& f : s.figures)
      suite_json["figures"].push_back({{"name", f.name}, {"measured", f.measured},
                                       {"relation", f.relation}, {"target", f.target},
                                       {"unit", f.unit}, {"met", f.met()}});
    suite_json["notes"] = s.notes;
    json["suites"].push_back(suite_json);
  }
  std::ofstream(dir + "/results.json") << json.dump(2) << '\n';
}

int usage(int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: memkit-bench [--profile smoke|quick|full] [--out DIR] [--list] [SUITE...]\n"
               "  Runs the named suites (all when none is named) and writes DIR/results.json and\n"
               "  DIR/results.csv (DIR defaults to bench-results/<profile>).\n"
               "  --profile  smoke: seconds (CI); quick: minutes (default); full: the seeds' sizes\n"
               "  --list     lists the suites and exits\n");
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
  std::string out;
  std::vector<std::string> wanted;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return usage(0);
    if (a == "--list") {
      for (auto& s : registered_suites()) std::printf("%-20s %s\n", s.name.c_str(), s.description.c_str());
      return 0;
    }
    if ((a == "--profile" || a == "--out") && i + 1 >= args.size()) return usage(2);
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
  if (out.empty()) out = std::string("bench-results/") + profile_name(selected);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "memkit-bench: cannot create %s: %s\n", out.c_str(), ec.message().c_str());
    return 1;
  }
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  std::printf("memkit-bench: profile %s, results in %s\n", profile_name(selected), out.c_str());
  std::vector<suite_results> all;
  for (auto& s : registered_suites()) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), s.name) == wanted.end()) continue;
    all.push_back({s.name, {}, {}, {}});
    runner_context ctx(selected, out, all.back(), terminal);
    auto start = clock::now();
    try {
      s.run(ctx);
    } catch (const std::exception& e) {
      ctx.note(std::string("suite failed: ") + e.what());
    }
    if (terminal) std::fprintf(stderr, "\r\033[K");
    print_tables(all.back());
    std::printf("  (%s took %s)\n", s.name.c_str(), format_nanoseconds(nanoseconds(start, clock::now())).c_str());
    std::fflush(stdout);
  }
  print_figures(all);
  write_outputs(out, selected, all);
  std::printf("\nwrote %s/results.json and %s/results.csv\n", out.c_str(), out.c_str());
  return 0;
}

}  // namespace
}  // namespace memkit::bench

int main(int argc, char** argv) { return memkit::bench::run(argc, argv); }
