// Pages: the allocation slow path (collect, extend, retire full pages, fetch a new page), frees
// that need more than a list push, and frees from other threads.
#include <cstring>

#include "internal.hpp"
#include "memkit/os.hpp"

namespace memkit {
using namespace gpa;

namespace gpa {

void extend_page(general_allocator::impl* im, page* pg) noexcept {
  const std::size_t bs = pg->block_size;
  std::size_t n = pg->reserved - pg->capacity;
  // Carve about one OS page at a time so a page's memory is touched only as it is needed.
  const std::size_t os_page = os::page_size();
  const std::size_t step = bs >= os_page ? 1 : os_page / bs;
  if (n > step) n = step;
  char* first = pg->start + static_cast<std::size_t>(pg->capacity) * bs;
  char* p = first;
  for (std::size_t i = 1; i < n; ++i, p += bs) reinterpret_cast<block*>(p)->next = reinterpret_cast<block*>(p + bs);
  reinterpret_cast<block*>(p)->next = pg->free;
  pg->free = reinterpret_cast<block*>(first);
  pg->capacity += static_cast<std::uint32_t>(n);
  const std::size_t touched =
      detail::align_up(static_cast<std::size_t>(pg->capacity) * bs, os_page);
  if (touched > pg->touched_bytes) {
    im->resident_bytes.fetch_add(touched - pg->touched_bytes, std::memory_order_relaxed);
    pg->touched_bytes = touched;
  }
}

namespace {

// Takes the page out of its queue as full, asking to be notified by the next remote free. False
// when remote frees arrived meanwhile (the caller collects them instead).
bool mark_full(page* pg) noexcept {
  std::uintptr_t expected = tf_normal;
  if (pg->thread_free.compare_exchange_strong(expected, tf_notify, std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
    return true;
  }
  // Already notifying (its notification is on the way): the drain will bring it back.
  return expected == tf_notified || expected == tf_notify;
}

// Releases an empty page unless it is the last page of its queue (a thread that allocates and
// frees one block at a time must not map and unmap a page each time).
void maybe_release(general_allocator::impl* im, heap* h, page* pg) noexcept {
  if (pg->used != 0) return;
  // No block can be in flight to a page with no live block, but a notified page may be on the
  // notified stack and must stay until drained.
  const std::uintptr_t tf = pg->thread_free.load(std::memory_order_acquire);
  if ((tf & ~tf_state_mask) != 0 || (tf & tf_state_mask) == tf_notified) return;
  if (pg->in_full) return;
  // (A large-class span holds one block: kept, it would hold its slices for one class only.)
  page_queue& q = queue_of(h, pg);
  if (q.first == pg && pg->next == nullptr && segment_of_page(pg)->kind != segment_kind::large) return;
  im->release_page(h, pg);
}

}  // namespace
}  // namespace gpa

void general_allocator::impl::collect_page(heap* h, page* pg) noexcept {
  (void)h;
  if ((pg->thread_free.load(std::memory_order_relaxed) & ~tf_state_mask) == 0) return;
  // Take the whole list, keeping the notification state.
  const std::uintptr_t taken = pg->thread_free.fetch_and(tf_state_mask, std::memory_order_acquire);
  block* list = reinterpret_cast<block*>(taken & ~tf_state_mask);
  if (list == nullptr) return;
  std::uint32_t count = 1;
  block* tail = list;
  while (tail->next != nullptr) {
    tail = tail->next;
    ++count;
  }
  tail->next = pg->free;
  pg->free = list;
  pg->used -= count;
}

void general_allocator::impl::drain_notified(heap* h) noexcept {
  page* list = h->notified.exchange(nullptr, std::memory_order_acquire);
  while (list != nullptr) {
    page* pg = list;
    list = pg->notify_next;
    pg->notify_next = nullptr;
    pg->thread_free.fetch_and(~tf_state_mask, std::memory_order_acq_rel);  // back to normal
    collect_page(h, pg);
    if (pg->in_full) {
      pg->in_full = false;
      // Behind the current page, which keeps serving while it has blocks.
      queue_push_back(queue_of(h, pg), pg);
      queue_changed(h, pg);
    }
    maybe_release(this, h, pg);
  }
}

void* general_allocator::impl::allocate_slow(heap* h, std::size_t cls, bool debug) noexcept {
  if (h->notified.load(std::memory_order_relaxed) != nullptr) drain_notified(h);
  const bool shared_work = huge_cached_count.load(std::memory_order_relaxed) != 0 ||
                           empty_segments.dirty_count.load(std::memory_order_relaxed) != 0 ||
                           has_abandoned.load(std::memory_order_relaxed);
  if (h->purge_first[0] != nullptr || h->purge_first[1] != nullptr || h->purge_first[2] != nullptr ||
      h->purge_requested.load(std::memory_order_relaxed) || shared_work) {
    const bool everything = h->purge_requested.exchange(false, std::memory_order_relaxed);
    const std::uint64_t now = now_ms();
    purge_heap(h, now, everything);
    // The caches are shared (and locked): look at them at most once per clock tick, and read the
    // tick before writing it, so that threads do not fight over its cache line.
    if (everything || (shared_work && caches_checked_ms.load(std::memory_order_relaxed) != now &&
                       caches_checked_ms.exchange(now, std::memory_order_relaxed) != now)) {
      purge_caches(now, everything);
    }
  }
  page_queue& q = h->queues[debug ? 1 : 0][cls];
  const bool reuse = !(debug && self->options_.never_reuse_addresses);
  for (;;) {
    page* pg = q.first;
    if (pg == nullptr) {
      pg = acquire_page(h, cls, debug);
      if (pg == nullptr) return allocation_failure();
      queue_push_front(q, pg);
      queue_changed(h, debug, cls);
    }
    if (pg->free == nullptr && reuse) collect_page(h, pg);
    if (pg->free == nullptr && pg->capacity < pg->reserved) extend_page(this, pg);
    if (pg->free != nullptr) return pop_free_block(pg);
    if (!mark_full(pg)) continue;  // remote frees arrived: collect them on the next turn
    queue_remove(q, pg);
    queue_changed(h, debug, cls);
    pg->in_full = true;
  }
}

void general_allocator::impl::free_local_slow(heap* h, page* pg) noexcept {
  const errno_keeper keep_errno;
  if (pg->in_full) {
    // Back in the queue, behind the current page, so that it gathers a few free blocks before it
    // serves again (a page that flips between full and not full on every free costs more). Its
    // notify state stays: a remote free then merely pushes it on the notified stack, which is
    // harmless for a page in its queue.
    pg->in_full = false;
    queue_push_back(queue_of(h, pg), pg);
    queue_changed(h, pg);
  }
  if (pg->used == 0) maybe_release(this, h, pg);
}

void general_allocator::impl::free_remote(segment* s, page* pg, block* b) noexcept {
  std::uintptr_t old = pg->thread_free.load(std::memory_order_relaxed);
  std::uintptr_t state;
  do {
    state = old & tf_state_mask;
    b->next = reinterpret_cast<block*>(old & ~tf_state_mask);
  } while (!pg->thread_free.compare_exchange_weak(
      old, reinterpret_cast<std::uintptr_t>(b) | (state == tf_notify ? tf_notified : state),
      std::memory_order_acq_rel, std::memory_order_relaxed));
  if (state != tf_notify) return;
  // The exchange above acquires the owner's tf_notify (set after it last drained the page), so
  // the owner's reset of notify_next happens before the write below. This free made a full page
  // usable again: tell its owner. The page cannot be released before
  // the owner drains it (release requires the normal state), so pushing it is safe.
  heap* owner = s->owner.load(std::memory_order_acquire);
  page* head = owner->notified.load(std::memory_order_relaxed);
  do {
    pg->notify_next = head;
  } while (!owner->notified.compare_exchange_weak(head, pg, std::memory_order_release,
                                                  std::memory_order_relaxed));
}

void general_allocator::impl::release_page(heap* h, page* pg) noexcept {
  queue_remove(queue_of(h, pg), pg);
  queue_changed(h, pg);
  segment* s = segment_of_page(pg);
  bump(h->counters[pg->size_class].pages, static_cast<std::uint64_t>(-1));
  bump(h->counters[pg->size_class].allocations, pg->allocated.load(std::memory_order_relaxed));
  pg->allocated.store(0, std::memory_order_relaxed);
  note_in_use(-static_cast<std::ptrdiff_t>(page_area_bytes(pg)));
  const bool debug = pg->debug;
  pg->in_use = false;  // first: a leak scan that stops this thread here must not read the records
  if (debug) release_records(pg);
  pg->in_full = false;
  pg->free = nullptr;
  pg->used = 0;
  pg->capacity = 0;
  pg->debug = false;
  --s->used_pages;
  if (s->kind == segment_kind::large) {
    release_span(h, pg, debug);
  } else {
    s->free_mask |= std::uint64_t{1} << pg->index;
    if (pg->touched_bytes != 0) {
      h->retained_bytes += pg->touched_bytes;
      retained_bytes.fetch_add(pg->touched_bytes, std::memory_order_relaxed);
      purge_list_append(h, pg, now_ms());
    }
  }
  const unsigned k = static_cast<unsigned>(s->kind);
  if (!s->in_free_list) {
    s->in_free_list = true;
    s->free_prev = nullptr;
    s->free_next = h->free_segments[k];
    if (s->free_next != nullptr) s->free_next->free_prev = s;
    h->free_segments[k] = s;
  }
  // An empty segment goes back to the cache unless it is the heap's only one with free pages.
  if (s->used_pages == 0 && (h->free_segments[k] != s || s->free_next != nullptr)) {
    release_segment(h, s);
  }
}

}  // namespace memkit
