// Content-checked stress: threads allocate blocks of random sizes, write a pattern derived from
// the block's address and size, and hand them to other threads through bounded mailboxes; the
// receivers check the pattern and free. Any lost, duplicated, overlapping or corrupted block shows
// up as a pattern mismatch. Bounded to a few seconds; meant to run under ThreadSanitizer too.
// MEMKIT_STRESS_SECONDS=<n> makes it run longer (release soak).
#include "memkit/general_allocator.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

using memkit::general_allocator;

struct message {
  unsigned char* block;
  std::size_t size;
  std::size_t seed;  // the pattern's seed (kept across reallocation, which may move the block)
};

// A small bounded queue per receiving thread (std::mutex keeps the test simple and TSan-visible).
class mailbox {
 public:
  bool push(message m) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (items_.size() >= 256) return false;
    items_.push_back(m);
    return true;
  }
  bool pop(message& m) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (items_.empty()) return false;
    m = items_.back();
    items_.pop_back();
    return true;
  }

 private:
  std::mutex mutex_;
  std::vector<message> items_;
};

unsigned char pattern_byte(std::size_t seed, std::size_t i) {
  return static_cast<unsigned char>(seed * 31 + i * 13 + (i >> 8));
}

// Large blocks: the first and last KiB and every 4 KiB in between, to keep the test fast.
std::size_t next_index(std::size_t i, std::size_t size) { return (i < 1024 || i + 1024 >= size) ? i + 1 : i + 4096; }

void write_pattern(const message& m) {
  for (std::size_t i = 0; i < m.size; i = next_index(i, m.size)) m.block[i] = pattern_byte(m.seed, i);
}

bool check_pattern(const message& m) {
  for (std::size_t i = 0; i < m.size; i = next_index(i, m.size)) {
    if (m.block[i] != pattern_byte(m.seed, i)) return false;
  }
  return true;
}

std::size_t random_size(std::mt19937_64& rng) {
  const unsigned r = static_cast<unsigned>(rng() % 1000);
  if (r < 700) return 1 + rng() % 256;          // mostly small
  if (r < 950) return 257 + rng() % 16000;      // medium
  if (r < 998) return 16000 + rng() % 500000;   // large pages
  return 600000 + rng() % (4u << 20);           // slice spans, and own mappings above 3.5 MiB
}

double seconds_to_run() {
  if (const char* env = std::getenv("MEMKIT_STRESS_SECONDS")) return std::atof(env);
  return 2.0;
}

// Returns how many allocate() calls succeeded.
std::uint64_t run_stress(general_allocator& a, unsigned threads) {
  std::vector<mailbox> boxes(threads);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> allocated{0};
  std::atomic<std::uint64_t> corrupted{0};
  std::atomic<std::uint64_t> handed_over{0};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(t * 7919 + 1);
      std::vector<message> own;
      std::uint64_t local_handed = 0;
      auto receive = [&] {
        message m;
        while (boxes[t].pop(m)) {
          if (!check_pattern(m)) corrupted.fetch_add(1);
          if (a.usable_size(m.block) < m.size) corrupted.fetch_add(1);
          a.free(m.block);
        }
      };
      while (!stop.load(std::memory_order_relaxed)) {
        const std::size_t size = random_size(rng);
        auto* block = static_cast<unsigned char*>(a.allocate(size, rng() % 16 == 0 ? 64 : 16));
        if (block == nullptr) {
          corrupted.fetch_add(1);
          continue;
        }
        allocated.fetch_add(1, std::memory_order_relaxed);
        const message made{block, size, static_cast<std::size_t>(rng())};
        write_pattern(made);
        const unsigned action = static_cast<unsigned>(rng() % 4);
        if (action == 0) {
          own.push_back(made);  // kept locally for a while
        } else {
          const unsigned to = static_cast<unsigned>(rng() % threads);
          if (boxes[to].push(made)) {
            ++local_handed;
          } else {
            own.push_back(made);
          }
        }
        if (own.size() > 64) {
          const std::size_t i = rng() % own.size();
          if (!check_pattern(own[i])) corrupted.fetch_add(1);
          void* moved = a.reallocate_unsized(own[i].block, own[i].size + 100);
          if (moved == nullptr) {
            corrupted.fetch_add(1);
          } else {
            own[i].block = static_cast<unsigned char*>(moved);
            if (!check_pattern(own[i])) corrupted.fetch_add(1);
            own[i].size += 100;
            write_pattern(own[i]);
          }
          a.free(own.back().block);
          own.pop_back();
        }
        receive();
      }
      receive();
      for (auto& m : own) {
        if (!check_pattern(m)) corrupted.fetch_add(1);
        a.free(m.block);
      }
      handed_over.fetch_add(local_handed);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds_to_run()));
  stop.store(true);
  for (auto& w : workers) w.join();
  // Blocks still in mailboxes (pushed after their receiver's last look) are checked here.
  for (auto& box : boxes) {
    message m;
    while (box.pop(m)) {
      if (!check_pattern(m)) corrupted.fetch_add(1);
      a.free(m.block);
    }
  }
  EXPECT_EQ(corrupted.load(), 0u);
  EXPECT_GT(handed_over.load(), 0u);
  return allocated.load();
}

