// Statistics: per-heap and per-page counters summed on demand (the fast paths only bump counters
// of their own heap's pages, with no locked instruction), and their text form, written without
// malloc.
#include <cstdio>

#include "internal.hpp"
#include "report.hpp"

namespace memkit {
using namespace gpa;

general_allocator_statistics general_allocator::statistics() const noexcept {
  general_allocator_statistics s;
  impl* im = impl_;
  s.size_class_count = class_count;
  for (std::size_t c = 0; c < class_count; ++c) s.size_classes[c].block_size = class_block_size(c);
  if (im == nullptr) return s;
  // Blocks freed into exited threads' heaps count as freed once collected; nobody else would.
  im->collect_abandoned(false);
  // Under the lock under which heaps link and unlink their segments: the walk sees whole lists,
  // and no segment it reads leaves for the cache (or is unmapped) meanwhile. Page fields the
  // owners change meanwhile are atomic.
  lock_guard guard(im->lock);
  for (heap* h = im->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    ++s.heaps;
    for (std::size_t c = 0; c < class_count; ++c) {
      s.size_classes[c].allocations += h->counters[c].allocations.load(std::memory_order_relaxed);
      s.size_classes[c].pages += static_cast<std::size_t>(h->counters[c].pages.load(std::memory_order_relaxed));
    }
    // Live blocks are counted in the pages (the fast paths do not count frees): a snapshot of a
    // running thread's heap.
    for (segment* seg = h->segments; seg != nullptr; seg = seg->next) {
      for (unsigned i = 0; i < seg->page_count; ++i) {
        const page& pg = seg->pages[i];
        if (!pg.in_use) continue;
        s.size_classes[pg.size_class].live_blocks += pg.used;
        s.size_classes[pg.size_class].allocations += pg.allocated.load(std::memory_order_relaxed);
      }
    }
  }
  for (std::size_t c = 0; c < class_count; ++c) {
    auto& k = s.size_classes[c];
    if (k.live_blocks > k.allocations) k.live_blocks = k.allocations;
    k.frees = k.allocations - k.live_blocks;
    s.allocations += k.allocations;
    s.frees += k.frees;
    s.live_bytes += static_cast<std::size_t>(k.live_blocks) * k.block_size;
  }
  s.huge_allocations = im->huge_allocations.load(std::memory_order_relaxed);
  s.huge_frees = im->huge_frees.load(std::memory_order_relaxed);
  s.huge_live_bytes = im->huge_live_bytes.load(std::memory_order_relaxed);
  s.allocations += s.huge_allocations;
  s.frees += s.huge_frees;
  s.live_bytes += s.huge_live_bytes;
  const std::size_t peak = im->peak_in_use_bytes.load(std::memory_order_relaxed);
  s.peak_live_bytes = peak > s.live_bytes ? peak : s.live_bytes;
  s.resident_bytes = im->resident_bytes.load(std::memory_order_relaxed);
  s.mapped_bytes = im->mapped_bytes.load(std::memory_order_relaxed);
  s.retained_bytes = im->retained_bytes.load(std::memory_order_relaxed);
  return s;
}


void general_allocator::print_statistics(int fd) const noexcept {
  const general_allocator_statistics s = statistics();
  auto ull = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  diagnostics::print(fd, "memkit general_allocator statistics\n");
  diagnostics::print(fd, "  live      %zu bytes (peak in use %zu)\n  resident  %zu bytes (estimate), "
                           "mapped %zu, retained empty %zu\n",
                           s.live_bytes, s.peak_live_bytes, s.resident_bytes, s.mapped_bytes,
                           s.retained_bytes);
  diagnostics::print(fd, "  calls     %llu allocations, %llu frees; huge: %llu allocations, %llu frees, "
                           "%zu bytes live; %zu heaps\n",
                           ull(s.allocations), ull(s.frees), ull(s.huge_allocations), ull(s.huge_frees),
                           s.huge_live_bytes, s.heaps);
  diagnostics::print(fd, "  %10s %14s %14s %12s %8s\n", "block", "allocations", "frees",
                           "live", "pages");
  for (std::size_t c = 0; c < s.size_class_count; ++c) {
    const auto& k = s.size_classes[c];
    if (k.allocations == 0 && k.pages == 0) continue;
    diagnostics::print(fd, "  %10zu %14llu %14llu %12llu %8zu\n", k.block_size,
                             ull(k.allocations), ull(k.frees), ull(k.live_blocks), k.pages);
  }
}

}  // namespace memkit
