// memkit::vector_base<T> — the one implementation behind memkit::vector<T> and
// memkit::small_vector<T, N>, and the type through which functions accept either.
//
// Both containers derive from vector_base<T>, which holds every operation of the std::vector
// interface plus memkit's additions (try_*, unchecked_*). A function that takes
// `memkit::vector_base<T>&` accepts a vector<T> and a small_vector<T, N> for every N, without
// being a template on N (LLVM calls this SmallVectorImpl). Only constructors, and swap and move
// with knowledge of N, live in the derived classes.
//
// Layout (64-bit, T of 4 bytes or more): data pointer (8) + size and capacity as two 32-bit
// halves of one 64-bit word (8) + allocator pointer (8) = 24 bytes. Counts are 32-bit for
// elements of 4 bytes or more (at most 2^32 - 1 elements, 16 GiB of int) and 64-bit for smaller
// elements, so byte vectors may exceed 4 GiB (32 bytes then).
// The allocator pointer's lowest bit records whether the object has inline storage (a
// small_vector), which sits at a fixed offset right after these fields; while the elements live
// on the heap, the first bytes of that unused inline storage remember its capacity, so code that
// does not know N can still move elements back inline.
//
// Allocators: a container uses the allocator it was built with for its whole life, except that
// swap() exchanges allocators together with contents (each buffer stays with the allocator that
// made it). Copy construction uses the source's allocator; copy and move assignment keep the
// destination's allocator and, when the allocators differ (allocator::is_equal is false), move
// the elements one by one into memory from the destination's allocator, as std::pmr does.
//
// T must be a complete, nothrow-destructible object type.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "memkit/allocator.hpp"
#include "memkit/detail/config.hpp"
#include "memkit/type_traits.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define MEMKIT_DETAIL_VECTOR_NOINLINE __attribute__((noinline))
#else
#define MEMKIT_DETAIL_VECTOR_NOINLINE
#endif

namespace memkit {

template <class T>
class vector_base;

namespace detail {

// 32-bit counts keep small_vector<int, N>'s overhead at 24 bytes; byte-sized elements keep
// 64-bit counts so a byte buffer may exceed 4 GiB.
template <class T>
using vector_stored_size =
    std::conditional_t<(sizeof(T) < 4 && sizeof(void*) >= 8), std::uint64_t, std::uint32_t>;

// Size and capacity. With 32-bit counts both are packed into one 64-bit word whose type no store
// of an element can alias: under the aliasing rules a store through an int* may modify any int
// or unsigned int (and a long* any long or unsigned long), so with separate uint32_t fields the
// compiler reloads size and capacity from memory after every element a push_back loop writes;
// with a word of an unrelated type they stay in registers (measured: about 30% faster loops).
// The word holds the size in its low half and the free room (capacity - size) in its high half,
// so "is there room" is one compare of the whole word against 2^32 and appending adds one
// constant: push_back's hot path never has to split the word into size and capacity.
// Arithmetic on each half is modulo 2^32, so setting size and capacity one after the other
// round-trips even when the pair is momentarily inconsistent.
template <class T, bool Packed = std::is_same_v<vector_stored_size<T>, std::uint32_t>>
class vector_counts {
  // unsigned long long, which on LP64 systems is none of int64_t, uint64_t, size_t or ptrdiff_t
  // (those are long / unsigned long), so element members of those types cannot alias it either.
  using word = std::conditional_t<std::is_same_v<std::remove_cv_t<T>, unsigned long long> ||
                                      std::is_same_v<std::remove_cv_t<T>, long long>,
                                  unsigned long, unsigned long long>;
  static_assert(sizeof(word) == 8);
  static constexpr word low = 0xFFFF'FFFFu;
  static constexpr word one_room = word{1} << 32;

  static constexpr word pack(std::size_t size, std::size_t capacity) noexcept {
    const auto room = static_cast<std::uint32_t>(static_cast<std::uint32_t>(capacity) - static_cast<std::uint32_t>(size));
    return static_cast<word>(static_cast<std::uint32_t>(size)) | (static_cast<word>(room) << 32);
  }

 public:
  constexpr vector_counts(std::size_t size, std::size_t capacity) noexcept : bits_(pack(size, capacity)) {}
  constexpr std::size_t size() const noexcept { return static_cast<std::size_t>(bits_ & low); }
  constexpr std::size_t capacity() const noexcept {
    return static_cast<std::uint32_t>(static_cast<std::uint32_t>(bits_) + static_cast<std::uint32_t>(bits_ >> 32));
  }
  // size() == capacity(): no room left (the free-room half is zero).
  constexpr bool full() const noexcept { return bits_ < one_room; }
  constexpr void set_size(std::size_t n) noexcept { bits_ = pack(n, capacity()); }
  // size() + 1, given size() < capacity(): one add of a constant (size up, room down), so a
  // push_back loop's dependency chain stays one instruction long.
  constexpr void increment_size() noexcept { bits_ += 1 - one_room; }
  constexpr void set_capacity(std::size_t n) noexcept { bits_ = pack(size(), n); }

 private:
  word bits_;
};

template <class T>
class vector_counts<T, false> {
 public:
  constexpr vector_counts(std::size_t size, std::size_t capacity) noexcept : size_(size), capacity_(capacity) {}
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t capacity() const noexcept { return capacity_; }
  constexpr bool full() const noexcept { return size_ >= capacity_; }
  constexpr void set_size(std::size_t n) noexcept { size_ = n; }
  constexpr void increment_size() noexcept { ++size_; }
  constexpr void set_capacity(std::size_t n) noexcept { capacity_ = n; }

 private:
  std::size_t size_;
  std::size_t capacity_;
};

// The comparison <=> uses for elements: their own <=> when they have one, else one built from <.
struct synth_three_way {
  template <class U>
  constexpr auto operator()(const U& a, const U& b) const {
    if constexpr (std::three_way_comparable<U>) {
      return a <=> b;
    } else {
      if (a < b) return std::weak_ordering::less;
      if (b < a) return std::weak_ordering::greater;
      return std::weak_ordering::equivalent;
    }
  }
};

template <class U>
using synth_three_way_result = decltype(synth_three_way{}(std::declval<const U&>(), std::declval<const U&>()));

// Points the aliasing checks compare against: std::less gives a total order over all pointers.
template <class T>
bool points_into(const T* p, const T* first, const T* last) noexcept {
  return !std::less<const T*>{}(p, first) && std::less<const T*>{}(p, last);
}

}  // namespace detail

template <class T>
class vector_base {
  using stored_size = detail::vector_stored_size<T>;

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;
  using allocator_type = memkit::allocator;

  // ---- assignment -------------------------------------------------------------------------------

  // Copies the elements of `other`; this container keeps its allocator. Strong guarantee when a
  // new buffer is needed, basic otherwise (like std::vector).
  vector_base& operator=(const vector_base& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }

