// The diagnostics module (report.hpp): plain text, misuse reports and the misuse channel.
#include "report.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "memkit/detail/stack_trace.hpp"
#include "os/platform.hpp"

namespace memkit::diagnostics {

void put(int fd, const char* text, std::size_t length) noexcept { (void)os::output(fd, text, length); }

void put(int fd, const char* text) noexcept { put(fd, text, std::strlen(text)); }

void print(int fd, const char* format, ...) noexcept {
  char line[1024];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (length > 0) put(fd, line, static_cast<std::size_t>(length) < sizeof line ? static_cast<std::size_t>(length) : sizeof line - 1);
}

void finish_misuse_report(bool abort_process) noexcept {
  if (abort_process) std::abort();
}

void report_contract_violation(const char* condition, const char* message, const char* file, int line) noexcept {
  print(os::error_stream, "memkit: contract violated: %s (%s) at %s:%d\n", message, condition, file, line);
  finish_misuse_report(true);
  std::abort();  // finish_misuse_report(true) does not return
}

namespace {

// The places whose misuse reports were written: a hash of each report's kind and stacks, in
// an open-addressed table that only grows (no malloc; reports may come from any thread). When it
// is full, further reports are written.
constexpr std::size_t place_slots = 4096;
std::atomic<std::uint64_t> written_places[place_slots];
std::atomic<std::size_t> repeated_reports{0};
std::atomic<std::size_t> repeated_places{0};  // places with at least one repeat left out

// 0: new place, recorded; 1: a repeat (the first one of its place: 2).
int record_place(std::uint64_t key) noexcept {
  for (std::size_t probe = 0; probe < place_slots; ++probe) {
    std::atomic<std::uint64_t>& slot = written_places[(key + probe) % place_slots];
    std::uint64_t seen = slot.load(std::memory_order_acquire);
    if (seen == 0 && slot.compare_exchange_strong(seen, key, std::memory_order_acq_rel)) return 0;
    // A slot holds the key, or the key with its top bit set once a repeat of it was left out.
    if ((seen & ~(std::uint64_t{1} << 63)) == key) {
      if ((seen >> 63) == 0 && slot.compare_exchange_strong(seen, seen | std::uint64_t{1} << 63)) return 2;
      return 1;
    }
  }
  return 0;  // full: written
}

// One misuse report at a time: the lock, the flag of the thread that holds it (a report made while
// writing one, which does not happen, would be written directly), and what the holder holds back
// until it knows whether its report is a repeat: the text, and its stacks' pointers.
std::atomic<bool> misuse_lock{false};
constinit thread_local bool writing_misuse_report = false;
char pending[2048];
std::size_t pending_length = 0;
struct held_stack {
  const char* title;
  void* const* frames;
  std::size_t count;
  bool captured;
};
held_stack held[4];
std::size_t held_count = 0;

// Each report (begin() to end(), or a note) goes out in one write() where it fits this buffer, so
// that reports of several threads, or of several processes appending to one report file (make
// -j2's compilers under memkit-run --report), do not mix within a line or a report. The thread
// that holds it (from begin() to end()) is flagged; a report made meanwhile on that thread (which
// does not happen) is written directly.
constexpr std::size_t output_capacity = 16384;
char output[output_capacity];
std::size_t output_used = 0;
std::atomic<bool> output_lock{false};
constinit thread_local bool holding_output = false;

}  // namespace

report_writer::report_writer(int fd, general_allocator::report_format format, misuse_report misuse) noexcept
    : report_writer(fd, format) {
  if (writing_misuse_report || holding_output) return;
  while (misuse_lock.exchange(true, std::memory_order_acquire)) os::yield_thread();
  writing_misuse_report = true;
  serialized_ = true;
  deciding_ = !misuse.aborts;
  pending_length = 0;
  held_count = 0;
}

report_writer::~report_writer() {
  if (serialized_ && deciding_) decide();  // a report without end()
  release_output();
  if (!serialized_) return;
  writing_misuse_report = false;
  misuse_lock.store(false, std::memory_order_release);
}

void report_writer::hold_output() noexcept {
  if (holds_output_ || holding_output) return;
  while (output_lock.exchange(true, std::memory_order_acquire)) os::yield_thread();
  holding_output = true;
  holds_output_ = true;
  output_used = 0;
}

void report_writer::release_output() noexcept {
  if (!holds_output_) return;
  put(fd_, output, output_used);
  output_used = 0;
  holds_output_ = false;
  holding_output = false;
  output_lock.store(false, std::memory_order_release);
}

void report_writer::emit(const char* s, std::size_t n) noexcept {
  if (!holds_output_) {
    put(fd_, s, n);
    return;
  }
  if (n > output_capacity - output_used) {  // longer than what is left: what is held goes first
    put(fd_, output, output_used);
    output_used = 0;
  }
  if (n > output_capacity) {
    put(fd_, s, n);
    return;
  }
  std::memcpy(output + output_used, s, n);
  output_used += n;
}

void report_writer::write_pending() noexcept {
  deciding_ = false;
  emit(pending, pending_length);
  pending_length = 0;
  const std::size_t stacks = held_count;
  held_count = 0;
  for (std::size_t s = 0; s < stacks; ++s) write_stack(held[s].title, held[s].frames, held[s].count, held[s].captured);
}

void misuse_reports_after_fork_in_child() noexcept {
  writing_misuse_report = false;
  misuse_lock.store(false, std::memory_order_relaxed);
  holding_output = false;
  output_used = 0;
  output_lock.store(false, std::memory_order_relaxed);
}

repeated_misuse repeated_misuse_reports() noexcept {
  return {repeated_reports.load(std::memory_order_relaxed), repeated_places.load(std::memory_order_relaxed)};
}

void report_writer::decide() noexcept {
  deciding_ = false;
  bool captured = held_count != 0;
  std::uint64_t key = 14695981039346656037ull;  // FNV-1a over the kind and every stack's addresses
  for (const char* c = kind_; *c != '\0'; ++c) key = (key ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  for (std::size_t s = 0; s < held_count; ++s) {
    const held_stack& h = held[s];
    captured = captured && h.captured;
    for (std::size_t i = 0; i < h.count; ++i) key = (key ^ reinterpret_cast<std::uintptr_t>(h.frames[i])) * 1099511628211ull;
    key = (key ^ 0xff) * 1099511628211ull;  // the end of a stack
  }
  key = (key & ~(std::uint64_t{1} << 63)) | 1;  // never 0 (an empty slot), top bit free
  const int repeat = captured ? record_place(key) : 0;
  if (repeat != 0) {
    muted_ = true;
    pending_length = 0;
    held_count = 0;
    repeated_reports.fetch_add(1, std::memory_order_relaxed);
    if (repeat == 2) repeated_places.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  write_pending();
}

void report_writer::text(const char* s, std::size_t n) noexcept {
  if (muted_) return;
  if (deciding_) {
    if (pending_length + n <= sizeof pending) {
      std::memcpy(pending + pending_length, s, n);
      pending_length += n;
      return;
    }
    write_pending();  // too long to hold: written, whether or not it repeats
  }
  emit(s, n);
}

void report_writer::text(const char* s) noexcept { text(s, std::strlen(s)); }

void report_writer::formatted(const char* format, ...) noexcept {
  char line[1024];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (length > 0) text(line, static_cast<std::size_t>(length) < sizeof line ? static_cast<std::size_t>(length) : sizeof line - 1);
}

void report_writer::quoted(const char* s) noexcept {
  char buffer[600];
  std::size_t n = 0;
  buffer[n++] = '"';
  for (; *s != '\0'; ++s) {
    if (n + 8 > sizeof buffer) {
      text(buffer, n);
      n = 0;
    }
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      buffer[n++] = '\\';
      buffer[n++] = static_cast<char>(c);
    } else if (c < 0x20) {
      n += static_cast<std::size_t>(std::snprintf(buffer + n, 8, "\\u%04x", c));
    } else {
      buffer[n++] = static_cast<char>(c);
    }
  }
  buffer[n++] = '"';
  text(buffer, n);
}

void report_writer::begin(const char* kind, const void* address, std::size_t size, const char* format, ...) noexcept {
  char headline[768];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(headline, sizeof headline, format, args);
  va_end(args);
  if (length < 0) headline[0] = '\0';
  stacks_open_ = false;
  kind_ = kind;
  hold_output();
  if (!json_) {
    formatted("memkit: %s\n", headline);
    return;
  }
  text("{\"kind\":");
  quoted(kind);
  text(",\"message\":");
  quoted(headline);
  if (address != nullptr) formatted(",\"address\":\"" MEMKIT_ADDRESS "\"", diagnostics::address(address));
  if (size != 0 || address != nullptr) formatted(",\"size\":%zu", size);
}

void report_writer::number(const char* name, std::size_t value) noexcept {
  if (json_) formatted(",\"%s\":%zu", name, value);
}

void report_writer::word(const char* name, const char* value) noexcept {
  if (!json_) return;
  formatted(",\"%s\":", name);
  quoted(value);
}

void report_writer::stack(const char* title, void* const* frames, std::size_t count, bool captured) noexcept {
  if (deciding_) {
    if (held_count < sizeof held / sizeof held[0]) {
      held[held_count++] = {title, frames, count, captured};
      return;
    }
    write_pending();  // more stacks than held: written, whether or not it repeats
  }
  write_stack(title, frames, count, captured);
}

void report_writer::write_stack(const char* title, void* const* frames, std::size_t count, bool captured) noexcept {
  if (muted_) return;
  if (!json_) {
    formatted("  %s:\n", title);
    if (!captured) {
      text("    (stack traces not captured: options::capture_stack_traces is off)\n");
      return;
    }
    detail::print_stack_trace(
        [](void* writer, const char* piece, std::size_t length) noexcept {
          static_cast<report_writer*>(writer)->emit(piece, length);
        },
        this, frames, count);
    return;
  }
  text(stacks_open_ ? "," : ",\"stacks\":[");
  stacks_open_ = true;
  text("{\"title\":");
  quoted(title);
  formatted(",\"captured\":%s,\"frames\":[", captured ? "true" : "false");
  for (std::size_t i = 0; i < count; ++i) {
    detail::resolved_frame d;
    (void)detail::resolve_stack_frame(frames[i], d);
    formatted("%s{\"address\":\"" MEMKIT_ADDRESS "\",\"function\":", i == 0 ? "" : ",", address(frames[i]));
    quoted(d.function != nullptr ? d.function : "");
    text(",\"file\":");
    quoted(d.file != nullptr ? d.file : "");
    formatted(",\"line\":%u,\"object\":", d.line);
    quoted(d.object != nullptr ? d.object : "");
    text("}");
  }
  text("]}");
}

void report_writer::end() noexcept {
  if (deciding_) decide();
  if (json_) {
    if (stacks_open_) text("]");
    process_field();
    text("}\n");
    stacks_open_ = false;
  }
  release_output();
}

// The record's last field, which process wrote it: several processes may share one report file.
void report_writer::process_field() noexcept {
  formatted(",\"pid\":%llu", static_cast<unsigned long long>(os::process_id()));
}

void report_writer::note(const char* kind, const char* format, ...) noexcept {
  char line[768];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (length < 0) return;
  hold_output();
  if (!json_) {
    formatted("memkit: %s\n", line);
  } else {
    text("{\"kind\":");
    quoted(kind);
    text(",\"message\":");
    quoted(line);
    process_field();
    text("}\n");
  }
  release_output();
}

}  // namespace memkit::diagnostics
