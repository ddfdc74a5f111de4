// memkit::vector_base<T> — the interface of memkit::vector<T> and memkit::small_vector<T, N>, and
// the type through which a function accepts either.
//
// Every member a user calls on a vector or small_vector is declared and documented here;
// vector.hpp and small_vector.hpp add only constructors and the moves and swaps that know N.
// A function that takes `memkit::vector_base<T>&` accepts a vector<T> and a small_vector<T, N>
// for every N without being a template on N (LLVM calls this SmallVectorImpl):
//
//   void collect(memkit::vector_base<int>& out) { out.push_back(42); }
//
// The interface is std::vector's, plus what std lacks: try_reserve / try_push_back /
// try_emplace_back / try_resize fail by returning false or null instead of throwing, and
// unchecked_push_back appends into reserved capacity without a growth check.
//
// Allocators: a container uses the allocator it was built with for its whole life, except that
// swap() exchanges allocators together with contents (each buffer stays with the allocator that
// made it). Copy construction uses the source's allocator; copy and move assignment keep the
// destination's allocator and, when the allocators differ (allocator::is_equal is false), move
// the elements one by one into memory from the destination's allocator, as std::pmr does.
//
// Growth: capacity doubles (at least 4 elements, or exactly what is needed when more). Trivially
// relocatable elements (type_traits.hpp) grow through allocator::reallocate(), which extends the
// block in place when it can and otherwise moves the bytes; other elements ask resize() to grow
// in place and are moved one by one into a new block only when that fails. The size the
// allocator reports (allocate_at_least) becomes capacity.
//
// Exception guarantees are std::vector's: appends and growth are strong (when the growth itself
// succeeded in place and an element's constructor then throws, the elements are unchanged but
// the capacity stays grown); inserting in the middle without growth and assigning over existing
// elements are basic. Allocation failure throws std::bad_alloc, exceeding max_size() throws
// std::length_error, and the try_ forms report both as false or null with nothing changed.
//
// Layout (64-bit, T of 4 bytes or more): data pointer (8) + size and capacity packed in one
// 64-bit word (8) + allocator pointer (8) = 24 bytes, with 32-bit counts (at most 2^32 - 1
// elements, 16 GiB of int); smaller elements keep 64-bit counts (32 bytes then), so byte vectors
// may exceed 4 GiB. The allocator pointer's lowest bit marks inline storage (a small_vector),
// which sits right after these fields; while the elements live on the heap, the first bytes of
// that unused storage remember its capacity, so code that does not know N can move elements back.
//
// T must be a complete, nothrow-destructible object type.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
#include "memkit/detail/contiguous_surface.hpp"
#include "memkit/detail/vector_storage.hpp"
#include "memkit/type_traits.hpp"

namespace memkit {

template <class T>
class vector_base : public detail::contiguous_surface<vector_base<T>, T> {
  using surface = detail::contiguous_surface<vector_base<T>, T>;
  using stored_size = detail::vector_stored_size<T>;
  using block = detail::element_block<T>;
  static_assert(std::is_object_v<T> && !std::is_const_v<T>, "memkit vectors need a non-const object type");
  static_assert(std::is_nothrow_destructible_v<T>, "memkit vectors need elements whose destructor does not throw");

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
  using allocator_type = memkit::allocator;
  using surface_type = vector_base;  // for memkit::erase / erase_if

  // Element access (at, [], front, back), iterators (begin, end, rbegin, ...), empty() and the
  // comparisons == and <=> come from detail/contiguous_surface.hpp, shared with dyn_array.
  using surface::begin;
  using surface::end;
  using surface::empty;

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
      std::fill_n(data_, common, value);
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

  // ---- data and capacity ------------------------------------------------------------------------

  // The elements, contiguous (may be null when capacity() is 0).
  T* data() noexcept { return data_; }
  // The elements, contiguous (may be null when capacity() is 0).
  const T* data() const noexcept { return data_; }
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
  [[nodiscard]] bool is_inline() const noexcept { return has_inline_storage() && data_ == inline_buffer(); }

