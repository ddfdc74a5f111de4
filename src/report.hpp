// Internal: the diagnostics module. Every text memkit writes goes through here: the statistics
// (general_allocator::print_statistics), tracking_allocator's reports, contract violations and
// misuse reports of the general allocator's debug mode and of block_heap. Nothing here allocates
// through malloc, so it runs inside an allocator and while the heap is corrupt; every write goes
// through the os layer (os::output).
//
// Misuse has one channel: format the report, write it, then take the one action configured for
// it (finish_misuse_report): abort by default, or return when the user asked to go on
// (general_allocator::options::abort_on_error false). A contract violation always ends there.
//
// Misuse reports come as text for people or as one JSON object per line for machines:
//   Text:  memkit: <headline>
//            <stack title>:
//              #0 0xADDR function+0xOFF (object)
//   JSON:  {"kind":"double-free","message":"<headline>","address":"0x...","size":N,
//           "stacks":[{"title":"freed again at","frames":[{"address":"0x...","function":"...",
//           "file":"...","line":N,"object":"..."}]}]}
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cinttypes>
#include <cstdint>

#include "memkit/general_allocator.hpp"

namespace memkit::diagnostics {

// Writes `length` bytes of `text` to `fd`; a failed write is dropped (there is nowhere to report it).
void put(int fd, const char* text, std::size_t length) noexcept;
// Writes a NUL-terminated text.
void put(int fd, const char* text) noexcept;
// An address in a report, in one form on every platform: "0x" and lower-case hex digits (%p's
// form is each C runtime's own; Windows' has no "0x"). A format says "at " MEMKIT_ADDRESS and
// passes diagnostics::address(p).
#define MEMKIT_ADDRESS "0x%" PRIxPTR
inline std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

// printf to `fd` through a stack buffer (longer output is cut at 1 KiB).
void print(int fd, const char* format, ...) noexcept __attribute__((format(printf, 2, 3)));

// Ends a misuse report: aborts the process when `abort_process` (the default configuration of
// every reporter), else returns so that the caller goes on as documented for that misuse.
void finish_misuse_report(bool abort_process) noexcept;

// Writes "memkit: contract violated: <message> (<condition>) at <file>:<line>" to the error
// stream and aborts.
[[noreturn]] void report_contract_violation(const char* condition, const char* message, const char* file,
                                            int line) noexcept;

// A misuse report, written piece by piece to a descriptor in the configured format.
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

}  // namespace memkit::diagnostics
