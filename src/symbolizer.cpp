// Symbolizing captured return addresses; see include/memkit/detail/stack_trace.hpp.
//
// Two ways, chosen at the first symbolization of the process:
// - libdw (elfutils), opened with dlopen("libdw.so.1"), never linked, so that memkit itself keeps
//   depending on the standard library and the OS only. Each object (the executable, every shared
//   object) is reported to one Dwfl session the first time one of its addresses is looked up, at
//   the load bias the dynamic loader chose (dladdr1's link_map), so position-independent code maps
//   back to the file's own addresses. libdw then reads the symbol tables (.symtab, not just
//   .dynsym), the DWARF line tables, and the separate debug file found by build-id or debuglink
//   under /usr/lib/debug when the object is stripped. It caches both per object.
// - dladdr, when libdw is missing (or MEMKIT_SYMBOLIZER=dladdr): exported symbols only, no lines.
//
// Results are kept per address in a table, and their strings in an arena, both mapped with
// os::map: repeated frames (a leak report repeats the same few call sites thousands of times)
// cost one hash lookup. Nothing is ever freed: symbolizing happens in reports, and a process makes
// few distinct call sites compared to the memory this keeps (about 100 bytes per site).
//
// Allocation: libdw, dlopen and __cxa_demangle call malloc. symbolizing_on_this_thread() is true
// throughout, so that general_allocator in debug mode serves those calls as plain allocations
// (no records, no checks, no stack capture, not counted as leaks) instead of recursing.
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "memkit/detail/stack_trace.hpp"
#include "memkit/os.hpp"

namespace memkit::detail {
namespace {

// ---- the part of libdwfl's ABI used here (elfutils/libdwfl.h; declared here so that building
// memkit needs no elfutils headers) ----------------------------------------------------------------
struct dwfl_session;  // Dwfl
struct dwfl_module;   // Dwfl_Module
struct dwfl_line;     // Dwfl_Line
struct elf_handle;    // Elf
struct dwarf_file;    // Dwarf
struct dwarf_line;    // Dwarf_Line
using dwarf_address = std::uint64_t;

struct dwarf_die {  // Dwarf_Die: a value type, filled by dwarf_offdie
  void* address;
  void* unit;
  void* abbreviation;
  long padding;
};

struct dwfl_callbacks {  // Dwfl_Callbacks
  int (*find_elf)(dwfl_module*, void**, const char*, dwarf_address, char**, elf_handle**);
  int (*find_debuginfo)(dwfl_module*, void**, const char*, dwarf_address, const char*, const char*, Elf64_Word,
                        char**);
  int (*section_address)(dwfl_module*, void**, const char*, dwarf_address, const char*, Elf64_Word,
                         const Elf64_Shdr*, dwarf_address*);
  char** debuginfo_path;  // null: the default, ":.debug:/usr/lib/debug"
};

struct libdw_api {
  dwfl_session* (*begin)(const dwfl_callbacks*);
  void (*report_begin_add)(dwfl_session*);
  dwfl_module* (*report_elf)(dwfl_session*, const char*, const char*, int, dwarf_address, bool);
  int (*report_end)(dwfl_session*, int (*)(dwfl_module*, void*, const char*, dwarf_address, void*), void*);
  const char* (*module_addrinfo)(dwfl_module*, dwarf_address, Elf64_Off*, Elf64_Sym*, Elf64_Word*, elf_handle**,
                                 dwarf_address*);
  dwfl_line* (*module_getsrc)(dwfl_module*, dwarf_address);
  const char* (*lineinfo)(dwfl_line*, dwarf_address*, int*, int*, std::uint64_t*, std::uint64_t*);
  int (*getsymtab)(dwfl_module*);
  const char* (*getsym_info)(dwfl_module*, int, Elf64_Sym*, Elf64_Addr*, Elf64_Word*, elf_handle**, dwarf_address*);
  // For objects without .debug_aranges (Clang emits none), where libdwfl finds no unit for an
  // address: the units' own ranges, read once per object.
  dwarf_file* (*module_getdwarf)(dwfl_module*, dwarf_address*);
  int (*nextcu)(dwarf_file*, std::uint64_t, std::uint64_t*, std::size_t*, std::uint64_t*, std::uint8_t*, std::uint8_t*);
  dwarf_die* (*offdie)(dwarf_file*, std::uint64_t, dwarf_die*);
  std::ptrdiff_t (*ranges)(dwarf_die*, std::ptrdiff_t, dwarf_address*, dwarf_address*, dwarf_address*);
  dwarf_line* (*getsrc_die)(dwarf_die*, dwarf_address);
  const char* (*linesrc)(dwarf_line*, std::uint64_t*, std::uint64_t*);
  int (*lineno)(dwarf_line*, int*);
  dwfl_callbacks callbacks;
};

// ---- state (all of it guarded by `lock`) ---------------------------------------------------------

thread_local int symbolizing_depth = 0;

struct symbolizing_scope {
  symbolizing_scope() noexcept { ++symbolizing_depth; }
  ~symbolizing_scope() { --symbolizing_depth; }
  symbolizing_scope(const symbolizing_scope&) = delete;
  symbolizing_scope& operator=(const symbolizing_scope&) = delete;
};

enum class backend : int { untried, libdw, dladdr };

constinit std::mutex lock;
backend chosen = backend::untried;
const char* library_name = nullptr;  // test hook; null means "libdw.so.1"
libdw_api dw{};
dwfl_session* session = nullptr;

// Strings, bump-allocated from mappings that are never returned.
struct string_arena {
  char* cursor = nullptr;
  std::size_t left = 0;

