// memkit::general_allocator: construction, the public entry points and their fast paths. The
// slow paths live beside this file: page.cpp (refill, cross-thread frees), segment.cpp (pages,
// segments, purging), heap.cpp (thread heaps), huge.cpp (own-mapping blocks), debug.cpp (checks
// and reports), statistics.cpp.
#include "memkit/general_allocator.hpp"

#include <cstring>
#include <new>

#include "internal.hpp"
#include "report.hpp"
#include "memkit/os.hpp"
#include "memkit/detail/stack_trace.hpp"

namespace memkit {
using namespace gpa;

namespace {

void on_thread_exit(void* value) {
  auto* h = static_cast<heap*>(value);
  general_allocator::impl* im = h->instance;
  if (im->is_global) {
    global_heap = nullptr;
    direct_heap = &empty_heap;  // a later allocation of this thread attaches a heap again
  }
  im->abandon_heap(h);
}

void init_impl(general_allocator::impl* im, general_allocator* self, bool global) noexcept {
  im->self = self;
  im->is_global = global;
  (void)os::thread_key_create(im->key, &on_thread_exit);
}

std::size_t impl_bytes() noexcept { return detail::align_up(sizeof(general_allocator::impl), os::page_size()); }

}  // namespace

general_allocator::general_allocator() noexcept : general_allocator(options{}) {}

general_allocator::general_allocator(const options& opts) noexcept : options_(opts) {
  if (options_.stack_frames > max_stack_frames) options_.stack_frames = max_stack_frames;
  auto mapped = os::map(impl_bytes());
  if (!mapped) return;  // every allocation will fail cleanly
  impl_ = new (mapped.value()) impl();
  init_impl(impl_, this, false);
}

// The global instance and its state are constant-initialized static objects: no constructor
// runs, so no initialization order can reach them too early, and the holder's destructor does
// nothing, so they outlive every static destructor that frees memory. Its thread-exit key is
// created by the first heap attach (heap.cpp).
struct global_instance_holder {
  union {
    general_allocator instance;
  };
  constexpr global_instance_holder() noexcept;
  ~global_instance_holder() {}  // never destroys `instance`
};

extern global_instance_holder global_holder;
constinit general_allocator::impl global_impl{&global_holder.instance, true};
constexpr global_instance_holder::global_instance_holder() noexcept
    : instance(general_allocator::global_tag{}, &global_impl) {}
constinit global_instance_holder global_holder;

void thread_exit_hook(void* value) { on_thread_exit(value); }

general_allocator::~general_allocator() {
  if (impl_ == nullptr) return;
  impl_->release_everything();
  os::thread_key_delete(impl_->key);
  impl_->~impl();
  (void)os::release(impl_, impl_bytes());
}

general_allocator& general_allocator::global() noexcept { return global_holder.instance; }

void general_allocator::configure(const options& opts) noexcept {
  const bool release_quarantine = opts.quarantine_bytes < options_.quarantine_bytes || !opts.debug;
  options_ = opts;
  if (options_.stack_frames > max_stack_frames) options_.stack_frames = max_stack_frames;
  fast_ = global_ && !options_.debug;
  if (impl_ != nullptr && impl_->direct_on != fast_) {
    impl_->direct_on = fast_;
    impl_->refresh_direct();
  }
  if (impl_ != nullptr && release_quarantine) impl_->flush_quarantine(true);
}

// Points every heap's direct entries at its queues' first pages, or at empty_page while they are
// off (configure(), which no allocation runs concurrently with).
void general_allocator::impl::refresh_direct() noexcept {
  for (heap* h = heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (std::size_t c = 0; c < class_count && class_block_size(c) <= direct_max; ++c) queue_changed(h, false, c);
  }
}

// ---- allocation ---------------------------------------------------------------------------------

namespace {

// Everything allocate() does not finish inline (private instances, first use of a thread, other
// sizes and alignments, debug mode) takes the generic path. Out of line so the fast path needs no
// stack frame.
[[gnu::noinline]] void* allocate_fallback(general_allocator::impl* im, std::size_t size,
                                          std::size_t alignment) noexcept {
  if (im == nullptr) return allocation_failure();
  return im->allocate_generic(size, alignment, false);
}

}  // namespace

void* general_allocator::allocate(std::size_t size, std::size_t alignment) noexcept {
  // Fast path: the global instance in release mode, 0..1024 bytes at alignment 1, 2, 4, 8 or 16
  // (the bits of 0x10116): one load finds the page (heap::direct of direct_heap), whose free list
  // is empty for an empty queue and for a thread without a heap. Every other case takes the
  // fallback.
  if (MEMKIT_LIKELY(size <= direct_max && alignment <= default_alignment && fast_ &&
                    ((0x10116u >> alignment) & 1u) != 0)) {
    heap* h = direct_heap;
    page* pg = h->direct[direct_index(size, alignment)];
    if (MEMKIT_LIKELY(pg->free != nullptr)) return pop_free_block(pg);
    return impl_->allocate_direct_miss(h, size, alignment);
  }
  if (MEMKIT_UNLIKELY(options_.debug)) detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
  return allocate_fallback(impl_, size, alignment);
}

// A direct entry with no free block: the class's queue needs a page (the slow path refills it),
// or the thread has no heap yet (`h` is empty_heap), or debug mode is on (every entry empty).
void* general_allocator::impl::allocate_direct_miss(heap* h, std::size_t size, std::size_t alignment) noexcept {
  if (MEMKIT_LIKELY(h != &empty_heap && direct_on)) {
    return allocate_slow(h, direct_class(direct_index(size, alignment)), false);
  }
  return allocate_generic(size, alignment, false);
}

void* general_allocator::allocate_zeroed(std::size_t size, std::size_t alignment) noexcept {
  if (impl_ == nullptr) return allocation_failure();
  if (MEMKIT_UNLIKELY(options_.debug)) detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
  return impl_->allocate_generic(size, alignment, true);
}

// The generic path: every allocation that allocate()'s fast path does not finish, whatever the
// size, alignment or mode. A size class's block comes from allocate_in_class, like the fast
// path's; debug mode adds its records around the same step (debug_allocate); huge blocks get a
// mapping of their own (huge.cpp).
void* general_allocator::impl::allocate_generic(std::size_t size, std::size_t alignment, bool zeroed) noexcept {
  if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return allocation_failure(EINVAL);
  if (MEMKIT_UNLIKELY(size > max_allocation_size)) return allocation_failure();
  // The symbolizer's own allocations (libdw's, while a report prints a trace) are plain ones:
  // recording or checking them would recurse into the report.
  if (self->options_.debug && !detail::symbolizing_on_this_thread()) {
    void* p = debug_allocate(size, alignment);  // a request for 0 bytes stays one (debug_allocate)
    if (p == nullptr) return allocation_failure();
    if (zeroed) std::memset(p, 0, size);
    return p;
  }
  if (size == 0) size = 1;
  if (alignment <= max_class_alignment) {
    const std::size_t need = alignment <= default_alignment ? size : detail::align_up(size, alignment);
    if (need <= large_max) {
      heap* h = current_heap(this);
      if (h == nullptr) return allocation_failure();
      const std::size_t cls = (need <= 8 && alignment <= 8) ? 0 : class_of(need);
      void* p = allocate_in_class(this, h, cls, false);
      if (p != nullptr && zeroed) std::memset(p, 0, size);
      return p;
    }
  }
  void* p = huge_allocate(size, alignment, zeroed);
  return p != nullptr ? p : allocation_failure();
}

// ---- free -----------------------------------------------------------------------------------------

void general_allocator::impl::free_block(segment* s, page* pg, void* p) noexcept {
  if (MEMKIT_LIKELY(s->thread_id.load(std::memory_order_relaxed) == current_thread_id())) {
    const bool was_full = pg->in_full;
    if (MEMKIT_UNLIKELY(push_local_free(pg, p) || was_full)) {
      free_local_slow(s->owner.load(std::memory_order_relaxed), pg);
    }
    return;
  }
  if (s->kind == segment_kind::huge) {
    huge_free(s);
    return;
  }
  free_remote(s, pg, static_cast<block*>(p));
}

namespace {

// The rest of free() once the fast path's tests failed: a debug or full page of this thread, or a
// block of another thread, a huge block, a debug block. Out of line so that free()'s local path
// needs no stack frame.
[[gnu::noinline]] void free_other(general_allocator::impl* im, segment* s, page* pg, void* p) noexcept {
  auto* b = static_cast<block*>(p);
  if (s->thread_id.load(std::memory_order_relaxed) == current_thread_id()) {
    if (pg->debug) {  // allocated while debug mode was on
      im->debug_free(p);
      return;
    }
    (void)push_local_free(pg, p);  // a full page: it goes back to its queue
    im->free_local_slow(s->owner.load(std::memory_order_relaxed), pg);
    return;
  }
  if (s->kind == segment_kind::huge) {
    if (pg->debug) im->debug_free(p);
    else im->huge_free(s);
    return;
  }
  // Another thread's page: a debug page is known by its records (in the line remote frees touch
  // anyway, not the owner's first line that holds `debug`).
  if (pg->records != nullptr) {
    im->debug_free(p);
    return;
  }
  im->free_remote(s, pg, b);
}

}  // namespace

void general_allocator::free(void* p) noexcept {
  if (p == nullptr) return;
  if (MEMKIT_UNLIKELY(options_.debug)) {
    detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
    impl_->debug_free(p);
    return;
  }
  segment* s = segment_of(p);
  page* pg = page_of(s, p);
  // One register for the page: without this GCC addresses `free` from the segment and the index
  // again (one more instruction on the path below).
  MEMKIT_IN_REGISTER(pg);
  // Local and plain (neither a full page nor a debug page): push, count, done. A page whose count
  // reaches zero may be released (free_local_slow).
  if (MEMKIT_LIKELY(is_current_thread(s->thread_id.load(std::memory_order_relaxed)) && local_free_is_plain(pg))) {
    if (MEMKIT_UNLIKELY(push_local_free(pg, p))) impl_->free_local_slow(s->owner.load(std::memory_order_relaxed), pg);
    return;
  }
  free_other(impl_, s, pg, p);
}

// ---- sizes and resizing -----------------------------------------------------------------------------

std::size_t general_allocator::usable_size(const void* p) const noexcept {
  if (p == nullptr) return 0;
  if (MEMKIT_UNLIKELY(options_.debug)) {
    detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
    return impl_->debug_checked_usable_size(p);  // checks p first
  }
  segment* s = segment_of(p);
  page* pg = page_of(s, p);
  if (pg->debug) return impl_->debug_usable_size(p);
  if (s->kind == segment_kind::huge) return s->huge_size;
  return pg->block_size;
}

std::size_t general_allocator::good_size(std::size_t size) const noexcept {
  if (size == 0) size = 1;
  if (size > max_allocation_size) return size;
  if (size <= large_max) return class_block_size(class_of(size));
  const std::size_t page = os::page_size();
  const std::size_t offset = detail::align_up(sizeof(segment), page);
  return detail::align_up(offset + size, page) - offset;
}

bool general_allocator::impl::resize_in_place(void* p, std::size_t new_size) noexcept {
  segment* s = segment_of(p);
  page* pg = page_of(s, p);
  if (pg->debug) return debug_resize(p, new_size);
  if (s->kind == segment_kind::huge) return huge_resize(s, new_size);
  return new_size <= pg->block_size;
}

void* general_allocator::reallocate_unsized(void* p, std::size_t new_size) noexcept {
  return reallocate_unsized(p, new_size, default_alignment);
}

void* general_allocator::reallocate_unsized(void* p, std::size_t new_size, std::size_t alignment) noexcept {
  if (MEMKIT_UNLIKELY(options_.debug)) detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
  if (p == nullptr) return allocate(new_size, alignment);
  if (impl_ == nullptr) return allocation_failure();
  if (!detail::is_power_of_two(alignment)) return allocation_failure(EINVAL);
  if (new_size == 0) new_size = 1;
  if (new_size > max_allocation_size) return allocation_failure();
  if (MEMKIT_UNLIKELY(options_.debug) && !impl_->debug_check_reallocate(p)) return allocation_failure(EINVAL);
  segment* s = segment_of(p);
  const bool huge = s->kind == segment_kind::huge;
  if (page* pg = page_of(s, p); MEMKIT_LIKELY(!huge && !pg->debug)) {
    // A block of a size class (the common case, one lookup): in place when it fits, unless it
    // would keep more than twice what it needs.
    const std::size_t block_size = pg->block_size;
    if (new_size <= block_size && (new_size >= block_size / 2 || block_size <= 16)) return p;
    if (new_size >= growth_threshold && new_size > block_size && !options_.debug) {
      return impl_->grow_block(p, block_size, new_size, alignment, true);
    }
    void* fresh = allocate(new_size, alignment);
    if (fresh == nullptr) return nullptr;
    std::memcpy(fresh, p, block_size < new_size ? block_size : new_size);
    free(p);
    return fresh;
  }
  const std::size_t old_size = usable_size(p);
  // In place when it fits, unless a small block would keep more than twice what it needs.
  if (new_size <= old_size && (huge || new_size >= old_size / 2 || old_size <= 16)) {
    if (impl_->resize_in_place(p, new_size)) return p;
  }
  if (huge && new_size > old_size && !page_of(s, p)->debug) {
    // In place, else its page tables move: the bytes are never copied.
    return impl_->grow_block(p, old_size, new_size, alignment, true);
  }
  if (huge && new_size > old_size && impl_->resize_in_place(p, new_size)) return p;
  void* fresh = allocate(new_size, alignment);
  if (fresh == nullptr) return nullptr;
  std::memcpy(fresh, p, old_size < new_size ? old_size : new_size);
  free(p);
  return fresh;
}

bool general_allocator::owns(const void* p) const noexcept {
  if (p == nullptr || impl_ == nullptr) return false;
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t base = (address - 1) & ~segment_mask;
  if (!segment_map_contains(base)) return false;
  auto* s = reinterpret_cast<segment*>(base);
  if (s->instance != impl_) return false;
  const char* c = static_cast<const char*>(p);
  if (s->kind == segment_kind::huge) {
    return s->huge_live && c >= s->pages[0].start && c < s->pages[0].start + s->huge_size;
  }
  const page* pg = block_page(s, p);
  if (!pg->in_use) return false;
  return c >= pg->start && c < pg->start + static_cast<std::size_t>(pg->capacity) * pg->block_size;
}

void general_allocator::purge() noexcept {
  impl* im = impl_;
  if (im == nullptr) return;
  im->flush_quarantine(false);
  heap* h = attached_heap(im);
  const std::uint64_t now = now_ms();
  if (h != nullptr) {
    im->collect_heap(h, true);
    im->purge_heap(h, now, true);
  }
  for (heap* other = im->heaps.load(std::memory_order_acquire); other != nullptr; other = other->next_registered) {
    if (other != h) other->purge_requested.store(true, std::memory_order_relaxed);
  }
  im->collect_abandoned(true);  // exited threads' heaps: their empty pages, remote frees included
  im->purge_caches(now, true);
}

// ---- the allocator interface ------------------------------------------------------------------------

void* general_allocator::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  return allocate(size, alignment);
}

