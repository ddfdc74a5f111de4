// block_heap: construction, runs of blocks (best fit through the run-length bitmap, O(1)
// coalescing), sub-block size classes, free without size, and in-place resize.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>

#include "internal.hpp"
#include "memkit/os.hpp"

namespace memkit {

using namespace block_heap_detail;

namespace {

// Sub-block slot sizes: 16-byte steps to 128, then four per doubling. Every one is a multiple of
// 16, so every slot is aligned for max_align_t; the powers of two also serve larger alignments.
constexpr std::uint32_t class_bytes[] = {16,  32,  48,  64,  80,   96,   112,  128,
                                         160, 192, 224, 256, 320,  384,  448,  512,
                                         640, 768, 896, 1024, 1280, 1536, 1792, 2048};

constexpr std::size_t minimum_block_size = 256;
constexpr std::size_t maximum_block_size = std::size_t{1} << 30;
constexpr std::size_t maximum_guard_bytes = std::size_t{1} << 20;
constexpr std::size_t maximum_blocks = npos - 1;

}  // namespace

const char* to_string(block_heap_failure failure) noexcept {
  switch (failure) {
    case block_heap_failure::none: return "none";
    case block_heap_failure::invalid_argument: return "invalid argument";
    case block_heap_failure::too_large: return "too large for the region";
    case block_heap_failure::out_of_memory: return "out of memory";
    case block_heap_failure::fragmentation: return "fragmentation";
    case block_heap_failure::commit_failed: return "commit failed";
    case block_heap_failure::no_region: return "no region";
  }
  return "?";
}

// ---- construction -----------------------------------------------------------------------------

namespace {
bool usable_options(const block_heap_options& o) noexcept {
  return detail::is_power_of_two(o.block_size) && o.block_size >= minimum_block_size &&
         o.block_size <= maximum_block_size && o.guard_bytes <= maximum_guard_bytes;
}
}  // namespace

block_heap::block_heap(std::size_t region_bytes, const block_heap_options& options) noexcept
    : options_(options) {
  if (!usable_options(options) || region_bytes == 0 ||
      region_bytes > maximum_blocks * options.block_size) {
    os_error_ = EINVAL;
    return;
  }
  const std::size_t bs = options.block_size;
  const std::size_t blocks = (region_bytes + bs - 1) / bs;
  const std::size_t bytes = detail::align_up(blocks * bs, os::page_size());
  auto reserved = bs > os::reservation_granularity() ? os::reserve_aligned(bytes, bs)
                                                     : os::reserve(bytes);
  if (!reserved) {
    os_error_ = reserved.error();
    return;
  }
  reserved_ = static_cast<std::byte*>(reserved.value());
  reserved_bytes_ = bytes;
  if (options.commit == commit_policy::up_front) {
    if (auto s = os::commit(reserved_, bytes); !s) {
      os_error_ = s.error();
      (void)os::release(reserved_, reserved_bytes_);
      reserved_ = nullptr;
      return;
    }
  }
  if (!initialize(reserved_, blocks)) {
    (void)os::release(reserved_, reserved_bytes_);
    reserved_ = nullptr;
  }
}

block_heap::block_heap(void* buffer, std::size_t bytes, const block_heap_options& options) noexcept
    : options_(options) {
  if (!usable_options(options) || buffer == nullptr) {
    os_error_ = EINVAL;
    return;
  }
  const std::size_t bs = options.block_size;
  auto start = reinterpret_cast<std::uintptr_t>(buffer);
  auto aligned = detail::align_up(start, bs);
  if (aligned < start || aligned - start >= bytes) {
    os_error_ = EINVAL;
    return;
  }
  const std::size_t blocks = std::min((bytes - (aligned - start)) / bs, maximum_blocks);
  if (blocks == 0) {
    os_error_ = EINVAL;
    return;
  }
  initialize(reinterpret_cast<std::byte*>(aligned), blocks);
}

bool block_heap::initialize(std::byte* base, std::size_t block_count) noexcept {
  static_assert(sizeof(tag) == 32, "a tag should stay at 32 bytes: metadata is per block");
  const std::size_t bs = options_.block_size;
  block_size_ = bs;
  block_shift_ = static_cast<unsigned>(std::countr_zero(bs));

  // Run-length bitmap: level 0 has one bit per length (index length - 1), each level above one
  // bit per word below, up to a single word.
  std::size_t words_total = 0;
  std::size_t bits = block_count;
  levels_ = 0;
  do {
    std::size_t words = (bits + 63) / 64;
    bitmap_words_[levels_++] = words;
    words_total += words;
    bits = words;
  } while (bits > 1 && levels_ < max_levels);
  if (bits > 1) {
    os_error_ = EINVAL;
    return false;
  }

  // Commit steps (on_demand and for decommit_free_runs); a user buffer is always committed.
  const std::size_t step_blocks = std::max<std::size_t>(1, commit_granularity / bs);
  commit_shift_ = static_cast<unsigned>(std::countr_zero(step_blocks));
  commit_steps_ = reserved_ != nullptr ? (block_count + step_blocks - 1) / step_blocks : 0;
  const std::size_t commit_words = (commit_steps_ + 63) / 64;

  auto round8 = [](std::size_t x) { return detail::align_up(x, 8); };
  const std::size_t tags_bytes = round8(block_count * sizeof(tag));
  const std::size_t heads_bytes = round8(block_count * sizeof(std::uint32_t));
  const std::size_t total = detail::align_up(
      tags_bytes + heads_bytes + (words_total + commit_words) * sizeof(std::uint64_t),
      os::page_size());
  auto mapped = os::map(total);
  if (!mapped) {
    os_error_ = mapped.error();
    return false;
  }
  metadata_ = mapped.value();
  metadata_bytes_ = total;
  auto* cursor = static_cast<std::byte*>(metadata_);
  tags_ = reinterpret_cast<tag*>(cursor);  // zero-filled: every tag starts `tag_interior`
  cursor += tags_bytes;
  heads_ = reinterpret_cast<std::uint32_t*>(cursor);
  std::memset(heads_, 0xFF, block_count * sizeof(std::uint32_t));
  cursor += heads_bytes;
  for (int level = 0; level < levels_; ++level) {
    bitmap_[level] = reinterpret_cast<std::uint64_t*>(cursor);
    cursor += bitmap_words_[level] * sizeof(std::uint64_t);
  }
  committed_ = reinterpret_cast<std::uint64_t*>(cursor);
  if (options_.commit == commit_policy::up_front && commit_steps_ != 0) {
    for (std::size_t i = 0; i < commit_steps_; ++i) committed_[i / 64] |= std::uint64_t{1} << (i % 64);
    committed_steps_ = commit_steps_;
  }

  // Size classes that fit at least two slots in a block.
  small_limit_ = std::min(max_small_size, bs / 2);
  std::size_t next_class = 0;
  for (std::size_t i = 0; i < size_class_count; ++i) {
    classes_[i].slot_bytes = class_bytes[i];
    classes_[i].slots = static_cast<std::uint32_t>(bs / class_bytes[i]);
    classes_[i].partial_head = npos;
    classes_[i].reciprocal = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) + class_bytes[i] - 1) / class_bytes[i]);
    classes_[i].empty_page = npos;
  }
  for (std::size_t i = 0; i <= max_small_size / 16; ++i) {
    while (next_class + 1 < size_class_count && class_bytes[next_class] < i * 16) ++next_class;
    class_of_[i] = static_cast<unsigned char>(next_class);
  }

  debug_ = options_.fill_patterns || options_.guard_bytes != 0 || options_.track_sites;
  if (options_.track_sites) {
    sites_ = std::unique_ptr<site_table>(new (std::nothrow) site_table());
    if (!sites_) {
      (void)os::release(metadata_, metadata_bytes_);
      metadata_ = nullptr;
      os_error_ = ENOMEM;
      return false;
    }
  }

  base_ = base;
  block_count_ = block_count;
  top_ = static_cast<std::uint32_t>(block_count);
  fast_ = !options_.thread_safe && !debug_;
  push_free(0, static_cast<std::uint32_t>(block_count));
  free_blocks_ = block_count;
  MEMKIT_POISON(base_, block_count * bs);
  return true;
}

