// The drop-in malloc across fork(): this executable links the static form, so every allocation in
// it goes through memkit. Other threads allocate and free without pause while the main thread
// forks; each child must be able to allocate (small, large, from a new thread) and exit 0, which
// fails (deadlock or crash) if a lock held by a thread that does not exist in the child survived
// the fork.
#include <gtest/gtest.h>

#if !defined(MEMKIT_MALLOC_TESTS)

TEST(malloc_fork, not_built_in_sanitizer_builds) {
  GTEST_SKIP() << "the drop-in malloc is not built when a sanitizer owns malloc";
}

#else

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "memkit/general_allocator.hpp"

namespace {

// What a child does: allocate and check all kinds of blocks, including from a new thread, then
// exit with 0 on success. Runs after fork(), so it exits with _exit and reports by status only.
[[noreturn]] void child_work() {
  int status = 0;
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < 2000; ++i) {
    const std::size_t size = 1 + (i * 131) % 4000;
    auto* p = static_cast<unsigned char*>(std::malloc(size));
    if (p == nullptr) _exit(10);
    std::memset(p, 0x5C, size);
    blocks.push_back(p);
  }
  void* big = std::malloc(std::size_t{8} << 20);
  if (big == nullptr) _exit(11);
  std::memset(big, 1, std::size_t{8} << 20);
  std::free(big);
  std::thread helper([&status] {
    for (int i = 0; i < 1000; ++i) {
      auto* p = new (std::nothrow) char[64 + i];
      if (p == nullptr) {
        status = 12;
        return;
      }
      delete[] p;
    }
  });
  helper.join();
  for (void* p : blocks) {
    if (static_cast<unsigned char*>(p)[0] != 0x5C) _exit(13);
    std::free(p);
  }
  void* probe = std::malloc(16);
  if (!memkit::general_allocator::global().owns(probe)) _exit(14);
  _exit(status);
}

// Waits for `pid` for at most `seconds`; kills it on timeout. Returns the wait status, or -1 on
// timeout.
int wait_with_deadline(pid_t pid, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    int status = 0;
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(malloc_fork, children_allocate_while_other_threads_hammer_the_allocator) {
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> operations{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&stop, &operations, t] {
      std::vector<void*> held(64, nullptr);
      std::size_t i = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        void*& slot = held[i % held.size()];
        std::free(slot);
        // Mostly small, now and then large, so both the thread caches and the shared large-block
        // and page machinery are busy (and locked) at the moment of a fork.
        const std::size_t size = (i % 97 == 0) ? (std::size_t{1} << 20) + i % 4096 : 8 + (i * 7 + t) % 2000;
        slot = std::malloc(size);
        if (slot != nullptr) static_cast<unsigned char*>(slot)[0] = 1;
        ++i;
        operations.fetch_add(1, std::memory_order_relaxed);
      }
      for (void* p : held) std::free(p);
    });
  }
  while (operations.load() < 1000) std::this_thread::yield();

  constexpr int forks = 100;
  int failures = 0;
  for (int i = 0; i < forks; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) child_work();
    const int status = wait_with_deadline(pid, 20);
    if (status == -1) {
      ADD_FAILURE() << "child " << i << " hung (a lock survived the fork)";
      ++failures;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "child " << i << " failed: "
                    << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                            : "exit " + std::to_string(WEXITSTATUS(status)));
      ++failures;
    }
    if (failures > 3) break;
  }
  stop = true;
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures, 0);
}

TEST(malloc_fork, the_parent_keeps_working_after_forks) {
  // Memory allocated before a fork stays valid and freeable in both processes.
  auto* before = static_cast<char*>(std::malloc(100));
  ASSERT_NE(before, nullptr);
  std::strcpy(before, "from before the fork");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const bool intact = std::strcmp(before, "from before the fork") == 0;
    std::free(before);
    void* fresh = std::malloc(100);
    _exit(intact && fresh != nullptr ? 0 : 1);
  }
  const int status = wait_with_deadline(pid, 20);
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_STREQ(before, "from before the fork");
  std::free(before);
  void* after = std::malloc(100);
  EXPECT_NE(after, nullptr);
  std::free(after);
}

}  // namespace

#endif  // MEMKIT_MALLOC_TESTS
