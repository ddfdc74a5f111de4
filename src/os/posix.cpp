// The os layer on POSIX systems (Linux tested; macOS and the BSDs handled where they differ).
#include "memkit/os.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>

#include "fault_injection.hpp"

#if defined(__APPLE__)
#include <mach/mach.h>
#endif

#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif
#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the constant
#endif

namespace memkit::os {
namespace {

using testing::operation;

std::size_t system_page_size() noexcept {
  static const std::size_t size = [] {
    const long bytes = sysconf(_SC_PAGESIZE);
    return bytes > 0 ? static_cast<std::size_t>(bytes) : std::size_t{4096};
  }();
  return size;
}

// The page size the rest of memkit sees: the system's, or a larger power of two (at most 1 MiB)
// from MEMKIT_PAGE_SIZE, so that a test suite can run with the 16 KiB and 64 KiB granularities of
// other systems on a 4 KiB machine. Read once.
std::size_t query_page_size() noexcept {
  const std::size_t system = system_page_size();
  if (const char* forced = std::getenv("MEMKIT_PAGE_SIZE"); forced != nullptr && forced[0] != '\0') {
    char* end = nullptr;
    const unsigned long long bytes = std::strtoull(forced, &end, 10);
    if (*end == '\0' && bytes > system && bytes <= (std::size_t{1} << 20) && (bytes & (bytes - 1)) == 0) {
      return static_cast<std::size_t>(bytes);
    }
  }
  return system;
}

bool page_aligned(const void* address, std::size_t bytes) noexcept {
  const std::size_t mask = page_size() - 1;
  return (reinterpret_cast<std::uintptr_t>(address) & mask) == 0 && (bytes & mask) == 0;
}

result<void*> map_anonymous_unaligned(std::size_t bytes, int protection, int extra_flags) noexcept {
  void* p = ::mmap(nullptr, bytes, protection, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  if (p == MAP_FAILED) return result<void*>::failure(errno);
  return p;
}

// Maps `bytes` (a multiple of the system's page size) starting at a multiple of `alignment` by
// mapping more and trimming both ends.
result<void*> map_anonymous_aligned(std::size_t bytes, std::size_t alignment, int protection,
                                    int extra_flags) noexcept {
  if (alignment <= system_page_size()) return map_anonymous_unaligned(bytes, protection, extra_flags);
  // A whole `alignment` of padding, not the `alignment - page` that suffices to fit: the kernel
  // places mappings top-down against the previous one, whose start is aligned, so this mapping
  // starts aligned too and its trimmed tail leaves `alignment` bytes of free address space right
  // after the block, where extend_mapping can grow it in place. With one page less, the block
  // ends against its neighbour and every growth beyond its reservation moves it (std::vector /
  // memkit::vector with two or three vectors growing at once fell from 2.4-2.7x to 1.3-1.4x).
  const std::size_t padded = bytes + alignment;
  if (padded < bytes) return result<void*>::failure(ENOMEM);
  auto raw = map_anonymous_unaligned(padded, protection, extra_flags);
  if (!raw) return raw;
  auto start = reinterpret_cast<std::uintptr_t>(raw.value());
  auto aligned = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  std::size_t head = aligned - start;
  std::size_t tail = padded - head - bytes;
  // Trimming cannot fail for a range we just mapped short of a kernel bug; report it if it does.
  if (head != 0 && ::munmap(raw.value(), head) != 0) {
    int error = errno;
    ::munmap(raw.value(), padded);
    return result<void*>::failure(error);
  }
  if (tail != 0 && ::munmap(reinterpret_cast<void*>(aligned + bytes), tail) != 0) {
    int error = errno;
    ::munmap(reinterpret_cast<void*>(aligned), bytes + tail);
    return result<void*>::failure(error);
  }
  return reinterpret_cast<void*>(aligned);
}

// A fresh mapping at page_size() granularity (larger than the system's when MEMKIT_PAGE_SIZE says).
result<void*> map_anonymous(std::size_t bytes, int protection, int extra_flags) noexcept {
  return map_anonymous_aligned(bytes, page_size(), protection, extra_flags);
}

}  // namespace

std::size_t page_size() noexcept {
  static const std::size_t size = query_page_size();
  return size;
}

std::size_t reservation_granularity() noexcept { return page_size(); }

std::size_t address_space_limit() noexcept {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur >= static_cast<rlim_t>(SIZE_MAX)) {
    return SIZE_MAX;
  }
  return static_cast<std::size_t>(limit.rlim_cur);
}

std::size_t huge_page_size() noexcept {
#if defined(__linux__)
  static const std::size_t size = [] {
    std::size_t bytes = 0;
    if (std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
      unsigned long long value = 0;
      if (std::fscanf(f, "%llu", &value) == 1) bytes = static_cast<std::size_t>(value);
      std::fclose(f);
    }
    return bytes;
  }();
  return size;
#else
  return 0;
#endif
}

result<void*> reserve(std::size_t bytes) noexcept {
  if (bytes == 0 || !page_aligned(nullptr, bytes)) return result<void*>::failure(EINVAL);
  if (int error = detail::injected_failure(operation::reserve)) return result<void*>::failure(error);
  return map_anonymous(bytes, PROT_NONE, MAP_NORESERVE);
}

result<void*> reserve_aligned(std::size_t bytes, std::size_t alignment) noexcept {
  if (alignment <= reservation_granularity()) return reserve(bytes);
  if ((alignment & (alignment - 1)) != 0 || bytes == 0 || !page_aligned(nullptr, bytes) ||
      bytes + alignment < bytes) {
    return result<void*>::failure(EINVAL);
  }
  if (int error = detail::injected_failure(operation::reserve)) return result<void*>::failure(error);
  return map_anonymous_aligned(bytes, alignment, PROT_NONE, MAP_NORESERVE);
}

status commit(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(EINVAL);
  if (bytes == 0) return {};
  if (int error = detail::injected_failure(operation::commit)) return status::failure(error);
  if (::mprotect(address, bytes, PROT_READ | PROT_WRITE) != 0) return status::failure(errno);
  return {};
}

status decommit(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(EINVAL);
  if (bytes == 0) return {};
  if (int error = detail::injected_failure(operation::decommit)) return status::failure(error);
  // A fresh PROT_NONE mapping over the range drops the pages and the commit charge at once;
  // madvise(MADV_DONTNEED) alone would keep the charge.
  void* p = ::mmap(address, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
  if (p == MAP_FAILED) return status::failure(errno);
  return {};
}

status discard(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(EINVAL);
  if (bytes == 0) return {};
#if defined(__linux__)
  const int advice = MADV_DONTNEED;
#elif defined(MADV_FREE)
  const int advice = MADV_FREE;
#else
  const int advice = MADV_DONTNEED;
#endif
  if (::madvise(address, bytes, advice) != 0) return status::failure(errno);
  return {};
}

status release(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(EINVAL);
  if (bytes == 0) return {};
  if (::munmap(address, bytes) != 0) return status::failure(errno);
  return {};
}

result<void*> map(std::size_t bytes) noexcept {
  if (bytes == 0 || !page_aligned(nullptr, bytes)) return result<void*>::failure(EINVAL);
  if (int error = detail::injected_failure(operation::map)) return result<void*>::failure(error);
  return map_anonymous(bytes, PROT_READ | PROT_WRITE, 0);
}

status extend_mapping(void* address, std::size_t old_bytes, std::size_t new_bytes) noexcept {
  if (!page_aligned(address, old_bytes) || !page_aligned(nullptr, new_bytes) || old_bytes == 0 ||
      new_bytes == 0) {
    return status::failure(EINVAL);
  }
  if (new_bytes == old_bytes) return {};
  if (new_bytes < old_bytes) {
    return release(static_cast<char*>(address) + new_bytes, old_bytes - new_bytes);
  }
#if defined(__linux__)
  if (int error = detail::injected_failure(operation::map)) return status::failure(error);
  void* p = ::mremap(address, old_bytes, new_bytes, 0);
  if (p == MAP_FAILED) return status::failure(errno);
  return {};
#else
  return status::failure(ENOTSUP);
#endif
}

result<void*> remap(void* address, std::size_t old_bytes, std::size_t new_bytes) noexcept {
  if (!page_aligned(address, old_bytes) || !page_aligned(nullptr, new_bytes) || old_bytes == 0 ||
      new_bytes == 0) {
    return result<void*>::failure(EINVAL);
  }
#if defined(__linux__)
  if (int error = detail::injected_failure(operation::map)) return result<void*>::failure(error);
  if (page_size() > system_page_size()) {
    // The kernel would move the pages to any address of its page size: give it a destination at
    // ours.
    auto target = map_anonymous(new_bytes, PROT_NONE, MAP_NORESERVE);
    if (!target) return target;
    void* p = ::mremap(address, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, target.value());
    if (p == MAP_FAILED) {
      const int error = errno;
      ::munmap(target.value(), new_bytes);
      return result<void*>::failure(error);
    }
    return p;
  }
  void* p = ::mremap(address, old_bytes, new_bytes, MREMAP_MAYMOVE);
  if (p == MAP_FAILED) return result<void*>::failure(errno);
  return p;
#else
  auto fresh = map(new_bytes);
  if (!fresh) return fresh;
  std::memcpy(fresh.value(), address, old_bytes < new_bytes ? old_bytes : new_bytes);
  if (auto s = release(address, old_bytes); !s) {
    release(fresh.value(), new_bytes);
    return result<void*>::failure(s.error());
  }
  return fresh;
#endif
}

status move_pages(void* from, std::size_t bytes, void* to) noexcept {
  const auto source = reinterpret_cast<std::uintptr_t>(from);
  const auto target = reinterpret_cast<std::uintptr_t>(to);
  if (!page_aligned(from, bytes) || !page_aligned(to, 0) || bytes == 0 ||
      (source < target + bytes && target < source + bytes)) {
    return status::failure(EINVAL);
  }
#if defined(__linux__)
  if (int error = detail::injected_failure(operation::map)) return status::failure(error);
  void* p = ::mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  if (p == MAP_FAILED) return status::failure(errno);
  return {};
#else
  return status::failure(ENOTSUP);
#endif
}

status move_and_grow_pages(void* from, std::size_t bytes, void* to, std::size_t new_bytes) noexcept {
  const auto source = reinterpret_cast<std::uintptr_t>(from);
  const auto target = reinterpret_cast<std::uintptr_t>(to);
  if (!page_aligned(from, bytes) || !page_aligned(to, new_bytes) || bytes == 0 || new_bytes < bytes ||
      (source < target + new_bytes && target < source + bytes)) {
    return status::failure(EINVAL);
  }
#if defined(__linux__)
  if (int error = detail::injected_failure(operation::map)) return status::failure(error);
  void* p = ::mremap(from, bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  if (p == MAP_FAILED) return status::failure(errno);
  return {};
#else
  return status::failure(ENOTSUP);
#endif
}

status advise_huge_pages(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(EINVAL);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes == 0) return {};
  if (::madvise(address, bytes, MADV_HUGEPAGE) != 0) return status::failure(errno);
  return {};
#else
  return status::failure(ENOTSUP);
#endif
}

status prefault(void* address, std::size_t bytes) noexcept {
  if (!page_aligned(address, bytes)) return status::failure(EINVAL);
  if (bytes == 0) return {};
  if (int error = detail::injected_failure(operation::prefault)) return status::failure(error);
#if defined(__linux__)
  if (::madvise(address, bytes, MADV_POPULATE_WRITE) == 0) return {};
  if (errno != EINVAL) return status::failure(errno);  // ENOMEM, EFAULT, EHWPOISON: report them
  // EINVAL: a kernel older than 5.14; fall back to touching each page.
#endif
  auto* p = static_cast<volatile char*>(address);
  for (std::size_t offset = 0; offset < bytes; offset += system_page_size()) p[offset] = p[offset];
  return {};
}

result<std::size_t> current_resident_bytes() noexcept {
#if defined(__linux__)
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return result<std::size_t>::failure(errno);
  unsigned long long total_pages = 0, resident_pages = 0;
  int fields = std::fscanf(f, "%llu %llu", &total_pages, &resident_pages);
  std::fclose(f);
  if (fields != 2) return result<std::size_t>::failure(EIO);
  return static_cast<std::size_t>(resident_pages) * system_page_size();
#elif defined(__APPLE__)
  mach_task_basic_info info{};
  mach_msg_type_number_t count = MACH_TASK_BASIC_INFO_COUNT;
  if (task_info(mach_task_self(), MACH_TASK_BASIC_INFO, reinterpret_cast<task_info_t>(&info),
                &count) != KERN_SUCCESS) {
    return result<std::size_t>::failure(EIO);
  }
  return static_cast<std::size_t>(info.resident_size);
#else
  return result<std::size_t>::failure(ENOTSUP);
#endif
}

result<std::size_t> peak_resident_bytes() noexcept {
#if defined(__linux__)
  // VmHWM is this address space's own high-water mark. ru_maxrss is not: Linux carries it across
  // execve, so a process started by posix_spawn/fork+exec reports its parent's resident size as
  // its own peak until it exceeds it (a benchmark child would measure the runner).
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f) != nullptr) {
      found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
    }
    std::fclose(f);
    if (found) return static_cast<std::size_t>(kib) * 1024;
  }
  // No /proc: fall back to getrusage.