block_heap::~block_heap() {
  if (base_ != nullptr) MEMKIT_UNPOISON(base_, block_count_ * block_size_);
  if (metadata_ != nullptr) (void)os::release(metadata_, metadata_bytes_);
  if (reserved_ != nullptr) (void)os::release(reserved_, reserved_bytes_);
}

// ---- the run-length bitmap ----------------------------------------------------------------------
//
// The hot functions below copy the members they use into locals first: their stores go through
// uint32_t and uint64_t pointers, which the compiler must otherwise assume may alias the heap's
// own size_t and int members and reload them after every store.

// The shortest free run of at least `length` blocks (its length), or 0. At most two passes over
// the levels: up until a word has a set bit at or after the wanted position, then down.
inline std::uint32_t block_heap::find_run(std::uint32_t length) const noexcept {
  const int levels = levels_;
  std::size_t position = length - 1;
  if (MEMKIT_LIKELY(levels == 3)) {
    // Regions of 4,097 to 262,144 blocks (16 MiB to 1 GiB of 4 KiB blocks): the same walk, unrolled.
    const std::uint64_t* const level0 = bitmap_[0];
    const std::uint64_t* const level1 = bitmap_[1];
    const std::size_t word0 = position >> 6;
    if (word0 >= bitmap_words_[0]) return 0;
    std::uint64_t bits = level0[word0] & (~std::uint64_t{0} << (position & 63));
    if (bits != 0) return static_cast<std::uint32_t>(((word0 << 6) | static_cast<std::size_t>(std::countr_zero(bits))) + 1);
    const std::size_t position1 = word0 + 1;
    const std::size_t word1 = position1 >> 6;
    std::size_t index1;
    bits = word1 < bitmap_words_[1] ? level1[word1] & (~std::uint64_t{0} << (position1 & 63)) : 0;
    if (bits != 0) {
      index1 = (word1 << 6) | static_cast<std::size_t>(std::countr_zero(bits));
    } else {
      const std::size_t position2 = word1 + 1;
      if (position2 >= 64) return 0;
      bits = bitmap_[2][0] & (~std::uint64_t{0} << position2);
      if (bits == 0) return 0;
      const auto index2 = static_cast<std::size_t>(std::countr_zero(bits));
      index1 = (index2 << 6) | static_cast<std::size_t>(std::countr_zero(level1[index2]));
    }
    return static_cast<std::uint32_t>(((index1 << 6) | static_cast<std::size_t>(std::countr_zero(level0[index1]))) + 1);
  }
  for (int level = 0; level < levels; ++level) {
    const std::size_t word = position >> 6;
    if (word >= bitmap_words_[level]) return 0;
    const std::uint64_t bits = bitmap_[level][word] & (~std::uint64_t{0} << (position & 63));
    if (bits != 0) {
      position = (word << 6) | static_cast<std::size_t>(std::countr_zero(bits));
      for (int below = level - 1; below >= 0; --below)
        position = (position << 6) | static_cast<std::size_t>(std::countr_zero(bitmap_[below][position]));
      return static_cast<std::uint32_t>(position + 1);
    }
    position = word + 1;
  }
  return 0;
}

