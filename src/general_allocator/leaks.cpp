// Debug mode's leak report: which live blocks can the process still reach?
//
// The scan is conservative, word by word, as LeakSanitizer's and memcheck's are. Roots: every
// writable mapping of the process (os::process::for_each_region: the data segments of every
// loaded object, every thread's stack and TLS, the loader's own allocations, memory a program maps
// for itself, shared memory as memcheck reads it), except the memory of memkit's allocators; the calling thread's stack only above the
// report's own frame (below it lie dead frames and the scan's own variables) plus its registers,
// and below exit() without the C library's and the loader's frames there, whose unwritten slots
// hold the program's returned frames' words, but with the registers exit()'s caller kept
// (calling_thread_roots);
// the other threads, stopped until phase 1 ends (os::process::stopped_threads), likewise: each
// stack from its stack pointer up, and each thread's registers (where they cannot be stopped, their
// stacks are read whole and their registers are not seen); and the blocks this allocator handed out
// before debug mode was switched on (no records, so no way to tell whether they are reachable: they
// count as roots), as do the blocks of other instances; of both, only those that may be live
// (scan_untracked_page()). Then transitively every reachable block, over its requested bytes; a
// pointer anywhere inside a block's requested bytes counts as reaching it (a pointer to a 0-byte
// block's start too: reach_of()), as memcheck and LeakSanitizer count it. A pointer into the rest
// of the block's slot, past what was asked for (debug mode's canary, the size class's rounding),
// reaches nothing: a stale word there made a lost arena of perl's look reachable.
//
// Classes (memcheck's): a live block no root reaches is lost. Lost blocks are grouped in cliques:
// walking the lost blocks in address order, each one not yet reached is a clique leader,
// "definitely lost", and every lost block it reaches, directly or not, "indirectly lost" (a
// leader reached later from another clique becomes indirect too). A lost cycle thus shows as one
// definitely lost block and the rest indirectly lost.
//
// Never scanned: segment memory (its headers point at every page's first block; free blocks hold
// stale copies), the quarantine ring, the debug records, and the scan's own tables. Foreign ranges
// (the roots) are read in place when no other thread runs, as far as the os layer, probing page by
// page, says they can be read (os::process::readable_prefix: no guard region, no file page past its
// file's end); with other threads running they are copied out by the os layer
// (os::process::read_memory), so a range another thread unmaps between reading the map and scanning
// it is skipped instead of crashing the report. memkit's own blocks are read in place.
//
// The cost is one lookup per word that could be an address (see visit()): a range filter (for the
// roots, a byte per 4 MiB chunk: scan_root()), then a table indexed by the address's 4 MiB chunk, a
// page entry, a multiplication for the block index and a bit of the reached bitmap, all in tables
// laid out for the scan (phase 2, the cliques of lost blocks, uses the same ones). In front of the
// entries and the bitmap, which outgrow the L2 cache in a GiB of small blocks, a bit per page entry
// tells that every live block of the page is reached already: a word into such a page costs the
// chunk word and that bit. Per block, the scan reads the page's dense table of live sizes
// (live_sizes(), 4 bytes a block, kept by the allocation path) once, in address order (prepare()),
// and only the report reads the records (the stacks) of what it lists. Phase 1 scans the reached
// blocks in address order too (sweep()), not in the order pointers reach them, so a heap of small
// blocks is read in sequence, not a miss per block. Blocks reached behind the sweep are scanned
// from a stack while they are few; past a bound per pass they wait in a pending set for another
// pass in address order (a heap reached through its blocks from a few roots is mostly reached
// behind the sweep).
// Phase 2 walks each clique the same way, from its leader (mark_lost()).
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "internal.hpp"
#include "memkit/detail/stack_trace.hpp"
#include "../os/process.hpp"
#include "../os/symbols.hpp"
#include "memkit/os.hpp"
#include "report.hpp"

