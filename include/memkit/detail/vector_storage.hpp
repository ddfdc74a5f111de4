// The storage layer under memkit::vector_base: how size and capacity are stored, and how
// elements relocate between buffers. Internal; the public interface is memkit/vector_base.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "memkit/allocator.hpp"
#include "memkit/detail/config.hpp"
#include "memkit/detail/contiguous_surface.hpp"
#include "memkit/detail/transactions.hpp"
#include "memkit/type_traits.hpp"

namespace memkit::detail {

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
  static_assert(sizeof(word) == 8, "the packed counts need a 64-bit word for two 32-bit halves");
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

// Relocation, growth's second phase: building `count` elements at `destination` from those at
// `source`. Trivially relocatable T: their bytes are copied, and the sources need no destruction
// afterwards. Other T: moved when the move cannot throw (or there is no copy), else copied, so a
// throw leaves the sources intact (std::vector's rule); a throw destroys what was built.
template <class T>
inline constexpr bool relocates_by_memcpy = is_trivially_relocatable_v<T>;

template <class T>
void relocate_construct(T* source, std::size_t count, T* destination) {
  if (count == 0) return;
  if constexpr (relocates_by_memcpy<T>) {
    std::memcpy(static_cast<void*>(destination), static_cast<const void*>(source), count * sizeof(T));
  } else if constexpr (std::is_nothrow_move_constructible_v<T> || !std::is_copy_constructible_v<T>) {
    std::uninitialized_move_n(source, count, destination);
  } else {
    std::uninitialized_copy_n(source, count, destination);
  }
}
// Ends the lives of elements that were relocated away (nothing to do after a byte copy).
template <class T>
void end_relocated(T* first, std::size_t count) noexcept {
  if constexpr (!relocates_by_memcpy<T>) destroy_range(first, first + count);
  else (void)first, (void)count;
}
// relocate_construct() then end_relocated() of the sources.
template <class T>
void relocate(T* source, std::size_t count, T* destination) {
  relocate_construct(source, count, destination);
  end_relocated(source, count);
}

}  // namespace memkit::detail