// The best fit among the listed runs and the top run (the free run that ends the region, kept out
// of the lists so that carving from it and merging into it touch no list): its length, with its
// first block in *first; 0 when no free run is long enough. On a tie the listed run wins, keeping
// the top whole for larger requests.
inline std::uint32_t block_heap::best_fit(std::uint32_t length, std::uint32_t* first) const noexcept {
  const std::uint32_t listed = bitmap_[levels_ - 1][0] != 0 ? find_run(length) : 0;
  const auto top_length = static_cast<std::uint32_t>(block_count_ - top_);
  if (top_length >= length && (listed == 0 || top_length < listed)) {
    *first = top_;
    return top_length;
  }
  if (listed != 0) *first = heads_[listed - 1];
  return listed;
}

// Sets the bitmap bit of a run length whose list just became non-empty, and the bits above it
// whose words were empty.
inline void block_heap::set_length(std::uint32_t length) noexcept {
  std::uint64_t* const* const bitmap = bitmap_;
  std::size_t position = length - 1;
  std::uint64_t& first_word = bitmap[0][position >> 6];
  const std::uint64_t first_old = first_word;
  first_word = first_old | std::uint64_t{1} << (position & 63);
  if (MEMKIT_LIKELY(first_old != 0)) return;
  const int levels = levels_;
  position >>= 6;
  for (int level = 1; level < levels; ++level) {
    std::uint64_t& word = bitmap[level][position >> 6];
    const std::uint64_t old = word;
    word = old | std::uint64_t{1} << (position & 63);
    if (old != 0) break;
    position >>= 6;
  }
}

// Clears the bitmap bit of a run length whose list is empty, and the bits above it that cover
// only empty words.
inline void block_heap::clear_length(std::uint32_t length) noexcept {
  if (heads_[length - 1] != npos) return;
  std::uint64_t* const* const bitmap = bitmap_;
  std::size_t position = length - 1;
  std::uint64_t& first_word = bitmap[0][position >> 6];
  const std::uint64_t first_now = first_word & ~(std::uint64_t{1} << (position & 63));
  first_word = first_now;
  if (MEMKIT_LIKELY(first_now != 0)) return;
  const int levels = levels_;
  position >>= 6;
  for (int level = 1; level < levels; ++level) {
    std::uint64_t& word = bitmap[level][position >> 6];
    const std::uint64_t now = word & ~(std::uint64_t{1} << (position & 63));
    word = now;
    if (now != 0) break;
    position >>= 6;
  }
}

inline void block_heap::push_free(std::uint32_t first, std::uint32_t length) noexcept {
  tag* const tags = tags_;
  std::uint32_t* const heads = heads_;
  tag& head = tags[first];
  head.length = length;
  head.state = tag_free;
  if (length > 1) {
    tag& tail = tags[first + length - 1];
    tail.length = length;
    tail.state = tag_free;
  }
  if (first + length == block_count_) {  // the top run: tagged, but in no list
    top_ = first;
    return;
  }
  const std::uint32_t old = heads[length - 1];
  head.prev = npos;
  head.next = old;
  heads[length - 1] = first;
  if (old != npos) tags[old].prev = first;
  else set_length(length);
}

// Takes a free run off its list. Returns true when the list became empty: the caller then calls
// clear_length() after giving back any pieces, so a word that is refilled at once (a split run's
// remainder usually lands in the same 64 lengths) never empties and the levels above stay as
// they are.
inline bool block_heap::unlink_free(std::uint32_t first, std::uint32_t length) noexcept {
  if (first == top_) {
    top_ = static_cast<std::uint32_t>(block_count_);
    return false;
  }
  tag* const tags = tags_;
  const std::uint32_t next = tags[first].next;
  const std::uint32_t prev = tags[first].prev;
  if (next != npos) tags[next].prev = prev;
  if (prev != npos) {
    tags[prev].next = next;
    return false;
  }
  heads_[length - 1] = next;
  return next == npos;
}

inline void block_heap::mark_run(std::uint32_t first, std::uint32_t length, unsigned state) noexcept {
  tag* const tags = tags_;
  tag& head = tags[first];
  head.length = length;
  head.state = static_cast<std::uint8_t>(state);
  if (length > 1) {
    tag& tail = tags[first + length - 1];
    tail.length = length;
    tail.state = tag_run_tail;
  }
}

// Takes [first, first + length) out of the free run [found, found + found_length) and gives the
// pieces before and after it back to the free lists. Returns `first`.
inline std::uint32_t block_heap::take_run(std::uint32_t found, std::uint32_t found_length,
                                          std::uint32_t first, std::uint32_t length) noexcept {
  const bool emptied = unlink_free(found, found_length);
  if (first > found) push_free(found, first - found);
  const std::uint32_t end = first + length;
  const std::uint32_t found_end = found + found_length;
  if (end < found_end) push_free(end, found_end - end);
  if (emptied) clear_length(found_length);
  mark_run(first, length, tag_run_head);
  free_blocks_ -= length;
  return first;
}

