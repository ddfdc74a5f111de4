// memkit::dyn_array<T> — a growable array whose elements never move: it reserves address space for
// max_size elements up front and commits pages as it grows.
//
// std::vector grows by allocating a bigger buffer and moving every element into it: appends have
// latency spikes proportional to the array's length, peak memory reaches about 1.5-3x the payload
// during the copy, and every pointer, reference and iterator into the array is invalidated.
// dyn_array reserves room for max_size elements as one range of virtual memory (no physical
// memory, no commit charge) and commits it in large steps as it fills, so an append never copies
// the array, peak resident memory stays within one prefault step of the payload, and pointers,
// references and iterators to elements stay valid across any append for the array's lifetime.
//
// Pick it when an upper bound on the length is known (even a very loose one: reserving 64 GiB of
// address space costs nothing) and addresses must stay stable or append latency must stay flat.
// Pick std::vector or memkit::vector when the bound is unknown or many small arrays are needed
// (each dyn_array holds one reservation and, once it has elements, one prefault step of resident
// memory: 256 KiB by default, at most max_size elements' worth).
//
// The interface follows std::vector (without allocators): capacity() is the ready part (committed
// and prefaulted), max_size() the reserved bound, reserve() commits ahead and shrink_to_fit()
// decommits. Running out of max_size throws std::length_error and a commit the system refuses
// throws std::bad_alloc; try_push_back()/try_emplace_back() report both as false instead, leaving
// the array unchanged.
// Exception guarantees are std::vector's: appends are strong (size and elements unchanged; the
// committed capacity may have grown), insert/erase in the middle are basic when T's moves throw.
#pragma once

#include <algorithm>
#include <compare>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "memkit/detail/config.hpp"
#include "memkit/detail/contiguous_surface.hpp"
#include "memkit/detail/transactions.hpp"
#include "memkit/os.hpp"
#include "memkit/virtual_arena.hpp"

namespace memkit {

// Construction options of a dyn_array (the same policy knobs as virtual_arena's, which holds the
// elements). Sizes are rounded up to the page size (the huge page size with huge_pages).
struct dyn_array_options {
  // Bytes committed (mprotect) per growth step; 0 picks virtual_arena::default_commit_step (8 MiB).
  // Committing costs commit charge, not physical memory, so a large step only makes the system
  // calls rare.
  std::size_t commit_step = 0;
  // With prefault, bytes populated per step ahead of the last element; 0 picks
  // virtual_arena::default_prefault_step (256 KiB). The append that crosses a step pays for
  // populating all of it; resident memory stays within one such step of the payload.
  std::size_t prefault_step = 0;
  // Back the array with transparent huge pages where the system has them (a hint).
  bool huge_pages = false;
  // Populate memory one prefault_step at a time in one system call (MADV_POPULATE_WRITE) instead
  // of one page fault per page. On by default: measured 3-4x faster appends than faulting page by
  // page (a fault costs microseconds, more under virtualization), and a shortage surfaces as
  // bad_alloc at the append that crosses the step instead of a SIGBUS or OOM kill later.
  bool prefault = true;
};

template <class T>
class dyn_array : public detail::contiguous_surface<dyn_array<T>, T> {
  using surface = detail::contiguous_surface<dyn_array<T>, T>;

  static_assert(std::is_object_v<T> && !std::is_const_v<T>, "dyn_array<T>: T must be a non-const object type");
  static_assert(std::is_nothrow_destructible_v<T>, "dyn_array<T>: T's destructor must not throw");

 public:
  using typename surface::const_iterator;
  using typename surface::const_pointer;
  using typename surface::const_reference;
  using typename surface::const_reverse_iterator;
  using typename surface::difference_type;
  using typename surface::iterator;
  using typename surface::pointer;
  using typename surface::reference;
  using typename surface::reverse_iterator;
  using typename surface::size_type;
  using typename surface::value_type;
  using surface_type = dyn_array;  // for memkit::erase / erase_if

  // Element access (at, [], front, back), iterators (begin, end, rbegin, ...), empty() and the
  // comparisons == and <=> come from detail/contiguous_surface.hpp, shared with the vectors.
  using surface::empty;

  // An array with max_size() 0: every append fails. The state of a moved-from array.
  dyn_array() noexcept = default;