namespace memkit {
using namespace gpa;

namespace {

// How many bytes from a block's start a pointer reaches it: its requested bytes, at least one (a
// block of 0 bytes is reached by a pointer to its start, as memcheck counts it).
constexpr std::size_t reach_of(std::size_t requested) noexcept { return requested != 0 ? requested : 1; }

debug_record* record_of(const page* pg, std::size_t index) noexcept {
  return reinterpret_cast<debug_record*>(pg->records + index * pg->record_size);
}

void** alloc_frames(debug_record* r) noexcept {
  return reinterpret_cast<void**>(reinterpret_cast<unsigned char*>(r) + sizeof(debug_record));
}

// The scan's mark of each live block, one byte in a table of its own (the records are far apart
// in memory; the marks of a whole heap fit in the cache): a block's leak class, or not_live.
enum leak_mark : std::uint8_t { unmarked = 0, reachable = 1, indirectly_lost = 2, definitely_lost = 3, not_live = 0xff };

// Memory for the scan's tables, from the os layer (the scan never calls malloc).
class scratch {
 public:
  static constexpr std::size_t huge_table_bytes = std::size_t{4} << 20;
  scratch() noexcept = default;
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() { reset(); }
  void* get(std::size_t bytes) noexcept {
    reset();
    bytes_ = detail::align_up(bytes == 0 ? 1 : bytes, os::page_size());
    auto mapped = os::map(bytes_);
    if (!mapped) {
      bytes_ = 0;
      return nullptr;
    }
    base_ = mapped.value();
    // The tables of a large heap are megabytes (a mark, a size and a stack slot per block): with
    // huge pages where the system has them, filling them faults once per 2 MiB, not per 4 KiB.
    // (Not os::huge_page_size(): its first call reads a file through the C library, which may
    // allocate, and the scan runs under the allocator's lock. Where there are none, the advice
    // fails and changes nothing.)
    if (bytes_ >= huge_table_bytes) (void)os::advise_huge_pages(base_, bytes_);
    return base_;
  }
  void reset() noexcept {
    if (base_ != nullptr) (void)os::release(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }
  std::uintptr_t begin() const noexcept { return reinterpret_cast<std::uintptr_t>(base_); }
  std::uintptr_t end() const noexcept { return begin() + bytes_; }

 private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

struct address_range {
  std::uintptr_t begin;
  std::uintptr_t end;
};

// A block to scan. Phase 1 pushes a page block by its mark instead of its size (`size` is then
// `by_mark | mark`): the size is read when the block leaves the stack, its line requested with
// the block's own a few blocks ahead, not when a pointer reaches it (a miss each, in a table of 4
// bytes per block that outgrows the L2 cache).
struct pending_block {
  const unsigned char* start;
  std::size_t size;
};
constexpr std::size_t by_mark = std::size_t{1} << 63;

struct huge_block {
  std::uintptr_t begin;
  std::uintptr_t end;
  segment* s;
};

// One group of the report: the blocks of one class allocated from one stack.
struct leak_group {
  std::uint64_t hash;
  void* frames[general_allocator::max_stack_frames];  // copied: the record may go once threads run
  std::size_t frame_count;
  bool captured;
  std::uint8_t mark;
  std::size_t blocks;
  std::size_t bytes;
  const void* sample;
};

std::uint64_t hash_frames(void* const* frames, std::size_t count, std::uint8_t mark) noexcept {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ mark;
  for (std::size_t i = 0; i < count; ++i) {
    h ^= reinterpret_cast<std::uintptr_t>(frames[i]);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return h ^ count;
}

// `*` matches any run of characters; the pattern may match anywhere in `text` unless it starts
// with ^ or ends with $ (LeakSanitizer's suppression syntax).
bool wildcard_match(const char* pattern, std::size_t pattern_length, const char* text) noexcept {
  bool anchored_start = pattern_length != 0 && pattern[0] == '^';
  bool anchored_end = pattern_length != 0 && pattern[pattern_length - 1] == '$';
  const char* p = pattern + (anchored_start ? 1 : 0);
  const char* p_end = pattern + pattern_length - (anchored_end && pattern_length > 0 ? 1 : 0);
  const char* t = text;
  const char* star_p = anchored_start ? nullptr : p;  // an implicit leading '*'
  const char* star_t = t;
  bool implicit_star = !anchored_start;
  for (;;) {
    if (p == p_end) {
      if (!anchored_end || *t == '\0') return true;
    } else if (*p == '*') {
      star_p = ++p;
      star_t = t;
      implicit_star = true;
      continue;
    } else if (*t != '\0' && *p == *t) {
      ++p;
      ++t;
      continue;
    }
    if (!implicit_star || *star_t == '\0') return false;
    p = star_p;
    t = ++star_t;
  }
}

// True when a `leak:` line of `suppressions` matches a frame of the stack.
bool suppressed(const char* suppressions, void* const* frames, std::size_t count) noexcept {
  if (suppressions == nullptr || count == 0) return false;
  detail::resolved_frame described[general_allocator::max_stack_frames];
  const std::size_t n = count < general_allocator::max_stack_frames ? count : general_allocator::max_stack_frames;
  for (std::size_t i = 0; i < n; ++i) (void)detail::resolve_stack_frame(frames[i], described[i]);
  const char* line = suppressions;
  while (*line != '\0') {
    const char* end = line;
    while (*end != '\0' && *end != '\n') ++end;
    const char* a = line;
    const char* b = end;
    while (a < b && (*a == ' ' || *a == '\t')) ++a;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r')) --b;
    if (b - a > 5 && std::strncmp(a, "leak:", 5) == 0) {
      a += 5;
      for (std::size_t i = 0; i < n; ++i) {
        const detail::resolved_frame& d = described[i];
        const auto length = static_cast<std::size_t>(b - a);
        // The object's file name without its directory, as LeakSanitizer matches modules (a path
        // of Windows' may separate them with either slash).
        const char* object = d.object;
        for (const char* c = object; c != nullptr && *c != '\0'; ++c) {
          if (*c == '/' || *c == '\\') object = c + 1;
        }
        if ((d.function != nullptr && wildcard_match(a, length, d.function)) ||
            (object != nullptr && wildcard_match(a, length, object)) ||
            (d.file != nullptr && wildcard_match(a, length, d.file))) {
          return true;
        }
      }
    }
    line = *end == '\0' ? end : end + 1;
  }
  return false;
}

// Mappings larger than this are reservations, not data (a sanitizer's shadow memory reserves
// terabytes): never scanned.
constexpr std::size_t largest_root_mapping = std::size_t{1} << 40;

class leak_scanner {
 public:
  explicit leak_scanner(general_allocator::impl* im) noexcept : im_(im) {}

  // Counts the live blocks, clears their marks and collects the large ones. False when the
  // scan's tables cannot be mapped.
  bool prepare() noexcept;
  std::size_t live_blocks() const noexcept { return live_; }
  // Live blocks whose canary the scan found overwritten (at most max_overflowed; a block may be
  // listed twice), when it checked them: only with no other thread, which could be between a
  // block's size and its canary.
  const unsigned char* const* overflowed() const noexcept { return overflowed_; }
  std::size_t overflowed_count() const noexcept { return overflowed_count_; }
  // Whether the scan checked the canaries (and so may the pages' guards: no other thread runs).
  bool checked_canaries() const noexcept { return canary_check_bytes_ != 0; }
  // Bytes read as roots by mark_reachable(): everything it scanned before the blocks.
  std::size_t root_bytes() const noexcept { return root_bytes_; }
  // Phase 1: everything reachable from the roots.
  // `alone`: no other thread exists; `others`: the other threads, stopped (null where they run).
  void mark_reachable(const calling_thread_roots& caller, bool alone, const os::process::stopped_threads* others) noexcept;
  // Phase 2: cliques of lost blocks.
  void mark_lost() noexcept;
  // Counts every live block by class into `summary` and groups the ones the report lists by
  // allocation stack (the stacks copied out of the records). Reads the records: before the other
  // threads run again.
  void group(general_allocator::leak_summary& summary) noexcept;
  // Sorts and writes the groups (symbolizing their stacks), applies the suppressions; returns the
  // lost blocks not suppressed.
  std::size_t write(int fd, general_allocator::leak_summary& summary) noexcept;

 private:
  // Calls visit(start, size, mark, page, index, large) for each live block. Sizes come from
  // sizes_, so no record is read here: a visitor that needs the allocation stack reads the page's
  // record at `index` (or the huge block's segment, `page` then null).
  template <class Visit>
  void for_each_live_block(Visit visit) noexcept;
  // The live block `v` points into: its start, its mark, and where its size is (a record, or
  // the huge block's segment). False when `v` reaches no live block of this allocator.
  bool find(std::uintptr_t v, const unsigned char*& start, std::uint8_t*& mark, const debug_record*& record,
            const segment*& large) const noexcept;
  struct segment_slot {
    const segment* s;
    std::uint32_t base[max_pages_per_segment];  // index of each debug page's first mark
  };
  const segment_slot* slot_of(const segment* s) const noexcept;
  // The lookup tables of visit(); false when they would be too large (the heap's segments lie
  // too far apart), and visit_slow() then finds each block through the segment map.
  bool build_lookup() noexcept;
  static constexpr std::size_t visit_batch = 16;  // candidate words handed to visit() together
  void visit(const std::uintptr_t* words, std::size_t n) noexcept;
  void visit_slow(std::uintptr_t v) noexcept;
  bool is_set(std::size_t index) const noexcept { return ((reached_[index >> 6] >> (index & 63)) & 1) != 0; }
  void sweep() noexcept;
  void scan(const unsigned char* begin, const unsigned char* end) noexcept;
  // A live debug block's requested bytes, then (when canaries are checked) the first bytes of its
  // canary, which follow them in the same or the next cache line: every live block is scanned,
  // phase 1 or 2, so every canary is seen, at no cache miss of its own (a pass of its own over the
  // canaries added 0.15-0.25 s per GiB of small blocks to the report).
  void scan_block(const unsigned char* start, std::size_t size) noexcept {
    scan(start, start + size);
    if (canary_check_bytes_ != 0 && !canary_intact(start + size) && overflowed_count_ < max_overflowed) {
      overflowed_[overflowed_count_++] = start;
    }
  }
  // (Not debug.cpp's overwritten_canary(), whose loop over any length measured 3-5% slower on
  // every small-block heap: two words compared without a loop, as the default canary allows.)
  bool canary_intact(const unsigned char* at) const noexcept {
    if (MEMKIT_LIKELY(canary_check_bytes_ == 16)) {  // the default: two words
      constexpr std::uint64_t canary_word = 0x0101010101010101ull * general_allocator::canary_byte;
      std::uint64_t first;
      std::uint64_t second;
      std::memcpy(&first, at, sizeof first);
      std::memcpy(&second, at + sizeof first, sizeof second);
      return ((first ^ canary_word) | (second ^ canary_word)) == 0;
    }
    for (std::size_t i = 0; i < canary_check_bytes_; ++i) {
      if (at[i] != general_allocator::canary_byte) return false;
    }
    return true;
  }
  void scan_root(const unsigned char* begin, const unsigned char* end) noexcept;
  void scan_in_range(std::uintptr_t first, std::uintptr_t end) noexcept;  // scan()'s filter
  template <class Candidate>
  void scan_words(std::uintptr_t first, std::uintptr_t end, Candidate candidate) noexcept;
  void drain() noexcept;
  void scan_foreign(std::uintptr_t begin, std::uintptr_t end) noexcept;
  void scan_root_range(std::uintptr_t begin, std::uintptr_t end) noexcept;
  void scan_touched(std::uintptr_t begin, std::uintptr_t end) noexcept;
  std::uintptr_t live_part_of(const os::process::region& r, bool after_guard) const noexcept;
  void scan_other_instance(const segment* s) noexcept;
  // The most blocks of a page scan_untracked_page() tells free from live (an 8-byte class in a
  // 64 KiB page); a page of more is read whole.
  static constexpr std::size_t max_untracked_blocks = 8192;
  void scan_untracked_page(const segment* s, const page& pg) noexcept;
  static bool free_blocks_of(const page& pg, std::uint64_t* bits) noexcept;
  void exclude(std::uintptr_t begin, std::uintptr_t end) noexcept;

  general_allocator::impl* im_;
  std::uintptr_t lo_ = UINTPTR_MAX;  // bounds of this allocator's live debug blocks
  std::uintptr_t hi_ = 0;
  std::size_t live_ = 0;
  scratch slots_memory_;
  segment_slot* slots_ = nullptr;
  std::size_t slot_bits_ = 0;
  scratch marks_memory_;
  std::uint8_t* marks_ = nullptr;
  // The requested size of each live page block, by mark index, copied from the pages' live_sizes()
  // tables while prepare() reads them in address order: the scan and the report then read 4 bytes
  // in one dense table instead of a 200-byte record far from every other (one cache and TLB miss
  // each).
  scratch sizes_memory_;
  std::uint32_t* sizes_ = nullptr;
  // One bit per mark: set once the block is reached (or when it is not live), so that a word
  // pointing into a block reached before costs one load and one branch in a table small enough
  // for the cache (1.6 MiB per GiB of 80-byte blocks, where the mark bytes take 13 MiB).
  scratch reached_memory_;
  std::uint64_t* reached_ = nullptr;
  // Phase 1 scans reached blocks in mark order, which is address order within a page (sweep()):
  // a block newly reached at or past the sweep's position is only marked, the sweep gets to it;
  // one behind it goes on the stack. Phase 2 walks each clique the same way from its leader.
  std::size_t finger_ = 0;
  // Blocks reached behind the sweep go on the stack and are scanned at once, depth first, in the
  // order pointers reach them: a cache and a TLB miss each, which is cheap while they are few (a
  // list, a tree hanging off a block). Once a pass has put `stack_limit` of them on the stack, the
  // rest it reaches behind itself only get a bit in the pending set, and further passes take the
  // pending blocks in mark order, like the first (pending_pass()). The set is a tree of bitmaps:
  // level 0 a bit per mark, each level above a bit per word of the one below (any bit set there),
  // so that the next pending mark at or after a position costs a few word loads however sparse the
  // set is. A pass that leaves blocks to the next has scanned `stack_limit` from the stack, so
  // there are at most live / stack_limit + 1 passes. (Tried on a heap reached through its blocks
  // from one root, 0.125 GiB of small blocks, 2.5-3.0 CPU s per GiB against these passes' 1.5: a
  // queue instead of the passes, every block reached behind the sweep taken first in first out,
  // its first line asked for 32 blocks ahead, or read with plain loads 16 at a time. Reads in the
  // order pointers reach the blocks stay a miss each whatever asks for them early; the passes
  // read in address order. A cursor asking for the pending blocks' lines 16 ahead of a pass gained
  // 2-3%, within the spread.)
  static constexpr std::size_t stack_limit = 1024;
  std::size_t stacked_ = 0;  // blocks this pass put on the stack
  bool passes_ = false;      // in pending_pass(): blocks reached ahead need a pending bit too
  static constexpr std::size_t max_levels = 8;
  std::uint64_t* pending_[max_levels] = {};
  std::size_t pending_words_[max_levels] = {};
  std::size_t levels_ = 0;
  void set_pending(std::size_t m) noexcept {
    for (std::size_t l = 0; l < levels_; ++l, m >>= 6) {
      std::uint64_t& word = pending_[l][m >> 6];
      const bool was_empty = word == 0;
      word |= std::uint64_t{1} << (m & 63);
      if (!was_empty) return;
    }
  }
  void clear_pending(std::size_t m) noexcept {
    for (std::size_t l = 0; l < levels_; ++l, m >>= 6) {
      std::uint64_t& word = pending_[l][m >> 6];
      word &= ~(std::uint64_t{1} << (m & 63));
      if (word != 0) return;
    }
  }
  // The lowest pending mark at or after `m`, or SIZE_MAX.
  std::size_t next_pending(std::size_t m) const noexcept;
  // Whether any mark is pending: the top level's one word (phase 2 asks once per clique, most of
  // them a block or two, where next_pending(0) climbed every level to find nothing).
  bool any_pending() const noexcept { return pending_[levels_ - 1][0] != 0; }
  // A block newly reached in phase 1 (its bit just set): left to the sweep, stacked or pending.
  void reached(std::size_t m, const unsigned char* start, std::size_t size) noexcept {
    if (m >= finger_) {
      if (passes_) set_pending(m);  // this pass gets to it; the first pass finds it by its bit
      return;
    }
    if (stacked_ < stack_limit) {
      ++stacked_;
      stack_[depth_++] = {start, size};
    } else {
      set_pending(m);  // the next pass's
    }
  }
  void pending_pass() noexcept;
  // The pages in mark order, for pending_pass() to find a mark's block.
  struct page_run {
    std::size_t mark_base;
    std::size_t capacity;
    const unsigned char* start;
    std::size_t block_size;
    const page* pg;
  };
  scratch runs_memory_;
  page_run* runs_ = nullptr;
  // The report's groups (group(), then write()): an open-addressing table that doubles.
  scratch table_memory_[2];
  std::size_t table_current_ = 0;
  leak_group* table_ = nullptr;
  std::size_t table_capacity_ = 0;
  std::size_t table_groups_ = 0;
  std::size_t run_count_ = 0;
  // The first byte of page block `m` (below page_blocks_); `run`, the index of its page, is kept by
  // the caller between calls, so that marks taken in ascending order cost one step each.
  const unsigned char* page_block_start(std::size_t m, std::size_t& run) const noexcept {
    if (m - runs_[run].mark_base >= runs_[run].capacity) {  // (unsigned: also when m lies below)
      if (run + 1 < run_count_ && m - runs_[run + 1].mark_base < runs_[run + 1].capacity) {
        ++run;
      } else {
        run = static_cast<std::size_t>(std::upper_bound(runs_, runs_ + run_count_, m,
                                                        [](std::size_t x, const page_run& r) { return x < r.mark_base; }) -
                                       runs_) - 1;
      }
    }
    return runs_[run].start + (m - runs_[run].mark_base) * runs_[run].block_size;
  }
  std::size_t page_blocks_ = 0;  // marks of page blocks; the huge blocks' follow
  scratch huge_memory_;
  huge_block* huge_ = nullptr;
  std::size_t huge_count_ = 0;
  scratch stack_memory_;
  pending_block* stack_ = nullptr;
  std::size_t depth_ = 0;
  scratch excluded_memory_;
  address_range* excluded_ = nullptr;
  std::size_t excluded_count_ = 0;
  std::size_t excluded_capacity_ = 0;
  std::uintptr_t stack_low_ = 0;  // the calling thread's stack is scanned from here up
  // The other threads, stopped from the roots to the end of phase 1 where the os layer can: their
  // stacks are scanned from their stack pointers up, their registers too. Where it cannot, their
  // stacks are scanned whole (dead frames included) and their registers are not seen.
  const os::process::stopped_threads* others_ = nullptr;
  std::uintptr_t guard_end_ = 0;  // the end of the last region walked when it was a guard (unreadable)
  // scan_block()'s check: the canary's first bytes, at most 16 (every block's canary has
  // canary_bytes; the rest of a page block's slot is checked on free); 0 when not checked.
  std::size_t canary_check_bytes_ = 0;
  static constexpr std::size_t max_overflowed = 16;
  const unsigned char* overflowed_[max_overflowed] = {};
  std::size_t overflowed_count_ = 0;
  // Every live thread's stack pointer is known (no other thread, or all stopped): a stack mapping
  // none of them lies in is no live thread's.
  bool threads_known_ = false;
  // The thread pointers of threads that exited (impl::exited_threads), copied by prepare().
  std::uintptr_t exited_[general_allocator::impl::exited_thread_slots] = {};
  std::size_t exited_count_ = 0;
  std::size_t scanned_bytes_ = 0;  // by scan(), so far
  std::size_t root_bytes_ = 0;
  scratch copy_memory_;
  unsigned char* copy_ = nullptr;
  static constexpr std::size_t copy_bytes = std::size_t{256} << 10;
  static constexpr std::size_t probe_bytes = std::size_t{1} << 20;  // read in place a MiB at a time
  bool direct_reads_ = false;
  // No other thread runs, or all are stopped (so none unmaps a root meanwhile): roots are read in
  // place, which costs less than half what the copy does (python3's 153 MiB of its own arenas:
  // 24-27 ms of scan alone, 56-64 with one more thread running, which makes the scan copy).
  bool single_threaded_ = false;
  // Set while a root mapping that is writable and executable is read: a JIT's code (the Java VM's
  // code cache), which holds pointers as instructions' 64-bit operands at any byte offset, so
  // scan_root() reads a word at every byte of it, not only at word boundaries.
  bool in_code_ = false;
  // The root being read is a shared mapping: read through copies only (see mark_reachable()).
  bool in_shared_ = false;
  // The mark a block gets when it is scanned: reachable in phase 1, indirectly lost in phase 2.
  std::uint8_t new_mark_ = reachable;
  // Phase 2: the mark of the clique's leader. A leader's reached bit stays clear: its own clique's
  // pointers to it change nothing, and a later clique that reaches it takes it as any block not
  // reached yet, so it is scanned again (its blocks are marked already) and becomes indirectly
  // lost.
  std::size_t leader_ = SIZE_MAX;
  // A word reached mark `m`, whose reached bit is clear: true, with the bit set, unless `m` is the
  // clique's leader.
  bool newly_reached(std::size_t m) noexcept {
    if (m == leader_) return false;
    reached_[m >> 6] |= std::uint64_t{1} << (m & 63);
    return true;
  }
  // visit()'s tables. A page entry per page slot of each segment with live debug blocks (a large
  // span's slices share the span's entry), and one per huge block.
  struct page_entry {
    std::uintptr_t start;      // the first block
    std::uintptr_t limit;      // bytes from `start` that blocks cover; 0: no live debug page here
    std::uint64_t reciprocal;  // block index = offset * reciprocal >> 64; 0 for a huge block
    std::uint32_t mark_base;   // index of the first block's mark
    std::uint32_t block_size;  // 0 for a huge block
    // The fewest bytes any live block of the page asked for: a word less far into its block than
    // this points into the requested bytes without a look at the block's size (sizes_, a cache
    // miss in a large heap).
    std::uint32_t least_requested;
  };
  // One word per 4 MiB chunk of [lo_, hi_): 0, or (index of the chunk's first entry + 1) << 8 |
  // the shift from an offset in the chunk to its page slot (22 for a huge block: one entry).
  scratch chunks_memory_;
  std::uint64_t* chunks_ = nullptr;
  std::uintptr_t first_chunk_ = 0;
  // scan_root()'s filter: a byte per chunk of chunks_, 1 where it has an entry, then a 0 at
  // [chunk_count_] where every word outside the chunks' range lands.
  std::uint8_t* in_chunk_ = nullptr;
  std::size_t chunk_count_ = 0;
  std::uintptr_t chunk_index(std::uintptr_t w) const noexcept {
    return std::min<std::uintptr_t>((w >> segment_shift) - first_chunk_, chunk_count_);
  }
  scratch entries_memory_;
  page_entry* entries_ = nullptr;
  const void** owners_ = nullptr;  // per entry: its page, or a huge block's segment
  // The summary in front of the bitmap: a bit per entry, set once every live block of its page
  // (or huge block) is reached, so that in phase 1 a word into such a page costs the chunk word
  // and this bit (2 KiB per GiB of small-block pages) instead of an entry and a bitmap word (0.6
  // and 1.6 MiB per GiB, past the L2 cache). Per entry, the live blocks of its page not yet
  // reached (counted at the page's first entry; a span's other slices name it in head_).
  std::uint64_t* full_ = nullptr;
  std::uint32_t* unreached_ = nullptr;
  std::uint32_t* head_ = nullptr;
  std::size_t entry_count_ = 0;
  bool entry_full(std::size_t k) const noexcept { return ((full_[k >> 6] >> (k & 63)) & 1) != 0; }
  void set_full(std::size_t head) noexcept {
    for (std::size_t k = head; k < entry_count_ && head_[k] == head; ++k) full_[k >> 6] |= std::uint64_t{1} << (k & 63);
  }
};

template <class Visit>
void leak_scanner::for_each_live_block(Visit visit) noexcept {
  // The pages as prepare() found them (the heap may have changed since, once threads run).
  for (std::size_t r = 0; r < run_count_; ++r) {
    const page_run& run = runs_[r];
    std::uint8_t* marks = marks_ + run.mark_base;
    const std::uint32_t* sizes = sizes_ + run.mark_base;
    for (std::size_t b = 0; b < run.capacity; ++b) {
      if (marks[b] == not_live) continue;
      visit(run.start + b * run.block_size, std::size_t{sizes[b]}, &marks[b], run.pg, b, static_cast<const segment*>(nullptr));
    }
  }
  for (std::size_t i = 0; i < huge_count_; ++i) {
    const segment* s = huge_[i].s;
    visit(reinterpret_cast<const unsigned char*>(huge_[i].begin), s->huge_requested, &marks_[page_blocks_ + i],
          static_cast<const page*>(nullptr), std::size_t{0}, s);
  }
}

const leak_scanner::segment_slot* leak_scanner::slot_of(const segment* s) const noexcept {
  if (slots_ == nullptr) return nullptr;
  const std::size_t mask = (std::size_t{1} << slot_bits_) - 1;
  std::size_t i = static_cast<std::size_t>(((reinterpret_cast<std::uintptr_t>(s) >> segment_shift) * 0x9e3779b97f4a7c15ull) >>
                                           (64 - slot_bits_));
  for (;; i = (i + 1) & mask) {
    if (slots_[i].s == s) return &slots_[i];
    if (slots_[i].s == nullptr) return nullptr;
  }
}

bool leak_scanner::prepare() noexcept {
  std::size_t huge_total = 0;
  {
    lock_guard guard(im_->lock);
    for (const std::uintptr_t t : im_->exited_threads) {
      if (t != 0) exited_[exited_count_++] = t;
    }
    for (segment* s = im_->huge_live; s != nullptr; s = s->next) ++huge_total;
    huge_total += 1;
    huge_ = static_cast<huge_block*>(huge_memory_.get(huge_total * sizeof(huge_block)));
    if (huge_ == nullptr) return false;
    for (segment* s = im_->huge_live; s != nullptr && huge_count_ < huge_total; s = s->next) {
      if (!s->pages[0].debug) continue;
      const auto begin = reinterpret_cast<std::uintptr_t>(s->pages[0].start);
      // Its requested bytes only; the canary follows them.
      huge_[huge_count_++] = {begin, begin + s->huge_requested, s};
    }
  }
  std::sort(huge_, huge_ + huge_count_, [](const huge_block& a, const huge_block& b) { return a.begin < b.begin; });
  // One slot per segment with debug pages, one mark per block carved from them.
  std::size_t segments = 0;
  std::size_t record_ranges = 0;
  for (heap* h = im_->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      bool any = false;
      for (unsigned i = 0; i < s->page_count; ++i) {
        const page& pg = s->pages[i];
        if (!pg.in_use || !pg.debug) continue;
        any = true;
        page_blocks_ += pg.capacity;
        ++run_count_;
        record_ranges += pg.records != nullptr ? 1 : 0;
      }
      segments += any ? 1 : 0;
    }
  }
  slot_bits_ = 4;
  while ((std::size_t{1} << slot_bits_) < 2 * segments) ++slot_bits_;
  slots_ = static_cast<segment_slot*>(slots_memory_.get((std::size_t{1} << slot_bits_) * sizeof(segment_slot)));
  marks_ = static_cast<std::uint8_t*>(marks_memory_.get(page_blocks_ + huge_count_ + 1));
  sizes_ = static_cast<std::uint32_t*>(sizes_memory_.get((page_blocks_ + 1) * sizeof(std::uint32_t)));
  runs_ = static_cast<page_run*>(runs_memory_.get((run_count_ + 1) * sizeof(page_run)));
  if (slots_ == nullptr || marks_ == nullptr || sizes_ == nullptr || runs_ == nullptr) return false;
  std::uint32_t next = 0;
  std::size_t runs = 0;
  const std::size_t mask = (std::size_t{1} << slot_bits_) - 1;
  for (heap* h = im_->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      segment_slot* slot = nullptr;
      for (unsigned i = 0; i < s->page_count; ++i) {
        const page& pg = s->pages[i];
        if (!pg.in_use || !pg.debug) continue;
        if (slot == nullptr) {
          std::size_t k = static_cast<std::size_t>(
              ((reinterpret_cast<std::uintptr_t>(s) >> segment_shift) * 0x9e3779b97f4a7c15ull) >> (64 - slot_bits_));
          while (slots_[k].s != nullptr) k = (k + 1) & mask;
          slot = &slots_[k];
          slot->s = s;
        }
        slot->base[i] = next;
        if (runs < run_count_) runs_[runs++] = {next, pg.capacity, reinterpret_cast<const unsigned char*>(pg.start), pg.block_size, &pg};
        if (pg.used == 0) {  // no block handed out: nothing to read
          std::memset(marks_ + next, not_live, pg.capacity);
          next += pg.capacity;
          continue;
        }
        const std::uint32_t* live_size = live_sizes(&pg);
        std::size_t first = SIZE_MAX;
        std::size_t last = 0;
        for (std::size_t b = 0; b < pg.capacity; ++b) {
          const bool alive = live_size[b] != 0;
          marks_[next + b] = alive ? std::uint8_t{unmarked} : std::uint8_t{not_live};
          sizes_[next + b] = live_size[b] - 1;
          if (!alive) continue;
          ++live_;
          first = std::min(first, b);
          last = b;
        }
        if (first != SIZE_MAX) {
          lo_ = std::min(lo_, reinterpret_cast<std::uintptr_t>(pg.start) + first * pg.block_size);
          hi_ = std::max(hi_, reinterpret_cast<std::uintptr_t>(pg.start) + (last + 1) * pg.block_size);
        }
        next += pg.capacity;
      }
    }
  }
  page_blocks_ = next;
  run_count_ = runs;
  for (std::size_t i = 0; i < huge_count_; ++i) {
    marks_[page_blocks_ + i] = unmarked;
    ++live_;
    lo_ = std::min(lo_, huge_[i].begin);
    hi_ = std::max(hi_, huge_[i].end);
  }
  const std::size_t marks = page_blocks_ + huge_count_;
  // The reached bitmap, then the pending set's levels (pages never touched unless a scan needs
  // them).
  const std::size_t words = marks / 64 + 1;
  std::size_t total_words = words;
  levels_ = 0;
  for (std::size_t n = words;; n = n / 64 + 1) {
    pending_words_[levels_++] = n;
    total_words += n;
    if (n == 1 || levels_ == max_levels) break;
  }
  reached_ = static_cast<std::uint64_t*>(reached_memory_.get(total_words * sizeof(std::uint64_t)));
  if (reached_ == nullptr) return false;
  pending_[0] = reached_ + words;
  for (std::size_t l = 1; l < levels_; ++l) pending_[l] = pending_[l - 1] + pending_words_[l - 1];
  for (std::size_t i = 0; i < marks; i += 64) {  // blocks not live count as reached: never scanned
    std::uint64_t word = 0;
    const std::size_t n = std::min<std::size_t>(64, marks - i);
    for (std::size_t b = 0; b < n; ++b) word |= std::uint64_t{marks_[i + b] == not_live} << b;
    reached_[i / 64] = word;
  }
  stack_ = static_cast<pending_block*>(stack_memory_.get((live_ + 1) * sizeof(pending_block)));
  copy_ = static_cast<unsigned char*>(copy_memory_.get(copy_bytes));
  excluded_capacity_ = 4096 + record_ranges;  // memkit's own ranges, and each page's records
  excluded_ = static_cast<address_range*>(excluded_memory_.get(excluded_capacity_ * sizeof(address_range)));
  if (stack_ == nullptr || copy_ == nullptr || excluded_ == nullptr) return false;
  (void)build_lookup();
  return true;
}

bool leak_scanner::build_lookup() noexcept {
  if (live_ == 0) return false;
  first_chunk_ = lo_ >> segment_shift;
  const std::size_t chunks = ((hi_ - 1) >> segment_shift) - first_chunk_ + 1;
  constexpr std::size_t largest_table = std::size_t{1} << 21;  // 16 MiB of chunk words
  if (chunks > largest_table) return false;
  std::size_t segments = 0;
  for (std::size_t i = 0; i < (std::size_t{1} << slot_bits_); ++i) segments += slots_[i].s != nullptr ? 1 : 0;
  const std::size_t entries = segments * max_pages_per_segment + huge_count_;
  chunks_ = static_cast<std::uint64_t*>(chunks_memory_.get(chunks * sizeof(std::uint64_t) + chunks + 1));
  const std::size_t full_words = entries / 64 + 1;
  auto* memory = static_cast<unsigned char*>(entries_memory_.get(
      entries * (sizeof(page_entry) + sizeof(void*) + 2 * sizeof(std::uint32_t)) + full_words * sizeof(std::uint64_t)));
  if (chunks_ == nullptr || memory == nullptr) {
    chunks_ = nullptr;
    return false;
  }
  in_chunk_ = reinterpret_cast<std::uint8_t*>(chunks_ + chunks);
  chunk_count_ = chunks;
  entries_ = reinterpret_cast<page_entry*>(memory);
  owners_ = reinterpret_cast<const void**>(memory + entries * sizeof(page_entry));
  full_ = reinterpret_cast<std::uint64_t*>(memory + entries * (sizeof(page_entry) + sizeof(void*)));
  unreached_ = reinterpret_cast<std::uint32_t*>(full_ + full_words);
  head_ = unreached_ + entries;
  entry_count_ = entries;
  for (std::size_t k = 0; k < entries; ++k) head_[k] = static_cast<std::uint32_t>(k);
  std::size_t next = 0;
  for (std::size_t i = 0; i < (std::size_t{1} << slot_bits_); ++i) {
    const segment* s = slots_[i].s;
    if (s == nullptr) continue;
    const std::uintptr_t chunk = reinterpret_cast<std::uintptr_t>(s) >> segment_shift;
    if (chunk < first_chunk_ || chunk - first_chunk_ >= chunks) continue;  // no live block in it
    const std::size_t base = next;
    next += max_pages_per_segment;
    chunks_[chunk - first_chunk_] = (std::uint64_t{base + 1} << 8) | s->page_shift;
    in_chunk_[chunk - first_chunk_] = 1;
    const std::size_t slots = std::min<std::size_t>(s->page_count, segment_size >> s->page_shift);
    for (std::size_t j = 0; j < slots; ++j) {
      const page* pg = &s->pages[j];
      if (!pg->in_use && s->kind == segment_kind::large) pg = &s->pages[pg->span_head];
      if (!pg->in_use || !pg->debug) continue;
      const std::uint32_t mark_base = slots_[i].base[pg->index];
      const std::size_t head = base + pg->index;
      std::uint32_t least = UINT32_MAX;
      if (head == base + j) {
        std::uint32_t live = 0;
        for (std::size_t b = 0; b < pg->capacity; ++b) {
          if (marks_[mark_base + b] == not_live) continue;
          ++live;
          least = std::min(least, static_cast<std::uint32_t>(reach_of(sizes_[mark_base + b])));
        }
        unreached_[head] = live;
      } else {
        // A later slice of a span whose head came first, or a debug span's guard before its head
        // (stale, and never read: no word into the guard passes the offset test).
        least = entries_[head].least_requested;
      }
      entries_[base + j] = {reinterpret_cast<std::uintptr_t>(pg->start), std::uintptr_t{pg->capacity} * pg->block_size,
                            pg->reciprocal, mark_base, static_cast<std::uint32_t>(pg->block_size), least};
      owners_[base + j] = pg;
      head_[base + j] = static_cast<std::uint32_t>(head);
    }
    // Slots with no live debug block hold nothing to find; full pages too.
    for (std::size_t j = 0; j < max_pages_per_segment; ++j) {
      if (head_[base + j] == base + j && unreached_[base + j] == 0) full_[(base + j) >> 6] |= std::uint64_t{1} << ((base + j) & 63);
    }
  }
  for (std::size_t i = 0; i < huge_count_; ++i) {
    const std::size_t k = next++;
    entries_[k] = {huge_[i].begin, huge_[i].end - huge_[i].begin, 0, static_cast<std::uint32_t>(page_blocks_ + i), 0, 0};
    owners_[k] = huge_[i].s;
    unreached_[k] = 1;
    for (std::uintptr_t c = huge_[i].begin >> segment_shift; c <= (huge_[i].end - 1) >> segment_shift; ++c) {
      chunks_[c - first_chunk_] = (std::uint64_t{k + 1} << 8) | segment_shift;
      in_chunk_[c - first_chunk_] = 1;
    }
  }
  return true;
}

bool leak_scanner::find(std::uintptr_t v, const unsigned char*& start, std::uint8_t*& mark,
                        const debug_record*& record, const segment*& large) const noexcept {
  const std::uintptr_t base = v & ~segment_mask;
  if (segment_map_contains(base)) {
    auto* s = reinterpret_cast<const segment*>(base);
    if (s->instance == im_ && s->kind != segment_kind::huge) {
      const page* pg = block_page(const_cast<segment*>(s), reinterpret_cast<const void*>(v));
      if (!pg->in_use || !pg->debug) return false;
      const auto first = reinterpret_cast<std::uintptr_t>(pg->start);
      if (v < first) return false;
      const std::size_t index = block_index(pg, v - first);
      if (index >= pg->capacity) return false;
      const segment_slot* slot = slot_of(s);
      if (slot == nullptr) return false;
      std::uint8_t* m = marks_ + slot->base[pg->index] + index;
      if (*m == not_live) return false;
      start = reinterpret_cast<const unsigned char*>(first + index * pg->block_size);
      mark = m;
      record = record_of(pg, index);  // an address only: read when the block is first marked
      large = nullptr;
      return true;
    }
  }
  if (huge_count_ == 0) return false;
  const huge_block* at = std::upper_bound(huge_, huge_ + huge_count_, v,
                                          [](std::uintptr_t x, const huge_block& b) { return x < b.begin; });
  if (at == huge_) return false;
  --at;
  if (v >= at->end) return false;
  start = reinterpret_cast<const unsigned char*>(at->begin);
  mark = &marks_[page_blocks_ + static_cast<std::size_t>(at - huge_)];
  record = nullptr;
  large = at->s;
  return true;
}

// The lookup of words that lie in [lo_, hi_): no search, no division, no hash, only loads from
// tables a few hundred KiB per GiB of heap, and the reached bit. The tables fit the cache, so each
// word is looked up to the end in one pass (a pass that only computed the bits' addresses and
// prefetched them, then a second that tested them, measured 12-15% slower; so did, on a heap
// reached through its blocks, lookups without a branch on the page's full bit or the reached bit,
// the word sent to an entry and a bit always set instead, by 3-25%; no faster either: words put
// in buckets by segment and looked up a bucketful at a time, a bit per KiB of a segment in front
// of the page's, the scan fused with the lookup; see docs/malloc.md). A block reached before,
// the common case, costs the bit test; one reached now is marked at once and queued only when
// phase 1's sweep has passed it.
void leak_scanner::visit(const std::uintptr_t* words, std::size_t n) noexcept {
  if (chunks_ == nullptr) {
    for (std::size_t i = 0; i < n; ++i) visit_slow(words[i]);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::uintptr_t v = words[i];
    const std::uint64_t chunk = chunks_[(v >> segment_shift) - first_chunk_];
    if (chunk == 0) continue;
    const std::size_t k = static_cast<std::size_t>(chunk >> 8) - 1 + ((v & segment_mask) >> (chunk & 0xff));
    if (entry_full(k)) continue;  // every live block of the page reached before
    const page_entry& e = entries_[k];
    const std::uintptr_t offset = v - e.start;
    if (offset >= e.limit) continue;
    const auto index = static_cast<std::size_t>((static_cast<uint128>(offset) * e.reciprocal) >> 64);
    const std::size_t m = e.mark_base + index;
    if (MEMKIT_LIKELY(is_set(m))) continue;  // reached before, or not live
    // Past the block's requested bytes: no pointer to it (a huge block's entry ends there).
    if (e.block_size != 0) {
      const std::size_t into = offset - index * e.block_size;
      if (into >= e.least_requested && into >= sizes_[m]) continue;
    }
    if (!newly_reached(m)) continue;
    if (--unreached_[head_[k]] == 0) set_full(head_[k]);
    if (m >= finger_ && !passes_) continue;  // phase 1's sweep gets to it
    // A page block's mark byte and size are left to whoever scans it (drain() asks for their lines
    // a few blocks ahead; here each would be a miss that nothing else hides).
    const auto* start = reinterpret_cast<const unsigned char*>(e.start + index * e.block_size);
    if (e.block_size != 0) {
      reached(m, start, by_mark | m);
    } else {
      marks_[m] = new_mark_;
      reached(m, start, static_cast<const segment*>(owners_[k])->huge_requested);
    }
  }
}

void leak_scanner::visit_slow(std::uintptr_t v) noexcept {
  const unsigned char* start;
  std::uint8_t* mark;
  const debug_record* record;
  const segment* large;
  if (!find(v, start, mark, record, large)) return;
  const auto m = static_cast<std::size_t>(mark - marks_);
  const std::size_t size = record != nullptr ? std::size_t{sizes_[m]} : large->huge_requested;
  if (is_set(m) || v - reinterpret_cast<std::uintptr_t>(start) >= reach_of(size) || !newly_reached(m)) return;
  *mark = new_mark_;
  reached(m, start, size);
}

void leak_scanner::scan(const unsigned char* begin, const unsigned char* end) noexcept {
  scanned_bytes_ += static_cast<std::size_t>(end - begin);
  scan_in_range(detail::align_up(reinterpret_cast<std::uintptr_t>(begin), sizeof(void*)),
                reinterpret_cast<std::uintptr_t>(end));
}

void leak_scanner::scan_in_range(std::uintptr_t first, std::uintptr_t end) noexcept {
  const std::uintptr_t lo = lo_;
  const std::uintptr_t span = hi_ - lo_;
  scan_words(first, end, [lo, span](std::uintptr_t w) -> unsigned { return w - lo < span ? 1 : 0; });
}

// The program's own memory outside the allocator (its mappings and stacks) holds other heaps: a
// garbage collector's, an arena's, a runtime's, whose mappings lie among the allocator's segments,
// so that a large share of their words fall in [lo_, hi_) (a compiler's 174 MiB of roots: 7.2
// million words in that range, 0.23 million in chunks with live blocks). A branch on the range
// then goes either way; the chunk's byte takes them out before it (that compiler's scan: 2.4
// times as fast). Blocks keep the plain range test, which costs less where few words are in range
// (heaps of numbers: 9-12% more with the chunk's byte).
void leak_scanner::scan_root(const unsigned char* begin, const unsigned char* end) noexcept {
  scanned_bytes_ += static_cast<std::size_t>(end - begin);
  const std::uintptr_t first = detail::align_up(reinterpret_cast<std::uintptr_t>(begin), sizeof(void*));
  const auto last = reinterpret_cast<std::uintptr_t>(end);
  for (std::size_t offset = 0; offset < (in_code_ ? sizeof(void*) : 1); ++offset) {
    if (in_chunk_ == nullptr) {
      scan_in_range(first + offset, last);
    } else {
      scan_words(first + offset, last, [this](std::uintptr_t w) -> unsigned { return in_chunk_[chunk_index(w)]; });
    }
  }
}

// Hands the words from `first` (a word's address, or any byte's in a JIT's code) up to `end` that
// `candidate` accepts (not 0) to visit(), up to visit_batch at a time. Four words per branch: in
// most memory few words are addresses of blocks, and the filter then runs at the speed memory is
// read.
template <class Candidate>
void leak_scanner::scan_words(std::uintptr_t first, std::uintptr_t end, Candidate candidate) noexcept {
  std::uintptr_t a = first;
  constexpr std::size_t group = 4 * sizeof(void*);
  std::uintptr_t candidates[visit_batch];
  std::size_t n = 0;
  for (; a + group <= end; a += group) {
    std::uintptr_t w[4];
    std::memcpy(w, reinterpret_cast<const void*>(a), sizeof w);
    const unsigned any = candidate(w[0]) | candidate(w[1]) | candidate(w[2]) | candidate(w[3]);
    if (MEMKIT_LIKELY(!any)) continue;
    for (const std::uintptr_t word : w) {
      if (candidate(word)) candidates[n++] = word;
    }
    if (n > visit_batch - 4) {
      visit(candidates, n);
      n = 0;
    }
  }
  for (; a + sizeof(void*) <= end; a += sizeof(void*)) {
    std::uintptr_t word;
    std::memcpy(&word, reinterpret_cast<const void*>(a), sizeof word);
    if (candidate(word)) candidates[n++] = word;
  }
  if (n != 0) visit(candidates, n);
}

// Blocks leave the stack a few at a time, their first lines requested together before the first
// is read: in a heap of small blocks, the scan otherwise waits for memory once per block (the
// prefetch when a block is reached comes too late for the block pushed last, which is popped
// first).
void leak_scanner::drain() noexcept {
  constexpr std::size_t window = 16;  // a power of two
  pending_block ring[window];
  std::size_t head = 0;
  std::size_t count = 0;
  for (;;) {
    while (count < window && depth_ != 0) {
      const pending_block& p = stack_[--depth_];
      MEMKIT_PREFETCH(p.start);
      if ((p.size & by_mark) != 0) {
        MEMKIT_PREFETCH(&sizes_[p.size & ~by_mark]);
        MEMKIT_PREFETCH(&marks_[p.size & ~by_mark]);
      }
      ring[(head + count++) & (window - 1)] = p;
    }
    if (count == 0) return;
    const pending_block p = ring[head];
    head = (head + 1) & (window - 1);
    --count;
    std::size_t size = p.size;
    if ((size & by_mark) != 0) {  // reached now
      const std::size_t m = size & ~by_mark;
      marks_[m] = new_mark_;
      size = sizes_[m];
    }
    scan_block(p.start, size);
  }
}

// A range of memory the scan does not own (a root). With no other thread running it is read in
// place, a MiB at a time, as far as the probe says it can be read; else it is copied out through
// the kernel, a chunk at a time, so that a page unmapped meanwhile (another thread's munmap) is
// skipped instead of faulting. Either way an unreadable page is skipped and the rest scanned.
void leak_scanner::scan_foreign(std::uintptr_t begin, std::uintptr_t end) noexcept {
  if (direct_reads_) {
    if (in_shared_) return;  // no safe copy on this system: a shared mapping is not read
    scan_root(reinterpret_cast<const unsigned char*>(begin), reinterpret_cast<const unsigned char*>(end));
    return;
  }
  // An unreadable page is skipped up to the next page of the system's, not of os::page_size(),
  // which may be larger: the rest of a larger page may be readable and hold roots.
  const std::size_t page = os::process::protection_granularity();
  while (single_threaded_ && !in_shared_ && begin < end) {
    const std::size_t n = std::min<std::size_t>(end - begin, probe_bytes);
    const auto readable = os::process::readable_prefix(reinterpret_cast<const void*>(begin), n);
    if (!readable) {
      single_threaded_ = false;  // the system cannot tell: copy instead
      break;
    }
    if (readable.value() > 0) {
      const auto* at = reinterpret_cast<const unsigned char*>(begin);
      scan_root(at, at + readable.value());
      drain();
      begin += readable.value();
    }
    if (readable.value() < n) begin = (begin | (page - 1)) + 1;  // unreadable page: skip it
  }
  while (begin < end) {
    const std::size_t n = std::min<std::size_t>(end - begin, copy_bytes);
    const auto got = os::process::read_memory(reinterpret_cast<const void*>(begin), copy_, n);
    if (!got) {
      direct_reads_ = true;  // no safe copy on this system: read in place
      if (!in_shared_) scan_root(reinterpret_cast<const unsigned char*>(begin), reinterpret_cast<const unsigned char*>(end));
      return;
    }
    if (got.value() > 0) {
      scan_root(copy_, copy_ + got.value());
      drain();  // the blocks this chunk reached, while the stack is shallow
      begin += got.value();
    } else {
      begin = (begin | (page - 1)) + 1;  // unreadable page: skip it
    }
  }
}

void leak_scanner::exclude(std::uintptr_t begin, std::uintptr_t end) noexcept {
  if (begin >= end || excluded_count_ == excluded_capacity_) return;
  excluded_[excluded_count_++] = {begin, end};
}

// Blocks of another general_allocator instance (a private one, or the global one seen from a
// private one) may point into this one: the blocks of their in-use pages that may be live are
// roots (scan_untracked_page()).
void leak_scanner::scan_other_instance(const segment* s) noexcept {
  if (s->kind == segment_kind::huge) {
    if (s->huge_live) {
      const auto* start = reinterpret_cast<const unsigned char*>(s->pages[0].start);
      scan(start, start + s->huge_size);
    }
    return;
  }
  for (unsigned i = 0; i < s->page_count; ++i) {
    const page& pg = s->pages[i];
    if (!pg.in_use || pg.used == 0) continue;
    scan_untracked_page(s, pg);
  }
}

// The blocks of a page this scan has no marks for (another instance's, or this one's from before
// debug mode) are roots, but a freed block is not: it holds what its last owner left there, old
// pointers among it (LeakSanitizer and memcheck never read freed blocks). Which blocks are free is
// known without a race only in the calling thread's pages: no other thread takes blocks from their
// free list while this thread reports, and only this thread collects their frees from other
// threads (a list others only push onto, so the blocks on it now stay free). There the blocks on
// both lists, and in a debug page those whose record is not live (blocks in the quarantine), are
// skipped. Another thread's page, or one whose lists do not look sound, is read whole: a block
// taken from its list while the scan runs may hold a pointer already.
void leak_scanner::scan_untracked_page(const segment* s, const page& pg) noexcept {
  const auto* start = reinterpret_cast<const unsigned char*>(pg.start);
  const std::size_t bs = pg.block_size;
  const std::size_t n = pg.capacity;
  std::uint64_t free_bits[max_untracked_blocks / 64];
  if (n > max_untracked_blocks || bs == 0 || !is_current_thread(s->thread_id.load(std::memory_order_relaxed)) ||
      !free_blocks_of(pg, free_bits)) {
    scan(start, start + n * bs);
    return;
  }
  const auto is_free = [&](std::size_t b) { return ((free_bits[b >> 6] >> (b & 63)) & 1) != 0; };
  for (std::size_t b = 0; b < n;) {
    while (b < n && is_free(b)) ++b;
    std::size_t e = b;
    while (e < n && !is_free(e)) ++e;
    if (e > b) scan(start + b * bs, start + e * bs);  // a run of blocks that may be live, at once
    b = e;
  }
}

// Sets the bit of each free block of `pg` (a page of the calling thread) in `bits`. False when a
// list leaves the page's blocks, lands between two, or is longer than the page.
bool leak_scanner::free_blocks_of(const page& pg, std::uint64_t* bits) noexcept {
  const std::size_t n = pg.capacity;
  const std::size_t bs = pg.block_size;
  const auto first = reinterpret_cast<std::uintptr_t>(pg.start);
  std::memset(bits, 0, (n + 63) / 64 * sizeof(std::uint64_t));
  std::size_t count = 0;
  const auto take = [&](const block* list) {
    for (const block* b = list; b != nullptr; b = b->next) {
      const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(b);
      if (at < first || (at - first) % bs != 0) return false;
      const std::size_t index = (at - first) / bs;
      if (index >= n || ((bits[index >> 6] >> (index & 63)) & 1) != 0 || ++count > n) return false;
      bits[index >> 6] |= std::uint64_t{1} << (index & 63);
    }
    return true;
  };
  if (!take(pg.free)) return false;
  if (!take(reinterpret_cast<const block*>(pg.thread_free.load(std::memory_order_acquire) & ~tf_state_mask))) return false;
  if (pg.debug && pg.records != nullptr) {
    for (std::size_t i = 0; i < n; ++i) {
      if (live_sizes(&pg)[i] == 0) bits[i >> 6] |= std::uint64_t{1} << (i & 63);
    }
  }
  return true;
}

// A root mapping, minus memkit's own memory: segments (found by the segment map, a 4 MiB chunk at
// a time) and the excluded ranges.
void leak_scanner::scan_root_range(std::uintptr_t begin, std::uintptr_t end) noexcept {
  while (begin < end) {
    const std::uintptr_t chunk = begin & ~segment_mask;
    if (segment_map_contains(chunk)) {
      const auto* s = reinterpret_cast<const segment*>(chunk);
      if (s->instance != im_) scan_other_instance(s);
      const std::size_t span = std::max(segment_size, detail::align_up(s->reserved_bytes, segment_size));
      begin = chunk + span;
      continue;
    }
    std::uintptr_t stop = std::min(end, chunk + segment_size);
    // The first excluded range that ends after `begin`.
    const address_range* e = std::upper_bound(excluded_, excluded_ + excluded_count_, begin,
                                              [](std::uintptr_t x, const address_range& r) { return x < r.end; });
    if (e != excluded_ + excluded_count_ && e->begin < stop) {
      if (e->begin > begin) scan_foreign(begin, e->begin);
      begin = e->end;
      continue;
    }
    scan_foreign(begin, stop);
    begin = stop;
  }
}

// Phase 1's scan of the reached blocks, in mark order (address order within each page, pages in
// the order of their segments): a block's words, its size and its mark are read in sequence, so
// that each of the blocks reached from the roots costs no cache miss of its own, where taking them
// in the order they were reached (a pointer's, random) costs one or more per block. A block
// reached from one the sweep scans is only marked when it lies ahead, and scanned at once (the
// stack) when it lies behind.
void leak_scanner::sweep() noexcept {
  root_bytes_ = scanned_bytes_;  // the roots only marked what they reached; the blocks start here
  const auto scan_if_reached = [&](std::size_t m, const unsigned char* start, std::size_t size) {
    if (!is_set(m) || marks_[m] == not_live) return;
    marks_[m] = reachable;
    finger_ = m + 1;
    scan_block(start, size);
    if (depth_ != 0) drain();
  };
  for (heap* h = im_->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      const segment_slot* slot = nullptr;
      for (unsigned i = 0; i < s->page_count; ++i) {
        const page* pg = &s->pages[i];
        if (!pg->in_use || !pg->debug) continue;
        if (slot == nullptr) slot = slot_of(s);
        if (slot == nullptr) break;
        const std::size_t base = slot->base[i];
        const auto* start = reinterpret_cast<const unsigned char*>(pg->start);
        const bool prefetch_next_page = pg->block_size >= 1024;
        for (std::size_t b = 0; b < pg->capacity; ++b) {
          // Whole words of the bitmap with no reached block are passed at once.
          if ((b & 63) == 0 && ((base + b) & 63) == 0 && b + 64 <= pg->capacity && reached_[(base + b) >> 6] == 0) {
            b += 63;
            continue;
          }
          // The hardware's prefetcher stops at each 4 KiB page: the next page's first line is asked
          // for while this block is scanned (for blocks of 1 KiB or more: one request per block).
          if (prefetch_next_page) MEMKIT_PREFETCH(start + b * pg->block_size + 4096);
          scan_if_reached(base + b, start + b * pg->block_size, sizes_[base + b]);
        }
      }
    }
  }
  for (std::size_t i = 0; i < huge_count_; ++i) {
    const segment* s = huge_[i].s;
    scan_if_reached(page_blocks_ + i, reinterpret_cast<const unsigned char*>(s->pages[0].start), s->huge_requested);
  }
  // What the first pass left pending: further passes in mark order, until none is left.
  passes_ = true;
  while (any_pending()) pending_pass();
  passes_ = false;
  finger_ = SIZE_MAX;
}

std::size_t leak_scanner::next_pending(std::size_t m) const noexcept {
  // Up: the first level whose word holds a bit at or after the position (the top level is one
  // word).
  std::size_t l = 0;
  std::size_t at = m;
  for (;;) {
    if ((at >> 6) >= pending_words_[l]) return SIZE_MAX;  // past the end: nothing at this level or above
    const std::uint64_t word = pending_[l][at >> 6] & (~std::uint64_t{0} << (at & 63));
    if (word != 0) {
      at = (at & ~std::size_t{63}) | static_cast<std::size_t>(std::countr_zero(word));
      break;
    }
    if (l + 1 == levels_) return SIZE_MAX;
    ++l;
    at = (at >> 6) + 1;
  }
  // Down: the lowest bit under it.
  for (; l > 0; --l) at = (at << 6) | static_cast<std::size_t>(std::countr_zero(pending_[l - 1][at]));
  return at;
}

// One pass over the pending set in mark order: blocks reached ahead of it join this pass, those
// behind go on the stack (up to stack_limit) or wait for the next pass.
void leak_scanner::pending_pass() noexcept {
  stacked_ = 0;
  std::size_t run = 0;
  // A cursor runs a few pending blocks ahead and asks for their first lines: in a sparse set (a
  // clique of blocks that hold few pointers) each block is otherwise a cache miss of its own. It
  // is a hint: blocks that join the pass behind the cursor are scanned without one.
  constexpr std::size_t lookahead = 16;
  std::size_t cursor = 0;
  std::size_t cursor_run = 0;
  std::size_t requested = 0;
  const auto request_ahead = [&] {
    for (; requested < lookahead; ++requested) {
      cursor = next_pending(cursor + 1);
      if (cursor >= page_blocks_) {  // the end, or the huge blocks
        cursor = SIZE_MAX - 1;
        requested = lookahead;
        return;
      }
      MEMKIT_PREFETCH(page_block_start(cursor, cursor_run));
    }
  };
  for (std::size_t m = next_pending(0); m != SIZE_MAX; m = next_pending(m)) {
    if (m >= page_blocks_) {
      clear_pending(m);
      finger_ = m + 1;
      marks_[m] = new_mark_;
      const segment* s = huge_[m - page_blocks_].s;
      const auto* start = reinterpret_cast<const unsigned char*>(s->pages[0].start);
      scan_block(start, s->huge_requested);
      if (depth_ != 0) drain();
      ++m;
      continue;
    }
    // The pending blocks of this word of the set, lowest first; the word is read again after each
    // block, whose scan may add blocks ahead of it.
    std::uint64_t& word = pending_[0][m >> 6];
    const std::size_t word_base = m & ~std::size_t{63};
    std::uint64_t bits = word & (~std::uint64_t{0} << (m & 63));
    while (bits != 0) {
      m = word_base | static_cast<std::size_t>(std::countr_zero(bits));
      if (m >= page_blocks_) break;  // a huge block: the loop above
      word &= ~(std::uint64_t{1} << (m & 63));
      finger_ = m + 1;
      marks_[m] = new_mark_;
      const unsigned char* start = page_block_start(m, run);
      if (runs_[run].block_size >= 1024) MEMKIT_PREFETCH(start + 4096);
      if (cursor < m) {
        cursor = m;
        cursor_run = run;
        requested = 0;
      }
      if (requested != 0) --requested;
      request_ahead();
      scan_block(start, sizes_[m]);
      if (depth_ != 0) drain();
      bits = word & (~std::uint64_t{0} << (m & 63));
    }
    if (bits != 0) continue;  // the huge block
    if (word == 0) clear_pending(word_base);  // the levels above: the bit is clear already here
    m = word_base + 64;  // (the loop's next_pending(m) looks on from the next word)
  }
}


void leak_scanner::mark_reachable(const calling_thread_roots& caller, bool alone,
                                  const os::process::stopped_threads* others) noexcept {
  new_mark_ = reachable;
  leader_ = SIZE_MAX;
  finger_ = 0;  // the roots only mark the blocks they reach; sweep() scans them
  // memkit's own memory that is not segments: never roots.
  {
    lock_guard guard(im_->lock);
    if (im_->quarantine != nullptr) {
      const auto q = reinterpret_cast<std::uintptr_t>(im_->quarantine);
      exclude(q, q + im_->quarantine_slots * sizeof(void*));
    }
    for (segment* s = im_->huge_live; s != nullptr; s = s->next) {
      exclude(reinterpret_cast<std::uintptr_t>(s), reinterpret_cast<std::uintptr_t>(s) + s->reserved_bytes);
    }
    for (segment* s = im_->huge_cached; s != nullptr; s = s->next) {
      exclude(reinterpret_cast<std::uintptr_t>(s), reinterpret_cast<std::uintptr_t>(s) + s->reserved_bytes);
    }
  }
  for (const scratch* own : {&slots_memory_, &marks_memory_, &sizes_memory_, &reached_memory_, &huge_memory_,
                             &stack_memory_, &excluded_memory_, &copy_memory_, &entries_memory_, &chunks_memory_, &runs_memory_}) {
    exclude(own->begin(), own->end());
  }
  exclude(reinterpret_cast<std::uintptr_t>(&segment_map[0]), reinterpret_cast<std::uintptr_t>(&segment_map[segment_map_words]));
  // The debug records (stack traces and sizes, mapped per page): no roots, and in a heap of small
  // blocks more bytes than the blocks themselves.
  for (heap* h = im_->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      for (unsigned i = 0; i < s->page_count; ++i) {
        const page& pg = s->pages[i];
        if (!pg.in_use || !pg.debug || pg.records == nullptr) continue;
        const auto records = reinterpret_cast<std::uintptr_t>(pg.records);
        exclude(records, records + pg.records_bytes);
      }
    }
  }
  // Blocks from before debug mode: roots.
  for (heap* h = im_->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      for (unsigned i = 0; i < s->page_count; ++i) {
        const page& pg = s->pages[i];
        if (!pg.in_use || pg.debug || pg.used == 0) continue;
        scan_untracked_page(s, pg);
        drain();
      }
    }
  }
  {
    lock_guard guard(im_->lock);
    for (segment* s = im_->huge_live; s != nullptr; s = s->next) {
      if (s->pages[0].debug) continue;
      const auto* start = reinterpret_cast<const unsigned char*>(s->pages[0].start);
      scan(start, start + s->huge_size);
    }
  }
  drain();
  // This thread's registers (a snapshot here, the caller's callee-saved ones stored before the
  // report began, and below exit() those exit()'s caller kept), then every writable mapping, but
  // for the frames of the exit path.
  const auto scan_object = [this](const void* p, std::size_t bytes) {
    scan(static_cast<const unsigned char*>(p), static_cast<const unsigned char*>(p) + bytes);
  };
  scan_object(caller.registers, caller.register_bytes);
  if (caller.saved != nullptr) scan_object(caller.saved, caller.saved_bytes);
  if (caller.exit != nullptr) {
    scan_object(caller.exit->caller_registers, caller.exit->register_count * sizeof(std::uintptr_t));
    for (std::size_t i = 0; i < caller.exit->frame_count; ++i) exclude(caller.exit->frames[i].begin, caller.exit->frames[i].end);
  }
  drain();
  // The other threads' registers (stopped by the caller: report_lost_blocks()).
  if (others != nullptr) {
    others_ = others;
    exclude(others->storage_begin(), others->storage_end());
    for (std::size_t i = 0; i < others->count(); ++i) {
      const auto t = others->at(i);
      const auto* words = static_cast<const unsigned char*>(t.registers);
      scan(words, words + t.register_bytes);
    }
    drain();
  }
  std::sort(excluded_, excluded_ + excluded_count_,
            [](const address_range& a, const address_range& b) { return a.begin < b.begin; });
  stack_low_ = caller.stack_low;
  threads_known_ = alone || others_ != nullptr;
  canary_check_bytes_ = alone && !im_->forked_mid_operation
                            ? std::min<std::size_t>(im_->self->current_options().canary_bytes, 16)
                            : 0;
  // (Under AddressSanitizer the roots hold bytes it poisoned, the redzones of globals and frames,
  // which a read in place would report: copied there.)
  single_threaded_ = !MEMKIT_HAS_ASAN && threads_known_;
  // Readable and writable. Shared ones too (System V shared memory, MAP_SHARED anonymous memory
  // and memfds, shared files), as memcheck reads them: a pointer kept only there reaches its block.
  // They are read through copies (scan_foreign()), since a shared file, or a memfd another
  // process shrinks, may end before its mapping does and a read in place past its end would fault.
  (void)os::process::for_each_region(
      [](const os::process::region& r, void* context) {
        auto* self = static_cast<leak_scanner*>(context);
        const bool after_guard = r.begin == self->guard_end_;
        self->guard_end_ = r.readable ? 0 : r.end;
        if (!r.readable || !r.writable || r.end - r.begin > largest_root_mapping) return true;
        self->in_code_ = r.executable;
        self->in_shared_ = !r.is_private;
        self->scan_touched(self->live_part_of(r, after_guard), r.end);
        self->in_code_ = self->in_shared_ = false;
        return true;
      },
      this);
  sweep();
  others_ = nullptr;
}

