// The os layer's view of the process's own address space (src/os/process.hpp, internal), which
// debug mode's leak scan walks: regions with their access, copies and probes that do not fault,
// which pages were ever touched, the number of threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "../src/os/process.hpp"
#include "memkit/detail/config.hpp"
#include "memkit/os.hpp"
#include "support/refuse_tracing.h"

namespace {

using memkit::os::page_size;
namespace process = memkit::os::process;

int data_segment_word = 42;  // in the data segment: a private writable region

struct snapshot {
  std::vector<process::region> regions;
  std::size_t stop_after = SIZE_MAX;
};

snapshot walk(std::size_t stop_after = SIZE_MAX) {
  snapshot s;
  s.stop_after = stop_after;
  const auto status = process::for_each_region(
      [](const process::region& r, void* context) {
        auto* out = static_cast<snapshot*>(context);
        out->regions.push_back(r);
        return out->regions.size() < out->stop_after;
      },
      &s);
  EXPECT_TRUE(status.ok()) << memkit::os::error_message(status.error());
  return s;
}

const process::region* containing(const snapshot& s, const void* address) {
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  for (const auto& r : s.regions) {
    if (a >= r.begin && a < r.end) return &r;
  }
  return nullptr;
}

TEST(os_process, regions_cover_the_data_segment_the_stack_and_a_mapping_in_address_order) {
  int on_stack = 1;
  auto mapped = memkit::os::map(4 * page_size());
  ASSERT_TRUE(mapped.ok());
  auto reserved = memkit::os::reserve(16 * page_size());
  ASSERT_TRUE(reserved.ok());
  const snapshot s = walk();
  ASSERT_FALSE(s.regions.empty());
  for (std::size_t i = 0; i < s.regions.size(); ++i) {
    EXPECT_LT(s.regions[i].begin, s.regions[i].end);
    if (i > 0) {
      EXPECT_LE(s.regions[i - 1].end, s.regions[i].begin) << "sorted, never overlapping";
    }
    EXPECT_NE(s.regions[i].name, nullptr);
  }
  for (const void* address : {static_cast<const void*>(&data_segment_word), static_cast<const void*>(&on_stack),
                              static_cast<const void*>(mapped.value())}) {
    const process::region* r = containing(s, address);
    ASSERT_NE(r, nullptr) << address;
    EXPECT_TRUE(r->readable && r->writable && r->is_private) << address;
  }
  // A reservation is no data: listed unreadable (POSIX), or not listed at all (Windows lists
  // committed memory only).
  if (const process::region* r = containing(s, reserved.value())) {
    EXPECT_FALSE(r->readable);
  }
  (void)memkit::os::release(mapped.value(), 4 * page_size());
  (void)memkit::os::release(reserved.value(), 16 * page_size());
}

TEST(os_process, the_walk_stops_when_the_visitor_says_so) {
  const snapshot all = walk();
  ASSERT_GE(all.regions.size(), 3u);
  const snapshot two = walk(2);
  ASSERT_EQ(two.regions.size(), 2u);
  EXPECT_EQ(two.regions[0].begin, all.regions[0].begin);
}

TEST(os_process, read_memory_copies_and_stops_at_the_first_unmapped_page) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(2 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  for (std::size_t i = 0; i < 2 * page; ++i) bytes[i] = static_cast<unsigned char>(i * 7);
  std::vector<unsigned char> copy(2 * page);
  const auto whole = process::read_memory(bytes, copy.data(), 2 * page);
  if (!whole.ok()) GTEST_SKIP() << "no safe copy on this system: " << memkit::os::error_message(whole.error());
  EXPECT_EQ(whole.value(), 2 * page);
  EXPECT_EQ(std::memcmp(copy.data(), bytes, 2 * page), 0);
  // The second page made inaccessible: the copy ends where it starts.
  ASSERT_TRUE(memkit::os::decommit(bytes + page, page).ok());
  const auto partial = process::read_memory(bytes, copy.data(), 2 * page);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial.value(), page);
  auto reserved = memkit::os::reserve(page);  // some unreadable memory
  ASSERT_TRUE(reserved.ok());
  const auto none = process::read_memory(reserved.value(), copy.data(), page);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value(), 0u) << "an unreadable first page: nothing copied, no fault";
  (void)memkit::os::release(reserved.value(), page);
  (void)memkit::os::release(mapped.value(), 2 * page);
}

