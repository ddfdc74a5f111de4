// The os layer on Windows: VirtualAlloc / VirtualFree / VirtualQuery for memory,
// GetProcessMemoryInfo / GetProcessTimes for metrics. Compiled on Windows only (see CMakeLists.txt).
//
// Error numbers are GetLastError() values (ERROR_NOT_ENOUGH_MEMORY, ERROR_COMMITMENT_LIMIT, ...),
// as os.hpp promises; error_message() formats them.
//
// Differences from POSIX that callers see:
// - reserve() returns addresses aligned to the allocation granularity (64 KiB), and the size of a
//   reservation is rounded up to it by the system.
// - The system frees address space by WHOLE reservations only: VirtualFree(MEM_RELEASE) must be
//   given the reservation's base and a size of 0. release() of a part of a reservation, which
//   munmap allows and the general allocator does (the ends of an over-aligned reservation, a
//   cached huge block split into a segment and the rest), decommits the part at once (its pages
//   and commit charge go back) and counts it; the reservation's address space goes back with the
//   last of its bytes released.
// - commit() charges the commit limit at once (Windows never overcommits), so a later write
//   cannot fail; prefault() only touches pages to make them resident.
// - Transparent huge pages do not exist: large pages need SeLockMemoryPrivilege and must be
//   committed whole at reservation, which the reserve-then-commit model cannot use.
//   huge_page_size() is 0 and advise_huge_pages() fails with ERROR_NOT_SUPPORTED.
// - extend_mapping() fails with ERROR_NOT_SUPPORTED: a second VirtualAlloc next to a mapping is a
//   separate allocation that release() of the first would not free.
#include "windows_api.hpp"  // first: the headers below need it
#include <psapi.h>

#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "fault_injection.hpp"
#include "memkit/os.hpp"