#endif
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return result<std::size_t>::failure(errno);
#if defined(__APPLE__)
  return static_cast<std::size_t>(usage.ru_maxrss);  // bytes on macOS
#else
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // KiB on Linux and the BSDs
#endif
}

result<cpu_times> process_cpu_times() noexcept {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return result<cpu_times>::failure(errno);
  auto ns = [](const timeval& tv) {
    return static_cast<std::uint64_t>(tv.tv_sec) * 1'000'000'000u +
           static_cast<std::uint64_t>(tv.tv_usec) * 1'000u;
  };
  return cpu_times{ns(usage.ru_utime), ns(usage.ru_stime)};
}

std::size_t malloc_usable_size(void* block) noexcept {
#if defined(__GLIBC__)
  return block == nullptr ? 0 : ::malloc_usable_size(block);
#else
  (void)block;
  return 0;
#endif
}

void* malloc_aligned(std::size_t size, std::size_t alignment) noexcept {
  void* p = nullptr;
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  return ::posix_memalign(&p, alignment, size) == 0 ? p : nullptr;
}

void free_aligned(void* block) noexcept { std::free(block); }

bool is_unsupported(int error) noexcept { return error == ENOTSUP || error == EOPNOTSUPP; }

const char* error_message(int error) noexcept {
  if (error == -1) return "injected or unknown failure";
  const char* text = std::strerror(error);
  return text != nullptr ? text : "unknown error";
}

}  // namespace memkit::os

