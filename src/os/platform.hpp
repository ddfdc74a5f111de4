// Internal: the operating system and C runtime services memkit's allocators need besides memory
// (include/memkit/os.hpp has those): per-thread values with a callback at thread exit, yielding,
// a monotonic clock, writing to a file descriptor, the environment, fork hooks, a snapshot of the
// calling thread's registers, and the few instructions a compiler offers only as builtins.
//
// Implemented at the end of src/os/posix.cpp and src/os/windows.cpp; nothing outside src/os/ (and
// include/memkit/detail/config.hpp) names a platform header or tests a platform macro. Every
// function here is safe to call from inside an allocator: none allocates through malloc.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "memkit/detail/config.hpp"
#include "memkit/os.hpp"

#if !defined(_WIN32)
#include <ucontext.h>
#endif

namespace memkit::os {

// ---- threads ------------------------------------------------------------------------------------

// A per-thread slot whose non-null value is handed to a callback when its thread exits (a pthread
// key on POSIX, a fiber-local storage index on Windows). Constant-initializable, so a key can live
// in a constinit object; `created` says whether thread_key_create succeeded.
struct thread_key {
  std::uintptr_t handle = 0;
  bool created = false;
};

// Called at the exit of each thread whose slot holds a non-null value, with that value.
using thread_exit_callback = void (*)(void* value);

// Creates a key; on failure `key.created` stays false and the error number comes back.
status thread_key_create(thread_key& key, thread_exit_callback on_exit) noexcept;
// Deletes a created key (no callback runs for it afterwards).
void thread_key_delete(thread_key& key) noexcept;
// The calling thread's value of a created key (null until set).
void* thread_key_get(const thread_key& key) noexcept;
// Sets the calling thread's value of a created key. May allocate on some systems (glibc beyond
// its first 32 keys); callers must tolerate re-entry.
status thread_key_set(const thread_key& key, void* value) noexcept;

// The thread pointer, where one instruction reads it (x86-64 Linux: %fs:0, the address of the
// thread's control block): a value unique to each live thread, for allocators' owner tests. Where
// has_thread_pointer is false, thread_pointer() is 0 and callers use a value of their own.
#if defined(__x86_64__) && defined(__linux__)
inline constexpr bool has_thread_pointer = true;
inline std::uintptr_t thread_pointer() noexcept {
  std::uintptr_t self;
  __asm__("mov %%fs:0, %0" : "=r"(self));
  return self;
}
// id == thread_pointer(), as one compare with the thread pointer in memory.
inline bool is_thread_pointer(std::uintptr_t id) noexcept {
  bool equal;
  __asm__("cmp %%fs:0, %1" : "=@ccz"(equal) : "r"(id) : "cc");
  return equal;
}
#else
inline constexpr bool has_thread_pointer = false;
inline std::uintptr_t thread_pointer() noexcept { return 0; }
inline bool is_thread_pointer(std::uintptr_t id) noexcept { return id == 0; }
#endif

// Gives the rest of the calling thread's time slice to another thread (spin locks' back-off).
void yield_thread() noexcept;

// Registers fork handlers (pthread_atfork): `prepare` runs in the parent before a fork, the other
// two after it in the parent and the child. ENOTSUP (ERROR_NOT_SUPPORTED) where there is no fork.
status at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept;

// ---- time ---------------------------------------------------------------------------------------

// Milliseconds of a coarse monotonic clock: a few nanoseconds to read, a few milliseconds of
// resolution. For delays (purging), never for measurements.
std::uint64_t monotonic_ms() noexcept;

// Nanoseconds of CPU time (user and kernel) the calling thread has used so far, for a report that
// says what it cost; 0 when the platform cannot tell. Linux counts in nanoseconds, Windows in the
// scheduler's ticks (about 16 ms).
std::uint64_t thread_cpu_ns() noexcept;

// ---- output -------------------------------------------------------------------------------------

// The descriptor of the process's error stream (2 on POSIX; the C runtime's stderr on Windows).
inline constexpr int error_stream = 2;

// Writes all `length` bytes to the file descriptor `fd`, retrying short writes and interruptions.
// No buffering and no allocation: usable from inside an allocator and from a report that runs
// while memory is corrupt.
status output(int fd, const char* text, std::size_t length) noexcept;

// Opens `path` for appending (created with mode 0644 when missing), close-on-exec, at a
// descriptor of at least `lowest` where the process may have one that high (else the lowest free).
result<int> open_for_append(const char* path, int lowest) noexcept;

// A private, close-on-exec copy of the error stream at a descriptor of at least `lowest` (so it
// stays out of the program's way and survives the program closing its own stderr).
result<int> duplicate_error_stream(int lowest) noexcept;

// Where memkit keeps the descriptors it holds for the life of the process (a copy of stderr, the
// report file, libunwind's pipe): far above those a program opens.
inline constexpr int high_descriptors = 500;

// Runs `body(context)` with every free descriptor below `lowest` taken, so that the descriptors it
// opens and keeps (libunwind's pipe, opened on its first walk) lie at `lowest` or above, where they
// do not change which descriptors the program gets or finds open. Where the process may not have
// that many, as many as it may, less a few; elsewhere (no such numbering) it just runs `body`.
void with_low_descriptors_taken(int lowest, void (*body)(void*), void* context) noexcept;

// Reads up to `capacity` bytes of the file at `path` into `buffer`; returns how many were read.
result<std::size_t> read_file(const char* path, char* buffer, std::size_t capacity) noexcept;

// Closes a descriptor opened by this layer.
void close_descriptor(int fd) noexcept;

// Makes descriptor `to` refer to what `from` refers to (close-on-exec), then closes `from`: a file
// swapped in under a number others already hold.
status move_descriptor(int from, int to) noexcept;

// ---- environment --------------------------------------------------------------------------------

// The calling process's id.
std::uint64_t process_id() noexcept;

// Ends the process at once with `status`, as _exit does: no exit handlers, no destructors, no
// flushing. The C library's own _exit (the next definition after the caller's module on ELF
// systems, so that a drop-in that defines _exit itself reaches the real one), or the system call.
[[noreturn]] void end_process(int status) noexcept;

// True when the process runs with privileges its user does not have (setuid or setgid: the
// kernel's AT_SECURE on Linux, issetugid elsewhere). Such a process must not let the user choose
// where it writes files, so it ignores memkit's environment variables.
bool process_is_privileged() noexcept;

// The value of the environment variable `name`, or null when it is unset or the process is
// privileged (see process_is_privileged). Allocates nothing. On Windows the value is copied into a
// per-thread buffer that the next call on the same thread overwrites.
const char* environment_variable(const char* name) noexcept;

// ---- registers ----------------------------------------------------------------------------------

// Bytes a caller reserves just above a callee's return address for the callee to spill its
// register arguments in (the Windows x64 "home space"). A callee with fewer than four arguments
// leaves some of it unwritten, so it still holds what earlier calls at that depth left there: a
// conservative scan of the caller's stack starts above it. Other ABIs have none.
#if defined(_WIN32) && defined(__x86_64__)
inline constexpr std::size_t caller_argument_home_bytes = 32;
#else
inline constexpr std::size_t caller_argument_home_bytes = 0;
#endif

// The lowest address of the calling function's caller's frame that a conservative scan of the
// stack should cover: above the calling function's saved frame pointer, its return address and
// the home space above them. A macro, so that the frame is the calling function's own.
#define MEMKIT_OS_CALLER_STACK_START()                                                     \
  (reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0)) + 2 * sizeof(void*) + \
   ::memkit::os::caller_argument_home_bytes)

