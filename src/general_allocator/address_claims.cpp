// The address-space ownership check of builds with assertions (see internal.hpp, namespace
// claims): a sorted table of the ranges every segment and huge block claims, process-wide,
// under one lock. A claim must not overlap another, a change must name a range exactly as claimed,
// and a claimed range must be mapped after every step that changes it, so a step that gives away
// or re-claims address space wrongly is named where it happens, not when the memory it lost is
// handed out again. Release builds compile none of it.

#include "internal.hpp"

#if MEMKIT_ASSERTIONS

#include <cerrno>
#include <cstdlib>

#include "../os/process.hpp"
#include "memkit/os.hpp"
#include "report.hpp"

namespace memkit::gpa::claims {

namespace {

struct entry {
  std::uintptr_t begin;
  std::uintptr_t end;
  const char* step;  // the last step that claimed or changed it
};

// Segments and huge blocks of every instance of a test or a soak stay far below this; when the
// table is full the check stops (it never fails a program for its own lack of room).
constexpr std::size_t capacity = std::size_t{1} << 15;

entry table[capacity];
std::size_t count = 0;
bool overflowed = false;
spin_lock table_lock;

// The first claim whose end lies after `at`.
std::size_t lower_bound(std::uintptr_t at) noexcept {
  std::size_t low = 0, high = count;
  while (low < high) {
    const std::size_t mid = (low + high) / 2;
    if (table[mid].end <= at) low = mid + 1;
    else high = mid;
  }
  return low;
}

// The mappings and claims within 16 MiB of a violation, printed with it: what the system holds
// there against what the allocator believes it holds.
struct window {
  std::uintptr_t begin, end;
};

bool print_region(const os::process::region& r, void* context) noexcept {
  const auto* w = static_cast<const window*>(context);
  if (r.end > w->begin && r.begin < w->end) {
    diagnostics::print(os::error_stream, "  mapped  [%#zx, %#zx) %c%c\n", static_cast<std::size_t>(r.begin),
                       static_cast<std::size_t>(r.end), r.readable ? 'r' : '-', r.writable ? 'w' : '-');
  }
  return true;
}

[[noreturn]] void fail(const char* what, std::uintptr_t begin, std::uintptr_t end, const char* step,
                       const entry* other) noexcept {
  if (other != nullptr) {
    diagnostics::print(os::error_stream,
                       "memkit: address-space ownership violated: %s: [%#zx, %#zx) by %s; the claim [%#zx, "
                       "%#zx) last changed by %s\n",
                       what, static_cast<std::size_t>(begin), static_cast<std::size_t>(end), step,
                       static_cast<std::size_t>(other->begin), static_cast<std::size_t>(other->end), other->step);
  } else {
    diagnostics::print(os::error_stream, "memkit: address-space ownership violated: %s: [%#zx, %#zx) by %s\n", what,
                       static_cast<std::size_t>(begin), static_cast<std::size_t>(end), step);
  }
  window w{begin - (std::uintptr_t{16} << 20), end + (std::uintptr_t{16} << 20)};
  (void)os::process::for_each_region(print_region, &w);
  for (std::size_t i = 0; i < count; ++i) {  // the process is ending: read without the lock
    if (table[i].end > w.begin && table[i].begin < w.end) {
      diagnostics::print(os::error_stream, "  claimed [%#zx, %#zx) by %s\n", static_cast<std::size_t>(table[i].begin),
                         static_cast<std::size_t>(table[i].end), table[i].step);
    }
  }
  std::abort();
}

}  // namespace

void change(const void* at, std::size_t old_bytes, std::size_t new_bytes, const char* step) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(at);
  {
    lock_guard guard(table_lock);
    if (overflowed) return;
    std::size_t i = lower_bound(begin);
    if (old_bytes == 0) {
      if (new_bytes == 0) return;
      // A new claim: nothing claimed may overlap it.
      if (i < count && table[i].begin < begin + new_bytes) {
        fail("a new claim overlaps a claim", begin, begin + new_bytes, step, &table[i]);
      }
      if (count == capacity) {
        overflowed = true;
        return;
      }
      for (std::size_t k = count; k > i; --k) table[k] = table[k - 1];
      table[i] = entry{begin, begin + new_bytes, step};
      ++count;
    } else {
      // A change names a claim exactly.
      if (i >= count || table[i].begin != begin || table[i].end != begin + old_bytes) {
        fail("a change names no claim", begin, begin + old_bytes, step, i < count ? &table[i] : nullptr);
      }
      if (new_bytes == 0) {
        for (std::size_t k = i + 1; k < count; ++k) table[k - 1] = table[k];
        --count;
        return;
      }
      if (i + 1 < count && table[i + 1].begin < begin + new_bytes) {
        fail("a grown claim overlaps a claim", begin, begin + new_bytes, step, &table[i + 1]);
      }
      table[i].end = begin + new_bytes;
      table[i].step = step;
    }
  }
  check_mapped(at, new_bytes, step);
}

void check_mapped(const void* at, std::size_t bytes, const char* step) noexcept {
  if (bytes == 0) return;
  const os::status s = os::process::mapped(at, bytes);
  if (!s && s.error() != ENOSYS) {
    const auto begin = reinterpret_cast<std::uintptr_t>(at);
    fail("part of a claimed range is not mapped", begin, begin + bytes, step, nullptr);
  }
}

void reset_after_fork() noexcept { table_lock.reset(); }

}  // namespace memkit::gpa::claims

#endif