// ---- platform services of the allocators (src/os/platform.hpp) ---------------------------------

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

#include <cstdlib>

#include "platform.hpp"

namespace memkit::os {

static_assert(sizeof(pthread_key_t) <= sizeof(std::uintptr_t), "a pthread key must fit a thread_key handle");

status thread_key_create(thread_key& key, thread_exit_callback on_exit) noexcept {
  pthread_key_t k{};
  if (const int error = ::pthread_key_create(&k, on_exit); error != 0) return status::failure(error);
  key.handle = static_cast<std::uintptr_t>(k);
  key.created = true;
  return {};
}

void thread_key_delete(thread_key& key) noexcept {
  if (!key.created) return;
  (void)::pthread_key_delete(static_cast<pthread_key_t>(key.handle));
  key.created = false;
}

void* thread_key_get(const thread_key& key) noexcept {
  return ::pthread_getspecific(static_cast<pthread_key_t>(key.handle));
}

status thread_key_set(const thread_key& key, void* value) noexcept {
  if (const int error = ::pthread_setspecific(static_cast<pthread_key_t>(key.handle), value); error != 0) {
    return status::failure(error);
  }
  return {};
}

void yield_thread() noexcept { (void)::sched_yield(); }

status at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept {
  if (const int error = ::pthread_atfork(prepare, parent, child); error != 0) return status::failure(error);
  return {};
}

std::uint64_t monotonic_ms() noexcept {
  timespec ts{};
#if defined(CLOCK_MONOTONIC_COARSE)
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000000u;
}

#if defined(__linux__) && defined(__x86_64__)
// Pushes rbx, rbp and r12-r15 (the System V ABI's callee-saved registers), keeps the stack aligned
// for the call, and calls fn(object, argument, result, stack_start, saved) with `saved` the
// address of the six pushed words. Written in assembly: a C++ function's prologue may save and
// reuse those registers before any statement of its body runs.
__asm__(R"(
  .text
  .p2align 4
  .globl memkit_os_call_with_callee_saved
  .hidden memkit_os_call_with_callee_saved
  .type memkit_os_call_with_callee_saved, @function
memkit_os_call_with_callee_saved:
  .cfi_startproc
  endbr64
  pushq %rbx
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbx, 0
  pushq %rbp
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbp, 0
  pushq %r12
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r12, 0
  pushq %r13
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r13, 0
  pushq %r14
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r14, 0
  pushq %r15
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r15, 0
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  movq %rdi, %rax
  movq %rsi, %rdi
  movq %rdx, %rsi
  movq %rcx, %rdx
  movq %r8, %rcx
  leaq 8(%rsp), %r8
  call *%rax
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %r15
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r15
  popq %r14
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r14
  popq %r13
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r13
  popq %r12
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r12
  popq %rbp
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbp
  popq %rbx
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbx
  ret
  .cfi_endproc
  .size memkit_os_call_with_callee_saved, .-memkit_os_call_with_callee_saved
)");
#else
extern "C" std::size_t memkit_os_call_with_callee_saved(callee_saved_function fn, const void* object,
                                                         std::uintptr_t argument, void* result,
                                                         std::uintptr_t stack_start) noexcept {
  return fn(object, argument, result, stack_start, nullptr);
}
#endif

std::uint64_t thread_cpu_ns() noexcept {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

status output(int fd, const char* text, std::size_t length) noexcept {
  while (length != 0) {
    const ssize_t written = ::write(fd, text, length);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return status::failure(errno);
    if (written == 0) return status::failure(EIO);
    text += written;
    length -= static_cast<std::size_t>(written);
  }
  return {};
}

result<int> open_for_append(const char* path) noexcept {
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return result<int>::failure(errno);
  return fd;
}

result<int> duplicate_error_stream(int lowest) noexcept {
  const int fd = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, lowest);
  if (fd < 0) return result<int>::failure(errno);
  return fd;
}

result<std::size_t> read_file(const char* path, char* buffer, std::size_t capacity) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return result<std::size_t>::failure(errno);
  std::size_t length = 0;
  while (length < capacity) {
    const ssize_t n = ::read(fd, buffer + length, capacity - length);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return result<std::size_t>::failure(error);
    }
    if (n == 0) break;
    length += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return length;
}

