// memkit::virtual_arena — a bump allocator over ONE reserved range of address space, committed on
// demand, with marks, O(1) reset and in-place growth of its most recent allocation.
//
// The arena reserves `reservation` bytes of address space up front (no physical memory, no commit
// charge) and commits them in steps as allocations move the cursor forward. Because the range never
// moves and never chains chunks, every allocation stays where it is until the arena is rewound,
// reset or destroyed, nothing is wasted at chunk tails, and the last allocation can always grow in
// place until the reservation ends. Failure (reservation exhausted, commit refused by the system)
// is a null pointer with the arena unchanged; nothing throws after construction.
//
// Pick it for phase- or frame-scoped memory (parsers, compilers, per-request scratch, game
// frames): allocate freely, then rewind to a mark or reset() everything at once. Pick dyn_array for
// a single growing array of objects. Individual frees are no-ops except for the most recent
// allocation (stack order), so an arena is wrong for long-lived objects with unrelated lifetimes.
//
// Under AddressSanitizer every committed byte that is not currently allocated is poisoned, so a
// use after rewind()/reset()/deallocate() is reported. Not thread-safe: one arena per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

#include "memkit/allocator.hpp"
#include "memkit/detail/config.hpp"

namespace memkit {

// Construction options of a virtual_arena. Every size is rounded up to the page size (to the huge
// page size for the commit step when huge pages are on).
struct virtual_arena_options {
  // Bytes committed per step when the cursor crosses the committed end; 0 picks
  // virtual_arena::default_commit_step. Larger steps mean fewer system calls (each mprotect costs
  // about a microsecond whatever its size, and now and then milliseconds when it waits for the
  // address-space lock); committed-but-untouched pages cost commit charge, not physical memory.
  std::size_t commit_step = 0;
  // With prefault, bytes populated per step ahead of the cursor (at most up to the committed end);
  // 0 picks virtual_arena::default_prefault_step. The allocation that crosses it pays for
  // populating one such step, and resident memory runs at most one such step ahead of use.
  std::size_t prefault_step = 0;
  // Bytes that reset() keeps committed (from the start of the arena); the rest is decommitted,
  // giving physical pages and commit charge back. SIZE_MAX keeps everything (reset is then a
  // single store).
  std::size_t retained_on_reset = 0;
  // Aligns the reservation and the commit step to the transparent huge page size and asks the
  // system for huge pages (fewer page faults and TLB misses). A hint: ignored where unsupported.
  bool huge_pages = false;
  // Populates memory with physical pages one prefault_step at a time, in one system call each
  // (MADV_POPULATE_WRITE), instead of one page fault per page: measured 3-4x cheaper per page (see
  // docs/virtual_arena.md), and a shortage is reported as a failed allocation instead of a later
  // SIGBUS or OOM kill. The cost: resident memory runs up to one prefault step ahead of use. Turn
  // it off for sparse use of a large range.
  bool prefault = true;
};

// Figures an arena reports about itself.
struct virtual_arena_statistics {
  std::size_t reserved = 0;    // bytes of address space held
  std::size_t committed = 0;   // bytes currently committed (readable and writable)
  std::size_t used = 0;        // bytes from the start to the cursor, alignment padding included
  std::size_t high_water = 0;  // the largest `used` ever reached
};

class virtual_arena final : public allocator {
 public:
  // The commit step used when the options give none: large, so that mprotect calls (and their
  // occasional multi-millisecond waits for the address-space lock, measured in the reserve-commit
  // suite) are rare; it costs commit charge only, not physical memory.
  static constexpr std::size_t default_commit_step = std::size_t{8} << 20;
  // The prefault step used when the options give none. Measured (bench suite reserve-commit,
  // experiment commit-step): throughput is flat from 256 KiB up, and the allocation that crosses a
  // step populates all of it, so the smallest step on the plateau keeps both the worst-case
  // allocation latency and the resident memory ahead of use lowest.
  static constexpr std::size_t default_prefault_step = std::size_t{256} << 10;

  // A position of the cursor, taken by mark() and given back to rewind().
  struct marker {
    std::size_t offset = 0;  // bytes from the start of the arena
  };

  // Rewinds the arena to where it was on construction when it goes out of scope: scratch memory
  // for one function or one iteration.
  class scope {
   public:
    // Remembers the arena's current mark.
    explicit scope(virtual_arena& arena) noexcept : arena_(&arena), mark_(arena.mark()) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    // Rewinds the arena to the remembered mark.
    ~scope() { arena_->rewind(mark_); }
    // The arena this scope rewinds.
    virtual_arena& arena() const noexcept { return *arena_; }

