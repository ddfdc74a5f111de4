// The drop-in malloc as users run it: programs started with LD_PRELOAD=libmemkit_malloc.so (or
// through tools/memkit-run), the MEMKIT_* variables, the debug-mode reports of a misbehaving C
// program, and the library dlopen()ed into a process that runs on glibc's malloc.
#include <gtest/gtest.h>

#if !defined(MEMKIT_MALLOC_TESTS)

TEST(malloc_preload, not_built_in_sanitizer_builds) {
  GTEST_SKIP() << "the drop-in malloc is not built when a sanitizer owns malloc";
}

#else

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct outcome {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// Runs `argv` with the current environment minus any MEMKIT_* / LD_PRELOAD, plus `extra`.
outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& extra) {
  outcome result;
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    if (entry.rfind("MEMKIT_", 0) == 0 || entry.rfind("LD_PRELOAD=", 0) == 0) continue;
    environment.push_back(entry);
  }
  environment.insert(environment.end(), extra.begin(), extra.end());
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  if (::pipe(fds) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (error != 0) {
    ::close(fds[0]);
    result.output = std::string("spawn failed: ") + std::strerror(error);
    return result;
  }
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n > 0) result.output.append(buffer, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

const std::string library = MEMKIT_MALLOC_LIBRARY;
const std::string misuse = MEMKIT_MALLOC_MISUSE;
const std::string preload = "LD_PRELOAD=" + library;

outcome misuse_with(const std::string& what, std::vector<std::string> extra) {
  extra.insert(extra.begin(), preload);
  return run({misuse, what}, extra);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The first line of a report: what went wrong, in one line.
std::string first_report_line(const std::string& output) {
  auto at = output.find("memkit:");
  if (at == std::string::npos) return {};
  return output.substr(at, output.find('\n', at) - at);
}

TEST(malloc_preload, a_c_program_runs_on_the_drop_in_and_prints_statistics_on_request) {
  auto quiet = misuse_with("ok", {});
  EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output, "") << "nothing is printed unless asked for";
  auto stats = misuse_with("ok", {"MEMKIT_STATS=1"});
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_TRUE(contains(stats.output, "memkit")) << stats.output;
}

TEST(malloc_preload, a_dlopened_library_uses_the_drop_in_from_its_threads) {
  for (const char* debug : {"MEMKIT_DEBUG=0", "MEMKIT_DEBUG=1"}) {
    auto out = run({misuse, "plugin", MEMKIT_MALLOC_PLUGIN}, {preload, debug, "MEMKIT_LEAKS=0"});
    EXPECT_EQ(out.exit_code, 0) << debug << "\n" << out.output;
  }
}

TEST(malloc_preload, short_lived_threads_leave_nothing_broken) {
  for (const char* debug : {"MEMKIT_DEBUG=0", "MEMKIT_DEBUG=1"}) {
    auto out = misuse_with("threads", {debug, "MEMKIT_LEAKS=0"});
    EXPECT_EQ(out.exit_code, 0) << debug << "\n" << out.output;
  }
}

TEST(malloc_preload, statistics_survive_a_program_that_closes_stderr) {
  auto out = misuse_with("close-stderr", {"MEMKIT_STATS=1"});
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_TRUE(contains(out.output, "memkit")) << out.output;
}

TEST(malloc_preload, reports_go_to_memkit_report_file_when_set) {
  char path[] = "/tmp/memkit_report_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto out = misuse_with("double-free", {"MEMKIT_DEBUG=1", std::string("MEMKIT_REPORT_FILE=") + path});
  EXPECT_EQ(out.signal, SIGABRT);
  EXPECT_FALSE(contains(out.output, "double free")) << "the report went to the file, not stderr";
  std::string written;
  if (FILE* file = std::fopen(path, "r")) {
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) written.append(buffer, n);
    std::fclose(file);
  }
  ::unlink(path);
  EXPECT_TRUE(contains(first_report_line(written), "double free")) << written;
}

