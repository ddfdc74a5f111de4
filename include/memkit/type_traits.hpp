// memkit::is_trivially_relocatable — which types may be moved to a new address with memcpy.
//
// A type is trivially relocatable when "move-construct at the new address, then destroy the old
// object" has exactly the same effect as copying its bytes and forgetting the old object. memkit
// containers use the trait to grow through allocator::reallocate() (realloc), which copies bytes,
// instead of moving element by element: that is what lets a vector of unique_ptr grow in place or
// through mremap.
//
// The trait is true for trivially copyable types that can be moved (not std::mutex or
// std::atomic, whose moves are deleted), std::unique_ptr (with a relocatable deleter),
// std::array and std::pair of relocatable types, and memkit::vector (specialized in vector.hpp).
// It is false for memkit::small_vector, whose data pointer can point into the object itself.
// (memkit::dyn_array only holds its reservation's address and could be marked true by its owner
// in dyn_array.hpp.)
// Specialize it for your own types when they hold no pointer to themselves and register their
// address nowhere:
//
//   template <> struct memkit::is_trivially_relocatable<my_string> : std::true_type {};
//
// A wrong `true` corrupts memory silently; when in doubt, leave it false (growth then moves
// elements one by one, which is always correct).
#pragma once

#include <array>
#include <memory>
#include <type_traits>
#include <utility>

namespace memkit {

// True when objects of T may be relocated with memcpy (see the header comment).
// The default: trivially copyable types that can also be moved trivially. (GCC and Clang call a
// type whose copy and move are deleted, like std::mutex or std::atomic<int>, trivially copyable;
// such a type forbids moving, so it is not relocatable.)
template <class T>
struct is_trivially_relocatable
    : std::bool_constant<std::is_trivially_copyable_v<T> && std::is_trivially_move_constructible_v<T> &&
                         std::is_trivially_destructible_v<T>> {};

// const and volatile do not change how an object's bytes may be moved.
template <class T>
struct is_trivially_relocatable<const T> : is_trivially_relocatable<T> {};
template <class T>
struct is_trivially_relocatable<volatile T> : is_trivially_relocatable<T> {};
template <class T>
struct is_trivially_relocatable<const volatile T> : is_trivially_relocatable<T> {};

// unique_ptr holds its pointer and deleter and nothing that refers to its own address.
template <class T, class Deleter>
struct is_trivially_relocatable<std::unique_ptr<T, Deleter>>
    : std::bool_constant<is_trivially_relocatable<Deleter>::value &&
                         is_trivially_relocatable<typename std::unique_ptr<T, Deleter>::pointer>::value> {};

// Aggregates of relocatable members are relocatable.
template <class T, std::size_t N>
struct is_trivially_relocatable<std::array<T, N>> : is_trivially_relocatable<T> {};
template <class First, class Second>
struct is_trivially_relocatable<std::pair<First, Second>>
    : std::bool_constant<is_trivially_relocatable<First>::value &&
                         is_trivially_relocatable<Second>::value> {};

// Shorthand for is_trivially_relocatable<T>::value.
template <class T>
inline constexpr bool is_trivially_relocatable_v = is_trivially_relocatable<T>::value;

}  // namespace memkit
