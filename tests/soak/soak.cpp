// memkit-soak: a long, content-checked, cross-thread stress of the general allocator, in the style
// of mimalloc's test-stress. Run it for as long as you like; it stops at the first corrupted byte.
//
//   memkit-soak SECONDS THREADS general   a private memkit::general_allocator (the C++ API)
//   memkit-soak SECONDS THREADS malloc    the process's malloc/realloc/free: run it with
//                                         LD_PRELOAD=libmemkit_malloc.so to soak the drop-in
//
// Every round starts THREADS threads and joins them, so heaps are abandoned and adopted all the
// time. Each thread allocates objects of 8 bytes to 8 MiB (skewed: most are small, one in a
// thousand is several MiB), frees and reallocates them, and swaps them with other threads through
// a shared array of slots; objects left in slots outlive the thread that made them and are freed
// by a thread of a later round. Every object carries a unique id and is filled with a pattern
// derived from that id, checked when it is handed over, before it is reallocated (the kept prefix,
// after the move) and before it is freed: a block handed out twice, overlapping blocks, a lost
// write-back or a cross-thread free that lands in the wrong place all show up as a mismatch.
//
// Prints the operations done and "PASS"; on a mismatch, prints what was found where and aborts.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "memkit/general_allocator.hpp"

namespace {

// What an object looks like in memory: the header, then pattern words up to its size.
struct object_header {
  std::uint64_t id;    // unique over the whole run
  std::uint64_t size;  // bytes requested (at least sizeof(object_header))
};

struct object {
  object_header* block;
  std::uint64_t id;
  std::size_t size;
};

constexpr std::size_t min_object_size = 8;  // objects below sizeof(object_header) keep the id only
static_assert(min_object_size >= sizeof(std::uint64_t), "every object holds its id");
constexpr std::size_t max_object_size = std::size_t{8} << 20;

std::uint64_t pattern_word(std::uint64_t id, std::size_t index) {
  std::uint64_t x = id * 0x9E3779B97F4A7C15ull + index * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// --- the allocator under test -----------------------------------------------------------------

enum class backend { general, malloc };
backend mode = backend::general;
memkit::general_allocator* general = nullptr;

void* allocate_bytes(std::size_t size) {
  return mode == backend::general ? general->allocate(size) : std::malloc(size);
}
void* reallocate_bytes(void* p, std::size_t size) {
  return mode == backend::general ? general->reallocate_unsized(p, size) : std::realloc(p, size);
}
void free_bytes(void* p) {
  if (mode == backend::general) {
    general->free(p);
  } else {
    std::free(p);
  }
}

// --- filling and checking ---------------------------------------------------------------------

[[noreturn]] void corrupted(const object& o, const char* when, std::size_t offset,
                            std::uint64_t expected, std::uint64_t found) {
  std::fprintf(stderr,
               "memkit-soak: FAIL: object %" PRIu64 " (%zu bytes at %p) corrupted %s: at byte %zu "
               "expected %016" PRIx64 ", found %016" PRIx64 "\n",
               o.id, o.size, static_cast<void*>(o.block), when, offset, expected, found);
  std::abort();
}

// Fills from byte `from` (a multiple of 8, or 0) to the end.
void fill(const object& o, std::size_t from) {
  auto* bytes = reinterpret_cast<unsigned char*>(o.block);
  if (o.size < sizeof(object_header)) {  // the id, then bytes derived from it
    std::memcpy(bytes, &o.id, sizeof o.id);
    for (std::size_t i = sizeof o.id; i < o.size; ++i) bytes[i] = static_cast<unsigned char>(o.id + i);
    return;
  }
  o.block->id = o.id;
  o.block->size = o.size;
  auto* words = reinterpret_cast<std::uint64_t*>(bytes);
  const std::size_t word_count = o.size / 8;
  for (std::size_t i = from / 8 < 2 ? 2 : from / 8; i < word_count; ++i) words[i] = pattern_word(o.id, i);
  for (std::size_t i = word_count * 8; i < o.size; ++i) bytes[i] = static_cast<unsigned char>(o.id + i);
}

// The byte at `offset` of an intact object: the id, the size (objects that hold a header),
// pattern words, then bytes derived from the id in a last partial word.
unsigned char expected_byte(const object& o, std::size_t offset) {
  std::uint64_t word = 0;
  if (offset < 8) {
    word = o.id;
  } else if (offset < sizeof(object_header) && o.size >= sizeof(object_header)) {
    word = o.size;
  } else if (o.size >= sizeof(object_header) && offset < o.size / 8 * 8) {
    word = pattern_word(o.id, offset / 8);
  } else {
    return static_cast<unsigned char>(o.id + offset);
  }
  return static_cast<unsigned char>(word >> (offset % 8 * 8));
}

// Checks the first `bytes` bytes of `o` (all of them unless a realloc kept only a prefix).
void check(const object& o, const char* when, std::size_t bytes) {
  const auto* raw = reinterpret_cast<const unsigned char*>(o.block);
  const auto* words = reinterpret_cast<const std::uint64_t*>(raw);
  std::size_t offset = 0;
  if (o.size >= sizeof(object_header) && bytes >= sizeof(object_header)) {  // whole words first
    if (words[0] != o.id) corrupted(o, when, 0, o.id, words[0]);
    if (words[1] != o.size) corrupted(o, when, 8, o.size, words[1]);
    const std::size_t word_count = (bytes < o.size ? bytes : o.size) / 8;
    for (std::size_t i = 2; i < word_count; ++i) {
      if (words[i] != pattern_word(o.id, i)) corrupted(o, when, i * 8, pattern_word(o.id, i), words[i]);
    }
    offset = word_count * 8;
  }
  for (; offset < bytes; ++offset) {
    if (raw[offset] != expected_byte(o, offset)) corrupted(o, when, offset, expected_byte(o, offset), raw[offset]);
  }
}

// --- the workload -----------------------------------------------------------------------------

// xorshift*: fast and good enough; one per thread.
struct random_source {
  std::uint64_t state;
  std::uint64_t next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
};

// Skewed sizes: 90% 8-256 B, 9% up to 64 KiB, 0.9% up to 1 MiB, 0.1% 1-8 MiB (beyond the size
// classes, so own mappings too); log-uniform within each band, so small sizes dominate each band.
std::size_t random_size(random_source& rng) {
  const std::size_t band = rng.below(1000);
  std::size_t low = 8, high = 256;
  if (band >= 999) {
    low = std::size_t{1} << 20;
    high = max_object_size;
  } else if (band >= 990) {
    low = std::size_t{64} << 10;
    high = std::size_t{1} << 20;
  } else if (band >= 900) {
    low = 256;
    high = std::size_t{64} << 10;
  }
  // log-uniform in [low, high]: a power of two between, then uniform up to the next one.
  unsigned low_bits = 63 - static_cast<unsigned>(__builtin_clzll(low));
  unsigned high_bits = 63 - static_cast<unsigned>(__builtin_clzll(high));
  const unsigned bits = low_bits + static_cast<unsigned>(rng.below(high_bits - low_bits + 1));
  std::size_t size = (std::size_t{1} << bits) + rng.below(std::size_t{1} << bits);
  if (size < low) size = low;
  if (size > high) size = high;
  return size;
}

struct shared_state {
  std::vector<std::atomic<object_header*>> slots;  // objects in transit between threads
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::uint64_t> operations{0};
  std::atomic<std::uint64_t> handovers{0};
  std::atomic<std::uint64_t> bytes_allocated{0};
  std::atomic<bool> stop{false};
  explicit shared_state(std::size_t slot_count) : slots(slot_count) {}
};

// An object in a slot is known by its header alone; objects below the header size never travel.
object from_slot(object_header* block) { return object{block, block->id, block->size}; }

class worker {
 public:
  worker(shared_state& shared, std::uint64_t seed) : shared_(shared), rng_{seed | 1} {}

  void run(std::size_t operations) {
    live_.reserve(live_limit + 1);
    std::size_t done = 0;
    for (; done < operations; ++done) {
      if ((done & 1023) == 0 && shared_.stop.load(std::memory_order_relaxed)) break;
      const std::size_t action = rng_.below(100);
      if (live_.empty() || action < 45) {
        if (live_.size() >= live_limit) release(rng_.below(live_.size()));
        make();
      } else if (action < 80) {
        release(rng_.below(live_.size()));
      } else if (action < 85) {
        resize(rng_.below(live_.size()));
      } else {
        swap_with_slot(rng_.below(live_.size()));
      }
    }
    // Leave some objects in slots for later rounds' threads (they outlive this thread), free the
    // rest here.
    while (!live_.empty()) {
      if (rng_.below(4) == 0) {
        swap_with_slot(live_.size() - 1);
      } else {
        release(live_.size() - 1);
      }
      ++done;
    }
    shared_.operations.fetch_add(done, std::memory_order_relaxed);
    shared_.handovers.fetch_add(handovers_, std::memory_order_relaxed);
    shared_.bytes_allocated.fetch_add(bytes_, std::memory_order_relaxed);
  }

 private:
  static constexpr std::size_t live_limit = 512;

  void make() {
    object o{nullptr, shared_.next_id.fetch_add(1, std::memory_order_relaxed), random_size(rng_)};
    o.block = static_cast<object_header*>(allocate_bytes(o.size));
    if (o.block == nullptr) out_of_memory(o.size);
    fill(o, 0);
    bytes_ += o.size;
    live_.push_back(o);
  }

  void release(std::size_t index) {
    check(live_[index], "before free", live_[index].size);
    free_bytes(live_[index].block);
    live_[index] = live_.back();
    live_.pop_back();
  }

  void resize(std::size_t index) {
    object& o = live_[index];
    check(o, "before realloc", o.size);
    const std::size_t new_size = rng_.below(2) == 0 ? random_size(rng_) : o.size + o.size / 2 + 8;
    auto* moved = static_cast<object_header*>(reallocate_bytes(o.block, new_size));
    if (moved == nullptr) out_of_memory(new_size);
    const std::size_t kept = o.size < new_size ? o.size : new_size;
    o.block = moved;
    check(o, "after realloc (the kept bytes)", kept);
    o.size = new_size;
    fill(o, kept < sizeof(object_header) ? 0 : kept & ~std::size_t{7});
    bytes_ += new_size;
  }

  // Puts the object into a random slot and takes what was there (checked) in its place.
  void swap_with_slot(std::size_t index) {
    object mine = live_[index];
    if (mine.size < sizeof(object_header)) {
      release(index);  // too small to carry its own header; freed instead
      return;
    }
    check(mine, "before hand-over", mine.size);
    auto& slot = shared_.slots[rng_.below(shared_.slots.size())];
    object_header* theirs = slot.exchange(mine.block, std::memory_order_acq_rel);
    ++handovers_;
    if (theirs == nullptr) {
      live_[index] = live_.back();
      live_.pop_back();
      return;
    }
    live_[index] = from_slot(theirs);
    check(live_[index], "when taken over from another thread", live_[index].size);
  }

  [[noreturn]] void out_of_memory(std::size_t size) {
    std::fprintf(stderr, "memkit-soak: FAIL: allocation of %zu bytes returned null (%s)\n", size,
                 std::strerror(errno));
    std::abort();
  }

  shared_state& shared_;
  random_source rng_;
  std::vector<object> live_;
  std::uint64_t handovers_ = 0;
  std::uint64_t bytes_ = 0;
};

// Which file the process's malloc comes from (the drop-in when LD_PRELOAD took effect).
const char* malloc_provider() {
  Dl_info info{};
  void* symbol = dlsym(RTLD_DEFAULT, "malloc");
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

int usage() {
  std::fprintf(stderr, "usage: memkit-soak SECONDS THREADS general|malloc\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe before an abort
  if (argc != 4) return usage();
  const double seconds = std::atof(argv[1]);
  const int threads = std::atoi(argv[2]);
  if (!(seconds > 0) || threads < 1 || threads > 1024) return usage();
  if (std::strcmp(argv[3], "general") == 0) {
    mode = backend::general;
  } else if (std::strcmp(argv[3], "malloc") == 0) {
    mode = backend::malloc;
  } else {
    return usage();
  }
  static memkit::general_allocator private_allocator;
  general = &private_allocator;
  std::printf("memkit-soak: %g s, %d threads per round, allocator: %s\n", seconds, threads,
              mode == backend::general ? "memkit::general_allocator (C++ API)" : malloc_provider());
  std::fflush(stdout);

  shared_state shared(std::size_t{256} * static_cast<std::size_t>(threads));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  // A watchdog stops the round in progress at the deadline, so a slow build (TSan) overruns by
  // at most one thread's last 1,024 operations.
  std::thread watchdog([&] {
    while (std::chrono::steady_clock::now() < deadline && !shared.stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    shared.stop.store(true);
  });
  std::uint64_t rounds = 0;
  std::uint64_t threads_started = 0;
  while (!shared.stop.load()) {
    std::vector<std::thread> round;
    for (int t = 0; t < threads; ++t) {
      round.emplace_back([&shared, rounds, t] {
        worker w(shared, (rounds + 1) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(t) * 7919);
        w.run(20000);
      });
    }
    for (auto& thread : round) thread.join();
    ++rounds;
    threads_started += static_cast<std::uint64_t>(threads);
  }
  watchdog.join();
  // What is still in transit is checked and freed by the main thread.
  std::uint64_t left = 0;
  for (auto& slot : shared.slots) {
    if (object_header* block = slot.exchange(nullptr)) {
      const object o = from_slot(block);
      check(o, "at the end", o.size);
      free_bytes(block);
      ++left;
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::uint64_t operations = shared.operations.load() + left;
  std::printf("memkit-soak: %.1f s, %" PRIu64 " rounds, %" PRIu64 " threads, %" PRIu64
              " operations (%.0f per second), %" PRIu64 " hand-overs, %.1f GiB allocated, %" PRIu64
              " objects left in slots checked\n",
              elapsed, rounds, threads_started, operations, static_cast<double>(operations) / elapsed,
              shared.handovers.load(), static_cast<double>(shared.bytes_allocated.load()) / (1u << 30),
              left);
  std::printf("memkit-soak: PASS\n");
  std::fflush(stdout);
  return 0;
}
