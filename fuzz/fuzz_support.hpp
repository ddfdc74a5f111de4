// What every harness shares: reading operations from the fuzzer's bytes, a check that stops the
// run with a message, and a model of live blocks for the allocator harnesses (each block filled
// with its own pattern, checked before it is given back, never overlapping another).
//
// Harnesses keep no state across inputs: everything lives inside one LLVMFuzzerTestOneInput call,
// so any finding reproduces from its input alone (fuzz/replay_main.cpp replays saved inputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

// The checking loops run for every byte of every block: without coverage instrumentation they cost
// a tenth (their comparisons tell the fuzzer nothing about memkit anyway).
#if defined(__clang__)
#define MEMKIT_FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define MEMKIT_FUZZ_NO_COVERAGE
#endif

namespace memkit::fuzzing {

[[noreturn]] inline void fail(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, condition);
  std::abort();
}

// Reads choices from the input. Once the bytes run out every choice is 0, and empty() ends the
// harness's loop.
class input {
 public:
  input(const std::uint8_t* data, std::size_t size) noexcept : data_(data), size_(size) {}
  bool empty() const noexcept { return size_ == 0; }
  // A value in [0, bound), from as few bytes as the bound needs.
  std::uint64_t below(std::uint64_t bound) noexcept {
    if (bound <= 1) return 0;
    std::uint64_t value = 0;
    for (std::uint64_t span = bound - 1; span != 0 && size_ != 0; span >>= 8, ++data_, --size_) {
      value = (value << 8) | *data_;
    }
    return value % bound;
  }
  // A value in [low, high].
  std::uint64_t between(std::uint64_t low, std::uint64_t high) noexcept { return low + below(high - low + 1); }
  bool coin() noexcept { return below(2) != 0; }
  // A size that is usually small and now and then large: mostly up to 256 bytes, one in nine up
  // to 64 KiB, one in 64 up to `large`.
  std::size_t size(std::size_t large) noexcept {
    switch (below(64)) {
      case 0: return below(large + 1);
      case 1: case 2: case 3: case 4: case 5: case 6: case 7: return below(64 * 1024 + 1);
      default: return below(257);
    }
  }
  // A power-of-two alignment from 1 to 2^max_log2.
  std::size_t alignment(unsigned max_log2) noexcept { return std::size_t{1} << below(max_log2 + 1); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
};

// The byte a block's i-th byte is filled with: depends on the block's id, so two blocks that
// overlap or a block handed out twice show up as a mismatch.
inline unsigned char pattern(std::uint32_t id, std::size_t i) noexcept {
  return static_cast<unsigned char>(id * 131u + static_cast<std::uint32_t>(i >> 6) * 7u + 1u);
}

// Blocks up to this size are filled and checked whole; larger ones at their first and last 256
// bytes and at sampled_points evenly spread bytes, so that an operation costs about the same
// whatever the size: each point of a large block is a page fault on first touch (two with ASan's
// shadow), and a harness must stay above 1,000 executions per second. 64 points made those faults
// a third of the tracking_allocator harness's time. Overlaps are caught by address in the model
// whatever the points; a copy that stops short is caught when a point falls in what it missed
// (always from a sixteenth of the block, proportionally below, input after input).
inline constexpr std::size_t whole_limit = 8 * 1024;
inline constexpr std::size_t sampled_points = 16;

// Calls visit(i) for every byte index of a block of `size` bytes that is filled and checked.
template <class Visit>
MEMKIT_FUZZ_NO_COVERAGE bool for_each_point(std::size_t size, Visit&& visit) {
  if (size <= whole_limit) {
    for (std::size_t i = 0; i < size; ++i)
      if (!visit(i)) return false;
    return true;
  }
  for (std::size_t i = 0; i < 256; ++i)
    if (!visit(i) || !visit(size - 1 - i)) return false;
  const std::size_t stride = size / sampled_points;
  for (std::size_t i = 256; i < size - 256; i += stride)
    if (!visit(i)) return false;
  return true;
}

// Fills a block of `size` bytes at p with its pattern (the points above).
MEMKIT_FUZZ_NO_COVERAGE inline void fill(unsigned char* p, std::size_t size, std::uint32_t id) noexcept {
  if (size <= whole_limit) {
    for (std::size_t chunk = 0; chunk < size; chunk += 64) {
      const std::size_t n = size - chunk < 64 ? size - chunk : 64;
      std::memset(p + chunk, pattern(id, chunk), n);
    }
    return;
  }
  for_each_point(size, [&](std::size_t i) {
    p[i] = pattern(id, i);
    return true;
  });
}

// True when the first `size` bytes at p hold the pattern (or zeros): eight bytes at a time, each
// 64-byte chunk without an early exit (a byte-by-byte loop that stopped at the first mismatch was
// the largest cost of the block_heap harness).
MEMKIT_FUZZ_NO_COVERAGE inline bool holds_whole(const unsigned char* p, std::size_t size, std::uint32_t id,
                                                bool zero) noexcept {
  for (std::size_t chunk = 0; chunk < size; chunk += 64) {
    const std::size_t n = size - chunk < 64 ? size - chunk : 64;
    const unsigned char expected = zero ? 0 : pattern(id, chunk);
    const std::uint64_t word = 0x0101010101010101ull * expected;
    std::uint64_t difference = 0;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t bytes;
      std::memcpy(&bytes, p + chunk + i, sizeof bytes);
      difference |= bytes ^ word;
    }
    for (; i < n; ++i) difference |= static_cast<unsigned char>(p[chunk + i] ^ expected);
    if (difference != 0) return false;
  }
  return true;
}

