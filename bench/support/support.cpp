// Out-of-line parts of the suite interface: the registry, child-result parsing, formatting and
// the malloc peers found at configure time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "measure.hpp"
#include "peers.hpp"
#include "suite.hpp"

extern char** environ;

namespace memkit::bench {

const char* profile_name(profile p) noexcept {
  switch (p) {
    case profile::smoke: return "smoke";
    case profile::quick: return "quick";
    case profile::full: return "full";
  }
  return "?";
}

namespace {
std::atomic<int> child_pid{0};

std::vector<suite>& registry() {
  static std::vector<suite> suites;
  return suites;
}
}  // namespace

int register_suite(suite s) {
  auto& suites = registry();
  auto at = std::lower_bound(suites.begin(), suites.end(), s.name,
                             [](const suite& a, const std::string& name) { return a.name < name; });
  suites.insert(at, std::move(s));
  return static_cast<int>(suites.size());
}

const std::vector<suite>& registered_suites() { return registry(); }

namespace {
// A "Name:   1234 kB" line of /proc/self/status, in bytes; 0 when missing.
double status_bytes(const char* name) noexcept {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double bytes = 0;
  const std::size_t length = std::strlen(name);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, name, length) == 0 && line[length] == ':') {
      bytes = std::strtod(line + length + 1, nullptr) * 1024.0;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

double minor_faults_now() noexcept {
  rusage usage{};
  return ::getrusage(RUSAGE_SELF, &usage) == 0 ? static_cast<double>(usage.ru_minflt) : 0;
}
}  // namespace

double resident_bytes() noexcept { return status_bytes("VmRSS"); }

memory_phase begin_memory_phase() noexcept {
  memory_phase phase;
  // Writing 5 to clear_refs resets VmHWM to the current resident size (Linux 4.0 and later).
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    const bool written = std::fputs("5", f) >= 0;
    phase.peak_is_phase_own = std::fclose(f) == 0 && written;
  }
  phase.baseline_rss = resident_bytes();
  phase.start_faults = minor_faults_now();
  return phase;
}

void end_memory_phase(memory_phase& phase) noexcept {
  phase.minor_faults = minor_faults_now() - phase.start_faults;
  phase.peak_rss = std::max(status_bytes("VmHWM"), resident_bytes());
}

figure peer_figure(std::string name, std::string subject, std::string peer, double ratio, double low,
                   double high, double target, std::string quantity) {
  return figure{std::move(name), ratio, std::string(">="), target, std::string("x"), std::move(peer),
                std::move(subject), std::move(quantity), low, high, std::string()};
}

int running_child() noexcept { return child_pid.load(); }

std::map<std::string, std::string> child_result::values() const {
  std::map<std::string, std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0 || line.find(' ') < eq) continue;
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

double child_result::number(const std::string& key, double fallback) const {
  auto all = values();
  auto it = all.find(key);
  if (it == all.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  return end == it->second.c_str() ? fallback : v;
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
  return text;
}

std::string format_nanoseconds(double ns) {
  char text[32];
  if (ns < 1e3) std::snprintf(text, sizeof text, "%.1f ns", ns);
  else if (ns < 1e6) std::snprintf(text, sizeof text, "%.2f us", ns / 1e3);
  else if (ns < 1e9) std::snprintf(text, sizeof text, "%.2f ms", ns / 1e6);
  else std::snprintf(text, sizeof text, "%.2f s", ns / 1e9);
  return text;
}

std::string format_number(double value) {
  char text[32];
  if (value != 0 && (std::fabs(value) >= 1e7 || std::fabs(value) < 1e-3))
    std::snprintf(text, sizeof text, "%.3g", value);
  else if (value == std::floor(value) && std::fabs(value) < 1e7)
    std::snprintf(text, sizeof text, "%.0f", value);
  else
    std::snprintf(text, sizeof text, "%.4g", value);
  return text;
}

child_result run_program(const std::string& program, const std::vector<std::string>& args,
                         const std::vector<std::string>& extra_env) {
  child_result result;
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    result.output = std::string("pipe failed: ") + std::strerror(errno);
    return result;
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool overridden = std::any_of(extra_env.begin(), extra_env.end(), [&](const std::string& x) {
      auto name = x.substr(0, x.find('=') + 1);
      return entry.compare(0, name.size(), name) == 0;
    });
    if (!overridden) env_strings.push_back(std::move(entry));
  }
  env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  // The runner blocks SIGINT and SIGTERM in its own threads (one thread waits for them); the
  // child starts with none blocked, so it can be interrupted and ended as usual.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const auto start = std::chrono::steady_clock::now();
  int error = ::posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (error == 0) child_pid.store(pid);
  ::close(pipe_fds[1]);
  if (error != 0) {
    ::close(pipe_fds[0]);
    result.output = std::string("spawn failed: ") + std::strerror(error);
    return result;
  }
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n > 0) result.output.append(buffer, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(pipe_fds[0]);
  int status = 0;
  struct rusage usage {};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  child_pid.store(0);
  result.wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  result.peak_rss = static_cast<double>(usage.ru_maxrss) * 1024.0;  // KiB on Linux
  result.page_faults = static_cast<double>(usage.ru_minflt + usage.ru_majflt);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

namespace {
malloc_peer peer(const char* name, const char* path) {
  return malloc_peer{name, path, path[0] != '\0' && ::access(path, R_OK) == 0, {}};
}
}  // namespace

malloc_peer memkit_malloc() { return peer("memkit (LD_PRELOAD)", MEMKIT_BENCH_MEMKIT_MALLOC); }

const char* const glibc_tunables =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456:"
    "glibc.malloc.top_pad=16777216:glibc.malloc.tcache_count=256";

malloc_peer glibc_tuned() {
  return malloc_peer{"glibc (tuned)", "", true, {std::string("GLIBC_TUNABLES=") + glibc_tunables}};
}

std::vector<malloc_peer> malloc_peers() {
  return {
      malloc_peer{"glibc", "", true, {}},
      peer("jemalloc", MEMKIT_BENCH_JEMALLOC),
      peer("mimalloc", MEMKIT_BENCH_MIMALLOC),
      peer("tcmalloc", MEMKIT_BENCH_TCMALLOC),
  };
}

}  // namespace memkit::bench