void close_descriptor(int fd) noexcept {
  if (fd > STDERR_FILENO) (void)::close(fd);
}

bool process_is_privileged() noexcept {
#if defined(__linux__)
  return ::getauxval(AT_SECURE) != 0;
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__)
  return ::issetugid() != 0;
#else
  return ::getuid() != ::geteuid() || ::getgid() != ::getegid();
#endif
}

const char* environment_variable(const char* name) noexcept {
  if (process_is_privileged()) return nullptr;  // setuid/setgid: the environment is another user's
  return std::getenv(name);                      // allocates nothing
}

}  // namespace memkit::os

// ---- the process's own address space (process.hpp), for debug mode's leak scan ----------------

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/uio.h>

#if defined(__linux__)
#include <elf.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>

#include <atomic>
#include <new>
#endif

#include "process.hpp"

namespace memkit::os::process {

#if defined(__linux__)

namespace {

std::uintptr_t parse_hex(const char*& p, const char* end) noexcept {
  std::uintptr_t v = 0;
  for (; p < end; ++p) {
    const char c = *p;
    unsigned digit;
    if (c >= '0' && c <= '9') digit = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') digit = static_cast<unsigned>(c - 'a' + 10);
    else break;
    v = v * 16 + digit;
  }
  return v;
}

}  // namespace

// Reads `fd` from where it stands to its end, or until `capacity` bytes: how many it read.
result<std::size_t> read_up_to(int fd, char* buffer, std::size_t capacity) noexcept {
  std::size_t length = 0;
  while (length < capacity) {
    const ssize_t n = ::read(fd, buffer + length, capacity - length);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return result<std::size_t>::failure(errno);
    if (n == 0) break;
    length += static_cast<std::size_t>(n);
  }
  return length;
}

// /proc/self/maps, read whole into memory from map() (no malloc, no stdio) so that the walk sees
// one snapshot, then parsed line by line: "begin-end perms offset dev inode   name".
status for_each_region(region_visitor visit, void* context) noexcept {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return status::failure(errno);
  char* buffer = nullptr;
  std::size_t capacity = 0;
  std::size_t length = 0;
  int error = 0;
  for (capacity = std::size_t{1} << 20; capacity <= (std::size_t{256} << 20); capacity *= 4) {
    auto mapped = map(capacity);
    if (!mapped) {
      error = mapped.error();
      break;
    }
    buffer = static_cast<char*>(mapped.value());
    length = 0;
    if (::lseek(fd, 0, SEEK_SET) != 0) {
      error = errno;
      break;
    }
    const auto got = read_up_to(fd, buffer, capacity);
    if (!got) error = got.error();
    length = got ? got.value() : 0;
    if (error != 0 || length < capacity) break;
    (void)release(buffer, capacity);  // too small: the file did not fit
    buffer = nullptr;
  }
  ::close(fd);
  if (buffer == nullptr || error != 0) {
    if (buffer != nullptr) (void)release(buffer, capacity);
    return status::failure(error != 0 ? error : ENOMEM);
  }
  const char* line = buffer;
  const char* const end = buffer + length;
  while (line < end) {
    char* eol = buffer + (line - buffer);
    while (eol < end && *eol != '\n') ++eol;
    *eol = '\0';  // at `end` too: the buffer has room, length < capacity
    const char* p = line;
    region r{};
    r.begin = parse_hex(p, eol);
    if (p < eol && *p == '-') ++p;
    r.end = parse_hex(p, eol);
    if (p < eol && *p == ' ') ++p;
    if (eol - p >= 4) {
      r.readable = p[0] == 'r';
      r.writable = p[1] == 'w';
      r.is_private = p[3] == 'p';
    }
    // The name: after the fifth field (perms, offset, dev, inode), past the padding.
    int fields = 0;
    while (p < eol && fields < 4) {
      while (p < eol && *p != ' ') ++p;
      while (p < eol && *p == ' ') ++p;
      ++fields;
    }
    r.name = p;
    // The kernel's pages (time data, the legacy syscall page) are no data of the process.
    if (std::strncmp(r.name, "[vvar", 5) == 0 || std::strncmp(r.name, "[vsyscall", 9) == 0) r.readable = false;
    line = eol + 1;
    if (r.begin < r.end && !visit(r, context)) break;
  }
  (void)release(buffer, capacity);
  return {};
}

// process_vm_readv on this process: the kernel copies, so a page unmapped meanwhile ends the copy
// instead of faulting.
result<std::size_t> read_memory(const void* address, void* buffer, std::size_t bytes) noexcept {
  iovec local{buffer, bytes};
  iovec remote{const_cast<void*>(address), bytes};
  const ssize_t got = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0);
  if (got >= 0) return static_cast<std::size_t>(got);
  if (errno == EFAULT) return std::size_t{0};  // the first page is not readable
  return result<std::size_t>::failure(errno);
}

