// Stack capture and symbolization (include/memkit/detail/stack_trace.hpp, src/symbolizer.cpp).
//
// This executable is built with -g and without -rdynamic (tests/CMakeLists.txt), so its own
// functions are in .symtab and the DWARF line tables but not in .dynsym: dladdr cannot name them,
// and only the libdw symbolizer can. The first test checks that premise.
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <sys/wait.h>
#include <gtest/gtest.h>
#include <search.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "memkit/detail/stack_trace.hpp"
#include "../src/os/symbols.hpp"

extern "C" int memkit_test_call_without_unwind_tables(int (*function)());

// At namespace scope, not in an anonymous namespace, so that the functions below that take it
// keep external linkage (and a plain demangled name).
constexpr std::size_t max_frames = 16;

struct trace {
  void* frames[max_frames] = {};
  std::size_t count = 0;
};

// Each capturing function is called through a volatile pointer (so it is neither inlined nor
// specialized) and does work after the capture (so the capture is not a tail call): its own frame
// is then frames[0], at a return address inside the function's line range.
namespace memkit_symbols_test::nested {

constexpr unsigned namespace_function_first_line = __LINE__ + 1;
[[gnu::noinline]] void capture_in_namespace(trace& out) {
  out.count = memkit::detail::capture_stack_trace(out.frames, max_frames, 0);
  asm volatile("" ::: "memory");
}
constexpr unsigned namespace_function_last_line = __LINE__ - 1;

}  // namespace memkit_symbols_test::nested

constexpr unsigned static_function_first_line = __LINE__ + 1;
[[gnu::noinline]] static void capture_in_static_function(trace& out) {
  out.count = memkit::detail::capture_stack_trace(out.frames, max_frames, 0);
  asm volatile("" ::: "memory");
}
constexpr unsigned static_function_last_line = __LINE__ - 1;

// A comparator called by the C library's tsearch (which no sanitizer intercepts): its trace runs
// through libc's exported tsearch.
trace trace_in_tsearch;
[[gnu::noinline]] static int compare_and_capture(const void* a, const void* b) {
  if (trace_in_tsearch.count == 0) {
    trace_in_tsearch.count = memkit::detail::capture_stack_trace(trace_in_tsearch.frames, max_frames, 0);
  }
  asm volatile("" ::: "memory");
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}

namespace {

using memkit::detail::resolved_frame;

void (*volatile namespace_function)(trace&) = &memkit_symbols_test::nested::capture_in_namespace;
void (*volatile static_function)(trace&) = &capture_in_static_function;

bool libdw_installed() {
  void* handle = ::dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  return handle != nullptr;
}

std::string base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

// What print_stack_trace writes, read back through a pipe.
std::string printed(const trace& t) {
  int ends[2];
  if (::pipe(ends) != 0) return "pipe failed";
  memkit::detail::print_stack_trace(ends[1], t.frames, t.count);
  ::close(ends[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(ends[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(ends[0]);
  return text;
}

trace tsearch_trace() {
  trace_in_tsearch = {};
  static int values[] = {3, 1, 2};
  void* root = nullptr;
  for (int& value : values) (void)::tsearch(&value, &root, &compare_and_capture);
  while (root != nullptr) (void)::tdelete(*static_cast<int**>(root), &root, &compare_and_capture);
  return trace_in_tsearch;
}

// The path of the separate debug file of the object that holds `address`, by build-id
// (/usr/lib/debug/.build-id/xx/yyyy.debug), or "" when the object has no build-id.
std::string debug_file_of(const void* address) {
  struct search {
    std::uintptr_t address;
    std::string path;
  } wanted{reinterpret_cast<std::uintptr_t>(address), {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* argument) {
        auto* s = static_cast<search*>(argument);
        bool contains = false;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& segment = info->dlpi_phdr[i];
          const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
          if (segment.p_type == PT_LOAD && s->address >= begin && s->address < begin + segment.p_memsz) contains = true;
        }
        if (!contains) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_NOTE) continue;
          const auto* at = reinterpret_cast<const unsigned char*>(info->dlpi_addr + segment.p_vaddr);
          const auto* end = at + segment.p_memsz;
          while (at + sizeof(ElfW(Nhdr)) <= end) {
            const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
            const unsigned char* name = at + sizeof(ElfW(Nhdr));
            const unsigned char* description = name + ((note->n_namesz + 3) & ~3u);
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
              char hex[3];
              s->path = "/usr/lib/debug/.build-id/";
              for (unsigned b = 0; b < note->n_descsz; ++b) {
                std::snprintf(hex, sizeof hex, "%02x", description[b]);
                s->path += hex;
                if (b == 0) s->path += '/';
              }
              s->path += ".debug";
              return 1;
            }
            at = description + ((note->n_descsz + 3) & ~3u);
          }
        }
        return 1;
      },
      &wanted);
  return wanted.path;
}

// Each test picks the symbolizer it needs and leaves libdw selected.
class stack_trace : public ::testing::Test {
 protected:
  void TearDown() override { memkit::detail::set_symbolizer_library_for_testing(nullptr); }
};

TEST_F(stack_trace, this_test_is_built_without_rdynamic) {
  // If the executable exported its functions, dladdr would name them and the tests below could
  // not tell the symbolizers apart.
  EXPECT_EQ(::dlsym(RTLD_DEFAULT, "_ZN19memkit_symbols_test6nested20capture_in_namespaceER5trace"), nullptr);
}

TEST_F(stack_trace, libdw_is_used_when_installed) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed (tools/install-deps installs it)";
  EXPECT_TRUE(memkit::detail::symbolizer_uses_libdw());
}

