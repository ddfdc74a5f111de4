// memkit::small_vector<T, N> — a vector that keeps its first N elements inside the object and
// spills to its allocator beyond that.
//
// When most sequences are short (say, lengths that cluster around a typical value), an
// inline buffer sized to the common case removes nearly every heap allocation: building and
// dropping a small_vector<int, 16> of 8 elements touches no allocator at all. Beyond N elements it
// behaves like memkit::vector<T>: same interface, same run-time allocator, same in-place growth
// and try_* operations, from the same implementation: vector_base.hpp documents every member.
//
// Pick it over std::vector (and over vector<T>) for local or embedded sequences whose usual length
// is known and small; pick N near the length that covers most cases. Pick vector<T> when
// sequences are usually long, when the container itself is moved or swapped a lot (moving a
// small_vector moves its inline elements one by one), or when sizeof matters more than
// allocations.
//
// Size: sizeof(small_vector<T, N>) is 24 bytes + N * sizeof(T) on 64-bit systems for T of 4 bytes
// or more (rounded up to the alignment of 8): the data pointer (8), the size and the capacity
// (32 bits each, packed in one word, so at most 2^32 - 1 elements), and the allocator pointer
// (8), whose lowest bit marks that inline storage follows. Boost's small_vector has the same 24 bytes of overhead with a
// stateless allocator; absl::InlinedVector has 16 but no room for a run-time allocator.
//
// Functions take any small_vector<T, N> (any N) or vector<T> as `memkit::vector_base<T>&`:
//
//   void collect(memkit::vector_base<int>& out) { out.push_back(42); }
//   memkit::small_vector<int, 8> a;  memkit::vector<int> b;
//   collect(a);  collect(b);
//
// Moves and swaps: a heap buffer changes hands; inline elements are moved one by one (so
// small_vector is not trivially relocatable). swap exchanges allocators along with contents.
// Assignment keeps the destination's allocator. shrink_to_fit moves elements back inline when
// they fit.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <type_traits>
#include <utility>

#include "memkit/allocator.hpp"
#include "memkit/vector_base.hpp"

namespace memkit {

namespace detail {
// The inline capacity when none is given: what fits in a 64-byte object after vector_base's
// fields (24 bytes, or 32 for elements under 4 bytes, whose counts are 64-bit), at least 1.
template <class T>
constexpr std::size_t default_small_vector_capacity() noexcept {
  constexpr std::size_t alignment = alignof(T) > alignof(vector_stored_size<T>) ? alignof(T) : alignof(vector_stored_size<T>);
  constexpr std::size_t header = align_up(sizeof(vector_base<T>), alignment);
  constexpr std::size_t room = header < 64 ? 64 - header : 0;
  return sizeof(T) >= room ? 1 : room / sizeof(T);
}
}  // namespace detail

template <class T, std::size_t N = detail::default_small_vector_capacity<T>()>
class small_vector : public vector_base<T> {
  using base = vector_base<T>;
  static_assert(N > 0, "small_vector needs N >= 1; use memkit::vector<T> for no inline storage");
  static_assert(N <= base::max_size(), "small_vector: N exceeds what the counts can hold");

 public:
  using typename base::const_iterator;
  using typename base::const_pointer;
  using typename base::const_reference;
  using typename base::const_reverse_iterator;
  using typename base::difference_type;
  using typename base::iterator;
  using typename base::pointer;
  using typename base::reference;
  using typename base::reverse_iterator;
  using typename base::size_type;
  using typename base::value_type;

  // The number of elements held inline.
  static constexpr std::size_t inline_capacity = N;