std::size_t protection_granularity() noexcept { return system_page_size(); }

// One byte of each system page read in place, under a handler of SIGSEGV and SIGBUS that jumps
// back out of the fault (the way conservative collectors find the ends of their roots): where the
// fault was is where the readable prefix ends. The handlers the program had, and its signal mask,
// are back when this returns. Probing through the kernel instead (process_vm_readv, a byte a page)
// costs more than copying the pages does. Only while no other thread runs: a fault of another
// thread meanwhile would land in the handler below.
namespace {

sigjmp_buf* probe_return = nullptr;

void probe_fault(int, siginfo_t*, void*) { siglongjmp(*probe_return, 1); }

// Reads a byte of each page from `begin` on until `end` or a fault: where it stopped. (What lives
// across sigsetjmp is volatile, so that the jump back finds it as the fault left it. The byte may
// be one AddressSanitizer poisoned, a global's redzone: not checked.)
[[gnu::noinline]] __attribute__((no_sanitize("address"))) std::uintptr_t probe_until_fault(std::uintptr_t begin,
                                                                                       std::uintptr_t end,
                                                                                       std::size_t page) noexcept {
  volatile std::uintptr_t at = begin;
  const volatile std::uintptr_t stop = end;
  const volatile std::size_t step = page;
  sigjmp_buf back;
  probe_return = &back;
  if (sigsetjmp(back, 1) == 0) {
    while (at < stop) {
      (void)*reinterpret_cast<const volatile char*>(at);
      at = (at & ~(step - 1)) + step;
    }
  }
  probe_return = nullptr;
  return at;
}

}  // namespace

result<std::size_t> readable_prefix(const void* address, std::size_t bytes) noexcept {
  const std::size_t page = system_page_size();
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t end = begin + bytes;
  struct sigaction probe {};
  probe.sa_sigaction = probe_fault;
  probe.sa_flags = SA_SIGINFO;
  sigemptyset(&probe.sa_mask);
  struct sigaction old_segv {};
  struct sigaction old_bus {};
  sigset_t faults;
  sigset_t old_mask;
  sigemptyset(&faults);
  sigaddset(&faults, SIGSEGV);
  sigaddset(&faults, SIGBUS);
  if (::sigaction(SIGSEGV, &probe, &old_segv) != 0) return result<std::size_t>::failure(errno);
  if (::sigaction(SIGBUS, &probe, &old_bus) != 0) {
    const int error = errno;
    (void)::sigaction(SIGSEGV, &old_segv, nullptr);
    return result<std::size_t>::failure(error);
  }
  (void)::pthread_sigmask(SIG_UNBLOCK, &faults, &old_mask);  // a blocked fault would kill the process
  const std::uintptr_t at = probe_until_fault(begin, end, page);
  (void)::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  (void)::sigaction(SIGBUS, &old_bus, nullptr);
  (void)::sigaction(SIGSEGV, &old_segv, nullptr);
  return at < end ? static_cast<std::size_t>(at - begin) : bytes;
}

// Field 20 of /proc/self/stat, counted after the last ')' (the command's name may hold spaces and
// parentheses).
result<std::size_t> thread_count() noexcept {
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return result<std::size_t>::failure(errno);
  char text[1024];
  const auto got = read_up_to(fd, text, sizeof text - 1);
  ::close(fd);
  if (!got) return result<std::size_t>::failure(got.error());
  text[got.value()] = '\0';
  const char* p = std::strrchr(text, ')');
  if (p == nullptr) return result<std::size_t>::failure(EINVAL);
  for (int field = 2; field < 20 && *p != '\0'; ++p) {
    if (*p == ' ') ++field;
  }
  std::size_t threads = 0;
  for (; *p >= '0' && *p <= '9'; ++p) threads = threads * 10 + static_cast<std::size_t>(*p - '0');
  if (threads == 0) return result<std::size_t>::failure(EINVAL);
  return threads;
}

