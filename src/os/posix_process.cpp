// The os layer's view of the process's own address space on POSIX systems (src/os/process.hpp):
// its regions, copies and probes that do not fault, which pages were ever touched, the number of
// threads, and the other threads held stopped, as debug mode's leak scan needs them. Nothing here
// calls malloc.
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#if defined(__linux__)
#include <elf.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <new>
#endif

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

// ---- stopped_threads: a tracer task stops the other threads --------------------------------------
//
// The calling thread starts a task that shares its memory but is not one of its threads (clone
// without CLONE_THREAD: a thread cannot trace its own process's threads), allows it to trace the
// process (Yama's PR_SET_PTRACER), and waits on a futex. The tracer lists /proc/PID/task, seizes
// and interrupts each thread but the caller, waits until it stops and reads its registers, and
// lists again until a pass finds no new thread (one not stopped yet may have started another).
// It then reports "stopped" and waits for "resume", detaches every thread (passing on a signal
// that arrived meanwhile) and exits; the caller reaps it. The tracer runs on a stack of its own
// but with the caller's thread pointer, so it makes raw system calls only (raw()) and touches no
// thread-local state, errno included. Under ThreadSanitizer, which cannot follow such a task,
// stop() fails with ENOSYS.
namespace {

#if MEMKIT_HAS_TSAN
#define MEMKIT_OS_NO_STOPPED_THREADS 1
#endif
#if !defined(__x86_64__) && !defined(__aarch64__)
#define MEMKIT_OS_NO_STOPPED_THREADS 1  // raw() and the stack pointer are written for x86-64 and AArch64
#endif

#ifndef MEMKIT_OS_NO_STOPPED_THREADS

#define MEMKIT_OS_TRACER __attribute__((no_sanitize("address", "undefined")))

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
  int tracer_pid;
  std::size_t count;
  std::size_t bytes;  // of the whole mapping: this header, the slots, the tracer's stack
  stopped_slot* slots() noexcept { return reinterpret_cast<stopped_slot*>(this + 1); }
};
static_assert(sizeof(stop_state) % alignof(stopped_slot) == 0);

constexpr std::size_t stop_capacity = 4096;  // threads; more and stop() fails (E2BIG)
constexpr std::size_t tracer_stack_bytes = std::size_t{64} << 10;
constexpr long per_thread_wait_ns = 2'000'000'000;  // a thread not stopped by then: ETIMEDOUT

