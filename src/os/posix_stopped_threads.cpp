// The os layer's stopped_threads on POSIX systems (src/os/process.hpp): the other threads of the
// process held stopped while debug mode's leak scan reads the heap, by a tracer task (ptrace) or,
// where ptrace is refused, by a signal handler. Linux only; elsewhere stop() fails with ENOSYS.
// Nothing here calls malloc.
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "memkit/detail/config.hpp"
#include "memkit/os.hpp"
#include "platform.hpp"
#include "process.hpp"

#if defined(__linux__)
#include <elf.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#endif

namespace memkit::os::process {

#if defined(__linux__)

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
    std::uint64_t waited_ms = 0;
    for (std::uint64_t last_ms = monotonic_ms();;) {
      const std::uint64_t now_ms = monotonic_ms();
      waited_ms += std::min<std::uint64_t>(now_ms - last_ms, 50);
      last_ms = now_ms;
      // Read before the slots: a thread that stops after this changes the word, so the wait
      // below returns at once instead of sleeping through its wake-up.
      const int stopped = st.stopped.load(std::memory_order_acquire);
      std::size_t waiting = 0;
      const std::size_t count = st.count.load(std::memory_order_relaxed);
      for (std::size_t i = 0; i < count; ++i) {
        signal_slot& slot = st.slots[i];
        const int tid = slot.tid.load(std::memory_order_relaxed);
        if (tid == 0 || slot.stopped.load(std::memory_order_acquire) != 0) continue;
        if (waited_ms >= 20 && exited(st.process_id, tid)) {
          slot.tid.store(0, std::memory_order_relaxed);
          continue;
        }
        if (waited_ms >= 20 && blocks_signal(st.process_id, tid, st.signal)) error = -EPERM;
        ++waiting;
      }
      if (waiting == 0 || error != 0) break;
      if (waited_ms >= per_thread_wait_ns / 1'000'000) {
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
    const std::uint64_t start_ms = monotonic_ms();
    while (monotonic_ms() - start_ms < per_thread_wait_ns / 1'000'000) {
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

status stopped_threads::stop() noexcept { return status::failure(ENOSYS); }
void stopped_threads::resume() noexcept {}
std::size_t stopped_threads::count() const noexcept { return 0; }
stopped_threads::thread stopped_threads::at(std::size_t) const noexcept { return {}; }
std::uintptr_t stopped_threads::storage_begin() const noexcept { return 0; }
std::uintptr_t stopped_threads::storage_end() const noexcept { return 0; }

#endif

}  // namespace memkit::os::process
