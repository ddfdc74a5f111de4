// Internal: the block_heap's per-block boundary tag, its lock, and small helpers shared by the
// block_heap source files. Not installed.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

#include "memkit/block_heap.hpp"

namespace memkit::block_heap_detail {

// "No block": terminates free lists and partial-page lists.
inline constexpr std::uint32_t npos = 0xFFFFFFFFu;

// What a tag says about its block. Only the first and last block of a run carry a meaningful
// tag; every tag that stops being a run boundary is reset to `tag_interior`, so a stale tag can never
// make an interior block look like the start of an allocation.
enum state : std::uint8_t {
  tag_interior = 0,  // inside a run (or never a boundary)
  tag_free = 1,  // first or last block of a free run
  tag_run_head = 2,  // first block of an allocated run
  tag_run_tail = 3,  // last block of an allocated run longer than one block
  tag_sub_block = 4, // a block holding slots of one size class
};

}  // namespace memkit::block_heap_detail

namespace memkit {

// Boundary tag, kept in the metadata mapping (never in the region), 32 bytes per block.
struct block_heap::tag {
  std::uint32_t length;      // run length in blocks (first and last block of a run)
  std::uint32_t next;        // free-run list (free head) or partial-page list (tag_sub_block)
  std::uint32_t prev;
  std::uint8_t state;        // block_heap_detail::state
  std::uint8_t size_class;   // tag_sub_block: index into classes_
  std::uint16_t reserved;
  std::uint32_t free_slot;   // tag_sub_block: byte offset of the first free slot (npos: none);
                             // each free slot holds the offset of the next (an offset, not an
                             // index, keeps a multiply off the allocation's chain of loads)
  std::uint32_t used;        // tag_sub_block: live slots
  std::uint32_t bump;        // tag_sub_block: slots handed out at least once (never-used slots follow)
  std::uint32_t slack;       // tag_run_head: run bytes minus the bytes requested
};

// Allocation sites are interned by the identity of std::source_location's strings (they have
// static storage) and the line, so recording an allocation is one hash lookup and one insert.
struct block_heap::site_table {
  struct key {
    const char* file;
    const char* function;
    std::uint32_t line;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& k) const noexcept {
      auto h = std::hash<const void*>{}(k.file);
      h ^= std::hash<const void*>{}(k.function) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      return h ^ (k.line * 0x9e3779b97f4a7c15ull);
    }
  };
  struct live_record {
    std::uint32_t site;
    std::size_t bytes;
  };
  std::vector<allocation_site> sites;
  std::unordered_map<key, std::uint32_t, key_hash> index;
  std::unordered_map<const void*, live_record> live;
};

// Takes the heap's mutex when it was built thread_safe.
struct block_heap::lock {
  explicit lock(const block_heap& heap) noexcept
      : mutex_(heap.options_.thread_safe ? &heap.mutex_ : nullptr) {
    if (mutex_ != nullptr) mutex_->lock();
  }
  ~lock() {
    if (mutex_ != nullptr) mutex_->unlock();
  }
  lock(const lock&) = delete;
  lock& operator=(const lock&) = delete;
  std::mutex* mutex_;
};

// The length of the longest free run: the top run, or the longest listed one (from the top of
// the run-length bitmap down).
inline std::uint32_t block_heap::largest_length() const noexcept {
  if (levels_ == 0) return 0;
  const auto top_length = static_cast<std::uint32_t>(block_count_ - top_);
  std::uint64_t top = bitmap_[levels_ - 1][0];
  if (top == 0) return top_length;
  std::size_t position = static_cast<std::size_t>(63 - std::countl_zero(top));
  for (int below = levels_ - 2; below >= 0; --below)
    position = (position << 6) | static_cast<std::size_t>(63 - std::countl_zero(bitmap_[below][position]));
  return std::max(static_cast<std::uint32_t>(position + 1), top_length);
}

namespace block_heap_detail {

// Slot links live in the first four bytes of a free slot; these read and write them around
// AddressSanitizer's poisoning of free slots.
inline std::uint32_t read_link(const std::byte* slot) noexcept {
  MEMKIT_UNPOISON(slot, sizeof(std::uint32_t));
  std::uint32_t value;
  std::memcpy(&value, slot, sizeof value);
  MEMKIT_POISON(slot, sizeof(std::uint32_t));
  return value;
}

}  // namespace block_heap_detail
}  // namespace memkit
