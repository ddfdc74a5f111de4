// memkit::block_heap — a heap over one fixed region, carved into blocks, with a bounded worst case
// and full inspection.
//
// The heap manages a region of fixed size (reserved through memkit::os, or a buffer you provide)
// in blocks of a fixed size (4 KiB by default). Requests up to 2 KiB (and at most half a block)
// are served from size classes packed inside blocks; larger ones get a run of whole blocks,
// aligned to the block size. Run allocation is best fit and never misses a run that fits: free
// runs sit in one list per exact run length, and a fixed-depth 64-way bitmap over those lengths
// finds the shortest run that is long enough in a handful of bit scans, whatever the region's
// size or state (three levels cover every length up to 262,144 blocks: 1 GiB of 4 KiB blocks). The free run that ends the region (the top run) is
// kept out of the lists and compared with the best listed run, so carving from it and merging into
// it cost no list work. Freeing coalesces with both neighbours in O(1) through boundary tags. All
// metadata lives outside the region, so a 32 MiB region can hand out one 32 MiB block.
//
// Pick it when a subsystem must live inside a fixed memory budget with a predictable worst case
// (games, embedded, servers with per-tenant budgets), and when you want to see inside the heap:
// statistics, an O(1) fragmentation figure, why a request failed (no memory, or no run long
// enough), a walk over every block, validate(), live allocations grouped by source line, fill
// patterns and guard bytes. For general-purpose allocation prefer general_allocator.
//
// Threads: by default a heap is for one thread at a time. With options.thread_safe every
// operation takes one mutex (uncontended: one atomic exchange each way), so any thread may
// allocate and any thread may free. The inspection functions take the same mutex; walk()'s
// callback runs under it and must not call back into the heap.
//
// Memory: with commit_policy::on_demand (the default) the region is reserved and committed in
// steps of commit_granularity (1 MiB, or one block if larger) as runs are first handed out;
// committed memory stays committed unless options.decommit_free_runs asks free() to give whole
// free steps back to the system. commit_policy::up_front commits the region at construction.
// Committing only changes page protection (no page is touched), so both are cheap; on_demand
// keeps the commit charge proportional to what was used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <version>
#if __has_include(<source_location>)
#include <source_location>
#endif
#include <string>
#include <type_traits>
#include <vector>

#include "memkit/allocator.hpp"