  // Takes the elements of `other`, which is left empty. This container keeps its allocator: when
  // it equals other's and other's elements are on the heap, the buffer changes hands (no element
  // is touched); otherwise elements are moved one by one into this container's memory.
  vector_base& operator=(vector_base&& other) {
    if (this == &other) return *this;
    if (!other.is_inline() && other.data_ != nullptr && allocators_equal(other)) {
      release_storage();
      adopt_heap_of(other);
    } else {
      assign(std::make_move_iterator(other.begin()), std::make_move_iterator(other.end()));
      other.clear();
    }
    return *this;
  }

  // Replaces the contents with the list's elements.
  vector_base& operator=(std::initializer_list<T> list) {
    assign(list.begin(), list.end());
    return *this;
  }

  // Replaces the contents with `count` copies of `value` (which may be an element of this one).
  void assign(size_type count, const T& value) {
    if (count > capacity()) {
      assign_in_new_buffer(count, [&](T* fresh) { std::uninitialized_fill_n(fresh, count, value); });
      return;
    }
    const size_type common = std::min(count, size());
    if (count > size()) {
      // Construct the tail first: `value` may be one of the elements about to be overwritten.
      std::uninitialized_fill_n(data_ + counts_.size(), count - size(), value);
      // The tail is constructed: count it before the assignments below, which may throw.
      counts_.set_size(static_cast<stored_size>(count));
      const T* source = &value;
      std::fill_n(data_, common, *source);
    } else {
      T copy(value);  // `value` may live in the tail destroyed below
      std::fill_n(data_, common, copy);
      truncate(count);
    }
  }

  // Replaces the contents with [first, last).
  template <std::input_iterator InputIt>
  void assign(InputIt first, InputIt last) {
    if constexpr (std::forward_iterator<InputIt>) {
      const auto count = static_cast<size_type>(std::distance(first, last));
      if (count > capacity()) {
        assign_in_new_buffer(count, [&](T* fresh) { std::uninitialized_copy(first, last, fresh); });
      } else if (count > size()) {
        InputIt middle = std::next(first, static_cast<difference_type>(size()));
        std::copy(first, middle, data_);
        std::uninitialized_copy(middle, last, data_ + counts_.size());
        counts_.set_size(static_cast<stored_size>(count));
      } else {
        T* new_end = std::copy(first, last, data_);
        truncate(static_cast<size_type>(new_end - data_));
      }
    } else {
      clear();
      for (; first != last; ++first) emplace_back(*first);
    }
  }

  // Replaces the contents with the list's elements.
  void assign(std::initializer_list<T> list) { assign(list.begin(), list.end()); }

  // The allocator this container takes its memory from.
  [[nodiscard]] memkit::allocator& get_allocator() const noexcept { return alloc(); }

  // ---- element access ---------------------------------------------------------------------------

  // The element at `index`; throws std::out_of_range when index >= size().
  reference at(size_type index) {
    if (index >= size()) throw std::out_of_range("memkit::vector::at: index out of range");
    return data_[index];
  }
  // The element at `index`; throws std::out_of_range when index >= size().
  const_reference at(size_type index) const {
    if (index >= size()) throw std::out_of_range("memkit::vector::at: index out of range");
    return data_[index];
  }
  // The element at `index` (checked by an assertion in debug builds).
  reference operator[](size_type index) noexcept {
    MEMKIT_ASSERT(index < size(), "vector: index out of range");
    return data_[index];
  }
  // The element at `index` (checked by an assertion in debug builds).
  const_reference operator[](size_type index) const noexcept {
    MEMKIT_ASSERT(index < size(), "vector: index out of range");
    return data_[index];
  }
  // The first element; the container must not be empty.
  reference front() noexcept {
    MEMKIT_ASSERT(!empty(), "vector: front() of an empty vector");
    return data_[0];
  }
  // The first element; the container must not be empty.
  const_reference front() const noexcept {
    MEMKIT_ASSERT(!empty(), "vector: front() of an empty vector");
    return data_[0];
  }
  // The last element; the container must not be empty.
  reference back() noexcept {
    MEMKIT_ASSERT(!empty(), "vector: back() of an empty vector");
    return data_[counts_.size() - 1];
  }
  // The last element; the container must not be empty.
  const_reference back() const noexcept {
    MEMKIT_ASSERT(!empty(), "vector: back() of an empty vector");
    return data_[counts_.size() - 1];
  }
  // The elements, contiguous (may be null when capacity() is 0).
  T* data() noexcept { return data_; }
  // The elements, contiguous (may be null when capacity() is 0).
  const T* data() const noexcept { return data_; }

  // ---- iterators --------------------------------------------------------------------------------

  iterator begin() noexcept { return data_; }
  const_iterator begin() const noexcept { return data_; }
  const_iterator cbegin() const noexcept { return data_; }
  iterator end() noexcept { return data_ + counts_.size(); }
  const_iterator end() const noexcept { return data_ + counts_.size(); }
  const_iterator cend() const noexcept { return data_ + counts_.size(); }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator crbegin() const noexcept { return const_reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }
  const_reverse_iterator crend() const noexcept { return const_reverse_iterator(begin()); }

  // ---- capacity ---------------------------------------------------------------------------------

  // True when there are no elements.
  [[nodiscard]] bool empty() const noexcept { return counts_.size() == 0; }
  // Number of elements.
  [[nodiscard]] size_type size() const noexcept { return counts_.size(); }
  // The largest size this container can reach (limited by its 32- or 64-bit counts).
  [[nodiscard]] static constexpr size_type max_size() noexcept {
    constexpr auto by_count = static_cast<size_type>(std::numeric_limits<stored_size>::max());
    constexpr auto by_bytes = static_cast<size_type>(std::numeric_limits<difference_type>::max()) / sizeof(T);
    return by_count < by_bytes ? by_count : by_bytes;
  }
  // Number of elements the current buffer holds without growing.
  [[nodiscard]] size_type capacity() const noexcept { return counts_.capacity(); }
  // True while the elements live in a small_vector's inline storage.
  [[nodiscard]] bool is_inline() const noexcept {
    return (allocator_bits_ & inline_flag) != 0 && data_ == inline_buffer();
  }

  // Makes capacity() at least `new_capacity`; throws std::length_error beyond max_size() and
  // std::bad_alloc when the allocator fails (the container is then unchanged).
  void reserve(size_type new_capacity) {
    if (new_capacity <= capacity()) return;
    if (new_capacity > max_size()) throw_length_error();
    if (!change_capacity(new_capacity)) throw std::bad_alloc();
  }

