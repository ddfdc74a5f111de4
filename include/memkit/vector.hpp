// memkit::vector<T> — std::vector's interface with a run-time allocator, in-place growth, and
// operations that fail without throwing.
//
// The allocator is a `memkit::allocator&` given at construction (default_allocator() otherwise)
// and is not part of the type, so a vector<int> on an arena and one on the heap are the same type
// and one function handles both. Growth never copies when the
// allocator can avoid it: trivially relocatable elements (see type_traits.hpp) grow through
// reallocate(), which extends the block in place when it can and otherwise moves the bytes
// (realloc, mremap); other elements ask resize() to grow in place first and are moved one by one
// only when that fails. With virtual_arena a vector grows without ever copying; with
// malloc_allocator large vectors grow through mremap. The size the allocator reports
// (allocate_at_least) becomes capacity.
//
// Pick it over std::vector when the allocator must be chosen at run time without changing the
// type, when growth should happen in place (arena, realloc), when allocation failure must be a
// return value (try_reserve, try_push_back, try_emplace_back, try_resize), or for
// unchecked_push_back after a reserve. Stay with std::vector when you need more than 2^32 - 1
// elements of 4 bytes or more, incomplete element types, or allocator propagation traits.
//
// Differences from std::vector, all deliberate:
// - size_type is std::size_t but counts are stored in 32 bits for elements of 4 bytes or more
//   (max_size() says so; growth beyond throws std::length_error);
// - a copy uses its source's allocator; assignment keeps the destination's allocator and moves
//   elements one by one when the allocators differ (like std::pmr); swap exchanges allocators with
//   the contents, so it is defined (and noexcept) for any two vectors;
// - std::erase / std::erase_if are memkit::erase / memkit::erase_if, found by argument-dependent
//   lookup when called unqualified (`erase(v, 0)`), because overloading in namespace std is not
//   allowed;
// - on growth failure caused by an element's constructor, the contents are unchanged but the
//   capacity may have grown (in place).
//
// Functions that accept any memkit vector take `memkit::vector_base<T>&`: both vector<T> and
// every small_vector<T, N> bind to it. vector_base.hpp documents every member.
//
//   memkit::virtual_arena arena(1 << 30);
//   memkit::vector<int> v(arena);          // grows in place inside the arena
//   for (int i = 0; i < 1000; ++i) v.push_back(i);
//   if (!v.try_reserve(1u << 28)) { /* handle it: nothing changed */ }
#pragma once

#include <initializer_list>
#include <iterator>
#include <utility>

#include "memkit/allocator.hpp"
#include "memkit/vector_base.hpp"
#include "memkit/type_traits.hpp"

namespace memkit {

template <class T>
class vector : public vector_base<T> {
  using base = vector_base<T>;

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

  // An empty vector on default_allocator().
  vector() noexcept : base(default_allocator()) {}
  // An empty vector on `a`, which must outlive it.
  explicit vector(allocator& a) noexcept : base(a) {}
  // `count` value-initialized elements.
  explicit vector(size_type count, allocator& a = default_allocator()) : base(a) { this->construct_values(count); }
  // `count` copies of `value`.
  vector(size_type count, const T& value, allocator& a = default_allocator()) : base(a) {
    this->construct_copies(count, value);
  }
  // The elements of [first, last).
  template <std::input_iterator InputIt>
  vector(InputIt first, InputIt last, allocator& a = default_allocator()) : base(a) {
    this->construct_copies(first, last);
  }
  // The list's elements.
  vector(std::initializer_list<T> list, allocator& a = default_allocator()) : base(a) {
    this->construct_copies(list.begin(), list.end());
  }
  // A copy on other's allocator.
  vector(const vector& other) : base(other.get_allocator()) { this->construct_copies(other.begin(), other.end()); }
  // A copy on `a`.
  vector(const vector& other, allocator& a) : base(a) { this->construct_copies(other.begin(), other.end()); }
  // A copy of any memkit vector (a small_vector, say) on its allocator.
  explicit vector(const vector_base<T>& other) : base(other.get_allocator()) {
    this->construct_copies(other.begin(), other.end());
  }
  // A copy of any memkit vector on `a`.
  vector(const vector_base<T>& other, allocator& a) : base(a) { this->construct_copies(other.begin(), other.end()); }
  // Takes other's buffer and allocator; other is left empty. Never allocates.
  vector(vector&& other) noexcept : base(other.get_allocator()) { this->take_contents_of(other); }
  // On `a`: takes other's buffer when the allocators are equal, else moves the elements one by one
  // into memory from `a`. other is left empty.
  vector(vector&& other, allocator& a) : base(a) { base::operator=(std::move(other)); }
  // Takes the contents and allocator of any memkit vector: a heap buffer changes hands, inline
  // elements are moved into a buffer from that allocator. other is left empty.
  explicit vector(vector_base<T>&& other) : base(other.get_allocator()) { this->take_contents_of(other); }
  // Takes the contents of any memkit vector onto `a` (see vector(vector&&, allocator&)).
  vector(vector_base<T>&& other, allocator& a) : base(a) { base::operator=(std::move(other)); }

  // Destroys the elements and gives back the buffer.
  ~vector() { this->template release_storage_at_end<false>(); }

  // Copies other's elements; keeps this vector's allocator.
  vector& operator=(const vector& other) {
    base::operator=(other);
    return *this;
  }
  // Takes other's elements; keeps this vector's allocator (see vector_base::operator=).
  vector& operator=(vector&& other) {
    base::operator=(std::move(other));
    return *this;
  }
  // Assignment from any memkit vector and from an initializer list.
  using base::operator=;
  // Swap with any memkit vector (see vector_base::swap).
  using base::swap;

  // Exchanges contents and allocators. Never allocates, never throws.
  void swap(vector& other) noexcept { base::swap(other); }
  // Exchanges contents and allocators. Never allocates, never throws.
  friend void swap(vector& a, vector& b) noexcept { a.swap(b); }
};

template <std::input_iterator InputIt>
vector(InputIt, InputIt) -> vector<std::iter_value_t<InputIt>>;
template <std::input_iterator InputIt>
vector(InputIt, InputIt, allocator&) -> vector<std::iter_value_t<InputIt>>;

// A vector holds a pointer to its heap buffer, never to itself: its bytes may move.
template <class T>
struct is_trivially_relocatable<vector<T>> : std::true_type {};

}  // namespace memkit
