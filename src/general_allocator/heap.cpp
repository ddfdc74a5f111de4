// Thread heaps: creation on a thread's first allocation, abandonment at thread exit and adoption,
// whole, by the next thread that needs a heap (so the number of heaps never exceeds the number of
// threads alive at once, and blocks still live in an exited thread's heap stay valid).
#include <new>

#include "internal.hpp"
#include "memkit/os.hpp"

namespace memkit {
using namespace gpa;

namespace gpa {
constinit thread_local heap* global_heap __attribute__((tls_model("initial-exec"))) = nullptr;
constinit page empty_page;
constinit heap empty_heap;
constinit thread_local heap* direct_heap __attribute__((tls_model("initial-exec"))) = &empty_heap;
}  // namespace gpa

heap* general_allocator::impl::attach_heap() noexcept {
  if (!is_global && !key.created) return nullptr;  // no per-thread slot: nothing can be cached
  heap* h = nullptr;
  {
    lock_guard guard(lock);
    if (!key.created) (void)os::thread_key_create(key, &thread_exit_hook);
    forget_exited_thread(current_thread_id());  // a new thread on a stack an exited one left
    if (abandoned != nullptr) {
      h = abandoned;
      abandoned = h->next_abandoned;
      h->next_abandoned = nullptr;
      has_abandoned.store(abandoned != nullptr, std::memory_order_relaxed);
    }
  }
  const std::uintptr_t tid = current_thread_id();
  if (h == nullptr) {
    auto mapped = os::map(detail::align_up(sizeof(heap), os::page_size()));
    if (!mapped) return nullptr;
    h = new (mapped.value()) heap();
    h->instance = this;
    mapped_bytes.fetch_add(detail::align_up(sizeof(heap), os::page_size()), std::memory_order_relaxed);
    resident_bytes.fetch_add(detail::align_up(sizeof(heap), os::page_size()), std::memory_order_relaxed);
    h->thread_id.store(tid, std::memory_order_relaxed);
    lock_guard guard(lock);
    h->next_registered = heaps.load(std::memory_order_relaxed);
    heaps.store(h, std::memory_order_release);
  } else {
    h->thread_id.store(tid, std::memory_order_relaxed);
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      s->thread_id.store(tid, std::memory_order_relaxed);
    }
  }
  if (is_global) global_heap = direct_heap = h;
  // The key's destructor abandons the heap at thread exit. glibc's first 32 keys need no memory;
  // beyond them setting the value may allocate, which finds global_heap already set.
  if (key.created) (void)os::thread_key_set(key, h);
  // Pages that filled up and were freed into meanwhile. (Not a walk over every page: a thread
  // that starts, adopts a large heap and exits must not cost O(pages).)
  drain_notified(h);
  return h;
}

void general_allocator::impl::collect_heap(heap* h, bool everything) noexcept {
  drain_notified(h);
  for (segment* s = h->segments, *next = nullptr; s != nullptr; s = next) {
    next = s->next;
    for (unsigned i = 0; i < s->page_count; ++i) {
      page* pg = &s->pages[i];
      if (!pg->in_use) continue;
      collect_page(h, pg);
      if (pg->in_full && pg->free != nullptr) {
        pg->in_full = false;
        queue_push_front(queue_of(h, pg), pg);
        queue_changed(h, pg);
        std::uintptr_t expected = tf_notify;
        pg->thread_free.compare_exchange_strong(expected, tf_normal, std::memory_order_acq_rel,
                                                std::memory_order_relaxed);
      }
      if (everything && pg->used == 0 && !pg->in_full &&
          pg->thread_free.load(std::memory_order_relaxed) == 0) {
        // Releasing can release the segment too; `next` was read before.
        const bool last_page = s->used_pages == 1;
        release_page(h, pg);
        if (last_page) break;
      }
    }
  }
}

void general_allocator::impl::collect_abandoned(bool everything) noexcept {
  // Taken off the list for the walk, so that no starting thread adopts one meanwhile; the lock is
  // not held during it (releasing a page can release its segment, which takes the lock). A thread
  // that starts meanwhile gets a new heap.
  heap* taken;
  {
    lock_guard guard(lock);
    taken = abandoned;
    abandoned = nullptr;
    has_abandoned.store(false, std::memory_order_relaxed);
  }
  if (taken == nullptr) return;
  heap* last = nullptr;
  for (heap* h = taken; h != nullptr; h = h->next_abandoned) {
    collect_heap(h, everything);
    last = h;
  }
  lock_guard guard(lock);
  last->next_abandoned = abandoned;
  abandoned = taken;
  has_abandoned.store(true, std::memory_order_relaxed);
}

void general_allocator::impl::forget_exited_thread(std::uintptr_t thread) noexcept {
  if constexpr (!os::has_thread_pointer) return;
  for (std::uintptr_t& t : exited_threads) {
    if (t == thread) t = 0;
  }
}

void general_allocator::impl::abandon_heap(heap* h) noexcept {
  if (h->quarantine_pending != 0) hand_over_quarantined(h);  // debug mode's last frees of the thread
  drain_notified(h);
  // Only what is due: the next thread to start usually adopts this heap and its warm pages.
  purge_heap(h, now_ms(), false);
  h->thread_id.store(0, std::memory_order_relaxed);
  for (segment* s = h->segments; s != nullptr; s = s->next) s->thread_id.store(0, std::memory_order_relaxed);
  lock_guard guard(lock);
  if constexpr (os::has_thread_pointer) exited_threads[exited_thread_count++ % exited_thread_slots] = current_thread_id();
  h->next_abandoned = abandoned;
  abandoned = h;
  has_abandoned.store(true, std::memory_order_relaxed);
}

}  // namespace memkit