// Frees [first, first + length) and merges it with free neighbours on both sides, in O(1).
inline void block_heap::release_run(std::uint32_t first, std::uint32_t length) noexcept {
  tag* const tags = tags_;
  const std::size_t block_count = block_count_;
  tags[first].state = tag_interior;
  tags[first + length - 1].state = tag_interior;
  std::uint32_t start = first;
  std::uint32_t merged = length;
  std::uint32_t emptied_left = 0, emptied_right = 0;
  if (first > 0 && tags[first - 1].state == tag_free) {
    const std::uint32_t left = tags[first - 1].length;
    start = first - left;
    if (unlink_free(start, left)) emptied_left = left;
    tags[first - 1].state = tag_interior;
    merged += left;
  }
  const std::uint32_t end = first + length;
  if (end < block_count && tags[end].state == tag_free) {
    const std::uint32_t right = tags[end].length;
    if (unlink_free(end, right)) emptied_right = right;
    tags[end].state = tag_interior;
    merged += right;
  }
  push_free(start, merged);
  if (emptied_left != 0) clear_length(emptied_left);
  if (emptied_right != 0) clear_length(emptied_right);
  free_blocks_ += length;
  if (MEMKIT_UNLIKELY(options_.decommit_free_runs)) (void)decommit_free(start, merged);
}

// ---- commit -----------------------------------------------------------------------------------

// Makes sure blocks [first, first + length) are committed: O(1) once everything is, otherwise one
// word test per 64 commit steps the run spans, and system calls only for steps never committed.
inline bool block_heap::commit_blocks(std::uint32_t first, std::uint32_t length) noexcept {
  if (MEMKIT_LIKELY(committed_steps_ == commit_steps_)) return true;
  const unsigned shift = commit_shift_;
  const std::size_t first_step = first >> shift;
  const std::size_t last_step = (std::size_t{first} + length - 1) >> shift;
  if (MEMKIT_LIKELY(first_step == last_step) && (committed_[first_step / 64] >> (first_step % 64) & 1))
    return true;
  bool all = true;
  for (std::size_t word = first_step / 64; word <= last_step / 64 && all; ++word) {
    const std::size_t low = word == first_step / 64 ? first_step % 64 : 0;
    const std::size_t high = word == last_step / 64 ? last_step % 64 : 63;
    const std::uint64_t mask = (~std::uint64_t{0} >> (63 - high)) & (~std::uint64_t{0} << low);
    all = (committed_[word] & mask) == mask;
  }
  return all || commit_steps(first_step, last_step);
}

// Commits the steps in [first_step, last_step] that are not committed yet.
bool block_heap::commit_steps(std::size_t first_step, std::size_t last_step) noexcept {
  const std::size_t step_bytes = block_size_ << commit_shift_;
  std::size_t step = first_step;
  while (step <= last_step) {
    if (committed_[step / 64] >> (step % 64) & 1) {
      ++step;
      continue;
    }
    std::size_t end = step;
    while (end <= last_step && !(committed_[end / 64] >> (end % 64) & 1)) ++end;
    std::byte* from = base_ + step * step_bytes;
    std::byte* to = std::min(base_ + end * step_bytes, reserved_ + reserved_bytes_);
    if (auto s = os::commit(from, static_cast<std::size_t>(to - from)); !s) {
      os_error_ = s.error();
      return false;
    }
    for (std::size_t i = step; i < end; ++i) committed_[i / 64] |= std::uint64_t{1} << (i % 64);
    committed_steps_ += end - step;
    step = end;
  }
  return true;
}

// Decommits every committed step that lies wholly inside the free run [first, first + length).
std::size_t block_heap::decommit_free(std::uint32_t first, std::uint32_t length) noexcept {
  if (commit_steps_ == 0) return 0;
  const std::size_t step_blocks = std::size_t{1} << commit_shift_;
  std::size_t step = (std::size_t{first} + step_blocks - 1) >> commit_shift_;
  const std::size_t end_block = std::size_t{first} + length;
  const std::size_t step_bytes = block_size_ << commit_shift_;
  std::size_t released = 0;
  for (; step < commit_steps_; ++step) {
    const std::size_t step_end = std::min((step + 1) << commit_shift_, std::size_t{block_count_});
    if (step_end > end_block) break;
    if (!(committed_[step / 64] >> (step % 64) & 1)) continue;
    std::byte* from = base_ + step * step_bytes;
    std::byte* to = std::min(base_ + (step + 1) * step_bytes, reserved_ + reserved_bytes_);
    if (auto s = os::decommit(from, static_cast<std::size_t>(to - from)); !s) {
      os_error_ = s.error();
      break;  // still committed and still correct; only the memory stays in use
    }
    committed_[step / 64] &= ~(std::uint64_t{1} << (step % 64));
    --committed_steps_;
    released += static_cast<std::size_t>(to - from);
  }
  return released;
}

// ---- allocation -------------------------------------------------------------------------------

inline void block_heap::fail(block_heap_failure why) noexcept {
  last_failure_ = why;
  ++failed_allocations_;
}

