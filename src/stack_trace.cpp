// Stack capture and printing; see include/memkit/detail/stack_trace.hpp (symbolizing is in
// src/symbolizer.cpp).
//
// The unwinder: libunwind's unw_backtrace when libunwind.so.8 is installed (about 10 ns per frame
// with its cache), else the compiler runtime's _Unwind_Backtrace (a few hundred ns per frame: it
// looks up the unwind tables of every frame again). libunwind is opened with dlopen, privately
// (RTLD_LOCAL), on the first capture, not linked: linking it would let its _Unwind_* symbols take
// over C++ exception handling in the whole program, and its static archive is not
// position-independent. That first dlopen may allocate once; the re-entrancy guard below makes
// an allocator that captures from inside that allocation fall back to no trace.
#include "memkit/detail/stack_trace.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace memkit::detail {
namespace {

// Set while this thread unwinds: the unwinder may allocate on its first use, and an allocator in
// debug mode would capture again from inside that allocation.
thread_local bool capturing = false;

using backtrace_function = int (*)(void**, int);
std::atomic<backtrace_function> fast_backtrace{nullptr};
std::atomic<int> fast_backtrace_state{0};  // 0: not looked for, 1: looking, 2: done

#if defined(__SANITIZE_THREAD__)
#define MEMKIT_STACK_TRACE_NO_LIBUNWIND 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MEMKIT_STACK_TRACE_NO_LIBUNWIND 1
#endif
#endif

backtrace_function find_fast_backtrace() noexcept {
#if defined(MEMKIT_STACK_TRACE_NO_LIBUNWIND)
  // Under ThreadSanitizer, libunwind's thread-exit destructor locks a mutex after TSan has torn
  // the thread's state down, which crashes the process: use the compiler's unwinder there.
  return nullptr;
#endif
  int state = fast_backtrace_state.load(std::memory_order_acquire);
  if (state == 2) return fast_backtrace.load(std::memory_order_relaxed);
  if (state == 0 && fast_backtrace_state.compare_exchange_strong(state, 1, std::memory_order_acq_rel)) {
    if (void* library = ::dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL)) {
      if (void* symbol = ::dlsym(library, "unw_backtrace")) {
        fast_backtrace.store(reinterpret_cast<backtrace_function>(symbol), std::memory_order_relaxed);
      }
    }
    fast_backtrace_state.store(2, std::memory_order_release);
    return fast_backtrace.load(std::memory_order_relaxed);
  }
  return nullptr;  // another thread is looking: use the slow unwinder meanwhile
}

constexpr std::size_t kept_frames_limit = 80;  // frames skipped + kept, per capture

#if defined(MEMKIT_MALLOC_SHARED)
// In the drop-in library (libmemkit_malloc.so) every frame of the allocator lies in the library's
// own code, while the program's never does. Leading frames in that range are dropped instead of a
// fixed count of them, which link-time inlining and tail calls change from build to build.
struct code_range {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool contains(const void* address) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    return a >= begin && a < end;
  }
};

int find_own_code(dl_phdr_info* info, std::size_t, void* argument) {
  auto* range = static_cast<code_range*>(argument);
  const auto self = reinterpret_cast<std::uintptr_t>(&find_own_code);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD || (segment.p_flags & PF_X) == 0) continue;
    const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (self >= begin && self < begin + segment.p_memsz) {
      *range = {begin, begin + segment.p_memsz};
      return 1;
    }
  }
  return 0;
}

const code_range& own_code() noexcept {
  static const code_range range = [] {
    code_range found;
    ::dl_iterate_phdr(&find_own_code, &found);
    return found;
  }();
  return range;
}
#endif

struct walk_state {
  void** frames;
  std::size_t max_frames;
  std::size_t count;
};

_Unwind_Reason_Code on_frame(struct _Unwind_Context* context, void* argument) {
  auto* state = static_cast<walk_state*>(argument);
  const std::uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0) return _URC_END_OF_STACK;
  if (state->count == state->max_frames) return _URC_END_OF_STACK;
  state->frames[state->count++] = reinterpret_cast<void*>(ip);
  return _URC_NO_REASON;
}