// Calls fn(object, argument, result, stack_start, saved) after storing the callee-saved registers
// on the stack, in a frame above fn's: `saved` points at them (callee_saved_bytes; null where this
// is not implemented). They hold the calling function's caller's values as long as the calling
// function made this call its last and reused none of them before it (a forwarding function,
// compiled to a tail call). A conservative scan made from fn then sees the pointers that the
// caller keeps only in those registers, which fn's prologue may save in fn's own frame, below
// stack_start, before a register snapshot taken in fn could see them.
using callee_saved_function = std::size_t (*)(const void* object, std::uintptr_t argument, void* result,
                                              std::uintptr_t stack_start, const void* saved) noexcept;
extern "C" std::size_t memkit_os_call_with_callee_saved(callee_saved_function fn, const void* object,
                                                         std::uintptr_t argument, void* result,
                                                         std::uintptr_t stack_start) noexcept;
inline constexpr auto& call_with_callee_saved = memkit_os_call_with_callee_saved;
// For a function that only forwards to call_with_callee_saved: no sanitizer hooks, whose calls
// (ThreadSanitizer's at entry and exit) would make it keep its arguments in callee-saved
// registers, reusing the ones it must pass on untouched.
#if defined(__has_attribute)
#if __has_attribute(disable_sanitizer_instrumentation)
#define MEMKIT_OS_FORWARDS_CALLEE_SAVED __attribute__((disable_sanitizer_instrumentation))
#endif
#endif
#ifndef MEMKIT_OS_FORWARDS_CALLEE_SAVED
#define MEMKIT_OS_FORWARDS_CALLEE_SAVED
#endif
#if defined(__linux__) && defined(__x86_64__)
inline constexpr std::size_t callee_saved_bytes = 6 * sizeof(void*);  // rbx, rbp, r12-r15
#else
inline constexpr std::size_t callee_saved_bytes = 0;
#endif

