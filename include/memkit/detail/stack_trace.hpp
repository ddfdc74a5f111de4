// Internal: cheap stack capture and symbolized printing, shared by general_allocator's debug mode
// and tracking_allocator. Not part of the public API.
//
// capture_stack_trace() walks the stack with the platform unwinder (_Unwind_Backtrace, which uses
// the same unwind tables as C++ exceptions, so it works without frame pointers) and stores return
// addresses only; symbolizing is deferred to report time (src/symbolizer.cpp). With elfutils'
// libdw installed (libdw.so.1, opened with dlopen at the first symbolization, never linked), a
// frame gets its function from the symbol tables (.symtab and .dynsym, so static functions and
// executables built without -rdynamic are named), demangled, and its file:line from the DWARF line
// tables, including separate debug files under /usr/lib/debug. Without libdw, dladdr names
// exported symbols only. Capturing never calls malloc; symbolizing may, and every allocation it
// makes (libdw's included) is flagged by symbolizing_on_this_thread() so that an allocator in debug
// mode serves it without records or checks instead of recursing into them.
#pragma once

#include <cstddef>

namespace memkit::detail {

// Stores up to `max_frames` return addresses of the calling thread's stack in `frames`, after
// skipping the `skip` innermost frames (capture_stack_trace's own frame is never included). In
// the drop-in library it skips every innermost frame inside the library's own code instead.
// Returns how many were stored. Re-entrant calls (from an allocation made by the unwinder itself)
// return 0.
std::size_t capture_stack_trace(void** frames, std::size_t max_frames, std::size_t skip) noexcept;

// Names where the current operation entered the library: the return address of the call into its
// public entry point (MEMKIT_CALLER_ADDRESS() there), on this thread. The captures that follow
// start at that frame when they find it among the first frames, instead of after a fixed count of
// them, which tail calls and inlining change from build to build (an optimized build tail-calls
// from general_allocator::free into debug mode, and the count then dropped the user's own frame).
// The drop-in library drops its frames by address and needs none of this.
void set_capture_origin(const void* return_address) noexcept;

// Writes one line per frame to `fd`:
//   "    #i 0xADDR function+0xOFF at file:line (object+0xOFF)"
// where the function, " at file:line" and the object are left out when unknown. Must not be called
// while holding a lock that malloc takes (it may allocate on first use of a module).
void print_stack_trace(int fd, void* const* frames, std::size_t count) noexcept;
// The same lines, handed to `sink(context, text, length)` a few at a time (a report's own buffer).
using text_sink = void (*)(void* context, const char* text, std::size_t length) noexcept;
void print_stack_trace(text_sink sink, void* context, void* const* frames, std::size_t count) noexcept;

// What is known about one captured frame. The strings stay valid for the life of the process.
struct resolved_frame {
  const void* address = nullptr;     // the return address, as captured
  const char* function = nullptr;    // demangled function name, or null
  std::size_t function_offset = 0;   // address - the function's start (meaningful with function)
  const char* file = nullptr;        // source file of the call, as the debug info names it, or null
  unsigned line = 0;                 // its line, 0 when unknown
  const char* object = nullptr;      // path of the executable or shared object, or null
  std::size_t object_offset = 0;     // address - the object's load bias: what addr2line -e takes
};

// Symbolizes one return address (a call's site is looked up at address - 1). Returns false, with
// only `address` set, when no loaded object contains it. Thread-safe; results are cached per
// address and libdw caches per module, so repeated frames cost a hash lookup.
bool resolve_stack_frame(const void* address, resolved_frame& out) noexcept;

// True while this thread is inside the symbolizer: allocators in debug mode serve its allocations
// (libdw's own included) as plain ones, neither recorded nor checked, so that a report can
// symbolize from inside malloc's callers without recursing into debug mode.
bool symbolizing_on_this_thread() noexcept;

// Test hook: the library the symbolizer opens instead of "libdw.so.1" (null: back to it). A name
// that does not load makes the next symbolization take the dladdr fallback, exactly as on a system
// without libdw. Setting MEMKIT_SYMBOLIZER=dladdr in the environment does the same for a program.
void set_symbolizer_library_for_testing(const char* soname) noexcept;

// True when frames are symbolized with libdw (after trying to load it if not tried yet).
bool symbolizer_uses_libdw() noexcept;

}  // namespace memkit::detail
