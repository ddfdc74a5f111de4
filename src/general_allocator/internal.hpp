// Internal data structures of memkit::general_allocator, shared by the files of this folder.
//
// Memory hierarchy (the model is mimalloc; the words are those of the glossary in
// docs/general_allocator.md: small, medium and large classes, huge blocks):
//   segment  4 MiB of address space reserved at a 4 MiB-aligned address. Its first 64 KiB hold the
//            segment header and the page descriptors, so any pointer into the segment finds them
//            by masking. A segment belongs to one thread heap. A huge block (above 3.5 MiB, or
//            aligned to more than 64 KiB) gets a segment of its own, of the huge kind, reserving at
//            least 32 MiB of address space so that it can serve larger blocks once freed (huge.cpp).
//   page     a run of the segment (64 KiB small, 512 KiB medium) cut into blocks of one size
//            class; it keeps its free blocks in an intrusive list. Large classes (64 KiB-3.5 MiB)
//            take a *span* of whole 64 KiB slices of a large-kind segment, one block per span;
//            a freed span's slices serve any later span that fits, in place (segment.cpp).
//   heap     one per thread: for each size class a queue of pages with free blocks. Full pages
//            leave the queue and come back when a block of theirs is freed.
//
// Cross-thread frees push onto the page's atomic thread_free list, whose two low bits carry a
// notification state: a full page (not in any queue) asks to be notified; the first remote free
// after that also pushes the page onto its heap's notified stack, so the owner finds it in O(1).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "memkit/detail/config.hpp"
#include "memkit/general_allocator.hpp"
#include "../os/platform.hpp"

namespace memkit::os::symbols {
struct exit_path;
}

namespace memkit::gpa {

// ---- geometry ---------------------------------------------------------------------------------

inline constexpr unsigned segment_shift = 22;
inline constexpr std::size_t segment_size = std::size_t{1} << segment_shift;  // 4 MiB
inline constexpr std::uintptr_t segment_mask = segment_size - 1;
inline constexpr std::size_t segment_header_bytes = std::size_t{64} << 10;  // first 64 KiB
inline constexpr std::size_t max_pages_per_segment = 64;
inline constexpr std::size_t max_huge_splits = 32;  // see segment::huge_splits

enum class segment_kind : std::uint8_t { small, medium, large, huge };
inline constexpr unsigned page_kind_count = 3;  // small, medium, large
inline constexpr unsigned page_shift_of[page_kind_count] = {16, 19, 16};  // large: slices
inline constexpr unsigned slice_shift = 16;
inline constexpr std::size_t slice_size = std::size_t{1} << slice_shift;  // 64 KiB

// ---- size classes (size_classes.cpp) ----------------------------------------------------------
// Class 0 is 8 bytes, 1..8 are 16..128 in steps of 16, then four classes per power of two up to
// 3.5 MiB. Every class but 0 is a multiple of 16, and a request aligned up to A (A <= 64 KiB) lands
// in a class whose blocks are A-aligned (see size_classes.cpp).

inline constexpr std::size_t class_count = 68;
inline constexpr std::size_t small_max = std::size_t{8} << 10;    // small pages serve up to this
inline constexpr std::size_t medium_max = std::size_t{64} << 10;  // medium pages up to this
inline constexpr std::size_t large_max = std::size_t{3584} << 10;  // larger: own mapping
inline constexpr std::size_t max_class_alignment = std::size_t{64} << 10;
static_assert(class_count <= general_allocator::max_size_classes);

// Block size of class `c`.
constexpr std::size_t class_block_size(std::size_t c) noexcept {
  if (c == 0) return 8;
  if (c <= 8) return c * 16;
  const std::size_t j = c - 9;
  const std::size_t b = 7 + j / 4;
  return (std::size_t{1} << b) + (j % 4 + 1) * (std::size_t{1} << (b - 2));
}

// The class of a request of `size` bytes (1 <= size <= large_max) needing 16-byte alignment at
// most (8 when `size` <= 8 and alignment <= 8).
// Classes of sizes up to small_table_max, indexed by (size + 15) / 16 (size_classes.cpp).
inline constexpr std::size_t small_table_max = 8192;
struct class_table {
  std::uint8_t entries[small_table_max / 16 + 1];
  constexpr std::uint8_t operator[](std::size_t i) const noexcept { return entries[i]; }
};
extern const class_table small_class_table;

inline std::size_t class_of(std::size_t size) noexcept {
  if (size <= small_table_max) return small_class_table[(size + 15) >> 4];
  const std::size_t w = size - 1;
  const unsigned b = static_cast<unsigned>(std::bit_width(w)) - 1u;
  return 9 + (b - 7) * 4 + ((w >> (b - 2)) & 3);
}

inline segment_kind kind_of_class(std::size_t c) noexcept {
  const std::size_t bs = class_block_size(c);
  return bs <= small_max ? segment_kind::small
                         : bs <= medium_max ? segment_kind::medium : segment_kind::large;
}

// ---- small utilities --------------------------------------------------------------------------

// A lock for the rare global paths (segment cache, heap registry, huge blocks). No malloc, and
// resettable in a forked child.
class spin_lock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) os::yield_thread();
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }
  void reset() noexcept { locked_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> locked_{false};
};