TEST(os_process, touched_pages_marks_the_pages_written) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(4 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  bytes[0] = 1;
  bytes[2 * page] = 1;
  unsigned char touched[4] = {9, 9, 9, 9};
  ASSERT_TRUE(process::touched_pages(bytes, 4 * page, touched).ok());
  EXPECT_EQ(touched[0], 1);
  EXPECT_EQ(touched[2], 1);
#if defined(__linux__)
  // Linux tells pages never touched apart (Windows counts every committed page as touched).
  EXPECT_EQ(touched[1], 0);
  EXPECT_EQ(touched[3], 0);
#endif
  (void)memkit::os::release(mapped.value(), 4 * page);
#if defined(__linux__)
  // Linux's mincore fails on a range that is not mapped.
  EXPECT_FALSE(process::touched_pages(bytes, 4 * page, touched).ok());
#endif
}

#if defined(__linux__)
// A private mapping of a file the process wrote: its pages are in memory though the mapping was
// never touched, and they count (the leak scan reads them rather than guess what the file holds).
TEST(os_process, touched_pages_counts_a_file_page_in_memory) {
  const std::size_t page = page_size();
  FILE* file = ::tmpfile();
  ASSERT_NE(file, nullptr);
  std::vector<unsigned char> content(2 * page, 0x5a);
  ASSERT_EQ(::fwrite(content.data(), 1, content.size(), file), content.size());
  ASSERT_EQ(::fflush(file), 0);
  void* view = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, ::fileno(file), 0);
  ASSERT_NE(view, MAP_FAILED);
  unsigned char touched[2] = {9, 9};
  ASSERT_TRUE(process::touched_pages(view, 2 * page, touched).ok());
  EXPECT_EQ(touched[0], 1);
  EXPECT_EQ(touched[1], 1);
  ::munmap(view, 2 * page);
  ::fclose(file);
}

// A page swapped out holds what the process wrote: it counts as touched, though not in memory
// (mincore alone says it is not resident). Needs swap: MADV_PAGEOUT cannot move a page of
// anonymous memory anywhere without it.
TEST(os_process, touched_pages_counts_a_swapped_out_page) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(2 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  std::memset(bytes, 0x5a, page);
  ASSERT_EQ(::madvise(bytes, 2 * page, 21 /* MADV_PAGEOUT, Linux 5.4 */), 0) << std::strerror(errno);
  unsigned char in_memory[2] = {9, 9};
  ASSERT_EQ(::mincore(bytes, 2 * page, in_memory), 0);
  if ((in_memory[0] & 1) != 0) {
    (void)memkit::os::release(mapped.value(), 2 * page);
    GTEST_SKIP() << "the written page is still in memory (no swap, or it waits in the swap cache)";
  }
  unsigned char touched[2] = {9, 9};
  ASSERT_TRUE(process::touched_pages(bytes, 2 * page, touched).ok());
  EXPECT_EQ(touched[0], 1) << "a swapped-out page";
  EXPECT_EQ(touched[1], 0) << "a page never touched";
  EXPECT_EQ(bytes[page - 1], 0x5a);
  (void)memkit::os::release(mapped.value(), 2 * page);
}
#endif

