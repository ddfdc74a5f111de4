// block_heap: inspection — statistics, the fragmentation figure, the walk over runs, validate(),
// allocation-site tracking and its report, and trim().
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "internal.hpp"

namespace memkit {

using namespace block_heap_detail;

// ---- allocation sites -------------------------------------------------------------------------

void block_heap::record_site(void* p, std::size_t size, const memkit::source_location* where) {
  site_table& table = *sites_;
  // Calls through the allocator interface carry no location; they share one "(unknown)" site.
  site_table::key k{"(unknown)", "", 0};
  if (where != nullptr) k = {where->file_name(), where->function_name(), where->line()};
  try {
    auto [it, inserted] = table.index.try_emplace(k, static_cast<std::uint32_t>(table.sites.size()));
    if (inserted) {
      allocation_site site;
      site.file = k.file;
      site.line = k.line;
      site.function = k.function;
      table.sites.push_back(site);
    }
    allocation_site& site = table.sites[it->second];
    ++site.live_allocations;
    ++site.total_allocations;
    site.live_bytes += size;
    table.live[p] = {it->second, size};
  } catch (...) {
    // Out of memory for the bookkeeping: the allocation stands, it is just not tracked.
  }
}

void block_heap::forget_site(void* p) noexcept {
  site_table& table = *sites_;
  auto it = table.live.find(p);
  if (it == table.live.end()) return;
  allocation_site& site = table.sites[it->second.site];
  --site.live_allocations;
  site.live_bytes -= it->second.bytes;
  table.live.erase(it);
}

void block_heap::resize_site(void* p, std::size_t size) noexcept {
  site_table& table = *sites_;
  auto it = table.live.find(p);
  if (it == table.live.end()) return;
  allocation_site& site = table.sites[it->second.site];
  site.live_bytes = site.live_bytes - it->second.bytes + size;
  it->second.bytes = size;
}

std::vector<allocation_site> block_heap::live_allocations_by_site() const {
  lock guard(*this);
  std::vector<allocation_site> out;
  if (!sites_) return out;
  for (const allocation_site& site : sites_->sites)
    if (site.live_allocations != 0) out.push_back(site);
  std::sort(out.begin(), out.end(), [](const allocation_site& a, const allocation_site& b) {
    if (a.live_bytes != b.live_bytes) return a.live_bytes > b.live_bytes;
    if (a.live_allocations != b.live_allocations) return a.live_allocations > b.live_allocations;
    return a.line < b.line;
  });
  return out;
}

std::vector<allocation_site> block_heap::report_live_allocations(std::ostream& out) const {
  std::vector<allocation_site> sites = live_allocations_by_site();
  std::size_t count = 0;
  std::size_t bytes = 0;
  for (const allocation_site& s : sites) {
    count += s.live_allocations;
    bytes += s.live_bytes;
  }
  char line[256];
  if (!options_.track_sites) {
    out << "block_heap: allocation-site tracking is off (block_heap_options::track_sites)\n";
    return sites;
  }
  std::snprintf(line, sizeof line, "block_heap: %zu live allocation%s, %zu bytes, from %zu site%s\n",
                count, count == 1 ? "" : "s", bytes, sites.size(), sites.size() == 1 ? "" : "s");
  out << line;
  if (sites.empty()) return sites;
  out << "      live       bytes  (total)  site\n";
  for (const allocation_site& s : sites) {
    std::snprintf(line, sizeof line, "  %8zu  %10zu  (%5zu)  ", s.live_allocations, s.live_bytes,
                  s.total_allocations);
    out << line << s.file << ':' << s.line;
    if (s.function[0] != '\0') out << "  " << s.function;
    out << '\n';
  }
  return sites;
}

// ---- statistics -------------------------------------------------------------------------------

std::size_t block_heap::largest_free_run() const noexcept {
  lock guard(*this);
  return std::size_t{largest_length()} << block_shift_;
}

double block_heap::fragmentation() const noexcept {
  lock guard(*this);
  if (free_blocks_ == 0) return 0;
  return 1.0 - static_cast<double>(largest_length()) / static_cast<double>(free_blocks_);
}

block_heap_failure block_heap::last_failure() const noexcept {
  lock guard(*this);
  return last_failure_;
}

block_heap_statistics block_heap::statistics() const noexcept {
  lock guard(*this);
  block_heap_statistics s;
  s.region_bytes = region_bytes();
  s.block_size = block_size_;
  s.block_count = block_count_;
  s.free_bytes = free_blocks_ << block_shift_;
  s.used_bytes = s.region_bytes - s.free_bytes;
  s.largest_free_run_bytes = std::size_t{largest_length()} << block_shift_;
  if (commit_steps_ == 0) {
    s.committed_bytes = s.region_bytes;
  } else {
    const std::size_t step_bytes = block_size_ << commit_shift_;
    s.committed_bytes = committed_steps_ * step_bytes;
    const std::size_t last = commit_steps_ - 1;
    if (committed_[last / 64] >> (last % 64) & 1) s.committed_bytes -= commit_steps_ * step_bytes - s.region_bytes;
  }
  s.live_allocations = total_allocations_ - total_frees_;
  s.live_small_allocations = s.live_allocations - live_runs_;
  s.total_allocations = total_allocations_;
  s.total_frees = total_frees_;
  s.failed_allocations = failed_allocations_;
  s.sub_block_pages = small_pages_;
  s.fragmentation =
      free_blocks_ == 0 ? 0 : 1.0 - static_cast<double>(largest_length()) / static_cast<double>(free_blocks_);
  return s;
}

// ---- walk -------------------------------------------------------------------------------------

void block_heap::walk_runs(void (*visit)(void*, const block_run_info&), void* context) const {
  lock guard(*this);
  std::size_t i = 0;
  while (i < block_count_) {
    const tag& t = tags_[i];
    block_run_info info;
    info.address = base_ + (i << block_shift_);
    info.first_block = i;
    switch (t.state) {
      case tag_free:
        info.state = block_run_state::free;
        info.block_count = t.length;
        break;
      case tag_run_head:
        info.state = block_run_state::allocated;
        info.block_count = t.length;
        info.requested_bytes = (std::size_t{t.length} << block_shift_) - t.slack;
        break;
      case tag_sub_block:
        info.state = block_run_state::sub_block;
        info.block_count = 1;
        info.slot_bytes = classes_[t.size_class].slot_bytes;
        info.live_slots = t.used;
        info.slot_capacity = classes_[t.size_class].slots;
        break;
      default:
        // Unreachable while the invariants hold (validate() reports it); stop rather than loop.
        return;
    }
    if (info.block_count == 0) return;
    visit(context, info);
    i += info.block_count;
  }
}

// ---- validate ---------------------------------------------------------------------------------

block_heap_validation block_heap::validate() const {
  lock guard(*this);
  block_heap_validation result;
  result.problem = validate_locked();
  result.ok = result.problem.empty();
  return result;
}

namespace {

// True when the `size` bytes at p all equal `value`, compared eight at a time (validate() runs
// this over every freed slot of a heap with fill patterns).
bool all_bytes_are(const std::byte* p, std::size_t size, std::byte value) noexcept {
  const std::uint64_t word = 0x0101010101010101ull * static_cast<std::uint8_t>(value);
  std::uint64_t difference = 0;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t chunk;
    std::memcpy(&chunk, p + i, sizeof chunk);
    difference |= chunk ^ word;
  }
  for (; i < size; ++i) difference |= static_cast<std::uint8_t>(p[i] ^ value);
  return difference == 0;
}

}  // namespace