class lock_guard {
 public:
  explicit lock_guard(spin_lock& l) noexcept : lock_(l) { lock_.lock(); }
  ~lock_guard() { lock_.unlock(); }
  lock_guard(const lock_guard&) = delete;
  lock_guard& operator=(const lock_guard&) = delete;

 private:
  spin_lock& lock_;
};

// Keeps errno as it was across a scope that may make system calls: free() never changes errno
// (glibc's guarantee since 2.33, which the drop-in relies on), while its slow paths may return
// memory to the OS.
class errno_keeper {
 public:
  errno_keeper() noexcept : saved_(errno) {}
  ~errno_keeper() { errno = saved_; }
  errno_keeper(const errno_keeper&) = delete;
  errno_keeper& operator=(const errno_keeper&) = delete;

 private:
  int saved_;
};

// Every allocation that returns null sets errno (ENOMEM, or EINVAL for a bad alignment), as C's
// malloc does: the drop-in then returns the allocator's result as it is, with the slow paths as
// tail calls and no stack frame on the fast path.
[[gnu::cold]] inline void* allocation_failure(int error = ENOMEM) noexcept {
  errno = error;
  return nullptr;
}

// Milliseconds of a coarse monotonic clock (a few ns to read; only slow paths read it).
std::uint64_t now_ms() noexcept;

// ---- blocks, pages, segments, heaps ------------------------------------------------------------

struct block {
  block* next;
};

struct heap;
struct segment;

// Notification states in the low bits of page::thread_free.
inline constexpr std::uintptr_t tf_normal = 0;    // owner knows where the page is
inline constexpr std::uintptr_t tf_notify = 1;    // page is full: the next remote free notifies
inline constexpr std::uintptr_t tf_notified = 2;  // page is (being) pushed on the notified stack
inline constexpr std::uintptr_t tf_state_mask = 3;

// Debug record of one block, followed in memory by 2 * frames trace slots.
struct debug_record {
  std::uint32_t requested;     // bytes asked for
  std::uint8_t state;          // record_state
  std::uint8_t alloc_frames;   // frames captured at allocation
  std::uint8_t free_frames;    // frames captured at the first free
  std::uint8_t flags;          // the block's allocation_family (family_mask), an aligned new's alignment
};
inline constexpr std::uint8_t family_mask = 3;  // of debug_record::flags and segment::huge_flags
// The rest of the same flags: the std::align_val_t an aligned operator new or new[] was called
// with, as its log2 + 1 (0: none, for the plain forms and every other family).
inline constexpr unsigned alignment_shift = 2;
constexpr std::uint8_t alignment_flags(std::size_t alignment) noexcept {
  if (alignment == 0) return 0;
  const unsigned log = std::min(static_cast<unsigned>(std::countr_zero(alignment)) + 1, 63u);
  return static_cast<std::uint8_t>(log << alignment_shift);
}
constexpr std::size_t named_alignment(std::uint8_t flags) noexcept {
  const unsigned log = flags >> alignment_shift;
  return log == 0 ? 0 : std::size_t{1} << (log - 1);
}
enum record_state : std::uint8_t { never_used = 0, live = 1, freed = 2 };

using os::owner_add;
using os::owner_decrement_is_zero;

// A count only the owning thread changes: plain loads and stores (no locked instruction), but
// atomic so that statistics() may read it from another thread.
class owned_count {
 public:
  owned_count& operator=(std::uint32_t v) noexcept {
    value_.store(v, std::memory_order_relaxed);
    return *this;
  }
  operator std::uint32_t() const noexcept { return value_.load(std::memory_order_relaxed); }
  std::uint32_t operator++() noexcept { return add(1); }
  std::uint32_t operator--() noexcept { return add(static_cast<std::uint32_t>(-1)); }
  // ++ and -- of the fast paths, which need no value back (see owner_add).
  void increment() noexcept { owner_add(value_, std::uint32_t{1}); }
  bool decrement_is_zero() noexcept { return owner_decrement_is_zero(value_); }
  owned_count& operator-=(std::uint32_t n) noexcept {
    add(static_cast<std::uint32_t>(0u - n));
    return *this;
  }

 private:
  std::uint32_t add(std::uint32_t n) noexcept {
    const std::uint32_t v = value_.load(std::memory_order_relaxed) + n;
    value_.store(v, std::memory_order_relaxed);
    return v;
  }
  std::atomic<std::uint32_t> value_{0};
};

// A field only the owning thread writes and statistics() reads from others: plain loads and
// stores, but atomic, like owned_count.
template <class T>
class owner_written {
 public:
  constexpr owner_written() noexcept = default;
  owner_written& operator=(T v) noexcept {
    value_.store(v, std::memory_order_relaxed);
    return *this;
  }
  operator T() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<T> value_{};
};