// ---- stopped_threads: a helper task traces the other threads --------------------------------------
//
// The calling thread starts a task that shares its memory but is not one of its threads (clone
// without CLONE_THREAD: a thread cannot trace its own process's threads), allows it to trace the
// process (Yama's PR_SET_PTRACER), and waits on a futex. The helper lists /proc/PID/task, seizes
// and interrupts each thread but the caller, waits until it stops and reads its registers, and
// lists again until a pass finds no new thread (one not stopped yet may have started another).
// It then reports "stopped" and waits for "resume", detaches every thread (passing on a signal
// that arrived meanwhile) and exits; the caller reaps it. The helper runs on a stack of its own
// but with the caller's thread pointer, so it makes raw system calls only (raw()) and touches no
// thread-local state, errno included. Under ThreadSanitizer, which cannot follow such a task,
// stop() fails with ENOSYS.
namespace {

#if defined(__SANITIZE_THREAD__)
#define MEMKIT_OS_NO_STOPPED_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MEMKIT_OS_NO_STOPPED_THREADS 1
#endif
#endif
#if !defined(__x86_64__) && !defined(__aarch64__)
#define MEMKIT_OS_NO_STOPPED_THREADS 1  // the stack pointer's place in the registers is known for these
#endif

#ifndef MEMKIT_OS_NO_STOPPED_THREADS

#define MEMKIT_OS_HELPER __attribute__((no_sanitize("address", "undefined")))

enum stop_phase : int { starting, go, all_stopped, stop_failed, resuming };

struct stopped_slot {
  int tid;
  int signal;  // a signal the thread was about to take when it stopped: passed on at detach
  user_regs_struct registers;
};

struct stop_state {
  std::atomic<int> phase;  // the futex word
  int error;
  int process_id;
  int caller_tid;
  int helper_pid;
  std::size_t count;
  std::size_t capacity;
  std::size_t bytes;  // of the whole mapping: this header, the slots, the helper's stack
  stopped_slot* slots() noexcept { return reinterpret_cast<stopped_slot*>(this + 1); }
};
static_assert(sizeof(stop_state) % alignof(stopped_slot) == 0);

constexpr std::size_t stop_capacity = 4096;  // threads; more and stop() fails (E2BIG)
constexpr std::size_t helper_stack_bytes = std::size_t{64} << 10;
constexpr long per_thread_wait_ns = 2'000'000'000;  // a thread not stopped by then: ETIMEDOUT

// A system call without the C library: the result, or minus the error (no errno: the helper's
// would be the caller's, which the caller's own calls write meanwhile).
MEMKIT_OS_HELPER long raw(long number, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) noexcept {
#if defined(__x86_64__)
  long result;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  asm volatile("syscall"
               : "=a"(result)
               : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
               : "rcx", "r11", "memory");
  return result;
#else
  register long x8 asm("x8") = number;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  register long x3 asm("x3") = d;
  register long x4 asm("x4") = e;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
  return x0;
#endif
}

MEMKIT_OS_HELPER void futex_wait(std::atomic<int>& word, int value, long timeout_ns) noexcept {
  timespec timeout{timeout_ns / 1'000'000'000, timeout_ns % 1'000'000'000};
  (void)raw(SYS_futex, reinterpret_cast<long>(&word), FUTEX_WAIT, value, timeout_ns > 0 ? reinterpret_cast<long>(&timeout) : 0);
}

MEMKIT_OS_HELPER void futex_wake(std::atomic<int>& word) noexcept {
  (void)raw(SYS_futex, reinterpret_cast<long>(&word), FUTEX_WAKE, 1 << 30);
}

MEMKIT_OS_HELPER std::uintptr_t stack_pointer_of(const user_regs_struct& r) noexcept {
#if defined(__x86_64__)
  return static_cast<std::uintptr_t>(r.rsp);
#else
  return static_cast<std::uintptr_t>(r.sp);
#endif
}

// Waits until `tid`, just interrupted, stops: 1 when it did (its slot filled), 0 when it exited
// meanwhile, else a negative error.
MEMKIT_OS_HELPER long wait_for_stop(stopped_slot& slot) noexcept {
  long waited_ns = 0;
  long pause_ns = 1000;
  int yields = 0;
  for (;;) {
    int status = 0;
    const long r = raw(SYS_wait4, slot.tid, reinterpret_cast<long>(&status), __WALL | WNOHANG, 0);
    if (r == -EINTR) continue;
    if (r < 0) return r;
    if (r == slot.tid) {
      if (WIFEXITED(status) || WIFSIGNALED(status)) return 0;
      if (!WIFSTOPPED(status)) continue;
      // The interrupt's own stop, or a group stop, reads PTRACE_EVENT_STOP in the upper bits; a
      // signal's delivery stop does not, and the signal is passed on when the thread is let go.
      slot.signal = (status >> 16) == PTRACE_EVENT_STOP ? 0 : WSTOPSIG(status);
      iovec registers{&slot.registers, sizeof slot.registers};
      const long got = raw(SYS_ptrace, PTRACE_GETREGSET, slot.tid, NT_PRSTATUS, reinterpret_cast<long>(&registers));
      return got < 0 ? got : 1;
    }
    if (waited_ns >= per_thread_wait_ns) return -ETIMEDOUT;
    // A thread stops within microseconds: yield first (the shortest sleep lasts the timer's
    // slack, 50 us by default, per thread).
    if (yields < 200) {
      ++yields;
      (void)raw(SYS_sched_yield);
      continue;
    }
    timespec pause{0, pause_ns};
    (void)raw(SYS_nanosleep, reinterpret_cast<long>(&pause), 0);
    waited_ns += pause_ns;
    if (pause_ns < 1'000'000) pause_ns *= 2;
  }
}

struct dirent64_header {
  std::uint64_t inode;
  std::int64_t offset;
  unsigned short length;
  unsigned char type;
  char name[1];
};

// Appends the decimal digits of `value` (above 0) at path[n]; returns the new length.
MEMKIT_OS_HELPER std::size_t append_number(char* path, std::size_t n, int value) noexcept {
  char digits[16];
  std::size_t d = 0;
  for (; value > 0; value /= 10) digits[d++] = static_cast<char>('0' + value % 10);
  while (d > 0) path[n++] = digits[--d];
  return n;
}

// Whether thread `tid` has exited and waits to be reaped (a zombie: the main thread after
// pthread_exit while others run), which ptrace refuses (EPERM) and which runs nothing: its state
// in /proc/PID/task/TID/stat, after the command's name in parentheses.
MEMKIT_OS_HELPER bool exited(int process_id, int tid) noexcept {
  char path[64] = "/proc/";
  std::size_t n = append_number(path, 6, process_id);
  std::memcpy(path + n, "/task/", 6);
  n = append_number(path, n + 6, tid);
  std::memcpy(path + n, "/stat", 6);
  const long fd = raw(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fd == -ENOENT;
  char text[512];
  const long got = raw(SYS_read, fd, reinterpret_cast<long>(text), sizeof text - 1);
  (void)raw(SYS_close, fd);
  if (got <= 0) return false;
  const char* state = nullptr;
  for (long i = 0; i < got; ++i) {
    if (text[i] == ')') state = text + i;
  }
  return state != nullptr && state + 2 < text + got && (state[2] == 'Z' || state[2] == 'X');
}

// One pass over /proc/PID/task: seizes every thread not stopped yet. 1 when it found one, 0 when
// none, else a negative error.
MEMKIT_OS_HELPER long stop_new_threads(stop_state& st) noexcept {
  char path[64] = "/proc/";
  const std::size_t n = append_number(path, 6, st.process_id);
  std::memcpy(path + n, "/task", 6);
  const long fd = raw(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fd;
  long found = 0;
  alignas(8) char buffer[4096];
  for (;;) {
    const long got = raw(SYS_getdents64, fd, reinterpret_cast<long>(buffer), sizeof buffer);
    if (got <= 0) {
      if (got < 0) found = got;
      break;
    }
    for (long at = 0; at < got && found >= 0;) {
      const auto* entry = reinterpret_cast<const dirent64_header*>(buffer + at);
      at += entry->length;
      int tid = 0;
      const char* c = entry->name;
      for (; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + (*c - '0');
      if (*c != '\0' || tid == 0 || tid == st.caller_tid) continue;
      bool known = false;
      for (std::size_t i = 0; i < st.count && !known; ++i) known = st.slots()[i].tid == tid;
      if (known) continue;
      if (st.count == st.capacity) {
        found = -E2BIG;
        break;
      }
      const long seized = raw(SYS_ptrace, PTRACE_SEIZE, tid, 0, 0);
      if (seized == -ESRCH || (seized == -EPERM && exited(st.process_id, tid))) continue;  // it exited
      if (seized < 0) {
        found = seized;
        break;
      }
      stopped_slot& slot = st.slots()[st.count++];
      slot.tid = tid;
      slot.signal = 0;
      found = 1;
      long stopped = raw(SYS_ptrace, PTRACE_INTERRUPT, tid, 0, 0);
      if (stopped == 0) stopped = wait_for_stop(slot);
      if (stopped == 0 || stopped == -ESRCH) --st.count;  // gone, nothing to let go
      else if (stopped < 0) found = stopped;
    }
    if (found < 0) break;
  }
  (void)raw(SYS_close, fd);
  return found;
}

MEMKIT_OS_HELPER int helper_main(void* argument) noexcept {
  auto& st = *static_cast<stop_state*>(argument);
  while (st.phase.load(std::memory_order_acquire) == starting) futex_wait(st.phase, starting, 0);
  long error = 0;
  if (st.phase.load(std::memory_order_acquire) == go) {
    for (int pass = 0;; ++pass) {
      const long found = stop_new_threads(st);
      if (found <= 0) {
        error = found;
        break;
      }
      if (pass == 64) {
        error = -EAGAIN;  // threads keep starting threads
        break;
      }
    }
  }
  int expected = go;
  st.error = static_cast<int>(-error);
  if (st.phase.compare_exchange_strong(expected, error == 0 ? all_stopped : stop_failed, std::memory_order_acq_rel)) {
    futex_wake(st.phase);
    if (error == 0) {
      while (st.phase.load(std::memory_order_acquire) == all_stopped) futex_wait(st.phase, all_stopped, 0);
    }
  }
  for (std::size_t i = 0; i < st.count; ++i) (void)raw(SYS_ptrace, PTRACE_DETACH, st.slots()[i].tid, 0, st.slots()[i].signal);
  return 0;
}

#endif  // MEMKIT_OS_NO_STOPPED_THREADS

}  // namespace

status stopped_threads::stop() noexcept {
#ifdef MEMKIT_OS_NO_STOPPED_THREADS
  return status::failure(ENOSYS);
#else
  resume();
  const int saved_errno = errno;
  const std::size_t page = system_page_size();
  const std::size_t state_bytes = (sizeof(stop_state) + stop_capacity * sizeof(stopped_slot) + page - 1) & ~(page - 1);
  const std::size_t bytes = state_bytes + helper_stack_bytes;
  auto mapped = map(bytes);
  if (!mapped) return status::failure(mapped.error());
  auto* st = new (mapped.value()) stop_state{};
  st->phase.store(starting, std::memory_order_relaxed);
  st->process_id = static_cast<int>(::getpid());
  st->caller_tid = static_cast<int>(::syscall(SYS_gettid));
  st->capacity = stop_capacity;
  st->bytes = bytes;
  auto* stack_top = static_cast<unsigned char*>(mapped.value()) + bytes;
  const int helper = ::clone(helper_main, stack_top, CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED, st);
  if (helper < 0) {
    const int error = errno;
    (void)release(mapped.value(), bytes);
    errno = saved_errno;
    return status::failure(error);
  }
  st->helper_pid = helper;
  // Where Yama allows tracing only by ancestors, allow the helper; elsewhere this fails (EINVAL)
  // and changes nothing.
  const bool allowed = ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(helper), 0, 0, 0) == 0;
  st->phase.store(go, std::memory_order_release);
  futex_wake(st->phase);
  int phase = go;
  while ((phase = st->phase.load(std::memory_order_acquire)) == go) {
    futex_wait(st->phase, go, 100'000'000);
    int status = 0;
    if (st->phase.load(std::memory_order_acquire) == go &&
        raw(SYS_wait4, helper, reinterpret_cast<long>(&status), __WALL | WNOHANG, 0) == helper) {
      phase = stop_failed;  // the helper died (its threads, if any, let go with it)
      st->error = ECHILD;
      st->helper_pid = 0;
      break;
    }
  }
  if (allowed) (void)::prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  if (phase != all_stopped) {
    const int error = st->error != 0 ? st->error : EAGAIN;
    int status = 0;
    if (st->helper_pid != 0) {
      while (raw(SYS_wait4, helper, reinterpret_cast<long>(&status), __WALL, 0) == -EINTR) {
      }
    }
    (void)release(mapped.value(), bytes);
    errno = saved_errno;
    return status::failure(error);
  }
  state_ = st;
  errno = saved_errno;
  return {};
#endif
}

void stopped_threads::resume() noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ == nullptr) return;
  const int saved_errno = errno;
  auto* st = static_cast<stop_state*>(state_);
  st->phase.store(resuming, std::memory_order_release);
  futex_wake(st->phase);
  int status = 0;
  while (raw(SYS_wait4, st->helper_pid, reinterpret_cast<long>(&status), __WALL, 0) == -EINTR) {
  }
  (void)release(st, st->bytes);
  state_ = nullptr;
  errno = saved_errno;
#endif
}