namespace memkit {

// Where an allocation was made: std::source_location's members, from the compiler's builtins,
// which default arguments evaluate at the call site just as std::source_location::current() does.
// memkit's own type on every compiler and standard library (Clang 14 with libstdc++ has no
// std::source_location), so a library built by one compiler links with programs built by another.
struct source_location {
  // The location of the call that uses this as a default argument.
  static constexpr source_location current(const char* file = MEMKIT_CALLER_FILE(),
                                           const char* function = MEMKIT_CALLER_FUNCTION(),
                                           std::uint_least32_t line = MEMKIT_CALLER_LINE(),
                                           std::uint_least32_t column = MEMKIT_CALLER_COLUMN()) noexcept {
    source_location where;
    where.file_ = file;
    where.function_ = function;
    where.line_ = line;
    where.column_ = column;
    return where;
  }
  constexpr source_location() noexcept = default;
#if defined(__cpp_lib_source_location)
  // A std::source_location's file, function, line and column.
  constexpr source_location(const std::source_location& where) noexcept  // NOLINT: implicit, like a copy
      : file_(where.file_name()), function_(where.function_name()), line_(where.line()), column_(where.column()) {}
#endif
  // The source file's name.
  constexpr const char* file_name() const noexcept { return file_; }
  // The enclosing function's name.
  constexpr const char* function_name() const noexcept { return function_; }
  // The line number.
  constexpr std::uint_least32_t line() const noexcept { return line_; }
  // The column number (0 when the compiler does not provide it).
  constexpr std::uint_least32_t column() const noexcept { return column_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  std::uint_least32_t line_ = 0;
  std::uint_least32_t column_ = 0;
};

// When the region's memory is committed (see the header comment).
enum class commit_policy : unsigned char {
  on_demand,  // reserve the region, commit steps as runs are first handed out
  up_front,   // commit the whole region when the heap is built
};

// How a block_heap is configured. Every field has a production default.
struct block_heap_options {
  // Bytes per block: a power of two, at least 256. Runs are aligned to the block size.
  std::size_t block_size = 4096;
  // Serialize every operation with a mutex, so any thread may allocate and free.
  bool thread_safe = false;
  // Record file, line and function of each live allocation (costs a hash-map insert per call).
  bool track_sites = false;
  // Fill new allocations with allocated_fill and freed memory with freed_fill, so reads of
  // uninitialized or freed memory show recognizable bytes; validate() then also checks that free
  // sub-block slots were not written after free.
  bool fill_patterns = false;
  // Bytes of guard_fill placed after every allocation and checked when it is freed (0: off). An
  // overwritten guard stops the program with a message naming the allocation.
  std::size_t guard_bytes = 0;
  // When region memory is committed.
  commit_policy commit = commit_policy::on_demand;
  // Give whole free commit steps back to the system when free() leaves them unused. Makes free()
  // proportional to the size of the merged free run; off by default.
  bool decommit_free_runs = false;
};

// Why the heap's last failed request failed.
enum class block_heap_failure : unsigned char {
  none,                   // no request has failed yet
  invalid_argument,       // alignment not a power of two
  too_large,              // more than the whole region (or an alignment larger than it)
  out_of_memory,          // fewer free blocks in total than the request needs
  fragmentation,          // enough free blocks in total, but no free run long enough
  commit_failed,          // the system refused to commit memory (see os_error())
  no_region,              // the heap has no region: its construction failed (see os_error())
};

// A short English name of a failure reason ("fragmentation", ...).
const char* to_string(block_heap_failure failure) noexcept;

// Counters and sizes at one moment; block_heap::statistics() fills it in O(1).
struct block_heap_statistics {
  std::size_t region_bytes = 0;           // bytes managed (block_count * block_size)
  std::size_t block_size = 0;             // bytes per block
  std::size_t block_count = 0;            // blocks in the region
  std::size_t used_bytes = 0;             // bytes in blocks that are not free (runs, sub-block pages)
  std::size_t free_bytes = 0;             // bytes in free runs
  std::size_t largest_free_run_bytes = 0; // bytes in the longest free run
  std::size_t committed_bytes = 0;        // bytes of the region currently committed
  std::size_t live_allocations = 0;       // allocations not yet freed
  std::size_t live_small_allocations = 0; // of which served from sub-block size classes
  std::size_t total_allocations = 0;      // successful allocations since construction
  std::size_t total_frees = 0;            // frees since construction
  std::size_t failed_allocations = 0;     // requests that returned null
  std::size_t sub_block_pages = 0;        // blocks currently holding sub-block slots
  double fragmentation = 0;               // 1 - largest free run / free bytes (0 when nothing is free)
};

// What a block is doing, as seen by block_heap::walk().
enum class block_run_state : unsigned char {
  free,       // part of a free run
  allocated,  // a run handed out by one allocation
  sub_block,  // one block holding slots of one size class
};

// One run of blocks, as visited by block_heap::walk() in address order.
struct block_run_info {
  void* address = nullptr;           // first byte of the run
  std::size_t first_block = 0;       // index of its first block
  std::size_t block_count = 0;       // blocks in the run (1 for sub_block)
  block_run_state state = block_run_state::free;
  std::size_t requested_bytes = 0;   // allocated: bytes asked for; otherwise 0
  std::size_t slot_bytes = 0;        // sub_block: bytes per slot; otherwise 0
  std::size_t live_slots = 0;        // sub_block: slots handed out; otherwise 0
  std::size_t slot_capacity = 0;     // sub_block: slots the block holds; otherwise 0
};

// Live allocations from one source location (block_heap::live_allocations_by_site()).
struct allocation_site {
  const char* file = "";         // source file, or "(unknown)" for calls through the allocator interface
  std::uint32_t line = 0;        // line, 0 when unknown
  const char* function = "";     // enclosing function's name as the compiler spells it
  std::size_t live_allocations = 0;  // allocations from here not yet freed
  std::size_t live_bytes = 0;        // bytes they asked for
  std::size_t total_allocations = 0; // allocations from here since construction
};

// The outcome of block_heap::validate().
struct block_heap_validation {
  bool ok = true;       // every invariant holds
  std::string problem;  // the first broken invariant, in words; empty when ok
  explicit operator bool() const noexcept { return ok; }
};

// The heap. Not copyable or movable: it owns a region and hands out pointers into it.
class block_heap final : public allocator {
 public:
  // Byte written over new allocations when options.fill_patterns is on.
  static constexpr unsigned char allocated_fill = 0xCD;
  // Byte written over freed memory when options.fill_patterns is on.
  static constexpr unsigned char freed_fill = 0xDD;
  // Byte written into guard bytes when options.guard_bytes is non-zero.
  static constexpr unsigned char guard_fill = 0xFD;
  // Largest request served from sub-block size classes (also limited to half a block).
  static constexpr std::size_t max_small_size = 2048;
  // Commit step for commit_policy::on_demand (one block when blocks are larger).
  static constexpr std::size_t commit_granularity = std::size_t{1} << 20;

