// Internal to the drop-in malloc (src/malloc/): the process-wide allocator behind every entry
// point, started on the first call. Not installed; the public surface is the C and C++
// allocation functions themselves.
//
// The first malloc of a process can come from anywhere: the dynamic loader, libc's or libstdc++'s
// start-up, another library's constructor, long before main and before this library's own
// constructors ran. So nothing here relies on static initialization: heap() checks one flag (a
// plain load on x86-64) and, the first time, reads the environment and configures the allocator
// before anything is handed out. malloc's and operator new's small fast paths skip even that
// flag: until a thread has a heap its direct entries are empty (src/general_allocator/
// internal.hpp, direct_heap), so its first small allocation takes the miss path, which checks it.
// (A program linking the static form that allocates through general_allocator::global() before
// its first malloc has a heap already: its small mallocs of the classes that API left with free
// blocks are served before the environment is read, which then happens at the first miss.)
#pragma once

#include <atomic>
#include <cerrno>

#include "memkit/detail/config.hpp"
#include "memkit/general_allocator.hpp"

namespace memkit::malloc_runtime {

// general_allocator::global() once it is configured from the environment; null before. Kept here
// so that the other entry points' check is one load instead of a call into global().
extern std::atomic<general_allocator*> started;

// Reads MEMKIT_DEBUG and friends, configures the allocator, registers the fork handlers, and
// returns the allocator. Safe to call from several threads at once (one starts, the others wait)
// and re-entrantly (an allocation made while starting is served by the not-yet-configured
// allocator).
general_allocator& start() noexcept;

// The value of the environment variable `name`, or null when unset or when the process is
// privileged (setuid or setgid: the kernel's AT_SECURE). A privileged program must not let the
// user who started it choose where reports are written (MEMKIT_REPORT_FILE would create files as
// the program's owner), so it ignores every MEMKIT_* variable, as mimalloc does.
const char* environment_value(const char* name, bool privileged) noexcept;

// The allocator every entry point uses.
inline general_allocator& heap() noexcept {
  general_allocator* allocator = started.load(std::memory_order_acquire);
  if (MEMKIT_UNLIKELY(allocator == nullptr)) return start();
  return *allocator;
}

// errno of this thread. glibc reaches it through a call (__errno_location); the address never
// changes for a thread, so it is kept in an initial-exec thread_local after the first use.
inline int& error_number() noexcept {
  static thread_local int* address = nullptr;
  int* known = address;
  if (MEMKIT_UNLIKELY(known == nullptr)) known = address = &errno;
  return *known;
}

}  // namespace memkit::malloc_runtime