  const char* keep(const char* text) noexcept {
    if (text == nullptr) return nullptr;
    const std::size_t n = std::strlen(text) + 1;
    if (n > left) {
      constexpr std::size_t chunk = std::size_t{64} << 10;
      const std::size_t bytes = n > chunk ? (n + 4095) & ~std::size_t{4095} : chunk;
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

// The address range of one compile unit, in the debug file's own addresses.
struct unit_range {
  dwarf_address begin;
  dwarf_address end;
  std::uint64_t die_offset;
};

// A function symbol at its run-time address.
struct function_symbol {
  std::uintptr_t begin;
  std::uintptr_t size;
  const char* name;  // in libdw's copy of the string table, which lives as long as the session
  unsigned rank;     // binding: global 0, weak 1, local 2 (aliases: the global name wins)
};

// Objects reported to the session, by load bias and the loader's name for them.
struct module_entry {
  std::uintptr_t bias;
  const char* loader_name;  // dl_phdr_info::dlpi_name, "" for the executable
  const char* path;         // kept in `strings`
  dwfl_module* module;      // null when libdw could not read the file
  // libdwfl looks a symbol up by a linear scan of the whole table (cc1plus has 30,000): the
  // function symbols are sorted once per object instead, and found by binary search.
  function_symbol* symbols;
  std::size_t symbol_count;
  bool symbols_read;
  unit_range* units;        // read on first need (mapped), when libdwfl's own lookup finds no line
  std::size_t unit_count;
  bool units_read;
};
constexpr std::size_t max_modules = 1024;
module_entry* modules = nullptr;  // mapped on first use
std::size_t module_count = 0;

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
  auto mapped = os::map((count * sizeof(T) + 4095) & ~std::size_t{4095});
  return mapped ? static_cast<T*>(mapped.value()) : nullptr;
}

template <class F>
bool find_symbol(void* library, const char* name, F& out) noexcept {
  void* symbol = ::dlsym(library, name);
  out = reinterpret_cast<F>(symbol);
  return symbol != nullptr;
}

bool load_libdw() noexcept {
  if (const char* forced = std::getenv("MEMKIT_SYMBOLIZER"); forced != nullptr && std::strcmp(forced, "dladdr") == 0)
    return false;
  void* library = ::dlopen(library_name != nullptr ? library_name : "libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return false;
  libdw_api api{};
  const bool complete =
      find_symbol(library, "dwfl_begin", api.begin) && find_symbol(library, "dwfl_report_begin_add", api.report_begin_add) &&
      find_symbol(library, "dwfl_report_elf", api.report_elf) && find_symbol(library, "dwfl_report_end", api.report_end) &&
      find_symbol(library, "dwfl_module_addrinfo", api.module_addrinfo) &&
      find_symbol(library, "dwfl_module_getsrc", api.module_getsrc) && find_symbol(library, "dwfl_lineinfo", api.lineinfo) &&
      find_symbol(library, "dwfl_module_getdwarf", api.module_getdwarf) && find_symbol(library, "dwarf_nextcu", api.nextcu) &&
      find_symbol(library, "dwarf_offdie", api.offdie) && find_symbol(library, "dwarf_ranges", api.ranges) &&
      find_symbol(library, "dwarf_getsrc_die", api.getsrc_die) && find_symbol(library, "dwarf_linesrc", api.linesrc) &&
      find_symbol(library, "dwarf_lineno", api.lineno) && find_symbol(library, "dwfl_module_getsymtab", api.getsymtab) &&
      find_symbol(library, "dwfl_module_getsym_info", api.getsym_info) &&
      find_symbol(library, "dwfl_build_id_find_elf", api.callbacks.find_elf) &&
      find_symbol(library, "dwfl_standard_find_debuginfo", api.callbacks.find_debuginfo) &&
      find_symbol(library, "dwfl_offline_section_address", api.callbacks.section_address);
  if (!complete) return false;  // the handle stays open: harmless, and dlclose could run its destructors now
  dw = api;
  if (session == nullptr) {
    static dwfl_callbacks callbacks;  // libdw keeps the pointer for the session's life
    callbacks = dw.callbacks;
    session = dw.begin(&callbacks);
  }
  return session != nullptr;
}

// fork: a child of a process in which another thread was symbolizing inherits `lock` held by a
// thread it does not have, and libdw's state half-updated. It makes a fresh lock and keeps to
// dladdr, which has no state of its own.
bool inherited_midway = false;

void after_fork_in_child() noexcept {
  if (lock.try_lock()) {
    lock.unlock();
    return;
  }
  new (&lock) std::mutex;
  inherited_midway = true;
  chosen = backend::dladdr;
  // The table and the arena may be half-updated too: start new ones.
  cache = nullptr;
  cache_used = 0;
  strings = string_arena{};
}

backend current_backend() noexcept {
  if (inherited_midway) return backend::dladdr;
  if (chosen == backend::untried) {
    static bool fork_handler_installed = false;
    if (!fork_handler_installed) fork_handler_installed = ::pthread_atfork(nullptr, nullptr, after_fork_in_child) == 0;
    chosen = load_libdw() ? backend::libdw : backend::dladdr;
  }
  return chosen;
}

// The executable's path (its link_map names it ""), read once.
const char* executable_path() noexcept {
  static char path[4096];
  static bool read = false;
  if (!read) {
    const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
    path[n > 0 ? n : 0] = '\0';
    read = true;
  }
  return path[0] != '\0' ? path : nullptr;
}

// The loaded object holding an address: its load bias and the loader's name for it. Walks the
// program headers of the loaded objects (no symbol search, unlike dladdr).
struct loaded_object {
  std::uintptr_t address;
  std::uintptr_t bias = 0;
  const char* name = nullptr;
  bool found = false;
};

int find_loaded_object(dl_phdr_info* info, std::size_t, void* argument) {
  auto* wanted = static_cast<loaded_object*>(argument);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD) continue;
    const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (wanted->address >= begin && wanted->address - begin < segment.p_memsz) {
      wanted->bias = info->dlpi_addr;
      wanted->name = info->dlpi_name;
      wanted->found = true;
      return 1;
    }
  }
  return 0;
}

// The session's module for an object, reporting it on first use.
module_entry* module_for(const loaded_object& object) noexcept {
  for (std::size_t i = 0; i < module_count; ++i) {
    if (modules[i].bias == object.bias && modules[i].loader_name == object.name) return &modules[i];
  }
  if (modules == nullptr && (modules = map_array<module_entry>(max_modules)) == nullptr) return nullptr;
  if (module_count == max_modules) return nullptr;
  const char* name = object.name;
  const char* path = (name == nullptr || name[0] == '\0') ? executable_path() : name;
  module_entry entry{};
  entry.bias = object.bias;
  entry.loader_name = object.name;
  entry.path = strings.keep(path);
  // The vDSO has no file; libdw would fail to open its name anyway.
  if (entry.path != nullptr && entry.path[0] == '/') {
    dw.report_begin_add(session);
    // add_p_vaddr: `base` is the load bias, which libdw adds to the file's own addresses.
    entry.module = dw.report_elf(session, entry.path, entry.path, -1, object.bias, true);
    (void)dw.report_end(session, nullptr, nullptr);
  }
  modules[module_count] = entry;
  return &modules[module_count++];
}

// Reads and sorts the function symbols of the entry's object (.symtab, from the separate debug
// file when the object is stripped, else .dynsym).
void read_symbols(module_entry& entry) noexcept {
  entry.symbols_read = true;
  const int total = dw.getsymtab(entry.module);
  if (total <= 1) return;
  function_symbol* table = map_array<function_symbol>(static_cast<std::size_t>(total));
  if (table == nullptr) return;
  std::size_t count = 0;
  for (int i = 1; i < total; ++i) {
    Elf64_Sym symbol{};
    Elf64_Addr address = 0;
    Elf64_Word section = 0;
    const char* name = dw.getsym_info(entry.module, i, &symbol, &address, &section, nullptr, nullptr);
    const unsigned type = ELF64_ST_TYPE(symbol.st_info);
    if (name == nullptr || name[0] == '\0' || address == 0 || section == SHN_UNDEF) continue;
    if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
    const unsigned binding = ELF64_ST_BIND(symbol.st_info);
    table[count++] = {static_cast<std::uintptr_t>(address), static_cast<std::uintptr_t>(symbol.st_size), name,
                      binding == STB_GLOBAL ? 0u : binding == STB_WEAK ? 1u : 2u};
  }
  std::sort(table, table + count, [](const function_symbol& a, const function_symbol& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.size > b.size;
  });
  // One symbol per address: the first after sorting (global, then largest).
  std::size_t kept = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (kept != 0 && table[kept - 1].begin == table[i].begin) continue;
    table[kept++] = table[i];
  }
  entry.symbols = table;
  entry.symbol_count = kept;
}

// The function symbol containing `address`, or null.
const function_symbol* symbol_at(module_entry& entry, std::uintptr_t address) noexcept {
  if (!entry.symbols_read) read_symbols(entry);
  const function_symbol* begin = entry.symbols;
  const function_symbol* end = begin + entry.symbol_count;
  const function_symbol* after = std::upper_bound(
      begin, end, address, [](std::uintptr_t a, const function_symbol& s) { return a < s.begin; });
  if (after == entry.symbols) return nullptr;
  const function_symbol* nearest = after - 1;
  // A sized symbol must contain the address; a symbol nested in a larger one (rare) may hide
  // the one that does, so look a few entries back. A sizeless one (hand-written assembly) counts
  // when it is the nearest.
  for (const function_symbol* s = nearest; s >= entry.symbols && nearest - s < 8; --s) {
    if (address - s->begin < s->size) return s;
  }
  return nearest->size == 0 ? nearest : nullptr;
}

// Reads the ranges of every compile unit of the entry's debug information.
void read_units(module_entry& entry, dwarf_file* dwarf) noexcept {
  entry.units_read = true;
  std::size_t capacity = 0;
  std::uint64_t offset = 0;
  std::uint64_t next = 0;
  std::size_t header = 0;
  while (dw.nextcu(dwarf, offset, &next, &header, nullptr, nullptr, nullptr) == 0) {
    dwarf_die unit{};
    if (dw.offdie(dwarf, offset + header, &unit) != nullptr) {
      dwarf_address base = 0;
      dwarf_address begin = 0;
      dwarf_address end = 0;
      for (std::ptrdiff_t at = 0; (at = dw.ranges(&unit, at, &base, &begin, &end)) > 0;) {
        if (entry.unit_count == capacity) {
          const std::size_t grown = capacity == 0 ? 256 : capacity * 2;
          unit_range* fresh = map_array<unit_range>(grown);
          if (fresh == nullptr) return;
          if (entry.units != nullptr) {
            std::memcpy(fresh, entry.units, entry.unit_count * sizeof(unit_range));
            (void)os::release(entry.units, (capacity * sizeof(unit_range) + 4095) & ~std::size_t{4095});
          }
          entry.units = fresh;
          capacity = grown;
        }
        entry.units[entry.unit_count++] = {begin, end, offset + header};
      }
    }
    offset = next;
  }
}

// file:line of `address` (a run-time address) by the units' ranges; false when none covers it.
bool line_by_units(module_entry& entry, std::uintptr_t address, resolved_frame& out) noexcept {
  dwarf_address bias = 0;
  dwarf_file* dwarf = dw.module_getdwarf(entry.module, &bias);
  if (dwarf == nullptr) return false;
  if (!entry.units_read) read_units(entry, dwarf);
  const dwarf_address wanted = address - bias;
  for (std::size_t i = 0; i < entry.unit_count; ++i) {
    const unit_range& range = entry.units[i];
    if (wanted < range.begin || wanted >= range.end) continue;
    dwarf_die unit{};
    if (dw.offdie(dwarf, range.die_offset, &unit) == nullptr) return false;
    dwarf_line* line = dw.getsrc_die(&unit, wanted);
    if (line == nullptr) return false;
    const char* file = dw.linesrc(line, nullptr, nullptr);
    if (file == nullptr) return false;
    int number = 0;
    out.file = strings.keep(file);
    out.line = dw.lineno(line, &number) == 0 && number > 0 ? static_cast<unsigned>(number) : 0;
    return true;
  }
  return false;
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

// dladdr only: exported symbols, no lines. With `keep` (the lock held), the names are demangled
// and copied into `strings`, so that a cached answer outlives a dlclose; without, they point into
// the loader's tables.
bool resolve_with_dladdr(const void* address, resolved_frame& out, bool keep) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  Dl_info info{};
  link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(a - 1), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0)
    return false;
  out.object = info.dli_fname;
  if (map != nullptr && (map->l_name == nullptr || map->l_name[0] == '\0')) {
    if (const char* exe = executable_path()) out.object = exe;
  }
  out.object_offset = a - (map != nullptr ? map->l_addr : reinterpret_cast<std::uintptr_t>(info.dli_fbase));
  if (info.dli_sname != nullptr) {
    out.function = info.dli_sname;
    out.function_offset = a - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
  }
  if (keep) {
    out.object = strings.keep(out.object);
    out.function = demangled(out.function);
  }
  return true;
}

bool resolve_with_libdw(const void* address, resolved_frame& out) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  loaded_object object{a - 1};
  ::dl_iterate_phdr(&find_loaded_object, &object);
  if (!object.found) return false;
  module_entry* entry = module_for(object);
  out.object_offset = a - object.bias;
  if (entry == nullptr || entry->module == nullptr) return resolve_with_dladdr(address, out, true);
  out.object = entry->path;
  if (const function_symbol* symbol = symbol_at(*entry, a - 1)) {
    out.function = demangled(symbol->name);
    out.function_offset = a - symbol->begin;
  }
  if (dwfl_line* line = dw.module_getsrc(entry->module, a - 1)) {
    int number = 0;
    if (const char* file = dw.lineinfo(line, nullptr, &number, nullptr, nullptr, nullptr)) {
      out.file = strings.keep(file);
      out.line = number > 0 ? static_cast<unsigned>(number) : 0;
    }
  } else {
    (void)line_by_units(*entry, a - 1, out);
  }
  return true;
}

}  // namespace

bool symbolizing_on_this_thread() noexcept { return symbolizing_depth != 0; }

bool resolve_stack_frame(const void* address, resolved_frame& out) noexcept {
  out = resolved_frame{};
  out.address = address;
  if (address == nullptr) return false;
  // Re-entered from an allocation made while symbolizing (a report from inside libdw's malloc):
  // the lock is this thread's already, so only the lock-free way is open.
  if (symbolizing_depth != 0) return resolve_with_dladdr(address, out, false);
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
  const bool found = way == backend::libdw ? resolve_with_libdw(address, out) : resolve_with_dladdr(address, out, true);
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
  return current_backend() == backend::libdw;
}

}  // namespace memkit::detail