void general_allocator::do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept {
  deallocate(p, size, alignment);
}

bool general_allocator::do_resize(void* p, std::size_t old_size, std::size_t new_size,
                                  std::size_t alignment) noexcept {
  (void)old_size;
  (void)alignment;
  if (impl_ == nullptr || new_size > max_allocation_size) return false;
  return impl_->resize_in_place(p, new_size);
}

void* general_allocator::do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                                       std::size_t new_size, std::size_t alignment) noexcept {
  if (impl_ != nullptr && new_size > old_size && !options_.debug) {
    segment* s = segment_of(p);
    page* pg = page_of(s, p);
    if (!pg->debug && (s->kind == segment_kind::huge || new_size >= growth_threshold)) {
      if (s->kind != segment_kind::huge && new_size <= pg->block_size) return p;
      // A huge block grows in place or moves its page tables; a class block moves (once) into a
      // range with room to grow.
      return impl_->grow_block(p, used_bytes, new_size, alignment, false);
    }
  }
  if (do_resize(p, old_size, new_size, alignment)) return p;
  void* fresh = allocate(new_size, alignment);
  if (fresh == nullptr) return nullptr;
  if (used_bytes != 0) std::memcpy(fresh, p, used_bytes);
  free(p);
  return fresh;
}

allocation general_allocator::do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
  void* p = allocate(size, alignment);
  return p == nullptr ? allocation{} : allocation{p, usable_size(p)};
}