namespace memkit::os {
namespace {

using testing::operation;

// Errors returned without a system call; the numeric values of the Win32 codes.
constexpr int invalid_parameter = ERROR_INVALID_PARAMETER;
constexpr int not_supported = ERROR_NOT_SUPPORTED;

int last_error() noexcept {
  const DWORD error = ::GetLastError();
  return error == 0 ? -1 : static_cast<int>(error);
}

SYSTEM_INFO system_info() noexcept {
  SYSTEM_INFO info{};
  ::GetSystemInfo(&info);
  return info;
}

bool page_aligned(const void* address, std::size_t bytes) noexcept {
  const std::size_t mask = page_size() - 1;
  return (reinterpret_cast<std::uintptr_t>(address) & mask) == 0 && (bytes & mask) == 0;
}

// The size of the whole reservation that starts at `base` (all regions sharing its
// AllocationBase), or 0 when `base` is not the start of a reservation.
std::size_t reservation_size(void* base) noexcept {
  MEMORY_BASIC_INFORMATION info{};
  if (::VirtualQuery(base, &info, sizeof info) == 0 || info.AllocationBase != base) return 0;
  std::size_t total = 0;
  auto* cursor = static_cast<char*>(base);
  while (::VirtualQuery(cursor, &info, sizeof info) != 0 && info.AllocationBase == base) {
    total += info.RegionSize;
    cursor += info.RegionSize;
  }
  return total;
}

// Reservations of which parts were released (see release()): the bytes released so far. A base of
// 0 marks a free entry.
struct partly_released {
  std::uintptr_t base;
  std::size_t size;      // the whole reservation
  std::size_t released;  // of it
};
constexpr std::size_t max_partly_released = 4096;
partly_released partly[max_partly_released];
std::size_t partly_used = 0;  // entries at and past it are free
SRWLOCK partly_lock = SRWLOCK_INIT;

// Counts `bytes` more released of the reservation at `base`, `size` bytes; true once all of them
// are, when the caller releases the reservation. With every entry taken (4096 reservations partly
// released at once), false always: the part's pages went back, its address space stays reserved.
bool count_released(std::uintptr_t base, std::size_t size, std::size_t bytes) noexcept {
  ::AcquireSRWLockExclusive(&partly_lock);
  partly_released* entry = nullptr;
  partly_released* free_entry = nullptr;
  for (std::size_t i = 0; i < partly_used && entry == nullptr; ++i) {
    if (partly[i].base == base) entry = &partly[i];
    else if (partly[i].base == 0 && free_entry == nullptr) free_entry = &partly[i];
  }
  if (entry == nullptr) {
    if (free_entry == nullptr && partly_used < max_partly_released) free_entry = &partly[partly_used++];
    if (free_entry != nullptr) *free_entry = {base, size, 0};
    entry = free_entry;
  }
  bool whole = false;
  if (entry != nullptr) {
    entry->released += bytes;
    whole = entry->released >= entry->size;
    if (whole) entry->base = 0;
  }
  while (partly_used != 0 && partly[partly_used - 1].base == 0) --partly_used;
  ::ReleaseSRWLockExclusive(&partly_lock);
  return whole;
}

// The reservation at `base` is released whole: it counts no parts any more (the system may hand
// out its address space again, as a reservation of its own).
void forget_released(std::uintptr_t base) noexcept {
  ::AcquireSRWLockExclusive(&partly_lock);
  for (std::size_t i = 0; i < partly_used; ++i) {
    if (partly[i].base == base) partly[i].base = 0;
  }
  while (partly_used != 0 && partly[partly_used - 1].base == 0) --partly_used;
  ::ReleaseSRWLockExclusive(&partly_lock);
}

result<void*> virtual_alloc(void* address, std::size_t bytes, DWORD type, DWORD protection) noexcept {
  void* p = ::VirtualAlloc(address, bytes, type, protection);
  if (p == nullptr) return result<void*>::failure(last_error());
  return p;
}

}  // namespace

std::size_t page_size() noexcept {
  static const std::size_t size = system_info().dwPageSize;
  return size;
}

std::size_t reservation_granularity() noexcept {
  static const std::size_t size = system_info().dwAllocationGranularity;
  return size;
}

std::size_t huge_page_size() noexcept { return 0; }

std::size_t address_space_limit() noexcept { return SIZE_MAX; }  // job limits count commit, not addresses

result<void*> reserve(std::size_t bytes) noexcept {
  if (bytes == 0 || !page_aligned(nullptr, bytes)) return result<void*>::failure(invalid_parameter);
  if (int error = detail::injected_failure(operation::reserve)) return result<void*>::failure(error);
  auto reserved = virtual_alloc(nullptr, bytes, MEM_RESERVE, PAGE_NOACCESS);
  // VirtualAlloc calls a size beyond the address space an invalid parameter; to callers it is
  // address space running out, as on POSIX.
  if (!reserved && reserved.error() == invalid_parameter) return result<void*>::failure(ERROR_NOT_ENOUGH_MEMORY);
  return reserved;
}

result<void*> reserve_aligned(std::size_t bytes, std::size_t alignment) noexcept {
  if ((alignment & (alignment - 1)) != 0 || alignment == 0 || bytes == 0 || !page_aligned(nullptr, bytes) ||
      bytes + alignment < bytes) {
    return result<void*>::failure(invalid_parameter);
  }
  if (alignment <= reservation_granularity()) return reserve(bytes);
  if (int error = detail::injected_failure(operation::reserve)) return result<void*>::failure(error);
  // A reservation cannot be trimmed on Windows, so find an aligned hole by reserving an oversized
  // range, releasing it, and reserving exactly at the aligned address inside it. Another thread may
  // take the hole in between; retry a few times.
  int error = ERROR_NOT_ENOUGH_MEMORY;
  for (int attempt = 0; attempt < 16; ++attempt) {
    auto probe = virtual_alloc(nullptr, bytes + alignment, MEM_RESERVE, PAGE_NOACCESS);
    if (!probe) return probe;
    const auto start = reinterpret_cast<std::uintptr_t>(probe.value());
    const auto aligned = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
    if (!::VirtualFree(probe.value(), 0, MEM_RELEASE)) return result<void*>::failure(last_error());
    auto exact = virtual_alloc(reinterpret_cast<void*>(aligned), bytes, MEM_RESERVE, PAGE_NOACCESS);
    if (exact) return exact;
    error = exact.error();
  }
  return result<void*>::failure(error);
}

status commit(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(invalid_parameter);
  if (bytes == 0) return {};
  if (int error = detail::injected_failure(operation::commit)) return status::failure(error);
  if (::VirtualAlloc(address, bytes, MEM_COMMIT, PAGE_READWRITE) == nullptr) return status::failure(last_error());
  return {};
}

status decommit(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(invalid_parameter);
  if (bytes == 0) return {};
  if (int error = detail::injected_failure(operation::decommit)) return status::failure(error);
  // MEM_DECOMMIT returns the physical pages and the commit charge; the addresses stay reserved.
  if (!::VirtualFree(address, bytes, MEM_DECOMMIT)) return status::failure(last_error());
  return {};
}

status discard(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(invalid_parameter);
  if (bytes == 0) return {};
  // MEM_RESET: the pages stay committed and accessible, their contents become unspecified, and the
  // system may reclaim them without writing them to the page file. The protection is ignored.
  if (::VirtualAlloc(address, bytes, MEM_RESET, PAGE_NOACCESS) == nullptr) return status::failure(last_error());
  return {};
}

status release(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(invalid_parameter);
  if (bytes == 0) return {};
  MEMORY_BASIC_INFORMATION info{};
  if (::VirtualQuery(address, &info, sizeof info) == 0 || info.State == MEM_FREE) {
    return status::failure(invalid_parameter);
  }
  // The range must lie in one reservation (whose size the system rounded up to pages).
  const auto base = reinterpret_cast<std::uintptr_t>(info.AllocationBase);
  const std::size_t whole = reservation_size(info.AllocationBase);
  const std::size_t start = reinterpret_cast<std::uintptr_t>(address) - base;
  if (whole == 0 || start >= whole || bytes > whole - start) return status::failure(invalid_parameter);
  if (start == 0 && bytes == whole) {
    forget_released(base);
    if (!::VirtualFree(info.AllocationBase, 0, MEM_RELEASE)) return status::failure(last_error());
    return {};
  }
  // A part: its pages go back now (decommitting pages that are not committed is no error), its
  // address space with the reservation's last part.
  if (!::VirtualFree(address, bytes, MEM_DECOMMIT)) return status::failure(last_error());
  if (count_released(base, whole, bytes) && !::VirtualFree(info.AllocationBase, 0, MEM_RELEASE)) {
    return status::failure(last_error());
  }
  return {};
}

result<void*> map(std::size_t bytes) noexcept {
  if (bytes == 0 || !page_aligned(nullptr, bytes)) return result<void*>::failure(invalid_parameter);
  if (int error = detail::injected_failure(operation::map)) return result<void*>::failure(error);
  return virtual_alloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}

status extend_mapping(void* address, std::size_t old_bytes, std::size_t new_bytes) noexcept {
  if (!page_aligned(address, old_bytes) || !page_aligned(nullptr, new_bytes) || old_bytes == 0 ||
      new_bytes == 0) {
    return status::failure(invalid_parameter);
  }
  if (new_bytes == old_bytes) return {};
  return status::failure(not_supported);
}

result<void*> remap(void* address, std::size_t old_bytes, std::size_t new_bytes) noexcept {
  if (!page_aligned(address, old_bytes) || !page_aligned(nullptr, new_bytes) || old_bytes == 0 ||
      new_bytes == 0) {
    return result<void*>::failure(invalid_parameter);
  }
  // No mremap on Windows: map, copy, release.
  auto fresh = map(new_bytes);
  if (!fresh) return fresh;
  std::memcpy(fresh.value(), address, old_bytes < new_bytes ? old_bytes : new_bytes);
  if (auto released = release(address, old_bytes); !released) {
    static_cast<void>(release(fresh.value(), new_bytes).ok());
    return result<void*>::failure(released.error());
  }
  return fresh;
}

status move_pages(void* from, std::size_t bytes, void* to) noexcept {
  const auto source = reinterpret_cast<std::uintptr_t>(from);
  const auto target = reinterpret_cast<std::uintptr_t>(to);
  if (!page_aligned(from, bytes) || !page_aligned(to, 0) || bytes == 0 ||
      (source < target + bytes && target < source + bytes)) {
    return status::failure(invalid_parameter);
  }
  // Checked like the POSIX layer's, so that a test of the failure path runs the same everywhere.
  if (int error = detail::injected_failure(operation::map)) return status::failure(error);
  return status::failure(not_supported);
}

status move_and_grow_pages(void* from, std::size_t bytes, void* to, std::size_t new_bytes) noexcept {
  const auto source = reinterpret_cast<std::uintptr_t>(from);
  const auto target = reinterpret_cast<std::uintptr_t>(to);
  if (!page_aligned(from, bytes) || !page_aligned(to, new_bytes) || bytes == 0 || new_bytes < bytes ||
      (source < target + new_bytes && target < source + bytes)) {
    return status::failure(invalid_parameter);
  }
  if (int error = detail::injected_failure(operation::map)) return status::failure(error);
  return status::failure(not_supported);
}

status advise_huge_pages(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(invalid_parameter);
  return status::failure(not_supported);
}

status prefault(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(invalid_parameter);
  if (bytes == 0) return {};
  if (int error = detail::injected_failure(operation::prefault)) return status::failure(error);
  // The commit charge was taken by commit(), so touching cannot fail for lack of memory; writing
  // each page makes it resident now instead of at the first use.
  auto* p = static_cast<volatile char*>(address);
  for (std::size_t offset = 0; offset < bytes; offset += page_size()) p[offset] = p[offset];
  return {};
}

result<std::size_t> current_resident_bytes() noexcept {
  PROCESS_MEMORY_COUNTERS counters{};
  if (!::GetProcessMemoryInfo(::GetCurrentProcess(), &counters, sizeof counters)) {
    return result<std::size_t>::failure(last_error());
  }
  return static_cast<std::size_t>(counters.WorkingSetSize);
}

result<std::size_t> peak_resident_bytes() noexcept {
  PROCESS_MEMORY_COUNTERS counters{};
  if (!::GetProcessMemoryInfo(::GetCurrentProcess(), &counters, sizeof counters)) {
    return result<std::size_t>::failure(last_error());
  }
  return static_cast<std::size_t>(counters.PeakWorkingSetSize);
}

result<cpu_times> process_cpu_times() noexcept {
  FILETIME creation{}, exit{}, kernel{}, user{};
  if (!::GetProcessTimes(::GetCurrentProcess(), &creation, &exit, &kernel, &user)) {
    return result<cpu_times>::failure(last_error());
  }
  // FILETIME counts 100-nanosecond intervals.
  auto ns = [](const FILETIME& t) {
    ULARGE_INTEGER value;
    value.LowPart = t.dwLowDateTime;
    value.HighPart = t.dwHighDateTime;
    return static_cast<std::uint64_t>(value.QuadPart) * 100u;
  };
  return cpu_times{ns(user), ns(kernel)};
}

std::size_t malloc_usable_size(void*) noexcept {
  // _msize knows blocks from plain malloc only, and callers cannot say which kind they hold (a
  // block from _aligned_malloc would be misread): report nothing.
  return 0;
}

void* malloc_aligned(std::size_t size, std::size_t alignment) noexcept {
  return ::_aligned_malloc(size == 0 ? 1 : size, alignment);
}

void free_aligned(void* block) noexcept { ::_aligned_free(block); }

bool is_unsupported(int error) noexcept { return error == not_supported; }

const char* error_message(int error) noexcept {
  if (error == -1) return "injected or unknown failure";
  thread_local char text[256];
  const DWORD length = ::FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, nullptr,
                                        static_cast<DWORD>(error), 0, text, static_cast<DWORD>(sizeof text), nullptr);
  if (length == 0) {
    std::snprintf(text, sizeof text, "Windows error %d", error);
    return text;
  }
  // FormatMessage ends its text with "\r\n"; drop it so messages compose on one line.
  DWORD end = length;
  while (end > 0 && (text[end - 1] == '\r' || text[end - 1] == '\n' || text[end - 1] == ' ')) --end;
  text[end] = '\0';
  return text;
}

}  // namespace memkit::os

