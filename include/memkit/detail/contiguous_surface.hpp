// The part of std::vector's interface that only reads a contiguous run of elements: element
// access, iterators, emptiness and comparison, plus std::erase / std::erase_if. memkit::vector_base
// (hence vector and small_vector) and memkit::dyn_array inherit it instead of each writing it out;
// a container provides data(), size() and erase(first, last), and gets the rest from here.
// Internal: users see these members as members of the containers (documented here once).
#pragma once

#include <algorithm>
#include <compare>
#include <concepts>
#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "memkit/detail/config.hpp"

namespace memkit::detail {

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

// True when `p` points into [first, last); std::less gives a total order over all pointers.
template <class T>
bool points_into(const T* p, const T* first, const T* last) noexcept {
  return !std::less<const T*>{}(p, first) && std::less<const T*>{}(p, last);
}

// Ends the lives of [first, last); nothing to do for trivially destructible T.
template <class T>
void destroy_range(T* first, T* last) noexcept {
  if constexpr (!std::is_trivially_destructible_v<T>) std::destroy(first, last);
  else (void)first, (void)last;
}

// Derived provides data() and size() (and erase(first, last) for the free erase functions).
template <class Derived, class T>
class contiguous_surface {
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

  // ---- element access ---------------------------------------------------------------------------

  // The element at `index`; throws std::out_of_range when index >= size().
  reference at(size_type index) {
    if (index >= self().size()) throw_out_of_range();
    return self().data()[index];
  }
  // The element at `index`; throws std::out_of_range when index >= size().
  const_reference at(size_type index) const {
    if (index >= self().size()) throw_out_of_range();
    return self().data()[index];
  }
  // The element at `index` (checked by an assertion in debug builds).
  reference operator[](size_type index) noexcept {
    MEMKIT_ASSERT(index < self().size(), "index out of range");
    return self().data()[index];
  }
  // The element at `index` (checked by an assertion in debug builds).
  const_reference operator[](size_type index) const noexcept {
    MEMKIT_ASSERT(index < self().size(), "index out of range");
    return self().data()[index];
  }
  // The first element; the container must not be empty.
  reference front() noexcept {
    MEMKIT_ASSERT(!empty(), "front() of an empty container");
    return self().data()[0];
  }
  // The first element; the container must not be empty.
  const_reference front() const noexcept {
    MEMKIT_ASSERT(!empty(), "front() of an empty container");
    return self().data()[0];
  }
  // The last element; the container must not be empty.
  reference back() noexcept {
    MEMKIT_ASSERT(!empty(), "back() of an empty container");
    return self().data()[self().size() - 1];
  }
  // The last element; the container must not be empty.
  const_reference back() const noexcept {
    MEMKIT_ASSERT(!empty(), "back() of an empty container");
    return self().data()[self().size() - 1];
  }

  // ---- iterators (pointers) ---------------------------------------------------------------------

  // The first element.
  iterator begin() noexcept { return self().data(); }
  // The first element.
  const_iterator begin() const noexcept { return self().data(); }
  // The first element.
  const_iterator cbegin() const noexcept { return self().data(); }
  // One past the last element.
  iterator end() noexcept { return self().data() + self().size(); }
  // One past the last element.
  const_iterator end() const noexcept { return self().data() + self().size(); }
  // One past the last element.
  const_iterator cend() const noexcept { return end(); }
  // The last element, for walking backwards.
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  // The last element, for walking backwards.
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  // The last element, for walking backwards.
  const_reverse_iterator crbegin() const noexcept { return const_reverse_iterator(end()); }
  // Before the first element, for walking backwards.
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  // Before the first element, for walking backwards.
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }
  // Before the first element, for walking backwards.
  const_reverse_iterator crend() const noexcept { return const_reverse_iterator(begin()); }

  // True when there are no elements.
  [[nodiscard]] bool empty() const noexcept { return self().size() == 0; }

  // ---- comparison (by elements, as std::vector) -------------------------------------------------

  // Equal sizes and equal elements.
  friend bool operator==(const Derived& a, const Derived& b)
    requires std::equality_comparable<T>
  {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  // Lexicographic order (by T's <=>, or by < when T has no <=>).
  friend auto operator<=>(const Derived& a, const Derived& b)
    requires requires(const T& x) { x < x; }
  {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end(), synth_three_way{});
  }

 protected:
  contiguous_surface() = default;
  ~contiguous_surface() = default;
  contiguous_surface(const contiguous_surface&) = default;
  contiguous_surface& operator=(const contiguous_surface&) = default;

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
  [[noreturn]] static void throw_out_of_range() { throw std::out_of_range("memkit: index out of range"); }
};

// True for memkit's contiguous containers (vector, small_vector, vector_base, dyn_array).
template <class Container>
concept contiguous_container =
    std::derived_from<Container, contiguous_surface<typename Container::surface_type, typename Container::value_type>>;

}  // namespace memkit::detail

namespace memkit {

// Removes every element equal to `value`; returns how many were removed. (std::erase for memkit
// containers; found by argument-dependent lookup: `erase(v, value)`.)
template <detail::contiguous_container Container, class U>
typename Container::size_type erase(Container& c, const U& value) {
  const auto kept_end = std::remove(c.begin(), c.end(), value);
  const auto removed = static_cast<typename Container::size_type>(c.end() - kept_end);
  c.erase(kept_end, c.end());
  return removed;
}

// Removes every element for which `predicate` is true; returns how many were removed.
template <detail::contiguous_container Container, class Predicate>
typename Container::size_type erase_if(Container& c, Predicate predicate) {
  const auto kept_end = std::remove_if(c.begin(), c.end(), predicate);
  const auto removed = static_cast<typename Container::size_type>(c.end() - kept_end);
  c.erase(kept_end, c.end());
  return removed;
}

}  // namespace memkit
