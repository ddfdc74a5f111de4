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

bool executable_protection(DWORD protect) noexcept {
  return (protect & (PAGE_EXECUTE | PAGE_EXECUTE_READ | PAGE_EXECUTE_READWRITE | PAGE_EXECUTE_WRITECOPY)) != 0;
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
      region r{begin, end, readable_protection(m.Protect), writable, executable_protection(m.Protect),
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

// ---- stopped_threads: SuspendThread and GetThreadContext --------------------------------------
//
// Each thread of a Toolhelp snapshot but the caller is suspended, and its context read (which
// also waits until the suspension took effect: SuspendThread only asks for it); snapshots are taken
// again until one lists no thread not suspended yet (one running may have started another).
// resume() resumes them in the same order. Nothing here takes a lock a suspended thread could hold:
// Toolhelp maps its snapshot's memory from the system rather than taking it from the process's
// heap (whose lock a suspended thread may hold), and so does stop() its own table.
namespace {

struct stopped_slot {
  CONTEXT context;  // first: it must be 16-byte aligned on x64
  HANDLE handle;
  DWORD tid;
};

struct stop_state {
  std::size_t count;
  std::size_t bytes;
  stopped_slot* slots() noexcept {
    const auto after = reinterpret_cast<std::uintptr_t>(this + 1);
    return reinterpret_cast<stopped_slot*>((after + alignof(stopped_slot) - 1) & ~(alignof(stopped_slot) - 1));
  }
};

constexpr std::size_t stop_capacity = 4096;  // threads; more and stop() fails
constexpr int stop_rounds = 16;              // snapshots that keep finding new threads; then it fails

// Suspends the threads of one snapshot not suspended yet: how many, or the system's error.
result<std::size_t> suspend_new_threads(stop_state& st) noexcept {
  const HANDLE snapshot = ::CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0);
  if (snapshot == INVALID_HANDLE_VALUE) return result<std::size_t>::failure(static_cast<int>(::GetLastError()));
  const DWORD self = ::GetCurrentProcessId();
  const DWORD caller = ::GetCurrentThreadId();
  THREADENTRY32 entry;
  entry.dwSize = sizeof entry;
  std::size_t found = 0;
  int error = 0;
  for (BOOL more = ::Thread32First(snapshot, &entry); more != 0 && error == 0;
       more = ::Thread32Next(snapshot, &entry), entry.dwSize = sizeof entry) {
    if (entry.th32OwnerProcessID != self || entry.th32ThreadID == caller) continue;
    bool known = false;
    for (std::size_t i = 0; i < st.count && !known; ++i) known = st.slots()[i].tid == entry.th32ThreadID;
    if (known) continue;
    if (st.count == stop_capacity) {
      error = ERROR_NOT_ENOUGH_MEMORY;  // no room for more threads
      break;
    }
    const HANDLE thread =
        ::OpenThread(THREAD_SUSPEND_RESUME | THREAD_GET_CONTEXT | THREAD_QUERY_INFORMATION, FALSE, entry.th32ThreadID);
    if (thread == nullptr) continue;  // it exited
    if (::SuspendThread(thread) == static_cast<DWORD>(-1)) {
      ::CloseHandle(thread);
      continue;
    }
    stopped_slot& slot = st.slots()[st.count];
    slot.context.ContextFlags = CONTEXT_INTEGER | CONTEXT_CONTROL;
    if (::GetThreadContext(thread, &slot.context) == 0) {  // it is exiting
      ::ResumeThread(thread);
      ::CloseHandle(thread);
      continue;
    }
    slot.handle = thread;
    slot.tid = entry.th32ThreadID;
    ++st.count;
    ++found;
  }
  ::CloseHandle(snapshot);
  if (error != 0) return result<std::size_t>::failure(error);
  return found;
}

std::uintptr_t stack_pointer_of(const CONTEXT& c) noexcept {
#if defined(_M_X64) || defined(__x86_64__)
  return static_cast<std::uintptr_t>(c.Rsp);
#elif defined(_M_ARM64) || defined(__aarch64__)
  return static_cast<std::uintptr_t>(c.Sp);
#else
  return static_cast<std::uintptr_t>(c.Esp);
#endif
}

}  // namespace

status stopped_threads::stop() noexcept {
  resume();
  const std::size_t page = page_size();
  const std::size_t bytes =
      (sizeof(stop_state) + alignof(stopped_slot) + stop_capacity * sizeof(stopped_slot) + page - 1) & ~(page - 1);
  auto mapped = map(bytes);
  if (!mapped) return status::failure(mapped.error());
  auto* st = static_cast<stop_state*>(mapped.value());
  st->count = 0;
  st->bytes = bytes;
  state_ = st;
  for (int round = 0;; ++round) {
    const auto found = suspend_new_threads(*st);
    if (found && found.value() == 0) return {};
    if (!found || round + 1 == stop_rounds) {
      const int error = found ? ERROR_BUSY : found.error();
      resume();
      return status::failure(error);
    }
  }
}

void stopped_threads::resume() noexcept {
  if (state_ == nullptr) return;
  auto* st = static_cast<stop_state*>(state_);
  for (std::size_t i = 0; i < st->count; ++i) {
    ::ResumeThread(st->slots()[i].handle);
    ::CloseHandle(st->slots()[i].handle);
  }
  (void)release(st, st->bytes);
  state_ = nullptr;
}

std::size_t stopped_threads::count() const noexcept {
  return state_ != nullptr ? static_cast<const stop_state*>(state_)->count : 0;
}

stopped_threads::thread stopped_threads::at(std::size_t i) const noexcept {
  const stopped_slot& slot = static_cast<stop_state*>(state_)->slots()[i];
  return {stack_pointer_of(slot.context), &slot.context, sizeof slot.context};
}

std::uintptr_t stopped_threads::storage_begin() const noexcept { return reinterpret_cast<std::uintptr_t>(state_); }

std::uintptr_t stopped_threads::storage_end() const noexcept {
  return state_ != nullptr ? storage_begin() + static_cast<const stop_state*>(state_)->bytes : storage_begin();
}

// Committed pages may hold data (Windows has no cheap residency query short of the working set
// API): one VirtualQuery per run of pages in the same state.
status touched_pages(const void* address, std::size_t bytes, unsigned char* touched) noexcept {
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
    for (std::uintptr_t p = at; p < run_end; p += page) touched[(p - begin) / page] = value;
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
