// The os layer's view of the process's own address space on POSIX systems (src/os/process.hpp):
// its regions, copies and probes that do not fault, which pages were ever touched and the number
// of threads, as debug mode's leak scan needs them (the other threads held stopped:
// posix_stopped_threads.cpp). Nothing here calls malloc.
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "memkit/detail/config.hpp"
#include "memkit/os.hpp"
#include "process.hpp"

namespace memkit::os::process {

// The system's own page (os::page_size() is larger when MEMKIT_PAGE_SIZE asks for it).
std::size_t protection_granularity() noexcept {
  static const std::size_t size = [] {
    const long bytes = ::sysconf(_SC_PAGESIZE);
    return bytes > 0 ? static_cast<std::size_t>(bytes) : std::size_t{4096};
  }();
  return size;
}

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
      r.executable = p[2] == 'x';
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
  const std::size_t page = protection_granularity();
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

#else

// Elsewhere no portable way to list mappings: the leak scan then has no roots beyond its caller's.
status for_each_region(region_visitor, void*) noexcept { return status::failure(ENOSYS); }

result<std::size_t> read_memory(const void*, void*, std::size_t) noexcept {
  return result<std::size_t>::failure(ENOSYS);
}

result<std::size_t> readable_prefix(const void*, std::size_t) noexcept { return result<std::size_t>::failure(ENOSYS); }

result<std::size_t> thread_count() noexcept { return result<std::size_t>::failure(ENOSYS); }

#endif

#if defined(__linux__)
namespace {

// Adds to `touched` (one byte per page of ours) the system pages of [address, address + bytes)
// that /proc/self/pagemap lists as present (bit 63) or swapped out (bit 62). mincore() counts a
// swapped-out page as not resident, yet it holds what the process wrote there.
status add_present_or_swapped(std::uintptr_t address, std::size_t bytes, unsigned char* touched) noexcept {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);  // not cached: "self" changes at fork
  if (fd < 0) return status::failure(errno);
  const std::size_t system_page = protection_granularity();
  const std::size_t per_page = page_size() / system_page;
  const std::size_t count = (bytes + system_page - 1) / system_page;
  const std::size_t first = address / system_page;
  std::uint64_t entries[512];
  constexpr std::size_t batch = sizeof entries / sizeof entries[0];
  int error = 0;
  for (std::size_t done = 0; done < count && error == 0;) {
    const std::size_t want = count - done < batch ? count - done : batch;
    const ssize_t got = ::pread(fd, entries, want * sizeof entries[0],
                                static_cast<off_t>((first + done) * sizeof entries[0]));
    if (got <= 0 || static_cast<std::size_t>(got) % sizeof entries[0] != 0) {
      error = got < 0 ? errno : EIO;
      break;
    }
    const std::size_t n = static_cast<std::size_t>(got) / sizeof entries[0];
    for (std::size_t i = 0; i < n; ++i) {
      if ((entries[i] >> 62) != 0) touched[(done + i) / per_page] = 1;
    }
    done += n;
  }
  ::close(fd);
  return error == 0 ? status{} : status::failure(error);
}

}  // namespace
#endif

status touched_pages(const void* address, std::size_t bytes, unsigned char* touched) noexcept {
  // mincore answers per system page; with a larger page_size() (MEMKIT_PAGE_SIZE) each of ours is
  // touched when any of its system pages is, asked one of ours at a time. For a file mapping's page
  // the process never wrote, mincore says whether the file's page is in memory (then it is read:
  // a cautious answer; the bytes are the file's, not the program's).
  const std::size_t page = page_size();
  const std::size_t per_page = page / protection_granularity();  // at most 1 MiB / 4 KiB
  unsigned char system_pages[256];
  unsigned char* answer = per_page == 1 ? touched : system_pages;
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
      for (std::size_t j = 0; j < (length + protection_granularity() - 1) / protection_granularity(); ++j) any |= answer[j];
      touched[i] = any;
    }
  }
  for (std::size_t i = 0, n = (bytes + page - 1) / page; i < n; ++i) touched[i] &= 1;
#if defined(__linux__)
  return add_present_or_swapped(reinterpret_cast<std::uintptr_t>(address), bytes, touched);
#else
  return {};  // no portable way to find swapped-out pages: they count as untouched
#endif
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
