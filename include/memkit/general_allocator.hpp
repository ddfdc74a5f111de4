// memkit::general_allocator — a thread-caching, size-class allocator for any mix of sizes and
// lifetimes, with no degenerate allocation pattern and an optional debug mode.
//
// Pick it when you want malloc-like behaviour (any size, any order of frees, any thread) behind
// the memkit::allocator interface, or as the process allocator (libmemkit_malloc.so is a thin C
// ABI over global()). Prefer virtual_arena when everything dies together, block_heap for a fixed
// region, and a container's inline storage when sizes are small and known.
//
// How it works (the model is mimalloc; see docs/general_allocator.md):
//  - Requests up to 3.5 MiB are rounded up to one of 68 size classes. Blocks of a small or medium
//    class are carved from a page (64 KiB or 512 KiB), and a block of a large class (above 64 KiB)
//    takes a span of 64 KiB slices, whose memory later spans of any size reuse in place. Pages
//    and spans come from 4 MiB segments reserved through memkit::os at 4 MiB-aligned addresses. A
//    pointer finds its segment header by masking its address and its page by a shift: free()
//    needs neither the size nor a search, so no pattern (Zig's gpa-degen included) makes it slower.
//  - Each thread allocates from its own heap: a free list per page, no locks. A block freed by
//    another thread is pushed onto its page's atomic list and collected by the owner later. When a
//    thread exits its heap is abandoned and adopted, whole, by the next thread that needs one.
//  - Empty pages are returned to the OS (os::discard) once they have stayed empty for
//    options::purge_delay_ms, or at once when more than options::retained_limit bytes sit empty.
//  - Requests above 3.5 MiB (or with large alignments), and blocks that reallocate() grows beyond
//    growth_threshold, get an address range of their own, committed only as far as used:
//    resize() and reallocate() commit further pages in place, and beyond the range reallocate()
//    moves the block's page tables with mremap instead of copying it. Freed ones are cached,
//    and a new one takes the resident pages of cached ones (os::move_pages) before faulting in
//    fresh pages.
//  - Debug mode (options::debug) keeps a record per block: requested size, state and, optionally,
//    the stack traces of the allocation and of the first free. It reports double frees (with the
//    allocation, first-free and second-free traces), frees of pointers it does not own or of
//    interior pointers, a deallocate() or sized delete of another size than the block's, a
//    release naming another alignment than its allocation did, overwritten canaries after a
//    block (and before a page's first block), writes to freed memory (found when the block leaves
//    the quarantine of freed blocks or is reused) and leaks. Every check is O(1) per operation.
//
// Every function is thread-safe unless its comment says otherwise, and nothing here calls malloc,
// so the allocator can BE malloc. (One exception, in debug mode with stack traces: the first
// capture dlopens libunwind, which may allocate once; captures re-entered from that allocation
// record no trace.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "memkit/allocator.hpp"
#include "memkit/detail/config.hpp"

namespace memkit {

struct general_allocator_statistics;

class general_allocator final : public allocator {
 public:
  // How debug-mode reports are written: text for people, or one JSON object per line per report.
  enum class report_format : std::uint8_t { text, json };

  // The function family a block came from (debug mode checks that the matching function releases
  // it, as memcheck does: malloc with free, new with delete, new[] with delete[]).
  enum class allocation_family : std::uint8_t { any = 0, malloc = 1, scalar_new = 2, array_new = 3 };