  // Reserves region_bytes (rounded up to whole blocks) through the os layer. On failure the heap
  // is empty: valid() is false, os_error() says why, and every allocation returns null.
  explicit block_heap(std::size_t region_bytes, const block_heap_options& options = {}) noexcept;
  // Manages [buffer, buffer + bytes), which the caller keeps alive and which is treated as
  // committed. The start is rounded up to the block size and the end down to whole blocks.
  block_heap(void* buffer, std::size_t bytes, const block_heap_options& options = {}) noexcept;
  // Returns the reserved region (not a user buffer) to the system; live allocations die with it.
  ~block_heap() override;
  block_heap(const block_heap&) = delete;
  block_heap& operator=(const block_heap&) = delete;

  // True when the heap has a region to allocate from.
  bool valid() const noexcept { return block_count_ != 0; }
  // The system's error number when construction or the last commit failed, else 0 (read it
  // from the thread that saw the failure, or while no other thread uses the heap).
  int os_error() const noexcept { return os_error_; }

  // Returns `size` bytes aligned to `alignment`, or null (then last_failure() says why). With
  // options.track_sites the caller's file, line and function are recorded (memkit::source_location).
  [[nodiscard]] void* allocate(std::size_t size, std::size_t alignment = default_alignment,
                               memkit::source_location where = memkit::source_location::current()) noexcept;
  // Gives back a block from this heap without its size; null is a no-op. A pointer the heap did
  // not hand out (or one already freed) stops the program with a message.
  void deallocate(void* p) noexcept;
  // Frees with size and alignment, as the allocator interface does (the size is checked when
  // contracts are on).
  using allocator::deallocate;
  // Bytes usable at `p` (the slot or run size; the requested size when guard bytes are on).
  std::size_t usable_size(const void* p) const noexcept;
  // True when `p` points into this heap's region.
  bool owns(const void* p) const noexcept;

  // Counters and sizes, read in O(1).
  block_heap_statistics statistics() const noexcept;
  // 1 - largest free run / total free bytes, in O(1); 0 when nothing or one run is free.
  double fragmentation() const noexcept;
  // Bytes in the longest free run, in O(1).
  std::size_t largest_free_run() const noexcept;
  // Why the most recent failed request failed (none if none has).
  block_heap_failure last_failure() const noexcept;
  // Calls visit(const block_run_info&) for every run in address order, under the heap's lock.
  template <class Visitor>
  void walk(Visitor&& visit) const {
    using visitor_type = std::remove_reference_t<Visitor>;
    walk_runs(
        [](void* context, const block_run_info& info) { (*static_cast<visitor_type*>(context))(info); },
        const_cast<void*>(static_cast<const void*>(std::addressof(visit))));
  }
  // Checks every invariant of the heap's metadata (and guard bytes and fill patterns when those
  // options are on). O(region); meant for tests and debugging.
  block_heap_validation validate() const;

  // Live allocations grouped by source location, most live bytes first (track_sites only; empty
  // otherwise).
  std::vector<allocation_site> live_allocations_by_site() const;
  // Writes a readable report of live_allocations_by_site() to `out` and returns the same data.
  std::vector<allocation_site> report_live_allocations(std::ostream& out) const;

  // Gives sub-block pages kept for reuse back to the free runs, and decommits every whole free
  // commit step. Returns the bytes decommitted.
  std::size_t trim() noexcept;

  // The block size in bytes.
  std::size_t block_size() const noexcept { return block_size_; }
  // The region's size in bytes.
  std::size_t region_bytes() const noexcept { return block_count_ * block_size_; }
  // The region's first byte.
  void* region() const noexcept { return base_; }
  // The options the heap was built with.
  const block_heap_options& options() const noexcept { return options_; }

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override;
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override;
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                 std::size_t alignment) noexcept override;
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override;

 private:
  struct tag;         // per-block boundary tag, outside the region
  struct site_table;  // allocation-site records (track_sites)
  struct lock;        // takes mutex_ when thread_safe

  // One sub-block size class.
  struct size_class {
    std::uint32_t slot_bytes = 0;    // bytes per slot
    std::uint32_t slots = 0;         // slots per block
    std::uint32_t partial_head = 0;  // first block with a free slot (npos when none)
    std::uint32_t empty_page = 0;    // the one block of this class kept with no live slot (npos: none)
    std::uint32_t reciprocal = 0;    // ceil(2^32 / slot_bytes): offset / slot_bytes without a divide
  };
  static constexpr std::size_t size_class_count = 24;
  static constexpr int max_levels = 6;