std::size_t stopped_threads::count() const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ != nullptr) return static_cast<const stop_state*>(state_)->count;
#endif
  return 0;
}

stopped_threads::thread stopped_threads::at(std::size_t i) const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  const stopped_slot& slot = static_cast<stop_state*>(state_)->slots()[i];
  return {stack_pointer_of(slot.registers), &slot.registers, sizeof slot.registers};
#else
  (void)i;
  return {};
#endif
}

std::uintptr_t stopped_threads::storage_begin() const noexcept { return reinterpret_cast<std::uintptr_t>(state_); }

std::uintptr_t stopped_threads::storage_end() const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ != nullptr) return storage_begin() + static_cast<const stop_state*>(state_)->bytes;
#endif
  return storage_begin();
}

#else

// Elsewhere no portable way to list mappings: the leak scan then has no roots beyond its caller's.
status for_each_region(region_visitor, void*) noexcept { return status::failure(ENOSYS); }

result<std::size_t> read_memory(const void*, void*, std::size_t) noexcept {
  return result<std::size_t>::failure(ENOSYS);
}

std::size_t protection_granularity() noexcept { return system_page_size(); }

result<std::size_t> readable_prefix(const void*, std::size_t) noexcept { return result<std::size_t>::failure(ENOSYS); }

result<std::size_t> thread_count() noexcept { return result<std::size_t>::failure(ENOSYS); }