// True when the block's points hold its pattern.
MEMKIT_FUZZ_NO_COVERAGE inline bool holds(const unsigned char* p, std::size_t size, std::uint32_t id) noexcept {
  if (size <= whole_limit) return holds_whole(p, size, id, false);
  return for_each_point(size, [&](std::size_t i) { return p[i] == pattern(id, i); });
}

// True when the points of a block of `size` bytes that lie below `limit` hold its pattern (what
// a block that shrank or moved keeps).
MEMKIT_FUZZ_NO_COVERAGE inline bool holds_prefix(const unsigned char* p, std::size_t size, std::size_t limit, std::uint32_t id) noexcept {
  if (size <= whole_limit) return holds_whole(p, size < limit ? size : limit, id, false);
  return for_each_point(size, [&](std::size_t i) { return i >= limit || p[i] == pattern(id, i); });
}

// True when the block's points are zero (calloc, allocate_zeroed).
MEMKIT_FUZZ_NO_COVERAGE inline bool zeroed(const unsigned char* p, std::size_t size) noexcept {
  if (size <= whole_limit) return holds_whole(p, size, 0, true);
  return for_each_point(size, [&](std::size_t i) { return p[i] == 0; });
}

// The live blocks of an allocator under test, by address.
struct live_block {
  std::size_t size = 0;       // bytes asked for (and filled)
  std::size_t alignment = 1;  // alignment asked for
  std::uint32_t id = 0;       // pattern id
  std::size_t extent = 1;     // bytes the block reaches (usable size), for the overlap check
};

class block_model {
 public:
  // Records a new block of `size` bytes at `p` (which must not overlap a live one, nor be
  // misaligned), fills it and returns its id. `extent` is how far the block reaches (its usable
  // size when larger than `size`).
  std::uint32_t add(void* p, std::size_t size, std::size_t alignment, std::size_t extent) {
    auto* c = static_cast<unsigned char*>(p);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    if (at % alignment != 0) fail("block is aligned as asked", __FILE__, __LINE__);
    if (extent < size) extent = size;
    if (extent == 0) extent = 1;
    auto next = blocks_.lower_bound(at);
    if (next != blocks_.end() && next->first < at + extent) fail("blocks do not overlap", __FILE__, __LINE__);
    if (next != blocks_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second.extent > at) fail("blocks do not overlap", __FILE__, __LINE__);
    }
    const std::uint32_t id = next_id_++;
    blocks_[at] = {size, alignment, id, extent};
    fill(c, size, id);
    return id;
  }
  // Checks the block's contents and forgets it.
  void remove(void* p) {
    check_contents(p);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  // Forgets a block whose contents were checked already (it is gone).
  void remove_unchecked(void* p) { blocks_.erase(reinterpret_cast<std::uintptr_t>(p)); }
  void check_contents(void* p) const {
    const live_block& b = at(p);
    if (!holds(static_cast<unsigned char*>(p), b.size, b.id)) fail("block holds what was written", __FILE__, __LINE__);
  }
  // Changes the size of a block that stayed in place, filling any new bytes with its pattern.
  void resize(void* p, std::size_t new_size, std::size_t extent) {
    live_block& b = blocks_.at(reinterpret_cast<std::uintptr_t>(p));
    auto* c = static_cast<unsigned char*>(p);
    if (new_size != b.size) fill(c, new_size, b.id);  // the points of the new size
    b.size = new_size;
    b.extent = extent < new_size ? new_size : extent;
    if (b.extent == 0) b.extent = 1;
  }
  // A block moved from `from` to `to` keeping its first `kept` bytes (checked), now `new_size`.
  void moved(void* from, void* to, std::size_t kept, std::size_t new_size, std::size_t alignment,
             std::size_t extent) {
    const live_block old = at(from);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(from));
    auto* c = static_cast<unsigned char*>(to);
    if (!holds_prefix(c, old.size, kept, old.id)) fail("a moved block keeps its contents", __FILE__, __LINE__);
    add(to, 0, alignment, extent < new_size ? new_size : extent);
    // Keep the old id so the kept prefix still matches; refill the rest.
    live_block& b = blocks_.at(reinterpret_cast<std::uintptr_t>(to));
    b.id = old.id;
    b.size = new_size;
    fill(c, new_size, old.id);
  }
  const live_block& at(void* p) const { return blocks_.at(reinterpret_cast<std::uintptr_t>(p)); }
  bool empty() const noexcept { return blocks_.empty(); }
  std::size_t count() const noexcept { return blocks_.size(); }
  // The address of the live block number `index` (in address order).
  void* nth(std::size_t index) const {
    auto it = blocks_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(index));
    return reinterpret_cast<void*>(it->first);
  }
  const std::map<std::uintptr_t, live_block>& blocks() const noexcept { return blocks_; }

 private:
  std::map<std::uintptr_t, live_block> blocks_;
  std::uint32_t next_id_ = 1;
};

}  // namespace memkit::fuzzing

#define MEMKIT_FUZZ_CHECK(condition) \
  ((condition) ? static_cast<void>(0) : ::memkit::fuzzing::fail(#condition, __FILE__, __LINE__))