  bool initialize(std::byte* base, std::size_t block_count) noexcept;
  void* allocate_locked(std::size_t size, std::size_t alignment, std::size_t* usable,
                        const memkit::source_location* where) noexcept;
  void* allocate_slow(std::size_t size, std::size_t alignment, memkit::source_location where) noexcept;
  void* allocate_run_counted(std::size_t size) noexcept;
  void* allocate_small(std::size_t class_index, std::size_t size) noexcept;
  void* allocate_run(std::size_t size, std::size_t alignment) noexcept;
  void free_locked(void* p, std::size_t checked_size) noexcept;
  void free_small(std::uint32_t block, std::byte* p, std::uint32_t slot) noexcept;
  void release_allocated_run(std::uint32_t block) noexcept;
  void free_run_fast(std::uint32_t block) noexcept;
  bool resize_locked(void* p, std::size_t new_size) noexcept;
  std::size_t usable_size_locked(const void* p) const noexcept;

  // Runs of blocks.
  std::uint32_t find_run(std::uint32_t length) const noexcept;
  std::uint32_t best_fit(std::uint32_t length, std::uint32_t* first) const noexcept;
  void push_free(std::uint32_t first, std::uint32_t length) noexcept;
  bool unlink_free(std::uint32_t first, std::uint32_t length) noexcept;
  void set_length(std::uint32_t length) noexcept;
  void clear_length(std::uint32_t length) noexcept;
  void mark_run(std::uint32_t first, std::uint32_t length, unsigned state) noexcept;
  std::uint32_t take_run(std::uint32_t found, std::uint32_t found_length, std::uint32_t first,
                         std::uint32_t length) noexcept;
  void release_run(std::uint32_t first, std::uint32_t length) noexcept;
  std::uint32_t largest_length() const noexcept;
  bool commit_blocks(std::uint32_t first, std::uint32_t length) noexcept;
  bool commit_steps(std::size_t first_step, std::size_t last_step) noexcept;
  std::size_t decommit_free(std::uint32_t first, std::uint32_t length) noexcept;

  // Sub-block pages.
  void unlink_partial(size_class& c, std::uint32_t block) noexcept;
  void push_partial(size_class& c, std::uint32_t block) noexcept;
  void* take_slot(size_class& c, std::uint32_t block) noexcept;
  bool release_cached_pages() noexcept;

  // Debugging aids.
  void fail(block_heap_failure why) noexcept;
  void check_guard(const std::byte* p, std::size_t requested) const noexcept;
  void debug_free(std::byte* p, std::size_t bytes, std::size_t requested) noexcept;
  void walk_runs(void (*visit)(void*, const block_run_info&), void* context) const;
  std::string validate_locked() const;
  void record_site(void* p, std::size_t size, const memkit::source_location* where);
  void forget_site(void* p) noexcept;
  void resize_site(void* p, std::size_t size) noexcept;

  // The region.
  std::byte* base_ = nullptr;
  std::size_t block_count_ = 0;
  std::size_t block_size_ = 0;
  unsigned block_shift_ = 0;
  std::byte* reserved_ = nullptr;  // what reserve() returned (null for a user buffer)
  std::size_t reserved_bytes_ = 0;
  block_heap_options options_;
  int os_error_ = 0;
  bool debug_ = false;  // fill_patterns, guard_bytes or track_sites: take the slow path
  bool fast_ = false;   // a valid heap without lock or debugging aids: allocate() and deallocate() take short paths

  // Metadata, in one mapping of its own.
  void* metadata_ = nullptr;
  std::size_t metadata_bytes_ = 0;
  tag* tags_ = nullptr;                  // one per block
  std::uint32_t* heads_ = nullptr;       // free-run list head per run length (index length - 1)
  std::uint64_t* bitmap_[max_levels]{};  // bitmap_[0]: bit per length; above: bit per word below
  std::size_t bitmap_words_[max_levels]{};
  int levels_ = 0;
  std::uint32_t top_ = 0;                // first block of the free run ending the region (in no
                                         // list), or the block count when the last block is used
  std::uint64_t* committed_ = nullptr;   // bit per commit step (on_demand)
  std::size_t commit_steps_ = 0;
  std::size_t committed_steps_ = 0;
  unsigned commit_shift_ = 0;            // log2(blocks per commit step)

  // Sub-block classes: class_of_[(size + 15) / 16] is the class serving `size`.
  size_class classes_[size_class_count]{};
  std::size_t small_limit_ = 0;
  unsigned char class_of_[max_small_size / 16 + 1]{};

  // Counters.
  std::size_t free_blocks_ = 0;
  std::size_t live_runs_ = 0;  // live allocations served as runs (the rest are sub-block slots)
  std::size_t small_pages_ = 0;
  std::size_t total_allocations_ = 0;
  std::size_t total_frees_ = 0;
  std::size_t failed_allocations_ = 0;
  block_heap_failure last_failure_ = block_heap_failure::none;

  mutable std::mutex mutex_;
  std::unique_ptr<site_table> sites_;
};

}  // namespace memkit