TEST_F(stack_trace, a_static_function_is_named_with_its_file_and_line) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  trace t;
  static_function(t);
  ASSERT_GE(t.count, 2u);
  resolved_frame frame;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], frame));
  EXPECT_EQ(frame.address, t.frames[0]);
  ASSERT_NE(frame.function, nullptr);
  EXPECT_EQ(std::string(frame.function), "capture_in_static_function(trace&)");
  EXPECT_GT(frame.function_offset, 0u);
  ASSERT_NE(frame.file, nullptr);
  EXPECT_EQ(base_name(frame.file), "stack_trace_test.cpp");
  EXPECT_GE(frame.line, static_function_first_line);
  EXPECT_LE(frame.line, static_function_last_line);
  ASSERT_NE(frame.object, nullptr);
  EXPECT_EQ(base_name(frame.object), "stack_trace_test");
}

TEST_F(stack_trace, a_function_in_a_namespace_is_demangled) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  trace t;
  namespace_function(t);
  ASSERT_GE(t.count, 2u);
  resolved_frame frame;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], frame));
  ASSERT_NE(frame.function, nullptr);
  EXPECT_EQ(std::string(frame.function), "memkit_symbols_test::nested::capture_in_namespace(trace&)");
  ASSERT_NE(frame.file, nullptr);
  EXPECT_EQ(base_name(frame.file), "stack_trace_test.cpp");
  EXPECT_GE(frame.line, memkit_symbols_test::nested::namespace_function_first_line);
  EXPECT_LE(frame.line, memkit_symbols_test::nested::namespace_function_last_line);
}

TEST_F(stack_trace, the_object_offset_is_the_files_own_address) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  trace t;
  static_function(t);
  ASSERT_GE(t.count, 1u);
  resolved_frame frame;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], frame));
  // The function's address in the file (its load address minus the load bias the loader chose
  // for this position-independent executable) lies just before the frame's object offset.
  Dl_info info{};
  void* map = nullptr;
  ASSERT_NE(::dladdr1(reinterpret_cast<void*>(&capture_in_static_function), &info, &map, RTLD_DL_LINKMAP), 0);
  const auto bias = static_cast<const struct link_map*>(map)->l_addr;
  const auto function_in_file = reinterpret_cast<std::uintptr_t>(&capture_in_static_function) - bias;
  EXPECT_EQ(frame.object_offset - frame.function_offset, function_in_file);
}

TEST_F(stack_trace, printed_frames_carry_name_file_line_and_object) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  trace t;
  namespace_function(t);
  const std::string text = printed(t);
  EXPECT_NE(text.find("    #0 0x"), std::string::npos) << text;
  EXPECT_NE(text.find(" memkit_symbols_test::nested::capture_in_namespace(trace&)+0x"), std::string::npos) << text;
  EXPECT_NE(text.find("stack_trace_test.cpp:"), std::string::npos) << text;
  EXPECT_NE(text.find("(stack_trace_test+0x"), std::string::npos) << text;
  // One line per frame.
  EXPECT_EQ(static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')), t.count) << text;
}