// Where a stack holds the caller's or a stopped thread's stack pointer, only the frames from that
// pointer up are live (a thread's red zone below it included); other mappings are read whole. A
// stopped thread's pointer trims only a mapping that is a stack of its own: the main thread's, or
// one right above a guard (how threads' stacks and guarded coroutine stacks are mapped). A thread
// running on a stack carved from a larger mapping (coroutine stacks side by side, no guards) may
// have live stacks below its own in it: that mapping is read whole, as LeakSanitizer reads a
// thread's whole stack when its pointer lies outside it.
// A guarded mapping no live thread's stack pointer lies in, but an exited thread's control block
// does (its thread pointer), is the stack that thread left: glibc keeps it mapped for a thread to
// come, with the dead frames and the static TLS below the control block still holding what they
// last held. Only the control block up is read (it holds glibc's own pointers, such as the
// dynamic TLS vector). So a block an exited thread held only in a local or a thread_local is lost,
// as LeakSanitizer (which reads live threads only) and valgrind (whose exit-time libc clean-up
// unmaps those stacks first) report it; read whole, it was reachable when a stale word survived.
std::uintptr_t leak_scanner::live_part_of(const os::process::region& r, bool after_guard) const noexcept {
  if (stack_low_ >= r.begin && stack_low_ < r.end) return stack_low_ & ~std::uintptr_t{7};
  if (!after_guard && std::strcmp(r.name, "[stack]") != 0) return r.begin;
  for (std::size_t i = 0; others_ != nullptr && i < others_->count(); ++i) {
    const std::uintptr_t sp = others_->at(i).stack_pointer;
    if (sp < r.begin || sp >= r.end) continue;
    const std::uintptr_t low = sp - os::process::stopped_threads::red_zone_bytes;
    return low > r.begin ? low & ~std::uintptr_t{7} : r.begin;
  }
  for (std::size_t i = 0; threads_known_ && after_guard && i < exited_count_; ++i) {
    if (exited_[i] >= r.begin && exited_[i] < r.end) return exited_[i] & ~std::uintptr_t{7};
  }
  return r.begin;
}

