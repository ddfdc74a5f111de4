// Large allocations (above 512 KiB, or aligned beyond 64 KiB): each gets a segment of its own,
// reserved at a 4 MiB-aligned address with the header first, so free() finds it by the same mask
// as small blocks. The reservation is rounded up to 4 MiB, leaving room to grow in place; beyond
// it, os::extend_mapping grows the mapping when the address space after it is free. Freed blocks
// are cached for reuse and returned to the OS after the purge delay.
#include <cstring>
#include <new>

#include "internal.hpp"
#include "memkit/os.hpp"

namespace memkit {
using namespace gpa;

namespace {

constexpr std::size_t max_cached_huge = 16;

std::size_t header_bytes_for(std::size_t alignment) noexcept {
  const std::size_t page_bytes = os::page_size();
  const std::size_t header = detail::align_up(sizeof(segment), page_bytes);
  if (alignment > segment_size) return segment_size;
  return detail::align_up(header, alignment > page_bytes ? alignment : page_bytes);
}

}  // namespace

void* general_allocator::impl::huge_allocate(std::size_t size, std::size_t alignment, bool zeroed,
                                             std::size_t reserve_hint) noexcept {
  const std::size_t page_bytes = os::page_size();
  const std::size_t offset = header_bytes_for(alignment);
  const std::size_t total = detail::align_up(offset + size, page_bytes);
  // Room to grow in place (reallocate passes a hint when it had to move a growing block).
  const std::size_t wanted = detail::align_up(offset + (reserve_hint > size ? reserve_hint : size), page_bytes);
  segment* s = nullptr;
  bool fresh = false;
  if (alignment <= segment_size && huge_cached_count != 0) {
    lock_guard guard(lock);
    // Best fit among the cached blocks (at most max_cached_huge of them).
    segment** best = nullptr;
    for (segment** link = &huge_cached; *link != nullptr; link = &(*link)->next) {
      const std::size_t r = (*link)->reserved_bytes;
      if (r >= total && (best == nullptr || r < (*best)->reserved_bytes)) best = link;
    }
    if (best != nullptr) {
      segment* c = *best;
      *best = c->next;
      --huge_cached_count;
      huge_cached_bytes -= c->reserved_bytes;
      retained_bytes.fetch_sub(c->reserved_bytes, std::memory_order_relaxed);
      s = c;
    }
  }
  std::size_t reserved;
  std::size_t touched;
  if (s != nullptr) {
    reserved = s->reserved_bytes;
    touched = s->pages[0].touched_bytes;
  } else {
    char* base;
    if (alignment <= segment_size) {
      reserved = detail::align_up(wanted, segment_size);
      auto r = os::reserve_aligned(reserved, segment_size);
      if (!r) return nullptr;
      base = static_cast<char*>(r.value());
    } else {
      // The block must sit at an `alignment` boundary with the header 4 MiB before it.
      reserved = total;
      auto r = os::reserve_aligned(reserved + alignment, alignment);
      if (!r) return nullptr;
      char* raw = static_cast<char*>(r.value());
      base = raw + alignment - segment_size;
      (void)os::release(raw, static_cast<std::size_t>(base - raw));
      (void)os::release(base + reserved, segment_size);
    }
    if (!os::commit(base, reserved)) {
      (void)os::release(base, reserved);
      return nullptr;
    }
    s = reinterpret_cast<segment*>(base);
    mapped_bytes.fetch_add(reserved, std::memory_order_relaxed);
    segment_map_set(s, true);
    fresh = true;
    touched = 0;
  }
  new (s) segment();
  s->instance = this;
  s->kind = segment_kind::huge;
  s->page_shift = 63;
  s->page_count = 1;
  s->reserved_bytes = reserved;
  s->huge_offset = offset;
  s->huge_size = total - offset;
  s->huge_requested = size;
  s->huge_live = true;
  s->huge_fresh = fresh;
  page& pg = s->pages[0];
  pg.start = reinterpret_cast<char*>(s) + offset;
  pg.area_end = pg.start + s->huge_size;
  pg.in_use = true;
  pg.reserved = 1;
  pg.capacity = 1;
  pg.used = 1;
  // Resident estimate: what was touched before (a reused block) or will be (the new block).
  pg.touched_bytes = touched > total ? touched : total;
  resident_bytes.fetch_add(pg.touched_bytes - touched, std::memory_order_relaxed);
  {
    lock_guard guard(lock);
    s->prev = nullptr;
    s->next = huge_live;
    if (huge_live != nullptr) huge_live->prev = s;
    huge_live = s;
  }
  large_allocations.fetch_add(1, std::memory_order_relaxed);
  large_live_bytes.fetch_add(s->huge_size, std::memory_order_relaxed);
  note_in_use(static_cast<std::ptrdiff_t>(total));
  if (zeroed && !fresh) std::memset(pg.start, 0, size);
  return pg.start;
}

void general_allocator::impl::huge_free(segment* s) noexcept {
  const std::size_t size = s->huge_size;
  // Read before the block is published to the cache: from then on another thread may reuse or
  // unmap it.
  const std::size_t accounted = s->huge_offset + size;
  const std::uint64_t now = now_ms();
  const bool cache = self->options_.purge_delay_ms != 0;
  bool cached_it = false;
  {
    lock_guard guard(lock);
    if (s->prev != nullptr) s->prev->next = s->next;
    else huge_live = s->next;
    if (s->next != nullptr) s->next->prev = s->prev;
    s->huge_live = false;
    if (cache && huge_cached_count < max_cached_huge &&
        huge_cached_bytes + s->reserved_bytes <= self->options_.retained_limit / 2) {
      s->cached_since_ms = now;
      s->next = huge_cached;
      huge_cached = s;
      ++huge_cached_count;
      huge_cached_bytes += s->reserved_bytes;
      retained_bytes.fetch_add(s->reserved_bytes, std::memory_order_relaxed);
      cached_it = true;
    }
  }
  large_frees.fetch_add(1, std::memory_order_relaxed);
  large_live_bytes.fetch_sub(size, std::memory_order_relaxed);
  note_in_use(-static_cast<std::ptrdiff_t>(accounted));
  if (!cached_it) {
    const std::size_t bytes = s->reserved_bytes;
    mapped_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    resident_bytes.fetch_sub(s->pages[0].touched_bytes, std::memory_order_relaxed);
    segment_map_set(s, false);
    (void)os::release(s, bytes);
  }
  // Older cached blocks may be due.
  purge_caches(now, false);
}

bool general_allocator::impl::huge_resize(segment* s, std::size_t new_size) noexcept {
  if (new_size > max_allocation_size) return false;
  const std::size_t total = detail::align_up(s->huge_offset + new_size, os::page_size());
  std::size_t reserved = s->reserved_bytes;
  if (total > reserved) {
    const std::size_t grown = detail::align_up(total, segment_size);
    if (!os::extend_mapping(s, reserved, grown)) return false;
    mapped_bytes.fetch_add(grown - reserved, std::memory_order_relaxed);
    s->reserved_bytes = reserved = grown;
  } else if (reserved - detail::align_up(total, segment_size) >= 2 * segment_size) {
    // Shrunk well below the reservation: give the tail back.
    const std::size_t kept = detail::align_up(total, segment_size);
    if (os::extend_mapping(s, reserved, kept)) {
      mapped_bytes.fetch_sub(reserved - kept, std::memory_order_relaxed);
      s->reserved_bytes = kept;
      if (s->pages[0].touched_bytes > kept) {
        resident_bytes.fetch_sub(s->pages[0].touched_bytes - kept, std::memory_order_relaxed);
        s->pages[0].touched_bytes = kept;
      }
    }
  }
  const std::size_t old_size = s->huge_size;
  s->huge_size = total - s->huge_offset;
  s->huge_requested = new_size;
  s->pages[0].area_end = s->pages[0].start + s->huge_size;
  if (s->huge_size > old_size) {
    large_live_bytes.fetch_add(s->huge_size - old_size, std::memory_order_relaxed);
    note_in_use(static_cast<std::ptrdiff_t>(s->huge_size - old_size));
    if (total > s->pages[0].touched_bytes) {
      resident_bytes.fetch_add(total - s->pages[0].touched_bytes, std::memory_order_relaxed);
      s->pages[0].touched_bytes = total;
    }
  } else {
    large_live_bytes.fetch_sub(old_size - s->huge_size, std::memory_order_relaxed);
    note_in_use(-static_cast<std::ptrdiff_t>(old_size - s->huge_size));
  }
  return true;
}

}  // namespace memkit