// The common request (no lock, no debugging aid, default alignment) takes a short path: a slot
// from the class's first partial page, or a run; everything else goes through allocate_slow().
void* block_heap::allocate(std::size_t size, std::size_t alignment,
                           memkit::source_location where) noexcept {
  // Alignments 1, 2, 4, 8 and 16 (bits of 0x10116) take the fast path; anything else, zero and
  // the other small values included, goes to the slow path, which refuses non-powers of two.
  if (MEMKIT_LIKELY(fast_ && alignment <= 16 && ((0x10116u >> alignment) & 1u) != 0)) {
    if (size - 1 < small_limit_) {  // size 0 wraps around and takes the slow path
      size_class& c = classes_[class_of_[(size + 15) >> 4]];
      if (MEMKIT_LIKELY(c.partial_head != npos)) {
        void* p = take_slot(c, c.partial_head);
        MEMKIT_UNPOISON(p, size);
        ++total_allocations_;
        return p;
      }
    } else if (size - 1 < (block_count_ << block_shift_)) {
      return allocate_run_counted(size);
    }
  }
  return allocate_slow(size, alignment, where);
}

// A run for `size` bytes (1 to region_bytes()) at the default alignment, counted; no lock, no
// debugging aids. allocate_run() without the argument checks the caller made.
void* block_heap::allocate_run_counted(std::size_t size) noexcept {
  const auto length = static_cast<std::uint32_t>((size + block_size_ - 1) >> block_shift_);
  std::uint32_t first = 0;
  const std::uint32_t found = best_fit(length, &first);
  if (MEMKIT_UNLIKELY(found == 0)) {
    // The general path gives kept sub-block pages back, retries, and records why it failed.
    void* p = allocate_run(size, 16);
    if (p != nullptr) ++total_allocations_;
    return p;
  }
  if (MEMKIT_UNLIKELY(!commit_blocks(first, length))) {
    fail(block_heap_failure::commit_failed);
    return nullptr;
  }
  take_run(first, found, first, length);
  tags_[first].slack = static_cast<std::uint32_t>((std::size_t{length} << block_shift_) - size);
  std::byte* p = base_ + (std::size_t{first} << block_shift_);
  MEMKIT_UNPOISON(p, size);
  ++total_allocations_;
  ++live_runs_;
  return p;
}

void* block_heap::allocate_slow(std::size_t size, std::size_t alignment,
                                memkit::source_location where) noexcept {
  lock guard(*this);
  if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) {
    fail(block_heap_failure::invalid_argument);
    return nullptr;
  }
  return allocate_locked(size == 0 ? 1 : size, alignment, nullptr, &where);
}

void* block_heap::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  lock guard(*this);
  return allocate_locked(size, alignment, nullptr, nullptr);
}

allocation block_heap::do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
  lock guard(*this);
  std::size_t usable = 0;
  void* p = allocate_locked(size, alignment, &usable, nullptr);
  return p == nullptr ? allocation{} : allocation{p, usable};
}

inline void* block_heap::allocate_locked(std::size_t size, std::size_t alignment, std::size_t* usable,
                                  const memkit::source_location* where) noexcept {
  if (MEMKIT_UNLIKELY(block_count_ == 0)) {
    fail(block_heap_failure::no_region);
    return nullptr;
  }
  const std::size_t guard = options_.guard_bytes;
  void* p;
  if (MEMKIT_LIKELY(!debug_)) {
    if (size <= small_limit_ && alignment <= small_limit_) {
      std::size_t slot = alignment > 16 ? std::max(std::bit_ceil(size), alignment) : size;
      p = allocate_small(class_of_[(slot + 15) >> 4], size);
    } else {
      p = allocate_run(size, alignment);
    }
    if (MEMKIT_UNLIKELY(p == nullptr)) return nullptr;
    if (usable != nullptr) {
      *usable = usable_size_locked(p);
      MEMKIT_UNPOISON(p, *usable);
    }
    ++total_allocations_;
    return p;
  }

  // Debugging layout: the guard follows the requested bytes; a sub-block slot also keeps the
  // requested size in its last four bytes, since a free without size must find the guard.
  if (size > region_bytes() || guard > region_bytes() - size) {
    fail(block_heap_failure::too_large);
    return nullptr;
  }
  const std::size_t small_need = size + guard + (guard != 0 ? sizeof(std::uint32_t) : 0);
  bool small = false;
  if (small_need <= small_limit_ && alignment <= small_limit_) {
    std::size_t slot = alignment > 16 ? std::max(std::bit_ceil(small_need), alignment) : small_need;
    p = allocate_small(class_of_[(slot + 15) >> 4], size);
    small = true;
  } else {
    p = allocate_run(size + guard, alignment);
  }
  if (p == nullptr) return nullptr;
  auto* bytes = static_cast<std::byte*>(p);
  const std::uint32_t block = static_cast<std::uint32_t>((bytes - base_) >> block_shift_);
  if (small) {
    if (guard != 0) {
      const std::uint32_t stored = static_cast<std::uint32_t>(size);
      std::memcpy(bytes + classes_[tags_[block].size_class].slot_bytes - sizeof stored, &stored,
                  sizeof stored);
    }
  } else {
    tags_[block].slack = static_cast<std::uint32_t>((std::size_t{tags_[block].length} << block_shift_) - size);
  }
  if (options_.fill_patterns) std::memset(bytes, allocated_fill, size);
  if (guard != 0) std::memset(bytes + size, guard_fill, guard);
  if (options_.track_sites) record_site(p, size, where);
  if (usable != nullptr) *usable = guard != 0 ? size : usable_size_locked(p);
  ++total_allocations_;
  return p;
}