// Mappings are read only where the process ever touched them (os::process::touched_pages): a page
// it never touched holds zeros, or its file's bytes, and reading it would fault. Reservations of
// other allocators and runtimes are mostly such pages, and so are the unused depths of stacks. A
// compiler's collected heap, mapped in pieces of a few MiB, leaves 5 MiB of them among 180 MiB of
// roots (g++ -O1 on bench/real_programs/templates.cpp, 6 runs each, alternated: 56-69 ms of scan
// CPU when every mapping under 64 MiB was read whole, 31-52 asking first). A swapped-out page
// counts as touched and is read. A mapping of a few pages is read whole: asking costs more.
void leak_scanner::scan_touched(std::uintptr_t begin, std::uintptr_t end) noexcept {
  constexpr std::size_t small_mapping = std::size_t{64} << 10;
  if (end - begin <= small_mapping) {
    scan_root_range(begin, end);
    drain();
    return;
  }
  const std::size_t page = os::page_size();
  constexpr std::size_t step = std::size_t{8} << 20;
  unsigned char touched[step / 4096];
  for (std::uintptr_t chunk = begin & ~(page - 1); chunk < end; chunk += step) {
    const std::uintptr_t chunk_end = std::min<std::uintptr_t>(end, chunk + step);
    const std::size_t pages = (chunk_end - chunk + page - 1) / page;
    if (!os::process::touched_pages(reinterpret_cast<const void*>(chunk), chunk_end - chunk, touched)) {
      scan_root_range(std::max(chunk, begin), chunk_end);  // cannot tell: scan it all
      drain();
      continue;
    }
    for (std::size_t i = 0; i < pages;) {
      if ((touched[i] & 1) == 0) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < pages && (touched[j] & 1) != 0) ++j;
      scan_root_range(std::max(chunk + i * page, begin), std::min(chunk + j * page, chunk_end));
      drain();
      i = j;
    }
  }
}