  // Reserves address space for `max_size` elements and commits nothing. Throws std::length_error
  // when max_size * sizeof(T) overflows, std::bad_alloc when the system refuses the reservation.
  explicit dyn_array(size_type max_size, dyn_array_options options = {})
      : arena_(reservation_bytes(max_size), arena_options(options)),
        data_(static_cast<T*>(arena_.base())),
        end_(data_),
        capacity_end_(data_),
        max_size_(max_size),
        options_(options) {}

  // `count` copies of `value`, with room for `max_size` elements.
  dyn_array(size_type max_size, size_type count, const T& value, dyn_array_options options = {})
      : dyn_array(max_size, options) {
    append_n(count, [&](T* p) { ::new (static_cast<void*>(p)) T(value); });
  }

  // The elements of `init`, with room for `max_size` elements.
  dyn_array(size_type max_size, std::initializer_list<T> init, dyn_array_options options = {})
      : dyn_array(max_size, options) {
    append_range(init.begin(), init.end());
  }

  // The elements of [first, last), with room for `max_size` elements.
  template <std::input_iterator InputIterator>
  dyn_array(size_type max_size, InputIterator first, InputIterator last, dyn_array_options options = {})
      : dyn_array(max_size, options) {
    append_range(first, last);
  }

  // A copy with the same max_size() and options; its own reservation.
  dyn_array(const dyn_array& other) : dyn_array(other.max_size_, other.options_) {
    append_range(other.begin(), other.end());
  }

  // Takes over `other`'s reservation and elements (their addresses do not change); `other` is
  // left empty with max_size() 0.
  dyn_array(dyn_array&& other) noexcept
      : arena_(std::move(other.arena_)),
        data_(std::exchange(other.data_, nullptr)),
        end_(std::exchange(other.end_, nullptr)),
        capacity_end_(std::exchange(other.capacity_end_, nullptr)),
        max_size_(std::exchange(other.max_size_, 0)),
        options_(other.options_) {}

  // Becomes a copy of `other`, max_size() included (strong guarantee).
  dyn_array& operator=(const dyn_array& other) {
    if (this != &other) {
      dyn_array copy(other);
      swap(copy);
    }
    return *this;
  }

  // Takes over `other`'s reservation; this array's elements are destroyed first.
  dyn_array& operator=(dyn_array&& other) noexcept {
    if (this != &other) {
      dyn_array taken(std::move(other));
      swap(taken);
    }
    return *this;
  }

  // Replaces the contents with the elements of `init` (max_size() unchanged).
  dyn_array& operator=(std::initializer_list<T> init) {
    assign(init.begin(), init.end());
    return *this;
  }

  // Destroys the elements and releases the reservation.
  ~dyn_array() { detail::destroy_range(data_, end_); }

  // Replaces the contents with `count` copies of `value`.
  void assign(size_type count, const T& value) {
    if (count > max_size_) throw_length_error();
    const T copy(value);  // `value` may be an element
    clear();
    append_n(count, [&](T* p) { ::new (static_cast<void*>(p)) T(copy); });
  }

  // Replaces the contents with the elements of [first, last) (which must not point into *this).
  template <std::input_iterator InputIterator>
  void assign(InputIterator first, InputIterator last) {
    clear();
    append_range(first, last);
  }

  // Replaces the contents with the elements of `init`.
  void assign(std::initializer_list<T> init) { assign(init.begin(), init.end()); }

  // --- element access ---------------------------------------------------------------------------

  // The elements, contiguous; the pointer never changes for the array's lifetime (null for a
  // default-constructed or moved-from array).
  T* data() noexcept { return data_; }
  // The elements, contiguous.
  const T* data() const noexcept { return data_; }
  // The elements as a span (also available implicitly: std::span<T> s = array;).
  std::span<T> as_span() noexcept { return {data_, size()}; }
  // The elements as a read-only span.
  std::span<const T> as_span() const noexcept { return {data_, size()}; }

  // --- capacity ---------------------------------------------------------------------------------

