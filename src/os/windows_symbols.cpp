// The platform half of stack traces on Windows (see src/os/symbols.hpp).
//
// Capture: RtlCaptureStackBackTrace, which walks the stack with the unwind data of x64 code (every
// MinGW-w64 and MSVC function has it), so it works without frame pointers and never allocates.
//
// Symbols: the module holding an address (GetModuleHandleExW) names the object and the offset in
// it, which is what a symbolizer outside the process takes (addr2line -e memkit_test.exe 0xOFF on
// a MinGW build, whose debug information is DWARF inside the .exe). There is no in-process reader
// of debug information here (dbghelp reads PDB files, which MinGW does not write), so
// load_debug_info() is false and functions are not named: a report shows "(object+0xOFF)".
#include "windows_api.hpp"  // first: the headers below need it
#include <io.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "symbols.hpp"

namespace memkit::os::symbols {
namespace {

using detail::resolved_frame;

// The module (executable or DLL) holding `address`, or null.
HMODULE module_holding(const void* address) noexcept {
  HMODULE module = nullptr;
  if (!::GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                            static_cast<LPCWSTR>(address), &module)) {
    return nullptr;
  }
  return module;
}

// The size of a loaded module's image, from its PE header.
std::size_t image_size(HMODULE module) noexcept {
  const auto* base = reinterpret_cast<const unsigned char*>(module);
  const auto* dos = reinterpret_cast<const IMAGE_DOS_HEADER*>(base);
  if (dos->e_magic != IMAGE_DOS_SIGNATURE) return 0;
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS*>(base + dos->e_lfanew);
  if (nt->Signature != IMAGE_NT_SIGNATURE) return 0;
  return nt->OptionalHeader.SizeOfImage;
}

}  // namespace

std::size_t capture(void** frames, std::size_t max_frames) noexcept {
  // Skip 1: this function's own frame. The count is a DWORD, and older systems take fewer than 63.
  const DWORD wanted = static_cast<DWORD>(std::min<std::size_t>(max_frames, 62));
  return ::RtlCaptureStackBackTrace(1, wanted, frames, nullptr);
}

code_range own_code() noexcept {
  static const code_range range = [] {
    code_range found;
    if (HMODULE module = module_holding(reinterpret_cast<const void*>(&own_code))) {
      const auto base = reinterpret_cast<std::uintptr_t>(module);
      found = {base, base + image_size(module)};
    }
    return found;
  }();
  return range;
}

bool load_debug_info(const char*) noexcept { return false; }

bool resolve_with_debug_info(std::uintptr_t address, resolved_frame& out, const string_keeper& keeper) noexcept {
  return resolve_exported(address, out, &keeper);
}

bool resolve_exported(std::uintptr_t address, resolved_frame& out, const string_keeper* keeper) noexcept {
  HMODULE module = module_holding(reinterpret_cast<const void*>(address - 1));
  if (module == nullptr) return false;
  out.object_offset = address - reinterpret_cast<std::uintptr_t>(module);
  // Without a keeper (a re-entrant call) there is nowhere to put the name: the object is left out.
  if (keeper != nullptr) {
    char path[MAX_PATH];
    const DWORD length = ::GetModuleFileNameA(module, path, sizeof path);
    if (length != 0 && length < sizeof path) out.object = keeper->keep(path);
  }
  return true;
}

const void* default_definition(const char*, const char** object) noexcept {
  *object = nullptr;
  return nullptr;
}

// The exit path is not walked here: a report at exit reads the whole stack above its caller.
bool find_exit_path(exit_path& out) noexcept {
  out = exit_path{};
  return false;
}

bool may_be_in_signal_handler() noexcept { return false; }

bool on_fork_in_child(void (*)()) noexcept { return true; }

void write_all(int fd, const char* text, std::size_t length) noexcept {
  while (length != 0) {
    const unsigned piece = static_cast<unsigned>(std::min<std::size_t>(length, INT_MAX));
    const int written = ::_write(fd, text, piece);
    if (written <= 0) return;
    text += written;
    length -= static_cast<std::size_t>(written);
  }
}

}  // namespace memkit::os::symbols
