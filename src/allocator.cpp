#include "memkit/allocator.hpp"

#include <cstdlib>
#include <cstring>

#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"

namespace memkit {
namespace {

malloc_allocator malloc_instance;

bool malloc_aligns(std::size_t alignment) noexcept { return alignment <= default_alignment; }

}  // namespace

malloc_allocator& malloc_allocator::instance() noexcept { return malloc_instance; }

void* malloc_allocator::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  if (malloc_aligns(alignment)) return std::malloc(size);
  return os::malloc_aligned(size, alignment);
}

void malloc_allocator::do_deallocate(void* p, std::size_t, std::size_t alignment) noexcept {
  if (malloc_aligns(alignment)) {
    std::free(p);
  } else {
    os::free_aligned(p);
  }
}

namespace {

// malloc_allocator's operations, shared with hybrid_allocator's small blocks without a second
// virtual call.

bool malloc_resize(void* p, std::size_t old_size, std::size_t new_size) noexcept {
  // Growing or shrinking within the block malloc really handed out moves nothing.
  return new_size <= old_size || new_size <= os::malloc_usable_size(p);
}

void* malloc_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                        std::size_t alignment) noexcept;

}  // namespace

bool malloc_allocator::do_resize(void* p, std::size_t old_size, std::size_t new_size,
                                 std::size_t) noexcept {
  return malloc_resize(p, old_size, new_size);
}

// Small blocks grow through malloc + memcpy + free instead of realloc: glibc's realloc takes the
// block it moves to from the arena's bins, bypassing the per-thread cache that malloc serves small
// blocks from, and it can rarely extend a small block in place (cached free neighbours count as in
// use). Measured on seed 003's small_vector workload: about 25 ns per growth saved.
constexpr std::size_t small_block_limit = 1024;

namespace {

void* malloc_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                        std::size_t alignment) noexcept {
  if (malloc_aligns(alignment) && new_size > old_size && new_size <= small_block_limit) {
    void* fresh = std::malloc(new_size);
    if (fresh == nullptr) return nullptr;
    std::memcpy(fresh, p, used_bytes);
    std::free(p);
    return fresh;
  }
  if (malloc_aligns(alignment)) return std::realloc(p, new_size);
  // Over-aligned: resize in place, else allocate, copy, free (the interface's default).
  if (malloc_resize(p, old_size, new_size)) return p;
  void* fresh = malloc_instance.allocate(new_size, alignment);
  if (fresh == nullptr) return nullptr;
  if (used_bytes != 0) std::memcpy(fresh, p, used_bytes);
  os::free_aligned(p);
  return fresh;
}

}  // namespace

void* malloc_allocator::do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                                      std::size_t new_size, std::size_t alignment) noexcept {
  return malloc_reallocate(p, old_size, used_bytes, new_size, alignment);
}

allocation malloc_allocator::do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
  // Reports the requested size, not malloc_usable_size(): asking costs a call on every
  // allocation (measured: ~7% of small_vector's spill-heavy workload), while the slack is at most
  // a few bytes for the small blocks containers allocate most often, and do_resize() still finds
  // it when a container grows.
  void* p = do_allocate(size, alignment);
  if (p == nullptr) return {};
  return {p, size};
}

bool malloc_allocator::do_is_equal(const allocator& other) const noexcept {
  return dynamic_cast<const malloc_allocator*>(&other) != nullptr;
}

// ---- hybrid_allocator ------------------------------------------------------------------------------
// Which allocator owns a block follows from its size alone: a block is given back with a size
// between the one requested and the one reported, both on the same side of the threshold, and
// resize() never lets a block cross it.

static_assert(hybrid_allocator::large_block_threshold == general_allocator::growth_threshold,
              "large blocks must be those general_allocator grows in place");

namespace {

hybrid_allocator hybrid_instance;

constexpr std::size_t threshold = hybrid_allocator::large_block_threshold;

bool is_large(std::size_t size) noexcept { return size >= threshold; }

}  // namespace

hybrid_allocator& hybrid_allocator::instance() noexcept { return hybrid_instance; }

void* hybrid_allocator::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  if (MEMKIT_LIKELY(!is_large(size) && malloc_aligns(alignment))) return std::malloc(size);
  if (!is_large(size)) return malloc_instance.allocate(size, alignment);
  return general_allocator::global().allocate(size, alignment);
}

allocation hybrid_allocator::do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
  if (MEMKIT_LIKELY(!is_large(size) && malloc_aligns(alignment))) {
    void* p = std::malloc(size);
    if (p == nullptr) return {};
    return {p, size};  // see malloc_allocator::do_allocate_at_least
  }
  if (!is_large(size)) {
    void* p = malloc_instance.allocate(size, alignment);
    return p == nullptr ? allocation{} : allocation{p, size};
  }
  return general_allocator::global().allocate_at_least(size, alignment);
}

void hybrid_allocator::do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept {
  if (MEMKIT_LIKELY(!is_large(size))) {
    malloc_instance.deallocate(p, size, alignment);
    return;
  }
  MEMKIT_ASSERT(general_allocator::global().owns(p), "hybrid_allocator: a large block it did not allocate");
  general_allocator::global().free(p);
}

bool hybrid_allocator::do_resize(void* p, std::size_t old_size, std::size_t new_size,
                                 std::size_t alignment) noexcept {
  if (is_large(old_size) != is_large(new_size)) return false;
  if (!is_large(old_size)) return malloc_resize(p, old_size, new_size);
  return general_allocator::global().resize(p, old_size, new_size, alignment);
}

void* hybrid_allocator::do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                                      std::size_t new_size, std::size_t alignment) noexcept {
  if (is_large(old_size) == is_large(new_size)) {
    if (!is_large(old_size)) return malloc_reallocate(p, old_size, used_bytes, new_size, alignment);
    return general_allocator::global().reallocate(p, old_size, used_bytes, new_size, alignment);
  }
  void* fresh = do_allocate(new_size, alignment);
  if (fresh == nullptr) return nullptr;
  if (used_bytes != 0) std::memcpy(fresh, p, used_bytes);
  do_deallocate(p, old_size, alignment);
  return fresh;
}

bool hybrid_allocator::do_is_equal(const allocator& other) const noexcept {
  return dynamic_cast<const hybrid_allocator*>(&other) != nullptr;
}

namespace detail {
std::atomic<allocator*> default_allocator_pointer{&hybrid_instance};
}  // namespace detail

allocator& set_default_allocator(allocator& replacement) noexcept {
  return *detail::default_allocator_pointer.exchange(&replacement, std::memory_order_acq_rel);
}

void* allocator_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  void* p = allocator_->allocate(bytes, alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void allocator_resource::do_deallocate(void* p, std::size_t bytes, std::size_t alignment) {
  allocator_->deallocate(p, bytes, alignment);
}

bool allocator_resource::do_is_equal(const std::pmr::memory_resource& other) const noexcept {
  const auto* same = dynamic_cast<const allocator_resource*>(&other);
  return same != nullptr && allocator_->is_equal(*same->allocator_);
}

void* resource_allocator::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  try {
    return resource_->allocate(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

void resource_allocator::do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept {
  resource_->deallocate(p, size, alignment);
}

bool resource_allocator::do_is_equal(const allocator& other) const noexcept {
  const auto* same = dynamic_cast<const resource_allocator*>(&other);
  return same != nullptr && resource_->is_equal(*same->resource_);
}

}  // namespace memkit