// One pass over the tags (O(blocks), plus O(slots) for each sub-block page), one over the
// free-run lists and bitmap (O(blocks)), one over the partial-page lists; two scratch arrays and
// no other allocation, so that a program (or a fuzzer) can afford it after every operation.
std::string block_heap::validate_locked() const {
  if (block_count_ == 0) return {};
  auto at = [](const char* what, std::size_t block) {
    return std::string(what) + " (block " + std::to_string(block) + ")";
  };
  const std::size_t n = block_count_;

  // 1. The runs tile the region; heads and tails agree; no two free runs touch; counters add up.
  // listing[b]: 1 for the first block of a free run that must be in a free-run list (every free
  // run but the top one), 2 once the list walk below has found it there.
  std::vector<std::uint8_t> listing(n, 0);
  std::vector<std::uint8_t> seen;  // free slots of the page being checked
  std::size_t free_blocks = 0, runs = 0, small_live = 0, small_pages = 0, free_runs = 0;
  std::size_t partial_expected = 0;
  std::size_t empty_pages[size_class_count]{};
  bool previous_free = false;
  for (std::size_t i = 0; i < n;) {
    const tag& t = tags_[i];
    if (t.state == tag_sub_block) {
      if (t.size_class >= size_class_count || classes_[t.size_class].slot_bytes > small_limit_)
        return at("sub-block page with an invalid size class", i);
      const size_class& c = classes_[t.size_class];
      if (t.used > t.bump || t.bump > c.slots) return at("sub-block page counts out of range", i);
      // Free slots: every one below bump, no repeats, as many as bump - used.
      seen.assign(c.slots, 0);
      std::size_t free_slots = 0;
      const std::byte* page = base_ + (i << block_shift_);
      for (std::uint32_t offset = t.free_slot; offset != npos; offset = read_link(page + offset)) {
        const std::uint32_t s = offset / c.slot_bytes;
        if (offset % c.slot_bytes != 0 || s >= t.bump || seen[s] != 0)
          return at("sub-block free-slot list is corrupt", i);
        seen[s] = 1;
        if (++free_slots > c.slots) return at("sub-block free-slot list loops", i);
        if (options_.fill_patterns) {
          const std::byte* slot = page + std::size_t{s} * c.slot_bytes;
          MEMKIT_UNPOISON(slot, c.slot_bytes);
          const bool intact = all_bytes_are(slot + sizeof(std::uint32_t), c.slot_bytes - sizeof(std::uint32_t),
                                            static_cast<std::byte>(freed_fill));
          MEMKIT_POISON(slot, c.slot_bytes);
          if (!intact) return at("a freed sub-block slot was written after it was freed", i);
        }
      }
      if (free_slots != t.bump - t.used) return at("sub-block free-slot count differs from bump - used", i);
      if (options_.guard_bytes != 0) {
        for (std::uint32_t s = 0; s < t.bump; ++s) {
          if (seen[s] != 0) continue;
          const std::byte* slot = page + std::size_t{s} * c.slot_bytes;
          std::uint32_t requested;
          std::memcpy(&requested, slot + c.slot_bytes - sizeof requested, sizeof requested);
          if (requested + options_.guard_bytes + sizeof requested > c.slot_bytes)
            return at("a small allocation's stored size was overwritten", i);
          for (std::size_t g = 0; g < options_.guard_bytes; ++g)
            if (slot[requested + g] != static_cast<std::byte>(guard_fill))
              return at("a small allocation's guard bytes were overwritten", i);
        }
      }
      if (t.used == 0) ++empty_pages[t.size_class];
      if (t.used < c.slots) ++partial_expected;
      small_live += t.used;
      ++small_pages;
      ++runs;
      previous_free = false;
      ++i;
      continue;
    }
    if (t.state != tag_free && t.state != tag_run_head) return at("a run starts with a tag that is not a run head", i);
    const std::size_t length = t.length;
    if (length == 0 || i + length > n) return at("run length out of range", i);
    const tag& tail = tags_[i + length - 1];
    if (length > 1) {
      if (tail.length != length) return at("run head and tail disagree on the length", i);
      if (t.state == tag_free && tail.state != tag_free) return at("free run's tail is not marked free", i);
      if (t.state == tag_run_head && tail.state != tag_run_tail) return at("allocated run's tail is not marked", i);
    }
    for (std::size_t j = i + 1; j + 1 < i + length; ++j)
      if (tags_[j].state == tag_run_head || tags_[j].state == tag_sub_block)
        return at("a block inside a run is marked as the start of an allocation", j);
    if (t.state == tag_free) {
      if (previous_free) return at("two free runs touch (coalescing missed)", i);
      previous_free = true;
      free_blocks += length;
      if (i + length == n) {
        if (top_ != i) return at("the free run at the end of the region is not the top run", i);
      } else {
        listing[i] = 1;
        ++free_runs;
      }
    } else {
      previous_free = false;
      ++runs;
      if (t.slack >= (length << block_shift_)) return at("allocated run's requested size is out of range", i);
      if (commit_steps_ != 0) {
        for (std::size_t s = i >> commit_shift_; s <= (i + length - 1) >> commit_shift_; ++s)
          if (!(committed_[s / 64] >> (s % 64) & 1)) return at("an allocated run is not committed", i);
      }
      if (options_.guard_bytes != 0) {
        const std::byte* p = base_ + (i << block_shift_);
        const std::size_t requested = (length << block_shift_) - t.slack;
        for (std::size_t g = 0; g < options_.guard_bytes; ++g)
          if (p[requested + g] != static_cast<std::byte>(guard_fill))
            return at("an allocation's guard bytes were overwritten", i);
      }
    }
    i += length;
  }
  if (free_blocks != free_blocks_) return "free block counter differs from the free runs";
  if (top_ != n && (tags_[top_].state != tag_free || top_ + tags_[top_].length != n))
    return at("the top run is not a free run ending the region", top_);
  if (small_live + live_runs_ != total_allocations_ - total_frees_)
    return "live sub-block count differs from the pages";
  if (small_pages != small_pages_) return "sub-block page counter differs from the pages";
  if (runs - small_pages + small_live != total_allocations_ - total_frees_)
    return "allocation and free counters differ from the live blocks";

  // 2. Each free-run list holds exactly the free runs of its length (their first blocks), doubly
  //    linked; the bitmap's bits are set exactly for non-empty lists, at every level.
  std::size_t listed = 0;
  for (std::size_t length = 1; length <= n; ++length) {
    std::uint32_t head = heads_[length - 1];
    const bool bit = bitmap_[0][(length - 1) / 64] >> ((length - 1) % 64) & 1;
    if (bit != (head != npos)) return "run-length bitmap disagrees with list of length " + std::to_string(length);
    std::uint32_t previous = npos;
    for (std::uint32_t b = head; b != npos; b = tags_[b].next) {
      if (b >= n || tags_[b].state != tag_free || tags_[b].length != length || listing[b] == 0)
        return "free list of length " + std::to_string(length) + " holds a block that is not such a run";
      if (listing[b] == 2) return "free list of length " + std::to_string(length) + " misses or repeats runs";
      listing[b] = 2;
      if (tags_[b].prev != previous) return "free list of length " + std::to_string(length) + " has a broken back link";
      previous = b;
      ++listed;
    }
  }
  if (listed != free_runs) return "some free runs are in no free list";
  for (int level = 1; level < levels_; ++level) {
    for (std::size_t w = 0; w < bitmap_words_[level - 1]; ++w) {
      const bool bit = bitmap_[level][w / 64] >> (w % 64) & 1;
      if (bit != (bitmap_[level - 1][w] != 0)) return "run-length bitmap summary level " + std::to_string(level) + " is stale";
    }
  }

  // 3. Partial-page lists hold exactly the pages with a free or never-used slot; at most one
  //    empty page is kept per class.
  std::size_t partial_total = 0;
  for (std::size_t ci = 0; ci < size_class_count; ++ci) {
    const size_class& c = classes_[ci];
    std::uint32_t previous = npos;
    for (std::uint32_t b = c.partial_head; b != npos; b = tags_[b].next) {
      if (b >= n || tags_[b].state != tag_sub_block || tags_[b].size_class != ci)
        return "partial-page list holds a block that is not a page of its class";
      if (tags_[b].used >= c.slots) return "a full page is on the partial-page list";
      if (tags_[b].prev != previous) return "partial-page list has a broken back link";
      previous = b;
      if (++partial_total > n) return "partial-page list loops";
    }
    if (empty_pages[ci] > 1) return "more than one empty page kept for a size class";
    if ((c.empty_page != npos) != (empty_pages[ci] == 1)) return "kept empty page of a size class is not recorded";
    if (c.empty_page != npos && (c.empty_page >= n || tags_[c.empty_page].state != tag_sub_block ||
                                 tags_[c.empty_page].used != 0 || tags_[c.empty_page].size_class != ci))
      return "kept empty page of a size class is not an empty page of that class";
  }
  if (partial_total != partial_expected) return "a page with free slots is missing from its partial-page list";

  // 4. Site tracking accounts for every live allocation.
  if (sites_) {
    std::size_t tracked = 0;
    for (const allocation_site& s : sites_->sites) tracked += s.live_allocations;
    if (tracked != sites_->live.size()) return "site table counts differ from its live records";
    if (tracked > total_allocations_ - total_frees_) return "site table tracks more allocations than are live";
  }
  return {};
}

// ---- trim -------------------------------------------------------------------------------------

std::size_t block_heap::trim() noexcept {
  lock guard(*this);
  if (block_count_ == 0) return 0;
  release_cached_pages();
  std::size_t released = 0;
  if (commit_steps_ != 0) {
    for (std::size_t i = 0; i < block_count_;) {
      const tag& t = tags_[i];
      const std::size_t length = t.state == tag_sub_block ? 1 : t.length;
      if (t.state == tag_free) released += decommit_free(static_cast<std::uint32_t>(i), t.length);
      i += length == 0 ? 1 : length;
    }
  }
  return released;
}

}  // namespace memkit