TEST(malloc_preload, system_programs_run_on_the_drop_in) {
  auto pipeline = run({"/bin/sh", "-c", "ls -la /usr/lib | sort -r | head -n 5 | wc -l"}, {preload});
  EXPECT_EQ(pipeline.exit_code, 0) << pipeline.output;
  EXPECT_EQ(pipeline.output, "5\n");
  // A C++ program (libstdc++, exceptions, iostreams) on the drop-in.
  auto cpp = run({MEMKIT_CMAKE_COMMAND, "-E", "echo", "cmake on memkit"}, {preload});
  EXPECT_EQ(cpp.exit_code, 0) << cpp.output;
  EXPECT_EQ(cpp.output, "cmake on memkit\n");
}

TEST(malloc_preload, memkit_run_sets_the_variables_and_passes_the_exit_status) {
  auto stats = run({MEMKIT_RUN, "--lib", library, "--stats", "--", misuse, "ok"}, {});
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_TRUE(contains(stats.output, "memkit")) << stats.output;
  auto status = run({MEMKIT_RUN, "--lib", library, "--", "/bin/sh", "-c", "exit 7"}, {});
  EXPECT_EQ(status.exit_code, 7) << status.output;
  auto missing = run({MEMKIT_RUN, "--lib", "/nonexistent/libmemkit_malloc.so", "--", "/bin/true"}, {});
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_TRUE(contains(missing.output, "cannot find")) << missing.output;
  auto debug = run({MEMKIT_RUN, "--lib", library, "--debug", "--", misuse, "double-free"}, {});
  EXPECT_EQ(debug.signal, SIGABRT) << debug.output;
}

// ---- debug mode (MEMKIT_DEBUG=1) ------------------------------------------------------------------