// Phase 2: the lost blocks (reached bit still clear) in mark order; each one no clique reached
// yet leads one, definitely lost, and every lost block it reaches, directly or not, that no clique
// reached before is indirectly lost. A clique is walked from its leader as phase 1 walks what it
// reaches behind its sweep: depth first from the stack while it is small (most cliques are a
// block or a short list), and past the stack's bound with pending passes, so that a large one is
// read in address order. (A depth-first walk of every clique read a large one in the order
// pointers reach its blocks, a cache miss each: 2.8-3.8 CPU s per GiB of 80-byte blocks, every
// one lost, against 1.8-2.1 with the passes; and, without phase 1's per-page bit, 0.94-0.98 per
// GiB of 4 KiB blocks against 0.40-0.58. Starting every clique with a pending pass cost 1.5-1.6
// times as much where each lost block is a clique of its own.) A leader reached from a later
// clique becomes indirectly lost (newly_reached()).
void leak_scanner::mark_lost() noexcept {
  new_mark_ = indirectly_lost;
  passes_ = true;
  const std::size_t marks = page_blocks_ + huge_count_;
  std::size_t run = 0;
  for (std::size_t i = 0; i * 64 < marks; ++i) {
    std::uint64_t ahead = marks - i * 64 >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << (marks - i * 64)) - 1;
    for (;;) {
      const std::uint64_t open = ~reached_[i] & ahead;  // (earlier leaders' bits are clear too)
      if (open == 0) break;
      const auto b = static_cast<unsigned>(std::countr_zero(open));
      const std::size_t m = i * 64 + b;
      ahead &= b == 63 ? 0 : ~std::uint64_t{0} << (b + 1);
      const unsigned char* start;
      std::size_t size;
      if (m < page_blocks_) {
        start = page_block_start(m, run);
        size = sizes_[m];
      } else {
        const segment* s = huge_[m - page_blocks_].s;
        start = reinterpret_cast<const unsigned char*>(s->pages[0].start);
        size = s->huge_requested;
      }
      leader_ = m;
      finger_ = SIZE_MAX;  // every block it reaches lies behind: the stack, then the passes
      stacked_ = 0;
      scan_block(start, size);
      drain();
      while (any_pending()) pending_pass();
      marks_[m] = definitely_lost;
    }
  }
  leader_ = SIZE_MAX;
  passes_ = false;
  finger_ = SIZE_MAX;
}