  // Like reserve(), but returns false instead of throwing; the container is then unchanged.
  [[nodiscard]] bool try_reserve(size_type new_capacity) noexcept(relocation_is_nothrow()) {
    if (new_capacity <= capacity()) return true;
    if (new_capacity > max_size()) return false;
    return change_capacity(new_capacity);
  }

  // Gives back unused capacity: moves the elements back inline when they fit (small_vector),
  // frees the buffer when empty (vector), shrinks the heap buffer otherwise. Does nothing when the
  // allocator cannot provide a smaller block (it is a request, as in std::vector).
  void shrink_to_fit() {
    if (is_inline() || size() == capacity()) return;
    if (has_inline_storage()) {
      const size_type inline_cap = inline_capacity();
      if (size() <= inline_cap) {
        T* heap = data_;
        const size_type heap_capacity = counts_.capacity();
        T* inline_elements = inline_buffer();
        try {
          transfer_all(heap, size(), inline_elements);
        } catch (...) {
          remember_inline_capacity(inline_cap);  // the failed copy overwrote it; nothing else changed
          throw;
        }
        deallocate_block(heap, heap_capacity);
        data_ = inline_elements;
        counts_.set_capacity(static_cast<stored_size>(inline_cap));
        return;
      }
    }
    if (size() == 0) {
      deallocate_block(data_, counts_.capacity());
      data_ = nullptr;
      counts_.set_capacity(0);
      return;
    }
    (void)change_capacity(size());  // failure keeps the larger buffer, which is allowed
  }

  // ---- modifiers --------------------------------------------------------------------------------

  // Destroys every element; keeps the capacity.
  void clear() noexcept { truncate(0); }

  // Inserts a copy of `value` before `position`; returns an iterator to it.
  iterator insert(const_iterator position, const T& value) { return emplace(position, value); }
  // Inserts `value` (moved) before `position`; returns an iterator to it.
  iterator insert(const_iterator position, T&& value) { return emplace(position, std::move(value)); }

  // Inserts `count` copies of `value` before `position`; returns an iterator to the first one.
  iterator insert(const_iterator position, size_type count, const T& value) {
    const size_type index = index_of(position);
    if (count == 0) return data_ + index;
    T copy(value);  // `value` may be an element that moves below
    insert_gap(index, count, [&](T* destination) { std::uninitialized_fill_n(destination, count, copy); },
               [&](T* first, size_type assigned) { std::fill_n(first, assigned, copy); },
               [&](T* destination, size_type skipped, size_type constructed) {
                 (void)skipped;
                 std::uninitialized_fill_n(destination, constructed, copy);
               });
    return data_ + index;
  }

  // Inserts [first, last) before `position`; returns an iterator to the first inserted element.
  // The range must not come from this container.
  template <std::input_iterator InputIt>
  iterator insert(const_iterator position, InputIt first, InputIt last) {
    const size_type index = index_of(position);
    if constexpr (std::forward_iterator<InputIt>) {
      const auto count = static_cast<size_type>(std::distance(first, last));
      if (count == 0) return data_ + index;
      insert_gap(index, count, [&](T* destination) { std::uninitialized_copy(first, last, destination); },
                 [&](T* destination, size_type assigned) {
                   std::copy_n(first, assigned, destination);
                 },
                 [&](T* destination, size_type skipped, size_type constructed) {
                   std::uninitialized_copy_n(std::next(first, static_cast<difference_type>(skipped)),
                                             constructed, destination);
                 });
    } else {
      // Single pass: append, then rotate into place (basic guarantee, as std::vector).
      const size_type old_size = size();
      for (; first != last; ++first) emplace_back(*first);
      std::rotate(data_ + index, data_ + old_size, data_ + counts_.size());
    }
    return data_ + index;
  }

  // Inserts the list's elements before `position`.
  iterator insert(const_iterator position, std::initializer_list<T> list) {
    return insert(position, list.begin(), list.end());
  }

  // Constructs an element from `args` before `position`; returns an iterator to it.
  template <class... Args>
  iterator emplace(const_iterator position, Args&&... args) {
    const size_type index = index_of(position);
    if (index == size()) {
      emplace_back(std::forward<Args>(args)...);
      return data_ + index;
    }
    if (counts_.size() < counts_.capacity()) {
      T value(std::forward<Args>(args)...);  // args may refer to elements that move
      ::new (static_cast<void*>(data_ + counts_.size())) T(std::move(data_[counts_.size() - 1]));
      counts_.increment_size();
      std::move_backward(data_ + index, data_ + counts_.size() - 2, data_ + counts_.size() - 1);
      data_[index] = std::move(value);
      return data_ + index;
    }
    insert_gap(index, 1, [&](T* destination) { ::new (static_cast<void*>(destination)) T(std::forward<Args>(args)...); },
               nullptr_assign{}, nullptr_construct{});
    return data_ + index;
  }

  // Removes the element at `position`; returns an iterator to the element that followed it.
  iterator erase(const_iterator position) {
    MEMKIT_ASSERT(position >= begin() && position < end(), "vector: erase position out of range");
    return erase(position, position + 1);
  }

  // Removes [first, last); returns an iterator to the element that followed them.
  iterator erase(const_iterator first, const_iterator last) {
    MEMKIT_ASSERT(first >= begin() && first <= last && last <= end(), "vector: erase range out of range");
    T* from = data_ + (first - data_);
    if (first != last) {
      T* new_end = std::move(data_ + (last - data_), end(), from);
      truncate(static_cast<size_type>(new_end - data_));
    }
    return from;
  }

  // Appends a copy of `value` (which may be an element of this container).
  void push_back(const T& value) { emplace_back(value); }
  // Appends `value` (moved).
  void push_back(T&& value) { emplace_back(std::move(value)); }

  // Constructs an element from `args` at the end; returns it. Strong guarantee on growth.
  template <class... Args>
  reference emplace_back(Args&&... args) {
    if constexpr (is_small_copy<Args...>() && sizeof(T) <= sizeof(void*)) {
      // A value that fits a register: copy it first (the argument may be an element), make room
      // out of line, then store. The slow path rejoins before the store, which is what lets GCC
      // keep data, size and capacity in registers across a push_back loop (with a separate
      // return from the slow path it reloads both from the object on every iteration).
      const T value(std::forward<Args>(args)...);
      if (MEMKIT_UNLIKELY(counts_.full())) make_room_for_one_or_throw();
      T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(value);
      counts_.increment_size();
      return *slot;
    } else if constexpr (is_small_copy<Args...>()) {
      // A wider value: build it in place, not up front (holding it across the slow path costs a
      // round trip through the stack on every element). When full, a copy is built first (an
      // argument may be an element that the growth moves), room is made out of line, and the copy
      // is stored through the new data pointer; both paths rejoin for the increment. Reading data_
      // after the call is what lets GCC keep data, size and capacity in registers across a
      // push_back loop (when the slow path stored the element itself, data_ was reloaded from
      // memory on every element).
      T* slot;
      if (MEMKIT_LIKELY(!counts_.full())) {
        slot = ::new (static_cast<void*>(data_ + counts_.size())) T(std::forward<Args>(args)...);
      } else {
        const T copy(std::forward<Args>(args)...);
        make_room_for_one_or_throw();
        slot = ::new (static_cast<void*>(data_ + counts_.size())) T(copy);
      }
      counts_.increment_size();
      return *slot;
    } else {
      // Other element types: the hot path is a compare, a construction in place and an add;
      // everything else (growth, arguments that refer to elements about to move, throwing) is in
      // one out-of-line call.
      if (MEMKIT_LIKELY(!counts_.full())) {
        T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(std::forward<Args>(args)...);
        counts_.increment_size();
        return *slot;
      }
      return *grow_and_emplace_back_or_throw(std::forward<Args>(args)...);
    }
  }