  // Number of elements.
  size_type size() const noexcept { return static_cast<size_type>(end_ - data_); }
  // The bound given at construction: the array can never hold more.
  size_type max_size() const noexcept { return max_size_; }
  // Elements that fit in memory that is ready (committed and, with prefault, populated): appends
  // up to it make no system call.
  size_type capacity() const noexcept { return static_cast<size_type>(capacity_end_ - data_); }
  // Commits (and prefaults) ahead so that `count` elements fit without a system call. Throws std::length_error
  // when count > max_size(), std::bad_alloc when the system refuses (nothing changes then).
  void reserve(size_type count) {
    if (count > capacity()) grow_or_throw(count);
  }
  // Decommits the pages beyond the last element, giving their memory and commit charge back;
  // capacity() drops to what the remaining pages hold. Elements stay where they are.
  void shrink_to_fit() noexcept {
    if (data_ == nullptr) return;
    const auto used = size() * sizeof(T);
    const auto block = capacity() * sizeof(T);
    if (block == 0) return;
    if (used == 0) {
      arena_.deallocate(data_, block, alignof(T));
      if (arena_.decommit_unused()) {
        capacity_end_ = data_;
      } else {
        // The system kept the pages: take the block back so nothing is lost.
        static_cast<void>(arena_.allocate(block, alignof(T)));
        poison_tail();
      }
      return;
    }
    static_cast<void>(arena_.resize(data_, block, used, alignof(T)));
    static_cast<void>(arena_.decommit_unused());
    claim_committed(used);
  }
  // The arena that holds the elements (read-only: statistics such as committed()).
  const virtual_arena& storage() const noexcept { return arena_; }

  // --- modifiers --------------------------------------------------------------------------------

  // Destroys every element; capacity and max_size stay.
  void clear() noexcept {
    detail::destroy_range(data_, end_);
    end_ = data_;
    poison_tail();
  }

  // Appends a copy of `value`. Throws std::length_error at max_size(), std::bad_alloc when a
  // commit fails; any exception leaves the array unchanged.
  void push_back(const T& value) { emplace_back(value); }
  // Appends `value` moved in.
  void push_back(T&& value) { emplace_back(std::move(value)); }

  // Constructs an element at the end from `args` and returns it. Same errors as push_back.
  template <class... Args>
  reference emplace_back(Args&&... args) {
    if (MEMKIT_UNLIKELY(end_ == capacity_end_)) grow_or_throw(size() + 1);
    T* slot = end_;
    unpoison_slot(slot);
    construct_or_repoison(slot, std::forward<Args>(args)...);
    end_ = slot + 1;
    return *slot;
  }

  // Appends a copy of `value`, or returns false (array unchanged, nothing thrown) when max_size()
  // is reached or the system refuses to commit. Exceptions from T's constructor still propagate.
  [[nodiscard]] bool try_push_back(const T& value) { return try_emplace_back(value) != nullptr; }
  // Appends `value` moved in, or returns false as above (`value` is then not moved from).
  [[nodiscard]] bool try_push_back(T&& value) { return try_emplace_back(std::move(value)) != nullptr; }

  // Constructs an element at the end and returns a pointer to it, or returns null (array
  // unchanged, nothing thrown) when max_size() is reached or a commit fails.
  template <class... Args>
  [[nodiscard]] T* try_emplace_back(Args&&... args) {
    if (MEMKIT_UNLIKELY(end_ == capacity_end_) && !grow(size() + 1)) return nullptr;
    T* slot = end_;
    unpoison_slot(slot);
    construct_or_repoison(slot, std::forward<Args>(args)...);
    end_ = slot + 1;
    return slot;
  }

  // Destroys the last element (contract: not empty).
  void pop_back() noexcept {
    MEMKIT_ASSERT(!empty(), "dyn_array::pop_back: empty array");
    --end_;
    end_->~T();
    poison_tail();
  }

  // Inserts a copy of `value` before `pos`; returns an iterator to it. Elements after `pos` are
  // shifted (their values move; the storage does not).
  iterator insert(const_iterator pos, const T& value) { return emplace(pos, value); }
  // Inserts `value` moved in before `pos`.
  iterator insert(const_iterator pos, T&& value) { return emplace(pos, std::move(value)); }
  // Inserts `count` copies of `value` before `pos`; returns an iterator to the first inserted.
  iterator insert(const_iterator pos, size_type count, const T& value) {
    check_position(pos);
    const auto index = static_cast<size_type>(pos - data_);
    if (count > max_size_ - size()) throw_length_error();
    const T copy(value);
    T* old_end = end_;
    append_n(count, [&](T* p) { ::new (static_cast<void*>(p)) T(copy); });
    std::rotate(data_ + index, old_end, end_);
    return data_ + index;
  }
  // Inserts the elements of [first, last) (not from *this) before `pos`.
  template <std::input_iterator InputIterator>
  iterator insert(const_iterator pos, InputIterator first, InputIterator last) {
    check_position(pos);
    const auto index = static_cast<size_type>(pos - data_);
    T* old_end = end_;
    append_range(first, last);
    std::rotate(data_ + index, old_end, end_);
    return data_ + index;
  }
  // Inserts the elements of `init` before `pos`.
  iterator insert(const_iterator pos, std::initializer_list<T> init) {
    return insert(pos, init.begin(), init.end());
  }