// The first cache line holds what the owner touches on every allocation and local free; the
// second what other threads touch when they free into the page (thread_free, and `records` to
// tell a debug page), so a remote free does not take the owner's hot line away from it.
struct alignas(64) page {
  block* free = nullptr;            // blocks ready to hand out (owner only)
  owned_count used;                 // blocks handed out and not collected back
  std::uint32_t capacity = 0;       // blocks carved from the page so far
  std::uint32_t reserved = 0;       // blocks that fit in the page
  std::uint32_t block_size = 0;     // bytes per block
  owner_written<std::uint8_t> size_class;
  owner_written<bool> in_use;       // holds blocks of a class (else free in its segment)
  bool in_full = false;             // taken out of its queue because it had no free block
  bool debug = false;               // blocks carry debug records (right after in_full: see
                                    // local_free_is_plain)
  bool on_purge_list = false;
  std::uint8_t index = 0;           // position in its segment
  std::uint8_t span_head = 0;       // large-kind slice inside a span: the slice of the span's page
  // Blocks handed out since the page was taken (owner only; statistics() reads it). In the first
  // cache line with `free` and `used`, so that counting an allocation touches no other line; the
  // heap's per-class counters take it over when the page is released.
  std::atomic<std::uint64_t> allocated{0};
  char* start = nullptr;            // first block
  char* area_end = nullptr;         // end of the page's memory
  page* next = nullptr;             // queue (in use) or purge list (free)
  // ---- second cache line
  std::atomic<std::uintptr_t> thread_free{0};  // blocks freed by other threads | tf_* state
  page* notify_next = nullptr;      // link on the heap's notified stack
  unsigned char* records = nullptr; // debug records (debug pages only, and all of them), from the os layer
  page* prev = nullptr;
  std::uint32_t records_bytes = 0;  // at most 8192 records of at most 520 bytes, and live_sizes()
  std::uint16_t record_size = 0;
  std::uint16_t record_frames = 0;
  std::uint64_t reciprocal = 0;     // ceil(2^64 / block_size): block index by multiplication
  std::size_t touched_bytes = 0;    // bytes of the page that may be resident
  std::uint64_t free_since_ms = 0;  // when it became free (purge delay)
};
// 128 bytes: a page descriptor's address is the segment's plus a shifted index.
static_assert(sizeof(page) == 128, "page descriptors must stay 128 bytes");
static_assert(offsetof(page, thread_free) == 64 && offsetof(page, records) < 128,
              "what remote frees touch must stay out of the owner's first cache line");
static_assert(offsetof(page, debug) == offsetof(page, in_full) + 1,
              "local_free_is_plain reads in_full and debug as one 16-bit word");

// After a debug page's records, one word per block: its requested size + 1 while it is live, 0
// otherwise (the mapping starts zeroed). The leak scan reads these 4 bytes per block, in address
// order, instead of a record of about 200 bytes each.
inline std::uint32_t* live_sizes(const page* pg) noexcept {
  return reinterpret_cast<std::uint32_t*>(pg->records + std::size_t{pg->reserved} * pg->record_size);
}

// Debug mode keeps a guard before a page's first block, ending in the canary, so that a write just
// before that block (an underflow, which before any other block lands on the canary of the block
// before it) is found too: the page's first slot, never handed out, when it has two or more; in a
// span of the large classes (one block each), a slice of the span before the block (segment.cpp).
// The index of the first block handed out:
inline std::size_t first_block_index(const page* pg) noexcept { return pg->debug && pg->reserved >= 2 ? 1 : 0; }

// A local free is a plain list push when the page is neither full nor a debug page: both flags
// read as one 16-bit load (one compare on the free fast path instead of two).
inline bool local_free_is_plain(const page* pg) noexcept {
  using flags_word [[gnu::may_alias]] = std::uint16_t;
  return *reinterpret_cast<const flags_word*>(&pg->in_full) == 0;
}

struct segment {
  std::atomic<std::uintptr_t> thread_id{0};  // owning thread (0: none, or a huge segment)
  std::atomic<heap*> owner{nullptr};         // owning heap
  general_allocator::impl* instance = nullptr;
  segment_kind kind = segment_kind::small;
  std::uint8_t page_shift = 0;
  std::uint8_t page_count = 0;
  bool in_free_list = false;
  std::uint32_t used_pages = 0;
  std::uint64_t free_mask = 0;      // pages (large kind: slices) not in use
  std::uint64_t resident_mask = 0;  // large kind: slices touched and not discarded since
  std::size_t reserved_bytes = 0;   // size of the reservation starting at this header
  segment* next = nullptr;          // heap's segment list, or the cache
  segment* prev = nullptr;
  segment* free_next = nullptr;     // heap's list of segments with free pages of this kind
  segment* free_prev = nullptr;
  // Huge (large allocation) segments only:
  std::size_t huge_offset = 0;      // from the header to the block
  std::size_t huge_size = 0;        // usable bytes of the block
  std::size_t huge_requested = 0;   // bytes asked for (debug mode)
  std::size_t huge_committed = 0;   // bytes from the header on that are read-write (the rest of
                                    // the reservation is reserved only)
  bool huge_live = false;
  // Offsets (ascending, inside the reservation) where the memory may pass from one OS mapping to
  // the next: resident pages moved in from other freed blocks (huge.cpp). Each range between two
  // splits lies in one mapping, so it can be moved on again.
  std::uint32_t huge_split_count = 0;
  std::size_t huge_splits[max_huge_splits];
  std::uint64_t cached_since_ms = 0;  // cached segment: when it was cached, or when discarded
  std::size_t dirty_bytes = 0;      // cached segment: touched page bytes not yet discarded
  bool discarded_when_due = false;  // cached segment: its pages were discarded after its wait
  void* huge_frames[2 * general_allocator::max_stack_frames];
  std::uint8_t huge_alloc_frames = 0;
  std::uint8_t huge_free_frames = 0;
  std::uint8_t huge_flags = 0;      // debug mode: as debug_record::flags
  page pages[max_pages_per_segment];
};
static_assert(sizeof(segment) <= segment_header_bytes, "segment header must fit in 64 KiB");