   private:
    virtual_arena* arena_;
    marker mark_;
  };

  // An empty arena: reserves nothing, every allocation fails. Useful as a moved-from state.
  virtual_arena() noexcept = default;

  // Reserves `reservation` bytes (rounded up to the page size) and commits nothing. A reservation
  // of 0 gives an empty arena. Throws std::bad_alloc when the system refuses the reservation and
  // std::length_error when rounding it up overflows.
  explicit virtual_arena(std::size_t reservation, virtual_arena_options options = {});

  // Like the constructor, but reports failure as an empty optional instead of throwing.
  static std::optional<virtual_arena> try_create(std::size_t reservation,
                                                 virtual_arena_options options = {}) noexcept;

  virtual_arena(const virtual_arena&) = delete;
  virtual_arena& operator=(const virtual_arena&) = delete;
  // Takes over the reservation; `other` becomes empty. Pointers into the arena stay valid.
  virtual_arena(virtual_arena&& other) noexcept;
  // Releases this arena's reservation and takes over `other`'s.
  virtual_arena& operator=(virtual_arena&& other) noexcept;
  // Releases the whole reservation (every allocation becomes invalid; no destructors run).
  ~virtual_arena() override;

  // Returns `size` bytes (0 behaves as 1) aligned to `alignment` (a power of two, any size: the
  // padding comes out of the reservation), or null when the alignment is not a power of two, the
  // reservation is exhausted or the system refuses to commit; the arena is then unchanged and
  // last_error() says why. Inline bump-and-compare; commits out of line.
  [[nodiscard]] void* allocate(std::size_t size, std::size_t alignment = default_alignment) noexcept {
    if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return nullptr;
    size += static_cast<std::size_t>(size == 0);
    const auto cursor = reinterpret_cast<std::uintptr_t>(cursor_);
    const std::size_t padding = (std::uintptr_t{0} - cursor) & (alignment - 1);
    const auto room = static_cast<std::size_t>(ready_end_ - cursor_);
    if (MEMKIT_LIKELY(size <= room && padding <= room - size)) {
      char* block = cursor_ + padding;
      cursor_ = block + size;
      MEMKIT_UNPOISON(block, size);
      return block;
    }
    return allocate_slow(size, alignment);
  }

  // Memory for `count` objects of T (uninitialized), or null on failure or when count *
  // sizeof(T) overflows.
  template <class T>
  [[nodiscard]] T* allocate_array(std::size_t count) noexcept {
    if (count > SIZE_MAX / sizeof(T)) return nullptr;
    return static_cast<T*>(allocate(count * sizeof(T), alignof(T)));
  }

  // Constructs a T in the arena and returns it, or null when memory runs out. Its destructor is
  // never run by the arena: use it for trivially destructible types or destroy it yourself.
  // Exceptions from T's constructor propagate (the memory stays allocated until reset).
  template <class T, class... Args>
  [[nodiscard]] T* create(Args&&... args) {
    void* p = allocate(sizeof(T), alignof(T));
    return p == nullptr ? nullptr : ::new (p) T(std::forward<Args>(args)...);
  }

  // The current cursor, for rewind().
  [[nodiscard]] marker mark() const noexcept {
    return marker{static_cast<std::size_t>(cursor_ - base_)};
  }

  // Frees everything allocated since `m` was taken (m must not be ahead of the cursor). Keeps the
  // memory committed. Pointers into the freed part must not be used again (ASan reports it).
  void rewind(marker m) noexcept;

  // Frees everything in O(1): the cursor goes back to the start and everything committed beyond
  // retained_on_reset is decommitted with one system call (the kernel then frees those pages,
  // which costs time proportional to the pages that were touched; retain them to avoid it).
  void reset() noexcept;

  // Commits ahead so that the next `bytes` bytes after the cursor need no system call. Returns
  // false (arena unchanged) when they exceed the reservation or the system refuses.
  [[nodiscard]] bool commit_ahead(std::size_t bytes) noexcept;

  // Decommits the committed pages after the cursor (beyond whole pages in use), giving their
  // physical memory and commit charge back. Returns false, keeping them, if the system refuses.
  bool decommit_unused() noexcept;

  // Grows or shrinks the block at `p` of `old_size` bytes to `new_size` in place. Growth works
  // for the most recent allocation only (it ends at the cursor), up to the reservation; shrinking
  // always succeeds and gives the tail back when the block is the most recent one. Same as the
  // allocator interface's resize(), without the virtual call.
  [[nodiscard]] bool resize(void* p, std::size_t old_size, std::size_t new_size,
                            std::size_t alignment = default_alignment) noexcept {
    if (p == nullptr || !detail::is_power_of_two(alignment)) return false;
    return resize_block(static_cast<char*>(p), old_size == 0 ? 1 : old_size,
                        new_size == 0 ? 1 : new_size);
  }