void* block_heap::allocate_small(std::size_t class_index, std::size_t size) noexcept {
  size_class& c = classes_[class_index];
  std::uint32_t block = c.partial_head;
  if (MEMKIT_UNLIKELY(block == npos)) {
    std::uint32_t first = 0;
    std::uint32_t found = best_fit(1, &first);
    if (found == 0 && release_cached_pages()) found = best_fit(1, &first);
    if (found == 0) {
      fail(block_heap_failure::out_of_memory);
      return nullptr;
    }
    if (!commit_blocks(first, 1)) {
      fail(block_heap_failure::commit_failed);
      return nullptr;
    }
    take_run(first, found, first, 1);
    tag& page = tags_[first];
    page.state = tag_sub_block;
    page.size_class = static_cast<std::uint8_t>(class_index);
    page.free_slot = npos;
    page.used = 0;
    page.bump = 0;
    ++small_pages_;
    push_partial(c, first);
    block = first;
  }
  void* slot = take_slot(c, block);
  MEMKIT_UNPOISON(slot, options_.guard_bytes != 0 ? c.slot_bytes : size);
  (void)size;  // used only by the sanitizer hook
  return slot;
}

// Hands out a slot of `block`, a page on the partial list of class `c`: a freed slot first, else
// the next never-used one.
inline void* block_heap::take_slot(size_class& c, std::uint32_t block) noexcept {
  tag& page = tags_[block];
  std::byte* const page_base = base_ + (std::size_t{block} << block_shift_);
  std::byte* slot;
  if (page.free_slot != npos) {
    slot = page_base + page.free_slot;
    page.free_slot = read_link(slot);
  } else {
    slot = page_base + std::size_t{page.bump} * c.slot_bytes;
    ++page.bump;
  }
  ++page.used;
  if (c.empty_page == block) c.empty_page = npos;  // only an empty page is kept
  if (page.used == c.slots) unlink_partial(c, block);
  return slot;
}

inline void* block_heap::allocate_run(std::size_t size, std::size_t alignment) noexcept {
  if (MEMKIT_UNLIKELY(size > region_bytes() || alignment > region_bytes())) {
    fail(block_heap_failure::too_large);
    return nullptr;
  }
  const auto length = static_cast<std::uint32_t>((size + block_size_ - 1) >> block_shift_);
  // Over-aligned requests (beyond the block size) look for a run long enough for any placement.
  const std::uint32_t extra =
      alignment > block_size_ ? static_cast<std::uint32_t>((alignment >> block_shift_) - 1) : 0;
  if (MEMKIT_UNLIKELY(std::size_t{length} + extra > block_count_)) {
    fail(block_heap_failure::too_large);
    return nullptr;
  }
  std::uint32_t found_first = 0;
  std::uint32_t found = best_fit(length + extra, &found_first);
  if (MEMKIT_UNLIKELY(found == 0) && release_cached_pages()) found = best_fit(length + extra, &found_first);
  if (MEMKIT_UNLIKELY(found == 0)) {
    fail(free_blocks_ >= length ? block_heap_failure::fragmentation
                                : block_heap_failure::out_of_memory);
    return nullptr;
  }
  std::uint32_t first = found_first;
  if (extra != 0) {
    auto address = reinterpret_cast<std::uintptr_t>(base_ + (std::size_t{found_first} << block_shift_));
    first += static_cast<std::uint32_t>((detail::align_up(address, alignment) - address) >> block_shift_);
  }
  if (MEMKIT_UNLIKELY(!commit_blocks(first, length))) {
    fail(block_heap_failure::commit_failed);
    return nullptr;
  }
  take_run(found_first, found, first, length);
  tags_[first].slack = static_cast<std::uint32_t>((std::size_t{length} << block_shift_) - size);
  std::byte* p = base_ + (std::size_t{first} << block_shift_);
  MEMKIT_UNPOISON(p, size);
  ++live_runs_;
  return p;
}

// ---- sub-block pages --------------------------------------------------------------------------

inline void block_heap::push_partial(size_class& c, std::uint32_t block) noexcept {
  tag& page = tags_[block];
  page.prev = npos;
  page.next = c.partial_head;
  if (c.partial_head != npos) tags_[c.partial_head].prev = block;
  c.partial_head = block;
}

inline void block_heap::unlink_partial(size_class& c, std::uint32_t block) noexcept {
  const tag& page = tags_[block];
  if (page.next != npos) tags_[page.next].prev = page.prev;
  if (page.prev != npos) tags_[page.prev].next = page.next;
  else c.partial_head = page.next;
}

// Gives every class's kept empty page back to the free runs. O(classes). Returns true when one was.
bool block_heap::release_cached_pages() noexcept {
  bool released = false;
  for (size_class& c : classes_) {
    if (c.empty_page == npos) continue;
    const std::uint32_t block = c.empty_page;
    c.empty_page = npos;
    unlink_partial(c, block);
    --small_pages_;
    mark_run(block, 1, tag_run_head);
    release_run(block, 1);
    released = true;
  }
  return released;
}

// ---- free -------------------------------------------------------------------------------------