void leak_scanner::group(general_allocator::leak_summary& summary) noexcept {
  constexpr std::size_t record_lookahead = 16;
  const bool list_reachable = im_->self->current_options().report_reachable;
  // Group by (class, stack) in an open-addressing table that doubles when half full. (Sized for
  // every live block up front, it took 56 bytes per block, huge pages zero-filled wherever a
  // group landed, and a read of all of it to compact a report of a few groups.)
  std::size_t& capacity = table_capacity_;
  std::size_t& current = table_current_;
  leak_group*& table = table_;
  std::size_t& groups = table_groups_;
  capacity = 1024;
  table = static_cast<leak_group*>(table_memory_[current].get(capacity * sizeof(leak_group)));
  const auto insert = [](leak_group* t, std::size_t c, const leak_group& g) {
    std::size_t slot = g.hash & (c - 1);
    while (t[slot].blocks != 0) slot = (slot + 1) & (c - 1);
    t[slot] = g;
  };
  const auto grow = [&] {
    auto* bigger = static_cast<leak_group*>(table_memory_[1 - current].get(2 * capacity * sizeof(leak_group)));
    if (bigger == nullptr) return;  // this one fills up instead (groups past that are not listed)
    for (std::size_t i = 0; i < capacity; ++i) {
      if (table[i].blocks != 0) insert(bigger, 2 * capacity, table[i]);
    }
    table_memory_[current].reset();
    current = 1 - current;
    table = bigger;
    capacity *= 2;
  };
  for_each_live_block([&](const unsigned char* start, std::size_t size, std::uint8_t* flags, const page* pg,
                          std::size_t index, const segment* large) {
    const std::uint8_t mark = *flags;
    switch (mark) {
      case definitely_lost:
        ++summary.definitely_lost_blocks;
        summary.definitely_lost_bytes += size;
        break;
      case indirectly_lost:
        ++summary.indirectly_lost_blocks;
        summary.indirectly_lost_bytes += size;
        break;
      default:
        ++summary.reachable_blocks;
        summary.reachable_bytes += size;
        if (!list_reachable) return;
        break;
    }
    if (table == nullptr) return;
    // Only now, for the blocks the report lists, the record with the allocation stack.
    void* const* frames;
    std::size_t frame_count;
    bool captured;
    if (pg != nullptr) {
      // The records lie in address order, a few hundred bytes apart: the next ones' lines are
      // asked for while this one is hashed (lost blocks are mostly listed in runs).
      if (index + record_lookahead < pg->capacity) {
        const auto* ahead = reinterpret_cast<const unsigned char*>(record_of(pg, index + record_lookahead));
        MEMKIT_PREFETCH(ahead);
        MEMKIT_PREFETCH(ahead + 64);
      }
      debug_record* r = record_of(pg, index);
      frames = alloc_frames(r);
      frame_count = r->alloc_frames;
      captured = pg->record_frames != 0;
    } else {
      frames = large->huge_frames;
      frame_count = large->huge_alloc_frames;
      captured = large->pages[0].record_frames != 0;
    }
    const std::uint8_t kind = mark == unmarked ? std::uint8_t{reachable} : mark;
    const std::uint64_t h = hash_frames(frames, frame_count, kind);
    std::size_t slot = h & (capacity - 1);
    for (;; slot = (slot + 1) & (capacity - 1)) {
      leak_group& g = table[slot];
      if (g.blocks == 0) {
        if (groups + 1 == capacity) return;  // full (no memory to grow): counted, not listed
        g.hash = h;
        std::copy(frames, frames + frame_count, g.frames);
        g.frame_count = frame_count;
        g.captured = captured;
        g.mark = kind;
        g.blocks = 1;
        g.bytes = size;
        g.sample = start;
        if (2 * ++groups > capacity) grow();
        return;
      }
      if (g.hash == h && g.mark == kind && g.frame_count == frame_count &&
          std::memcmp(g.frames, frames, frame_count * sizeof(void*)) == 0) {
        ++g.blocks;
        g.bytes += size;
        return;
      }
    }
  });
}

