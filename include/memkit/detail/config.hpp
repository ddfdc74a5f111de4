// Internal configuration shared by every memkit header: the contract macro, branch hints and
// sanitizer hooks. Not part of the public API; include the component headers instead.
#pragma once

#include <cstddef>

// MEMKIT_ASSERTIONS: 1 turns contracts on. Defaults to on unless NDEBUG is defined, so a debug
// build of a user's program checks memkit's preconditions and a release build pays nothing.
#ifndef MEMKIT_ASSERTIONS
#ifdef NDEBUG
#define MEMKIT_ASSERTIONS 0
#else
#define MEMKIT_ASSERTIONS 1
#endif
#endif

// MEMKIT_WINDOWS: 1 when compiling for Windows, else 0. memkit's sources never test it (src/os/
// has one file per platform); tests use it to leave out what needs POSIX processes (fork, rlimits,
// /proc, pipes), each case with its reason.
#if defined(_WIN32)
#define MEMKIT_WINDOWS 1
#else
#define MEMKIT_WINDOWS 0
#endif

// Branch hints, where the compiler has them (GCC, Clang, and compilers that present themselves as
// GCC); plain conditions elsewhere.
#if defined(__GNUC__) || defined(__clang__)
#define MEMKIT_LIKELY(x) __builtin_expect(!!(x), 1)
#define MEMKIT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define MEMKIT_LIKELY(x) (!!(x))
#define MEMKIT_UNLIKELY(x) (!!(x))
#endif

// MEMKIT_NOINLINE keeps a slow path out of its callers; MEMKIT_PREFETCH(p) asks for the cache line
// at p ahead of a read. Both are hints and vanish where the compiler has no such builtin.
#if defined(__GNUC__) || defined(__clang__)
#define MEMKIT_NOINLINE __attribute__((noinline))
#define MEMKIT_PREFETCH(p) __builtin_prefetch(p)
#else
#define MEMKIT_NOINLINE
#define MEMKIT_PREFETCH(p) static_cast<void>(p)
#endif

// MEMKIT_CALLER_ADDRESS(): the return address of the current function's call, its caller's call
// site (null where the compiler cannot tell). Debug mode's traces start there.
#if defined(__GNUC__) || defined(__clang__)
#define MEMKIT_CALLER_ADDRESS() __builtin_return_address(0)
#else
#define MEMKIT_CALLER_ADDRESS() static_cast<void*>(nullptr)
#endif

// MEMKIT_IN_REGISTER(x): from here on the compiler knows nothing of the variable x but that it
// sits in a register, so it uses that register instead of computing x again from its sources. A
// hint for hot paths, where GCC would otherwise spend an instruction; nothing elsewhere.
#if defined(__GNUC__) || defined(__clang__)
#define MEMKIT_IN_REGISTER(x) __asm__("" : "+r"(x))
#else
#define MEMKIT_IN_REGISTER(x) static_cast<void>(0)
#endif

// The caller's file, function, line and column when used as default arguments; see
// memkit::source_location.
#define MEMKIT_CALLER_FILE() __builtin_FILE()
#define MEMKIT_CALLER_FUNCTION() __builtin_FUNCTION()
#define MEMKIT_CALLER_LINE() __builtin_LINE()
#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define MEMKIT_CALLER_COLUMN() __builtin_COLUMN()
#endif
#endif
#ifndef MEMKIT_CALLER_COLUMN
#define MEMKIT_CALLER_COLUMN() 0
#endif

namespace memkit::detail {
// Prints "memkit: contract violated: <message> (<condition>) at file:line" to stderr and aborts.
[[noreturn]] void contract_violation(const char* condition, const char* message, const char* file,
                                     int line) noexcept;
}  // namespace memkit::detail

// MEMKIT_ASSERT(cond, "message"): a precondition or invariant; checked only when assertions are on.
#if MEMKIT_ASSERTIONS
#define MEMKIT_ASSERT(cond, message)                                                       \
  (MEMKIT_LIKELY(cond) ? static_cast<void>(0)                                              \
                       : ::memkit::detail::contract_violation(#cond, message, __FILE__, __LINE__))
#else
#define MEMKIT_ASSERT(cond, message) static_cast<void>(0)
#endif

// MEMKIT_CHECK(cond, "message"): always on. Reserved for violations that would otherwise corrupt
// memory silently (a free of a pointer the allocator does not own, say).
#define MEMKIT_CHECK(cond, message)                                                        \
  (MEMKIT_LIKELY(cond) ? static_cast<void>(0)                                              \
                       : ::memkit::detail::contract_violation(#cond, message, __FILE__, __LINE__))

// AddressSanitizer manual poisoning, so that memory an arena or heap holds but has not handed out
// is reported when touched. No-ops without ASan.
#if defined(__SANITIZE_ADDRESS__)
#define MEMKIT_HAS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MEMKIT_HAS_ASAN 1
#endif
#endif
#ifndef MEMKIT_HAS_ASAN
#define MEMKIT_HAS_ASAN 0
#endif

// ThreadSanitizer: it cannot see into inline asm nor follow a task cloned outside its knowledge,
// and runs a thread of its own; the code and tests that depend on either ask this.
#if defined(__SANITIZE_THREAD__)
#define MEMKIT_HAS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MEMKIT_HAS_TSAN 1
#endif
#endif
#ifndef MEMKIT_HAS_TSAN
#define MEMKIT_HAS_TSAN 0
#endif

#if MEMKIT_HAS_ASAN
extern "C" void __asan_poison_memory_region(void const volatile* addr, std::size_t size);
extern "C" void __asan_unpoison_memory_region(void const volatile* addr, std::size_t size);
#define MEMKIT_POISON(addr, size) __asan_poison_memory_region((addr), (size))
#define MEMKIT_UNPOISON(addr, size) __asan_unpoison_memory_region((addr), (size))
#else
#define MEMKIT_POISON(addr, size) static_cast<void>(0)
#define MEMKIT_UNPOISON(addr, size) static_cast<void>(0)
#endif

namespace memkit::detail {
// True when x is a non-zero power of two.
constexpr bool is_power_of_two(std::size_t x) noexcept { return x != 0 && (x & (x - 1)) == 0; }
// Rounds x up to a multiple of the power of two `alignment`; the caller rules out overflow.
constexpr std::size_t align_up(std::size_t x, std::size_t alignment) noexcept {
  return (x + alignment - 1) & ~(alignment - 1);
}
// Rounds x down to a multiple of the power of two `alignment`.
constexpr std::size_t align_down(std::size_t x, std::size_t alignment) noexcept {
  return x & ~(alignment - 1);
}
}  // namespace memkit::detail