// Without a lock or debugging aids, a free that leaves its page neither full nor empty stays
// here; everything else goes to free_locked().
void block_heap::deallocate(void* pointer) noexcept {
  if (pointer == nullptr) return;
  if (MEMKIT_LIKELY(fast_)) {
    auto* p = static_cast<std::byte*>(pointer);
    const std::size_t offset = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(base_);
    if (MEMKIT_LIKELY(offset < (block_count_ << block_shift_))) {
      const auto block = static_cast<std::uint32_t>(offset >> block_shift_);
      tag& page = tags_[block];
      if (page.state == tag_sub_block) {
        size_class& c = classes_[page.size_class];
        const auto in_block = static_cast<std::uint32_t>(offset & (block_size_ - 1));
        const std::uint32_t slot =
            MEMKIT_LIKELY(block_size_ <= (std::size_t{1} << 21))
                ? static_cast<std::uint32_t>((std::uint64_t{in_block} * c.reciprocal) >> 32)
                : in_block / c.slot_bytes;
        // The page stays on its partial list; if it empties, it becomes the class's kept page.
        if (MEMKIT_LIKELY(slot * c.slot_bytes == in_block && slot < page.bump && page.used < c.slots &&
                          (page.used > 1 || c.empty_page == npos))) {
          MEMKIT_UNPOISON(p, sizeof page.free_slot);
          std::memcpy(p, &page.free_slot, sizeof page.free_slot);
          MEMKIT_POISON(p, c.slot_bytes);
          page.free_slot = in_block;
          if (--page.used == 0) c.empty_page = block;
          ++total_frees_;
          return;
        }
      } else if (page.state == tag_run_head && (offset & (block_size_ - 1)) == 0) {
        free_run_fast(block);
        return;
      }
    }
    free_locked(pointer, 0);
    return;
  }
  lock guard(*this);
  free_locked(pointer, 0);
}

// Frees the allocated run starting at `block` (already checked); no lock, no debugging aids.
void block_heap::free_run_fast(std::uint32_t block) noexcept {
  const std::uint32_t length = tags_[block].length;
  MEMKIT_POISON(base_ + (std::size_t{block} << block_shift_), std::size_t{length} << block_shift_);
  release_run(block, length);
  --live_runs_;
  ++total_frees_;
}

void block_heap::do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept {
  (void)alignment;
  lock guard(*this);
  free_locked(p, size);
}

bool block_heap::owns(const void* p) const noexcept {
  auto* b = static_cast<const std::byte*>(p);
  return base_ != nullptr && b >= base_ && b < base_ + block_count_ * block_size_;
}

inline void block_heap::check_guard(const std::byte* p, std::size_t requested) const noexcept {
  for (std::size_t i = 0; i < options_.guard_bytes; ++i) {
    MEMKIT_CHECK(p[requested + i] == static_cast<std::byte>(guard_fill),
                 "block_heap: guard bytes after an allocation were overwritten (a buffer overrun)");
  }
}

// Checks the guard, forgets the site and fills the freed bytes. `requested` is 0 for a slot,
// whose requested size sits in its last four bytes.
void block_heap::debug_free(std::byte* p, std::size_t bytes, std::size_t requested) noexcept {
  MEMKIT_UNPOISON(p, bytes);
  if (options_.guard_bytes != 0) {
    if (requested == 0) {
      std::uint32_t stored;
      std::memcpy(&stored, p + bytes - sizeof stored, sizeof stored);
      MEMKIT_CHECK(stored + options_.guard_bytes + sizeof stored <= bytes,
                   "block_heap: the size stored after a small allocation was overwritten (a buffer overrun)");
      requested = stored;
    }
    check_guard(p, requested);
  }
  if (options_.track_sites) forget_site(p);
  if (options_.fill_patterns) std::memset(p, freed_fill, bytes);
}

void block_heap::free_locked(void* pointer, std::size_t checked_size) noexcept {
  auto* p = static_cast<std::byte*>(pointer);
  // One unsigned comparison covers both ends (and an empty heap, whose region is 0 bytes).
  const std::size_t offset = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(base_);
  MEMKIT_CHECK(offset < (block_count_ << block_shift_),
               "block_heap: deallocate of a pointer outside this heap's region");
  const auto block = static_cast<std::uint32_t>(offset >> block_shift_);
  tag& t = tags_[block];
  if (t.state == tag_sub_block) {
    const size_class& c = classes_[t.size_class];
    const auto in_block = static_cast<std::uint32_t>(offset & (block_size_ - 1));
    // Multiplying by a rounded-up reciprocal divides exactly for offsets below 2^21 (blocks up to
    // 2 MiB); the check below would catch a wrong quotient anyway, as a bad pointer.
    const std::uint32_t slot =
        MEMKIT_LIKELY(block_size_ <= (std::size_t{1} << 21))
            ? static_cast<std::uint32_t>((std::uint64_t{in_block} * c.reciprocal) >> 32)
            : in_block / c.slot_bytes;
    MEMKIT_CHECK(slot * c.slot_bytes == in_block && slot < t.bump,
                 "block_heap: deallocate of a pointer this heap did not hand out");
    MEMKIT_ASSERT(checked_size <= c.slot_bytes, "block_heap: deallocate with a size larger than the block");
    if (MEMKIT_UNLIKELY(debug_)) debug_free(p, c.slot_bytes, 0);
    free_small(block, p, slot);
  } else {
    MEMKIT_CHECK(t.state == tag_run_head && (offset & (block_size_ - 1)) == 0,
                 "block_heap: deallocate of a pointer this heap did not hand out, or a double free");
    const std::size_t run_bytes = std::size_t{t.length} << block_shift_;
    MEMKIT_ASSERT(checked_size <= run_bytes, "block_heap: deallocate with a size larger than the block");
    if (MEMKIT_UNLIKELY(debug_)) debug_free(p, run_bytes, run_bytes - t.slack);
    MEMKIT_POISON(p, run_bytes);
    release_allocated_run(block);
    --live_runs_;
  }
  (void)checked_size;
  ++total_frees_;
}