  // Behaviour switches. The defaults are the fast release configuration.
  struct options {
    // Debug mode: per-block records and the checks listed in the header comment.
    bool debug = false;
    // In debug mode, record the stack of each allocation and first free (costs a stack walk).
    bool capture_stack_traces = true;
    // Frames kept per captured trace (at most max_stack_frames).
    std::size_t stack_frames = 12;
    // In debug mode, fill freed blocks with freed_fill_byte and check the fill when reused.
    bool fill_freed_memory = true;
    // In debug mode, bytes of canary after each block, checked on free (0: no canary).
    std::size_t canary_bytes = 16;
    // In debug mode, never hand out a freed address again (memory is still given back to the OS
    // when a whole page has been freed; only the addresses stay retired).
    bool never_reuse_addresses = false;
    // In debug mode, freed blocks of up to this many bytes in all wait in a quarantine before they
    // can be handed out again, so a double free or a write after free that comes after other
    // allocations is still caught (first in, first out; 0: reuse at once). Blocks above 3.5 MiB
    // skip it.
    std::size_t quarantine_bytes = std::size_t{256} << 10;
    // Free pages of segments that still hold blocks, freed huge blocks and empty segments of
    // large-class spans are returned to the OS once they have been empty for ten times this long;
    // other empty segments after once this long, up to ten times as the program takes discarded
    // ones back soon after (it empties and refills them in bursts).
    std::uint32_t purge_delay_ms = 10;
    // Empty memory kept beyond this many bytes is returned to the OS at once.
    std::size_t retained_limit = std::size_t{64} << 20;
    // On a detected error: true prints the report and aborts; false prints it and continues,
    // ignoring the offending operation (the block is neither freed nor reused), except a
    // mismatched free, deallocate or realloc, whose block is valid: that one is carried out.
    bool abort_on_error = true;
    // File descriptor reports are written to.
    int report_fd = 2;
    // Text reports, or JSON lines for machines (see docs/malloc.md for the fields).
    report_format format = report_format::text;
    // Leak reports also list the blocks still reachable (by default only the lost ones).
    bool report_reachable = false;
    // Each leak report ends with a line of what it cost: the live heap, the other memory read as
    // roots, and the CPU time of the scan and of the writing (the leak_summary's fields).
    bool report_cost = false;
    // Leak suppressions: lines `leak:NAME`, NAME matching (with `*` wildcards) part of a
    // function or object name anywhere in the allocation stack. Not copied: must outlive use.
    const char* suppressions = nullptr;
  };

  // What one leak report found, per class of block (definitely lost: nothing points to it;
  // indirectly lost: only lost blocks do; reachable: the program can still reach it).
  struct leak_summary {
    std::size_t definitely_lost_blocks = 0;
    std::size_t definitely_lost_bytes = 0;
    std::size_t indirectly_lost_blocks = 0;
    std::size_t indirectly_lost_bytes = 0;
    std::size_t reachable_blocks = 0;
    std::size_t reachable_bytes = 0;
    std::size_t suppressed_blocks = 0;  // lost blocks whose stack a suppression matched
    std::size_t suppressed_bytes = 0;
    // What the report read besides the live heap (the four counts above add up to that): the
    // program's writable memory, stacks and registers, and the blocks of other instances, read
    // as roots.
    std::size_t root_bytes = 0;
    // What the report cost, in CPU time of the calling thread (0 where the platform cannot tell):
    // the scan (the roots, the blocks they reach, the cliques of lost blocks), which grows with
    // the live heap and the roots, and the writing (grouping by stack, symbolizing, formatting),
    // which grows with what is listed.
    std::uint64_t scan_cpu_ns = 0;
    std::uint64_t writing_cpu_ns = 0;
  };

  // Counters for one size class.
  struct size_class_statistics {
    std::size_t block_size = 0;        // bytes per block in this class
    std::uint64_t allocations = 0;     // blocks handed out so far
    std::uint64_t frees = 0;           // blocks given back so far
    std::uint64_t live_blocks = 0;     // allocations - frees
    std::size_t pages = 0;             // pages of this class currently in use
  };

  // Most size classes there can be; general_allocator_statistics::size_classes has this many entries.
  static constexpr std::size_t max_size_classes = 72;
  // Longest stack trace kept in debug mode.
  static constexpr std::size_t max_stack_frames = 32;
  // Largest request ever satisfied; anything bigger returns null at once.
  static constexpr std::size_t max_allocation_size = std::size_t{1} << 46;
  // A block that reallocate() grows to at least this many bytes moves (once, by a copy) into an
  // address range of its own with room to grow; from then on growth commits pages in place or
  // moves the page tables (mremap), never the bytes. Chosen by measurement: docs/general_allocator.md.
  static constexpr std::size_t growth_threshold = std::size_t{128} << 10;
  // Byte freed blocks are filled with in debug mode.
  static constexpr unsigned char freed_fill_byte = 0xDF;
  // Byte canaries are made of.
  static constexpr unsigned char canary_byte = 0xCA;

  // A private allocator with default options. Its memory is returned to the OS when it is
  // destroyed; blocks still live then become invalid.
  general_allocator() noexcept;
  // A private allocator with the given options.
  explicit general_allocator(const options& opts) noexcept;
  // Returns every mapping to the OS. No other thread may use the allocator any more.
  ~general_allocator() override;

  general_allocator(const general_allocator&) = delete;
  general_allocator& operator=(const general_allocator&) = delete;

  // The process-wide instance (the drop-in malloc's). Constant-initialized (no constructor runs,
  // so it is usable from any static constructor, before main and during static destruction),
  // never destroyed, and never calls malloc.
  static general_allocator& global() noexcept;