TEST_F(stack_trace, frames_in_the_c_library_are_named) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  const trace t = tsearch_trace();
  ASSERT_GE(t.count, 3u);
  resolved_frame frame;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], frame));
  ASSERT_NE(frame.function, nullptr);
  EXPECT_EQ(std::string(frame.function), "compare_and_capture(void const*, void const*)");
  bool saw_tsearch = false;
  for (std::size_t i = 1; i < t.count; ++i) {
    ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[i], frame));
    if (frame.function != nullptr && std::string(frame.function).find("tsearch") != std::string::npos) {
      saw_tsearch = true;
      // The C library is stripped; its lines come from its separate debug file, when installed.
      if (::access(debug_file_of(t.frames[i]).c_str(), R_OK) == 0) {
        ASSERT_NE(frame.file, nullptr) << debug_file_of(t.frames[i]);
        EXPECT_NE(std::string(frame.file).find("tsearch.c"), std::string::npos) << frame.file;
        EXPECT_GT(frame.line, 0u);
      }
    }
  }
  EXPECT_TRUE(saw_tsearch) << printed(t);
}

TEST_F(stack_trace, repeated_lookups_give_the_same_answer) {
  trace t;
  static_function(t);
  ASSERT_GE(t.count, 1u);
  resolved_frame first;
  resolved_frame again;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], first));
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], again));
  EXPECT_EQ(first.function, again.function);
  EXPECT_EQ(first.line, again.line);
  EXPECT_EQ(first.object_offset, again.object_offset);
}

TEST_F(stack_trace, an_address_outside_every_object_is_printed_bare) {
  resolved_frame frame;
  EXPECT_FALSE(memkit::detail::resolve_stack_frame(reinterpret_cast<void*>(0x10), frame));
  EXPECT_EQ(frame.function, nullptr);
  EXPECT_EQ(frame.object, nullptr);
  EXPECT_FALSE(memkit::detail::resolve_stack_frame(nullptr, frame));
  trace t;
  t.frames[0] = reinterpret_cast<void*>(0x10);
  t.count = 1;
  EXPECT_EQ(printed(t), "    #0 0x10\n");
  t.count = 0;
  EXPECT_EQ(printed(t), "    (no stack trace captured)\n");
}

TEST_F(stack_trace, without_libdw_dladdr_names_exported_functions_only) {
  memkit::detail::set_symbolizer_library_for_testing("libmemkit-no-such-library.so.0");
  EXPECT_FALSE(memkit::detail::symbolizer_uses_libdw());
  // This executable's own functions are not exported: an object and an offset, no name, no line.
  trace t;
  static_function(t);
  ASSERT_GE(t.count, 1u);
  resolved_frame frame;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], frame));
  EXPECT_EQ(frame.function, nullptr);
  EXPECT_EQ(frame.file, nullptr);
  ASSERT_NE(frame.object, nullptr);
  EXPECT_EQ(base_name(frame.object), "stack_trace_test");
  const std::string text = printed(t);
  EXPECT_NE(text.find("    #0 0x"), std::string::npos) << text;
  EXPECT_NE(text.find(" (stack_trace_test+0x"), std::string::npos) << text;
  EXPECT_EQ(text.find(" at "), std::string::npos) << text;
  // The C library's tsearch is exported: dladdr names it.
  const trace q = tsearch_trace();
  bool saw_tsearch = false;
  for (std::size_t i = 1; i < q.count; ++i) {
    ASSERT_TRUE(memkit::detail::resolve_stack_frame(q.frames[i], frame));
    if (frame.function != nullptr && std::string(frame.function).find("tsearch") != std::string::npos) saw_tsearch = true;
  }
  EXPECT_TRUE(saw_tsearch) << printed(q);
}

TEST_F(stack_trace, libdw_comes_back_after_the_fallback) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  memkit::detail::set_symbolizer_library_for_testing("libmemkit-no-such-library.so.0");
  EXPECT_FALSE(memkit::detail::symbolizer_uses_libdw());
  memkit::detail::set_symbolizer_library_for_testing(nullptr);
  EXPECT_TRUE(memkit::detail::symbolizer_uses_libdw());
  trace t;
  static_function(t);
  resolved_frame frame;
  ASSERT_TRUE(memkit::detail::resolve_stack_frame(t.frames[0], frame));
  ASSERT_NE(frame.function, nullptr);
  EXPECT_EQ(std::string(frame.function), "capture_in_static_function(trace&)");
}

TEST_F(stack_trace, the_environment_can_ask_for_the_fallback) {
  ASSERT_EQ(::setenv("MEMKIT_SYMBOLIZER", "dladdr", 1), 0);
  memkit::detail::set_symbolizer_library_for_testing(nullptr);  // choose again
  const bool uses_libdw = memkit::detail::symbolizer_uses_libdw();
  ASSERT_EQ(::unsetenv("MEMKIT_SYMBOLIZER"), 0);
  EXPECT_FALSE(uses_libdw);
}