void write_all(int fd, const char* text, std::size_t length) noexcept {
  while (length != 0) {
    const ssize_t written = ::write(fd, text, length);
    if (written <= 0) return;
    text += written;
    length -= static_cast<std::size_t>(written);
  }
}

}  // namespace

std::size_t capture_stack_trace(void** frames, std::size_t max_frames, std::size_t skip) noexcept {
  if (max_frames == 0 || capturing) return 0;
  capturing = true;
#if defined(MEMKIT_MALLOC_SHARED)
  // Room for the allocator's own frames, dropped below by address.
  constexpr std::size_t own_frames_allowance = 16;
  const code_range& own = own_code();
  skip = 0;
#else
  constexpr std::size_t own_frames_allowance = 0;
#endif
  // The first frame either unwinder reports is this function: skip it too.
  void* buffer[kept_frames_limit];
  const std::size_t wanted = std::min(max_frames + own_frames_allowance + skip + 1, kept_frames_limit);
  std::size_t got = 0;
  if (backtrace_function fast = find_fast_backtrace()) {
    const int n = fast(buffer, static_cast<int>(wanted));
    got = n > 0 ? static_cast<std::size_t>(n) : 0;
  } else {
    walk_state state{buffer, wanted, 0};
    _Unwind_Backtrace(on_frame, &state);
    got = state.count;
  }
  std::size_t first = std::min(skip + 1, got);
#if defined(MEMKIT_MALLOC_SHARED)
  while (first < got && own.contains(buffer[first])) ++first;
#endif
  std::size_t count = 0;
  for (std::size_t i = first; i < got && count < max_frames; ++i) frames[count++] = buffer[i];
  capturing = false;
  return count;
}

namespace {

// Collects a trace's text and writes it in few write() calls: a leak report prints thousands of
// traces, and a system call per piece of a line cost more than symbolizing them.
class trace_writer {
 public:
  explicit trace_writer(int fd) noexcept : fd_(fd) {}
  ~trace_writer() { flush(); }
  trace_writer(const trace_writer&) = delete;
  trace_writer& operator=(const trace_writer&) = delete;

  void text(const char* piece, std::size_t length) noexcept {
    if (length > sizeof buffer_ - used_) flush();
    if (length > sizeof buffer_) {  // a name longer than the buffer goes out on its own
      write_all(fd_, piece, length);
      return;
    }
    std::memcpy(buffer_ + used_, piece, length);
    used_ += length;
  }
  void text(const char* piece) noexcept { text(piece, std::strlen(piece)); }
  template <class... Values>
  void format(const char* pattern, Values... values) noexcept {
    char piece[96];
    const int length = std::snprintf(piece, sizeof piece, pattern, values...);
    if (length > 0) text(piece, std::min(static_cast<std::size_t>(length), sizeof piece - 1));
  }
  void flush() noexcept {
    write_all(fd_, buffer_, used_);
    used_ = 0;
  }

 private:
  int fd_;
  std::size_t used_ = 0;
  char buffer_[4096];
};

}  // namespace

void print_stack_trace(int fd, void* const* frames, std::size_t count) noexcept {
  trace_writer out(fd);
  if (count == 0) {
    out.text("    (no stack trace captured)\n");
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    resolved_frame frame;
    const bool known = resolve_stack_frame(frames[i], frame);
    out.format("    #%zu 0x%zx", i, reinterpret_cast<std::size_t>(frames[i]));
    if (known && frame.function != nullptr) {
      out.text(" ");
      out.text(frame.function);
      out.format("+0x%zx", frame.function_offset);
    }
    if (known && frame.file != nullptr) {
      out.text(" at ");
      out.text(frame.file);
      if (frame.line != 0) out.format(":%u", frame.line);
    }
    if (known && frame.object != nullptr) {
      const char* object = frame.object;
      if (const char* slash = std::strrchr(object, '/')) object = slash + 1;
      out.text(" (");
      out.text(object);
      out.format("+0x%zx)", frame.object_offset);
    }
    out.text("\n");
  }
}

}  // namespace memkit::detail