// ---- fork and teardown --------------------------------------------------------------------------------

void general_allocator::prepare_fork() noexcept {
  if (impl_ != nullptr) impl_->lock.lock();
}

void general_allocator::after_fork_parent() noexcept {
  if (impl_ != nullptr) impl_->lock.unlock();
}

void general_allocator::after_fork_child() noexcept {
  impl* im = impl_;
  if (im == nullptr) return;
  im->lock.reset();
  claims::reset_after_fork();
  diagnostics::misuse_reports_after_fork_in_child();
  // The parent's other threads do not exist here. Their heaps may have been mid-update when the
  // fork happened, so they are never adopted; marking them ownerless makes every free into them
  // take the atomic cross-thread path, which is safe.
  heap* mine = attached_heap(im);
  for (heap* h = im->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    if (h == mine) continue;
    if (h->thread_id.load(std::memory_order_relaxed) != 0) im->forked_mid_operation = true;
    h->thread_id.store(0, std::memory_order_relaxed);
    for (segment* s = h->segments; s != nullptr; s = s->next) s->thread_id.store(0, std::memory_order_relaxed);
  }
}

void general_allocator::impl::release_everything() noexcept {
  for (heap* h = heaps.load(std::memory_order_acquire); h != nullptr;) {
    heap* next = h->next_registered;
    for (segment* s = h->segments; s != nullptr;) {
      segment* following = s->next;
      for (unsigned i = 0; i < s->page_count; ++i) {
        if (s->pages[i].in_use && s->pages[i].debug) release_records(&s->pages[i]);
      }
      segment_map_set(s, false);
      claims::drop(s, segment_size, "release_everything");
      (void)os::release(s, segment_size);
      s = following;
    }
    (void)os::release(h, detail::align_up(sizeof(heap), os::page_size()));
    h = next;
  }
  heaps.store(nullptr, std::memory_order_relaxed);
  for (segment* list : {empty_segments.clean, empty_segments.dirty_first, huge_cached, huge_live}) {
    while (list != nullptr) {
      segment* next = list->next;
      segment_map_set(list, false);
      claims::drop(list, list->reserved_bytes, "release_everything");
      (void)os::release(list, list->reserved_bytes);
      list = next;
    }
  }
  empty_segments.clean = empty_segments.dirty_first = empty_segments.dirty_last = huge_cached = huge_live = nullptr;
  if (quarantine != nullptr) (void)os::release(quarantine, quarantine_slots * sizeof(void*));
  quarantine = nullptr;
  quarantine_slots = quarantine_first = quarantine_count = quarantine_held = 0;
}

}  // namespace memkit