// Empty 4 MiB segments kept for reuse (segment.cpp); guarded by the instance's lock, but for
// dirty_count, which the slow paths read without it.
struct segment_cache {
  segment* clean = nullptr;                   // pages discarded
  segment* dirty_first = nullptr;             // pages awaiting discard, newest first
  segment* dirty_last = nullptr;              // (oldest: the next to be due)
  std::atomic<std::size_t> dirty_count{0};    // segments on the dirty list
  // Purge delays an empty segment of small or medium pages waits before its pages are discarded
  // (segments of spans always wait max_wait_delays): doubled when a segment discarded after its
  // wait is taken back within max_wait_delays (the program empties and refills segments in
  // bursts, and each discard came back as page faults), one less after each purge pass that
  // discards one that waited in vain.
  static constexpr unsigned max_wait_delays = 10;
  unsigned wait_delays = 1;
};

struct page_queue {
  page* first = nullptr;
  page* last = nullptr;
};

// Per-class counters of a heap. Allocations are counted in the pages (page::allocated) and added
// here when a page is released. Frees are not counted on the fast path: statistics() derives them
// as allocations minus the live blocks it finds in the pages.
struct class_counters {
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> pages{0};
};

// Adds to a counter only its owner writes: a plain load and store, no locked instruction, but
// still an atomic so that statistics() may read it from another thread.
inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by = 1) noexcept {
  owner_add(counter, by);
}

// Sizes 0..direct_max at 16-byte alignment find their page in one load: heap::direct, indexed by
// (size + 15) / 16 (so index 0, size 0, is the 16-byte class like index 1), holds the first page
// of the class's queue, or empty_page when the queue is empty or the fast path must not serve
// (debug mode), so the fast path tests only the page's free list (mimalloc's pages_free_direct).
// The 8-byte class (sizes up to 8 at alignment 8 or less) has the last entry, eight_slot.
inline constexpr std::size_t direct_max = 1024;
inline constexpr std::size_t eight_slot = direct_max / 16 + 1;
inline constexpr std::size_t direct_count = eight_slot + 1;
extern page empty_page;  // no free block, ever: its pages send allocations to the slow path

// The direct index of a request of `size` <= direct_max bytes aligned to `alignment` <= 16.
inline std::size_t direct_index(std::size_t size, std::size_t alignment) noexcept {
  return size <= 8 && alignment <= 8 ? eight_slot : (size + 15) >> 4;
}
// The size class of direct index `i`.
inline std::size_t direct_class(std::size_t i) noexcept { return i == eight_slot ? 0 : small_class_table[i]; }

struct heap {
  // Every direct entry starts at empty_page (so does empty_heap's, forever).
  constexpr heap() noexcept {
    for (page*& entry : direct) entry = &empty_page;
  }
  std::atomic<std::uintptr_t> thread_id{0};
  general_allocator::impl* instance = nullptr;
  page* direct[direct_count];       // see direct_max; set by queue_changed
  page_queue queues[2][class_count];  // [debug][class]
  std::atomic<page*> notified{nullptr};
  segment* free_segments[page_kind_count] = {};  // segments with a free page, per kind
  segment* segments = nullptr;                     // every segment of this heap
  // Free pages not yet purged, per kind, oldest first; reused newest first (their memory is hot).
  page* purge_first[page_kind_count] = {};
  page* purge_last[page_kind_count] = {};
  std::size_t retained_bytes = 0;                  // touched bytes of free pages not purged
  std::atomic<bool> purge_requested{false};
  heap* next_registered = nullptr;
  heap* next_abandoned = nullptr;
  class_counters counters[class_count];
  // Debug mode: the blocks this thread freed last, on their way into the instance's quarantine,
  // handed over under its lock a batch at a time (debug.cpp).
  static constexpr std::size_t quarantine_batch = 16;
  static constexpr std::size_t quarantine_batch_bytes = 16 << 10;  // or fewer blocks, if large
  std::uint32_t quarantine_pending = 0;
  std::size_t quarantine_pending_bytes = 0;
  void* quarantine_blocks[quarantine_batch] = {};
};

// The leak report's roots in the calling thread, captured by report_leaks (debug.cpp): a snapshot
// of its registers; the callee-saved registers of report_leaks's caller, stored before anything
// could reuse them (`saved`); its stack from `stack_low` up; and, when the report runs below
// exit(), the exit path (os::symbols::find_exit_path): the C library's and the loader's frames
// there, not read, and the registers exit()'s caller kept, read instead.
struct calling_thread_roots {
  const void* registers = nullptr;
  std::size_t register_bytes = 0;
  const void* saved = nullptr;
  std::size_t saved_bytes = 0;
  std::uintptr_t stack_low = 0;
  const os::symbols::exit_path* exit = nullptr;
};

}  // namespace memkit::gpa

