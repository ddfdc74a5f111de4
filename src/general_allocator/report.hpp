// Debug-mode reports (debug.cpp, leaks.cpp): written piece by piece straight to a file
// descriptor, without malloc, as text for people or as one JSON object per line for machines.
//
// Text:  memkit: <headline>
//          <stack title>:
//            #0 0xADDR function+0xOFF (object)
// JSON:  {"kind":"double-free","message":"<headline>","address":"0x...","size":N,
//         "stacks":[{"title":"freed again at","frames":[{"address":"0x...","function":"...",
//         "file":"...","line":N,"object":"..."}]}]}
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>

#include "memkit/general_allocator.hpp"

namespace memkit::gpa {

class report_writer {
 public:
  report_writer(int fd, general_allocator::report_format format) noexcept
      : fd_(fd), json_(format == general_allocator::report_format::json) {}

  // Starts a report: its kind (a JSON word such as "double-free"), the block's address and size
  // (null / 0 when there is none) and the one-line headline.
  void begin(const char* kind, const void* address, std::size_t size, const char* format, ...) noexcept
      __attribute__((format(printf, 5, 6)));
  // An extra field (JSON) that the headline already says in words (text).
  void number(const char* name, std::size_t value) noexcept;
  void word(const char* name, const char* value) noexcept;
  // One stack trace under a title; `captured` false says traces are off.
  void stack(const char* title, void* const* frames, std::size_t count, bool captured) noexcept;
  // Ends the report (JSON: closes the object and the line).
  void end() noexcept;
  // A line outside any report (text only; JSON gets {"kind":kind,"message":...}).
  void note(const char* kind, const char* format, ...) noexcept __attribute__((format(printf, 3, 4)));

  bool json() const noexcept { return json_; }

 private:
  void text(const char* s, std::size_t n) noexcept;
  void text(const char* s) noexcept;
  void formatted(const char* format, ...) noexcept __attribute__((format(printf, 2, 3)));
  void quoted(const char* s) noexcept;  // a JSON string
  int fd_;
  bool json_;
  bool stacks_open_ = false;
};

}  // namespace memkit::gpa