TEST(malloc_preload_debug, a_correct_program_runs_clean) {
  auto out = misuse_with("ok", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_FALSE(contains(out.output, "double free")) << out.output;
}

TEST(malloc_preload_debug, double_free_is_reported_in_one_line_then_aborts) {
  auto out = misuse_with("double-free", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.signal, SIGABRT) << out.output;
  EXPECT_TRUE(contains(first_report_line(out.output), "double free")) << out.output;
}

TEST(malloc_preload_debug, double_free_traces_name_the_places) {
  auto out = misuse_with("double-free", {"MEMKIT_DEBUG=1", "MEMKIT_STACK_TRACES=1"});
  EXPECT_EQ(out.signal, SIGABRT) << out.output;
  // Three traces: the second free (the line to fix) first, then the block's history.
  const auto second = out.output.find("freed again at");
  const auto allocated = out.output.find("allocated at");
  const auto first = out.output.find("first freed at");
  ASSERT_NE(allocated, std::string::npos) << out.output;
  ASSERT_NE(first, std::string::npos) << out.output;
  ASSERT_NE(second, std::string::npos) << out.output;
  EXPECT_LT(second, allocated);
  EXPECT_LT(allocated, first);
  // Each trace reaches the program's own code (the frame that called malloc or free), however
  // many allocator frames the build inlined.
  auto program_frame_between = [&](std::size_t from, std::size_t to) {
    auto at = out.output.find("memkit_malloc_misuse+", from);
    return at != std::string::npos && at < to;
  };
  EXPECT_TRUE(program_frame_between(second, allocated)) << out.output;
  EXPECT_TRUE(program_frame_between(allocated, first)) << out.output;
  EXPECT_TRUE(program_frame_between(first, out.output.size())) << out.output;
}

TEST(malloc_preload_debug, free_of_a_pointer_it_does_not_own_is_reported) {
  auto out = misuse_with("foreign-free", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.signal, SIGABRT) << out.output;
  EXPECT_FALSE(first_report_line(out.output).empty()) << out.output;
  EXPECT_TRUE(contains(out.output, "memkit_malloc_misuse+")) << "the trace reaches the program\n"
                                                               << out.output;
}

TEST(malloc_preload_debug, free_of_an_interior_pointer_is_reported) {
  auto out = misuse_with("interior-free", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.signal, SIGABRT) << out.output;
  EXPECT_TRUE(contains(first_report_line(out.output), "interior")) << out.output;
  EXPECT_TRUE(contains(out.output, "memkit_malloc_misuse+")) << "the trace reaches the program\n"
                                                               << out.output;
}

TEST(malloc_preload_debug, an_overwritten_canary_is_reported_on_free) {
  auto out = misuse_with("overflow", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.signal, SIGABRT) << out.output;
  EXPECT_FALSE(first_report_line(out.output).empty()) << out.output;
  EXPECT_TRUE(contains(out.output, "memkit_malloc_misuse+")) << "the trace reaches the program\n"
                                                               << out.output;
}

TEST(malloc_preload_debug, a_write_after_free_is_reported_on_reuse) {
  auto out = misuse_with("use-after-free", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.signal, SIGABRT) << out.output;
  EXPECT_FALSE(first_report_line(out.output).empty()) << out.output;
  EXPECT_TRUE(contains(out.output, "memkit_malloc_misuse+")) << "the trace reaches the program\n"
                                                               << out.output;
}

TEST(malloc_preload_debug, leaks_are_reported_at_exit_unless_silenced) {
  auto out = misuse_with("leak", {"MEMKIT_DEBUG=1"});
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_TRUE(contains(out.output, "1234")) << out.output;
  auto silenced = misuse_with("leak", {"MEMKIT_DEBUG=1", "MEMKIT_LEAKS=0"});
  EXPECT_EQ(silenced.exit_code, 0) << silenced.output;
  EXPECT_FALSE(contains(silenced.output, "1234")) << silenced.output;
}

TEST(malloc_preload_debug, reports_can_continue_instead_of_aborting) {
  auto out = misuse_with("double-free", {"MEMKIT_DEBUG=1", "MEMKIT_ABORT=0", "MEMKIT_LEAKS=0"});
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_TRUE(contains(first_report_line(out.output), "double free")) << out.output;
}

// ---- the library dlopen()ed into a glibc process ------------------------------------------------

TEST(malloc_dlopen, the_library_can_be_dlopened_and_used_explicitly) {
  // This process runs on glibc's malloc; a dlopen()ed, RTLD_LOCAL copy of the drop-in interposes
  // nothing, but its functions work when called explicitly (its TLS is initial-exec, so this also
  // checks that the loader's static TLS reserve takes it).
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  using malloc_fn = void* (*)(std::size_t);
  using free_fn = void (*)(void*);
  using usable_fn = std::size_t (*)(void*);
  auto memkit_malloc = reinterpret_cast<malloc_fn>(::dlsym(handle, "malloc"));
  auto memkit_free = reinterpret_cast<free_fn>(::dlsym(handle, "free"));
  auto memkit_usable = reinterpret_cast<usable_fn>(::dlsym(handle, "malloc_usable_size"));
  ASSERT_NE(memkit_malloc, nullptr);
  ASSERT_NE(memkit_free, nullptr);
  ASSERT_NE(memkit_usable, nullptr);
  EXPECT_EQ(::dlsym(handle, "memkit_malloc_print_statistics") != nullptr, true);
  EXPECT_EQ(::dlsym(handle, "_ZN6memkit17general_allocator6globalEv"), nullptr)
      << "memkit's internals must stay hidden";
  std::vector<void*> blocks;
  for (std::size_t size = 1; size < 100000; size = size * 3 + 1) {
    void* p = memkit_malloc(size);
    ASSERT_NE(p, nullptr);
    EXPECT_GE(memkit_usable(p), size);
    std::memset(p, 0x42, size);
    blocks.push_back(p);
  }
  for (void* p : blocks) memkit_free(p);
  EXPECT_EQ(::dlclose(handle), 0);
}

}  // namespace

#endif  // MEMKIT_MALLOC_TESTS