TEST(os_process, readable_prefix_stops_before_the_first_page_that_cannot_be_read) {
  const std::size_t page = page_size();
  auto mapped = memkit::os::map(3 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  ASSERT_TRUE(memkit::os::decommit(bytes + page, page).ok());  // the middle page: no access
  const auto first = process::readable_prefix(bytes, 3 * page);
  if (!first.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(first.error());
  EXPECT_EQ(first.value(), page);
  EXPECT_EQ(process::readable_prefix(bytes + 10, 3 * page - 10).value(), page - 10) << "from inside a page";
  EXPECT_EQ(process::readable_prefix(bytes, page / 2).value(), page / 2) << "never more than asked";
  EXPECT_EQ(process::readable_prefix(bytes + page, 2 * page).value(), 0u) << "an unreadable first page";
  EXPECT_EQ(process::readable_prefix(bytes + 2 * page, page).value(), page);
  (void)memkit::os::release(mapped.value(), 3 * page);
  auto reserved = memkit::os::reserve(page);
  ASSERT_TRUE(reserved.ok());
  EXPECT_EQ(process::readable_prefix(reserved.value(), page).value(), 0u);
  (void)memkit::os::release(reserved.value(), page);
}

TEST(os_process, thread_count_counts_the_threads_running) {
  std::thread([] {}).join();  // a runtime that starts a thread of its own with the first (TSan's) has now
  const auto before = process::thread_count();
  if (!before.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(before.error());
  EXPECT_GE(before.value(), 1u);
  std::atomic<bool> started{false};
  std::atomic<bool> stop{false};
  std::thread other([&] {
    started = true;
    while (!stop) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  const auto during = process::thread_count();
  stop = true;
  other.join();
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(during.value(), before.value() + 1);
}

#if !defined(_WIN32)
// Pages that are mapped and listed readable but fault when read: a private file mapping's pages
// past the end of its file (SIGBUS) and, where the kernel has them (Linux 6.13), guard regions
// inside a readable mapping (SIGSEGV; /proc/self/maps does not show them).
TEST(os_process, readable_prefix_stops_at_a_file_mappings_end_and_at_a_guard_region) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  std::vector<char> one_page(page, 'x');
  ASSERT_EQ(std::fwrite(one_page.data(), 1, page, file), page);
  ASSERT_EQ(std::fflush(file), 0);
  void* mapped = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, ::fileno(file), 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const auto file_prefix = process::readable_prefix(mapped, 3 * page);
  if (!file_prefix.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(file_prefix.error());
  EXPECT_EQ(file_prefix.value(), page) << "the pages past the file's end";
  ::munmap(mapped, 3 * page);
  std::fclose(file);

  constexpr int guard_install = 102;  // MADV_GUARD_INSTALL, in headers of Linux 6.13 and later
  void* anonymous = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anonymous, MAP_FAILED);
  auto* bytes = static_cast<unsigned char*>(anonymous);
  if (::madvise(bytes + page, page, guard_install) != 0) {
    ::munmap(anonymous, 3 * page);
    GTEST_SKIP() << "no guard regions in this kernel";
  }
  EXPECT_EQ(process::readable_prefix(bytes, 3 * page).value(), page);
  EXPECT_EQ(process::readable_prefix(bytes + 2 * page, page).value(), page);
  ::munmap(anonymous, 3 * page);
}

// The system's page, whatever MEMKIT_PAGE_SIZE makes os::page_size() (the suite also runs with
// 16 and 64 KiB): the unit in which an unreadable page is skipped.
TEST(os_process, protection_granularity_is_the_systems_page) {
  EXPECT_EQ(process::protection_granularity(), static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_LE(process::protection_granularity(), page_size());
}

void programs_own_handler(int) {}

// The probe catches its faults with handlers of its own while it runs: the program's handlers and
// its signal mask (here with both faults blocked, which would kill a process that faults) are
// what they were afterwards.
TEST(os_process, readable_prefix_leaves_the_programs_fault_handlers_and_signal_mask_as_they_were) {
  struct sigaction own {};
  own.sa_handler = programs_own_handler;
  sigemptyset(&own.sa_mask);
  struct sigaction saved_segv {};
  struct sigaction saved_bus {};
  ASSERT_EQ(::sigaction(SIGSEGV, &own, &saved_segv), 0);
  ASSERT_EQ(::sigaction(SIGBUS, &own, &saved_bus), 0);
  sigset_t blocked;
  sigset_t saved_mask;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGSEGV);
  sigaddset(&blocked, SIGBUS);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &blocked, &saved_mask), 0);

  const std::size_t page = page_size();
  auto mapped = memkit::os::map(2 * page);
  ASSERT_TRUE(mapped.ok());
  auto* bytes = static_cast<unsigned char*>(mapped.value());
  ASSERT_TRUE(memkit::os::decommit(bytes + page, page).ok());
  const auto prefix = process::readable_prefix(bytes, 2 * page);
  (void)memkit::os::release(mapped.value(), 2 * page);

  sigset_t mask_after;
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, &saved_mask, &mask_after), 0);
  struct sigaction segv_after {};
  struct sigaction bus_after {};
  ASSERT_EQ(::sigaction(SIGSEGV, &saved_segv, &segv_after), 0);
  ASSERT_EQ(::sigaction(SIGBUS, &saved_bus, &bus_after), 0);
  if (!prefix.ok()) GTEST_SKIP() << "the system cannot tell: " << memkit::os::error_message(prefix.error());
  EXPECT_EQ(prefix.value(), page);
  EXPECT_EQ(sigismember(&mask_after, SIGSEGV), 1);
  EXPECT_EQ(sigismember(&mask_after, SIGBUS), 1);
  EXPECT_EQ(segv_after.sa_handler, &programs_own_handler);
  EXPECT_EQ(bus_after.sa_handler, &programs_own_handler);
}
#endif

