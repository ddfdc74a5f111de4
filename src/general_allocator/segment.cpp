// Segments: 4 MiB-aligned reservations cut into pages, the process-wide segment map, the cache of
// empty segments, and purging (returning the memory of empty pages to the OS).
#include <new>

#include "internal.hpp"
#include "memkit/os.hpp"

namespace memkit {
using namespace gpa;

namespace gpa {

std::uint64_t segment_map[segment_map_words];

void segment_map_set(const segment* s, bool present) noexcept {
  const std::uintptr_t index = reinterpret_cast<std::uintptr_t>(s) >> segment_shift;
  if (index / 64 >= segment_map_words) return;
  const std::uint64_t bit = std::uint64_t{1} << (index % 64);
  std::atomic_ref<std::uint64_t> word(segment_map[index / 64]);
  if (present) word.fetch_or(bit, std::memory_order_relaxed);
  else word.fetch_and(~bit, std::memory_order_relaxed);
}

std::uint64_t now_ms() noexcept { return os::monotonic_ms(); }

std::size_t segment_header_touched() noexcept { return detail::align_up(sizeof(segment), os::page_size()); }

namespace {

void purge_list_remove(heap* h, page* pg) noexcept {
  const unsigned kind = static_cast<unsigned>(segment_of_page(pg)->kind);
  if (pg->prev != nullptr) pg->prev->next = pg->next;
  else h->purge_first[kind] = pg->next;
  if (pg->next != nullptr) pg->next->prev = pg->prev;
  else h->purge_last[kind] = pg->prev;
  pg->next = pg->prev = nullptr;
  pg->on_purge_list = false;
}

// The first of `n` consecutive set bits of `mask`, or 64 when there is no such run.
unsigned first_run(std::uint64_t mask, unsigned n) noexcept {
  std::uint64_t run = mask;
  for (unsigned i = 1; i < n && run != 0; ++i) run &= mask >> i;
  return run != 0 ? static_cast<unsigned>(std::countr_zero(run)) : 64u;
}

// The bits of slices [first, first + n).
std::uint64_t run_bits(unsigned first, unsigned n) noexcept {
  return (n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1) << first;
}

// Bytes of the slices in `bits`.
std::size_t slice_bytes(std::uint64_t bits) noexcept {
  return static_cast<std::size_t>(std::popcount(bits)) << slice_shift;
}

void free_list_remove(heap* h, segment* s) noexcept {
  const unsigned k = static_cast<unsigned>(s->kind);
  if (s->free_prev != nullptr) s->free_prev->free_next = s->free_next;
  else h->free_segments[k] = s->free_next;
  if (s->free_next != nullptr) s->free_next->free_prev = s->free_prev;
  s->free_next = s->free_prev = nullptr;
  s->in_free_list = false;
}

}  // namespace
}  // namespace gpa

void general_allocator::impl::note_in_use(std::ptrdiff_t delta) noexcept {
  const std::size_t now = in_use_bytes.fetch_add(static_cast<std::size_t>(delta), std::memory_order_relaxed) +
                          static_cast<std::size_t>(delta);
  if (delta <= 0) return;
  std::size_t peak = peak_in_use_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_in_use_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// At a limit: releases what the shared caches hold (cached huge blocks, empty segments) and says
// whether that unmapped anything, i.e. whether a refused mapping is worth trying once more.
bool general_allocator::impl::give_back_caches() noexcept {
  const std::size_t mapped_before = mapped_bytes.load(std::memory_order_relaxed);
  purge_caches(now_ms(), true);
  return mapped_bytes.load(std::memory_order_relaxed) < mapped_before;
}

// A fresh segment, reserved 4 MiB-aligned and committed; null if the system refuses either.
segment* general_allocator::impl::reserve_segment() noexcept {
  auto reserved = os::reserve_aligned(segment_size, segment_size);
  if (!reserved) return nullptr;
  if (!os::commit(reserved.value(), segment_size)) {
    (void)os::release(reserved.value(), segment_size);
    return nullptr;
  }
  return static_cast<segment*>(reserved.value());
}

// The first segment of the clean cache (under the lock; the cache is not empty). One whose pages
// were discarded after its wait and are wanted again soon after says that the wait was too short
// for this program: empty segments wait twice as long from now on (segment_cache::wait_delays).
segment* general_allocator::impl::take_clean_segment() noexcept {
  segment* s = empty_segments.clean;
  empty_segments.clean = s->next;
  if (s->discarded_when_due &&
      now_ms() - s->cached_since_ms < gpa::segment_cache::max_wait_delays * std::uint64_t{self->options_.purge_delay_ms}) {
    empty_segments.wait_delays = std::min(2 * empty_segments.wait_delays, gpa::segment_cache::max_wait_delays);
  }
  return s;
}

segment* general_allocator::impl::acquire_segment(heap* h, segment_kind kind) noexcept {
  segment* s = nullptr;
  {
    lock_guard guard(lock);
    if (empty_segments.dirty_first != nullptr) {  // warm memory first
      s = empty_segments.dirty_first;
      empty_segments.dirty_first = s->next;
      if (empty_segments.dirty_first != nullptr) empty_segments.dirty_first->prev = nullptr;
      else empty_segments.dirty_last = nullptr;
    } else if (empty_segments.clean != nullptr && kind != segment_kind::large) {
      s = take_clean_segment();
    }
  }
  if (s != nullptr && s->dirty_bytes != 0) {
    // Taken back before its purge: the memory is still there; its pages account for it again as
    // they are carved.
    empty_segments.dirty_count.fetch_sub(1, std::memory_order_relaxed);
    retained_bytes.fetch_sub(s->dirty_bytes, std::memory_order_relaxed);
    resident_bytes.fetch_sub(s->dirty_bytes, std::memory_order_relaxed);
  }
  std::size_t adopted = 0;  // bytes a freed huge block left resident in the segment
  // A segment of spans takes the resident pages a cached huge block left before a clean segment,
  // whose pages would all fault in afresh.
  if (s == nullptr && kind == segment_kind::large) {
    s = segment_from_cached_huge(adopted);
    if (s == nullptr) {
      lock_guard guard(lock);
      if (empty_segments.clean != nullptr) s = take_clean_segment();
    }
  }
  if (s == nullptr) {
    s = reserve_segment();
    if (s == nullptr) {
      // Freed memory kept for reuse holds address space and commit charge: cached huge blocks
      // (which segments of small and medium pages never take) and empty segments. Under a limit
      // (RLIMIT_AS, a commit limit), give them back and, if that unmapped anything, try once
      // more before refusing, as huge_allocate does. Only the shared caches: the heap's own free
      // pages hold no address space of their own, and the quarantine is not flushed from inside
      // an allocation of this heap.
      if (give_back_caches()) s = reserve_segment();
      if (s == nullptr) return nullptr;
    }
    claims::claim(s, segment_size, "acquire_segment");
    mapped_bytes.fetch_add(segment_size, std::memory_order_relaxed);
    resident_bytes.fetch_add(segment_header_touched(), std::memory_order_relaxed);
    segment_map_set(s, true);
  }
  new (s) segment();
  const unsigned k = static_cast<unsigned>(kind);
  s->instance = this;
  s->kind = kind;
  s->page_shift = static_cast<std::uint8_t>(page_shift_of[k]);
  s->page_count = static_cast<std::uint8_t>(segment_size >> page_shift_of[k]);
  s->reserved_bytes = segment_size;
  char* base = reinterpret_cast<char*>(s);
  for (unsigned i = 0; i < s->page_count; ++i) {
    page& pg = s->pages[i];
    const std::size_t begin = std::size_t{i} << s->page_shift;
    pg.index = static_cast<std::uint8_t>(i);
    pg.start = base + (begin < segment_header_bytes ? segment_header_bytes : begin);
    pg.area_end = base + ((std::size_t{i} + 1) << s->page_shift);
    if (pg.start < pg.area_end) s->free_mask |= std::uint64_t{1} << i;
  }
  if (adopted != 0) {
    // Its resident slices are free and idle, as release_span leaves them.
    const auto n = static_cast<unsigned>((adopted + slice_size - 1) >> slice_shift);
    s->resident_mask = n > 1 ? run_bits(1, n - 1) : 0;
    s->pages[0].touched_bytes = slice_bytes(s->resident_mask);
    h->retained_bytes += s->pages[0].touched_bytes;
    retained_bytes.fetch_add(s->pages[0].touched_bytes, std::memory_order_relaxed);
    resident_bytes.fetch_add(segment_header_touched() + s->pages[0].touched_bytes, std::memory_order_relaxed);
  }
  s->owner.store(h, std::memory_order_release);
  s->thread_id.store(h->thread_id.load(std::memory_order_relaxed), std::memory_order_relaxed);
  {
    lock_guard guard(lock);  // statistics() walks every heap's list under the lock
    s->prev = nullptr;
    s->next = h->segments;
    if (h->segments != nullptr) h->segments->prev = s;
    h->segments = s;
  }
  s->in_free_list = true;
  s->free_next = h->free_segments[k];
  if (s->free_next != nullptr) s->free_next->free_prev = s;
  h->free_segments[k] = s;
  if (adopted != 0 && s->pages[0].touched_bytes != 0) purge_list_append(h, &s->pages[0], now_ms());
  return s;
}

void general_allocator::impl::release_segment(heap* h, segment* s) noexcept {
  std::size_t retained = 0;
  for (unsigned i = 0; i < s->page_count; ++i) {
    page& pg = s->pages[i];
    if (pg.on_purge_list) {
      purge_list_remove(h, &pg);
      retained += pg.touched_bytes;
    }
  }
  h->retained_bytes -= retained;  // still retained, by the cache now
  if (s->in_free_list) free_list_remove(h, s);
  lock_guard guard(lock);  // statistics() walks every heap's list under the lock
  if (s->prev != nullptr) s->prev->next = s->next;
  else h->segments = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  s->thread_id.store(0, std::memory_order_relaxed);
  s->owner.store(nullptr, std::memory_order_relaxed);
  // Cached, not unmapped: a segment header stays readable for the allocator's lifetime (until
  // purge()), so statistics() and report_leaks() can walk heaps from another thread. Its touched
  // pages are discarded by purge_caches() once its wait has passed (segment_cache::wait_delays
  // purge delays; ten for a segment of spans), not now: discarding costs a TLB shootdown on every
  // core, and a busy program takes the segment back soon.
  s->dirty_bytes = retained;
  s->cached_since_ms = now_ms();
  if (retained != 0) {
    empty_segments.dirty_count.fetch_add(1, std::memory_order_relaxed);
    s->prev = nullptr;
    s->next = empty_segments.dirty_first;
    if (empty_segments.dirty_first != nullptr) empty_segments.dirty_first->prev = s;
    else empty_segments.dirty_last = s;
    empty_segments.dirty_first = s;
  } else {
    s->discarded_when_due = false;
    s->next = empty_segments.clean;
    empty_segments.clean = s;
  }
}

namespace {

// Sets up a free page (or span), whose memory area is set, for blocks of class `cls`. False if
// its debug records cannot be mapped.
bool prepare_page(general_allocator::impl& im, page* pg, std::size_t cls, bool debug) noexcept {
  const std::size_t bs = class_block_size(cls);
  pg->size_class = static_cast<std::uint8_t>(cls);
  pg->block_size = static_cast<std::uint32_t>(bs);
  pg->reciprocal = ~std::uint64_t{0} / bs + 1;
  pg->reserved = static_cast<std::uint32_t>(page_area_bytes(pg) / bs);
  pg->used = 0;
  pg->free = nullptr;
  pg->thread_free.store(0, std::memory_order_relaxed);
  pg->in_full = false;
  pg->debug = debug;
  pg->capacity = static_cast<std::uint32_t>(first_block_index(pg));  // a debug page's guard is never carved
  pg->next = pg->prev = nullptr;
  if (!debug) return true;
  if (!im.setup_records(pg)) return false;
  im.fill_page_guard(pg);
  return true;
}

}  // namespace

// Large classes take a span of whole 64 KiB slices of a large-kind segment, one block per span.
// A freed span's slices stay free and resident for whatever span fits next, so the memory one
// large block touched serves the next one of any size in place (mimalloc's spans, inside 4 MiB
// segments). A segment's free resident slices wait on the purge list, represented by the
// descriptor of its header slice (never a span), which carries their bytes in touched_bytes.
page* general_allocator::impl::acquire_span(heap* h, std::size_t cls, bool debug) noexcept {
  constexpr unsigned kind = static_cast<unsigned>(segment_kind::large);
  constexpr int max_segments_looked_at = 8;  // then a new segment: bounded time
  const std::size_t bs = class_block_size(cls);
  // In debug mode the span takes one more slice, before the page's: its last bytes are the page's
  // guard, the rest is never touched. (A block's slot fills its span to the end as often as not, so
  // the end of the span before it cannot be the guard.)
  const unsigned guard = debug ? 1 : 0;
  const auto n = static_cast<unsigned>((bs + slice_size - 1) >> slice_shift) + guard;
  segment* s = h->free_segments[kind];
  unsigned first = 64;
  for (int looked = 0; s != nullptr && looked < max_segments_looked_at; s = s->free_next, ++looked) {
    first = first_run(s->free_mask, n);
    if (first < 64) break;
  }
  if (first >= 64) {
    s = acquire_segment(h, segment_kind::large);
    if (s == nullptr) return nullptr;
    first = first_run(s->free_mask, n);
  }
  page* pg = &s->pages[first + guard];
  pg->area_end = pg->start + (std::size_t{n - guard} << slice_shift);  // under two blocks: holds one
  if (!prepare_page(*this, pg, cls, debug)) {
    pg->area_end = pg->start + slice_size;
    return nullptr;
  }
  const std::uint64_t bits = run_bits(first, n);
  // Slices already resident leave the segment's retained count; the others become resident.
  page* node = &s->pages[0];
  if (const std::size_t reused = slice_bytes(bits & s->resident_mask); reused != 0) {
    node->touched_bytes -= reused;
    h->retained_bytes -= reused;
    retained_bytes.fetch_sub(reused, std::memory_order_relaxed);
    if (node->touched_bytes == 0 && node->on_purge_list) purge_list_remove(h, node);
  }
  resident_bytes.fetch_add(slice_bytes(bits & ~s->resident_mask), std::memory_order_relaxed);
  s->resident_mask |= bits;
  pg->touched_bytes = std::size_t{n} << slice_shift;  // counted above: extend_page adds nothing
  for (unsigned j = first; j < first + n; ++j) {
    if (j != pg->index) s->pages[j].span_head = pg->index;  // the guard's slice too: no block there
  }
  pg->in_use = true;
  s->free_mask &= ~bits;
  ++s->used_pages;
  // Out of the list once no span of the smallest large class (2 slices) fits.
  if (first_run(s->free_mask, 2) >= 64 && s->in_free_list) free_list_remove(h, s);
  bump(h->counters[cls].pages);
  note_in_use(static_cast<std::ptrdiff_t>(page_area_bytes(pg)));
  extend_page(this, pg);
  return pg;
}

// The slices of a freed span become free; as they stay resident, the segment's node goes to the
// back of the purge list with their bytes. Called by release_page.
void general_allocator::impl::release_span(heap* h, page* pg, bool guarded) noexcept {
  segment* s = segment_of_page(pg);
  const unsigned guard = guarded ? 1 : 0;  // a debug span's slice before the page's
  const auto n = static_cast<unsigned>(page_area_bytes(pg) >> slice_shift) + guard;
  const std::uint64_t bits = run_bits(pg->index - guard, n);
  s->free_mask |= bits;
  pg->area_end = pg->start + slice_size;  // acquire_segment's layout again
  pg->touched_bytes = 0;
  page* node = &s->pages[0];
  if (node->on_purge_list) purge_list_remove(h, node);
  const std::size_t idle = slice_bytes(bits & s->resident_mask);
  node->touched_bytes += idle;
  h->retained_bytes += idle;
  retained_bytes.fetch_add(idle, std::memory_order_relaxed);
  if (node->touched_bytes != 0) purge_list_append(h, node, now_ms());
}

page* general_allocator::impl::acquire_page(heap* h, std::size_t cls, bool debug) noexcept {
  const segment_kind kind = kind_of_class(cls);
  if (kind == segment_kind::large) return acquire_span(h, cls, debug);
  const unsigned k = static_cast<unsigned>(kind);
  segment* s;
  unsigned index;
  if (page* hot = h->purge_last[k]) {
    // The most recently freed page: its memory is still resident and likely cached.
    s = segment_of_page(hot);
    index = hot->index;
  } else {
    s = h->free_segments[k];
    if (s == nullptr) {
      s = acquire_segment(h, kind);
      if (s == nullptr) return nullptr;
    }
    index = static_cast<unsigned>(std::countr_zero(s->free_mask));
  }
  page* pg = &s->pages[index];
  if (pg->on_purge_list) {
    purge_list_remove(h, pg);
    h->retained_bytes -= pg->touched_bytes;
    retained_bytes.fetch_sub(pg->touched_bytes, std::memory_order_relaxed);
  }
  if (!prepare_page(*this, pg, cls, debug)) return nullptr;
  pg->in_use = true;
  s->free_mask &= ~(std::uint64_t{1} << index);
  ++s->used_pages;
  if (s->free_mask == 0) free_list_remove(h, s);
  bump(h->counters[cls].pages);
  note_in_use(static_cast<std::ptrdiff_t>(page_area_bytes(pg)));
  extend_page(this, pg);
  return pg;
}

void general_allocator::impl::purge_heap(heap* h, std::uint64_t now, bool everything) noexcept {
  // A free page in a segment that still holds blocks is likely reused soon, and discarding costs a
  // TLB shootdown on every core: wait ten purge delays (as freed huge blocks do).
  const std::uint64_t delay = std::uint64_t{10} * self->options_.purge_delay_ms;
  const std::size_t limit = self->options_.retained_limit;
  for (unsigned k = 0; k < page_kind_count; ++k) {
    while (page* pg = h->purge_first[k]) {
      if (!everything && now - pg->free_since_ms < delay &&
          retained_bytes.load(std::memory_order_relaxed) <= limit) {
        break;
      }
      purge_list_remove(h, pg);
      segment* s = segment_of_page(pg);
      if (s->kind == segment_kind::large) {
        // A span segment's node (its header slice's descriptor): its free slices that are resident.
        const std::uint64_t idle = s->free_mask & s->resident_mask;
        for (std::uint64_t rest = idle; rest != 0;) {
          const unsigned first = static_cast<unsigned>(std::countr_zero(rest));
          const unsigned n = static_cast<unsigned>(std::countr_zero(~(rest >> first)));
          (void)os::discard(reinterpret_cast<char*>(s) + (std::size_t{first} << slice_shift),
                            std::size_t{n} << slice_shift);
          rest &= ~run_bits(first, n);
        }
        s->resident_mask &= ~idle;
      } else {
        // Only what was touched (pages start 4 KiB-aligned: they begin at 64 KiB boundaries).
        (void)os::discard(pg->start, detail::align_up(pg->touched_bytes, os::page_size()));
      }
      h->retained_bytes -= pg->touched_bytes;
      retained_bytes.fetch_sub(pg->touched_bytes, std::memory_order_relaxed);
      resident_bytes.fetch_sub(pg->touched_bytes, std::memory_order_relaxed);
      pg->touched_bytes = 0;
    }
  }
}

void general_allocator::impl::purge_caches(std::uint64_t now, bool everything) noexcept {
  const std::uint64_t delay = self->options_.purge_delay_ms;
  const bool over_limit = retained_bytes.load(std::memory_order_relaxed) > self->options_.retained_limit;
  segment* to_release = nullptr;
  segment* to_discard = nullptr;
  {
    lock_guard guard(lock);
    // Heaps of exited threads have no owner to purge their free pages: whoever looks at the caches
    // does it for them, under the lock that keeps a starting thread from adopting one meanwhile.
    for (heap* h = abandoned; h != nullptr; h = h->next_abandoned) purge_heap(h, now, everything);
    // Freed huge blocks wait ten delays, like free pages: refaulting megabytes costs more than a
    // segment's worth of pages, and the cache is bounded by retained_limit.
    segment** link = &huge_cached;
    while (segment* s = *link) {
      if (everything || over_limit || now - s->cached_since_ms >= 10 * delay) {
        *link = s->next;
        --huge_cached_count;
        huge_cached_bytes -= s->pages[0].touched_bytes;
        retained_bytes.fetch_sub(s->pages[0].touched_bytes, std::memory_order_relaxed);
        s->next = to_release;
        to_release = s;
      } else {
        link = &s->next;
      }
    }
    if (everything) {
      while (segment* s = empty_segments.clean) {
        empty_segments.clean = s->next;
        s->next = to_release;
        to_release = s;
      }
      while (segment* s = empty_segments.dirty_first) {
        empty_segments.dirty_first = s->next;
        s->next = to_release;
        to_release = s;
      }
      empty_segments.dirty_last = nullptr;
    } else {
      // Oldest first, only those due. They leave the cache while they are discarded (outside the
      // lock), so no thread can take one back meanwhile. Empty segments of spans wait ten delays,
      // as free pages and freed huge blocks do: their pages serve huge blocks
      // (recycle_dirty_segment in huge.cpp), which would otherwise fault the same megabytes in
      // again. Those of small and medium pages wait wait_delays, one delay until the program
      // shows that it takes discarded segments back (a heap whose blocks another thread frees in
      // bursts, a producer and its consumer, empties several segments at once and refills them a
      // few milliseconds later: after one delay, the producer-consumer workload faulted in 4 MiB
      // segments about 50 times a second, 6-10x mimalloc's page faults; after ten, a program
      // that empties its segments once holds their pages ten times as long). The walk passes
      // over those of spans not yet due and stops at the first other one that is not.
      const std::uint64_t wait = std::uint64_t{empty_segments.wait_delays} * delay;
      bool waited_in_vain = false;
      segment* s = empty_segments.dirty_last;
      while (s != nullptr) {
        segment* newer = s->prev;
        const bool spans = s->kind == segment_kind::large;
        if (!over_limit && now - s->cached_since_ms < (spans ? 10 * delay : wait)) {
          if (!spans) break;
          s = newer;
          continue;
        }
        s->discarded_when_due = !over_limit && !spans;
        waited_in_vain = waited_in_vain || s->discarded_when_due;
        if (newer != nullptr) newer->next = s->next;
        else empty_segments.dirty_first = s->next;
        if (s->next != nullptr) s->next->prev = newer;
        else empty_segments.dirty_last = newer;
        s->next = to_discard;
        to_discard = s;
        s = newer;
      }
      if (waited_in_vain && empty_segments.wait_delays > 1) --empty_segments.wait_delays;
    }
  }
  if (to_discard != nullptr) {
    segment* last = to_discard;
    for (segment* s = to_discard; s != nullptr; s = s->next) {
      (void)os::discard(reinterpret_cast<char*>(s) + segment_header_bytes, segment_size - segment_header_bytes);
      empty_segments.dirty_count.fetch_sub(1, std::memory_order_relaxed);
      retained_bytes.fetch_sub(s->dirty_bytes, std::memory_order_relaxed);
      resident_bytes.fetch_sub(s->dirty_bytes, std::memory_order_relaxed);
      s->dirty_bytes = 0;
      s->cached_since_ms = now;  // from now on, when it was discarded (take_clean_segment)
      last = s;
    }
    lock_guard guard(lock);
    last->next = empty_segments.clean;
    empty_segments.clean = to_discard;
  }
  while (segment* s = to_release) {
    to_release = s->next;
    const std::size_t bytes = s->reserved_bytes;
    const bool huge = s->kind == segment_kind::huge;
    mapped_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    std::size_t resident = huge ? s->pages[0].touched_bytes : segment_header_touched();
    if (!huge && s->dirty_bytes != 0) {
      empty_segments.dirty_count.fetch_sub(1, std::memory_order_relaxed);
      retained_bytes.fetch_sub(s->dirty_bytes, std::memory_order_relaxed);
      resident += s->dirty_bytes;
    }
    resident_bytes.fetch_sub(resident, std::memory_order_relaxed);
    segment_map_set(s, false);
    claims::drop(s, bytes, "purge_caches");
    (void)os::release(s, bytes);
  }
}

}  // namespace memkit
