// Start-up, fork handling and the end-of-process reports of the drop-in malloc.
#include "runtime.hpp"

#include "memkit/detail/stack_trace.hpp"
#include "memkit/os.hpp"
#include "../os/platform.hpp"
#include "../os/symbols.hpp"
#include "../report.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define MEMKIT_MALLOC_EXPORT extern "C" __attribute__((visibility("default")))

// libstdc++'s hook that frees its emergency exception-handling pool (what valgrind calls at exit).
// Weak, so that a program without libstdc++ still links the static form.
namespace __gnu_cxx {
__attribute__((weak)) void __freeres() noexcept;
}

namespace memkit::malloc_runtime {

std::atomic<general_allocator*> started{nullptr};

namespace {

// 0: nobody started yet; 1: a thread is starting; 2: started.
std::atomic<int> phase{0};
// Set on the thread that runs start(), so that its own re-entrant allocations do not wait for
// themselves. A trivially constructed thread_local needs no registration (no allocation).
thread_local bool starting_on_this_thread = false;

// What the environment asked for; written once by start(), read at exit.
struct settings {
  bool debug = false;       // MEMKIT_DEBUG
  bool statistics = false;  // MEMKIT_STATS
  bool leaks = true;        // MEMKIT_LEAKS (reports leaks at exit in debug mode unless 0)
  int report_fd = os::error_stream;  // MEMKIT_REPORT_FILE, else a private copy of stderr
};
// MEMKIT_REPORT_FILE names a file for every report instead of stderr; MEMKIT_LEAKS=all also lists
// the blocks still reachable. The other variables go straight into general_allocator::options:
// MEMKIT_REPORT_FORMAT (text, json), MEMKIT_SUPPRESSIONS (a file of leak:NAME lines), MEMKIT_STACK_TRACES,
// MEMKIT_STACK_FRAMES, MEMKIT_NEVER_REUSE, MEMKIT_QUARANTINE, MEMKIT_ABORT, MEMKIT_PURGE_DELAY_MS,
// MEMKIT_RETAINED_LIMIT.
settings chosen;

// Reads one MEMKIT_* variable, or nothing in a privileged process (see environment_value).
const char* variable(const char* name) noexcept {
  return environment_value(name, os::process_is_privileged());
}

// True when `value` is `word` in any case (ASCII; no locale, no allocation).
bool equals_ignoring_case(const char* value, const char* word) noexcept {
  for (; *value != '\0' && *word != '\0'; ++value, ++word) {
    const char a = *value >= 'A' && *value <= 'Z' ? static_cast<char>(*value - 'A' + 'a') : *value;
    if (a != *word) return false;
  }
  return *value == *word;
}

// Reading the environment allocates nothing, so it is safe here even before libc finished
// starting up.
// "1", "on", "yes", "true" (any case) switch a flag on; "0", "off", "no", "false" off; anything
// else, or unset, keeps `fallback`.
bool flag(const char* name, bool fallback) noexcept {
  const char* value = variable(name);
  if (value == nullptr || *value == '\0') return fallback;
  auto is = [value](const char* word) { return equals_ignoring_case(value, word); };
  if (is("1") || is("on") || is("yes") || is("true")) return true;
  if (is("0") || is("off") || is("no") || is("false")) return false;
  return fallback;
}

// A non-negative decimal number from the environment, or `fallback` when unset or malformed.
std::size_t number(const char* name, std::size_t fallback) noexcept {
  const char* value = variable(name);
  if (value == nullptr || *value < '0' || *value > '9') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  return *end == '\0' ? static_cast<std::size_t>(parsed) : fallback;
}

// MEMKIT_REPORT_FILE as given. "%p" in it stands for the process's id (valgrind's --log-file
// convention), so that each process of a command, forked children too, writes a file of its own;
// "%%" for a '%'.
char report_path_pattern[4096];
bool report_path_per_process = false;

// The report file's name for this process: the pattern with its %p expanded. False when it does
// not fit `out`.
bool report_path(char (&out)[4096]) noexcept {
  std::size_t n = 0;
  for (const char* c = report_path_pattern; *c != '\0'; ++c) {
    char digits[24];
    const char* piece = c;
    std::size_t length = 1;
    if (c[0] == '%' && c[1] == 'p') {
      length = static_cast<std::size_t>(std::snprintf(digits, sizeof digits, "%llu",
                                                      static_cast<unsigned long long>(os::process_id())));
      piece = digits;
      ++c;
    } else if (c[0] == '%' && c[1] == '%') {
      ++c;
    }
    if (n + length >= sizeof out) return false;
    std::memcpy(out + n, piece, length);
    n += length;
  }
  out[n] = '\0';
  return true;
}

int open_report_file() noexcept {
  char path[4096];
  if (!report_path(path)) return -1;
  auto fd = os::open_for_append(path, os::high_descriptors);
  return fd ? fd.value() : -1;
}

// Where reports go. Many programs close stderr before they exit (GNU tools do, in an atexit
// handler), which would silence the exit-time reports; so they go to a private, close-on-exec copy
// of stderr taken now, or to MEMKIT_REPORT_FILE (appended to) when that is set. Neither open nor
// duplicating allocates.
int open_report_destination() noexcept {
  if (const char* path = variable("MEMKIT_REPORT_FILE");
      path != nullptr && *path != '\0' && std::strlen(path) < sizeof report_path_pattern) {
    std::strcpy(report_path_pattern, path);
    report_path_per_process = std::strstr(path, "%p") != nullptr;
    if (const int fd = open_report_file(); fd >= 0) return fd;
    report_path_per_process = false;
  }
  if (auto fd = os::duplicate_error_stream(os::high_descriptors)) return fd.value();
  if (auto fd = os::duplicate_error_stream(3)) return fd.value();
  return os::error_stream;
}

// MEMKIT_SUPPRESSIONS: the file is read once, at start-up, into memory from the os layer (kept
// for the life of the process; no malloc).
const char* read_suppressions() noexcept {
  const char* path = variable("MEMKIT_SUPPRESSIONS");
  if (path == nullptr || *path == '\0') return nullptr;
  constexpr std::size_t most = std::size_t{1} << 20;
  auto mapped = os::map(most + os::page_size());  // + room for the NUL
  if (!mapped) return nullptr;
  char* text = static_cast<char*>(mapped.value());
  auto length = os::read_file(path, text, most);
  if (!length) {
    (void)os::release(text, most + os::page_size());
    return nullptr;
  }
  text[length.value()] = '\0';
  return text;
}

void configure_from_environment() noexcept {
  chosen.debug = flag("MEMKIT_DEBUG", false);
  chosen.statistics = flag("MEMKIT_STATS", false);
  const char* leaks = variable("MEMKIT_LEAKS");
  const bool all_leaks = leaks != nullptr && equals_ignoring_case(leaks, "all");
  chosen.leaks = all_leaks || flag("MEMKIT_LEAKS", true);
  if (chosen.debug || chosen.statistics) chosen.report_fd = open_report_destination();
  general_allocator::options options;
  options.debug = chosen.debug;
  options.report_fd = chosen.report_fd;
  options.report_reachable = all_leaks;
  options.report_cost = chosen.statistics;  // in debug mode: what each leak report cost
  if (const char* format = variable("MEMKIT_REPORT_FORMAT"); format != nullptr && equals_ignoring_case(format, "json")) {
    options.format = general_allocator::report_format::json;
  }
  if (chosen.debug && chosen.leaks) options.suppressions = read_suppressions();
  options.capture_stack_traces = flag("MEMKIT_STACK_TRACES", options.capture_stack_traces);
  options.stack_frames = number("MEMKIT_STACK_FRAMES", options.stack_frames);
  if (options.stack_frames > general_allocator::max_stack_frames)
    options.stack_frames = general_allocator::max_stack_frames;
  options.never_reuse_addresses = flag("MEMKIT_NEVER_REUSE", options.never_reuse_addresses);
  options.quarantine_bytes = number("MEMKIT_QUARANTINE", options.quarantine_bytes);
  options.abort_on_error = flag("MEMKIT_ABORT", options.abort_on_error);
  options.purge_delay_ms = static_cast<std::uint32_t>(
      number("MEMKIT_PURGE_DELAY_MS", options.purge_delay_ms));
  options.retained_limit = number("MEMKIT_RETAINED_LIMIT", options.retained_limit);
  if (options.debug && options.capture_stack_traces) {
    // The unwinder allocates on its first walk (unwind tables of the loaded objects) and keeps
    // that memory for the life of the process. Walk once now, before debug mode is on, so those
    // blocks are neither recorded nor reported as leaks at exit.
    void* frames[4];
    (void)detail::capture_stack_trace(frames, 4, 0);
  }
  general_allocator::global().configure(options);
}

// The process whose end the end-of-process reports describe: the one that started, or the child of a
// fork() (set by after_fork_in_child). A vfork() child (no fork handlers run) differs from it.
std::uint64_t reporting_process = 0;
// The reports at the end run once per process, whichever way it ends (exit() or _exit(), from
// any thread); `reported` is set once they are written.
std::atomic<bool> ended{false};
std::atomic<bool> reported{false};

// Fork: take every allocator lock before the fork so that the child starts with consistent,
// unlocked state even when other threads were inside malloc at that moment.
void before_fork() noexcept { general_allocator::global().prepare_fork(); }
void after_fork_in_parent() noexcept { general_allocator::global().after_fork_parent(); }
void after_fork_in_child() noexcept {
  general_allocator::global().after_fork_child();
  reporting_process = os::process_id();
  ended.store(false, std::memory_order_relaxed);
  reported.store(false, std::memory_order_relaxed);
  // A report file per process: the child's own, under the number the parent's had (which the
  // allocator's options hold too). Where it cannot be opened, the child goes on with the parent's.
  if (report_path_per_process) {
    if (const int fd = open_report_file(); fd >= 0 && !os::move_descriptor(fd, chosen.report_fd)) {
      os::close_descriptor(fd);
    }
  }
}

// How many error reports were left out as repeats (report.hpp). Out of line: the writer's buffer
// must not sit in report_at_exit's frame, which the leak scan reads as a root (stale words of the
// program's frames would fill it).
[[gnu::noinline]] void report_repeated_errors() noexcept {
  const diagnostics::repeated_misuse left_out = diagnostics::repeated_misuse_reports();
  if (left_out.reports == 0) return;
  diagnostics::report_writer out(chosen.report_fd, general_allocator::global().current_options().format);
  out.note("repeated-errors", "%zu more reports of errors above (the same kind with the same stacks) were left out, "
           "from %zu place%s", left_out.reports, left_out.places, left_out.places == 1 ? "" : "s");
}

// The end-of-process reports: statistics, leaks, how many error reports were left out as repeats.
// Not inlined into its callers, so that the frames the leak scan reads above its own are theirs.
// A second thread that ends the process meanwhile (its own exit() or _exit(): a thread woken from
// a system call with EINTR by the leak report's stop signal may end the process so) waits for the
// first one's reports, up to ten seconds, instead of cutting them off.
[[gnu::noinline]] void report_at_end() noexcept {
  if (started.load(std::memory_order_acquire) == nullptr) return;
  if (ended.exchange(true, std::memory_order_acq_rel)) {
    const std::uint64_t start = os::monotonic_ms();
    while (!reported.load(std::memory_order_acquire) && os::monotonic_ms() - start < 10'000) os::yield_thread();
    return;
  }
  if (chosen.statistics) general_allocator::global().print_statistics(chosen.report_fd);
  if (chosen.debug && chosen.leaks) {
    // The pool libstdc++ allocates at start-up and keeps for the whole run is not a leak of the
    // program's; give it back first so that the report lists only the program's blocks.
    if (__gnu_cxx::__freeres != nullptr) __gnu_cxx::__freeres();
    general_allocator::global().report_leaks(chosen.report_fd);
  }
  report_repeated_errors();
  reported.store(true, std::memory_order_release);
}

// Runs when the process exits (or the library is unloaded), after the program's own destructors:
// the statistics and leak reports see the final state.
__attribute__((destructor)) void report_at_exit() noexcept { report_at_end(); }

// The reports of a process that ends through _exit or _Exit, which run no exit handler. Not in a
// vfork() child: it runs in its parent's memory, which the parent's own reports describe (its
// process id is its own, and no fork handler set reporting_process to it). Not from a signal
// handler either, where _exit is the one way out that POSIX allows: the signal may have stopped
// this thread inside malloc or the loader, holding a lock the reports take (nor where a frame
// without unwind tables keeps the walk from telling).
[[gnu::noinline]] void report_before_immediate_exit() noexcept {
  if (started.load(std::memory_order_acquire) == nullptr || os::process_id() != reporting_process) return;
  if (!chosen.statistics && !chosen.debug && diagnostics::repeated_misuse_reports().reports == 0) return;
  if (os::symbols::may_be_in_signal_handler()) return;
  report_at_end();
}

// The reports of a process that ends through quick_exit, which runs the at_quick_exit handlers
// and then ends as _exit does. Registered when the drop-in starts, before the program can register
// its own, so it runs after them (they run in reverse order). quick_exit may be called from a
// signal handler: the same checks as before _exit.
void report_at_quick_exit() noexcept { report_before_immediate_exit(); }

// An executable that defines malloc itself (one linked with its own allocator: Rust's official
// rustc carries jemalloc) keeps it: the loader looks in the executable before the preloaded
// library, so none of the program's malloc calls reach memkit, and a debug run would end without a
// single report. Said once, at load, where the reports go, when reports or statistics were asked for.
__attribute__((constructor)) void warn_when_malloc_is_not_the_drop_ins() noexcept {
  if (!flag("MEMKIT_DEBUG", false) && !flag("MEMKIT_STATS", false)) return;
  const char* object = nullptr;
  const void* resolved = os::symbols::default_definition("malloc", &object);
  if (resolved == nullptr || os::symbols::own_code().contains(resolved)) return;
  (void)start();
  diagnostics::print(chosen.report_fd,
                     "memkit: this process's malloc is defined in %s, which the loader searches before the "
                     "drop-in: its allocations reach memkit only if that malloc passes them on, and are neither "
                     "checked nor counted otherwise\n",
                     object != nullptr && *object != '\0' ? object : "the executable");
}

}  // namespace

const char* environment_value(const char* name, bool privileged) noexcept {
  if (privileged) return nullptr;  // setuid/setgid: the environment belongs to another user
  return os::environment_variable(name);
}

general_allocator& start() noexcept {
  general_allocator& allocator = general_allocator::global();
  int expected = 0;
  if (phase.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    starting_on_this_thread = true;
    configure_from_environment();
    reporting_process = os::process_id();
    started.store(&allocator, std::memory_order_release);
    phase.store(2, std::memory_order_release);
    // Registering fork and quick_exit handlers may allocate; by now that allocation is served
    // normally.
    (void)os::at_fork(before_fork, after_fork_in_parent, after_fork_in_child);
    (void)std::at_quick_exit(report_at_quick_exit);
    starting_on_this_thread = false;
    return allocator;
  }
  if (starting_on_this_thread) return allocator;
  while (phase.load(std::memory_order_acquire) != 2) os::yield_thread();
  return allocator;
}

}  // namespace memkit::malloc_runtime

// Reports a program can ask for at any time (declared in docs/malloc.md; find them with dlsym
// when the library is preloaded). Both write to `fd`.
MEMKIT_MALLOC_EXPORT void memkit_malloc_print_statistics(int fd) noexcept {
  memkit::malloc_runtime::heap().print_statistics(fd);
}
MEMKIT_MALLOC_EXPORT void memkit_malloc_report_leaks(int fd) noexcept {
  memkit::malloc_runtime::heap().report_leaks(fd);
}

// _exit and _Exit: the end-of-process reports first, as valgrind makes them however a process
// ends (a forked child that leaves through _exit, rsync's third process), then the C library's
// _exit. glibc's exit() reaches its own _exit directly, not these, after report_at_exit ran.
MEMKIT_MALLOC_EXPORT void _exit(int status) {
  memkit::malloc_runtime::report_before_immediate_exit();
  memkit::os::end_process(status);
}
MEMKIT_MALLOC_EXPORT void _Exit(int status) noexcept {
  memkit::malloc_runtime::report_before_immediate_exit();
  memkit::os::end_process(status);
}
