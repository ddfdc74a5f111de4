// Internal: cheap stack capture and malloc-free printing, shared by general_allocator's debug mode
// and tracking_allocator. Not part of the public API.
//
// capture_stack_trace() walks the stack with the platform unwinder (_Unwind_Backtrace, which uses
// the same unwind tables as C++ exceptions, so it works without frame pointers) and stores return
// addresses only; symbolizing is deferred to print_stack_trace(), which uses dladdr (exported
// symbols only; build with -rdynamic for the symbols of an executable). Neither calls malloc, so
// both are usable inside an allocator.
#pragma once

#include <cstddef>

namespace memkit::detail {

// Stores up to `max_frames` return addresses of the calling thread's stack in `frames`, after
// skipping the `skip` innermost frames (capture_stack_trace's own frame is never included). In
// the drop-in library it skips every innermost frame inside the library's own code instead.
// Returns how many were stored. Re-entrant calls (from an allocation made by the unwinder itself)
// return 0.
std::size_t capture_stack_trace(void** frames, std::size_t max_frames, std::size_t skip) noexcept;

// Writes one line per frame to `fd`: "    #i 0xADDR symbol+0xOFF (object)". No malloc.
void print_stack_trace(int fd, void* const* frames, std::size_t count) noexcept;

}  // namespace memkit::detail