  // Gives back the block at `p` of `size` bytes. Only the most recent allocation (one that ends at
  // the cursor) is really freed, so frees in reverse order of allocation all reclaim memory; any
  // other free is a no-op and the memory comes back at rewind() or reset().
  void deallocate(void* p, std::size_t size, std::size_t alignment = default_alignment) noexcept {
    (void)alignment;
    if (p != nullptr) deallocate_block(static_cast<char*>(p), size == 0 ? 1 : size);
  }

  // True when `p` points into this arena's reservation.
  [[nodiscard]] bool owns(const void* p) const noexcept {
    const auto* c = static_cast<const char*>(p);
    return base_ != nullptr && c >= base_ && c < reserved_end_;
  }

  // Bytes of address space reserved.
  [[nodiscard]] std::size_t reserved() const noexcept { return static_cast<std::size_t>(reserved_end_ - base_); }
  // Bytes currently committed.
  [[nodiscard]] std::size_t committed() const noexcept { return static_cast<std::size_t>(committed_end_ - base_); }
  // Bytes from the start of the arena to the cursor.
  [[nodiscard]] std::size_t used() const noexcept { return static_cast<std::size_t>(cursor_ - base_); }
  // Bytes from the start that are ready: committed and, with prefault, populated. Allocations
  // below it make no system call.
  [[nodiscard]] std::size_t ready() const noexcept { return static_cast<std::size_t>(ready_end_ - base_); }
  // Bytes that can still be allocated without a system call (ignoring alignment padding).
  [[nodiscard]] std::size_t available_committed() const noexcept {
    return static_cast<std::size_t>(ready_end_ - cursor_);
  }
  // The largest used() ever reached.
  [[nodiscard]] std::size_t high_water() const noexcept {
    const std::size_t now = used();
    return now > high_water_ ? now : high_water_;
  }
  // All four figures at once.
  [[nodiscard]] virtual_arena_statistics statistics() const noexcept {
    return {reserved(), committed(), used(), high_water()};
  }
  // The start of the reservation (null for an empty arena).
  [[nodiscard]] void* base() const noexcept { return base_; }
  // The commit step in use, after rounding.
  [[nodiscard]] std::size_t commit_step() const noexcept { return commit_step_; }
  // The prefault step in use, after rounding.
  [[nodiscard]] std::size_t prefault_step() const noexcept { return prefault_step_; }
  // The options the arena was built with, after rounding.
  [[nodiscard]] virtual_arena_options options() const noexcept {
    return {commit_step_, prefault_step_, retained_on_reset_, huge_pages_, prefault_};
  }
  // The system's error number of the last failed allocation, commit or decommit (ENOMEM when the
  // reservation was exhausted), 0 when none failed yet. os::error_message() turns it into text.
  [[nodiscard]] int last_error() const noexcept { return last_error_; }

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override {
    return allocate(size, alignment);
  }
  void do_deallocate(void* p, std::size_t size, std::size_t) noexcept override {
    deallocate_block(static_cast<char*>(p), size);
  }
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size, std::size_t) noexcept override {
    return resize_block(static_cast<char*>(p), old_size, new_size);
  }
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                      std::size_t alignment) noexcept override;

 private:
  void* allocate_slow(std::size_t size, std::size_t alignment) noexcept;
  bool make_ready(char* end) noexcept;
  bool commit_through(char* end) noexcept;
  void decommit_from(char* from) noexcept;
  bool resize_block(char* p, std::size_t old_size, std::size_t new_size) noexcept;
  void deallocate_block(char* p, std::size_t size) noexcept;
  void release() noexcept;

  char* base_ = nullptr;           // start of the reservation
  char* cursor_ = nullptr;         // end of the most recent allocation
  char* ready_end_ = nullptr;      // [base_, ready_end_) is committed and, with prefault, populated
  char* committed_end_ = nullptr;  // [base_, committed_end_) is readable and writable
  char* reserved_end_ = nullptr;   // end of the reservation
  std::size_t high_water_ = 0;     // largest used() seen when the cursor last moved back
  std::size_t commit_step_ = 0;
  std::size_t prefault_step_ = 0;
  std::size_t retained_on_reset_ = 0;
  int last_error_ = 0;
  bool huge_pages_ = false;
  bool prefault_ = false;
};

}  // namespace memkit