  // Appends a copy of `value`; returns false, leaving the container unchanged, when memory cannot
  // be obtained. Exceptions from T's copy constructor still propagate.
  [[nodiscard]] bool try_push_back(const T& value) { return try_emplace_back(value) != nullptr; }
  // Appends `value` (moved); returns false, leaving both unchanged, when memory cannot be obtained.
  [[nodiscard]] bool try_push_back(T&& value) { return try_emplace_back(std::move(value)) != nullptr; }

  // Constructs an element at the end; returns it, or null (container unchanged) when memory
  // cannot be obtained. Exceptions from T's constructor still propagate.
  template <class... Args>
  [[nodiscard]] T* try_emplace_back(Args&&... args) {
    if (MEMKIT_LIKELY(!counts_.full())) {
      T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(std::forward<Args>(args)...);
      counts_.increment_size();
      return slot;
    }
    if constexpr (is_small_copy<Args...>()) {
      return grow_and_append_copy(T(std::forward<Args>(args)...));
    } else {
      return grow_and_emplace_back(std::forward<Args>(args)...);
    }
  }

  // Appends a copy of `value` into reserved capacity: size() < capacity() is a precondition
  // (checked by an assertion in debug builds), so no growth check is compiled in.
  void unchecked_push_back(const T& value) { unchecked_emplace_back(value); }
  // Appends `value` (moved) into reserved capacity; size() < capacity() is a precondition.
  void unchecked_push_back(T&& value) { unchecked_emplace_back(std::move(value)); }
  // Constructs an element at the end of reserved capacity; size() < capacity() is a precondition.
  template <class... Args>
  reference unchecked_emplace_back(Args&&... args) {
    MEMKIT_ASSERT(counts_.size() < counts_.capacity(), "vector: unchecked_emplace_back without reserved capacity");
    T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(std::forward<Args>(args)...);
    counts_.increment_size();
    return *slot;
  }

  // Removes the last element; the container must not be empty.
  void pop_back() noexcept {
    MEMKIT_ASSERT(!empty(), "vector: pop_back() on an empty vector");
    counts_.set_size(counts_.size() - 1);
    std::destroy_at(data_ + counts_.size());
  }

  // Makes size() `count`, value-initializing new elements. Strong guarantee on growth.
  void resize(size_type count) {
    if (count <= size()) return truncate(count);
    if (!append_with(count - size(), [](T* destination, size_type n) { std::uninitialized_value_construct_n(destination, n); }))
      throw_growth_failure(count);
  }
  // Makes size() `count`, copying `value` into new elements (value may be an element).
  void resize(size_type count, const T& value) {
    if (count <= size()) return truncate(count);
    const T* source = &value;
    std::size_t alias_index = detail::points_into(source, data_, data_ + counts_.size()) ? static_cast<size_type>(source - data_) : npos;
    if (!append_with(count - size(), [&](T* destination, size_type n) {
          std::uninitialized_fill_n(destination, n, alias_index == npos ? *source : data_[alias_index]);
        }))
      throw_growth_failure(count);
  }
  // Like resize(count), but returns false, leaving the container unchanged, when memory cannot be
  // obtained.
  [[nodiscard]] bool try_resize(size_type count) {
    if (count <= size()) {
      truncate(count);
      return true;
    }
    return append_with(count - size(), [](T* destination, size_type n) { std::uninitialized_value_construct_n(destination, n); });
  }
  // Like resize(count, value), but returns false, leaving the container unchanged, on failure.
  [[nodiscard]] bool try_resize(size_type count, const T& value) {
    if (count <= size()) {
      truncate(count);
      return true;
    }
    const T* source = &value;
    std::size_t alias_index = detail::points_into(source, data_, data_ + counts_.size()) ? static_cast<size_type>(source - data_) : npos;
    return append_with(count - size(), [&](T* destination, size_type n) {
      std::uninitialized_fill_n(destination, n, alias_index == npos ? *source : data_[alias_index]);
    });
  }

  // Exchanges contents and allocators with `other` (buffers stay with the allocators that made
  // them, so this is defined for any two allocators). Heap buffers change hands without touching
  // elements; inline elements are moved, and when they do not fit the other side's inline storage
  // a heap buffer is taken from their allocator, which may throw std::bad_alloc (nothing changes).
  void swap(vector_base& other) {
    if (this == &other) return;
    if (!is_inline() && !other.is_inline()) {
      swap_fields(other);
      return;
    }
    if (is_inline() && other.is_inline() && size() <= other.inline_capacity() &&
        other.size() <= inline_capacity()) {
      swap_inline_elements(other);
      return;
    }
    if (is_inline() && !other.is_inline() && other.has_inline_storage() &&
        size() <= other.inline_capacity()) {
      swap_inline_with_heap(*this, other);
      return;
    }
    if (other.is_inline() && !is_inline() && has_inline_storage() &&
        other.size() <= inline_capacity()) {
      swap_inline_with_heap(other, *this);
      return;
    }
    // General case: park this one's contents in a temporary, move other's in, move the parked
    // contents to other. Each step either succeeds or leaves its source untouched.
    vector_base parked(alloc());
    parked.take_contents_of(*this);
    try {
      take_contents_of(other);
    } catch (...) {
      take_contents_of(parked);  // a heap buffer (or nothing): changes hands without throwing
      throw;
    }
    other.take_contents_of(parked);
  }

  // ---- comparisons ------------------------------------------------------------------------------

  // Equal sizes and equal elements.
  friend bool operator==(const vector_base& a, const vector_base& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  // Lexicographic order (by T's <=>, or by < when T has no <=>).
  friend auto operator<=>(const vector_base& a, const vector_base& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end(),
                                                  detail::synth_three_way{});
  }

  // Exchanges contents and allocators (see the member swap).
  friend void swap(vector_base& a, vector_base& b) { a.swap(b); }