namespace memkit {

struct general_allocator::impl {
  impl() noexcept = default;
  constexpr impl(general_allocator* owner, bool global) noexcept
      : self(owner), is_global(global), direct_on(global) {}

  general_allocator* self = nullptr;
  bool is_global = false;
  // The heaps' direct entries point at pages (global instance outside debug mode); else they all
  // stay at empty_page, so the fast paths of the global instance send every request on. Set by
  // configure() with every heap's entries.
  bool direct_on = is_global;
  os::thread_key key{};                          // thread heaps of a private instance

  gpa::spin_lock lock;                            // guards everything below
  std::atomic<gpa::heap*> heaps{nullptr};         // registry, never shrinks
  gpa::heap* abandoned = nullptr;
  std::atomic<bool> has_abandoned{false};         // abandoned != nullptr, readable without the lock
  gpa::segment_cache empty_segments;              // segment.cpp
  std::atomic<std::uint64_t> caches_checked_ms{0};  // last time a slow path looked at the caches
  gpa::segment* huge_cached = nullptr;            // freed huge blocks kept for reuse
  std::atomic<std::size_t> huge_cached_count{0};
  std::size_t huge_cached_bytes = 0;              // their resident (touched) bytes
  gpa::segment* huge_live = nullptr;              // live huge blocks (leak reports)
  // The threads that exited after using this instance, by thread pointer (where the os layer has
  // one: on Linux the address of the thread's control block, at the top of its stack mapping), the
  // last exited_thread_slots of them in a ring; a thread that attaches a heap with the same pointer
  // takes its record out. The leak scan does not read their dead frames and TLS as roots (leaks.cpp).
  static constexpr std::size_t exited_thread_slots = 256;
  std::uintptr_t exited_threads[exited_thread_slots] = {};
  std::size_t exited_thread_count = 0;            // ever recorded
  // A fork() child whose parent had other threads using this instance: they may have been in the
  // middle of an allocation or a free when it forked (a block handed out, its canary not written
  // yet), and here they never finish it, so the leak report does not check live blocks' canaries.
  bool forked_mid_operation = false;
  // Debug mode's quarantine (debug.cpp): a ring of freed blocks not yet reusable, mapped on first
  // use. Guarded by `lock` like the caches.
  void** quarantine = nullptr;
  std::size_t quarantine_slots = 0;               // ring capacity
  std::size_t quarantine_first = 0;               // oldest entry
  std::size_t quarantine_count = 0;
  std::size_t quarantine_held = 0;                // bytes of the blocks in it

  std::atomic<std::size_t> mapped_bytes{0};
  std::atomic<std::size_t> resident_bytes{0};
  std::atomic<std::size_t> in_use_bytes{0};       // pages in use + live huge blocks
  std::atomic<std::size_t> peak_in_use_bytes{0};
  std::atomic<std::size_t> retained_bytes{0};     // empty memory not yet purged (all heaps)
  std::atomic<std::uint64_t> huge_allocations{0};
  std::atomic<std::uint64_t> huge_frees{0};
  std::atomic<std::size_t> huge_live_bytes{0};