  // Constructs an element from `args` before `pos`; returns an iterator to it.
  template <class... Args>
  iterator emplace(const_iterator pos, Args&&... args) {
    check_position(pos);
    const auto index = static_cast<size_type>(pos - data_);
    if (pos == end_) return std::addressof(emplace_back(std::forward<Args>(args)...));
    // Build the value first: args may refer to elements that the shift below moves.
    T value(std::forward<Args>(args)...);
    emplace_back(std::move(end_[-1]));
    std::move_backward(data_ + index, end_ - 2, end_ - 1);
    data_[index] = std::move(value);
    return data_ + index;
  }

  // Removes the element at `pos`; returns an iterator to the element that followed it.
  iterator erase(const_iterator pos) {
    MEMKIT_ASSERT(pos >= data_ && pos < end_, "dyn_array::erase: position out of range");
    return erase(pos, pos + 1);
  }
  // Removes [first, last); returns an iterator to the element that followed them.
  iterator erase(const_iterator first, const_iterator last) {
    MEMKIT_ASSERT(data_ <= first && first <= last && last <= end_, "dyn_array::erase: invalid range");
    T* from = data_ + (first - data_);
    if (first != last) {
      T* new_end = std::move(data_ + (last - data_), end_, from);
      detail::destroy_range(new_end, end_);
      end_ = new_end;
      poison_tail();
    }
    return from;
  }

  // Makes size() `count`, destroying surplus elements or appending value-initialized ones.
  void resize(size_type count) {
    if (count <= size()) {
      erase(data_ + count, end_);
      return;
    }
    if (count > max_size_) throw_length_error();
    append_n(count - size(), [](T* p) { ::new (static_cast<void*>(p)) T(); });
  }
  // Makes size() `count`, destroying surplus elements or appending copies of `value`.
  void resize(size_type count, const T& value) {
    if (count <= size()) {
      erase(data_ + count, end_);
      return;
    }
    if (count > max_size_) throw_length_error();
    const T copy(value);
    append_n(count - size(), [&](T* p) { ::new (static_cast<void*>(p)) T(copy); });
  }

  // Exchanges contents, reservations and max_size with `other` (no element moves).
  void swap(dyn_array& other) noexcept {
    std::swap(arena_, other.arena_);
    std::swap(data_, other.data_);
    std::swap(end_, other.end_);
    std::swap(capacity_end_, other.capacity_end_);
    std::swap(max_size_, other.max_size_);
    std::swap(options_, other.options_);
  }
  friend void swap(dyn_array& a, dyn_array& b) noexcept { a.swap(b); }

 private:
  static size_type reservation_bytes(size_type max_size) {
    if (max_size > std::numeric_limits<size_type>::max() / sizeof(T)) throw_length_error();
    static_assert(alignof(T) <= 4096, "dyn_array<T>: T's alignment exceeds the smallest page size");
    return max_size * sizeof(T);
  }

  static virtual_arena_options arena_options(const dyn_array_options& options) noexcept {
    virtual_arena_options result;
    result.commit_step = options.commit_step;
    result.prefault_step = options.prefault_step;
    result.retained_on_reset = 0;
    result.huge_pages = options.huge_pages;
    result.prefault = options.prefault;
    return result;
  }

  [[noreturn]] static void throw_length_error() {
    throw std::length_error("memkit::dyn_array: max_size() exceeded");
  }

  void check_position([[maybe_unused]] const_iterator pos) const noexcept {
    MEMKIT_ASSERT(pos >= data_ && pos <= end_, "dyn_array: position out of range");
  }