// ---- platform services of the allocators (src/os/platform.hpp) ---------------------------------

#include <fcntl.h>
#include <io.h>
#include <stdlib.h>

#include <array>
#include <atomic>
#include <utility>

#include "platform.hpp"

namespace memkit::os {

// FlsAlloc's callbacks run at thread (fiber) exit with the slot's value, like a pthread key's
// destructor. Unlike pthread_key_delete, FlsFree also runs the callback, on the deleting thread, for
// every thread whose value is not null: an owner that frees what the values point to and then
// deletes its key (as a private general_allocator's destructor does) would see its callback run on
// freed memory. So each key's callback goes through a trampoline of its own, which deletion
// disarms before FlsFree. A key's handle holds its FLS index (low 32 bits, what thread_key_get
// passes to FlsGetValue) and its trampoline's number (high bits).
namespace {

constexpr std::size_t max_thread_keys = 128;  // FLS_MAXIMUM_AVAILABLE on Windows 7

std::atomic<thread_exit_callback> key_callbacks[max_thread_keys];
std::atomic<bool> key_slot_taken[max_thread_keys];

template <std::size_t Slot>
void WINAPI key_trampoline(void* value) {
  if (const thread_exit_callback callback = key_callbacks[Slot].load(std::memory_order_acquire)) callback(value);
}

template <std::size_t... Slots>
constexpr std::array<PFLS_CALLBACK_FUNCTION, sizeof...(Slots)> make_trampolines(std::index_sequence<Slots...>) {
  return {&key_trampoline<Slots>...};
}

constexpr auto key_trampolines = make_trampolines(std::make_index_sequence<max_thread_keys>{});

}  // namespace

status thread_key_create(thread_key& key, thread_exit_callback on_exit) noexcept {
  std::size_t slot = 0;
  for (bool expected = false; slot < max_thread_keys; ++slot, expected = false) {
    if (key_slot_taken[slot].compare_exchange_strong(expected, true, std::memory_order_acq_rel)) break;
  }
  if (slot == max_thread_keys) return status::failure(ERROR_NO_MORE_ITEMS);
  key_callbacks[slot].store(on_exit, std::memory_order_release);
  const DWORD index = ::FlsAlloc(key_trampolines[slot]);
  if (index == FLS_OUT_OF_INDEXES) {
    const int error = static_cast<int>(::GetLastError());
    key_callbacks[slot].store(nullptr, std::memory_order_relaxed);
    key_slot_taken[slot].store(false, std::memory_order_release);
    return status::failure(error);
  }
  key.handle = static_cast<std::uintptr_t>(index) | (static_cast<std::uintptr_t>(slot) << 32);
  key.created = true;
  return {};
}

void thread_key_delete(thread_key& key) noexcept {
  if (!key.created) return;
  const std::size_t slot = static_cast<std::size_t>(key.handle >> 32);
  key_callbacks[slot].store(nullptr, std::memory_order_release);  // FlsFree's callbacks do nothing
  (void)::FlsFree(static_cast<DWORD>(key.handle));
  key_slot_taken[slot].store(false, std::memory_order_release);
  key.created = false;
}

void* thread_key_get(const thread_key& key) noexcept { return ::FlsGetValue(static_cast<DWORD>(key.handle)); }

status thread_key_set(const thread_key& key, void* value) noexcept {
  if (!::FlsSetValue(static_cast<DWORD>(key.handle), value)) return status::failure(static_cast<int>(::GetLastError()));
  return {};
}

void yield_thread() noexcept { (void)::SwitchToThread(); }

status at_fork(void (*)(), void (*)(), void (*)()) noexcept { return status::failure(ERROR_NOT_SUPPORTED); }

// GetTickCount64: the coarse clock (10-16 ms resolution), a read of shared memory like Linux's
// CLOCK_MONOTONIC_COARSE; QueryPerformanceCounter would be finer and slower than purging needs.
std::uint64_t monotonic_ms() noexcept { return static_cast<std::uint64_t>(::GetTickCount64()); }

// Windows x64 saves more registers (rdi, rsi and xmm6-15 besides rbx, rbp, r12-r15): not
// implemented, fn gets no saved registers (callee_saved_bytes is 0).
extern "C" std::size_t memkit_os_call_with_callee_saved(callee_saved_function fn, const void* object,
                                                         std::uintptr_t argument, void* result,
                                                         std::uintptr_t stack_start) noexcept {
  return fn(object, argument, result, stack_start, nullptr);
}

std::uint64_t thread_cpu_ns() noexcept {
  FILETIME created, exited, kernel, user;
  if (!::GetThreadTimes(::GetCurrentThread(), &created, &exited, &kernel, &user)) return 0;
  const auto ticks = [](const FILETIME& t) {  // 100 ns units
    return (static_cast<std::uint64_t>(t.dwHighDateTime) << 32) | t.dwLowDateTime;
  };
  return (ticks(kernel) + ticks(user)) * 100u;
}

namespace {

HANDLE handle_of(int fd) noexcept {
  if (fd == 1) return ::GetStdHandle(STD_OUTPUT_HANDLE);
  if (fd == error_stream) return ::GetStdHandle(STD_ERROR_HANDLE);
  return reinterpret_cast<HANDLE>(::_get_osfhandle(fd));
}

result<int> descriptor_of(HANDLE handle, int flags) noexcept {
  const int fd = ::_open_osfhandle(reinterpret_cast<std::intptr_t>(handle), flags);
  if (fd < 0) {
    ::CloseHandle(handle);
    return result<int>::failure(ERROR_TOO_MANY_OPEN_FILES);
  }
  return fd;
}

}  // namespace

status output(int fd, const char* text, std::size_t length) noexcept {
  const HANDLE handle = handle_of(fd);
  if (handle == nullptr || handle == INVALID_HANDLE_VALUE) return status::failure(ERROR_INVALID_HANDLE);
  while (length != 0) {
    const DWORD chunk = length > 0x40000000u ? 0x40000000u : static_cast<DWORD>(length);
    DWORD written = 0;
    if (!::WriteFile(handle, text, chunk, &written, nullptr)) return status::failure(static_cast<int>(::GetLastError()));
    if (written == 0) return status::failure(ERROR_WRITE_FAULT);
    text += written;
    length -= written;
  }
  return {};
}

result<int> open_for_append(const char* path, int) noexcept {
  // Not inheritable (null security attributes): the handle's "close-on-exec".
  const HANDLE handle = ::CreateFileA(path, FILE_APPEND_DATA, FILE_SHARE_READ | FILE_SHARE_WRITE, nullptr,
                                      OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (handle == INVALID_HANDLE_VALUE) return result<int>::failure(static_cast<int>(::GetLastError()));
  return descriptor_of(handle, _O_APPEND);
}

void with_low_descriptors_taken(int, void (*body)(void*), void* context) noexcept { body(context); }

result<int> duplicate_error_stream(int) noexcept {
  HANDLE copy = nullptr;
  const HANDLE process = ::GetCurrentProcess();
  if (!::DuplicateHandle(process, ::GetStdHandle(STD_ERROR_HANDLE), process, &copy, 0, FALSE,
                         DUPLICATE_SAME_ACCESS)) {
    return result<int>::failure(static_cast<int>(::GetLastError()));
  }
  return descriptor_of(copy, _O_APPEND);
}

result<std::size_t> read_file(const char* path, char* buffer, std::size_t capacity) noexcept {
  const HANDLE handle = ::CreateFileA(path, GENERIC_READ, FILE_SHARE_READ, nullptr, OPEN_EXISTING,
                                      FILE_ATTRIBUTE_NORMAL, nullptr);
  if (handle == INVALID_HANDLE_VALUE) return result<std::size_t>::failure(static_cast<int>(::GetLastError()));
  std::size_t length = 0;
  while (length < capacity) {
    const std::size_t left = capacity - length;
    const DWORD chunk = left > 0x40000000u ? 0x40000000u : static_cast<DWORD>(left);
    DWORD n = 0;
    if (!::ReadFile(handle, buffer + length, chunk, &n, nullptr)) {
      const int error = static_cast<int>(::GetLastError());
      ::CloseHandle(handle);
      return result<std::size_t>::failure(error);
    }
    if (n == 0) break;
    length += n;
  }
  ::CloseHandle(handle);
  return length;
}

void close_descriptor(int fd) noexcept {
  if (fd > error_stream) (void)::_close(fd);
}

status move_descriptor(int from, int to) noexcept {
  if (from == to) return {};
  if (::_dup2(from, to) != 0) return status::failure(errno);
  (void)::_close(from);
  return {};
}

std::uint64_t process_id() noexcept { return ::GetCurrentProcessId(); }

void end_process(int status) noexcept { ::_exit(status); }

// Windows has no setuid: a process's environment is its own user's.
bool process_is_privileged() noexcept { return false; }

const char* environment_variable(const char* name) noexcept {
  thread_local char value[4096];
  const DWORD length = ::GetEnvironmentVariableA(name, value, static_cast<DWORD>(sizeof value));
  if (length == 0 || length >= sizeof value) return nullptr;  // unset, or longer than any memkit value
  return value;
}

void capture_registers_out_of_line(register_snapshot& snapshot) noexcept {
  static_assert(sizeof(CONTEXT) <= sizeof(register_snapshot::bytes) && alignof(CONTEXT) <= 16,
                "register_snapshot must hold a CONTEXT");
  std::memset(&snapshot, 0, sizeof snapshot);
  ::RtlCaptureContext(reinterpret_cast<CONTEXT*>(snapshot.bytes));
}

}  // namespace memkit::os