TEST_F(stack_trace, the_symbolizing_flag_is_off_outside_the_symbolizer) {
  EXPECT_FALSE(memkit::detail::symbolizing_on_this_thread());
  trace t;
  static_function(t);
  resolved_frame frame;
  (void)memkit::detail::resolve_stack_frame(t.frames[0], frame);
  EXPECT_FALSE(memkit::detail::symbolizing_on_this_thread());
}

TEST_F(stack_trace, threads_symbolize_at_once) {
  std::vector<std::thread> threads;
  std::vector<std::string> names(4);
  for (std::size_t i = 0; i < names.size(); ++i) {
    threads.emplace_back([&names, i] {
      for (int round = 0; round < 50; ++round) {
        trace t;
        if (i % 2 == 0) static_function(t); else namespace_function(t);
        resolved_frame frame;
        if (memkit::detail::resolve_stack_frame(t.frames[0], frame) && frame.function != nullptr) {
          names[i] = frame.function;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (!libdw_installed()) return;
  EXPECT_EQ(names[0], "capture_in_static_function(trace&)");
  EXPECT_EQ(names[1], "memkit_symbols_test::nested::capture_in_namespace(trace&)");
}

// ---- inside the drop-in malloc's debug mode ---------------------------------------------------------
// There libdw's own allocations go through memkit's malloc while a report symbolizes: they must be
// served plainly (no records, no checks, no recursion into the report), and the report must still
// name the program's functions with their lines.
#if defined(MEMKIT_STACK_TRACE_DROPIN)

struct run_result {
  std::string output;
  int status = 0;
};

run_result run_misuse(const char* what, bool libdw) {
  int ends[2];
  run_result result;
  if (::pipe(ends) != 0) return result;
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(ends[1], STDERR_FILENO);
    ::dup2(ends[1], STDOUT_FILENO);
    ::close(ends[0]);
    ::setenv("LD_PRELOAD", MEMKIT_STACK_TRACE_DROPIN_LIBRARY, 1);
    // Whatever the test itself runs under: debug mode, traces, leak report, abort, stderr.
    ::setenv("MEMKIT_DEBUG", "1", 1);
    ::setenv("MEMKIT_STACK_TRACES", "1", 1);
    ::setenv("MEMKIT_LEAKS", "1", 1);
    ::setenv("MEMKIT_ABORT", "1", 1);
    ::unsetenv("MEMKIT_REPORT_FILE");
    if (libdw) ::unsetenv("MEMKIT_SYMBOLIZER"); else ::setenv("MEMKIT_SYMBOLIZER", "dladdr", 1);
    ::execl(MEMKIT_STACK_TRACE_DROPIN, MEMKIT_STACK_TRACE_DROPIN, what, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(ends[1]);
  char buffer[4096];
  for (ssize_t n; (n = ::read(ends[0], buffer, sizeof buffer)) > 0;) result.output.append(buffer, static_cast<std::size_t>(n));
  ::close(ends[0]);
  ::waitpid(child, &result.status, 0);
  return result;
}

TEST_F(stack_trace, a_double_free_report_in_the_drop_in_names_main_and_its_line) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  const run_result out = run_misuse("double-free", true);
  ASSERT_TRUE(WIFSIGNALED(out.status)) << out.output;
  EXPECT_EQ(WTERMSIG(out.status), SIGABRT) << out.output;
  EXPECT_NE(out.output.find("memkit: double free"), std::string::npos) << out.output;
  // The program is C, built without -rdynamic: its main is named from .symtab, its lines from DWARF.
  EXPECT_NE(out.output.find(" main+0x"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find(" at "), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("misuse.c:"), std::string::npos) << out.output;
}

TEST_F(stack_trace, a_leak_report_in_the_drop_in_is_symbolized_and_lists_only_the_leak) {
  if (!libdw_installed()) GTEST_SKIP() << "libdw.so.1 is not installed";
  const run_result out = run_misuse("leak", true);
  ASSERT_TRUE(WIFEXITED(out.status)) << out.output;
  EXPECT_EQ(WEXITSTATUS(out.status), 0) << out.output;
  EXPECT_NE(out.output.find("memkit: 1 block, 1234 bytes, definitely lost"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("misuse.c:"), std::string::npos) << out.output;
  // libdw's allocations while the report printed are not leaks of the program's.
  EXPECT_NE(out.output.find("memkit: leak summary: definitely lost: 1234 bytes in 1 blocks; indirectly lost: 0 "
                            "bytes in 0 blocks"),
            std::string::npos)
      << out.output;
}

TEST_F(stack_trace, without_libdw_the_drop_in_still_reports) {
  const run_result out = run_misuse("double-free", false);
  ASSERT_TRUE(WIFSIGNALED(out.status)) << out.output;
  EXPECT_NE(out.output.find("memkit: double free"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("(memkit_malloc_misuse+0x"), std::string::npos) << out.output;
  EXPECT_EQ(out.output.find("misuse.c:"), std::string::npos) << out.output;
}

#endif

// os::symbols::find_exit_path: nothing outside exit(); below it, the C library's frames there, above
// the handler's own, and the registers of exit()'s caller.
TEST(exit_path, is_not_found_outside_exit) {
  memkit::os::symbols::exit_path path;
  EXPECT_FALSE(memkit::os::symbols::find_exit_path(path));
  EXPECT_EQ(path.frame_count, 0u);
}

volatile bool seen_in_handler = false;
void note_signal_handler(int) { seen_in_handler = memkit::os::symbols::may_be_in_signal_handler(); }
int ask_from_below_a_frame_without_unwind_tables() { return memkit::os::symbols::may_be_in_signal_handler() ? 1 : 0; }

TEST(signal_handler, is_told_apart_from_ordinary_code) {
  EXPECT_FALSE(memkit::os::symbols::may_be_in_signal_handler());
  std::thread([] { EXPECT_FALSE(memkit::os::symbols::may_be_in_signal_handler()); }).join();
  struct sigaction action{};
  struct sigaction previous{};
  action.sa_handler = note_signal_handler;
  ASSERT_EQ(::sigaction(SIGUSR2, &action, &previous), 0);
  ASSERT_EQ(::raise(SIGUSR2), 0);
  ::sigaction(SIGUSR2, &previous, nullptr);
  EXPECT_TRUE(seen_in_handler);
}

// Below a frame the unwinder cannot step over, a handler may lie unseen: not sure, so true.
TEST(signal_handler, a_frame_without_unwind_tables_leaves_it_open) {
  EXPECT_EQ(memkit_test_call_without_unwind_tables(ask_from_below_a_frame_without_unwind_tables), 1);
}

std::uintptr_t exit_caller_marker = 0;

// Exits 0 when the path is as described, else with the number of the first check that failed.
void check_exit_path() {
  volatile int local = 0;  // lies in this handler's frame, which is not listed
  const auto here = reinterpret_cast<std::uintptr_t>(&local);
  memkit::os::symbols::exit_path path;
  if (!memkit::os::symbols::find_exit_path(path)) ::_exit(10);
  if (path.frame_count < 2) ::_exit(11);  // at least exit() and its handler loop
  for (std::size_t i = 0; i < path.frame_count; ++i) {
    const auto& f = path.frames[i];
    if (f.begin >= f.end) ::_exit(12);
    if (f.begin <= here) ::_exit(13);
    if (i > 0 && f.begin < path.frames[i - 1].end) ::_exit(14);
  }
#if defined(__x86_64__)
  if (path.register_count != 6) ::_exit(15);
  bool kept = false;  // exit_holding_a_marker() called exit() with the marker in r12
  for (std::size_t i = 0; i < path.register_count; ++i) kept = kept || path.caller_registers[i] == exit_caller_marker;
  if (!kept) ::_exit(16);
#endif
  ::_exit(0);
}

// Calls exit() (or quick_exit(), `quick`) with the marker in r12.
[[noreturn]] __attribute__((noinline)) void exit_holding_a_marker(bool quick = false) {
#if defined(__x86_64__)
  register std::uintptr_t held __asm__("r12") = exit_caller_marker;
  __asm__ volatile("" : "+r"(held));
  if (quick) __asm__ volatile("xor %%edi, %%edi\n call quick_exit@PLT" : : "r"(held) : "rdi", "memory");
  __asm__ volatile("xor %%edi, %%edi\n call exit@PLT" : : "r"(held) : "rdi", "memory");
#endif
  if (quick) std::quick_exit(0);
  std::exit(0);
}

TEST(exit_path, below_exit_lists_the_c_librarys_frames_and_the_callers_registers) {
  for (const bool quick : {false, true}) {
    exit_caller_marker = 0x5a5a0000u + static_cast<std::uintptr_t>(::getpid());
    const pid_t child = ::fork();
    if (child == 0) {
      if (quick) std::at_quick_exit(check_exit_path);
      else std::atexit(check_exit_path);
      exit_holding_a_marker(quick);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << (quick ? "quick_exit" : "exit") << ": check " << WEXITSTATUS(status)
                                      << " failed";
  }
}

}  // namespace