  // Makes capacity() at least `new_capacity`; throws std::length_error beyond max_size() and
  // std::bad_alloc when the allocator fails (the container is then unchanged).
  void reserve(size_type new_capacity) {
    if (new_capacity <= capacity()) return;
    if (new_capacity > max_size()) throw_length_error();
    if (!change_capacity<true>(new_capacity)) throw std::bad_alloc();
  }

  // Like reserve(), but returns false instead of throwing; the container is then unchanged.
  [[nodiscard]] bool try_reserve(size_type new_capacity) noexcept(relocation_is_nothrow()) {
    if (new_capacity <= capacity()) return true;
    if (new_capacity > max_size()) return false;
    return change_capacity<true>(new_capacity);
  }

  // Gives back unused capacity: moves the elements back inline when they fit (small_vector),
  // frees the buffer when empty (vector), shrinks the heap buffer otherwise. Does nothing when the
  // allocator cannot provide a smaller block (it is a request, as in std::vector).
  void shrink_to_fit() {
    if (is_inline() || size() == capacity()) return;
    if (has_inline_storage() && size() <= inline_capacity()) {
      move_back_inline();
      return;
    }
    if (size() == 0) {
      deallocate_block(data_, counts_.capacity());
      data_ = nullptr;
      counts_.set_capacity(0);
      return;
    }
    (void)change_capacity<true>(size());  // failure keeps the larger buffer, which is allowed
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
               [&](T* destination, size_type, size_type constructed) {
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
                 [&](T* destination, size_type assigned) { std::copy_n(first, assigned, destination); },
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
    if (!counts_.full()) {
      T value(std::forward<Args>(args)...);  // args may refer to elements that move
      ::new (static_cast<void*>(data_ + counts_.size())) T(std::move(data_[counts_.size() - 1]));
      counts_.increment_size();
      std::move_backward(data_ + index, data_ + counts_.size() - 2, data_ + counts_.size() - 1);
      data_[index] = std::move(value);
      return data_ + index;
    }
    insert_gap(index, 1, [&](T* destination) { ::new (static_cast<void*>(destination)) T(std::forward<Args>(args)...); },
               [](T*, size_type) {}, [](T*, size_type, size_type) {});
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
      // A value that fits a register: copy it first (the argument may be an element). The room
      // test comes first and guards the store, and the full case makes room out of line and then
      // repeats the store, so GCC lays a push_back loop out as: test room (a forward branch that
      // is never taken), store, add, loop test as the back edge. Written as "if full, make room;
      // then store" GCC instead entered the loop at the store and made the room test the back
      // edge, with the loop's exit as a taken forward branch: the same 8 instructions ran 10-15%
      // slower (docs/small_vector.md). Both ways data, size and capacity stay in registers
      // across the loop.
      const T value(std::forward<Args>(args)...);
      if (MEMKIT_LIKELY(!counts_.full())) {
        T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(value);
        counts_.increment_size();
        return *slot;
      }
      const stored_state grown = make_room_for_one_or_throw();
      data_ = grown.data;
      counts_ = grown.counts;
      T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(value);
      counts_.increment_size();
      return *slot;
    } else if constexpr (is_small_copy<Args...>()) {
      // A wider value: built in place, not up front (holding it across the slow path costs a
      // round trip through the stack on every element). When full, a copy is built first (an
      // argument may be an element that the growth moves), room is made out of line, and the
      // copy is stored; both paths rejoin for the increment.
      T* slot;
      if (MEMKIT_LIKELY(!counts_.full())) {
        slot = ::new (static_cast<void*>(data_ + counts_.size())) T(std::forward<Args>(args)...);
      } else {
        const T copy(std::forward<Args>(args)...);
        const stored_state grown = make_room_for_one_or_throw();
        data_ = grown.data;
        counts_ = grown.counts;
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
    if (!try_resize(count)) throw_growth_failure(count);
  }
  // Makes size() `count`, copying `value` into new elements (value may be an element).
  void resize(size_type count, const T& value) {
    if (!try_resize(count, value)) throw_growth_failure(count);
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
    const T* source = std::addressof(value);
    const size_type alias = detail::points_into(source, data_, data_ + counts_.size()) ? static_cast<size_type>(source - data_) : npos;
    return append_with(count - size(), [&](T* destination, size_type n) {
      // After a reallocate() an element passed by reference has moved with the buffer.
      std::uninitialized_fill_n(destination, n, alias == npos ? *source : data_[alias]);
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
    } else if (is_inline() && other.is_inline() && size() <= other.inline_capacity() &&
               other.size() <= inline_capacity()) {
      swap_inline_elements(other);
    } else if (is_inline() && !other.is_inline() && other.has_inline_storage() && size() <= other.inline_capacity()) {
      swap_inline_with_heap(*this, other);
    } else if (other.is_inline() && !is_inline() && has_inline_storage() && other.size() <= inline_capacity()) {
      swap_inline_with_heap(other, *this);
    } else {
      // General case: park this one's contents in a temporary, move other's in, move the parked
      // contents to other. Each step either succeeds or leaves its source untouched; the parked
      // contents are a heap buffer (or nothing), which changes hands back without throwing.
      struct parking : vector_base {
        explicit parking(memkit::allocator& a) noexcept : vector_base(a) {}
        ~parking() { this->template release_storage_at_end<false>(); }
      };
      parking parked(alloc());
      parked.take_contents_of(*this);
      detail::undo_unless_dismissed restore([&]() noexcept { take_contents_of(parked); });
      take_contents_of(other);
      restore.dismiss();
      other.take_contents_of(parked);
    }
  }

  // Exchanges contents and allocators (see the member swap).
  friend void swap(vector_base& a, vector_base& b) { a.swap(b); }

 protected:
  // An empty container without inline storage (memkit::vector) using `a`.
  explicit vector_base(memkit::allocator& a) noexcept
      : data_(nullptr), counts_(0, 0), allocator_bits_(reinterpret_cast<std::uintptr_t>(&a)) {
    check_layout();
  }

  // An empty container with `inline_capacity` elements of inline storage right after these
  // fields (memkit::small_vector).
  vector_base(memkit::allocator& a, size_type inline_capacity) noexcept
      : data_(inline_buffer()),
        counts_(0, inline_capacity),
        allocator_bits_(reinterpret_cast<std::uintptr_t>(&a) | inline_flag) {
    check_layout();
  }

  // Releasing the storage is the derived class's job (release_storage_at_end), because only it
  // knows whether the storage can be inline: a small_vector's destructor then compares one
  // pointer, a vector's tests one for null, and neither reads the inline flag.
  ~vector_base() = default;

  // Destroys the elements and gives back the heap buffer; for destructors. MayBeInline: the
  // object has inline storage (a small_vector), whose data pointer is never null.
  template <bool MayBeInline>
  void release_storage_at_end() noexcept {
    MEMKIT_ASSERT(has_inline_storage() == MayBeInline, "release_storage_at_end: wrong kind of storage");
    detail::destroy_range(data_, data_ + counts_.size());
    if constexpr (MayBeInline) {
      // A small_vector usually ends inline (N is chosen to cover most lengths): the heap case is
      // laid out of line, so the inline case falls through to the caller's next statement
      // instead of jumping over the deallocation (one taken branch fewer per container).
      if (MEMKIT_UNLIKELY(data_ != inline_buffer())) deallocate_block(data_, counts_.capacity());
    } else {
      if (data_ != nullptr) deallocate_block(data_, counts_.capacity());
    }
  }

  vector_base(const vector_base&) = delete;
  vector_base(vector_base&&) = delete;

  // For constructors, on an empty container: `count` value-initialized elements, `count` copies
  // of `value`, or the elements of [first, last), built in place. Unlike resize() and assign(),
  // nothing is moved or assigned, so elements need only be constructible that way (const members,
  // pair<const K, V>, types that cannot move), as for std::vector's constructors. On
  // an exception nothing is left behind: the constructor that called them then has no storage to
  // release.
  void construct_values(size_type count) {
    construct_elements(count, [&](T* at) { std::uninitialized_value_construct_n(at, count); });
  }
  void construct_copies(size_type count, const T& value) {
    construct_elements(count, [&](T* at) { std::uninitialized_fill_n(at, count, value); });
  }
  template <std::input_iterator InputIt>
  void construct_copies(InputIt first, InputIt last) {
    if constexpr (std::forward_iterator<InputIt>) {
      const auto count = static_cast<size_type>(std::distance(first, last));
      construct_elements(count, [&](T* at) { std::uninitialized_copy(first, last, at); });
    } else {
      // One pass, growing as it goes: if an element throws, the elements built so far and the
      // heap buffer holding them go with the exception.
      detail::undo_unless_dismissed undo([&]() noexcept { release_storage(); });
      for (; first != last; ++first) emplace_back(*first);
      undo.dismiss();
    }
  }

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
    } else if (has_inline_storage() && source.size() <= inline_capacity()) {
      detail::relocate(source.data_, source.size(), data_);
      counts_.set_size(source.size());
      source.counts_.set_size(0);  // relocate ended their lives
    } else if (source.size() != 0) {
      // Inline elements that do not fit here: a heap buffer from the source's allocator, which
      // this container takes over with them.
      const size_type count = source.size();
      detail::allocation_transaction<T> fresh(source.alloc(), count, max_size());
      if (fresh.failed()) throw std::bad_alloc();
      detail::relocate(source.data_, count, fresh.data());
      source.counts_.set_size(0);
      adopt_block(fresh.commit());
      counts_.set_size(count);
    }
    set_allocator(source.alloc());
  }

  // True when memory from other's allocator can be given back through this one's.
  bool allocators_equal(const vector_base& other) const noexcept {
    return &alloc() == &other.alloc() || alloc().is_equal(other.alloc());
  }

 private:
  static constexpr std::uintptr_t inline_flag = 1;
  // The data pointer and counts after a growth, returned in registers by the growth phases that
  // throw on failure (Throw); the others return whether they succeeded.
  struct stored_state {
    T* data;
    detail::vector_counts<T> counts;
  };
  template <bool Throw>
  using growth_result = std::conditional_t<Throw, stored_state, bool>;
  template <bool Throw>
  growth_result<Throw> grown() const noexcept {
    if constexpr (Throw) return stored_state{data_, counts_};
    else return true;
  }
  static constexpr size_type npos = static_cast<size_type>(-1);

  static constexpr bool relocatable() noexcept { return detail::relocates_by_memcpy<T>; }
  // Moving elements to a new buffer cannot throw: memcpy, or a nothrow move constructor.
  static constexpr bool relocation_is_nothrow() noexcept {
    return relocatable() || std::is_nothrow_move_constructible_v<T>;
  }

  // The layout small_vector and the packed counts rely on.
  static constexpr void check_layout() noexcept {
    static_assert(alignof(memkit::allocator) >= 2,
                  "the allocator pointer's lowest bit marks inline storage, so allocators must be 2-aligned");
    static_assert(sizeof(vector_base) == sizeof(T*) + sizeof(detail::vector_counts<T>) + sizeof(std::uintptr_t),
                  "vector_base must be exactly data pointer + counts + allocator pointer: small_vector's "
                  "inline storage is found at inline_offset() by code that does not know N");
    static_assert(sizeof(void*) < 8 || sizeof(T) < 4 || sizeof(vector_base) == 24,
                  "on 64-bit systems a vector of 4-byte or larger elements is 24 bytes (32-bit counts packed in one word)");
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

  void destroy_all() noexcept { truncate(0); }
  void truncate(size_type count) noexcept {
    detail::destroy_range(data_ + count, data_ + counts_.size());
    counts_.set_size(static_cast<stored_size>(count));
  }

  [[noreturn]] static void throw_length_error() {
    throw std::length_error("memkit::vector: size would exceed max_size()");
  }
  [[noreturn]] static void throw_growth_failure(size_type needed) {
    if (needed > max_size()) throw_length_error();
    throw std::bad_alloc();
  }

  // ---- the growth policy ------------------------------------------------------------------------

  // The one growth policy: the capacity to grow to from `current` when `needed` elements must
  // fit: double (at least 4), or `needed` when that is more.
  static size_type next_capacity(size_type current, size_type needed) noexcept {
    size_type doubled = current > max_size() / 2 ? max_size() : current * 2;
    if (doubled < 4) doubled = 4 < max_size() ? 4 : max_size();
    return needed > doubled ? needed : doubled;
  }

  // ---- the one path to the allocator, in three phases -------------------------------------------
  //
  // 1. allocate: an allocation_transaction (or, on the heap, resize()/reallocate() in place);
  // 2. relocate: the elements move into the new block around any gap the caller fills;
  // 3. adopt: adopt_block() gives back the old buffer (or remembers the inline capacity) and
  //    installs the new one. Only this phase changes the container, and it cannot throw.
  // Every function here is out of line, so the inline fast paths stay a compare and a store.

  void deallocate_block(T* pointer, size_type capacity) noexcept {
    alloc().deallocate(pointer, capacity * sizeof(T), alignof(T));
  }

  // Phase 3: installs a block (elements already in it) in place of the current storage, whose
  // elements were relocated away or destroyed. MayBeHeap false: the caller knows the current
  // storage is inline or absent (a spill), so there is nothing to free.
  template <bool MayBeHeap = true>
  void adopt_block(block fresh) noexcept {
    if (!MayBeHeap || is_inline()) {
      if (!MayBeHeap && data_ == nullptr) {
        // no storage yet: nothing to give back or remember
      } else {
        remember_inline_capacity(counts_.capacity());
      }
    } else if (data_ != nullptr) {
      deallocate_block(data_, counts_.capacity());
    }
    data_ = fresh.pointer;
    counts_.set_capacity(static_cast<stored_size>(fresh.capacity));
  }

  // Phase 1 for a heap buffer: makes it hold `new_capacity` elements without relocating them one
  // by one. Trivially relocatable T (when MayMoveBytes): reallocate(), which grows in place when
  // it can and moves the bytes otherwise (asking resize() first would cost a second call whenever
  // the block cannot grow); other T: resize(), in place only. False when that did not work.
  // Out of line, apart from move_to_new_block: each saves only the registers its own calls need.
  // Throw: a failed reallocate() throws std::bad_alloc instead of returning false.
  template <bool MayMoveBytes, bool Throw = false>
  MEMKIT_NOINLINE growth_result<Throw> resize_heap_buffer(size_type new_capacity) noexcept(!Throw) {
    const std::size_t old_bytes = counts_.capacity() * sizeof(T);
    const std::size_t new_bytes = new_capacity * sizeof(T);
    if constexpr (MayMoveBytes && relocatable()) {
      void* moved = alloc().reallocate(data_, old_bytes, counts_.size() * sizeof(T), new_bytes, alignof(T));
      if (moved == nullptr) {
        if constexpr (Throw) throw std::bad_alloc();
        else return false;
      }
      data_ = static_cast<T*>(moved);
    } else {
      if (!alloc().resize(data_, old_bytes, new_bytes, alignof(T))) {
        if constexpr (Throw) throw std::bad_alloc();
        else return false;
      }
    }
    counts_.set_capacity(static_cast<stored_size>(new_capacity));
    return grown<Throw>();
  }

  // All three phases into a new block of (at least) `new_capacity` elements, leaving `count`
  // slots at `index` that fill(gap) constructs before any element moves (so fill's arguments may
  // refer to elements). Strong guarantee: if fill or a relocation throws, nothing changed.
  // Returns the gap, or null (nothing changed) when the allocator fails.
  template <class Fill>
  MEMKIT_NOINLINE T* grow_into_new_block(size_type index, size_type count, size_type new_capacity, Fill&& fill) {
    const size_type old_size = size();
    detail::allocation_transaction<T> fresh(alloc(), new_capacity, max_size());
    if (MEMKIT_UNLIKELY(fresh.failed())) return nullptr;
    T* const gap = fresh.data() + index;
    fill(gap);
    detail::construction_transaction<T> filled(gap, gap + count);
    detail::relocate_construct(data_, index, fresh.data());
    // Bytes copied from relocatable elements are not objects of their own: nothing to undo.
    detail::construction_transaction<T> before_gap(fresh.data(), fresh.data() + (relocatable() ? 0 : index));
    detail::relocate_construct(data_ + index, old_size - index, gap + count);
    before_gap.commit();
    filled.commit();
    detail::end_relocated(data_, old_size);
    adopt_block(fresh.commit());
    counts_.set_size(static_cast<stored_size>(old_size + count));
    return gap;
  }

  // The same three phases with no gap: all the elements move to a new block of (at least)
  // `new_capacity` elements. A spill of a small_vector, and growth that resize() could not do in
  // place, come here, so it is kept to just the phases. False (nothing changed) when the
  // allocator fails.
  // Throw: a failed allocation throws std::bad_alloc instead of returning false. MayBeHeap: as
  // for adopt_block (false for a spill out of inline storage or a first allocation).
  template <bool Throw = false, bool MayBeHeap = true>
  MEMKIT_NOINLINE growth_result<Throw> move_to_new_block(size_type new_capacity) noexcept(!Throw && relocation_is_nothrow()) {
    detail::allocation_transaction<T> fresh(alloc(), new_capacity, max_size());
    if (MEMKIT_UNLIKELY(fresh.failed())) {
      if constexpr (Throw) throw std::bad_alloc();
      else return false;
    }
    detail::relocate(data_, size(), fresh.data());
    adopt_block<MayBeHeap>(fresh.commit());
    return grown<Throw>();
  }

  // Gives the buffer `new_capacity` (>= size()) elements: in place or by reallocate() when it is
  // on the heap, else in a new block. False (nothing changed) when the allocator fails.
  template <bool MayMoveBytes>
  bool change_capacity(size_type new_capacity) {
    MEMKIT_ASSERT(new_capacity >= size(), "change_capacity below size");
    if (!is_inline() && data_ != nullptr) {
      if (resize_heap_buffer<MayMoveBytes>(new_capacity)) return true;
      if constexpr (MayMoveBytes && relocatable()) return false;  // reallocate() already tried a new block
    }
    return move_to_new_block(new_capacity);
  }

  // Appends `count` elements built by construct(destination, count); grows first when needed.
  // Returns false (nothing changed) when memory cannot be obtained. If construct throws, the
  // elements are as before (capacity may have grown).
  template <class Construct>
  bool append_with(size_type count, Construct&& construct) {
    if (count > capacity() - size()) {
      if (count > max_size() - size()) return false;
      const size_type needed = size() + count;
      if (!change_capacity<true>(next_capacity(capacity(), needed)) && !change_capacity<true>(needed)) return false;
    }
    construct(data_ + counts_.size(), count);
    counts_.set_size(static_cast<stored_size>(size() + count));
    return true;
  }

  // The constructors' one step: `count` elements that `construct(at)` builds, in the storage this
  // empty container has (inline) or in a new buffer.
  template <class Construct>
  void construct_elements(size_type count, Construct construct) {
    if (count > capacity()) {
      assign_in_new_buffer(count, construct);
      return;
    }
    construct(data_);
    counts_.set_size(static_cast<stored_size>(count));
  }

  // Replaces the contents with `count` elements that `construct(fresh)` builds in a new buffer;
  // on an exception the old contents stay (strong guarantee).
  template <class Construct>
  void assign_in_new_buffer(size_type count, Construct construct) {
    if (count > max_size()) throw_length_error();
    detail::allocation_transaction<T> fresh(alloc(), count, max_size());
    if (fresh.failed()) throw std::bad_alloc();
    construct(fresh.data());
    destroy_all();
    adopt_block(fresh.commit());
    counts_.set_size(static_cast<stored_size>(count));
  }

  // Opens a gap of `count` elements at `index` and fills it. Without growth: the tail moves up
  // (construct_new builds the part of the gap past the old end from source position `skipped`,
  // assign_existing overwrites the part within it) — basic guarantee. With growth: a new block,
  // filled first — strong guarantee when T's move does not throw or T is copyable.
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
    if (grow_into_new_block(index, count, next_capacity(capacity(), size() + count), fill) == nullptr) throw std::bad_alloc();
  }

  // ---- emplace_back's slow paths (out of line) --------------------------------------------------

  // True when emplace_back(args...) builds a small trivially copyable T (an int, a 32-byte
  // struct): building it up front and copying it in is then cheaper than the alternative, and the
  // arguments cannot be affected by the growth that follows.
  template <class... Args>
  static constexpr bool is_small_copy() noexcept {
    // (The copy is what lets an argument that is an element survive growth: a type whose copy is
    // deleted takes the general path, which moves.)
    if constexpr (std::is_trivially_copyable_v<T> && std::is_trivially_copy_constructible_v<T> && sizeof(T) <= 64)
      return std::is_constructible_v<T, Args...>;
    else return false;
  }
  // True when emplace_back(args...) is a push_back of one T, whose address can be checked
  // against the buffer (so growth may use reallocate()).
  template <class... Args>
  static constexpr bool is_single_value() noexcept {
    if constexpr (sizeof...(Args) == 1) return (std::is_same_v<std::remove_cvref_t<Args>, T> && ...);
    else return false;
  }

  // Makes room for one more element in a full buffer (size() == capacity()); the value to store
  // is a copy the caller holds, so the buffer may move. False (nothing changed) on failure.
  // Inlined into its two cold callers, so a spill is one call deep before the allocator.
  bool grow_full_for_one_more() noexcept {
    MEMKIT_ASSERT(counts_.full(), "grow_full_for_one_more: the buffer is not full");
    const size_type count = size();  // == capacity()
    if (MEMKIT_UNLIKELY(count >= max_size())) return false;
    return change_capacity<true>(next_capacity(count, count + 1));
  }
  // grow_full_for_one_more() or throw: a dispatcher that jumps on to the phase that applies (the
  // callees throw themselves), so a spill costs no frame here.
  // Returns the grown storage's data pointer and counts in registers, and emplace_back stores the
  // value through them instead of reloading both through the object after the call. With the
  // reload, GCC kept the vector's address on the stack across a caller's push_back loop and moved
  // it between registers on every element (vector-growth suite: 26 instructions per push_back
  // instead of 24, callgrind); small_vector's loops stay as they were (data and counts in
  // registers).
  MEMKIT_NOINLINE stored_state make_room_for_one_or_throw() {
    const size_type count = size();  // == capacity()
    if (MEMKIT_UNLIKELY(count >= max_size())) throw_length_error();
    const size_type wanted = next_capacity(count, count + 1);
    if (is_inline() || data_ == nullptr) return move_to_new_block<true, false>(wanted);
    return resize_heap_buffer<true, true>(wanted);
  }
  // The slow path of try_emplace_back for small trivially copyable T (`value` is a copy, so the
  // buffer may move). Null (nothing changed) on failure.
  MEMKIT_NOINLINE T* grow_and_append_copy(const T& value) noexcept {
    if (!grow_full_for_one_more()) return nullptr;
    T* slot = ::new (static_cast<void*>(data_ + counts_.size())) T(value);
    counts_.increment_size();
    return slot;
  }

  // emplace_back's slow path for other T, as one out-of-line call that throws itself, so the
  // caller's loop keeps size, capacity and data in registers on the fast path.
  template <class... Args>
  MEMKIT_NOINLINE T* grow_and_emplace_back_or_throw(Args&&... args) {
    T* slot = grow_and_emplace_back(std::forward<Args>(args)...);
    if (slot == nullptr) throw_growth_failure(size() + 1);
    return slot;
  }

  // Grows by one and constructs the new last element; null (nothing changed, arguments
  // untouched) when memory cannot be obtained.
  template <class... Args>
  T* grow_and_emplace_back(Args&&... args) {
    if constexpr (is_single_value<Args...>()) {
      // One T: if it is an element, its index survives a reallocate() that moves the buffer.
      const T* source = std::addressof(args...);
      const size_type alias = detail::points_into(source, data_, data_ + counts_.size()) ? static_cast<size_type>(source - data_) : npos;
      return grow_and_construct_back<true>([&](T* slot) {
        T& from = alias == npos ? const_cast<T&>(*source) : data_[alias];
        ::new (static_cast<void*>(slot)) T(static_cast<Args&&>(from)...);
      });
    } else {
      // Arbitrary arguments may refer to elements: the buffer must not move before they are used,
      // so growth is in place or into a new block, never through reallocate().
      return grow_and_construct_back<false>([&](T* slot) { ::new (static_cast<void*>(slot)) T(std::forward<Args>(args)...); });
    }
  }

  // Grows for one more element and constructs it with construct(slot): on the heap in place (or
  // by reallocate(), when MayMoveBytes), then constructs; else in a new block, where the element
  // is built before the old ones move (strong guarantee).
  template <bool MayMoveBytes, class Construct>
  MEMKIT_NOINLINE T* grow_and_construct_back(Construct&& construct) {
    if (size() >= max_size()) return nullptr;
    const size_type new_capacity = next_capacity(capacity(), size() + 1);
    if (!is_inline() && data_ != nullptr) {
      if (resize_heap_buffer<MayMoveBytes>(new_capacity)) {
        T* slot = data_ + counts_.size();
        construct(slot);
        counts_.increment_size();
        return slot;
      }
      if constexpr (MayMoveBytes && relocatable()) return nullptr;  // reallocate() already tried a new block
    }
    return grow_into_new_block(size(), 1, new_capacity, construct);
  }

  // ---- moves and swaps between storages ---------------------------------------------------------

  // The heap elements move back into inline storage (shrink_to_fit of a small_vector).
  void move_back_inline() {
    const size_type inline_cap = inline_capacity();
    T* const heap = data_;
    const size_type heap_capacity = counts_.capacity();
    // A throwing copy has overwritten the remembered inline capacity; nothing else changed.
    detail::undo_unless_dismissed remember([&]() noexcept { remember_inline_capacity(inline_cap); });
    detail::relocate(heap, size(), inline_buffer());
    remember.dismiss();
    deallocate_block(heap, heap_capacity);
    data_ = inline_buffer();
    counts_.set_capacity(static_cast<stored_size>(inline_cap));
  }

  // Destroys the elements and gives back the heap buffer, keeping inline storage (whose capacity
  // is remembered, because the caller is about to adopt a heap buffer).
  void release_storage() noexcept {
    destroy_all();
    adopt_block({});
  }

  // Takes other's heap buffer (this one holds none: inline or null). Other returns to its inline
  // storage, or to null.
  void adopt_heap_of(vector_base& other) noexcept {
    if (is_inline()) remember_inline_capacity(counts_.capacity());
    data_ = other.data_;
    counts_ = other.counts_;
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

  void swap_allocators(vector_base& other) noexcept {
    memkit::allocator& mine = alloc();
    set_allocator(other.alloc());
    other.set_allocator(mine);
  }

  void swap_fields(vector_base& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(counts_, other.counts_);
    swap_allocators(other);
  }

  // Both inline and each fits the other's storage: swap element by element.
  void swap_inline_elements(vector_base& other) {
    vector_base* shorter = size() <= other.size() ? this : &other;
    vector_base* longer = shorter == this ? &other : this;
    const size_type common = shorter->size();
    std::swap_ranges(shorter->data_, shorter->data_ + common, longer->data_);
    const size_type extra = longer->size() - common;
    detail::relocate(longer->data_ + common, extra, shorter->data_ + common);
    shorter->counts_.set_size(static_cast<stored_size>(common + extra));
    longer->counts_.set_size(static_cast<stored_size>(common));
    swap_allocators(other);
  }

  // `inline_side`'s elements move into `heap_side`'s inline storage; heap_side's heap buffer
  // changes hands. Throws only if copying an element throws (then nothing changed).
  static void swap_inline_with_heap(vector_base& inline_side, vector_base& heap_side) {
    T* const heap = heap_side.data_;
    const detail::vector_counts<T> heap_counts = heap_side.counts_;
    const size_type heap_side_inline_capacity = heap_side.inline_capacity();  // before overwriting
    T* const destination = heap_side.inline_buffer();
    {
      detail::undo_unless_dismissed remember([&]() noexcept { heap_side.remember_inline_capacity(heap_side_inline_capacity); });
      detail::relocate(inline_side.data_, inline_side.size(), destination);
      remember.dismiss();
    }
    const size_type inline_side_capacity = inline_side.counts_.capacity();
    heap_side.data_ = destination;
    heap_side.counts_ = detail::vector_counts<T>(inline_side.counts_.size(), heap_side_inline_capacity);
    inline_side.remember_inline_capacity(inline_side_capacity);
    inline_side.data_ = heap;
    inline_side.counts_ = heap_counts;
    inline_side.swap_allocators(heap_side);
  }

  T* data_;
  detail::vector_counts<T> counts_;  // size and capacity
  std::uintptr_t allocator_bits_;    // the allocator's address | inline_flag
};

}  // namespace memkit
