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

// How many misuse reports were left out because they repeated one already written (see
// report_writer's misuse writer), and from how many places; both 0 when none was.
struct repeated_misuse {
  std::size_t reports = 0;
  std::size_t places = 0;
};
repeated_misuse repeated_misuse_reports() noexcept;

// In the child of a fork: no report is being written (the thread that was writing one in the
// parent does not exist here), so the misuse reports' lock is free.
void misuse_reports_after_fork_in_child() noexcept;

// What a misuse writer is told: whether the report ends the process (abort_on_error), in which
// case it is always written in full.
struct misuse_report {
  bool aborts = true;
};

// A misuse report, written piece by piece to a descriptor in the configured format.
//
// A misuse writer that goes on (abort_on_error false) writes each error once: a report whose kind
// and stacks (the operation that triggered it, then the block's history) were all written before
// in this process is left out and counted (repeated_misuse_reports), as valgrind counts "errors
// from N contexts" and ASan in recover mode deduplicates by place, so that a mismatched free in a
// loop is one report, not thousands, while a write after free found at one allocation site is
// still reported for each block history. Reports without a captured stack, and reports that abort,
// are always written. Such a writer holds the report until end(): the stacks' frames must stay
// valid until then.
class report_writer {
 public:
  report_writer(int fd, general_allocator::report_format format) noexcept
      : fd_(fd), json_(format == general_allocator::report_format::json) {}
  // A misuse writer: report_writer out(fd, format, misuse_report{o.abort_on_error}). Misuse reports
  // are written one at a time (a report from another thread waits for the one being written, so
  // that their lines do not mix), from its construction to its destruction.
  report_writer(int fd, general_allocator::report_format format, misuse_report misuse) noexcept;
  ~report_writer();
  report_writer(const report_writer&) = delete;
  report_writer& operator=(const report_writer&) = delete;

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
  void process_field() noexcept;       // JSON: "pid"
  void decide() noexcept;  // a deciding misuse writer, at end(): written or left out
  void write_pending() noexcept;  // what it held: the text, then the stacks
  void write_stack(const char* title, void* const* frames, std::size_t count, bool captured) noexcept;
  // Each report, begin() to end() (or a note), is held and written in one piece (report.cpp).
  void hold_output() noexcept;
  void release_output() noexcept;
  void emit(const char* s, std::size_t n) noexcept;  // every byte written goes through here
  int fd_;
  bool json_;
  bool stacks_open_ = false;
  // A misuse writer holds what it writes (the text and the stacks' pointers, in one place for all,
  // under the misuse reports' lock) until end() says whether it is a repeat.
  bool serialized_ = false;
  bool deciding_ = false;
  bool muted_ = false;
  bool holds_output_ = false;
  const char* kind_ = "";
};

}  // namespace memkit::diagnostics
