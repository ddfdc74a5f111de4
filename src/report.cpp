// The diagnostics module (report.hpp): plain text, misuse reports and the misuse channel.
#include "report.hpp"

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

void report_writer::text(const char* s, std::size_t n) noexcept { put(fd_, s, n); }

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
  if (!json_) {
    formatted("  %s:\n", title);
    if (!captured) {
      text("    (stack traces not captured: options::capture_stack_traces is off)\n");
      return;
    }
    detail::print_stack_trace(fd_, frames, count);
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
  if (!json_) return;
  if (stacks_open_) text("]");
  text("}\n");
  stacks_open_ = false;
}

void report_writer::note(const char* kind, const char* format, ...) noexcept {
  char line[768];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (length < 0) return;
  if (!json_) {
    formatted("memkit: %s\n", line);
    return;
  }
  text("{\"kind\":");
  quoted(kind);
  text(",\"message\":");
  quoted(line);
  text("}\n");
}

}  // namespace memkit::diagnostics