TEST(general_allocator_stress, cross_thread_hand_over_keeps_every_block_intact) {
  general_allocator a;
  const std::uint64_t allocated = run_stress(a, 8);
  auto s = a.statistics();
  // Every allocation is counted, whichever thread made it (reallocations that moved add more).
  // Every block was freed; frees by other threads are counted once their owners collect them, but
  // huge blocks are counted at once.
  EXPECT_GE(s.allocations, allocated);
  EXPECT_EQ(s.huge_allocations, s.huge_frees);
  EXPECT_EQ(s.huge_live_bytes, 0u);
}

TEST(general_allocator_stress, threads_that_come_and_go_reuse_heaps) {
  general_allocator a;
  std::vector<void*> survivors(64, nullptr);
  std::mutex survivors_mutex;
  for (int round = 0; round < 20; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t, round] {
        std::vector<void*> mine;
        for (int i = 0; i < 2000; ++i) {
          auto* p = static_cast<unsigned char*>(a.allocate(16 + static_cast<std::size_t>(i % 300)));
          ASSERT_NE(p, nullptr);
          p[0] = static_cast<unsigned char>(i);
          mine.push_back(p);
        }
        // One block outlives the thread and is freed by a later thread.
        std::lock_guard<std::mutex> guard(survivors_mutex);
        const std::size_t slot = static_cast<std::size_t>(round * 4 + t) % survivors.size();
        if (survivors[slot] != nullptr) a.free(survivors[slot]);
        survivors[slot] = mine.back();
        mine.pop_back();
        for (void* p : mine) a.free(p);
      });
    }
    for (auto& th : threads) th.join();
  }
  for (void* p : survivors) a.free(p);
  EXPECT_LE(a.statistics().heaps, 5u);  // heaps of exited threads were adopted, not recreated
}

TEST(general_allocator_stress, global_instance_under_the_same_load) { run_stress(general_allocator::global(), 4); }

// Destroying a private allocator frees the heaps of the threads that used it while those threads
// (this one among them) still hold them in its thread-exit slot: deleting the slot must run no
// exit callback on them (Windows' FlsFree runs a slot's callback for every thread's value unless
// the os layer prevents it), and the threads must exit cleanly afterwards.
TEST(general_allocator_stress, destroying_an_allocator_runs_no_thread_exit_callback_on_its_freed_heaps) {
  std::atomic<int> stage{0};
  std::thread user;
  {
    general_allocator a;
    void* mine = a.allocate(64);
    ASSERT_NE(mine, nullptr);
    a.free(mine);
    user = std::thread([&] {
      void* theirs = a.allocate(64);
      if (theirs != nullptr) a.free(theirs);
      stage.store(theirs != nullptr ? 1 : -1);
      while (stage.load() != 2) std::this_thread::yield();  // alive while `a` is destroyed
    });
    while (stage.load() == 0) std::this_thread::yield();
    ASSERT_EQ(stage.load(), 1);
    EXPECT_EQ(a.statistics().heaps, 2u);
  }
  stage.store(2);
  user.join();  // its exit runs no callback for the deleted slot either
  general_allocator fresh;  // the process goes on allocating normally
  void* p = fresh.allocate(64);
  EXPECT_NE(p, nullptr);
  fresh.free(p);
}

}  // namespace

namespace {

// Threads allocating, filling, checking and freeing huge blocks of mixed sizes at once, so that
// new blocks take pages from blocks other threads just freed (os::move_pages) while those threads
// go on: every block must keep exactly what its owner wrote, and calloc must see zeros.
TEST(general_allocator_stress, large_blocks_recycled_across_threads_keep_their_contents) {
  general_allocator::options o;
  o.purge_delay_ms = 600000;  // keep freed blocks cached: the recycling path, whatever the speed
  general_allocator a(o);
  constexpr int threads = 4;
  constexpr int rounds = 60;
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 random(static_cast<std::uint64_t>(t) + 7);
      struct held {
        unsigned char* p = nullptr;
        std::size_t size = 0;
        unsigned char value = 0;
      } blocks[3];
      for (int r = 0; r < rounds; ++r) {
        held& b = blocks[random() % 3];
        if (b.p != nullptr) {
          for (std::size_t i = 0; i < b.size; i += 4096) {
            if (b.p[i] != b.value || b.p[b.size - 1] != b.value) {
              failures.fetch_add(1);
              break;
            }
          }
          a.free(b.p);
        }
        b.size = (std::size_t{600} << 10) + random() % (std::size_t{6} << 20);
        const bool zeroed = random() % 2 == 0;
        b.p = static_cast<unsigned char*>(zeroed ? a.allocate_zeroed(b.size) : a.allocate(b.size));
        if (b.p == nullptr) {
          failures.fetch_add(1);
          continue;
        }
        if (zeroed) {
          for (std::size_t i = 0; i < b.size; i += 512) {
            if (b.p[i] != 0) {
              failures.fetch_add(1);
              break;
            }
          }
        }
        b.value = static_cast<unsigned char>(r * 16 + t + 1);
        std::memset(b.p, b.value, b.size);
      }
      for (auto& b : blocks)
        if (b.p != nullptr) a.free(b.p);
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  const auto s = a.statistics();
  EXPECT_EQ(s.huge_live_bytes, 0u);
  EXPECT_EQ(s.huge_allocations, s.huge_frees);
}

}  // namespace