// The report's last line: blocks and bytes of each class.
void write_summary(report_writer& out, const general_allocator::leak_summary& summary) noexcept {
  out.begin("leak-summary", nullptr, 0,
            "leak summary: definitely lost: %zu bytes in %zu blocks; indirectly lost: %zu bytes in %zu "
            "blocks; still reachable: %zu bytes in %zu blocks; suppressed: %zu bytes in %zu blocks",
            summary.definitely_lost_bytes, summary.definitely_lost_blocks, summary.indirectly_lost_bytes,
            summary.indirectly_lost_blocks, summary.reachable_bytes, summary.reachable_blocks,
            summary.suppressed_bytes, summary.suppressed_blocks);
  out.number("definitely_lost_blocks", summary.definitely_lost_blocks);
  out.number("definitely_lost_bytes", summary.definitely_lost_bytes);
  out.number("indirectly_lost_blocks", summary.indirectly_lost_blocks);
  out.number("indirectly_lost_bytes", summary.indirectly_lost_bytes);
  out.number("reachable_blocks", summary.reachable_blocks);
  out.number("reachable_bytes", summary.reachable_bytes);
  out.number("suppressed_blocks", summary.suppressed_blocks);
  out.number("suppressed_bytes", summary.suppressed_bytes);
  out.end();
}