inline void block_heap::free_small(std::uint32_t block, std::byte* p, std::uint32_t slot) noexcept {
  tag& page = tags_[block];
  size_class& c = classes_[page.size_class];
  MEMKIT_UNPOISON(p, sizeof page.free_slot);
  std::memcpy(p, &page.free_slot, sizeof page.free_slot);
  MEMKIT_POISON(p, c.slot_bytes);
  page.free_slot = slot * c.slot_bytes;
  if (page.used == c.slots) push_partial(c, block);
  if (--page.used != 0) return;
  // An empty page: keep one per class for the next request (a run request that finds no room
  // takes it back), give the others back as runs.
  if (c.empty_page == npos) {
    c.empty_page = block;
    return;
  }
  unlink_partial(c, block);
  --small_pages_;
  mark_run(block, 1, tag_run_head);
  release_run(block, 1);
}

inline void block_heap::release_allocated_run(std::uint32_t block) noexcept { release_run(block, tags_[block].length); }

// ---- resize -----------------------------------------------------------------------------------

inline std::size_t block_heap::usable_size_locked(const void* pointer) const noexcept {
  auto* p = static_cast<const std::byte*>(pointer);
  const std::size_t offset = static_cast<std::size_t>(p - base_);
  const tag& t = tags_[offset >> block_shift_];
  if (t.state == tag_sub_block) {
    const size_class& c = classes_[t.size_class];
    if (options_.guard_bytes == 0) return c.slot_bytes;
    std::uint32_t requested;
    std::memcpy(&requested, p + c.slot_bytes - sizeof requested, sizeof requested);
    return requested;
  }
  const std::size_t run_bytes = std::size_t{t.length} << block_shift_;
  return options_.guard_bytes == 0 ? run_bytes : run_bytes - t.slack;
}

std::size_t block_heap::usable_size(const void* p) const noexcept {
  if (p == nullptr) return 0;
  lock guard(*this);
  MEMKIT_CHECK(owns(p), "block_heap: usable_size of a pointer outside this heap's region");
  return usable_size_locked(p);
}

bool block_heap::do_resize(void* p, std::size_t old_size, std::size_t new_size,
                           std::size_t alignment) noexcept {
  (void)old_size;
  (void)alignment;
  lock guard(*this);
  MEMKIT_CHECK(owns(p), "block_heap: resize of a pointer outside this heap's region");
  return resize_locked(p, new_size);
}

bool block_heap::resize_locked(void* pointer, std::size_t new_size) noexcept {
  auto* p = static_cast<std::byte*>(pointer);
  const std::size_t offset = static_cast<std::size_t>(p - base_);
  const auto block = static_cast<std::uint32_t>(offset >> block_shift_);
  tag& t = tags_[block];
  const std::size_t guard = options_.guard_bytes;
  const std::size_t old_requested = usable_size_locked(p);

  if (t.state == tag_sub_block) {
    const size_class& c = classes_[t.size_class];
    const std::size_t need = new_size + guard + (guard != 0 ? sizeof(std::uint32_t) : 0);
    if (need > c.slot_bytes) return false;
    if (guard != 0) {
      check_guard(p, old_requested);
      const auto stored = static_cast<std::uint32_t>(new_size);
      std::memcpy(p + c.slot_bytes - sizeof stored, &stored, sizeof stored);
    }
  } else {
    MEMKIT_CHECK(t.state == tag_run_head && (offset & (block_size_ - 1)) == 0,
                 "block_heap: resize of a pointer this heap did not hand out");
    if (new_size > region_bytes() || guard > region_bytes() - new_size) return false;
    if (guard != 0) check_guard(p, old_requested);
    const std::uint32_t length = t.length;
    const auto wanted = static_cast<std::uint32_t>((new_size + guard + block_size_ - 1) >> block_shift_);
    if (wanted < length) {
      mark_run(block, wanted, tag_run_head);
      MEMKIT_POISON(base_ + (std::size_t{block + wanted} << block_shift_),
                    std::size_t{length - wanted} << block_shift_);
      release_run(block + wanted, length - wanted);
    } else if (wanted > length) {
      const std::uint32_t end = block + length;
      const std::uint32_t grow = wanted - length;
      if (end >= block_count_ || tags_[end].state != tag_free || tags_[end].length < grow) return false;
      if (!commit_blocks(end, grow)) return false;
      const std::uint32_t right = tags_[end].length;
      const bool emptied = unlink_free(end, right);
      tags_[block + length - 1].state = tag_interior;
      tags_[end].state = tag_interior;
      tags_[end + right - 1].state = tag_interior;
      if (right > grow) push_free(end + grow, right - grow);
      if (emptied) clear_length(right);
      mark_run(block, wanted, tag_run_head);
      free_blocks_ -= grow;
    }
    tags_[block].slack =
        static_cast<std::uint32_t>((std::size_t{tags_[block].length} << block_shift_) - new_size);
  }
  // The guard is the heap's to write (allocation unpoisons it with the block the same way).
  MEMKIT_UNPOISON(p, new_size + guard);
  if (options_.fill_patterns && new_size > old_requested)
    std::memset(p + old_requested, allocated_fill, new_size - old_requested);
  if (guard != 0) std::memset(p + new_size, guard_fill, guard);
  if (options_.track_sites) resize_site(p, new_size);
  return true;
}

}  // namespace memkit