  // Replaces the options. Switch debug mode before the first allocation: blocks allocated before
  // keep the mode they were allocated in (they are still freed correctly). Not thread-safe with
  // concurrent allocations.
  void configure(const options& opts) noexcept;
  // The options in force.
  const options& current_options() const noexcept { return options_; }

  // `size` bytes aligned to `alignment` (a power of two), or null when memory is exhausted, the
  // size exceeds max_allocation_size or the alignment is invalid; a null result sets errno to
  // ENOMEM (EINVAL for the alignment), as C's malloc does. Non-virtual fast path of
  // allocator::allocate with the same meaning.
  [[nodiscard]] void* allocate(std::size_t size, std::size_t alignment = default_alignment) noexcept;
  // Like allocate(), with every byte zero (calloc); skips the memset for fresh OS pages.
  [[nodiscard]] void* allocate_zeroed(std::size_t size,
                                      std::size_t alignment = default_alignment) noexcept;
  // Gives back a block from this allocator without its size (C free). Null is a no-op. Outside
  // debug mode `p` must be a live block of this allocator (as for C free); debug mode reports
  // anything else instead of corrupting memory. Never changes errno.
  void free(void* p) noexcept;
  // allocator::deallocate without the virtual call: the size and alignment are not needed, but
  // debug mode reports a size other than the block's (there, allocate_at_least and usable_size
  // report exactly the requested size, and resize changes it), then frees the block.
  void deallocate(void* p, std::size_t size, std::size_t alignment = default_alignment) noexcept {
    (void)alignment;
    if (MEMKIT_LIKELY(!options_.debug)) return free(p);
    free_in_family(p, allocation_family::any, size == 0 ? 1 : size, 0);
  }
  // Bytes usable in the block at `p` (at least the requested size); 0 for null. In debug mode,
  // exactly the requested size, so writing past it is caught by the canary.
  std::size_t usable_size(const void* p) const noexcept;
  // The usable size a request of `size` bytes at default alignment would get (malloc_good_size).
  std::size_t good_size(std::size_t size) const noexcept;
  // C realloc semantics: null `p` allocates; otherwise grows or shrinks in place when possible,
  // else moves the contents to a new block. Returns null on failure (errno set as by
  // allocate()), keeping `p` valid. A `new_size` of 0 is treated as 1 (the drop-in decides what
  // realloc(p, 0) means).
  [[nodiscard]] void* reallocate_unsized(void* p, std::size_t new_size) noexcept;
  // Same, keeping the block aligned to `alignment` (at least the block's original alignment).
  [[nodiscard]] void* reallocate_unsized(void* p, std::size_t new_size,
                                         std::size_t alignment) noexcept;
  // True when `p` points into memory this allocator handed out (a block start or inside a block
  // of a small or medium size class, or the start of a large allocation). O(1); never faults.
  bool owns(const void* p) const noexcept;

  // Returns empty memory that is retained (purge delay not yet elapsed, cached segments) to the
  // OS now. Memory of other threads' heaps is returned when those threads next refill a page.
  void purge() noexcept;

  // The counters now.
  general_allocator_statistics statistics() const noexcept;
  // Writes the counters as text to `fd` (no malloc; safe in an atexit handler).
  void print_statistics(int fd) const noexcept;

  // Debug mode: finds the live blocks the process can no longer reach by scanning its memory
  // for pointers (the writable mappings of every loaded object, every thread's stack and TLS,
  // every thread's registers, then the reachable blocks themselves) and writes one report per
  // distinct allocation stack, largest first, with a summary line; returns the lost (definitely +
  // indirectly) blocks not suppressed. Blocks allocated before debug mode was switched on have no
  // records: they are scanned as roots, never reported. Outside debug mode, reports the live block
  // count per page without traces and returns the live block count. Other threads are stopped
  // while the reachable blocks are found (Linux: ptrace, and a thread in a system call goes on with
  // it afterwards; Windows: SuspendThread); where they cannot be, their registers are not seen and
  // their whole stacks are scanned.
  std::size_t report_leaks(int fd) const noexcept;
  // Same, also filling `summary` with the counts of every class.
  std::size_t report_leaks(int fd, leak_summary& summary) const noexcept;