// ---- stopped_threads ----------------------------------------------------------------------------

// A thread that counts in memory while it keeps `magic` in a callee-saved register, and records
// where its stack is.
struct counting_thread {
  static constexpr std::uintptr_t magic = 0x6d656d6b69740a51u;
  std::atomic<long> counter{0};
  std::atomic<bool> quit{false};
  std::atomic<std::uintptr_t> stack_local{0};
  std::thread thread;

  counting_thread() {
    thread = std::thread([this] {
      char here = 0;
      stack_local = reinterpret_cast<std::uintptr_t>(&here);
#if defined(__x86_64__)
      register std::uintptr_t held asm("r12") = magic;
#elif defined(__aarch64__)
      register std::uintptr_t held asm("x19") = magic;
#else
      std::uintptr_t held = magic;
#endif
      while (!quit.load(std::memory_order_relaxed)) {
        asm volatile("" : "+r"(held));
        counter.fetch_add(1, std::memory_order_relaxed);
      }
      asm volatile("" : : "r"(held), "r"(&here));
    });
    while (counter.load() == 0) std::this_thread::yield();
  }
  ~counting_thread() {
    quit = true;
    thread.join();
  }
};

bool holds(const process::stopped_threads::thread& t, std::uintptr_t value) {
  for (std::size_t at = 0; at + sizeof value <= t.register_bytes; at += sizeof value) {
    std::uintptr_t word;
    std::memcpy(&word, static_cast<const unsigned char*>(t.registers) + at, sizeof word);
    if (word == value) return true;
  }
  return false;
}

#if !defined(_WIN32)
void sleep_ms(long ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000};
  while (::nanosleep(&t, &t) != 0) {
  }
}
#endif

// Where the system refuses to stop threads (no ptrace here, or none on this system), the tests
// of stopped threads have nothing to check; any other failure is one.
bool refused(const memkit::os::status& status) {
  return !status.ok() && (status.error() == EPERM || status.error() == ENOSYS);
}

// While stopped, no other thread runs (its counter stands still), and each one's stack pointer
// lies in its stack and its registers hold what it kept there; resumed, it runs on. The caller
// is never among them. Returns stop()'s status; checks nothing more when it failed.
memkit::os::status stop_and_check_standing_still() {
  counting_thread other;
  process::stopped_threads stopped;
  const auto status = stopped.stop();
  if (!status.ok()) return status;
  const long at_stop = other.counter.load();
#if !defined(_WIN32)
  sleep_ms(30);
#endif
  EXPECT_EQ(other.counter.load(), at_stop) << "a stopped thread ran";
  EXPECT_GE(stopped.count(), 1u);
  bool found = false;
  for (std::size_t i = 0; i < stopped.count(); ++i) {
    const auto t = stopped.at(i);
    EXPECT_GT(t.register_bytes, 0u);
    if (!holds(t, counting_thread::magic)) continue;
    found = true;
    const std::uintptr_t local = other.stack_local.load();
    EXPECT_LE(t.stack_pointer, local) << "the stack pointer lies below the thread's first frame";
    EXPECT_GT(t.stack_pointer + (std::size_t{1} << 20), local);
  }
#if defined(__x86_64__) || defined(__aarch64__)
  EXPECT_TRUE(found) << "no stopped thread holds the counting thread's register";
#endif
  const auto here = reinterpret_cast<std::uintptr_t>(&found);
  for (std::size_t i = 0; i < stopped.count(); ++i) {
    const std::uintptr_t sp = stopped.at(i).stack_pointer;
    EXPECT_FALSE(sp <= here && here - sp < (std::size_t{64} << 10)) << "the caller was stopped too";
  }
  stopped.resume();
  EXPECT_EQ(stopped.count(), 0u);
  const long at_resume = other.counter.load();
  while (other.counter.load() == at_resume) std::this_thread::yield();  // hangs if it never runs again
  return status;
}

TEST(os_process, stopped_threads_stand_still_with_their_registers_known_until_resumed) {
  const auto status = stop_and_check_standing_still();
  if (refused(status)) GTEST_SKIP() << "the system refuses: " << memkit::os::error_message(status.error());
  EXPECT_TRUE(status.ok()) << memkit::os::error_message(status.error());
}

