// Runs one scenario at the edge of memory for tests/malloc_limits_test.cpp: the process lowers its
// own RLIMIT_AS to what it uses now plus a small budget, then allocates beyond it.
//
//   memkit_malloc_limits CASE malloc    through malloc & co. and operator new: run it with
//                                       LD_PRELOAD=libmemkit_malloc.so (checked: it fails if
//                                       malloc does not come from the drop-in)
//   memkit_malloc_limits CASE general   through a private memkit::general_allocator
//
// CASE is one of refusals, realloc, new (malloc only), exhaust, threads, churn. Exits 0 when the
// allocator behaved; otherwise prints "FAIL: what" and exits 1 (a crash or abort is a failure
// too, seen by the test as a signal).
#include <dlfcn.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <new>
#include <string>
#include <vector>

#include "memkit/general_allocator.hpp"

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// Address space the process may add once the limit is set. Room for a few 4 MiB segments and
// multi-MiB blocks, small enough that the scenarios reach it quickly.
constexpr std::size_t budget = 64 * MiB;
// A request no allocator can serve under the limit.
constexpr std::size_t beyond = 4 * budget;

int failures = 0;

#define EXPECT(condition, ...)                                         \
  do {                                                                 \
    if (!(condition)) {                                                \
      std::fprintf(stderr, "FAIL: %s (line %d): ", #condition, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fprintf(stderr, "\n");                                      \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

// Keeps the compiler from folding a size into a call it knows cannot succeed. One sink per
// thread: with one shared by the threads scenario, a thread could read back another thread's size,
// get a block of that size and fill its own size into it (past the block's end).
std::size_t opaque(std::size_t n) {
  static thread_local volatile std::size_t sink;
  sink = n;
  return sink;
}

// --- the allocator under test -----------------------------------------------------------------

bool use_malloc = true;
memkit::general_allocator* general = nullptr;

void* allocate(std::size_t size) { return use_malloc ? std::malloc(opaque(size)) : general->allocate(opaque(size)); }
void* allocate_zeroed(std::size_t size) {
  return use_malloc ? std::calloc(1, opaque(size)) : general->allocate_zeroed(opaque(size));
}
void* allocate_aligned(std::size_t size, std::size_t alignment) {
  return use_malloc ? std::aligned_alloc(alignment, opaque(size)) : general->allocate(opaque(size), alignment);
}
void* reallocate(void* p, std::size_t size) {
  return use_malloc ? std::realloc(p, opaque(size)) : general->reallocate_unsized(p, opaque(size));
}
void release(void* p) {
  if (use_malloc) {
    std::free(p);
  } else {
    general->free(p);
  }
}

// --- the limit ----------------------------------------------------------------------------------

std::size_t status_kib(const char* key) {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return 0;
  unsigned long long kib = 0;
  char line[256];
  const std::size_t key_length = std::strlen(key);
  while (std::fgets(line, sizeof line, status) != nullptr) {
    if (std::strncmp(line, key, key_length) == 0 && std::sscanf(line + key_length, " %llu kB", &kib) == 1) break;
  }
  std::fclose(status);
  return static_cast<std::size_t>(kib);
}

rlimit original_limit{};

void limit_address_space() {
  rlimit limit{};
  const std::size_t size_kib = status_kib("VmSize:");
  if (size_kib == 0 || getrlimit(RLIMIT_AS, &limit) != 0) {
    std::fprintf(stderr, "FAIL: cannot read VmSize or RLIMIT_AS\n");
    std::exit(3);
  }
  original_limit = limit;
  limit.rlim_cur = static_cast<rlim_t>(size_kib * KiB + budget);
  if (setrlimit(RLIMIT_AS, &limit) != 0) {
    std::fprintf(stderr, "FAIL: setrlimit: %s\n", std::strerror(errno));
    std::exit(3);
  }
}

// Mappings of the process now (lines of /proc/self/maps).
std::size_t mapping_count() {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return 0;
  std::size_t lines = 0;
  for (int c; (c = std::fgetc(maps)) != EOF;) lines += c == '\n';
  std::fclose(maps);
  return lines;
}

// --- content-checked blocks ---------------------------------------------------------------------

struct block {
  unsigned char* data = nullptr;
  std::size_t size = 0;
  std::uint64_t seed = 0;
};

unsigned char pattern(std::uint64_t seed, std::size_t i) {
  return static_cast<unsigned char>((seed * 0x9E3779B97F4A7C15ull + i * 131 + (i >> 12)) >> 24);
}

// Bytes between checked bytes in the middle of big blocks: 512 touches every page, so a block
// that shares memory with another is caught; the churn, which is about mappings, not contents,
// touches one byte per 64 KiB to keep its thousands of multi-MiB blocks cheap.
std::size_t middle_step = 512;

// Every byte of small blocks; the first and last 4 KiB and one byte per middle_step of big ones.
std::size_t step(std::size_t i, std::size_t size) {
  return i < 4 * KiB || i + 4 * KiB >= size ? 1 : middle_step;
}

void fill(const block& b) {
  for (std::size_t i = 0; i < b.size; i += step(i, b.size)) b.data[i] = pattern(b.seed, i);
}

bool intact(const block& b, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; i += step(i, b.size)) {
    if (b.data[i] != pattern(b.seed, i)) {
      std::fprintf(stderr, "FAIL: block of %zu bytes at %p: byte %zu changed\n", b.size,
                   static_cast<void*>(b.data), i);
      ++failures;
      return false;
    }
  }
  return true;
}

block make(std::size_t size, std::uint64_t seed) {
  block b{static_cast<unsigned char*>(allocate(size)), size, seed};
  if (b.data != nullptr) fill(b);
  return b;
}

// A refused request must leave ENOMEM in errno.
void expect_refused(void* p, const char* what, std::size_t size) {
  const int error = errno;
  EXPECT(p == nullptr, "%s(%zu) succeeded beyond the limit", what, size);
  EXPECT(error == ENOMEM, "%s(%zu): errno %d (%s), expected ENOMEM", what, size, error, std::strerror(error));
  if (p != nullptr) release(p);
}

// A small allocation right after a refusal works.
void expect_small_works(const char* after) {
  block b = make(64, 7);
  EXPECT(b.data != nullptr, "malloc(64) failed right after a refused %s", after);
  if (b.data != nullptr) {
    intact(b, b.size);
    release(b.data);
  }
}

// --- scenarios ----------------------------------------------------------------------------------

void refusals() {
  struct request {
    const char* name;
    std::size_t alignment;  // 0: allocate(), 1: allocate_zeroed()
  };
  // Alignments: malloc's, a page, 1 MiB (beyond the size classes' 64 KiB) and 8 MiB (beyond a
  // segment: its own aligned reservation).
  const request requests[] = {{"malloc", 0},           {"calloc", 1},
                              {"aligned_alloc/4K", 4 * KiB}, {"aligned_alloc/1M", MiB},
                              {"aligned_alloc/8M", 8 * MiB}};
  // Sizes: four times the budget, the budget itself (with its header it cannot fit in what is
  // left of the budget) and 1 TiB.
  for (const request& r : requests) {
    for (std::size_t size : {beyond, budget, std::size_t{1} << 40}) {
      errno = 0;
      void* p = r.alignment == 0   ? allocate(size)
                : r.alignment == 1 ? allocate_zeroed(size)
                                   : allocate_aligned(size, r.alignment);
      expect_refused(p, r.name, size);
      expect_small_works(r.name);
    }
  }
  if (use_malloc) {
    void* sentinel = &failures;
    void* out = sentinel;
    const int result = posix_memalign(&out, 64, opaque(beyond));
    EXPECT(result == ENOMEM, "posix_memalign returned %d, expected ENOMEM", result);
    EXPECT(out == sentinel, "posix_memalign wrote its output on failure");
    expect_small_works("posix_memalign");
    for (auto* function : {+[](std::size_t n) { return memalign(64, n); }, +[](std::size_t n) { return valloc(n); },
                           +[](std::size_t n) { return pvalloc(n); }}) {
      errno = 0;
      expect_refused(function(opaque(beyond)), "memalign/valloc/pvalloc", beyond);
    }
    errno = 0;
    expect_refused(std::calloc(opaque(beyond / 16), 16), "calloc(n, 16)", beyond);
  }
  // Most of the budget held, then more than what is left.
  block held = make(budget / 2, 1);
  EXPECT(held.data != nullptr, "half the budget (%zu bytes) could not be allocated", budget / 2);
  errno = 0;
  expect_refused(allocate(budget / 2 + 8 * MiB), "malloc", budget / 2 + 8 * MiB);
  expect_small_works("malloc with half the budget held");
  if (held.data != nullptr) {
    intact(held, held.size);
    release(held.data);
  }
}

void realloc_keeps_the_block() {
  // A small block, one of a large size class (slices), one with its own mapping.
  std::uint64_t seed = 11;
  for (std::size_t size : {std::size_t{100}, 16 * KiB, std::size_t{1} * MiB, 8 * MiB}) {
    block b = make(size, ++seed);
    EXPECT(b.data != nullptr, "allocating %zu bytes failed", size);
    if (b.data == nullptr) continue;
    for (std::size_t target : {beyond, budget + size, std::size_t{1} << 40}) {
      errno = 0;
      void* moved = reallocate(b.data, target);
      const int error = errno;
      EXPECT(moved == nullptr, "realloc(%zu -> %zu) succeeded beyond the limit", size, target);
      EXPECT(error == ENOMEM, "realloc(%zu -> %zu): errno %d, expected ENOMEM", size, target, error);
      if (moved != nullptr) {
        b.data = static_cast<unsigned char*>(moved);
        break;
      }
      EXPECT(intact(b, b.size), "realloc(%zu -> %zu) changed the old block", size, target);
    }
    if (use_malloc) {
      errno = 0;
      void* moved = reallocarray(b.data, opaque(beyond / 16), 16);
      EXPECT(moved == nullptr && errno == ENOMEM, "reallocarray beyond the limit: %p, errno %d", moved, errno);
      EXPECT(intact(b, b.size), "reallocarray changed the old block");
    }
    // The old block is still a live block: it grows and is freed normally.
    void* grown = reallocate(b.data, size * 2);
    EXPECT(grown != nullptr, "realloc(%zu -> %zu) failed after a refusal", size, size * 2);
    if (grown != nullptr) {
      b.data = static_cast<unsigned char*>(grown);
      intact(b, size);
    }
    release(b.data);
  }
}

int handler_calls = 0;

void new_throws() {
  const std::size_t size = opaque(beyond);
  auto throws = [](auto&& allocate_it, const char* what) {
    bool threw = false;
    try {
      allocate_it();
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    EXPECT(threw, "%s did not throw std::bad_alloc", what);
    expect_small_works(what);
  };
  throws([&] { ::operator delete(::operator new(size)); }, "operator new");
  throws([&] { ::operator delete[](::operator new[](size)); }, "operator new[]");
  throws([&] { ::operator delete(::operator new(size, std::align_val_t{64}), std::align_val_t{64}); },
         "operator new(align 64)");
  throws([&] { ::operator delete(::operator new(size, std::align_val_t{MiB}), std::align_val_t{MiB}); },
         "operator new(align 1 MiB)");
  throws([&] { std::vector<char> v; v.reserve(size); }, "std::vector::reserve");
  EXPECT(::operator new(size, std::nothrow) == nullptr, "nothrow new succeeded beyond the limit");
  EXPECT(::operator new[](size, std::align_val_t{64}, std::nothrow) == nullptr,
         "nothrow aligned new[] succeeded beyond the limit");
  // The new-handler runs on each refusal; once it removes itself, new throws.
  std::set_new_handler(+[] {
    ++handler_calls;
    if (handler_calls == 3) std::set_new_handler(nullptr);
  });
  throws([&] { ::operator delete(::operator new(size)); }, "operator new with a new-handler");
  EXPECT(handler_calls == 3, "the new-handler ran %d times, expected 3", handler_calls);
  // A small object still comes from the drop-in.
  auto* p = new std::string(100, 'x');
  EXPECT(p->size() == 100 && (*p)[99] == 'x', "a small new after the refusals is broken");
  delete p;
}

void exhaust() {
  // Fill the budget with blocks of mixed sizes until the allocator refuses, twice: what was
  // freed in between must serve again (freed memory held in caches must not starve the process).
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<block> held;
    held.reserve(4096);
    const std::size_t sizes[] = {MiB, 100 * KiB, 5 * MiB, 64, 3 * MiB, 12 * KiB, 9 * MiB};
    std::size_t total = 0;
    int refusals = 0;
    for (std::size_t i = 0; held.size() < 4000 && refusals < 20; ++i) {
      const std::size_t size = sizes[i % (sizeof sizes / sizeof sizes[0])];
      errno = 0;
      block b = make(size, i + 1000 * static_cast<std::size_t>(pass));
      if (b.data == nullptr) {
        EXPECT(errno == ENOMEM, "pass %d: a refusal of %zu bytes left errno %d", pass, size, errno);
        ++refusals;
        continue;
      }
      total += size;
      held.push_back(b);
    }
    std::printf("pass %d: %zu blocks, %zu MiB held, %d refusals\n", pass, held.size(), total / MiB, refusals);
    EXPECT(refusals > 0, "pass %d: the budget was never reached", pass);
    // The budget is within reach: at least half of it was handed out before the first refusal
    // (it also holds segments' headers and the block sizes' rounding).
    EXPECT(total >= budget / 2, "pass %d: only %zu bytes served under a %zu-byte budget", pass, total, budget);
    for (const block& b : held) {
      intact(b, b.size);
      release(b.data);
    }
    // Everything is free again: one block of half the budget must fit, whatever the allocator
    // keeps cached (a cache that holds address space must give it up rather than refuse).
    errno = 0;
    block half = make(budget / 2, 99);
    EXPECT(half.data != nullptr, "pass %d: %zu bytes refused (errno %d) with nothing allocated", pass,
           budget / 2, errno);
    if (half.data != nullptr) {
      intact(half, half.size);
      release(half.data);
    }
  }
  expect_small_works("exhaustion");
  // The same the other way round: big blocks freed (and cached by the allocator), then half the
  // budget in small blocks, which need new segments. (Three 6 MiB blocks reserve 8 MiB each.)
  block big[3];
  for (std::size_t k = 0; k < 3; ++k) big[k] = make(6 * MiB, k);
  for (const block& b : big) {
    EXPECT(b.data != nullptr, "a 6 MiB block was refused with almost nothing else allocated");
    if (b.data != nullptr) intact(b, b.size), release(b.data);
  }
  std::vector<block> smalls;
  smalls.reserve(budget / 2 / (8 * KiB));
  while (smalls.size() < smalls.capacity()) {
    errno = 0;
    block b = make(8 * KiB, smalls.size());
    if (b.data == nullptr) {
      EXPECT(b.data != nullptr, "%zu-th 8 KiB block refused (errno %d) after big blocks were freed",
             smalls.size(), errno);
      break;
    }
    smalls.push_back(b);
  }
  for (const block& b : smalls) intact(b, b.size), release(b.data);
}

// Threads that share blocks through slots and run into the limit again and again. Their own
// bookkeeping is set up before the limit (a fixed pool of block records, vectors with their final
// capacity), so that only the allocator under test meets it.
constexpr int thread_count = 4;
constexpr std::size_t slot_count = 64;
constexpr std::size_t kept_per_thread = 24;
constexpr std::size_t record_count = slot_count + thread_count * (kept_per_thread + 8);

struct shared_state {
  std::atomic<block*> slots[slot_count] = {};
  block records[record_count];
  std::atomic<std::uint64_t> natural_refusals{0};
  std::atomic<std::uint64_t> operations{0};
  pthread_barrier_t start;
};

struct thread_state {
  shared_state* shared;
  std::vector<block*> mine;   // records of live blocks this thread holds
  std::vector<block*> spare;  // records with no block
};

std::size_t thread_size(std::uint64_t r) {
  const std::uint64_t band = r % 10;
  if (band < 5) return 8 + (r >> 8) % 1024;                 // small
  if (band < 8) return KiB + (r >> 8) % (256 * KiB);        // size classes up to 256 KiB
  return MiB + (r >> 8) % (11 * MiB);                       // 1-12 MiB: spans and own mappings
}

void* thread_main(void* argument) {
  auto& self = *static_cast<thread_state*>(argument);
  auto& shared = *self.shared;
  auto& mine = self.mine;
  auto& spare = self.spare;
  // One allocation before the limit: in debug mode its stack capture makes the thread's first use
  // of the unwinder's thread-local data, which glibc allocates lazily for a dlopen()ed library
  // and, when that allocation fails, ends the process ("cannot allocate memory for thread-local
  // data"): a limit of glibc's, not of the allocator under test.
  release(allocate(16));
  pthread_barrier_wait(&shared.start);
  std::uint64_t state = reinterpret_cast<std::uintptr_t>(&self) | 1;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto drop = [&](std::size_t index) {
    block* b = mine[index];
    intact(*b, b->size);
    release(b->data);
    *b = block{};
    spare.push_back(b);
    mine[index] = mine.back();
    mine.pop_back();
  };
  for (int i = 0; i < 3000; ++i) {
    const std::uint64_t r = next();
    if (i % 64 == 0) {  // certain refusal
      errno = 0;
      expect_refused(allocate(beyond), "malloc", beyond);
    }
    if ((mine.size() < 16 || r % 3 != 0) && !spare.empty()) {
      const std::size_t size = thread_size(r);
      errno = 0;
      block b = make(size, r);
      if (b.data == nullptr) {
        EXPECT(errno == ENOMEM, "a refusal of %zu bytes left errno %d", size, errno);
        shared.natural_refusals.fetch_add(1, std::memory_order_relaxed);
        // Give some memory back, as a program under pressure would.
        for (std::size_t k = mine.size() / 2; k > 0; --k) drop(next() % mine.size());
        continue;
      }
      *spare.back() = b;
      mine.push_back(spare.back());
      spare.pop_back();
      if (mine.size() > kept_per_thread) drop(next() % mine.size());
    } else if (!mine.empty()) {
      // Hand one over and take what is in the slot (it came from another thread).
      const std::size_t index = next() % mine.size();
      block* given = mine[index];
      intact(*given, given->size);
      block* taken = shared.slots[r % slot_count].exchange(given, std::memory_order_acq_rel);
      if (taken != nullptr) {
        intact(*taken, taken->size);
        mine[index] = taken;
      } else {
        mine[index] = mine.back();
        mine.pop_back();
      }
    }
    shared.operations.fetch_add(1, std::memory_order_relaxed);
  }
  while (!mine.empty()) drop(mine.size() - 1);
  return nullptr;
}

void threads() {
  static shared_state shared;
  pthread_barrier_init(&shared.start, nullptr, thread_count + 1);
  thread_state states[thread_count];
  std::size_t record = 0;
  for (thread_state& t : states) {
    t.shared = &shared;
    t.mine.reserve(record_count);
    t.spare.reserve(record_count);
    for (std::size_t k = 0; k < record_count / thread_count; ++k) t.spare.push_back(&shared.records[record++]);
  }
  // The threads (and their stacks) exist before the limit is set, so the budget is all heap.
  pthread_t ids[thread_count];
  for (int t = 0; t < thread_count; ++t) {
    if (pthread_create(&ids[t], nullptr, thread_main, &states[t]) != 0) {
      std::fprintf(stderr, "FAIL: pthread_create\n");
      std::exit(3);
    }
  }
  limit_address_space();
  pthread_barrier_wait(&shared.start);
  for (pthread_t id : ids) pthread_join(id, nullptr);
  std::size_t left = 0;
  for (auto& slot : shared.slots) {
    if (block* b = slot.exchange(nullptr)) {
      intact(*b, b->size);
      release(b->data);
      ++left;
    }
  }
  pthread_barrier_destroy(&shared.start);
  std::printf("%" PRIu64 " operations, %" PRIu64 " refusals at the limit, %zu blocks left in slots\n",
              shared.operations.load(), shared.natural_refusals.load(), left);
  // Four threads keeping up to 24 blocks each, a fifth of them 1-12 MiB: about 100 MiB wanted
  // against a 64 MiB budget, so the threads run into it on their own, not only on the requests
  // beyond it.
  EXPECT(shared.natural_refusals.load() > 0, "the threads never reached the limit");
  expect_small_works("the threads' refusals");
}

// Alternating large and small blocks, with refusals and pauses in between, must not pile up
// mappings. The large sizes vary from 4 to 28 MiB, so a freed block often cannot serve the next
// one: fresh reservations, page moves from cached blocks into them, and (after the pauses, longer
// than the purge delay) cached blocks returned to the OS all happen many times.
//
// The bound, from the design (docs/general_allocator.md):
//  - a block above 3.5 MiB is one reservation; moving resident pages into it (os::move_pages)
//    splits it into at most 33 mappings (32 recorded splits, gpa::max_huge_splits);
//  - one such block is live at a time here, and freed ones are cached, at most 16 of them;
//  - small blocks live in 4 MiB segments, one mapping each; the churn keeps 64 small blocks live,
//    so even if every one of them pinned its own segment that is 64, plus one being filled.
// So the allocator may hold (1 + 16) * 33 + 64 + 1 = 626 mappings whatever the length of the
// churn; a leak of one mapping per six iterations passes that within the 4,000 iterations.
void churn() {
  constexpr std::size_t huge_mappings_per_block = 33;
  constexpr std::size_t live_large = 1;
  constexpr std::size_t cached_large = 16;
  constexpr std::size_t live_small = 64;
  constexpr std::size_t bound = (live_large + cached_large) * huge_mappings_per_block + live_small + 1;
  constexpr int iterations = 4000;
  middle_step = 64 * KiB;
  const std::size_t baseline = mapping_count();
  std::size_t peak = baseline;
  block small[live_small] = {};
  int refusals = 0;
  for (int i = 0; i < iterations; ++i) {
    // A huge block: at most 28 MiB, a reservation of at most 32 MiB, so with a segment or two of
    // small blocks and the slack of an aligned reservation it fits the budget with room to spare:
    // none may be refused, however long the churn (what was freed must not hold the space).
    const std::size_t size = 4 * MiB + static_cast<std::size_t>(i) * 7919 * 7919 % (24 * MiB);
    errno = 0;
    block large = make(size, static_cast<std::uint64_t>(i));
    EXPECT(large.data != nullptr, "iteration %d: a %zu-byte block refused (errno %d)", i, size, errno);
    if (i % 8 == 0) {
      errno = 0;
      expect_refused(allocate(beyond), "malloc", beyond);
      ++refusals;
    }
    // A small one, replacing the oldest small block.
    block& little = small[i % live_small];
    if (little.data != nullptr) {
      intact(little, little.size);
      release(little.data);
    }
    little = make(16 + static_cast<std::size_t>(i) % 2000, static_cast<std::uint64_t>(i) + 1);
    EXPECT(little.data != nullptr, "a small block failed in iteration %d", i);
    if (large.data != nullptr) {
      intact(large, large.size);
      release(large.data);
    }
    if (i % 400 == 399) {
      // Longer than ten purge delays (10 ms each): cached blocks and pages go back to the OS.
      struct timespec pause = {0, 120 * 1000 * 1000};
      nanosleep(&pause, nullptr);
    }
    if (i % 50 == 0) {
      const std::size_t now = mapping_count();
      if (now > peak) peak = now;
      if (now > baseline + bound) {
        EXPECT(now <= baseline + bound, "iteration %d: %zu mappings, baseline %zu + bound %zu", i, now,
               baseline, bound);
        break;
      }
    }
  }
  for (block& b : small) {
    if (b.data != nullptr) intact(b, b.size), release(b.data);
  }
  const std::size_t end = mapping_count();
  std::printf("mappings: %zu before, peak %zu, %zu after %d iterations (%d refused on purpose); bound %zu above the start\n",
              baseline, peak, end, iterations, refusals, bound);
  EXPECT(end <= baseline + bound, "%zu mappings at the end, baseline %zu + bound %zu", end, baseline, bound);
}

bool malloc_is_memkit() {
  Dl_info info{};
  void* symbol = dlsym(RTLD_DEFAULT, "malloc");
  return symbol != nullptr && dladdr(symbol, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "memkit_malloc") != nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 3 || (std::strcmp(argv[2], "malloc") != 0 && std::strcmp(argv[2], "general") != 0)) {
    std::fprintf(stderr, "usage: memkit_malloc_limits refusals|realloc|new|exhaust|threads|churn malloc|general\n");
    return 2;
  }
  const std::string what = argv[1];
  use_malloc = std::strcmp(argv[2], "malloc") == 0;
  if (use_malloc && !malloc_is_memkit()) {
    std::fprintf(stderr, "FAIL: malloc does not come from libmemkit_malloc.so (run with LD_PRELOAD)\n");
    return 3;
  }
  // The drop-in reads MEMKIT_PURGE_DELAY_MS; the private instance takes it from the same variable,
  // so that a test can run a scenario with a delay no run reaches (cached memory then goes back
  // only when the allocator gives it up at the limit, never because a timer ran out).
  static memkit::general_allocator private_allocator = [] {
    memkit::general_allocator::options o;
    if (const char* delay = std::getenv("MEMKIT_PURGE_DELAY_MS")) {
      o.purge_delay_ms = static_cast<std::uint32_t>(std::strtoul(delay, nullptr, 10));
    }
    return memkit::general_allocator(o);
  }();
  general = &private_allocator;
  if (what != "threads") limit_address_space();  // threads set it once they are started
  if (what == "refusals") {
    refusals();
  } else if (what == "realloc") {
    realloc_keeps_the_block();
  } else if (what == "new" && use_malloc) {
    new_throws();
  } else if (what == "exhaust") {
    exhaust();
  } else if (what == "threads") {
    threads();
  } else if (what == "churn") {
    churn();
  } else {
    std::fprintf(stderr, "unknown case %s\n", what.c_str());
    return 2;
  }
  // Reports at exit (debug mode's leak report, which symbolizes with libdw) run without the
  // limit: libdw ends the process when it runs out of memory, and exit-time reporting is not what
  // these scenarios test.
  if (original_limit.rlim_max != 0) (void)setrlimit(RLIMIT_AS, &original_limit);
  if (failures != 0) return 1;
  std::printf("PASS\n");
  return 0;
}