  // allocate() for an allocation function of `family` (the drop-in's operator new and new[]):
  // outside debug mode exactly allocate(). `new_alignment` is the std::align_val_t an aligned
  // operator new or new[] was called with, 0 for the other forms: debug mode records it, and the
  // delete must name the same (see free()).
  [[nodiscard]] void* allocate(std::size_t size, std::size_t alignment, allocation_family family,
                               std::size_t new_alignment = 0) noexcept {
    if (MEMKIT_LIKELY(!options_.debug)) return allocate(size, alignment);
    return allocate_in_family(size, alignment, family, new_alignment);
  }
  // free() through a release function of `family` (C free, operator delete, delete[]): debug
  // mode reports a block from another family as a mismatch, and a block from an aligned operator
  // new or new[] released by a delete without an alignment. Outside debug mode exactly free().
  void free(void* p, allocation_family family) noexcept {
    if (MEMKIT_LIKELY(!options_.debug)) return free(p);
    free_in_family(p, family, 0, 0);
  }
  // The same through a sized or aligned release function (`alignment`: the std::align_val_t of an
  // aligned operator delete or delete[], 0 for the others): debug mode also reports a `size` other
  // than the one the block was allocated with, as a delete through a base class without a virtual
  // destructor passes, and an alignment other than the one its operator new or new[] was called
  // with (an aligned new released by a delete without one, or the reverse, as AddressSanitizer
  // reports them). A `size` of 0 is not checked.
  void free(void* p, allocation_family family, std::size_t size, std::size_t alignment = 0) noexcept {
    if (MEMKIT_LIKELY(!options_.debug)) return free(p);
    free_in_family(p, family, size, alignment);
  }

  // Fork support: the drop-in registers these as fork handlers. prepare_fork takes every lock
  // of the allocator, so the child starts with none held; after_fork_child also hands the heaps
  // of threads that do not exist in the child to the child's future threads.
  void prepare_fork() noexcept;
  // Releases what prepare_fork took, in the parent.
  void after_fork_parent() noexcept;
  // Resets the locks in the child and abandons the heaps of the parent's other threads.
  void after_fork_child() noexcept;

  struct impl;  // the machinery, in src/general_allocator/ (public only so internals can name it)

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override;
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override;
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                 std::size_t alignment) noexcept override;
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                      std::size_t alignment) noexcept override;
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override;

 private:
  void* allocate_in_family(std::size_t size, std::size_t alignment, allocation_family family,
                           std::size_t new_alignment) noexcept;
  void free_in_family(void* p, allocation_family family, std::size_t size, std::size_t alignment) noexcept;

  friend struct global_instance_holder;
  struct global_tag {};
  // The global instance: constant initialization only (its state is set up on first use).
  constexpr general_allocator(global_tag, impl* state) noexcept
      : impl_(state), global_(true), fast_(true) {}

  options options_;
  impl* impl_ = nullptr;  // lives in memory from the os layer, never from malloc
  bool global_ = false;   // global(): thread heaps in a thread_local, not a thread key
  bool fast_ = false;     // global_ && !options_.debug: allocate()'s fast path applies (one test)
};

// A snapshot of a general_allocator's counters (general_allocator::statistics()). Allocations are
// counted on the fast path; frees are derived (allocations minus the live blocks found in the
// pages), so a block freed by another thread counts as freed once its owner collects it (at its
// next page refill; statistics() and purge() collect for threads that have exited). When threads
// are quiet the figures are exact, except that a block freed into the heap of a thread that is
// still running counts as live until that thread collects it. statistics() may be called while
// other threads allocate (it then reads a snapshot).
struct general_allocator_statistics {
  std::size_t live_bytes = 0;        // bytes in blocks handed out and not freed (block sizes)
  std::size_t peak_live_bytes = 0;   // highest bytes in use, counted at page granularity (pages
                                     // holding blocks plus huge blocks): an upper bound
  std::size_t resident_bytes = 0;    // memory held and not returned to the OS (upper bound)
  std::size_t mapped_bytes = 0;      // address space reserved from the OS
  std::size_t retained_bytes = 0;    // empty memory not yet returned to the OS
  std::uint64_t allocations = 0;     // all allocations so far
  std::uint64_t frees = 0;           // all frees so far
  std::uint64_t huge_allocations = 0;  // allocations of huge blocks (a mapping of their own)
  std::uint64_t huge_frees = 0;        // frees of those
  std::size_t huge_live_bytes = 0;     // bytes in live huge blocks
  std::size_t heaps = 0;             // thread heaps created (live and abandoned)
  std::size_t size_class_count = 0;  // entries of size_classes in use
  general_allocator::size_class_statistics size_classes[general_allocator::max_size_classes];
};

}  // namespace memkit
