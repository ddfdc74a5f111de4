// virtual_arena's slow paths: reservation, committing in steps, decommitting on reset, and the
// allocator hooks that are not worth inlining.
//
// Poisoning rule (AddressSanitizer): inside [base_, committed_end_) exactly the bytes that are not
// allocated are poisoned; everything outside it is left unpoisoned, because the kernel may hand
// decommitted or released addresses to someone else and stale poison there would be a false report.
//
// The rule is kept by two halves: the inline fast path in the header and this file. A program built
// with ASan may link a memkit library built without it (an installed release build); the header's
// code then poisons (dyn_array's unused tail) and unpoisons, while this file's MEMKIT_POISON calls
// compile to nothing. So this file unpoisons through unpoison_for_any_build(), which reaches the
// sanitizer runtime whenever the process has one: memory this file hands out or gives back is never
// left poisoned by the header's half, whatever the build. (It poisons only when built with ASan:
// poisoning where the caller's inline code would not unpoison would be a false report.)
#include "memkit/virtual_arena.hpp"

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "memkit/os.hpp"

namespace memkit {
namespace {

// Rounds `bytes` up to `granularity` (a power of two); false on overflow.
bool round_up(std::size_t bytes, std::size_t granularity, std::size_t& out) noexcept {
  if (bytes > std::numeric_limits<std::size_t>::max() - (granularity - 1)) return false;
  out = detail::align_up(bytes, granularity);
  return true;
}

// The granularity the arena commits and aligns its reservation to.
std::size_t arena_granularity(bool huge_pages) noexcept {
  const std::size_t huge = huge_pages ? os::huge_page_size() : 0;
  return huge > os::page_size() ? huge : os::page_size();
}

#if !MEMKIT_HAS_ASAN && (defined(__GNUC__) || defined(__clang__))
// Present only when the process runs with AddressSanitizer (weak: null otherwise).
extern "C" [[gnu::weak]] void __asan_unpoison_memory_region(void const volatile* addr, std::size_t size);
#endif

void unpoison_for_any_build([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t bytes) noexcept {
#if MEMKIT_HAS_ASAN
  MEMKIT_UNPOISON(p, bytes);
#elif defined(__GNUC__) || defined(__clang__)
  if (&__asan_unpoison_memory_region != nullptr) __asan_unpoison_memory_region(p, bytes);
#endif
}

}  // namespace

virtual_arena::virtual_arena(std::size_t reservation, virtual_arena_options options) {
  const std::size_t granularity = arena_granularity(options.huge_pages);
  huge_pages_ = options.huge_pages && granularity > os::page_size();
  prefault_ = options.prefault;
  std::size_t step = options.commit_step == 0 ? default_commit_step : options.commit_step;
  if (!round_up(step, granularity, commit_step_)) commit_step_ = detail::align_down(step, granularity);
  step = options.prefault_step == 0 ? default_prefault_step : options.prefault_step;
  if (!round_up(step, granularity, prefault_step_)) prefault_step_ = detail::align_down(step, granularity);
  if (options.retained_on_reset == std::numeric_limits<std::size_t>::max()) {
    retained_on_reset_ = options.retained_on_reset;
  } else if (!round_up(options.retained_on_reset, os::page_size(), retained_on_reset_)) {
    retained_on_reset_ = std::numeric_limits<std::size_t>::max();
  }
  if (reservation == 0) return;
  std::size_t bytes = 0;
  if (!round_up(reservation, granularity, bytes)) {
    throw std::length_error("memkit::virtual_arena: reservation size overflows when rounded to pages");
  }
  auto reserved = huge_pages_ ? os::reserve_aligned(bytes, granularity) : os::reserve(bytes);
  if (!reserved) {
    last_error_ = reserved.error();
    throw std::bad_alloc();
  }
  base_ = cursor_ = ready_end_ = committed_end_ = static_cast<char*>(reserved.value());
  reserved_end_ = base_ + bytes;
  if (huge_pages_) {
    // Advice on the reservation carries over to every part mprotect later commits. A refusal
    // (THP disabled) only costs speed, so remember it and go on with small pages.
    if (auto advised = os::advise_huge_pages(base_, bytes); !advised) {
      huge_pages_ = false;
      last_error_ = advised.error();
    }
  }
}

std::optional<virtual_arena> virtual_arena::try_create(std::size_t reservation,
                                                       virtual_arena_options options) noexcept {
  try {
    return std::optional<virtual_arena>(std::in_place, reservation, options);
  } catch (...) {
    return std::nullopt;
  }
}

virtual_arena::virtual_arena(virtual_arena&& other) noexcept
    : allocator(),
      base_(std::exchange(other.base_, nullptr)),
      cursor_(std::exchange(other.cursor_, nullptr)),
      ready_end_(std::exchange(other.ready_end_, nullptr)),
      committed_end_(std::exchange(other.committed_end_, nullptr)),
      reserved_end_(std::exchange(other.reserved_end_, nullptr)),
      high_water_(std::exchange(other.high_water_, 0)),
      commit_step_(other.commit_step_),
      prefault_step_(other.prefault_step_),
      retained_on_reset_(other.retained_on_reset_),
      last_error_(std::exchange(other.last_error_, 0)),
      huge_pages_(other.huge_pages_),
      prefault_(other.prefault_) {}

virtual_arena& virtual_arena::operator=(virtual_arena&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    cursor_ = std::exchange(other.cursor_, nullptr);
    ready_end_ = std::exchange(other.ready_end_, nullptr);
    committed_end_ = std::exchange(other.committed_end_, nullptr);
    reserved_end_ = std::exchange(other.reserved_end_, nullptr);
    high_water_ = std::exchange(other.high_water_, 0);
    commit_step_ = other.commit_step_;
    prefault_step_ = other.prefault_step_;
    retained_on_reset_ = other.retained_on_reset_;
    last_error_ = std::exchange(other.last_error_, 0);
    huge_pages_ = other.huge_pages_;
    prefault_ = other.prefault_;
  }
  return *this;
}

virtual_arena::~virtual_arena() { release(); }

void virtual_arena::release() noexcept {
  if (base_ == nullptr) return;
  unpoison_for_any_build(base_, static_cast<std::size_t>(committed_end_ - base_));
  [[maybe_unused]] auto released = os::release(base_, reserved());
  // munmap of a range we mapped can only fail on a corrupted arena; nothing sensible is left to do
  // in a destructor but to say so in checked builds.
  MEMKIT_ASSERT(released.ok(), "virtual_arena: releasing the reservation failed");
  base_ = cursor_ = ready_end_ = committed_end_ = reserved_end_ = nullptr;
}

void* virtual_arena::allocate_slow(std::size_t size, std::size_t alignment) noexcept {
  const auto cursor = reinterpret_cast<std::uintptr_t>(cursor_);
  const std::size_t padding = (std::uintptr_t{0} - cursor) & (alignment - 1);
  const auto room = static_cast<std::size_t>(reserved_end_ - cursor_);
  if (size > room || padding > room - size) {
    last_error_ = ENOMEM;
    return nullptr;
  }
  char* block = cursor_ + padding;
  char* end = block + size;
  if (end > ready_end_ && !make_ready(end)) return nullptr;
  cursor_ = end;
  unpoison_for_any_build(block, size);
  return block;
}

// Makes [base_, end) ready: commits whole commit steps as needed, then (with prefault) populates
// whole prefault steps. On failure the arena is as it was (a step committed here is given back).
bool virtual_arena::make_ready(char* end) noexcept {
  char* const committed_before = committed_end_;
  if (end > committed_end_ && !commit_through(end)) return false;
  if (!prefault_) {
    ready_end_ = committed_end_;
    return true;
  }
  std::size_t target_offset = static_cast<std::size_t>(end - base_);
  if (!round_up(target_offset, prefault_step_, target_offset) || target_offset > committed()) {
    target_offset = committed();
  }
  char* target = base_ + target_offset;
  if (auto populated = os::prefault(ready_end_, static_cast<std::size_t>(target - ready_end_)); !populated) {
    last_error_ = populated.error();
    // Give a step committed for this request back, so that the failure leaves the arena as it
    // was; if even that fails the step stays committed, which is still a consistent state.
    if (committed_end_ != committed_before) decommit_from(committed_before);
    last_error_ = populated.error();
    return false;
  }
  ready_end_ = target;
  return true;
}

// Commits whole steps counted from the base, so the committed end lands on step boundaries (huge
// page boundaries with huge pages) whatever the sizes requested.
bool virtual_arena::commit_through(char* end) noexcept {
  std::size_t target_offset = static_cast<std::size_t>(end - base_);
  if (!round_up(target_offset, commit_step_, target_offset) || target_offset > reserved()) {
    target_offset = reserved();
  }
  char* target = base_ + target_offset;
  const auto bytes = static_cast<std::size_t>(target - committed_end_);
  if (auto committed = os::commit(committed_end_, bytes); !committed) {
    last_error_ = committed.error();
    return false;
  }
  MEMKIT_POISON(committed_end_, bytes);
  committed_end_ = target;
  return true;
}

void virtual_arena::decommit_from(char* from) noexcept {
  if (from >= committed_end_) return;
  const auto bytes = static_cast<std::size_t>(committed_end_ - from);
  unpoison_for_any_build(from, bytes);
  if (auto decommitted = os::decommit(from, bytes); !decommitted) {
    last_error_ = decommitted.error();
    MEMKIT_POISON(from, bytes);
    return;
  }
  // The fresh mapping that decommit puts in place has lost the huge-page advice; restore it.
  if (huge_pages_) static_cast<void>(os::advise_huge_pages(from, bytes).ok());
  committed_end_ = from;
  if (ready_end_ > from) ready_end_ = from;
}

void virtual_arena::rewind(marker m) noexcept {
  MEMKIT_CHECK(m.offset <= used(), "virtual_arena::rewind: the marker is ahead of the cursor");
  char* to = base_ + m.offset;
  const std::size_t now = used();
  if (now > high_water_) high_water_ = now;
  MEMKIT_POISON(to, static_cast<std::size_t>(cursor_ - to));
  cursor_ = to;
}

void virtual_arena::reset() noexcept {
  rewind(marker{0});
  if (base_ == nullptr || retained_on_reset_ >= committed()) return;
  // retained_on_reset_ is page-aligned and below committed(), hence inside the reservation.
  decommit_from(base_ + retained_on_reset_);
}

bool virtual_arena::commit_ahead(std::size_t bytes) noexcept {
  if (bytes > static_cast<std::size_t>(reserved_end_ - cursor_)) {
    last_error_ = ENOMEM;
    return false;
  }
  char* end = cursor_ + bytes;
  return end <= ready_end_ || make_ready(end);
}

bool virtual_arena::decommit_unused() noexcept {
  if (base_ == nullptr) return true;
  char* from = base_ + detail::align_up(used(), os::page_size());
  const int before = last_error_;
  last_error_ = 0;
  decommit_from(from);
  const bool ok = last_error_ == 0;
  if (ok) last_error_ = before;
  return ok;
}

bool virtual_arena::resize_block(char* p, std::size_t old_size, std::size_t new_size) noexcept {
  MEMKIT_ASSERT(owns(p), "virtual_arena::resize: the block is not from this arena");
  const bool most_recent = p + old_size == cursor_;
  if (new_size <= old_size) {
    // Shrinking never moves; only the most recent block can hand its tail back to the cursor.
    MEMKIT_POISON(p + new_size, old_size - new_size);
    if (most_recent) {
      const std::size_t now = used();
      if (now > high_water_) high_water_ = now;
      cursor_ = p + new_size;
    }
    return true;
  }
  if (!most_recent) return false;
  const std::size_t growth = new_size - old_size;
  if (growth > static_cast<std::size_t>(reserved_end_ - cursor_)) {
    last_error_ = ENOMEM;
    return false;
  }
  char* end = cursor_ + growth;
  if (end > ready_end_ && !make_ready(end)) return false;
  unpoison_for_any_build(cursor_, growth);
  cursor_ = end;
  return true;
}

void virtual_arena::deallocate_block(char* p, std::size_t size) noexcept {
  MEMKIT_ASSERT(owns(p), "virtual_arena::deallocate: the block is not from this arena");
  if (p + size != cursor_) return;  // not the most recent allocation: reclaimed at rewind/reset
  const std::size_t now = used();
  if (now > high_water_) high_water_ = now;
  MEMKIT_POISON(p, size);
  cursor_ = p;
}

void* virtual_arena::do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                                   std::size_t new_size, std::size_t alignment) noexcept {
  if (resize_block(static_cast<char*>(p), old_size, new_size)) return p;
  void* fresh = allocate(new_size, alignment);
  if (fresh == nullptr) return nullptr;
  if (used_bytes != 0) std::memcpy(fresh, p, used_bytes);
  // The old block is not the most recent (resize would have grown it), so its memory comes back
  // at rewind or reset; poison it so that a stale pointer is caught under ASan.
  MEMKIT_POISON(p, old_size);
  return fresh;
}

}  // namespace memkit
