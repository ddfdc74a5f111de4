// libFuzzer harness for block_heap: random sequences of allocations (sub-block slots and runs of
// blocks, any alignment), frees with and without size, in-place resizes and trims, over a small
// region with random options (block size, fill patterns, guard bytes, commit policy, decommitting
// free runs). After every step: validate() holds, every live block keeps what was written into it
// and overlaps no other, usable sizes cover the request, and the statistics agree with the model
// (live allocations, totals, failures, and used + free bytes = the region).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "memkit/block_heap.hpp"

namespace {

using memkit::block_heap;
using memkit::block_heap_failure;
using memkit::fuzzing::block_model;
using memkit::fuzzing::input;

struct counts {
  std::size_t allocations = 0;
  std::size_t frees = 0;
  std::size_t failures = 0;
};

void check_heap(const block_heap& heap, const block_model& model, const counts& expected) {
  const auto validation = heap.validate();
  if (!validation.ok) {
    std::fprintf(stderr, "block_heap::validate: %s\n", validation.problem.c_str());
    std::abort();
  }
  const auto s = heap.statistics();
  MEMKIT_FUZZ_CHECK(s.live_allocations == model.count());
  MEMKIT_FUZZ_CHECK(s.total_allocations == expected.allocations);
  MEMKIT_FUZZ_CHECK(s.total_frees == expected.frees);
  MEMKIT_FUZZ_CHECK(s.failed_allocations == expected.failures);
  MEMKIT_FUZZ_CHECK(s.used_bytes + s.free_bytes == s.region_bytes);
  MEMKIT_FUZZ_CHECK(s.largest_free_run_bytes <= s.free_bytes);
  MEMKIT_FUZZ_CHECK(s.committed_bytes <= s.region_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  memkit::block_heap_options options;
  options.block_size = std::size_t{256} << in.below(5);  // 256 B .. 4 KiB
  options.fill_patterns = in.coin();
  options.guard_bytes = in.coin() ? 0 : in.between(1, 32);
  options.commit = in.coin() ? memkit::commit_policy::on_demand : memkit::commit_policy::up_front;
  options.decommit_free_runs = in.coin();
  const std::size_t blocks = in.between(1, 96);
  block_heap heap(blocks * options.block_size, options);
  if (!heap.valid()) return 0;
  block_model model;
  counts expected;
  const std::size_t region = heap.region_bytes();
  while (!in.empty()) {
    switch (in.below(8)) {
      case 0:
      case 1:
      case 2: {  // allocate: sub-block sizes, runs, or more than the region
        std::size_t bytes = 0;
        switch (in.below(4)) {
          case 0: bytes = in.below(region + 2 * options.block_size); break;
          case 1: bytes = in.below(4 * options.block_size); break;
          default: bytes = in.below(options.block_size / 2 + 1); break;
        }
        const std::size_t alignment = in.below(8) == 0 ? in.below(5000) : in.alignment(13);
        void* p = heap.allocate(bytes, alignment);
        if (p == nullptr) {
          ++expected.failures;
          const block_heap_failure why = heap.last_failure();
          if (!memkit::detail::is_power_of_two(alignment)) MEMKIT_FUZZ_CHECK(why == block_heap_failure::invalid_argument);
          else if (bytes > region) MEMKIT_FUZZ_CHECK(why == block_heap_failure::too_large);
          else MEMKIT_FUZZ_CHECK(why != block_heap_failure::none && why != block_heap_failure::invalid_argument);
          break;
        }
        MEMKIT_FUZZ_CHECK(memkit::detail::is_power_of_two(alignment));
        ++expected.allocations;
        MEMKIT_FUZZ_CHECK(heap.owns(p));
        const std::size_t usable = heap.usable_size(p);
        MEMKIT_FUZZ_CHECK(usable >= bytes);
        MEMKIT_FUZZ_CHECK(static_cast<char*>(p) + usable <= static_cast<char*>(heap.region()) + region);
        // With guard bytes the usable size is the request: the guard follows it.
        model.add(p, bytes, alignment, options.guard_bytes != 0 ? bytes + options.guard_bytes : usable);
        break;
      }
      case 3:
      case 4: {  // free, without size or through the allocator interface with it
        if (model.empty()) break;
        void* p = model.nth(in.below(model.count()));
        const auto b = model.at(p);
        model.remove(p);
        if (in.coin()) heap.deallocate(p);
        else static_cast<memkit::allocator&>(heap).deallocate(p, b.size, b.alignment);
        ++expected.frees;
        break;
      }
      case 5: {  // resize in place
        if (model.empty()) break;
        void* p = model.nth(in.below(model.count()));
        const auto b = model.at(p);
        const std::size_t new_size = in.coin() ? in.below(4 * options.block_size) : in.below(b.size + 1);
        model.check_contents(p);
        if (static_cast<memkit::allocator&>(heap).resize(p, b.size, new_size, b.alignment)) {
          const std::size_t usable = heap.usable_size(p);
          MEMKIT_FUZZ_CHECK(usable >= new_size);
          const std::size_t kept = b.size < new_size ? b.size : new_size;
          MEMKIT_FUZZ_CHECK(memkit::fuzzing::holds_prefix(static_cast<unsigned char*>(p), b.size, kept, b.id));
          model.resize(p, new_size, options.guard_bytes != 0 ? new_size + options.guard_bytes : usable);
        } else {
          model.check_contents(p);
        }
        break;
      }
      case 6:
        if (in.below(4) == 0) static_cast<void>(heap.trim());
        break;
      default: {  // every live block still holds its contents
        for (const auto& [at, b] : model.blocks()) model.check_contents(reinterpret_cast<void*>(at));
        break;
      }
    }
    check_heap(heap, model, expected);
  }
  while (!model.empty()) {
    void* p = model.nth(0);
    model.remove(p);
    heap.deallocate(p);
    ++expected.frees;
  }
  check_heap(heap, model, expected);
  static_cast<void>(heap.trim());  // sub-block pages kept for reuse go back to the free runs
  check_heap(heap, model, expected);
  MEMKIT_FUZZ_CHECK(heap.statistics().used_bytes == 0);
  return 0;
}
