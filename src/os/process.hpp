// Internal: the calling process's own address space, as debug mode's leak scan needs it — which
// regions are mapped and with what access, a copy of memory that may be unmapped meanwhile, how
// much of a range can be read in place, which pages were ever touched, how many threads run, and
// the other threads held stopped. Implemented in posix_process.cpp and posix_stopped_threads.cpp,
// and in windows_process.cpp.
// Nothing here calls malloc: the leak scan runs inside the allocator, at exit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memkit/os.hpp"

namespace memkit::os::process {

// One mapped region of the address space.
struct region {
  std::uintptr_t begin;
  std::uintptr_t end;
  bool readable;
  bool writable;
  // Executable: with `writable`, a JIT's code (the Java VM's code cache), whose pointers are
  // instructions' operands at any byte offset.
  bool executable;
  // Private to this process (anonymous memory, a stack, the copy-on-write data of a loaded
  // object), as opposed to shared with other processes or backed by a file another can truncate.
  bool is_private;
  // A path, "[stack]" and the like, or "" when the system gives no name.
  const char* name;
};

// Calls visit(r, context) for each region of a snapshot of the address space, in address order,
// until it returns false. The snapshot is taken first, so the walk may map and unmap meanwhile;
// regions the system marks as not holding the process's data (Linux's [vvar], [vsyscall]) are
// reported as unreadable. Fails with the system's error when the address space cannot be read.
using region_visitor = bool (*)(const region& r, void* context);
status for_each_region(region_visitor visit, void* context) noexcept;

// Copies up to `bytes` from `address` into `buffer` without faulting: the number of bytes copied
// from `address` on, which stops short at the first page that is not mapped or not readable (0
// when the first one is not). Fails (ENOSYS, EPERM, ...) when the system offers no safe copy here;
// the caller then decides whether to read in place.
result<std::size_t> read_memory(const void* address, void* buffer, std::size_t bytes) noexcept;

// The unit in which the system maps and protects memory, its own page size: where a page cannot
// be read, the next one starts at the next multiple. (os::page_size() is larger when
// MEMKIT_PAGE_SIZE asks for it.)
std::size_t protection_granularity() noexcept;

// How many of the `bytes` from `address` on can be read in place now: the bytes before the first
// page that is not mapped, not readable, or would fault when read (a guard region, a file
// mapping's pages past the end of its file). No fault reaches the program: on POSIX systems the
// probe catches them with SIGSEGV and SIGBUS handlers of its own, which replace the program's
// while it runs. Fails (ENOSYS, EPERM, ...) when the system cannot tell. Call it, and read in
// place, only while no other thread runs (thread_count()): another thread's fault would land in
// the probe's handler, and memory another thread unmaps afterwards faults; else copy the range
// with read_memory().
result<std::size_t> readable_prefix(const void* address, std::size_t bytes) noexcept;

// The number of threads of the process now (the caller included); fails where the system cannot
// tell cheaply. Only the caller can make it grow: 1 stays 1 until the caller starts a thread.
result<std::size_t> thread_count() noexcept;

// The other threads of the process, held stopped: while stop() has succeeded and resume() has not
// run, no thread but the caller's runs, so that memory can be read in place (no other thread can
// unmap it or fault meanwhile) and each thread's registers and stack pointer are known (below the
// pointer its stack holds only dead frames). On Linux a tracer task stops the threads (ptrace,
// as LeakSanitizer stops them), so that a thread stopped in a system call goes on with it
// afterwards as if nothing happened: no EINTR, no handler of the program's run; every system call
// of the tracer is a raw one. Where the system refuses ptrace (EPERM: a seccomp filter, Yama's
// ptrace scope, a debugger or strace tracing the process already), a signal stops them instead,
// as garbage collectors stop threads: a signal the program leaves at its default action and no
// thread blocks (SIGURG, else SIGWINCH, else a real-time one) gets a handler for the while, each
// thread is sent it (tgkill), and the handler saves the thread's registers and waits until
// resume(); afterwards the signal's action is the program's again. A system call the signal
// interrupts and that the system does not restart (poll, epoll_wait, ...) then returns EINTR. On
// Windows each thread is suspended (SuspendThread) and its context read. stop() fails, and
// nothing stays stopped, where the system refuses both ways (EPERM, the first way's error: a
// thread blocks every candidate signal, or the program handles them all), where there is no way
// here (ENOSYS: other systems, ThreadSanitizer), when a thread does not stop within two seconds
// (ETIMEDOUT: one in an uninterruptible wait, or held by a debugger) or when threads keep
// starting threads. Nothing here calls malloc.
class stopped_threads {
 public:
  struct thread {
    std::uintptr_t stack_pointer;  // 0 where the platform's registers are not known here
    const void* registers;         // the general-purpose registers, as the system stores them
    std::size_t register_bytes;
  };
  // Bytes below a thread's stack pointer that a function may still use (the x86-64 ABI's red
  // zone): a scan of a stopped thread's stack starts this far below its pointer.
  static constexpr std::size_t red_zone_bytes =
#if defined(__x86_64__)
      128;
#else
      0;
#endif

  stopped_threads() noexcept = default;
  stopped_threads(const stopped_threads&) = delete;
  stopped_threads& operator=(const stopped_threads&) = delete;
  ~stopped_threads() { resume(); }

  status stop() noexcept;
  // Lets the threads run on; nothing when none are stopped.
  void resume() noexcept;
  // The threads stopped (the caller not among them).
  std::size_t count() const noexcept;
  thread at(std::size_t i) const noexcept;
  // The memory that holds the threads' registers while they are stopped.
  std::uintptr_t storage_begin() const noexcept;
  std::uintptr_t storage_end() const noexcept;

 private:
  status stop_by_tracing() noexcept;
  status stop_by_signal() noexcept;

  void* state_ = nullptr;
  bool by_signal_ = false;  // state_ is the signal's (posix_stopped_threads.cpp), not a tracer's
};

// One byte per page of [address, address + bytes) (address page-aligned): 1 when the page may
// hold data the process wrote (it is in memory, swapped out, or on Windows committed), 0 when the
// process never touched it (it reads as zeros, or as its file's bytes). Fails when the system
// cannot tell (the range is not mapped, /proc/self/pagemap cannot be read, ...). Elsewhere than
// Linux and Windows a swapped-out page counts as untouched.
status touched_pages(const void* address, std::size_t bytes, unsigned char* touched) noexcept;

// Success when every page of [address, address + bytes) belongs to a mapping of the process
// (reserved or committed); ENOMEM when part of it is not mapped; ENOSYS where the system cannot
// tell cheaply. Checks of the allocator's address-space bookkeeping use it.
status mapped(const void* address, std::size_t bytes) noexcept;

}  // namespace memkit::os::process