status stopped_threads::stop() noexcept { return status::failure(ENOSYS); }
void stopped_threads::resume() noexcept {}
std::size_t stopped_threads::count() const noexcept { return 0; }
stopped_threads::thread stopped_threads::at(std::size_t) const noexcept { return {}; }
std::uintptr_t stopped_threads::storage_begin() const noexcept { return 0; }
std::uintptr_t stopped_threads::storage_end() const noexcept { return 0; }

#endif

status resident_pages(const void* address, std::size_t bytes, unsigned char* resident) noexcept {
  // mincore answers per system page; with a larger page_size() (MEMKIT_PAGE_SIZE) each of ours is
  // resident when any of its system pages is, asked one of ours at a time.
  const std::size_t page = page_size();
  const std::size_t per_page = page / system_page_size();  // at most 1 MiB / 4 KiB
  unsigned char system_pages[256];
  unsigned char* answer = per_page == 1 ? resident : system_pages;
  const std::size_t step = per_page == 1 ? bytes : page;
  for (std::size_t offset = 0, i = 0; offset < bytes; offset += step, ++i) {
    const std::size_t length = bytes - offset < step ? bytes - offset : step;
    void* at = const_cast<char*>(static_cast<const char*>(address)) + offset;
#if defined(__APPLE__)
    if (::mincore(at, length, reinterpret_cast<char*>(answer)) != 0) return status::failure(errno);
#else
    if (::mincore(at, length, answer) != 0) return status::failure(errno);
#endif
    if (per_page != 1) {
      unsigned char any = 0;
      for (std::size_t j = 0; j < (length + system_page_size() - 1) / system_page_size(); ++j) any |= answer[j];
      resident[i] = any;
    }
  }
  for (std::size_t i = 0, n = (bytes + page - 1) / page; i < n; ++i) resident[i] &= 1;
  return {};
}

status mapped(const void* address, std::size_t bytes) noexcept {
  if (bytes == 0) return {};
#if defined(__linux__)
  // msync walks the mappings of the range and fails with ENOMEM at a gap; MS_ASYNC writes nothing
  // back for anonymous memory, so this costs a walk of the range's mappings and no more.
  if (::msync(const_cast<void*>(address), bytes, MS_ASYNC) != 0) return status::failure(errno);
  return {};
#else
  return status::failure(ENOSYS);
#endif
}

}  // namespace memkit::os::process
