// Stack capture and printing; see include/memkit/detail/stack_trace.hpp (symbolizing is in
// src/symbolizer.cpp). The platform's unwinder is behind src/os/symbols.hpp.
#include "memkit/detail/stack_trace.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "os/symbols.hpp"

namespace memkit::detail {
namespace {

// Set while this thread unwinds: the unwinder may allocate on its first use, and an allocator in
// debug mode would capture again from inside that allocation.
thread_local bool capturing = false;
// set_capture_origin's address, on this thread.
constinit thread_local const void* capture_origin = nullptr;

constexpr std::size_t kept_frames_limit = 80;  // frames skipped + kept, per capture

#if defined(MEMKIT_MALLOC_SHARED)
// The most leading frames of the drop-in's own code a capture has met so far (capture_stack_trace).
std::atomic<std::size_t> own_frames_seen{2};
#endif

using os::symbols::write_all;

}  // namespace

std::size_t capture_stack_trace(void** frames, std::size_t max_frames, std::size_t skip) noexcept {
  if (max_frames == 0 || capturing) return 0;
  capturing = true;
  void* buffer[kept_frames_limit];
  std::size_t got = 0;
  std::size_t first = 0;  // the program's first frame in buffer
#if defined(MEMKIT_MALLOC_SHARED)
  // In the drop-in library (libmemkit_malloc.so) every frame of the allocator lies in the library's
  // own code, while the program's never does. Leading frames in that range are dropped instead of a
  // fixed count of them, which link-time inlining and tail calls change from build to build and the
  // entry points from one another. The unwinder goes as far as the room asked for: the most own
  // frames seen so far beyond the frames kept; a capture that meets more, and so kept fewer of the
  // program's frames than it could, runs again with room for them.
  (void)skip;
  const os::symbols::code_range own = os::symbols::own_code();
  std::size_t room = own_frames_seen.load(std::memory_order_relaxed);
  for (;;) {
    // The first frame os::symbols::capture reports is this function: room for it too.
    const std::size_t wanted = std::min(max_frames + room + 1, kept_frames_limit);
    got = os::symbols::capture(buffer, wanted);
    first = std::min<std::size_t>(1, got);
    while (first < got && own.contains(buffer[first])) ++first;
    if (got < wanted || got - first >= max_frames || wanted == kept_frames_limit) break;
    room = first - 1;
    std::size_t seen = own_frames_seen.load(std::memory_order_relaxed);
    while (room > seen && !own_frames_seen.compare_exchange_weak(seen, room, std::memory_order_relaxed)) {
    }
  }
#else
  // A few frames of room: the entry's caller may lie further out than the count says.
  constexpr std::size_t own_frames_allowance = 8;
  // The first frame os::symbols::capture reports is this function: skip it too.
  const std::size_t wanted = std::min(max_frames + own_frames_allowance + skip + 1, kept_frames_limit);
  got = os::symbols::capture(buffer, wanted);
  first = std::min(skip + 1, got);
  if (capture_origin != nullptr) {
    for (std::size_t i = 1; i < got && i <= skip + 1 + own_frames_allowance; ++i) {
      if (buffer[i] == capture_origin) {
        first = i;
        break;
      }
    }
  }
#endif
  std::size_t count = 0;
  for (std::size_t i = first; i < got && count < max_frames; ++i) frames[count++] = buffer[i];
  capturing = false;
  return count;
}

void set_capture_origin(const void* return_address) noexcept { capture_origin = return_address; }

namespace {

// Collects a trace's text and hands it on in few pieces: a leak report prints thousands of
// traces, and a system call per piece of a line cost more than symbolizing them.
class trace_writer {
 public:
  trace_writer(text_sink sink, void* context) noexcept : sink_(sink), context_(context) {}
  ~trace_writer() { flush(); }
  trace_writer(const trace_writer&) = delete;
  trace_writer& operator=(const trace_writer&) = delete;

  void text(const char* piece, std::size_t length) noexcept {
    if (length > sizeof buffer_ - used_) flush();
    if (length > sizeof buffer_) {  // a name longer than the buffer goes out on its own
      sink_(context_, piece, length);
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
    if (used_ != 0) sink_(context_, buffer_, used_);
    used_ = 0;
  }

 private:
  text_sink sink_;
  void* context_;
  std::size_t used_ = 0;
  char buffer_[4096];
};

void to_descriptor(void* fd, const char* text, std::size_t length) noexcept {
  write_all(static_cast<int>(reinterpret_cast<std::intptr_t>(fd)), text, length);
}

}  // namespace

void print_stack_trace(int fd, void* const* frames, std::size_t count) noexcept {
  print_stack_trace(&to_descriptor, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)), frames, count);
}

void print_stack_trace(text_sink sink, void* context, void* const* frames, std::size_t count) noexcept {
  trace_writer out(sink, context);
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