std::size_t leak_scanner::write(int fd, general_allocator::leak_summary& summary) noexcept {
  const general_allocator::options& o = im_->self->current_options();
  const bool list_reachable = o.report_reachable;
  leak_group* const table = table_;
  const std::size_t capacity = table_capacity_;
  std::size_t lost = summary.definitely_lost_blocks + summary.indirectly_lost_blocks;
  if (table == nullptr) return lost;
  // Compact, then largest first (definitely lost before indirectly lost before reachable on ties).
  std::size_t n = 0;
  for (std::size_t i = 0; i < capacity; ++i) {
    if (table[i].blocks != 0) table[n++] = table[i];
  }
  std::sort(table, table + n, [](const leak_group& a, const leak_group& b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.mark != b.mark) return a.mark > b.mark;
    return a.blocks > b.blocks;
  });
  report_writer out(fd, o.format);
  for (std::size_t i = 0; i < n; ++i) {
    const leak_group& g = table[i];
    const char* kind = g.mark == definitely_lost ? "definitely lost" : g.mark == indirectly_lost ? "indirectly lost" : "still reachable";
    if (g.mark != reachable && suppressed(o.suppressions, g.frames, g.captured ? g.frame_count : 0)) {
      // Counted apart, as memcheck and LeakSanitizer do: the classes hold what is reported.
      summary.suppressed_blocks += g.blocks;
      summary.suppressed_bytes += g.bytes;
      if (g.mark == definitely_lost) {
        summary.definitely_lost_blocks -= g.blocks;
        summary.definitely_lost_bytes -= g.bytes;
      } else {
        summary.indirectly_lost_blocks -= g.blocks;
        summary.indirectly_lost_bytes -= g.bytes;
      }
      lost -= g.blocks;
      continue;
    }
    out.begin(g.mark == reachable ? "reachable" : "leak", g.sample, g.bytes, "%zu block%s, %zu bytes, %s (%s " MEMKIT_ADDRESS ")",
              g.blocks, g.blocks == 1 ? "" : "s", g.bytes, kind, g.blocks == 1 ? "at" : "one at", diagnostics::address(g.sample));
    out.word("class", kind);
    out.number("blocks", g.blocks);
    out.number("bytes", g.bytes);
    out.stack("allocated at", g.frames, g.frame_count, g.captured);
    out.end();
  }
  if (summary.definitely_lost_blocks + summary.indirectly_lost_blocks != 0 || list_reachable) {
    write_summary(out, summary);
  }
  return lost;
}

}  // namespace

std::size_t general_allocator::impl::report_lost_blocks(int fd, const gpa::calling_thread_roots& caller,
                                                       general_allocator::leak_summary& summary) noexcept {
  const std::uint64_t start = os::thread_cpu_ns();
  // The other threads, stopped before anything is read (which blocks are live, the tables, the
  // roots) until phase 1 ends, so that the heap is read as it is at one moment: no block is
  // freed or allocated between the tables and the scan (a block freed meanwhile was reported
  // lost, a page released meanwhile faulted the scan), what a thread holds only in a register or
  // in dead frames below its stack pointer is seen, and no pointer moves between a root read and
  // a block not read yet. Under the lock, so that no thread is stopped while it links or unlinks
  // a segment of its heap; from the stop to the end of phase 1 no other lock is taken (a stopped
  // thread may hold one). Where threads cannot be stopped, they run.
  const auto threads = os::process::thread_count();
  const bool alone = threads && threads.value() == 1;
  os::process::stopped_threads others;
  os::status stop;
  if (!alone) {
    lock_guard guard(lock);
    stop = others.stop();
  }
  const bool stopped = !alone && stop;
  leak_scanner scanner(this);
  if (!scanner.prepare()) {
    report_writer(fd, self->options_.format)
        .note("error", "leak report: cannot map memory for the scan; no report");
    return 0;
  }
  if (scanner.live_blocks() == 0) {
    // Nothing live: nothing to scan. Asked to list the reachable blocks too, the user still gets
    // the summary (all zeros), as every other report ends.
    if (self->options_.report_reachable) {
      report_writer out(fd, self->options_.format);
      write_summary(out, summary);
    }
    return 0;
  }
  scanner.mark_reachable(caller, alone, stopped ? &others : nullptr);
  scanner.mark_lost();
  const std::uint64_t scanned = os::thread_cpu_ns();  // the scan's cost ends here; the report's begins
  scanner.group(summary);
  // Everything below reads only what the scan copied: the threads may run (the report symbolizes
  // its stacks, which takes the loader's lock and allocates).
  others.resume();
  for (std::size_t i = 0; i < scanner.overflowed_count(); ++i) report_live_overflow(scanner.overflowed()[i]);
  if (scanner.checked_canaries()) check_live_guards();
  const std::size_t lost = scanner.write(fd, summary);
  if (lost != 0 && !alone && !stopped) {
    report_writer(fd, self->options_.format)
        .note("warning",
              "leak report: the other threads could not be stopped (%s), so their registers were not read: a "
              "block only a register of theirs held is counted lost above",
              os::error_message(stop.error()));
  }
  summary.root_bytes = scanner.root_bytes();
  summary.scan_cpu_ns = scanned - start;
  summary.writing_cpu_ns = os::thread_cpu_ns() - scanned;
  return lost;
}

}  // namespace memkit