#if defined(__linux__)
// Stopped in a system call, a thread goes on with it afterwards as if nothing happened: a sleep
// sleeps its whole time (a handler run in the thread would cut it short with EINTR, whatever
// SA_RESTART says) and a read waits for its data.
TEST(os_process, threads_stopped_in_a_system_call_go_on_with_it_without_eintr) {
  int pipe_ends[2];
  ASSERT_EQ(::pipe(pipe_ends), 0);
  std::atomic<int> sleep_result{1};
  std::atomic<long> read_result{1};
  std::atomic<int> read_errno{0};
  std::thread sleeper([&] {
    timespec t{0, 300 * 1000000};
    sleep_result = ::nanosleep(&t, nullptr);
  });
  std::thread reader([&] {
    char byte = 0;
    read_result = ::read(pipe_ends[0], &byte, 1);
    read_errno = errno;
  });
  sleep_ms(50);  // both in the kernel by now
  process::stopped_threads stopped;
  const auto status = stopped.stop();
  sleep_ms(20);
  stopped.resume();
  sleep_ms(20);
  ASSERT_EQ(::write(pipe_ends[1], "x", 1), 1);
  sleeper.join();
  reader.join();
  ::close(pipe_ends[0]);
  ::close(pipe_ends[1]);
  if (refused(status)) GTEST_SKIP() << "the system refuses: " << memkit::os::error_message(status.error());
  ASSERT_TRUE(status.ok()) << memkit::os::error_message(status.error());
  EXPECT_EQ(sleep_result.load(), 0) << "the sleep was cut short";
  EXPECT_EQ(read_result.load(), 1) << "errno " << read_errno.load();
}

// A main thread that ended (pthread_exit) while others run stays a zombie, which ptrace
// refuses: it is passed over, and the threads that run are stopped.
TEST(os_process, an_exited_main_thread_does_not_keep_the_others_from_being_stopped) {
  if (MEMKIT_HAS_TSAN) GTEST_SKIP() << "stop() fails with ENOSYS under ThreadSanitizer, which cannot follow its task";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pthread_t stopper;
    const auto body = [](void*) -> void* {
      sleep_ms(50);  // the main thread has exited by now
      int code = 0;
      {
        counting_thread other;
        process::stopped_threads stopped;
        const auto status = stopped.stop();
        if (!status.ok()) code = status.error() == EPERM ? 20 : 21;
        else if (stopped.count() != 1) code = 22;
      }
      ::_exit(code);
    };
    if (::pthread_create(&stopper, nullptr, body, nullptr) != 0) ::_exit(23);
    ::syscall(SYS_exit, 0);  // this thread only (pthread_exit would unwind through the test's frames)
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "20: EPERM (the zombie main thread); 21: another error; 22: not one "
                                       "thread stopped";
}

