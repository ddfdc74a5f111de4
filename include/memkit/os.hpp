// memkit::os — the only door to the operating system's virtual memory and process metrics.
//
// Everything in memkit that needs pages (arenas, heaps, the general allocator) goes through these
// functions, so porting memkit means writing one file under src/os/. The model is "reserve, then
// commit": reserve() takes a range of address space with no access and no commit charge, commit()
// makes part of it usable, decommit() gives both the physical pages and the commit charge back
// while keeping the addresses, release() returns the range. Every failure comes back as a value
// carrying the system's error number (errno / GetLastError); nothing here prints, throws or
// ignores a failed system call.
//
// Pick this layer directly when you build your own allocator; otherwise use virtual_arena,
// dyn_array or block_heap, which use it for you.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memkit::os {

// The outcome of an operation that yields nothing but success or an error number.
class [[nodiscard]] status {
 public:
  // Success.
  constexpr status() noexcept = default;
  // Failure with the system's error number (never 0).
  static constexpr status failure(int error) noexcept { return status(error == 0 ? -1 : error); }
  // True on success.
  constexpr bool ok() const noexcept { return error_ == 0; }
  // Same as ok().
  constexpr explicit operator bool() const noexcept { return ok(); }
  // The error number (errno on POSIX, GetLastError on Windows); 0 on success.
  constexpr int error() const noexcept { return error_; }

 private:
  constexpr explicit status(int error) noexcept : error_(error) {}
  int error_ = 0;
};

// The outcome of an operation that yields a value or an error number.
template <class T>
class [[nodiscard]] result {
 public:
  // Success with a value.
  constexpr result(T value) noexcept : value_(value) {}  // NOLINT: implicit by design
  // Failure with the system's error number (never 0).
  static constexpr result failure(int error) noexcept { return result(T{}, error == 0 ? -1 : error); }
  // True on success.
  constexpr bool ok() const noexcept { return error_ == 0; }
  // Same as ok().
  constexpr explicit operator bool() const noexcept { return ok(); }
  // The value; meaningful only on success.
  constexpr T value() const noexcept { return value_; }
  // The error number; 0 on success.
  constexpr int error() const noexcept { return error_; }

 private:
  constexpr result(T value, int error) noexcept : value_(value), error_(error) {}
  T value_{};
  int error_ = 0;
};

// Size of a page in bytes, queried from the system once.
std::size_t page_size() noexcept;

// Granularity of reservations: addresses returned by reserve() are multiples of it (the page size
// on POSIX, 64 KiB on Windows).
std::size_t reservation_granularity() noexcept;

// Size of a transparent huge page (2 MiB on x86-64 Linux), or 0 where the system has none.
std::size_t huge_page_size() noexcept;

// The process's limit on its address space (RLIMIT_AS on POSIX), or SIZE_MAX when it has none.
// Read afresh on each call (one system call), since the program may change it.
std::size_t address_space_limit() noexcept;

// Reserves `bytes` (a multiple of page_size()) of address space: no access, no physical memory,
// no commit charge. Fails with ENOMEM when the address space or the mapping count runs out.
result<void*> reserve(std::size_t bytes) noexcept;

// Like reserve(), but the start is a multiple of `alignment` (a power of two, at least the
// granularity). Used for slabs and segments that find their header by masking an address.
result<void*> reserve_aligned(std::size_t bytes, std::size_t alignment) noexcept;

// Makes [address, address + bytes) readable and writable; both page-aligned and inside a
// reservation. Under strict overcommit this is where ENOMEM appears, cleanly.
status commit(void* address, std::size_t bytes) noexcept;

// Returns the physical pages AND the commit charge of a committed range, keeping the addresses
// reserved. Touching the range afterwards faults until it is committed again.
status decommit(void* address, std::size_t bytes) noexcept;

// Returns the physical pages of a committed range but keeps it committed and accessible. The
// contents become unspecified (zero-filled pages on Linux). Cheaper than decommit + commit for
// memory that is about to be reused.
status discard(void* address, std::size_t bytes) noexcept;

// Returns a reservation (or a part of one, at page granularity) to the system. On Windows, which
// frees address space by whole reservations only, a part's pages go back at once and its address
// space with the last part of the reservation released.
status release(void* address, std::size_t bytes) noexcept;