  // Empty, on default_allocator() (which is only used once more than N elements are stored).
  small_vector() noexcept : base(default_allocator(), N) { check_layout(); }
  // Empty, on `a`, which must outlive it.
  explicit small_vector(allocator& a) noexcept : base(a, N) { check_layout(); }
  // `count` value-initialized elements.
  explicit small_vector(size_type count, allocator& a = default_allocator()) : base(a, N) {
    check_layout();
    this->construct_values(count);
  }
  // `count` copies of `value`.
  small_vector(size_type count, const T& value, allocator& a = default_allocator()) : base(a, N) {
    check_layout();
    this->construct_copies(count, value);
  }
  // The elements of [first, last).
  template <std::input_iterator InputIt>
  small_vector(InputIt first, InputIt last, allocator& a = default_allocator()) : base(a, N) {
    check_layout();
    this->construct_copies(first, last);
  }
  // The list's elements.
  small_vector(std::initializer_list<T> list, allocator& a = default_allocator()) : base(a, N) {
    check_layout();
    this->construct_copies(list.begin(), list.end());
  }
  // A copy on other's allocator.
  small_vector(const small_vector& other) : base(other.get_allocator(), N) {
    check_layout();
    this->construct_copies(other.begin(), other.end());
  }
  // A copy on `a`.
  small_vector(const small_vector& other, allocator& a) : base(a, N) {
    check_layout();
    this->construct_copies(other.begin(), other.end());
  }
  // A copy of any memkit vector on its allocator.
  explicit small_vector(const vector_base<T>& other) : base(other.get_allocator(), N) {
    check_layout();
    this->construct_copies(other.begin(), other.end());
  }
  // A copy of any memkit vector on `a`.
  small_vector(const vector_base<T>& other, allocator& a) : base(a, N) {
    check_layout();
    this->construct_copies(other.begin(), other.end());
  }
  // Takes other's heap buffer, or moves its inline elements into this one's inline storage; takes
  // its allocator. other is left empty. Never allocates.
  small_vector(small_vector&& other) noexcept(std::is_nothrow_move_constructible_v<T> ||
                                              is_trivially_relocatable_v<T>)
      : base(other.get_allocator(), N) {
    check_layout();
    this->take_contents_of(other);
  }
  // On `a`: takes other's heap buffer when the allocators are equal, else moves the elements.
  small_vector(small_vector&& other, allocator& a) : base(a, N) {
    check_layout();
    base::operator=(std::move(other));
  }
  // Takes the contents and allocator of any memkit vector (a vector, a small_vector of another
  // N): a heap buffer changes hands; inline elements move inline when they fit, else into a
  // buffer from that allocator.
  explicit small_vector(vector_base<T>&& other) : base(other.get_allocator(), N) {
    check_layout();
    this->take_contents_of(other);
  }
  // Takes the contents of any memkit vector onto `a`.
  small_vector(vector_base<T>&& other, allocator& a) : base(a, N) {
    check_layout();
    base::operator=(std::move(other));
  }

  // Destroys the elements and gives back the heap buffer, if any.
  ~small_vector() { this->template release_storage_at_end<true>(); }

  // Copies other's elements; keeps this one's allocator.
  small_vector& operator=(const small_vector& other) {
    base::operator=(other);
    return *this;
  }
  // Takes other's elements; keeps this one's allocator (see vector_base::operator=).
  small_vector& operator=(small_vector&& other) {
    base::operator=(std::move(other));
    return *this;
  }
  // Assignment from any memkit vector and from an initializer list.
  using base::operator=;
  // Swap with any memkit vector (see vector_base::swap).
  using base::swap;

  // Exchanges contents and allocators (see vector_base::swap; may allocate only when one side's
  // inline elements do not fit the other's inline storage, which cannot happen for equal N).
  void swap(small_vector& other) { base::swap(other); }
  friend void swap(small_vector& a, small_vector& b) { a.swap(b); }

 private:
  void check_layout() noexcept {
    static_assert(sizeof(small_vector) == detail::align_up(base::inline_offset() + base::inline_bytes(N), alignof(small_vector)),
                  "small_vector<T, N> must be vector_base followed directly by its inline storage: code that "
                  "only sees vector_base<T> finds the storage at inline_offset() without knowing N");
    static_assert(alignof(small_vector) >= alignof(T), "the inline storage must be aligned for T");
    MEMKIT_ASSERT(static_cast<void*>(storage_) == static_cast<void*>(this->inline_buffer()),
                  "small_vector: inline storage is not where vector_base expects it");
  }

  // Raw bytes: elements are constructed here one by one; while they live on the heap the first
  // bytes remember N for code that only sees vector_base<T>.
  alignas(base::inline_alignment()) std::byte storage_[base::inline_bytes(N)];
};

// small_vector v(first, last) holds the iterators' value type, with the default inline capacity.
template <std::input_iterator InputIt>
small_vector(InputIt, InputIt) -> small_vector<std::iter_value_t<InputIt>>;
template <std::input_iterator InputIt>
small_vector(InputIt, InputIt, allocator&) -> small_vector<std::iter_value_t<InputIt>>;

}  // namespace memkit
