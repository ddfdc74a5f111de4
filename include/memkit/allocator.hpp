// memkit::allocator — the stateful, type-erased allocator interface every memkit allocator
// implements, and the bridges to the standard library.
//
// A container holds an `allocator&` chosen at run time instead of carrying the allocator in its
// type (like the iAllocator interface of game engines, or Zig's Allocator). Beyond std::pmr::memory_resource it offers
// growth: resize() grows or shrinks a block in place and never moves it; reallocate() may move and
// copies only the bytes in use (realloc with a used size, an `expand` that may move). Failure is a null pointer or false, never an
// exception, so containers decide whether to throw.
//
// Pick it when the allocation strategy must be chosen at run time, swapped in tests (see
// tracking_allocator), or when containers should grow in place; use std_allocator<T> to give the
// same allocator to standard containers, and allocator_resource / resource_allocator to cross
// into and out of std::pmr.
//
// Rules shared by every function: `alignment` is a power of two (anything else fails: null or
// false); sizes of 0 are allowed and behave as 1 byte; deallocating null is a no-op; a block is
// given back with the size and alignment it was obtained with (or the size reported by
// allocate_at_least / reallocate at_least forms, or any size between the requested and reported
// one).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory_resource>
#include <new>

#include "memkit/detail/config.hpp"

namespace memkit {

// The strictest alignment malloc guarantees; the default for every allocation.
inline constexpr std::size_t default_alignment = alignof(std::max_align_t);

// A block and the number of bytes actually usable in it (C++23's allocation_result, for C++20).
struct allocation {
  void* pointer = nullptr;  // start of the block, or null on failure
  std::size_t size = 0;     // usable bytes, at least the requested size on success; 0 on failure
};

// The interface. Public functions are non-virtual and check their arguments once; implementations
// override the protected do_* hooks, which may assume valid arguments (power-of-two alignment,
// non-zero sizes, non-null pointers).
class allocator {
 public:
  virtual ~allocator() = default;

  // Returns `size` bytes aligned to `alignment`, or null when memory is exhausted or the
  // arguments are invalid. Never throws.
  [[nodiscard]] void* allocate(std::size_t size, std::size_t alignment = default_alignment) noexcept {
    if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return nullptr;
    return do_allocate(size == 0 ? 1 : size, alignment);
  }

  // Like allocate(), but reports how many bytes the block really has, so a container can use the
  // slack (size feedback). `size` of the result is 0 on failure.
  [[nodiscard]] allocation allocate_at_least(std::size_t size,
                                             std::size_t alignment = default_alignment) noexcept {
    if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return {};
    return do_allocate_at_least(size == 0 ? 1 : size, alignment);
  }

  // Gives back a block from allocate(); `size` and `alignment` must match the request.
  void deallocate(void* p, std::size_t size, std::size_t alignment = default_alignment) noexcept {
    if (p == nullptr) return;
    MEMKIT_ASSERT(detail::is_power_of_two(alignment), "deallocate: alignment is not a power of two");
    do_deallocate(p, size == 0 ? 1 : size, alignment);
  }

  // Grows or shrinks the block at `p` from `old_size` to `new_size` bytes without moving it.
  // Returns false, leaving the block as it was, when that is not possible. Never moves.
  [[nodiscard]] bool resize(void* p, std::size_t old_size, std::size_t new_size,
                            std::size_t alignment = default_alignment) noexcept {
    if (p == nullptr || MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return false;
    return do_resize(p, old_size == 0 ? 1 : old_size, new_size == 0 ? 1 : new_size, alignment);
  }

  // Changes the block at `p` to `new_size` bytes, in place if possible, else by moving the first
  // `used_bytes` (at most min(old_size, new_size)) to a new block. Returns the block (possibly the
  // same pointer), or null on failure, in which case `p` is untouched and still owned by the
  // caller. A null `p` behaves as allocate().
  [[nodiscard]] void* reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                                 std::size_t new_size,
                                 std::size_t alignment = default_alignment) noexcept {
    if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return nullptr;
    if (p == nullptr) return do_allocate(new_size == 0 ? 1 : new_size, alignment);
    old_size = old_size == 0 ? 1 : old_size;
    new_size = new_size == 0 ? 1 : new_size;
    MEMKIT_ASSERT(used_bytes <= old_size, "reallocate: used_bytes exceeds old_size");
    if (used_bytes > new_size) used_bytes = new_size;
    return do_reallocate(p, old_size, used_bytes, new_size, alignment);
  }

  // True when memory from one can be given back to the other. By default, identity.
  bool is_equal(const allocator& other) const noexcept { return do_is_equal(other); }

 protected:
  // Required: return `size` bytes aligned to `alignment`, or null.
  virtual void* do_allocate(std::size_t size, std::size_t alignment) noexcept = 0;

  // Required: give back a block obtained from this allocator with this size and alignment.
  virtual void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept = 0;

  // In-place resize. Default: succeeds only when nothing changes.
  virtual bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                         std::size_t alignment) noexcept {
    (void)p;
    (void)alignment;
    return old_size == new_size;
  }