// The calling thread's registers, for a conservative scan that treats whatever they hold as
// possible pointers. Only the callee-saved registers matter: they can carry the caller's pointers.
#if defined(_WIN32)
struct register_snapshot {
  alignas(16) unsigned char bytes[1232];  // a CONTEXT
};
void capture_registers_out_of_line(register_snapshot& snapshot) noexcept;
#define MEMKIT_OS_CAPTURE_REGISTERS(snapshot) ::memkit::os::capture_registers_out_of_line(snapshot)
#else
struct register_snapshot {
  ucontext_t context;
};
// A macro, so that the registers are the caller's own, not those of a callee that may have saved
// them in its frame, below the range the caller scans. The argument registers are zeroed: they
// hold whatever the last calls left there, and only the callee-saved ones can carry the caller's
// pointers.
#if defined(__linux__) && defined(__x86_64__)
#define MEMKIT_OS_CLEAR_ARGUMENT_REGISTERS(snapshot)                                 \
  for (const int memkit_scratch_ : {REG_RDI, REG_RSI, REG_RDX, REG_RCX, REG_R8, REG_R9}) \
  (snapshot).context.uc_mcontext.gregs[memkit_scratch_] = 0
#else
#define MEMKIT_OS_CLEAR_ARGUMENT_REGISTERS(snapshot) static_cast<void>(snapshot)
#endif
#define MEMKIT_OS_CAPTURE_REGISTERS(snapshot)                                        \
  do {                                                                               \
    std::memset(&(snapshot), 0, sizeof(snapshot));                                   \
    ::getcontext(&(snapshot).context);                                               \
    MEMKIT_OS_CLEAR_ARGUMENT_REGISTERS(snapshot);                                    \
  } while (0)
#endif

// ---- instructions -------------------------------------------------------------------------------

// Adds `n` to a counter only the calling thread writes, which other threads may read (relaxed).
// On x86-64 one plain (not locked) add to memory: no other thread writes the counter, and an
// aligned store is atomic, so a concurrent reader sees the old or the new value, exactly as with
// a relaxed load and store, which compilers do not fuse into one instruction. Elsewhere, and under
// ThreadSanitizer (which cannot see into asm), the relaxed load and store.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !MEMKIT_HAS_TSAN
#define MEMKIT_OS_OWNER_ADD_ASM 1
#endif
template <class T>
inline void owner_add(std::atomic<T>& counter, T n) noexcept {
  static_assert(sizeof(std::atomic<T>) == sizeof(T) && std::atomic<T>::is_always_lock_free);
#ifdef MEMKIT_OS_OWNER_ADD_ASM
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  if constexpr (sizeof(T) == 8) {
    __asm__("addq %1, %0" : "+m"(*reinterpret_cast<T*>(&counter)) : "er"(n));
  } else {
    __asm__("addl %1, %0" : "+m"(*reinterpret_cast<T*>(&counter)) : "er"(n));
  }
#else
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
#endif
}

// Subtracts one from such a counter; true when it reached zero (the flags of the same instruction).
inline bool owner_decrement_is_zero(std::atomic<std::uint32_t>& counter) noexcept {
#ifdef MEMKIT_OS_OWNER_ADD_ASM
  bool zero;
  __asm__("subl $1, %0" : "+m"(*reinterpret_cast<std::uint32_t*>(&counter)), "=@ccz"(zero));
  return zero;
#else
  const std::uint32_t v = counter.load(std::memory_order_relaxed) - 1;
  counter.store(v, std::memory_order_relaxed);
  return v == 0;
#endif
}

// a * b into `product`; true when it overflowed (one multiply and a flag test where the compiler
// offers it).
inline bool multiply_overflows(std::size_t a, std::size_t b, std::size_t& product) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_mul_overflow(a, b, &product);
#else
  product = a * b;
  return a != 0 && product / a != b;
#endif
}

// a + b into `sum`; true when it overflowed.
inline bool add_overflows(std::size_t a, std::size_t b, std::size_t& sum) noexcept {
  sum = a + b;
  return sum < a;
}

}  // namespace memkit::os