  // heap.cpp
  gpa::heap* attach_heap() noexcept;
  void abandon_heap(gpa::heap* h) noexcept;
  void forget_exited_thread(std::uintptr_t thread) noexcept;  // under the lock
  void collect_heap(gpa::heap* h, bool everything) noexcept;
  // collect_heap() for the heaps of exited threads, which have no owner to collect the blocks
  // other threads freed into them (statistics(), purge()).
  void collect_abandoned(bool everything) noexcept;
  // page.cpp
  void* allocate_slow(gpa::heap* h, std::size_t cls, bool debug) noexcept;
  void free_local_slow(gpa::heap* h, gpa::page* pg) noexcept;
  void free_remote(gpa::segment* s, gpa::page* pg, gpa::block* b) noexcept;
  void drain_notified(gpa::heap* h) noexcept;
  void collect_page(gpa::heap* h, gpa::page* pg) noexcept;
  void release_page(gpa::heap* h, gpa::page* pg) noexcept;
  // segment.cpp
  gpa::page* acquire_page(gpa::heap* h, std::size_t cls, bool debug) noexcept;
  gpa::page* acquire_span(gpa::heap* h, std::size_t cls, bool debug) noexcept;
  void release_span(gpa::heap* h, gpa::page* pg, bool guarded) noexcept;  // guarded: a debug span's
  gpa::segment* reserve_segment() noexcept;
  bool give_back_caches() noexcept;
  gpa::segment* acquire_segment(gpa::heap* h, gpa::segment_kind kind) noexcept;
  gpa::segment* take_clean_segment() noexcept;  // under the lock
  void release_segment(gpa::heap* h, gpa::segment* s) noexcept;
  void purge_heap(gpa::heap* h, std::uint64_t now, bool everything) noexcept;
  void purge_caches(std::uint64_t now, bool everything) noexcept;
  void note_in_use(std::ptrdiff_t delta) noexcept;
  // huge.cpp
  void* huge_allocate(std::size_t size, std::size_t alignment, bool zeroed,
                      std::size_t reserve_hint = 0) noexcept;
  void huge_free(gpa::segment* s) noexcept;
  bool huge_resize(gpa::segment* s, std::size_t new_size, bool populate = false) noexcept;
  void* huge_move(gpa::segment* s, std::size_t new_size, bool populate) noexcept;
  bool recycle_into(gpa::segment* s, std::size_t total) noexcept;
  gpa::segment* segment_from_cached_huge(std::size_t& resident) noexcept;
  void* grow_block(void* p, std::size_t copy_bytes, std::size_t new_size, std::size_t alignment,
                   bool populate) noexcept;
  // debug.cpp
  // `new_alignment`: an aligned operator new's std::align_val_t (0: any other allocation).
  void* debug_allocate(std::size_t size, std::size_t alignment,
                       general_allocator::allocation_family family = general_allocator::allocation_family::malloc,
                       std::size_t new_alignment = 0) noexcept;
  // `size`: what a sized operator delete passed, checked against the block's; 0 when not known.
  // `alignment`: an aligned operator delete's std::align_val_t, 0 for a plain one (and for free).
  void debug_free(void* p, general_allocator::allocation_family family = general_allocator::allocation_family::any,
                  std::size_t size = 0, std::size_t alignment = 0) noexcept;
  std::size_t debug_usable_size(const void* p) const noexcept;
  std::size_t debug_checked_usable_size(const void* p) const noexcept;
  bool debug_check_reallocate(void* p) noexcept;
  bool debug_resize(void* p, std::size_t new_size) noexcept;
  bool setup_records(gpa::page* pg) noexcept;
  void release_records(gpa::page* pg) noexcept;
  void report_foreign(const void* p, const char* what) noexcept;
  void quarantine_then_free(gpa::segment* s, gpa::page* pg, void* p) noexcept;
  void hand_over_quarantined(gpa::heap* h) noexcept;  // the heap's pending blocks into the ring
  void enter_quarantine(void* const* blocks, std::size_t count, std::size_t bytes) noexcept;
  void release_from_quarantine(void* p) noexcept;
  // `every_heap`: also every other thread's pending blocks (configure(), which nothing runs
  // concurrently with); else the calling thread's only.
  void flush_quarantine(bool every_heap) noexcept;
  void check_quarantine() noexcept;
  void report_live_overflow(const void* p) noexcept;  // a live block's canary, found overwritten
  // The guard before a debug page's first block (first_block_index()): written when the page is
  // prepared; checked when that block is freed and, while it is live, by the leak check. (A huge
  // block's guard, in the padding after its header, is written and checked by debug.cpp alone.)
  void fill_page_guard(gpa::page* pg) noexcept;
  void check_page_guard(gpa::page* pg, bool freeing) noexcept;
  void check_live_guards() noexcept;  // the leak check's, of live blocks, with no other thread running
  bool check_freed_fill(gpa::page* pg, void* p, std::size_t from) noexcept;  // true: intact
  [[gnu::cold]] MEMKIT_NOINLINE void report_freed_fill(gpa::page* pg, void* p, std::size_t from) noexcept;
  bool report_interior_of_huge(const void* p) noexcept;
  // leaks.cpp: the reachability scan and the grouped leak report, with the calling thread's roots
  // as the public entry point captured them.
  std::size_t report_lost_blocks(int fd, const gpa::calling_thread_roots& caller,
                                 general_allocator::leak_summary& summary) noexcept;
  // general_allocator.cpp
  void* allocate_generic(std::size_t size, std::size_t alignment, bool zeroed) noexcept;
  void* allocate_direct_miss(gpa::heap* h, std::size_t size, std::size_t alignment) noexcept;
  void refresh_direct() noexcept;
  void free_block(gpa::segment* s, gpa::page* pg, void* p) noexcept;
  bool resize_in_place(void* p, std::size_t new_size) noexcept;
  void release_everything() noexcept;
};

// Abandons the heap of an exiting thread (the thread-exit callback of every instance's key).
void thread_exit_hook(void* value);

// The state of general_allocator::global() (general_allocator.cpp).
extern general_allocator::impl global_impl;

}  // namespace memkit

