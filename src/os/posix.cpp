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

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#if defined(__linux__)
#include <sys/auxv.h>
#include <sys/syscall.h>
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

result<int> open_for_append(const char* path, int lowest) noexcept {
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return result<int>::failure(errno);
  if (fd >= lowest) return fd;
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, lowest);
  if (high < 0) return fd;  // the limit on descriptors is below `lowest`: keep the low one
  ::close(fd);
  return high;
}

void with_low_descriptors_taken(int lowest, void (*body)(void*), void* context) noexcept {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      limit.rlim_cur < static_cast<rlim_t>(lowest) + 16) {
    lowest = static_cast<int>(limit.rlim_cur) > 32 ? static_cast<int>(limit.rlim_cur) - 16 : 0;
  }
  // Each free descriptor below `lowest` gets a copy of one that is surely open (a new one to
  // /dev/null, itself the first taken), closed again once `body` has run.
  int taken[512];
  int count = 0;
  const int placeholder = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (placeholder >= 0 && placeholder < lowest) {
    taken[count++] = placeholder;
    while (count < static_cast<int>(sizeof taken / sizeof taken[0])) {
      const int fd = ::fcntl(placeholder, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) break;
      if (fd >= lowest) {
        ::close(fd);
        break;
      }
      taken[count++] = fd;
    }
  } else if (placeholder >= 0) {
    ::close(placeholder);
  }
  body(context);
  for (int i = 0; i < count; ++i) ::close(taken[i]);
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

status move_descriptor(int from, int to) noexcept {
  if (from == to) return {};
  if (::dup2(from, to) < 0) return status::failure(errno);
  (void)::fcntl(to, F_SETFD, FD_CLOEXEC);
  (void)::close(from);
  return {};
}

std::uint64_t process_id() noexcept { return static_cast<std::uint64_t>(::getpid()); }

void end_process(int status) noexcept {
  using exit_function = void (*)(int);
  if (const auto next = reinterpret_cast<exit_function>(::dlsym(RTLD_NEXT, "_exit")); next != nullptr) next(status);
#if defined(__linux__)
  ::syscall(SYS_exit_group, status);
#endif
  for (;;) ::pause();  // (not reached: no _exit, and not Linux, would be a system without a C library)
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
