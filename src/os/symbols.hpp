// Internal: the platform half of stack traces (src/stack_trace.cpp) and their symbolization
// (src/symbolizer.cpp): walking the stack, finding the loaded module and symbol of an address,
// writing to a descriptor. One implementation per platform: src/os/posix_symbols.cpp (ELF: libunwind
// or the compiler's unwinder, dl_iterate_phdr, dladdr, libdw opened at run time) and
// src/os/windows_symbols.cpp (RtlCaptureStackBackTrace, the module list of the process).
#pragma once

#include <cstddef>
#include <cstdint>

#include "memkit/detail/stack_trace.hpp"

namespace memkit::os::symbols {

// Stores up to `max_frames` return addresses of the calling thread's stack in `frames`, innermost
// first, starting with the caller of capture(). Never calls malloc after its first use (the first
// may load the unwinder). Returns how many were stored.
std::size_t capture(void** frames, std::size_t max_frames) noexcept;

// An address range [begin, end).
struct code_range {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool contains(const void* address) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    return a >= begin && a < end;
  }
};

// The executable code of the module (executable or shared library) that holds memkit itself.
code_range own_code() noexcept;

// How the symbolizer keeps what it finds: `keep` copies a string into storage that lives as long
// as the process, `demangle` does the same with a symbol name, demangled. Both return null when
// out of memory.
struct string_keeper {
  const char* (*keep)(const char* text) noexcept;
  const char* (*demangle)(const char* name) noexcept;
};

// Loads the debug-information reader (libdw on ELF systems; `library` overrides its name for
// tests, null for the default). False where there is none; then only resolve_exported() works.
// Called with the symbolizer's lock held, like the two functions below.
bool load_debug_info(const char* library) noexcept;

// Names the function, file and line and the object of a return address `address` (the call is at
// address - 1) from the debug information; false when no loaded module holds it.
bool resolve_with_debug_info(std::uintptr_t address, detail::resolved_frame& out, const string_keeper& keeper) noexcept;

// Names the object, and the function when it is exported, of a return address, without debug
// information and without locks. With `keeper` the strings are copied; without (a re-entrant call,
// where the symbolizer's storage is in use) they point into the system's own tables.
bool resolve_exported(std::uintptr_t address, detail::resolved_frame& out, const string_keeper* keeper) noexcept;

// Where the process's default lookup finds the function `name` (what a call from the executable
// reaches): the address of its definition, and in `object` the path of the module that defines it;
// null when there is none or the lookup gives a stub that stands for it (a non-PIE executable's
// canonical PLT entry). Where modules do not interpose each other's symbols (Windows), null.
const void* default_definition(const char* name, const char** object) noexcept;

// The calling thread's frames below exit() (or quick_exit()), when it runs what exit() calls (an
// atexit handler, a destructor). `frames`: the stack ranges of the C library's and the dynamic loader's frames among
// them (exit's own, its handler loop, the loader's destructor loop), which hold nothing of the
// program's, only stale words of the frames the program left (main's callees' among them, once
// main has returned). `caller_registers`: the callee-saved registers of exit()'s caller at its call,
// which those frames may have saved and reused. The other frames (handlers, destructors) are not
// listed: they belong to the program. Below _exit() or _Exit() (a definition of them that reports
// before it ends the process), every frame from the caller's up to theirs is listed. False, with
// nothing listed, where none of them is on the stack, the frames cannot be walked or named, or this
// platform does not say which registers the caller keeps.
struct exit_path {
  static constexpr std::size_t max_frames = 32;
  code_range frames[max_frames];
  std::size_t frame_count = 0;
  std::uintptr_t caller_registers[12] = {};
  std::size_t register_count = 0;
};
bool find_exit_path(exit_path& out) noexcept;

// False when the calling thread surely does not run in a signal handler: its stack, walked to the
// C library's first frames of a thread (where the walk cannot reach them, code without unwind
// tables is on the stack and may hide a handler), holds no signal frame. In a handler, what the
// signal interrupted may be anything, the allocator or the dynamic loader holding a lock
// included. Where this cannot be told at all, false.
bool may_be_in_signal_handler() noexcept;

// Runs `handler` in the child after a fork() (POSIX), once per process; false when it cannot be
// installed. Where processes do not fork, does nothing and returns true.
bool on_fork_in_child(void (*handler)()) noexcept;

// Writes all of [text, text + length) to the descriptor `fd` (2: the standard error), retrying
// short writes; gives up silently on an error.
void write_all(int fd, const char* text, std::size_t length) noexcept;

}  // namespace memkit::os::symbols