  // Reallocation. Default: resize in place, else allocate, copy `used_bytes`, deallocate.
  virtual void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                              std::size_t new_size, std::size_t alignment) noexcept {
    if (do_resize(p, old_size, new_size, alignment)) return p;
    void* fresh = do_allocate(new_size, alignment);
    if (fresh == nullptr) return nullptr;
    if (used_bytes != 0) std::memcpy(fresh, p, used_bytes);
    do_deallocate(p, old_size, alignment);
    return fresh;
  }

  // Size feedback. Default: exactly what was asked for.
  virtual allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
    void* p = do_allocate(size, alignment);
    return p == nullptr ? allocation{} : allocation{p, size};
  }

  // Equality. Default: the same object.
  virtual bool do_is_equal(const allocator& other) const noexcept { return this == &other; }
};

// An allocator over the C library's malloc family. realloc serves reallocate() (except that blocks
// growing to at most 1 KiB move through malloc + copy + free, which glibc serves faster from its
// per-thread cache) and, where the C library reports usable sizes, resize() succeeds within the
// block's usable size. Stateless: all instances are equal.
class malloc_allocator final : public allocator {
 public:
  // The process-wide instance.
  static malloc_allocator& instance() noexcept;

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override;
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override;
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                 std::size_t alignment) noexcept override;
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                      std::size_t alignment) noexcept override;
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override;
  bool do_is_equal(const allocator& other) const noexcept override;
};

// The default allocator of memkit's containers: malloc for blocks below large_block_threshold, and
// general_allocator::global() from there on, where a growing block gets an address range of its
// own and grows by committing pages in place or by moving its page tables (mremap), never by a
// copy, whatever state malloc is in (glibc's realloc copies large blocks once the process has
// freed other large blocks). A block crossing the threshold is copied once. Stateless: all
// instances are equal.
class hybrid_allocator final : public allocator {
 public:
  // Blocks of at least this many bytes come from general_allocator::global(); equal to
  // general_allocator::growth_threshold, from which on that allocator grows blocks in place.
  static constexpr std::size_t large_block_threshold = std::size_t{128} << 10;

  // The process-wide instance.
  static hybrid_allocator& instance() noexcept;

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override;
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override;
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                 std::size_t alignment) noexcept override;
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                      std::size_t alignment) noexcept override;
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override;
  bool do_is_equal(const allocator& other) const noexcept override;
};

namespace detail {
// The process-wide default allocator (see set_default_allocator). Read inline because every
// default-constructed container reads it: an out-of-line call cost small_vector about 1.5 ns per
// construction in the small-vector benchmark's workload.
extern std::atomic<allocator*> default_allocator_pointer;
}  // namespace detail

// The allocator containers use when none is given: hybrid_allocator until replaced.
inline allocator& default_allocator() noexcept {
  return *detail::default_allocator_pointer.load(std::memory_order_acquire);
}

// Replaces the process-wide default allocator and returns the previous one. The caller keeps
// `replacement` alive while anything may still use it; containers remember the allocator they were
// built with, so replacing the default never affects existing containers.
allocator& set_default_allocator(allocator& replacement) noexcept;

// A standard Allocator that forwards to a memkit allocator, so std::vector, std::map and friends
// can use any memkit allocator. Throws std::bad_alloc when the allocator returns null. Two
// instances compare equal when their allocators are equal.
template <class T>
class std_allocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::false_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  // Uses the default allocator.
  std_allocator() noexcept : allocator_(&default_allocator()) {}
  // Uses `a`, which must outlive every container using this std_allocator.
  std_allocator(allocator& a) noexcept : allocator_(&a) {}  // NOLINT: implicit, like pmr
  // Rebinding copy.
  template <class U>
  std_allocator(const std_allocator<U>& other) noexcept : allocator_(&other.resource()) {}

  // Memory for n objects of T; throws std::bad_alloc (or std::length_error-free overflow check).
  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    void* p = allocator_->allocate(n * sizeof(T), alignof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  // Gives back memory from allocate(n).
  void deallocate(T* p, std::size_t n) noexcept { allocator_->deallocate(p, n * sizeof(T), alignof(T)); }

  // The memkit allocator behind this one.
  allocator& resource() const noexcept { return *allocator_; }

  template <class U>
  friend bool operator==(const std_allocator& a, const std_allocator<U>& b) noexcept {
    return a.allocator_ == &b.resource() || a.allocator_->is_equal(b.resource());
  }

 private:
  allocator* allocator_;
};

// A std::pmr::memory_resource that forwards to a memkit allocator, for std::pmr containers.
// do_allocate throws std::bad_alloc when the allocator returns null, as memory_resource requires.
class allocator_resource final : public std::pmr::memory_resource {
 public:
  // Forwards to `a`, which must outlive this resource.
  explicit allocator_resource(allocator& a) noexcept : allocator_(&a) {}
  // The memkit allocator behind this resource.
  allocator& underlying() const noexcept { return *allocator_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override;

  allocator* allocator_;
};

// A memkit allocator that forwards to a std::pmr::memory_resource, so memkit containers can use
// monotonic_buffer_resource, pool resources or any user resource. Exceptions from the resource
// become null. resize() is not available (memory_resource cannot grow in place).
class resource_allocator final : public allocator {
 public:
  // Forwards to `resource`, which must outlive this allocator.
  explicit resource_allocator(std::pmr::memory_resource& resource) noexcept : resource_(&resource) {}
  // The memory_resource behind this allocator.
  std::pmr::memory_resource& underlying() const noexcept { return *resource_; }

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override;
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override;
  bool do_is_equal(const allocator& other) const noexcept override;

 private:
  std::pmr::memory_resource* resource_;
};

}  // namespace memkit
