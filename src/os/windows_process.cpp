// The os layer's view of the process's own address space on Windows (src/os/process.hpp): its
// regions, copies that do not fault, residency and the number of threads, as debug mode's leak
// scan needs them.
#include "windows_api.hpp"  // first: the headers below need it
#include <tlhelp32.h>

#include <cstdint>

#include "memkit/os.hpp"
#include "process.hpp"

namespace memkit::os::process {
namespace {

bool readable_protection(DWORD protect) noexcept {
  if ((protect & (PAGE_GUARD | PAGE_NOACCESS)) != 0) return false;
  return (protect & (PAGE_READONLY | PAGE_READWRITE | PAGE_WRITECOPY | PAGE_EXECUTE_READ | PAGE_EXECUTE_READWRITE |
                     PAGE_EXECUTE_WRITECOPY)) != 0;
}

bool writable_protection(DWORD protect) noexcept {
  return (protect & (PAGE_READWRITE | PAGE_WRITECOPY | PAGE_EXECUTE_READWRITE | PAGE_EXECUTE_WRITECOPY)) != 0;
}

}  // namespace

// VirtualQuery from the bottom of the address space up: one region per run of committed pages
// with the same protection. Private memory (heaps, stacks, VirtualAlloc) and the copy-on-write
// data of loaded images count as private; mapped files (MEM_MAPPED) as shared. Regions come one
// query at a time, so the walk is no snapshot: a region freed meanwhile is reported as it was,
// and read_memory() copes with it.
status for_each_region(region_visitor visit, void* context) noexcept {
  SYSTEM_INFO info;
  ::GetSystemInfo(&info);
  auto at = reinterpret_cast<std::uintptr_t>(info.lpMinimumApplicationAddress);
  const auto top = reinterpret_cast<std::uintptr_t>(info.lpMaximumApplicationAddress);
  bool any = false;
  while (at < top) {
    MEMORY_BASIC_INFORMATION m;
    if (::VirtualQuery(reinterpret_cast<const void*>(at), &m, sizeof m) == 0) {
      if (!any) return status::failure(static_cast<int>(::GetLastError()));
      break;
    }
    any = true;
    const auto begin = reinterpret_cast<std::uintptr_t>(m.BaseAddress);
    const std::uintptr_t end = begin + m.RegionSize;
    if (end <= at) break;
    if (m.State == MEM_COMMIT) {
      const bool writable = writable_protection(m.Protect);
      region r{begin, end, readable_protection(m.Protect), writable,
               m.Type == MEM_PRIVATE || (m.Type == MEM_IMAGE && writable), ""};
      if (!visit(r, context)) break;
    }
    at = end;
  }
  return {};
}

std::size_t protection_granularity() noexcept { return page_size(); }

// The committed, readable bytes from `address` on, at most `bytes`: one VirtualQuery per run of
// pages in the same state (a guard page, PAGE_GUARD, does not count as readable).
result<std::size_t> readable_prefix(const void* address, std::size_t bytes) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  std::uintptr_t at = begin;
  while (at - begin < bytes) {
    MEMORY_BASIC_INFORMATION m;
    if (::VirtualQuery(reinterpret_cast<const void*>(at), &m, sizeof m) == 0) break;
    if (m.State != MEM_COMMIT || !readable_protection(m.Protect)) break;
    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(m.BaseAddress) + m.RegionSize;
    if (end <= at) break;
    at = end;
  }
  return at - begin < bytes ? static_cast<std::size_t>(at - begin) : bytes;
}