// A system call without the C library: the result, or minus the error (no errno: the tracer's
// would be the caller's, which the caller's own calls write meanwhile).
MEMKIT_OS_TRACER long raw(long number, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) noexcept {
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

MEMKIT_OS_TRACER void futex_wait(std::atomic<int>& word, int value, long timeout_ns) noexcept {
  timespec timeout{timeout_ns / 1'000'000'000, timeout_ns % 1'000'000'000};
  (void)raw(SYS_futex, reinterpret_cast<long>(&word), FUTEX_WAIT, value, timeout_ns > 0 ? reinterpret_cast<long>(&timeout) : 0);
}

MEMKIT_OS_TRACER void futex_wake(std::atomic<int>& word) noexcept {
  (void)raw(SYS_futex, reinterpret_cast<long>(&word), FUTEX_WAKE, 1 << 30);
}

MEMKIT_OS_TRACER std::uintptr_t stack_pointer_of(const user_regs_struct& r) noexcept {
#if defined(__x86_64__)
  return static_cast<std::uintptr_t>(r.rsp);
#else
  return static_cast<std::uintptr_t>(r.sp);
#endif
}

// Waits until `tid`, just interrupted, stops: 1 when it did (its slot filled), 0 when it exited
// meanwhile, else a negative error.
MEMKIT_OS_TRACER long wait_for_stop(stopped_slot& slot) noexcept {
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
MEMKIT_OS_TRACER std::size_t append_number(char* path, std::size_t n, int value) noexcept {
  char digits[16];
  std::size_t d = 0;
  for (; value > 0; value /= 10) digits[d++] = static_cast<char>('0' + value % 10);
  while (d > 0) path[n++] = digits[--d];
  return n;
}

// Reads the start of /proc/PID/task/TID/`name` into `text` (at most `size` - 1 bytes, then a 0):
// the bytes read, or minus the error.
MEMKIT_OS_TRACER long read_task_file(int process_id, int tid, const char* name, char* text, std::size_t size) noexcept {
  char path[64] = "/proc/";
  std::size_t n = append_number(path, 6, process_id);
  std::memcpy(path + n, "/task/", 6);
  n = append_number(path, n + 6, tid);
  path[n++] = '/';
  for (; *name != '\0' && n + 1 < sizeof path; ++name) path[n++] = *name;
  path[n] = '\0';
  const long fd = raw(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fd;
  const long got = raw(SYS_read, fd, reinterpret_cast<long>(text), static_cast<long>(size - 1));
  (void)raw(SYS_close, fd);
  text[got > 0 ? got : 0] = '\0';
  return got;
}

// Whether thread `tid` has exited and waits to be reaped (a zombie: the main thread after
// pthread_exit while others run), which ptrace refuses (EPERM) and which runs nothing: its state
// in /proc/PID/task/TID/stat, after the command's name in parentheses.
MEMKIT_OS_TRACER bool exited(int process_id, int tid) noexcept {
  char text[512];
  const long got = read_task_file(process_id, tid, "stat", text, sizeof text);
  if (got == -ENOENT) return true;
  if (got <= 0) return false;
  const char* state = nullptr;
  for (long i = 0; i < got; ++i) {
    if (text[i] == ')') state = text + i;
  }
  return state != nullptr && state + 2 < text + got && (state[2] == 'Z' || state[2] == 'X');
}

// Calls on_task(tid) for every thread of process `process_id` but `caller_tid`, listed from
// /proc/PID/task, until it returns a negative error; returns that error, or 0.
template <class OnTask>
MEMKIT_OS_TRACER long for_each_task(int process_id, int caller_tid, OnTask on_task) noexcept {
  char path[64] = "/proc/";
  const std::size_t n = append_number(path, 6, process_id);
  std::memcpy(path + n, "/task", 6);
  const long fd = raw(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fd;
  long error = 0;
  alignas(8) char buffer[4096];
  while (error >= 0) {
    const long got = raw(SYS_getdents64, fd, reinterpret_cast<long>(buffer), sizeof buffer);
    if (got <= 0) {
      if (got < 0) error = got;
      break;
    }
    for (long at = 0; at < got && error >= 0;) {
      const auto* entry = reinterpret_cast<const dirent64_header*>(buffer + at);
      at += entry->length;
      int tid = 0;
      const char* c = entry->name;
      for (; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + (*c - '0');
      if (*c != '\0' || tid == 0 || tid == caller_tid) continue;
      error = on_task(tid);
    }
  }
  (void)raw(SYS_close, fd);
  return error < 0 ? error : 0;
}

// One pass over /proc/PID/task: seizes every thread not stopped yet. 1 when it found one, 0 when
// none, else a negative error.
MEMKIT_OS_TRACER long stop_new_threads(stop_state& st) noexcept {
  long found = 0;
  const long error = for_each_task(st.process_id, st.caller_tid, [&](int tid) MEMKIT_OS_TRACER -> long {
    for (std::size_t i = 0; i < st.count; ++i) {
      if (st.slots()[i].tid == tid) return 0;
    }
    if (st.count == stop_capacity) return -E2BIG;
    const long seized = raw(SYS_ptrace, PTRACE_SEIZE, tid, 0, 0);
    if (seized == -ESRCH || (seized == -EPERM && exited(st.process_id, tid))) return 0;  // it exited
    if (seized < 0) return seized;
    stopped_slot& slot = st.slots()[st.count++];
    slot.tid = tid;
    slot.signal = 0;
    found = 1;
    long stopped = raw(SYS_ptrace, PTRACE_INTERRUPT, tid, 0, 0);
    if (stopped == 0) stopped = wait_for_stop(slot);
    if (stopped == 0 || stopped == -ESRCH) --st.count;  // gone, nothing to let go
    return stopped < 0 && stopped != -ESRCH ? stopped : 0;
  });
  return error < 0 ? error : found;
}

MEMKIT_OS_TRACER int tracer_main(void* argument) noexcept {
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

// ---- stopped_threads, where ptrace is refused: a signal handler holds each thread ---------------
//
// The caller installs hold_on_signal() for a signal the program leaves at its default action and
// no thread blocks (free_stop_signal()), lists /proc/PID/task and sends each other thread the
// signal (tgkill); each handler finds its slot by its thread id, saves the registers the signal
// interrupted and waits on the phase word until resume(); the caller waits until every thread
// listed has stopped (or exited), and lists again until a pass finds no new thread. The state is static and its slots stay mapped
// once mapped: a handler that runs late (its thread took the signal after a failed stop gave up)
// finds the phase not "stopping" and returns at once, touching nothing else. `inside` counts the
// handlers running: resume() waits for them to leave before it gives the signal back, and stop()
// refuses (EBUSY) while one of an earlier stop has not left. Each handler makes raw system calls
// only, so errno stays as it was.
enum signal_phase : int { signal_idle, signal_stopping, signal_resuming };

struct signal_slot {
  std::atomic<int> tid;      // 0: the thread exited before it stopped
  std::atomic<int> stopped;  // set by the thread's handler once `registers` hold its registers
  std::uintptr_t stack_pointer;
  std::uintptr_t registers[34];  // the general-purpose registers of the interrupted context
};

struct signal_stop_state {
  std::atomic<int> phase;          // a futex word: the handlers wait while it reads signal_stopping
  std::atomic<int> inside;         // handlers running; a futex word
  std::atomic<int> stopped;        // threads stopped in the handler; a futex word
  std::atomic<std::size_t> count;  // slots in use (each written before its thread is signalled)
  std::atomic<bool> busy;          // a stop by signal holds the state
  int process_id;
  int signal;
  struct sigaction previous;  // the program's action for `signal`, given back by resume()
  signal_slot* slots;         // stop_capacity of them, mapped once
  std::size_t slot_bytes;
};
signal_stop_state signal_stop{};

MEMKIT_OS_TRACER void save_registers(signal_slot& slot, const void* context) noexcept {
  const auto& machine = static_cast<const ucontext_t*>(context)->uc_mcontext;
#if defined(__x86_64__)
  static_assert(sizeof machine.gregs <= sizeof slot.registers);
  std::memcpy(slot.registers, machine.gregs, sizeof machine.gregs);
  slot.stack_pointer = static_cast<std::uintptr_t>(machine.gregs[REG_RSP]);
#else
  static_assert(sizeof machine.regs + 2 * sizeof(std::uintptr_t) <= sizeof slot.registers);
  std::memcpy(slot.registers, machine.regs, sizeof machine.regs);
  slot.registers[31] = static_cast<std::uintptr_t>(machine.sp);
  slot.registers[32] = static_cast<std::uintptr_t>(machine.pc);
  slot.stack_pointer = static_cast<std::uintptr_t>(machine.sp);
#endif
}

MEMKIT_OS_TRACER void hold_on_signal(int, siginfo_t* info, void* context) noexcept {
  signal_stop_state& st = signal_stop;
  st.inside.fetch_add(1);
  if (st.phase.load() == signal_stopping && info->si_code == SI_TKILL && info->si_pid == st.process_id) {
    const int tid = static_cast<int>(raw(SYS_gettid));
    const std::size_t count = st.count.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < count; ++i) {
      signal_slot& slot = st.slots[i];
      if (slot.tid.load(std::memory_order_relaxed) != tid || slot.stopped.load(std::memory_order_relaxed) != 0) continue;
      save_registers(slot, context);
      slot.stopped.store(1, std::memory_order_release);
      st.stopped.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(st.stopped);
      while (st.phase.load(std::memory_order_acquire) == signal_stopping) futex_wait(st.phase, signal_stopping, 0);
      break;
    }
  }
  st.inside.fetch_sub(1);
  futex_wake(st.inside);
}

long monotonic_ns() noexcept {
  timespec now{};
  (void)::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000L + now.tv_nsec;
}

// The signals thread `tid` blocks now (bit n - 1 for signal n): the SigBlk mask of
// /proc/PID/task/TID/status; none when it cannot be read (the thread exited).
std::uint64_t blocked_signals(int process_id, int tid) noexcept {
  char text[4096];
  if (read_task_file(process_id, tid, "status", text, sizeof text) <= 0) return 0;
  const char* at = std::strstr(text, "\nSigBlk:");
  if (at == nullptr) return 0;
  std::uint64_t mask = 0;
  for (at += 8; *at == ' ' || *at == '\t'; ++at) {
  }
  for (;; ++at) {
    const char c = *at;
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) break;
    mask = mask << 4 | static_cast<std::uint64_t>(digit);
  }
  return mask;
}

bool blocks_signal(int process_id, int tid, int signal) noexcept {
  return signal <= 64 && ((blocked_signals(process_id, tid) >> (signal - 1)) & 1) != 0;
}

// The signal to stop threads with: one the program leaves at its default action (a program that
// used it would have set a handler or ignored it) and no thread but the caller blocks (a thread
// that blocks it would not stop, and might take it later from sigwait or a signalfd as the
// program's). SIGURG or SIGWINCH, whose default is to be ignored, so that one left pending after
// resume() harms nothing, and which debuggers pass on without stopping (gdb's defaults); else the
// highest of the top eight real-time signals; 0 if none is free.
int free_stop_signal(int process_id, int caller_tid, struct sigaction& previous) noexcept {
  std::uint64_t blocked = 0;
  (void)for_each_task(process_id, caller_tid, [&](int tid) -> long {
    blocked |= blocked_signals(process_id, tid);
    return 0;
  });
  const auto is_free = [&](int signal) {
    return signal <= 64 && ((blocked >> (signal - 1)) & 1) == 0 && ::sigaction(signal, nullptr, &previous) == 0 &&
           (previous.sa_flags & SA_SIGINFO) == 0 && previous.sa_handler == SIG_DFL;
  };
  for (const int signal : {SIGURG, SIGWINCH}) {
    if (is_free(signal)) return signal;
  }
  for (int signal = SIGRTMAX; signal > SIGRTMAX - 8 && signal >= SIGRTMIN; --signal) {
    if (is_free(signal)) return signal;
  }
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
  status stopped = stop_by_tracing();
  if (!stopped && stopped.error() == EPERM && stop_by_signal()) stopped = {};
  errno = saved_errno;
  return stopped;
#endif
}

#ifndef MEMKIT_OS_NO_STOPPED_THREADS
status stopped_threads::stop_by_tracing() noexcept {
  const std::size_t page = page_size();  // map()'s unit, which MEMKIT_PAGE_SIZE may make larger
  const std::size_t bytes =
      (sizeof(stop_state) + stop_capacity * sizeof(stopped_slot) + tracer_stack_bytes + page - 1) & ~(page - 1);
  auto mapped = map(bytes);
  if (!mapped) return status::failure(mapped.error());
  auto* st = new (mapped.value()) stop_state{};
  st->phase.store(starting, std::memory_order_relaxed);
  st->process_id = static_cast<int>(::getpid());
  st->caller_tid = static_cast<int>(::syscall(SYS_gettid));
  st->bytes = bytes;
  auto* stack_top = static_cast<unsigned char*>(mapped.value()) + bytes;
  const int tracer = ::clone(tracer_main, stack_top, CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED, st);
  if (tracer < 0) {
    const int error = errno;
    (void)release(mapped.value(), bytes);
    return status::failure(error);
  }
  st->tracer_pid = tracer;
  // Where Yama allows tracing only by ancestors, allow the tracer; elsewhere this fails (EINVAL)
  // and changes nothing.
  const bool allowed = ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(tracer), 0, 0, 0) == 0;
  st->phase.store(go, std::memory_order_release);
  futex_wake(st->phase);
  int phase = go;
  while ((phase = st->phase.load(std::memory_order_acquire)) == go) {
    futex_wait(st->phase, go, 100'000'000);
    int status = 0;
    if (st->phase.load(std::memory_order_acquire) == go &&
        raw(SYS_wait4, tracer, reinterpret_cast<long>(&status), __WALL | WNOHANG, 0) == tracer) {
      phase = stop_failed;  // the tracer died (its threads, if any, let go with it)
      st->error = ECHILD;
      st->tracer_pid = 0;
      break;
    }
  }
  if (allowed) (void)::prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  if (phase != all_stopped) {
    const int error = st->error != 0 ? st->error : EAGAIN;
    int status = 0;
    if (st->tracer_pid != 0) {
      while (raw(SYS_wait4, tracer, reinterpret_cast<long>(&status), __WALL, 0) == -EINTR) {
      }
    }
    (void)release(mapped.value(), bytes);
    return status::failure(error);
  }
  state_ = st;
  return {};
}

status stopped_threads::stop_by_signal() noexcept {
  signal_stop_state& st = signal_stop;
  if (st.busy.exchange(true, std::memory_order_acquire)) return status::failure(EBUSY);
  const auto give_up = [](int error) {
    signal_stop.busy.store(false, std::memory_order_release);
    return status::failure(error);
  };
  if (st.inside.load() != 0) return give_up(EBUSY);  // a handler of an earlier stop still runs
  if (st.slots == nullptr) {
    const std::size_t page = page_size();
    const std::size_t bytes = (stop_capacity * sizeof(signal_slot) + page - 1) & ~(page - 1);
    auto mapped = map(bytes);
    if (!mapped) return give_up(mapped.error());
    st.slots = static_cast<signal_slot*>(mapped.value());
    st.slot_bytes = bytes;
  }
  st.process_id = static_cast<int>(::getpid());
  const int caller_tid = static_cast<int>(::syscall(SYS_gettid));
  st.signal = free_stop_signal(st.process_id, caller_tid, st.previous);
  if (st.signal == 0) return give_up(EPERM);
  st.count.store(0, std::memory_order_relaxed);
  st.stopped.store(0, std::memory_order_relaxed);
  st.phase.store(signal_stopping);
  struct sigaction action {};
  action.sa_sigaction = hold_on_signal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&action.sa_mask);  // no handler of the program's runs in a held thread
  if (::sigaction(st.signal, &action, nullptr) != 0) {
    st.phase.store(signal_idle);
    return give_up(errno);
  }
  state_ = &st;
  by_signal_ = true;
  // Sends the signal to every thread not signalled yet; then waits until each has stopped or
  // exited. A thread that blocks the signal fails the stop once a short wait shows it still does
  // (one that is starting blocks every signal for a few microseconds).
  long error = 0;
  for (int pass = 0; error == 0; ++pass) {
    bool found = false;
    error = for_each_task(st.process_id, caller_tid, [&](int tid) -> long {
      const std::size_t count = st.count.load(std::memory_order_relaxed);
      for (std::size_t i = 0; i < count; ++i) {
        if (st.slots[i].tid.load(std::memory_order_relaxed) == tid) return 0;
      }
      if (exited(st.process_id, tid)) return 0;
      if (count == stop_capacity) return -E2BIG;
      signal_slot& slot = st.slots[count];
      slot.tid.store(tid, std::memory_order_relaxed);
      slot.stopped.store(0, std::memory_order_relaxed);
      st.count.store(count + 1, std::memory_order_release);
      found = true;
      const long sent = raw(SYS_tgkill, st.process_id, tid, st.signal);
      if (sent == -ESRCH) slot.tid.store(0, std::memory_order_relaxed);  // it exited
      return sent == -ESRCH ? 0 : sent;
    });
    if (error != 0 || !found) break;
    if (pass == 64) {
      error = -EAGAIN;  // threads keep starting threads
      break;
    }
    // Time waited, counted in steps of at most 50 ms: a debugger that holds the whole process
    // (it stops at the signal, then the user continues) does not run the clock out.
    long waited_ns = 0;
    for (long last_ns = monotonic_ns();;) {
      const long now_ns = monotonic_ns();
      waited_ns += std::min(now_ns - last_ns, 50'000'000L);
      last_ns = now_ns;
      // Read before the slots: a thread that stops after this changes the word, so the wait
      // below returns at once instead of sleeping through its wake-up.
      const int stopped = st.stopped.load(std::memory_order_acquire);
      std::size_t waiting = 0;
      const std::size_t count = st.count.load(std::memory_order_relaxed);
      for (std::size_t i = 0; i < count; ++i) {
        signal_slot& slot = st.slots[i];
        const int tid = slot.tid.load(std::memory_order_relaxed);
        if (tid == 0 || slot.stopped.load(std::memory_order_acquire) != 0) continue;
        if (waited_ns >= 20'000'000 && exited(st.process_id, tid)) {
          slot.tid.store(0, std::memory_order_relaxed);
          continue;
        }
        if (waited_ns >= 20'000'000 && blocks_signal(st.process_id, tid, st.signal)) error = -EPERM;
        ++waiting;
      }
      if (waiting == 0 || error != 0) break;
      if (waited_ns >= per_thread_wait_ns) {
        error = -ETIMEDOUT;
        break;
      }
      futex_wait(st.stopped, stopped, 10'000'000);
    }
  }
  if (error != 0) {
    resume();
    return status::failure(static_cast<int>(-error));
  }
  // The threads that exited leave no slot: count() and at() see the stopped ones only.
  std::size_t kept = 0;
  const std::size_t count = st.count.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < count; ++i) {
    signal_slot& slot = st.slots[i];
    if (slot.tid.load(std::memory_order_relaxed) == 0) continue;
    if (kept != i) {
      st.slots[kept].tid.store(slot.tid.load(std::memory_order_relaxed), std::memory_order_relaxed);
      st.slots[kept].stack_pointer = slot.stack_pointer;
      std::memcpy(st.slots[kept].registers, slot.registers, sizeof slot.registers);
    }
    ++kept;
  }
  st.count.store(kept, std::memory_order_relaxed);
  return {};
}
#endif

void stopped_threads::resume() noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ == nullptr) return;
  const int saved_errno = errno;
  if (by_signal_) {
    signal_stop_state& st = signal_stop;
    st.phase.store(signal_resuming);
    futex_wake(st.phase);
    // The held threads leave their handlers; a thread a debugger holds there is not waited for
    // past two seconds (its handler touches nothing of the state once the phase has changed).
    for (long waited_ns = 0; waited_ns < per_thread_wait_ns; waited_ns += 10'000'000) {
      const int inside = st.inside.load();
      if (inside == 0) break;
      futex_wait(st.inside, inside, 10'000'000);
    }
    // Ignoring the signal first drops any still pending (a thread that blocked it, or exited
    // with it pending), which a real-time signal's default action would turn into the process's
    // death.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    (void)::sigaction(st.signal, &ignore, nullptr);
    (void)::sigaction(st.signal, &st.previous, nullptr);
    st.phase.store(signal_idle);
    st.busy.store(false, std::memory_order_release);
    by_signal_ = false;
    state_ = nullptr;
    errno = saved_errno;
    return;
  }
  auto* st = static_cast<stop_state*>(state_);
  st->phase.store(resuming, std::memory_order_release);
  futex_wake(st->phase);
  int status = 0;
  while (raw(SYS_wait4, st->tracer_pid, reinterpret_cast<long>(&status), __WALL, 0) == -EINTR) {
  }
  (void)release(st, st->bytes);
  state_ = nullptr;
  errno = saved_errno;