// Runs `body` in a child process that refuses ptrace (a seccomp filter makes it fail with EPERM,
// as container runtimes' filters can); the child's exit code, 77 where the system has no seccomp
// filters, 1 when a gtest check of `body` failed.
template <class Body>
int in_child_refusing_tracing(Body body) {
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    if (!memkit_refuse_tracing()) ::_exit(77);
    const int code = body();
    ::_exit(::testing::Test::HasFailure() ? 1 : code);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Where tracing is refused, a signal stops the threads instead, with the same guarantees: they
// stand still, their registers and stack pointers are known, and they run on when resumed.
TEST(os_process, threads_are_stopped_by_a_signal_where_tracing_is_refused) {
  if (MEMKIT_HAS_TSAN) GTEST_SKIP() << "stop() fails with ENOSYS under ThreadSanitizer";
  const int code = in_child_refusing_tracing([] {
    const auto status = stop_and_check_standing_still();
    return status.ok() ? 0 : status.error() == EPERM ? 2 : 3;
  });
  if (code == 77) GTEST_SKIP() << "no seccomp filters here";
  EXPECT_EQ(code, 0) << "1: a check failed; 2: EPERM (not stopped by the signal); 3: another error";
}

// The signal is one the program leaves alone: a signal the program handles keeps its handler and
// is not used (the program's handler never runs), and the one used is back at its default action
// afterwards. SIGURG is the first choice, SIGWINCH the next, then the real-time signals from the top.
TEST(os_process, the_stopping_signal_leaves_the_programs_own_signals_alone) {
  if (MEMKIT_HAS_TSAN) GTEST_SKIP() << "stop() fails with ENOSYS under ThreadSanitizer";
  const int code = in_child_refusing_tracing([] {
    static std::atomic<int> handled{0};
    struct sigaction own {};
    own.sa_handler = [](int) { handled.fetch_add(1); };
    for (const int taken : {SIGURG, SIGWINCH, static_cast<int>(SIGRTMAX)}) {
      if (::sigaction(taken, &own, nullptr) != 0) return 4;
      counting_thread other;
      process::stopped_threads stopped;
      const auto status = stopped.stop();
      if (!status.ok()) return status.error() == EPERM ? 2 : 3;
      stopped.resume();
    }
    struct sigaction now {};
    for (const int taken : {SIGURG, SIGWINCH, static_cast<int>(SIGRTMAX)}) {
      if (::sigaction(taken, nullptr, &now) != 0 || now.sa_handler != own.sa_handler) return 5;
    }
    for (int signal = SIGRTMAX - 1; signal > SIGRTMAX - 8; --signal) {
      if (::sigaction(signal, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) return 6;
    }
    return handled.load() == 0 ? 0 : 7;
  });
  if (code == 77) GTEST_SKIP() << "no seccomp filters here";
  EXPECT_EQ(code, 0) << "2: EPERM; 3: another error; 5: the program's handler replaced; 6: a signal left "
                        "changed; 7: the program's handler ran";
}

// A signal some thread blocks is not used: that thread would not stop, and would find the signal
// pending later (a program that takes SIGURG with sigwait or a signalfd would take it as its own).
TEST(os_process, the_stopping_signal_is_one_no_thread_blocks) {
  if (MEMKIT_HAS_TSAN) GTEST_SKIP() << "stop() fails with ENOSYS under ThreadSanitizer";
  const int code = in_child_refusing_tracing([] {
    std::atomic<bool> quit{false};
    std::atomic<int> blocking{0};  // 1 once SIGURG is blocked; 2 when found pending at the end
    std::thread waiter([&] {
      sigset_t urgent;
      sigemptyset(&urgent);
      sigaddset(&urgent, SIGURG);
      (void)::pthread_sigmask(SIG_BLOCK, &urgent, nullptr);
      blocking = 1;
      while (!quit.load()) std::this_thread::yield();
      sigset_t pending;
      sigemptyset(&pending);
      if (::sigpending(&pending) == 0 && sigismember(&pending, SIGURG)) blocking = 2;
    });
    while (blocking.load() == 0) std::this_thread::yield();
    int result = 0;
    {
      process::stopped_threads stopped;
      const auto status = stopped.stop();
      if (!status.ok()) result = status.error() == EPERM ? 2 : 3;
      else if (stopped.count() != 1) result = 4;
    }
    quit = true;
    waiter.join();
    return result != 0 ? result : blocking.load() == 2 ? 5 : 0;
  });
  if (code == 77) GTEST_SKIP() << "no seccomp filters here";
  EXPECT_EQ(code, 0) << "2: EPERM (not stopped); 3: another error; 4: not one thread stopped; 5: SIGURG sent to "
                        "the thread that blocks it";
}

// Where tracing is refused and a thread blocks every signal, stop() fails with ptrace's error
// (EPERM) and every thread runs on; the stop of the next report works again.
TEST(os_process, stop_fails_and_stops_nothing_where_tracing_is_refused_and_signals_are_blocked) {
  if (MEMKIT_HAS_TSAN) GTEST_SKIP() << "stop() fails with ENOSYS under ThreadSanitizer";
  const int code = in_child_refusing_tracing([] {
    std::atomic<bool> quit{false};
    std::atomic<long> counter{0};
    std::thread blocking([&] {
      sigset_t all;
      sigfillset(&all);
      (void)::pthread_sigmask(SIG_BLOCK, &all, nullptr);
      while (!quit.load()) counter.fetch_add(1);
    });
    while (counter.load() == 0) std::this_thread::yield();
    int result = 0;
    {
      process::stopped_threads stopped;
      const auto status = stopped.stop();
      if (status.ok()) result = 12;
      else if (status.error() != EPERM) result = 13;
      else if (stopped.count() != 0) result = 14;
      const long before = counter.load();
      while (result == 0 && counter.load() == before) std::this_thread::yield();
    }
    quit = true;
    blocking.join();
    if (result == 0 && !stop_and_check_standing_still().ok()) result = 15;
    return result;
  });
  if (code == 77) GTEST_SKIP() << "no seccomp filters here";
  EXPECT_EQ(code, 0) << "12: stopped anyway; 13: another error; 14: threads left counted; 15: the next stop "
                        "failed";
}
#endif

}  // namespace