 protected:
  // An empty container without inline storage (memkit::vector) using `a`.
  explicit vector_base(memkit::allocator& a) noexcept
      : data_(nullptr), counts_(0, 0), allocator_bits_(reinterpret_cast<std::uintptr_t>(&a)) {
    static_assert(alignof(memkit::allocator) >= 2, "the allocator pointer's low bit is used as a flag");
  }

  // An empty container with `inline_capacity` elements of inline storage right after these
  // fields (memkit::small_vector).
  vector_base(memkit::allocator& a, size_type inline_capacity) noexcept
      : data_(inline_buffer()),
        counts_(0, inline_capacity),
        allocator_bits_(reinterpret_cast<std::uintptr_t>(&a) | inline_flag) {}

  // Destroys the elements and gives back the heap buffer, if any.
  ~vector_base() {
    destroy_range(data_, data_ + counts_.size());
    if (!is_inline() && data_ != nullptr) deallocate_block(data_, counts_.capacity());
  }

  vector_base(const vector_base&) = delete;
  vector_base(vector_base&&) = delete;

  // Where inline storage starts: right after these fields, aligned for T and for the remembered
  // inline capacity.
  static constexpr std::size_t inline_alignment() noexcept {
    return alignof(T) > alignof(stored_size) ? alignof(T) : alignof(stored_size);
  }
  static constexpr std::size_t inline_offset() noexcept {
    return detail::align_up(sizeof(vector_base), inline_alignment());
  }
  // Bytes of inline storage a small_vector<T, N> needs (room to remember N while on the heap).
  static constexpr std::size_t inline_bytes(std::size_t n) noexcept {
    return n * sizeof(T) > sizeof(stored_size) ? n * sizeof(T) : sizeof(stored_size);
  }

  T* inline_buffer() const noexcept {
    // The derived small_vector places its storage exactly here (checked in its constructor).
    // Integer arithmetic, because vector_base itself ends before this address and GCC's bounds
    // analysis would flag the (never executed for vector<T>) inline paths of a memkit::vector.
    return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(this) + inline_offset());
  }

  // Builds contents from a vector_base being moved from (move constructors). This one must be
  // empty. Heap buffers change hands; inline elements are moved (into inline storage when they
  // fit, else into a heap buffer from the source's allocator). Takes the source's allocator.
  void take_contents_of(vector_base& source) {
    MEMKIT_ASSERT(counts_.size() == 0 && (is_inline() || data_ == nullptr), "take_contents_of: not empty");
    if (!source.is_inline()) {
      if (source.data_ != nullptr) adopt_heap_of(source);
      set_allocator(source.alloc());
      return;
    }
    const size_type count = source.size();
    if (has_inline_storage() && count <= inline_capacity()) {
      transfer_all(source.data_, count, data_);
    } else {
      void* block_pointer = nullptr;
      size_type block_capacity = 0;
      if (count != 0) {
        allocation block = source.alloc().allocate_at_least(count * sizeof(T), alignof(T));
        if (block.pointer == nullptr) throw std::bad_alloc();
        block_pointer = block.pointer;
        block_capacity = clamp_capacity(block.size / sizeof(T));
      }
      try {
        transfer_all(source.data_, count, static_cast<T*>(block_pointer));
      } catch (...) {
        source.alloc().deallocate(block_pointer, block_capacity * sizeof(T), alignof(T));
        throw;
      }
      if (has_inline_storage()) remember_inline_capacity(counts_.capacity());
      data_ = static_cast<T*>(block_pointer);
      counts_.set_capacity(static_cast<stored_size>(block_capacity));
    }
    counts_.set_size(static_cast<stored_size>(count));
    source.counts_.set_size(0);  // transfer_all ended their lives
    set_allocator(source.alloc());
  }

  // True when memory from other's allocator can be given back through this one's.
  bool allocators_equal(const vector_base& other) const noexcept {
    return &alloc() == &other.alloc() || alloc().is_equal(other.alloc());
  }

 private:
  static constexpr std::uintptr_t inline_flag = 1;
  static constexpr size_type npos = static_cast<size_type>(-1);

  struct nullptr_assign {
    void operator()(T*, size_type) const noexcept {}
  };
  struct nullptr_construct {
    void operator()(T*, size_type, size_type) const noexcept {}
  };

  static constexpr bool relocatable() noexcept { return is_trivially_relocatable_v<T>; }
  // Moving elements to a new buffer cannot throw: memcpy, or a nothrow move constructor.
  static constexpr bool relocation_is_nothrow() noexcept {
    return relocatable() || std::is_nothrow_move_constructible_v<T>;
  }

  memkit::allocator& alloc() const noexcept {
    return *reinterpret_cast<memkit::allocator*>(allocator_bits_ & ~inline_flag);
  }
  void set_allocator(memkit::allocator& a) noexcept {
    allocator_bits_ = reinterpret_cast<std::uintptr_t>(&a) | (allocator_bits_ & inline_flag);
  }
  bool has_inline_storage() const noexcept { return (allocator_bits_ & inline_flag) != 0; }

  // The inline capacity N; only for containers with inline storage.
  size_type inline_capacity() const noexcept {
    if (data_ == inline_buffer()) return counts_.capacity();
    stored_size remembered;
    std::memcpy(&remembered, static_cast<const void*>(inline_buffer()), sizeof remembered);
    return remembered;
  }
  // Stores N in the (unused) inline storage when the elements move to the heap.
  void remember_inline_capacity(size_type n) noexcept {
    const auto value = static_cast<stored_size>(n);
    std::memcpy(static_cast<void*>(inline_buffer()), &value, sizeof value);
  }

  size_type index_of(const_iterator position) const noexcept {
    MEMKIT_ASSERT(position >= begin() && position <= end(), "vector: position out of range");
    return static_cast<size_type>(position - data_);
  }

  static void destroy_range(T* first, T* last) noexcept {
    if constexpr (!std::is_trivially_destructible_v<T>) std::destroy(first, last);
  }
  void destroy_all() noexcept {
    destroy_range(data_, data_ + counts_.size());
    counts_.set_size(0);
  }
  void truncate(size_type count) noexcept {
    destroy_range(data_ + count, data_ + counts_.size());
    counts_.set_size(static_cast<stored_size>(count));
  }

  [[noreturn]] static void throw_length_error() {
    throw std::length_error("memkit::vector: size would exceed max_size()");
  }
  [[noreturn]] static void throw_growth_failure(size_type needed) {
    if (needed > max_size()) throw_length_error();
    throw std::bad_alloc();
  }

  static size_type clamp_capacity(size_type capacity) noexcept {
    return capacity < max_size() ? capacity : max_size();
  }

