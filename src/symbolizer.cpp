// Symbolizing captured return addresses; see include/memkit/detail/stack_trace.hpp.
//
// Two ways, chosen at the first symbolization of the process, both behind src/os/symbols.hpp:
// - the debug information (libdw reading ELF symbol tables and DWARF on Linux), when the platform
//   has a reader for it: functions, static ones included, with file:line;
// - the system's table of exported symbols (dladdr on Linux; the module list on Windows), when
//   there is no reader (or MEMKIT_SYMBOLIZER=dladdr): exported functions and the object only.
//
// Results are kept per address in a table, and their strings in an arena, both mapped with
// os::map: repeated frames (a leak report repeats the same few call sites thousands of times)
// cost one hash lookup. Nothing is ever freed: symbolizing happens in reports, and a process makes
// few distinct call sites compared to the memory this keeps (about 100 bytes per site).
//
// Allocation: the debug-information reader, the loader and __cxa_demangle call malloc.
// symbolizing_on_this_thread() is true throughout, so that general_allocator in debug mode serves
// those calls as plain allocations (no records, no checks, no stack capture, not counted as leaks)
// instead of recursing.
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "memkit/detail/stack_trace.hpp"
#include "memkit/os.hpp"
#include "os/symbols.hpp"

namespace memkit::detail {
namespace {

// ---- state (all of it guarded by `lock`) ---------------------------------------------------------

thread_local int symbolizing_depth = 0;

struct symbolizing_scope {
  symbolizing_scope() noexcept { ++symbolizing_depth; }
  ~symbolizing_scope() { --symbolizing_depth; }
  symbolizing_scope(const symbolizing_scope&) = delete;
  symbolizing_scope& operator=(const symbolizing_scope&) = delete;
};

enum class backend : int { untried, debug_info, exported };

// A lock that is constant-initialized on every platform (std::mutex is not with MinGW's threads), so
// that a report from a static constructor finds it ready. Symbolizing is rare and slow: waiters
// yield rather than sleep.
class spin_lock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

constinit spin_lock lock;
backend chosen = backend::untried;
const char* library_name = nullptr;  // test hook; null means the platform's default reader

// Strings, bump-allocated from mappings that are never returned.
struct string_arena {
  char* cursor = nullptr;
  std::size_t left = 0;