// Reserves and commits in one step: fresh, zero-filled, read-write pages.
result<void*> map(std::size_t bytes) noexcept;

// Grows a mapping made by map() from old_bytes to new_bytes without moving it, if the pages after
// it are free. Fails with ENOMEM when they are not, ENOTSUP where the system cannot.
status extend_mapping(void* address, std::size_t old_bytes, std::size_t new_bytes) noexcept;

// Moves a mapping made by map() to a larger or smaller size, letting the system relocate the pages
// without copying them. Returns the new address; the old range is gone on success.
result<void*> remap(void* address, std::size_t old_bytes, std::size_t new_bytes) noexcept;

// Moves the physical pages of [from, from + bytes) to [to, to + bytes) without copying them,
// replacing whatever was mapped at the destination; afterwards the source range is unmapped (no
// longer reserved). Both ranges must be page-aligned, must not overlap, and the source must lie in
// one mapping (one region made by map(), reserve() + commit(), or one earlier move). Resident
// pages stay resident: this recycles memory that would otherwise be faulted in afresh. ENOTSUP
// where the system cannot (everywhere but Linux).
status move_pages(void* from, std::size_t bytes, void* to) noexcept;

// Like move_pages(), but the destination is `new_bytes` long (at least `bytes`): the pages after
// the moved ones read as zero and belong to the same mapping, committed. One system call on Linux,
// and on failure nothing moved. This is how a growing block changes address without a copy.
status move_and_grow_pages(void* from, std::size_t bytes, void* to, std::size_t new_bytes) noexcept;

// Asks for transparent huge pages over a committed or reserved range. ENOTSUP where unavailable.
status advise_huge_pages(void* address, std::size_t bytes) noexcept;

// Populates a committed range with physical pages now, so that later writes do not fault. Reports
// ENOMEM instead of a later SIGBUS when memory is short (MADV_POPULATE_WRITE, Linux 5.14+); where
// unavailable, touches each page.
status prefault(void* address, std::size_t bytes) noexcept;

// Resident set size of this process now, in bytes.
result<std::size_t> current_resident_bytes() noexcept;

// Highest resident set size this process has reached, in bytes. On Linux this is VmHWM, the
// address space's own peak (ru_maxrss survives execve, so a spawned child would report its
// parent's size); elsewhere ru_maxrss, converted (KiB on the BSDs, bytes on macOS).
result<std::size_t> peak_resident_bytes() noexcept;

// CPU time consumed by this process.
struct cpu_times {
  std::uint64_t user_ns = 0;    // time spent in user mode
  std::uint64_t system_ns = 0;  // time spent in the kernel, page faults included
};

// CPU time of this process so far.
result<cpu_times> process_cpu_times() noexcept;

// Usable size of a block from the C library's malloc, or 0 where the C library does not say.
std::size_t malloc_usable_size(void* block) noexcept;

// A block of `size` bytes aligned to `alignment` (a power of two) from the C library's heap, or
// null. Free it with free_aligned(), never free() (Windows keeps such blocks apart).
void* malloc_aligned(std::size_t size, std::size_t alignment) noexcept;

// Frees a block from malloc_aligned(); null does nothing.
void free_aligned(void* block) noexcept;

// Human-readable text of an error number returned by this layer (never null).
const char* error_message(int error) noexcept;

// Whether an error number returned by this layer means the system cannot do the operation at all
// (ENOTSUP on POSIX, ERROR_NOT_SUPPORTED on Windows), as opposed to a failure this time.
bool is_unsupported(int error) noexcept;

// Fault injection for tests: memkit's own tests (and users testing their error paths) can make the
// next calls of an operation fail without touching the real system.
namespace testing {

// The operations a failure can be injected into.
enum class operation : unsigned { reserve, commit, decommit, map, prefault, count };

// Makes the next `count` calls of `op` fail with `error` (ENOMEM by default); count 0 clears.
// Thread-safe; intended for tests, where the calls are counted down in the order they happen.
void inject_failure(operation op, unsigned count, int error = 12 /* ENOMEM */) noexcept;

// Clears every injected failure.
void clear_injected_failures() noexcept;

// Makes every call of `op` fail from the `after`-th call on (0: the next one), until cleared.
void fail_after(operation op, unsigned after, int error = 12 /* ENOMEM */) noexcept;

}  // namespace testing

}  // namespace memkit::os
