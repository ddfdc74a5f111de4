// Stack capture with _Unwind_Backtrace and symbolization with dladdr; see
// include/memkit/detail/stack_trace.hpp.
#include "memkit/detail/stack_trace.hpp"

#include <dlfcn.h>
#include <unistd.h>
#include <unwind.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace memkit::detail {
namespace {

// Set while this thread unwinds: the unwinder may allocate on its first use, and an allocator in
// debug mode would capture again from inside that allocation.
thread_local bool capturing = false;

struct walk_state {
  void** frames;
  std::size_t max_frames;
  std::size_t skip;
  std::size_t count;
};

_Unwind_Reason_Code on_frame(struct _Unwind_Context* context, void* argument) {
  auto* state = static_cast<walk_state*>(argument);
  const std::uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0) return _URC_END_OF_STACK;
  if (state->skip != 0) {
    --state->skip;
    return _URC_NO_REASON;
  }
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
  // +1: the first frame _Unwind_Backtrace reports is this function itself.
  walk_state state{frames, max_frames, skip + 1, 0};
  _Unwind_Backtrace(on_frame, &state);
  capturing = false;
  return state.count;
}

void print_stack_trace(int fd, void* const* frames, std::size_t count) noexcept {
  if (count == 0) {
    static const char none[] = "    (no stack trace captured)\n";
    write_all(fd, none, sizeof none - 1);
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    char line[512];
    int length = 0;
    // A return address points after the call; look up the byte before it so a call that ends a
    // function is attributed to that function.
    const auto address = reinterpret_cast<std::uintptr_t>(frames[i]);
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(address - 1), &info) != 0) {
      const char* object = info.dli_fname != nullptr ? info.dli_fname : "?";
      if (const char* slash = std::strrchr(object, '/')) object = slash + 1;
      if (info.dli_sname != nullptr) {
        length = std::snprintf(line, sizeof line, "    #%zu 0x%zx %s+0x%zx (%s)\n", i,
                               static_cast<std::size_t>(address), info.dli_sname,
                               static_cast<std::size_t>(address -
                                                        reinterpret_cast<std::uintptr_t>(info.dli_saddr)),
                               object);
      } else {
        length = std::snprintf(line, sizeof line, "    #%zu 0x%zx (%s+0x%zx)\n", i,
                               static_cast<std::size_t>(address), object,
                               static_cast<std::size_t>(address -
                                                        reinterpret_cast<std::uintptr_t>(info.dli_fbase)));
      }
    } else {
      length = std::snprintf(line, sizeof line, "    #%zu 0x%zx\n", i, static_cast<std::size_t>(address));
    }
    if (length > 0) {
      write_all(fd, line, static_cast<std::size_t>(length) < sizeof line ? static_cast<std::size_t>(length)
                                                                            : sizeof line - 1);
    }
  }
}

}  // namespace memkit::detail