  const char* keep(const char* text) noexcept {
    if (text == nullptr) return nullptr;
    const std::size_t n = std::strlen(text) + 1;
    if (n > left) {
      constexpr std::size_t chunk = std::size_t{64} << 10;
      const std::size_t page = os::page_size();
      const std::size_t bytes = n > chunk ? (n + page - 1) & ~(page - 1) : std::max(chunk, page);
      auto mapped = os::map(bytes);
      if (!mapped) return nullptr;
      char* fresh = static_cast<char*>(mapped.value());
      if (n > chunk) {  // a string of its own: keep the current chunk's tail for the next ones
        std::memcpy(fresh, text, n);
        return fresh;
      }
      cursor = fresh;
      left = bytes;
    }
    char* out = cursor;
    std::memcpy(out, text, n);
    cursor += n;
    left -= n;
    return out;
  }
};
string_arena strings;

// Resolved frames by address: open addressing, linear probing, never deleted; stops taking new
// entries at three quarters full (lookups still work, new sites are just not cached).
constexpr std::size_t cache_slots = std::size_t{1} << 14;
resolved_frame* cache = nullptr;  // mapped on first use
std::size_t cache_used = 0;

std::size_t slot_of(const void* address) noexcept {
  auto a = reinterpret_cast<std::uintptr_t>(address);
  a ^= a >> 17;
  a *= 0x9e3779b97f4a7c15ull;
  return static_cast<std::size_t>(a >> 32) & (cache_slots - 1);
}

template <class T>
T* map_array(std::size_t count) noexcept {
  const std::size_t page = os::page_size();
  auto mapped = os::map((count * sizeof(T) + page - 1) & ~(page - 1));
  return mapped ? static_cast<T*>(mapped.value()) : nullptr;
}

// fork: a child of a process in which another thread was symbolizing inherits `lock` held by a
// thread it does not have, and the debug-information reader's state half-updated. It takes the
// lock of its own (the one inherited is released) and keeps to the exported symbols, which have no
// state of their own.
bool inherited_midway = false;

void after_fork_in_child() noexcept {
  if (lock.try_lock()) {
    lock.unlock();
    return;
  }
  lock.unlock();
  inherited_midway = true;
  chosen = backend::exported;
  // The table and the arena may be half-updated too: start new ones.
  cache = nullptr;
  cache_used = 0;
  strings = string_arena{};
}

const char* keep_string(const char* text) noexcept { return strings.keep(text); }
const char* demangled(const char* name) noexcept;
constexpr os::symbols::string_keeper keeper{keep_string, demangled};

bool debug_info_wanted() noexcept {
  const char* forced = std::getenv("MEMKIT_SYMBOLIZER");
  return forced == nullptr || std::strcmp(forced, "dladdr") != 0;
}

backend current_backend() noexcept {
  if (inherited_midway) return backend::exported;
  if (chosen == backend::untried) {
    static bool fork_handler_installed = false;
    if (!fork_handler_installed) fork_handler_installed = os::symbols::on_fork_in_child(after_fork_in_child);
    chosen = debug_info_wanted() && os::symbols::load_debug_info(library_name) ? backend::debug_info
                                                                                 : backend::exported;
  }
  return chosen;
}

const char* demangled(const char* name) noexcept {
  if (name == nullptr) return nullptr;
  char unversioned[1024];
  if (const char* at = std::strchr(name, '@'); at != nullptr && static_cast<std::size_t>(at - name) < sizeof unversioned) {
    std::memcpy(unversioned, name, static_cast<std::size_t>(at - name));
    unversioned[at - name] = '\0';
    name = unversioned;
  }
  if (name[0] == '_' && name[1] == 'Z') {
    int status = -1;
    char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && text != nullptr) {
      const char* kept = strings.keep(text);
      std::free(text);
      if (kept != nullptr) return kept;
    } else {
      std::free(text);
    }
  }
  return strings.keep(name);
}

}  // namespace

bool symbolizing_on_this_thread() noexcept { return symbolizing_depth != 0; }

bool resolve_stack_frame(const void* address, resolved_frame& out) noexcept {
  out = resolved_frame{};
  out.address = address;
  if (address == nullptr) return false;
  // Re-entered from an allocation made while symbolizing (a report from inside libdw's malloc):
  // the lock is this thread's already, so only the lock-free way is open.
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  if (symbolizing_depth != 0) return os::symbols::resolve_exported(a, out, nullptr);
  const symbolizing_scope scope;
  std::lock_guard guard(lock);
  const backend way = current_backend();
  // Both ways are cached: dladdr searches every exported symbol of the object on each call.
  if (cache == nullptr) cache = map_array<resolved_frame>(cache_slots);
  std::size_t slot = cache != nullptr ? slot_of(address) : 0;
  if (cache != nullptr) {
    while (cache[slot].address != nullptr) {
      if (cache[slot].address == address) {
        out = cache[slot];
        return true;
      }
      slot = (slot + 1) & (cache_slots - 1);
    }
  }
  const bool found = way == backend::debug_info ? os::symbols::resolve_with_debug_info(a, out, keeper)
                                                : os::symbols::resolve_exported(a, out, &keeper);
  if (!found) return false;
  if (cache != nullptr && cache_used < cache_slots / 4 * 3) {
    cache[slot] = out;
    ++cache_used;
  }
  return true;
}

void set_symbolizer_library_for_testing(const char* soname) noexcept {
  const symbolizing_scope scope;
  std::lock_guard guard(lock);
  library_name = soname;
  chosen = backend::untried;
  if (cache != nullptr) std::memset(static_cast<void*>(cache), 0, cache_slots * sizeof(resolved_frame));
  cache_used = 0;
}

bool symbolizer_uses_libdw() noexcept {
  if (symbolizing_depth != 0) return false;
  const symbolizing_scope scope;
  std::lock_guard guard(lock);
  return current_backend() == backend::debug_info;
}

}  // namespace memkit::detail