namespace memkit::gpa {

// ---- the segment map (segment.cpp): one bit per 4 MiB of address space, set for segments this
// process's general allocators reserved, so owns() and debug mode never dereference a foreign
// pointer. In .bss; untouched parts cost nothing.
inline constexpr unsigned address_bits = 48;
inline constexpr std::size_t segment_map_words = (std::size_t{1} << (address_bits - segment_shift)) / 64;
// Plain words accessed through std::atomic_ref: an array of 2^20 std::atomic would need a
// constructor call per element, which Clang gives up evaluating at compile time and runs as a
// dynamic initializer, wiping bits set by allocations in earlier static constructors.
extern std::uint64_t segment_map[segment_map_words];

inline bool segment_map_contains(std::uintptr_t segment_address) noexcept {
  const std::uintptr_t index = segment_address >> segment_shift;
  if (index / 64 >= segment_map_words) return false;
  std::atomic_ref<std::uint64_t> word(segment_map[index / 64]);
  return (word.load(std::memory_order_relaxed) >> (index % 64)) & 1u;
}
void segment_map_set(const segment* s, bool present) noexcept;

// The segment of a block pointer. p - 1 so that a block starting exactly at a 4 MiB boundary (a
// huge block aligned to 4 MiB) maps to the header placed just before it.
inline segment* segment_of(const void* p) noexcept {
  return reinterpret_cast<segment*>((reinterpret_cast<std::uintptr_t>(p) - 1) & ~segment_mask);
}

// The page of a block pointer: a shift (huge segments use shift 63, so always page 0).
inline page* page_of(segment* s, const void* p) noexcept {
  const std::uintptr_t offset = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(s);
  return &s->pages[offset >> s->page_shift];
}

// The calling thread's heap of the global instance (null until its first allocation).
// constinit: no dynamic initialization, so accesses need no TLS wrapper call.
extern constinit thread_local heap* global_heap __attribute__((tls_model("initial-exec")));

// What the global instance's fast paths read instead: the same heap, or empty_heap (whose direct
// entries are all empty_page) while the thread has none. Never null, so the fast path has no test
// for it: a thread's first allocation finds an empty page and takes the miss path, which attaches
// the heap (and, in the drop-in, reads the environment first).
extern heap empty_heap;
extern constinit thread_local heap* direct_heap __attribute__((tls_model("initial-exec")));

// A value unique to each live thread, cheap to read: the thread pointer where the os layer reads
// it in one instruction (mimalloc's thread id), else the address of the thread's global_heap slot.
inline std::uintptr_t current_thread_id() noexcept {
  if constexpr (os::has_thread_pointer) return os::thread_pointer();
  else return reinterpret_cast<std::uintptr_t>(&global_heap);
}
// id == current_thread_id(), in one compare where the thread pointer is readable.
inline bool is_current_thread(std::uintptr_t id) noexcept {
  if constexpr (os::has_thread_pointer) return os::is_thread_pointer(id);
  else return id == current_thread_id();
}

// The calling thread's heap of `im`, or null when it has none yet.
inline heap* attached_heap(general_allocator::impl* im) noexcept {
  if (MEMKIT_LIKELY(im->is_global)) return global_heap;
  return static_cast<heap*>(os::thread_key_get(im->key));
}

inline heap* current_heap(general_allocator::impl* im) noexcept {
  heap* h = attached_heap(im);
  if (MEMKIT_LIKELY(h != nullptr)) return h;
  return im->attach_heap();
}

// Queue operations (owner only).
inline void queue_push_front(page_queue& q, page* pg) noexcept {
  pg->prev = nullptr;
  pg->next = q.first;
  if (q.first != nullptr) q.first->prev = pg;
  else q.last = pg;
  q.first = pg;
}
inline void queue_push_back(page_queue& q, page* pg) noexcept {
  pg->next = nullptr;
  pg->prev = q.last;
  if (q.last != nullptr) q.last->next = pg;
  else q.first = pg;
  q.last = pg;
}
inline void queue_remove(page_queue& q, page* pg) noexcept {
  if (pg->prev != nullptr) pg->prev->next = pg->next;
  else q.first = pg->next;
  if (pg->next != nullptr) pg->next->prev = pg->prev;
  else q.last = pg->prev;
  pg->next = pg->prev = nullptr;
}

// Hands out the first free block of `pg`, a page whose free list is not empty: the step every
// allocation path ends with. The block's link is cleared: left there, the address of the next
// free block stays in every byte the program does not write (a buffer not filled yet, a
// structure's padding, or the rest of a word whose low bytes it writes), and a leak scan, which
// reads live blocks whole, takes it, or that word, for a pointer, so a block lost later is found
// reachable (glibc clears its tcache key and masks its links, mimalloc's secure mode clears the
// link, sanitizer allocators keep their free lists outside the blocks).
inline block* pop_free_block(page* pg) noexcept {
  block* b = pg->free;
  pg->free = b->next;
  b->next = nullptr;
  pg->used.increment();
  bump(pg->allocated);
  return b;
}

// Allocation of a block of class `cls` from the heap: the first free block of the first page in
// the class's queue, else the slow path, which refills the queue (page.cpp). Every allocation of
// a size class goes through here (allocate()'s inline fast path does the same through
// heap::direct).
inline void* allocate_in_class(general_allocator::impl* im, heap* h, std::size_t cls, bool debug) noexcept;

inline page_queue& queue_of(heap* h, const page* pg) noexcept {
  return h->queues[pg->debug ? 1 : 0][pg->size_class];
}

// Points the heap's direct entries of a class at its queue's first page, after a queue operation
// that may have changed it (owner only; a slow path, at most once per page filled or emptied).
// While the instance's direct entries are off (debug mode, private instances) they stay at
// empty_page.
inline void queue_changed(heap* h, bool debug, std::size_t cls) noexcept {
  if (debug || class_block_size(cls) > direct_max) return;
  page* first = h->queues[0][cls].first;
  page* target = first != nullptr && h->instance->direct_on ? first : &empty_page;
  if (cls == 0) {
    h->direct[eight_slot] = target;
    return;
  }
  for (std::size_t i = 0; i < eight_slot; ++i) {
    if (small_class_table[i] == cls) h->direct[i] = target;
  }
}
inline void queue_changed(heap* h, const page* pg) noexcept { queue_changed(h, pg->debug, pg->size_class); }

}  // namespace memkit::gpa