  // Makes the element block in the arena cover all ready memory (up to max_size), so appends
  // within it need no call into the arena. `block` is the block's current size in bytes.
  void claim_committed(size_type block) noexcept {
    const size_type limit = max_size_ * sizeof(T);
    size_type target = arena_.ready() < limit ? arena_.ready() : limit;
    target -= target % sizeof(T);
    if (target > block && block != 0 && arena_.resize(data_, block, target, alignof(T))) block = target;
    capacity_end_ = data_ + block / sizeof(T);
    poison_tail();
  }

  // Grows capacity to at least `count` elements; false (nothing changed) when count > max_size()
  // or the system refuses the commit.
  bool grow(size_type count) noexcept {
    if (count > max_size_) return false;
    const size_type block = capacity() * sizeof(T);
    const size_type wanted = count * sizeof(T);
    if (block == 0) {
      void* first = arena_.allocate(wanted, alignof(T));
      if (first == nullptr) return false;
      MEMKIT_ASSERT(first == data_, "dyn_array: the element block must start at the reservation");
    } else if (!arena_.resize(data_, block, wanted, alignof(T))) {
      return false;
    }
    claim_committed(wanted);
    return true;
  }

  void grow_or_throw(size_type count) {
    if (count > max_size_) throw_length_error();
    if (!grow(count)) throw std::bad_alloc();
  }

  // Appends `count` elements made by `make(T* slot)`; on an exception destroys the ones it made.
  template <class Make>
  void append_n(size_type count, Make&& make) {
    if (count > max_size_ - size()) throw_length_error();
    reserve(size() + count);
    detail::undo_unless_dismissed undo(truncate_to(end_));
    for (size_type i = 0; i < count; ++i) {
      unpoison_slot(end_);
      make(end_);
      ++end_;
    }
    undo.dismiss();
  }

  template <class InputIterator>
  void append_range(InputIterator first, InputIterator last) {
    if constexpr (std::forward_iterator<InputIterator>) {
      const auto count = static_cast<size_type>(std::distance(first, last));
      append_n(count, [&](T* p) {
        ::new (static_cast<void*>(p)) T(*first);
        ++first;
      });
    } else {
      detail::undo_unless_dismissed undo(truncate_to(end_));
      for (; first != last; ++first) emplace_back(*first);
      undo.dismiss();
    }
  }

  // AddressSanitizer container annotations: the ready but unused slots [end_, capacity_end_) are
  // poisoned, so reading past size() (or a popped element) is reported. No-ops without ASan.
  void poison_tail() const noexcept {
    if (capacity_end_ != end_) {
      MEMKIT_POISON(end_, static_cast<std::size_t>(capacity_end_ - end_) * sizeof(T));
    }
  }
  static void unpoison_slot([[maybe_unused]] T* slot) noexcept { MEMKIT_UNPOISON(slot, sizeof(T)); }
  // Constructs at `slot` (already unpoisoned); if the constructor throws, poisons it again.
  template <class... Args>
  static void construct_or_repoison(T* slot, Args&&... args) {
#if MEMKIT_HAS_ASAN
    detail::undo_unless_dismissed repoison([slot]() noexcept { MEMKIT_POISON(slot, sizeof(T)); });
    ::new (static_cast<void*>(slot)) T(std::forward<Args>(args)...);
    repoison.dismiss();
#else
    ::new (static_cast<void*>(slot)) T(std::forward<Args>(args)...);
#endif
  }

  // An undo action for appends: destroys the elements from `old_end` on and makes it the end
  // again (the array as it was before the append that threw).
  auto truncate_to(T* old_end) noexcept {
    return [this, old_end]() noexcept {
      detail::destroy_range(old_end, end_);
      end_ = old_end;
      poison_tail();
    };
  }

  virtual_arena arena_;
  T* data_ = nullptr;          // start of the reservation: elements never move from here
  T* end_ = nullptr;           // one past the last element
  T* capacity_end_ = nullptr;  // end of the committed part claimed for elements
  size_type max_size_ = 0;
  dyn_array_options options_{};
};

// dyn_array d(max_size, first, last) holds the iterators' value type.
template <std::input_iterator InputIterator>
dyn_array(std::size_t, InputIterator, InputIterator) -> dyn_array<std::iter_value_t<InputIterator>>;
template <std::input_iterator InputIterator>
dyn_array(std::size_t, InputIterator, InputIterator, dyn_array_options) -> dyn_array<std::iter_value_t<InputIterator>>;

}  // namespace memkit