  // The capacity to grow to when `needed` elements must fit: double, at least 4.
  size_type grown_capacity(size_type needed) const noexcept {
    const size_type current = capacity();
    size_type doubled = current > max_size() / 2 ? max_size() : current * 2;
    if (doubled < 4) doubled = 4 < max_size() ? 4 : max_size();
    return needed > doubled ? needed : doubled;
  }

  void deallocate_block(T* block, size_type capacity) noexcept {
    alloc().deallocate(block, capacity * sizeof(T), alignof(T));
  }

  // A heap block and how many elements it holds (allocate_at_least's feedback).
  struct block {
    T* pointer;
    size_type capacity;
  };
  // Allocates room for at least `count` elements; pointer is null on failure.
  block allocate_block(size_type count) noexcept {
    allocation obtained = alloc().allocate_at_least(count * sizeof(T), alignof(T));
    return {static_cast<T*>(obtained.pointer), clamp_capacity(obtained.size / sizeof(T))};
  }
  // Allocates room for at least `wanted` elements, of which `needed` are required; throws.
  block allocate_or_throw(size_type needed, size_type wanted) {
    if (needed > max_size()) throw_length_error();
    block obtained = allocate_block(wanted);
    if (obtained.pointer == nullptr) throw std::bad_alloc();
    return obtained;
  }
  // Replaces the contents with `count` elements that `construct(fresh)` builds in a new buffer;
  // on an exception the old contents stay (strong guarantee).
  template <class Construct>
  void assign_in_new_buffer(size_type count, Construct construct) {
    const auto [fresh, fresh_capacity] = allocate_or_throw(count, count);
    try {
      construct(fresh);
    } catch (...) {
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    destroy_all();
    replace_buffer(fresh, fresh_capacity);
    counts_.set_size(static_cast<stored_size>(count));
  }

  // Constructs `count` elements at `destination` from the elements at `source` by move (or copy
  // when the move may throw and a copy exists), or copies their bytes when T is trivially
  // relocatable. Does not destroy the sources (relocated ones need no destruction: use
  // forget_or_destroy). On an exception, destroys what it constructed; sources are intact.
  static void transfer(T* source, size_type count, T* destination) {
    if (count == 0) return;
    if constexpr (relocatable()) {
      std::memcpy(static_cast<void*>(destination), static_cast<const void*>(source), count * sizeof(T));
    } else if constexpr (std::is_nothrow_move_constructible_v<T> || !std::is_copy_constructible_v<T>) {
      std::uninitialized_move_n(source, count, destination);
    } else {
      std::uninitialized_copy_n(source, count, destination);
    }
  }
  // Ends the life of elements that were transferred away.
  static void forget_or_destroy(T* first, size_type count) noexcept {
    if constexpr (!relocatable()) destroy_range(first, first + count);
    else (void)first, (void)count;
  }
  // transfer() then forget_or_destroy() of the sources.
  static void transfer_all(T* source, size_type count, T* destination) {
    transfer(source, count, destination);
    forget_or_destroy(source, count);
  }

  // Installs a fresh heap block (elements already in it) in place of the current storage, which
  // must hold no live elements.
  void replace_buffer(T* fresh, size_type fresh_capacity) noexcept {
    if (is_inline()) {
      remember_inline_capacity(counts_.capacity());
    } else if (data_ != nullptr) {
      deallocate_block(data_, counts_.capacity());
    }
    data_ = fresh;
    counts_.set_capacity(static_cast<stored_size>(fresh_capacity));
  }

  // Destroys the elements and gives back the heap buffer, keeping inline storage (whose capacity
  // is remembered, because the caller is about to adopt a heap buffer).
  void release_storage() noexcept {
    destroy_all();
    if (is_inline()) {
      remember_inline_capacity(counts_.capacity());
    } else if (data_ != nullptr) {
      deallocate_block(data_, counts_.capacity());
    }
    data_ = nullptr;
    counts_.set_capacity(0);
  }

  // Takes other's heap buffer (this one holds none: inline or null). Other returns to its inline
  // storage, or to null.
  void adopt_heap_of(vector_base& other) noexcept {
    if (is_inline()) remember_inline_capacity(counts_.capacity());
    data_ = other.data_;
    counts_.set_size(other.counts_.size());
    counts_.set_capacity(other.counts_.capacity());
    other.reset_to_empty_storage();
  }

  // Points at inline storage (or null) with no elements; for after a heap buffer was taken.
  void reset_to_empty_storage() noexcept {
    counts_.set_size(0);
    if (has_inline_storage()) {
      const size_type n = inline_capacity();  // read before data_ changes
      data_ = inline_buffer();
      counts_.set_capacity(static_cast<stored_size>(n));
    } else {
      data_ = nullptr;
      counts_.set_capacity(0);
    }
  }

  void swap_fields(vector_base& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(counts_, other.counts_);
    memkit::allocator& mine = alloc();
    set_allocator(other.alloc());
    other.set_allocator(mine);
  }

  // Both inline and each fits the other's storage: swap element by element.
  void swap_inline_elements(vector_base& other) {
    vector_base* shorter = size() <= other.size() ? this : &other;
    vector_base* longer = shorter == this ? &other : this;
    const size_type common = shorter->size();
    std::swap_ranges(shorter->data_, shorter->data_ + common, longer->data_);
    const size_type extra = longer->size() - common;
    transfer_all(longer->data_ + common, extra, shorter->data_ + common);
    shorter->counts_.set_size(static_cast<stored_size>(common + extra));
    longer->counts_.set_size(static_cast<stored_size>(common));
    memkit::allocator& mine = alloc();
    set_allocator(other.alloc());
    other.set_allocator(mine);
  }

  // `inline_side`'s elements move into `heap_side`'s inline storage; heap_side's heap buffer
  // changes hands. Throws only if copying an element throws (then nothing changed).
  static void swap_inline_with_heap(vector_base& inline_side, vector_base& heap_side) {
    T* const heap = heap_side.data_;
    const size_type heap_size = heap_side.size();
    const size_type heap_capacity = heap_side.capacity();
    const size_type heap_side_inline_capacity = heap_side.inline_capacity();  // before overwriting
    T* const destination = heap_side.inline_buffer();
    try {
      transfer_all(inline_side.data_, inline_side.size(), destination);
    } catch (...) {
      heap_side.remember_inline_capacity(heap_side_inline_capacity);
      throw;
    }
    const size_type inline_side_capacity = inline_side.counts_.capacity();
    heap_side.data_ = destination;
    heap_side.counts_.set_size(inline_side.counts_.size());
    heap_side.counts_.set_capacity(static_cast<stored_size>(heap_side_inline_capacity));
    inline_side.remember_inline_capacity(inline_side_capacity);
    inline_side.data_ = heap;
    inline_side.counts_.set_size(heap_size);
    inline_side.counts_.set_capacity(heap_capacity);
    memkit::allocator& first = inline_side.alloc();
    inline_side.set_allocator(heap_side.alloc());
    heap_side.set_allocator(first);
  }

  // Gives the buffer exactly `new_capacity` (>= size()) elements: in place through resize(),
  // else through reallocate() for trivially relocatable T, else a new block and element moves.
  // Returns false (nothing changed) when the allocator fails.
  bool change_capacity(size_type new_capacity) {
    MEMKIT_ASSERT(new_capacity >= size(), "change_capacity below size");
    if (!is_inline() && data_ != nullptr) {
      const std::size_t old_bytes = capacity() * sizeof(T);
      const std::size_t new_bytes = new_capacity * sizeof(T);
      if (alloc().resize(data_, old_bytes, new_bytes, alignof(T))) {
        counts_.set_capacity(static_cast<stored_size>(new_capacity));
        return true;
      }
      if constexpr (relocatable()) {
        void* moved = alloc().reallocate(data_, old_bytes, size() * sizeof(T), new_bytes, alignof(T));
        if (moved == nullptr) return false;
        data_ = static_cast<T*>(moved);
        counts_.set_capacity(static_cast<stored_size>(new_capacity));
        return true;
      }
    }
    const auto [fresh, fresh_capacity] = allocate_block(new_capacity);
    if (fresh == nullptr) return false;
    try {
      transfer(data_, size(), fresh);
    } catch (...) {
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    forget_or_destroy(data_, size());
    replace_buffer(fresh, fresh_capacity);
    return true;
  }

  // Appends `count` elements built by construct(destination, count); grows first when needed.
  // Returns false (nothing changed) when memory cannot be obtained. If construct throws, the
  // elements are as before (capacity may have grown).
  template <class Construct>
  bool append_with(size_type count, Construct&& construct) {
    if (count > capacity() - size()) {
      if (count > max_size() - size()) return false;
      const size_type needed = size() + count;
      if (!change_capacity(grown_capacity(needed))) {
        if (!change_capacity(needed)) return false;
      }
    }
    construct(data_ + counts_.size(), count);
    counts_.set_size(static_cast<stored_size>(size() + count));
    return true;
  }

  // True when emplace_back(args...) is a push_back of one T, whose address can be checked
  // against the buffer (so growth may use reallocate()).
  template <class... Args>
  static constexpr bool is_single_value() noexcept {
    if constexpr (sizeof...(Args) == 1) return (std::is_same_v<std::remove_cvref_t<Args>, T> && ...);
    else return false;
  }

  // emplace_back's slow path as one out-of-line call that throws itself, so the caller's loop
  // keeps size, capacity and data in registers on the fast path.
  template <class... Args>
  MEMKIT_DETAIL_VECTOR_NOINLINE T* grow_and_emplace_back_or_throw(Args&&... args) {
    T* slot = grow_and_emplace_back(std::forward<Args>(args)...);
    if (slot == nullptr) throw_growth_failure(size() + 1);
    return slot;
  }

  // grow_full_for_one_more() or throw, as one out-of-line call that jumps straight on to the
  // growth that applies.
  MEMKIT_DETAIL_VECTOR_NOINLINE void make_room_for_one_or_throw() { grow_full_for_one_more<true>(); }
  // The slow path of try_emplace_back for small trivially copyable T: `value` is a copy (a
  // temporary), so growth may move the buffer through reallocate(). Null (nothing changed) on failure.
  MEMKIT_DETAIL_VECTOR_NOINLINE T* grow_and_append_copy(const T& value) noexcept {
    if (!grow_full_for_one_more<false>()) return nullptr;
    T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(value);
    counts_.increment_size();
    return slot;
  }

  // True when emplace_back(args...) builds a small trivially copyable T (an int, a 32-byte
  // struct): building it up front and copying it in is then cheaper than the alternative, and the
  // arguments cannot be affected by the growth that follows.
  template <class... Args>
  static constexpr bool is_small_copy() noexcept {
    if constexpr (std::is_trivially_copyable_v<T> && sizeof(T) <= 64) return std::is_constructible_v<T, Args...>;
    else return false;
  }

  // Makes room for one more element in a full buffer (size() == capacity(), which is when every
  // caller needs it) for trivially copyable, hence relocatable, T: the capacity doubles (at least
  // 4), in a new block when the elements are inline (or there is no buffer), else through
  // reallocate(), which grows in place when it can. Nothing changes on failure, which returns
  // false, or throws when Throw. Two separate out-of-line functions, so that each saves only the
  // registers its own calls need (a small_vector's spill is the new-block one).
  template <bool Throw>
  bool grow_full_for_one_more() noexcept(!Throw) {
    if (is_inline() || data_ == nullptr) return grow_full_into_new_block<Throw>();
    return grow_full_by_reallocate<Throw>();
  }
  template <bool Throw>
  MEMKIT_DETAIL_VECTOR_NOINLINE bool grow_full_into_new_block() noexcept(!Throw) {
    MEMKIT_ASSERT(counts_.full(), "grow_full_into_new_block: the buffer is not full");
    const size_type count = counts_.size();
    if (MEMKIT_UNLIKELY(count >= max_size())) return growth_failed<Throw>();
    const block fresh = allocate_block(doubled_capacity(count));
    if (MEMKIT_UNLIKELY(fresh.pointer == nullptr)) return growth_failed<Throw>();
    if (data_ != nullptr) {
      // Copy first: the inline capacity is remembered in the bytes being copied.
      std::memcpy(static_cast<void*>(fresh.pointer), static_cast<const void*>(data_), count * sizeof(T));
      remember_inline_capacity(count);
    }
    data_ = fresh.pointer;
    counts_ = detail::vector_counts<T>(count, fresh.capacity);
    return true;
  }
  template <bool Throw>
  MEMKIT_DETAIL_VECTOR_NOINLINE bool grow_full_by_reallocate() noexcept(!Throw) {
    MEMKIT_ASSERT(counts_.full(), "grow_full_by_reallocate: the buffer is not full");
    const size_type count = counts_.size();
    if (MEMKIT_UNLIKELY(count >= max_size())) return growth_failed<Throw>();
    const size_type wanted = doubled_capacity(count);
    void* moved = alloc().reallocate(data_, count * sizeof(T), count * sizeof(T), wanted * sizeof(T), alignof(T));
    if (MEMKIT_UNLIKELY(moved == nullptr)) return growth_failed<Throw>();
    data_ = static_cast<T*>(moved);
    counts_ = detail::vector_counts<T>(count, wanted);
    return true;
  }
  // grown_capacity(count + 1) when capacity() == count < max_size().
  static size_type doubled_capacity(size_type count) noexcept {
    const size_type doubled = count > max_size() / 2 ? max_size() : 2 * count;
    return doubled >= 4 ? doubled : 4 < max_size() ? 4 : max_size();
  }
  // The failure of a growth by one element: throws (when Throw) or returns false.
  template <bool Throw>
  bool growth_failed() const noexcept(!Throw) {
    if constexpr (Throw) throw_growth_failure(size() + 1);
    return false;
  }

  // The slow path of emplace_back: grows, then constructs. Null when memory cannot be obtained
  // (nothing changed, arguments untouched).
  template <class... Args>
  T* grow_and_emplace_back(Args&&... args) {
    if constexpr (is_single_value<Args...>()) {
      return grow_and_push_back(std::forward<Args>(args)...);
    } else {
      // Arbitrary arguments may refer to elements: the buffer must not move before they are used,
      // so growth is in place or into a new block, never through reallocate().
      return grow_back<false>([&](T* slot) { ::new (static_cast<void*>(slot)) T(std::forward<Args>(args)...); });
    }
  }

  template <class U>
  MEMKIT_DETAIL_VECTOR_NOINLINE T* grow_and_push_back(U&& value) {
    const T* source = std::addressof(value);
    const size_type alias = detail::points_into(source, data_, data_ + counts_.size())
                                ? static_cast<size_type>(source - data_)
                                : npos;
    return grow_back<true>([&](T* slot) {
      // After reallocate() an element passed by reference has moved with the buffer.
      T& from = alias == npos ? const_cast<T&>(*source) : data_[alias];
      ::new (static_cast<void*>(slot)) T(static_cast<U&&>(from));
    });
  }

  // Grows for one more element and constructs it with construct(slot): when MayReallocate and T
  // is trivially relocatable, through reallocate(), which grows in place when it can and moves the
  // bytes otherwise (asking resize() first would cost a second call whenever the block cannot
  // grow, as with malloc blocks whose usable size allocate_at_least already handed out); else in
  // place through resize(); else in a new block where the element is built before the old ones
  // move (strong guarantee). If construct throws after an in-place or reallocate growth, the
  // elements are unchanged but capacity has grown.
  template <bool MayReallocate, class Construct>
  MEMKIT_DETAIL_VECTOR_NOINLINE T* grow_back(Construct&& construct) {
    if (size() >= max_size()) return nullptr;
    const size_type new_capacity = grown_capacity(size() + 1);
    if (!is_inline() && data_ != nullptr) {
      const std::size_t old_bytes = capacity() * sizeof(T);
      const std::size_t new_bytes = new_capacity * sizeof(T);
      if (!(MayReallocate && relocatable()) && alloc().resize(data_, old_bytes, new_bytes, alignof(T))) {
        counts_.set_capacity(static_cast<stored_size>(new_capacity));
        construct(data_ + counts_.size());
        counts_.increment_size();
        return data_ + counts_.size() - 1;
      }
      if constexpr (MayReallocate && relocatable()) {
        void* moved = alloc().reallocate(data_, old_bytes, size() * sizeof(T), new_bytes, alignof(T));
        if (moved == nullptr) return nullptr;
        data_ = static_cast<T*>(moved);
        counts_.set_capacity(static_cast<stored_size>(new_capacity));
        construct(data_ + counts_.size());
        counts_.increment_size();
        return data_ + counts_.size() - 1;
      }
    }
    const auto [fresh, fresh_capacity] = allocate_block(new_capacity);
    if (fresh == nullptr) return nullptr;
    T* slot = fresh + counts_.size();
    try {
      construct(slot);
    } catch (...) {
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    try {
      transfer(data_, size(), fresh);
    } catch (...) {
      std::destroy_at(slot);
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    forget_or_destroy(data_, size());
    replace_buffer(fresh, fresh_capacity);
    counts_.increment_size();
    return slot;
  }

  // Opens a gap of `count` elements at `index` and fills it. Without growth: the tail moves up
  // (construct_new builds the part of the gap past the old end from source position `skipped`,
  // assign_existing overwrites the part within it) — basic guarantee. With growth: fill(gap in a
  // new block) first, then the old elements move around it — strong guarantee when T's move does
  // not throw or T is copyable.
  template <class Fill, class AssignExisting, class ConstructNew>
  void insert_gap(size_type index, size_type count, Fill&& fill, AssignExisting&& assign_existing,
                  ConstructNew&& construct_new) {
    if (count <= capacity() - size()) {
      T* position = data_ + index;
      T* old_end = data_ + counts_.size();
      const size_type after = size() - index;
      if (after > count) {
        std::uninitialized_move(old_end - count, old_end, old_end);
        counts_.set_size(static_cast<stored_size>(size() + count));
        std::move_backward(position, old_end - count, old_end);
        assign_existing(position, count);
      } else {
        construct_new(old_end, after, count - after);
        counts_.set_size(static_cast<stored_size>(size() + count - after));
        std::uninitialized_move(position, old_end, data_ + counts_.size());
        counts_.set_size(static_cast<stored_size>(size() + after));
        assign_existing(position, after);
      }
      return;
    }
    if (count > max_size() - size()) throw_length_error();
    const size_type needed = size() + count;
    const auto [fresh, fresh_capacity] = allocate_or_throw(needed, grown_capacity(needed));
    try {
      fill(fresh + index);
    } catch (...) {
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    try {
      transfer(data_, index, fresh);
    } catch (...) {
      destroy_range(fresh + index, fresh + index + count);
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    try {
      transfer(data_ + index, size() - index, fresh + index + count);
    } catch (...) {
      if constexpr (!relocatable()) destroy_range(fresh, fresh + index);
      destroy_range(fresh + index, fresh + index + count);
      deallocate_block(fresh, fresh_capacity);
      throw;
    }
    forget_or_destroy(data_, size());
    replace_buffer(fresh, fresh_capacity);
    counts_.set_size(static_cast<stored_size>(needed));
  }

  T* data_;
  detail::vector_counts<T> counts_;  // size and capacity
  std::uintptr_t allocator_bits_;  // the allocator's address | inline_flag
};

// Removes every element equal to `value`; returns how many were removed. (The std::erase
// overload for memkit containers; found by argument-dependent lookup: `erase(v, value)`.)
template <class T, class U>
typename vector_base<T>::size_type erase(vector_base<T>& v, const U& value) {
  auto new_end = std::remove(v.begin(), v.end(), value);
  const auto removed = static_cast<typename vector_base<T>::size_type>(v.end() - new_end);
  v.erase(new_end, v.end());
  return removed;
}

// Removes every element for which `predicate` is true; returns how many were removed.
template <class T, class Predicate>
typename vector_base<T>::size_type erase_if(vector_base<T>& v, Predicate predicate) {
  auto new_end = std::remove_if(v.begin(), v.end(), predicate);
  const auto removed = static_cast<typename vector_base<T>::size_type>(v.end() - new_end);
  v.erase(new_end, v.end());
  return removed;
}

}  // namespace memkit