#endif
}

std::size_t stopped_threads::count() const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ != nullptr && by_signal_) return signal_stop.count.load(std::memory_order_relaxed);
  if (state_ != nullptr) return static_cast<const stop_state*>(state_)->count;
#endif
  return 0;
}

stopped_threads::thread stopped_threads::at(std::size_t i) const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (by_signal_) {
    const signal_slot& slot = signal_stop.slots[i];
    return {slot.stack_pointer, slot.registers, sizeof slot.registers};
  }
  const stopped_slot& slot = static_cast<stop_state*>(state_)->slots()[i];
  return {stack_pointer_of(slot.registers), &slot.registers, sizeof slot.registers};
#else
  (void)i;
  return {};
#endif
}

// The memory that holds the registers: the tracer's mapping, or the signal's slots.
std::uintptr_t stopped_threads::storage_begin() const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ != nullptr && by_signal_) return reinterpret_cast<std::uintptr_t>(signal_stop.slots);
#endif
  return reinterpret_cast<std::uintptr_t>(state_);
}

std::uintptr_t stopped_threads::storage_end() const noexcept {
#ifndef MEMKIT_OS_NO_STOPPED_THREADS
  if (state_ != nullptr && by_signal_) return storage_begin() + signal_stop.slot_bytes;
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

result<std::size_t> readable_prefix(const void*, std::size_t) noexcept { return result<std::size_t>::failure(ENOSYS); }

result<std::size_t> thread_count() noexcept { return result<std::size_t>::failure(ENOSYS); }

status stopped_threads::stop() noexcept { return status::failure(ENOSYS); }
void stopped_threads::resume() noexcept {}
std::size_t stopped_threads::count() const noexcept { return 0; }
stopped_threads::thread stopped_threads::at(std::size_t) const noexcept { return {}; }
std::uintptr_t stopped_threads::storage_begin() const noexcept { return 0; }
std::uintptr_t stopped_threads::storage_end() const noexcept { return 0; }

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