// ReadProcessMemory on the current process: the system copies, so a page freed or protected
// meanwhile ends the copy (a partial copy reports how far it got) instead of faulting. The copy is
// first limited to the pages VirtualQuery calls committed and readable: Wine's ReadProcessMemory
// reads the process's memory through the host kernel, which ignores page protection, and would
// hand back a decommitted or reserved page (as zeros) instead of stopping there.
result<std::size_t> read_memory(const void* address, void* buffer, std::size_t bytes) noexcept {
  bytes = readable_prefix(address, bytes).value();
  if (bytes == 0) return std::size_t{0};
  SIZE_T got = 0;
  if (::ReadProcessMemory(::GetCurrentProcess(), address, buffer, bytes, &got) != 0) return std::size_t{got};
  const DWORD error = ::GetLastError();
  if (error == ERROR_PARTIAL_COPY || error == ERROR_NOACCESS) return std::size_t{got};
  return result<std::size_t>::failure(static_cast<int>(error));
}

// The threads of a Toolhelp snapshot that belong to this process.
result<std::size_t> thread_count() noexcept {
  const HANDLE snapshot = ::CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0);
  if (snapshot == INVALID_HANDLE_VALUE) return result<std::size_t>::failure(static_cast<int>(::GetLastError()));
  const DWORD self = ::GetCurrentProcessId();
  THREADENTRY32 entry;
  entry.dwSize = sizeof entry;
  std::size_t threads = 0;
  for (BOOL more = ::Thread32First(snapshot, &entry); more != 0; more = ::Thread32Next(snapshot, &entry)) {
    if (entry.th32OwnerProcessID == self) ++threads;
    entry.dwSize = sizeof entry;
  }
  ::CloseHandle(snapshot);
  if (threads == 0) return result<std::size_t>::failure(ERROR_INVALID_DATA);
  return threads;
}

// Not here yet: SuspendThread and GetThreadContext would stop the threads, but a Toolhelp snapshot
// taken while one is suspended may wait for the heap lock it holds. The leak scan then reads the
// other threads' stacks whole, and copies.
status stopped_threads::stop() noexcept { return status::failure(ERROR_NOT_SUPPORTED); }
void stopped_threads::resume() noexcept {}
std::size_t stopped_threads::count() const noexcept { return 0; }
stopped_threads::thread stopped_threads::at(std::size_t) const noexcept { return {}; }
std::uintptr_t stopped_threads::storage_begin() const noexcept { return 0; }
std::uintptr_t stopped_threads::storage_end() const noexcept { return 0; }

// Committed pages may hold data (Windows has no cheap residency query short of the working set
// API): one VirtualQuery per run of pages in the same state.
status resident_pages(const void* address, std::size_t bytes, unsigned char* resident) noexcept {
  const std::size_t page = page_size();
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t end = begin + bytes;
  std::uintptr_t at = begin;
  while (at < end) {
    MEMORY_BASIC_INFORMATION m;
    if (::VirtualQuery(reinterpret_cast<const void*>(at), &m, sizeof m) == 0) {
      return status::failure(static_cast<int>(::GetLastError()));
    }
    std::uintptr_t run_end = reinterpret_cast<std::uintptr_t>(m.BaseAddress) + m.RegionSize;
    if (run_end > end) run_end = end;
    if (run_end <= at) return status::failure(ERROR_INVALID_PARAMETER);
    const unsigned char value = m.State == MEM_COMMIT ? 1 : 0;
    for (std::uintptr_t p = at; p < run_end; p += page) resident[(p - begin) / page] = value;
    at = run_end;
  }
  return {};
}

status mapped(const void* address, std::size_t bytes) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t end = begin + bytes;
  for (std::uintptr_t at = begin; at < end;) {
    MEMORY_BASIC_INFORMATION m;
    if (::VirtualQuery(reinterpret_cast<const void*>(at), &m, sizeof m) == 0) {
      return status::failure(static_cast<int>(::GetLastError()));
    }
    if (m.State == MEM_FREE) return status::failure(ERROR_NOT_ENOUGH_MEMORY);
    const std::uintptr_t run_end = reinterpret_cast<std::uintptr_t>(m.BaseAddress) + m.RegionSize;
    if (run_end <= at) return status::failure(ERROR_INVALID_PARAMETER);
    at = run_end;
  }
  return {};
}

}  // namespace memkit::os::process
