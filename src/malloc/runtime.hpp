// Internal to the drop-in malloc (src/malloc/): the process-wide allocator behind every entry
// point, started on the first call. Not installed; the public surface is the C and C++
// allocation functions themselves.
//
// The first malloc of a process can come from anywhere: the dynamic loader, libc's or libstdc++'s
// start-up, another library's constructor, long before main and before this library's own
// constructors ran. So nothing here relies on static initialization: heap() checks one flag (a
// plain load on x86-64) and, the first time, reads the environment and configures the allocator
// before anything is handed out.
#pragma once

#include <atomic>

#include "memkit/detail/config.hpp"
#include "memkit/general_allocator.hpp"

namespace memkit::malloc_runtime {

// True once the allocator is configured from the environment.
extern std::atomic<bool> ready;

// Reads MEMKIT_DEBUG and friends, configures the allocator, registers the fork handlers. Safe to
// call from several threads at once (one starts, the others wait) and re-entrantly (an allocation
// made while starting is served by the not-yet-configured allocator).
void start() noexcept;

// The allocator every entry point uses.
inline general_allocator& heap() noexcept {
  if (MEMKIT_UNLIKELY(!ready.load(std::memory_order_acquire))) start();
  return general_allocator::global();
}

}  // namespace memkit::malloc_runtime