namespace memkit::gpa {

// Carves more blocks from the page's untouched tail onto its free list (page.cpp).
void extend_page(general_allocator::impl* im, page* pg) noexcept;

// The segment holding a page descriptor.
inline segment* segment_of_page(const page* pg) noexcept {
  return reinterpret_cast<segment*>(reinterpret_cast<std::uintptr_t>(pg) & ~segment_mask);
}

// Whether a page of a small, medium or large segment has the guard first_block_index() describes.
inline bool has_page_guard(const page* pg) noexcept {
  return pg->debug && (pg->reserved >= 2 || segment_of_page(pg)->kind == segment_kind::large);
}

// Puts a free page (or a span segment's node) at the back of its heap's purge list, free since
// `now` (owner only).
inline void purge_list_append(heap* h, page* pg, std::uint64_t now) noexcept {
  const unsigned kind = static_cast<unsigned>(segment_of_page(pg)->kind);
  pg->free_since_ms = now;
  pg->on_purge_list = true;
  pg->next = nullptr;
  pg->prev = h->purge_last[kind];
  if (h->purge_last[kind] != nullptr) h->purge_last[kind]->next = pg;
  else h->purge_first[kind] = pg;
  h->purge_last[kind] = pg;
}

// The page descriptor of the block `p` points into: for a pointer inside a large-class span outside
// its page's slice (past it, or a debug span's guard before it), the span's (page_of gives that
// slice's own, unused descriptor).
inline page* block_page(segment* s, const void* p) noexcept {
  page* pg = page_of(s, p);
  if (!pg->in_use && s->kind == segment_kind::large) pg = &s->pages[pg->span_head];
  return pg;
}


// Index of the block holding byte `offset` of a page: offset / block_size by a multiplication
// (exact for every offset inside a page; a division costs several times more on the debug path).
__extension__ typedef unsigned __int128 uint128;  // GCC and Clang on 64-bit targets
inline std::size_t block_index(const page* pg, std::size_t offset) noexcept {
  return static_cast<std::size_t>((static_cast<uint128>(offset) * pg->reciprocal) >> 64);
}

// Bytes of a page's memory area.
inline std::size_t page_area_bytes(const page* pg) noexcept {
  return static_cast<std::size_t>(pg->area_end - pg->start);
}

// Header bytes of a segment that are touched (its descriptors), for resident estimates.
std::size_t segment_header_touched() noexcept;

inline void* allocate_in_class(general_allocator::impl* im, heap* h, std::size_t cls, bool debug) noexcept {
  page* pg = h->queues[debug ? 1 : 0][cls].first;
  if (MEMKIT_LIKELY(pg != nullptr && pg->free != nullptr)) return pop_free_block(pg);
  return im->allocate_slow(h, cls, debug);
}

// The local free: a block of this thread's page goes back on the page's free list. Returns true
// when the page needs the slow path (it was full, or it is now empty and may be released).
inline bool push_local_free(page* pg, void* p) noexcept {
  auto* b = static_cast<block*>(p);
  b->next = pg->free;
  pg->free = b;
  return pg->used.decrement_is_zero();
}

// Address-space ownership of segments and huge blocks (address_claims.cpp), checked in builds
// with assertions and compiled out of the others: every range a segment or block owns is claimed
// when reserved, changed when split, shrunk, grown or moved, and dropped when released. A new
// claim that overlaps another, a change that names a range not claimed exactly, or a claimed range
// left with a hole in its mapping aborts with the step that did it.
namespace claims {
#if MEMKIT_ASSERTIONS
// The claim [at, at + old_bytes) becomes [at, at + new_bytes): old_bytes 0 claims anew, new_bytes
// 0 drops it. The new range must be mapped.
void change(const void* at, std::size_t old_bytes, std::size_t new_bytes, const char* step) noexcept;
// The range must be mapped (reserved or committed) after `step`.
void check_mapped(const void* at, std::size_t bytes, const char* step) noexcept;
void reset_after_fork() noexcept;
#else
inline void change(const void*, std::size_t, std::size_t, const char*) noexcept {}
inline void check_mapped(const void*, std::size_t, const char*) noexcept {}
inline void reset_after_fork() noexcept {}
#endif
inline void claim(const void* at, std::size_t bytes, const char* step) noexcept { change(at, 0, bytes, step); }
inline void drop(const void* at, std::size_t bytes, const char* step) noexcept { change(at, bytes, 0, step); }
}  // namespace claims

namespace testing {

// Test seam (huge.cpp): when set, called just before a block short of resident pages takes the
// lock to take the page area of an empty segment, so a test can empty that list in between, as
// another thread can. Null in programs; tests declare it themselves (this header is not public).
extern void (*before_taking_dirty_segment)() noexcept;

// Test seams (huge.cpp, huge_move): called just before a moving block's last piece moves (a test
// can make that move fail), and after a failed move put the pieces that had moved back, with the
// new reservation and the bytes at its start those pieces left unmapped (address space another
// thread can be handed from then on).
extern void (*before_moving_last_piece)() noexcept;
extern void (*after_moving_pieces_back)(void* reservation, std::size_t vacated) noexcept;

}  // namespace testing

}  // namespace memkit::gpa
