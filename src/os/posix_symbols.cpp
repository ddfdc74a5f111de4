// The platform half of stack traces on ELF systems (Linux; see src/os/symbols.hpp).
//
// The unwinder: libunwind's unw_backtrace when libunwind.so.8 is installed (about 10 ns per frame
// with its cache), else the compiler runtime's _Unwind_Backtrace (a few hundred ns per frame: it
// looks up the unwind tables of every frame again). libunwind is opened with dlopen, privately
// (RTLD_LOCAL), on the first capture, not linked: linking it would let its _Unwind_* symbols take
// over C++ exception handling in the whole program, and its static archive is not
// position-independent. That first dlopen may allocate once; src/stack_trace.cpp's re-entrancy
// guard makes an allocator that captures from inside that allocation fall back to no trace.
//
// Symbols, two ways (src/symbolizer.cpp picks one at the first symbolization of the process):
// - libdw (elfutils), opened with dlopen("libdw.so.1"), never linked, so that memkit itself keeps
//   depending on the standard library and the OS only. Each object (the executable, every shared
//   object) is reported to one Dwfl session the first time one of its addresses is looked up, at
//   the load bias the dynamic loader chose, so position-independent code maps back to the file's
//   own addresses. libdw then reads the symbol tables (.symtab, not just .dynsym), the DWARF line
//   tables, and the separate debug file found by build-id or debuglink under /usr/lib/debug when
//   the object is stripped. It caches both per object.
// - dladdr, when libdw is missing (or MEMKIT_SYMBOLIZER=dladdr): exported symbols only, no lines.
//
// The tables kept per object are mapped with os::map and never returned, like the symbolizer's.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>

#include "memkit/detail/config.hpp"
#include "memkit/os.hpp"
#include "symbols.hpp"
#include "platform.hpp"

namespace memkit::os::symbols {
namespace {

using detail::resolved_frame;

// ---- stack capture -------------------------------------------------------------------------------

#if MEMKIT_HAS_TSAN
#define MEMKIT_STACK_TRACE_NO_LIBUNWIND 1
#endif

using backtrace_function = int (*)(void**, int);
std::atomic<backtrace_function> fast_backtrace{nullptr};
std::atomic<int> fast_backtrace_state{0};  // 0: not looked for, 1: looking, 2: done

backtrace_function find_fast_backtrace() noexcept {
#if defined(MEMKIT_STACK_TRACE_NO_LIBUNWIND)
  // Under ThreadSanitizer, libunwind's thread-exit destructor locks a mutex after TSan has torn
  // the thread's state down, which crashes the process: use the compiler's unwinder there.
  return nullptr;
#endif
  int state = fast_backtrace_state.load(std::memory_order_acquire);
  if (state == 2) return fast_backtrace.load(std::memory_order_relaxed);
  if (state == 0 && fast_backtrace_state.compare_exchange_strong(state, 1, std::memory_order_acq_rel)) {
    if (void* library = ::dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL)) {
      if (void* symbol = ::dlsym(library, "unw_backtrace")) {
        // libunwind opens a pipe on its first walk and keeps it (to probe memory): walked once
        // here with the low descriptors taken, so that the pipe lies high and the program finds
        // and gets the descriptors it would without memkit (a jobserver client tests whether 3
        // and 4 are open).
        auto backtrace = reinterpret_cast<backtrace_function>(symbol);
        os::with_low_descriptors_taken(
            os::high_descriptors,
            [](void* walk) {
              void* frames[2];
              (void)reinterpret_cast<backtrace_function>(walk)(frames, 2);
            },
            symbol);
        fast_backtrace.store(backtrace, std::memory_order_relaxed);
      }
    }
    fast_backtrace_state.store(2, std::memory_order_release);
    return fast_backtrace.load(std::memory_order_relaxed);
  }
  return nullptr;  // another thread is looking: use the slow unwinder meanwhile
}

struct walk_state {
  void** frames;
  std::size_t max_frames;
  std::size_t count;
};

_Unwind_Reason_Code on_frame(struct _Unwind_Context* context, void* argument) {
  auto* state = static_cast<walk_state*>(argument);
  const std::uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0) return _URC_END_OF_STACK;
  if (state->count == state->max_frames) return _URC_END_OF_STACK;
  state->frames[state->count++] = reinterpret_cast<void*>(ip);
  return _URC_NO_REASON;
}

// find_exit_path()'s walk: each frame up to exit()'s, with the object its code lies in, then the
// callee-saved registers of exit()'s caller (DWARF's numbers for them).
#if defined(__x86_64__)
constexpr int caller_kept_registers[] = {3, 6, 12, 13, 14, 15};  // rbx, rbp, r12-r15
#elif defined(__aarch64__)
constexpr int caller_kept_registers[] = {19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29};  // x19-x29
#else
constexpr int caller_kept_registers[] = {-1};  // not known here: find_exit_path() says false
#endif

struct exit_walk {
  struct frame {
    std::uintptr_t sp;    // its stack pointer: the lowest address of its frame
    const void* object;   // the base of the module its code lies in
  };
  static constexpr std::size_t max_frames = 64;
  frame frames[max_frames];
  std::size_t count = 0;
  std::uintptr_t caller_sp = 0;  // exit()'s caller's: where exit()'s frame ends
  bool exit_found = false;  // the last frame walked is exit()'s, quick_exit()'s, _exit()'s or _Exit()'s: the next is its caller
  bool immediate = false;   // _exit() or _Exit(): the process ends without running anything
  bool complete = false;    // the caller's registers are read
  exit_path* out;
};

_Unwind_Reason_Code on_exit_path_frame(struct _Unwind_Context* context, void* argument) {
  auto* walk = static_cast<exit_walk*>(argument);
  const std::uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0) return _URC_END_OF_STACK;
  // In a walk's callback the unwinders give a frame's stack pointer as its "CFA" (the compiler's
  // computes a frame's own CFA only when it steps to the next: what it gives is the callee's, which
  // is this frame's stack pointer at the call).
  const std::uintptr_t sp = _Unwind_GetCFA(context);
  if (walk->exit_found) {
    walk->caller_sp = sp;
    for (const int r : caller_kept_registers) {
      walk->out->caller_registers[walk->out->register_count++] = _Unwind_GetGR(context, r);
    }
    walk->complete = true;
    return _URC_END_OF_STACK;
  }
  if (walk->count == exit_walk::max_frames) return _URC_END_OF_STACK;
  Dl_info info;
  if (::dladdr(reinterpret_cast<void*>(ip - 1), &info) == 0) return _URC_END_OF_STACK;
  walk->frames[walk->count++] = {sp, info.dli_fbase};
  if (info.dli_sname != nullptr) {
    walk->immediate = std::strcmp(info.dli_sname, "_exit") == 0 || std::strcmp(info.dli_sname, "_Exit") == 0;
    walk->exit_found = walk->immediate || std::strcmp(info.dli_sname, "exit") == 0 ||
                       std::strcmp(info.dli_sname, "quick_exit") == 0;
  }
  return _URC_NO_REASON;
}

// may_be_in_signal_handler()'s walk: stops at the first frame the unwinder knows as a signal
// frame; otherwise keeps the modules of the last two frames it reached.
struct signal_walk {
  bool signal_frame = false;
  const void* last = nullptr;         // the module of the last frame walked
  const void* before_last = nullptr;  // and of the one before it
};

_Unwind_Reason_Code on_frame_looking_for_a_signal(struct _Unwind_Context* context, void* argument) {
  auto* walk = static_cast<signal_walk*>(argument);
  int before_instruction = 0;
  const std::uintptr_t ip = _Unwind_GetIPInfo(context, &before_instruction);
  if (ip == 0) return _URC_END_OF_STACK;
  if (before_instruction != 0) {
    walk->signal_frame = true;
    return _URC_END_OF_STACK;
  }
  Dl_info info;
  walk->before_last = walk->last;
  walk->last = ::dladdr(reinterpret_cast<void*>(ip - 1), &info) != 0 ? info.dli_fbase : nullptr;
  return _URC_NO_REASON;
}

int find_own_code(dl_phdr_info* info, std::size_t, void* argument) {
  auto* range = static_cast<code_range*>(argument);
  const auto self = reinterpret_cast<std::uintptr_t>(&find_own_code);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD || (segment.p_flags & PF_X) == 0) continue;
    const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (self >= begin && self < begin + segment.p_memsz) {
      *range = {begin, begin + segment.p_memsz};
      return 1;
    }
  }
  return 0;
}

// ---- symbols -------------------------------------------------------------------------------------

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

libdw_api dw{};
dwfl_session* session = nullptr;
const string_keeper* keeper = nullptr;  // the caller's, for the call in progress (under its lock)

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
  const char* path;         // kept by the symbolizer
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

// Rounds a size up to whole pages, for os::map.
std::size_t page_rounded(std::size_t bytes) noexcept {
  const std::size_t page = os::page_size();
  return (bytes + page - 1) & ~(page - 1);
}

template <class T>
T* map_array(std::size_t count) noexcept {
  auto mapped = os::map(page_rounded(count * sizeof(T)));
  return mapped ? static_cast<T*>(mapped.value()) : nullptr;
}

template <class F>
bool find_symbol(void* library, const char* name, F& out) noexcept {
  void* symbol = ::dlsym(library, name);
  out = reinterpret_cast<F>(symbol);
  return symbol != nullptr;
}

bool load_libdw(const char* library_name) noexcept {
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

// Objects dlclose() unloaded (the drop-in's dlclose records them, below): a trace taken while one
// was loaded names its code, which no loaded object holds by the time a leak report prints it (ld
// unloads its LTO plugin before it exits). Its file is still there for libdw, at the same bias.
struct unloaded_object {
  std::uintptr_t begin;  // its PT_LOAD segments' extent when it was loaded
  std::uintptr_t end;
  std::uintptr_t bias;
  char path[PATH_MAX];
};
unloaded_object* unloaded = nullptr;  // mapped at the first unload
std::atomic<std::size_t> unloaded_count{0};  // entries below it are complete (release)

// The latest unloaded object whose extent holds `address` (a later load may have reused the range:
// the loaded objects are asked first).
bool find_unloaded_object(loaded_object& wanted) noexcept {
  for (std::size_t i = unloaded_count.load(std::memory_order_acquire); i-- > 0;) {
    const unloaded_object& u = unloaded[i];
    if (wanted.address < u.begin || wanted.address >= u.end) continue;
    wanted.bias = u.bias;
    wanted.name = u.path;
    wanted.found = true;
    return true;
  }
  return false;
}

#if defined(MEMKIT_MALLOC_SHARED)
constexpr std::size_t max_unloaded = 128;
std::atomic<bool> unloaded_lock{false};  // for recorders

// The object a dlclose(handle) may unload, read before it does: its extent, bias and path.
bool describe_object(void* handle, unloaded_object& out) noexcept {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr ||
      map->l_name[0] == '\0' || std::strlen(map->l_name) >= sizeof out.path) {
    return false;  // (the executable has no name)
  }
  out.begin = UINTPTR_MAX;
  out.end = 0;
  out.bias = map->l_addr;
  std::strcpy(out.path, map->l_name);  // the loader's name, to find the object by
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* argument) {
        auto* o = static_cast<unloaded_object*>(argument);
        if (info->dlpi_addr != o->bias || info->dlpi_name == nullptr || std::strcmp(info->dlpi_name, o->path) != 0) {
          return 0;
        }
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_LOAD) continue;
          o->begin = std::min<std::uintptr_t>(o->begin, info->dlpi_addr + segment.p_vaddr);
          o->end = std::max<std::uintptr_t>(o->end, info->dlpi_addr + segment.p_vaddr + segment.p_memsz);
        }
        return 1;
      },
      &out);
  // The file by its absolute path: one opened by a relative path may be read at report time from
  // another working directory.
  char absolute[PATH_MAX];
  if (out.begin >= out.end || ::realpath(out.path, absolute) == nullptr || std::strlen(absolute) >= sizeof out.path) {
    return false;
  }
  std::strcpy(out.path, absolute);
  return true;
}

// After dlclose: records the object when it is gone (not when another handle keeps it loaded),
// once per path and bias.
void remember_if_unloaded(const unloaded_object& closed) noexcept {
  loaded_object still{closed.begin};
  ::dl_iterate_phdr(&find_loaded_object, &still);
  if (still.found && still.bias == closed.bias) return;
  while (unloaded_lock.exchange(true, std::memory_order_acquire)) os::yield_thread();
  if (unloaded == nullptr) unloaded = map_array<unloaded_object>(max_unloaded);
  const std::size_t n = unloaded_count.load(std::memory_order_relaxed);
  bool known = false;
  for (std::size_t i = 0; i < n && !known; ++i) {
    known = unloaded[i].bias == closed.bias && std::strcmp(unloaded[i].path, closed.path) == 0;
  }
  if (unloaded != nullptr && !known && n < max_unloaded) {
    unloaded[n] = closed;
    unloaded_count.store(n + 1, std::memory_order_release);
  }
  unloaded_lock.store(false, std::memory_order_release);
}
#endif

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
  entry.path = keeper->keep(path);
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
            (void)os::release(entry.units, page_rounded(capacity * sizeof(unit_range)));
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
    out.file = keeper->keep(file);
    out.line = dw.lineno(line, &number) == 0 && number > 0 ? static_cast<unsigned>(number) : 0;
    return true;
  }
  return false;
}

// dladdr only: exported symbols, no lines. With `keep` (the lock held), the names are demangled
// and copied, so that a cached answer outlives a dlclose; without, they point into the loader's
// tables.
bool resolve_with_dladdr(std::uintptr_t a, resolved_frame& out, const string_keeper* keep) noexcept {
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
  if (keep != nullptr) {
    out.object = keep->keep(out.object);
    out.function = keep->demangle(out.function);
  }
  return true;
}

bool resolve_with_libdw(std::uintptr_t a, resolved_frame& out) noexcept {
  loaded_object object{a - 1};
  ::dl_iterate_phdr(&find_loaded_object, &object);
  if (!object.found && !find_unloaded_object(object)) return false;
  module_entry* entry = module_for(object);
  out.object_offset = a - object.bias;
  if (entry == nullptr || entry->module == nullptr) return resolve_with_dladdr(a, out, keeper);
  out.object = entry->path;
  if (const function_symbol* symbol = symbol_at(*entry, a - 1)) {
    out.function = keeper->demangle(symbol->name);
    out.function_offset = a - symbol->begin;
  }
  if (dwfl_line* line = dw.module_getsrc(entry->module, a - 1)) {
    int number = 0;
    if (const char* file = dw.lineinfo(line, nullptr, &number, nullptr, nullptr, nullptr)) {
      out.file = keeper->keep(file);
      out.line = number > 0 ? static_cast<unsigned>(number) : 0;
    }
  } else {
    (void)line_by_units(*entry, a - 1, out);
  }
  return true;
}

}  // namespace

// ---- the interface -------------------------------------------------------------------------------

// Not inlined into its caller, so that the frame it skips is its own.
__attribute__((noinline)) std::size_t capture(void** frames, std::size_t max_frames) noexcept {
  constexpr std::size_t limit = 128;
  void* buffer[limit];
  const std::size_t wanted = std::min(max_frames + 1, limit);
  std::size_t got = 0;
  if (backtrace_function fast = find_fast_backtrace()) {
    const int n = fast(buffer, static_cast<int>(wanted));
    got = n > 0 ? static_cast<std::size_t>(n) : 0;
  } else {
    walk_state state{buffer, wanted, 0};
    _Unwind_Backtrace(on_frame, &state);
    got = state.count;
  }
  // The first frame either unwinder reports is this function.
  std::size_t count = 0;
  for (std::size_t i = 1; i < got && count < max_frames; ++i) frames[count++] = buffer[i];
  return count;
}

code_range own_code() noexcept {
  static const code_range range = [] {
    code_range found;
    ::dl_iterate_phdr(&find_own_code, &found);
    return found;
  }();
  return range;
}

bool load_debug_info(const char* library) noexcept { return load_libdw(library); }

bool resolve_with_debug_info(std::uintptr_t address, resolved_frame& out, const string_keeper& keep) noexcept {
  keeper = &keep;
  const bool found = resolve_with_libdw(address, out);
  keeper = nullptr;
  return found;
}

bool resolve_exported(std::uintptr_t address, resolved_frame& out, const string_keeper* keep) noexcept {
  if (resolve_with_dladdr(address, out, keep)) return true;
  loaded_object object{address - 1};
  if (!find_unloaded_object(object)) return false;
  out.object = keep != nullptr ? keep->keep(object.name) : object.name;
  out.object_offset = address - object.bias;
  return true;
}

const void* default_definition(const char* name, const char** object) noexcept {
  *object = nullptr;
  void* found = ::dlsym(RTLD_DEFAULT, name);
  Dl_info info{};
  void* entry = nullptr;  // the symbol's ElfW(Sym)
  // A non-PIE executable that takes the function's address gives it a canonical stub of its own,
  // which dlsym returns while the definition is elsewhere: its symbol is undefined there.
  if (found == nullptr || ::dladdr1(found, &info, &entry, RTLD_DL_SYMENT) == 0 || entry == nullptr ||
      static_cast<const ElfW(Sym)*>(entry)->st_shndx == SHN_UNDEF) {
    return nullptr;
  }
  *object = info.dli_fname;
  return found;
}

// Walks the stack with the compiler's unwinder, which reads the registers each frame saved
// (libunwind's fast walk gives return addresses only). exit() is known by its exported name, not
// its address: a non-PIE executable's address of exit is its PLT entry. So are _exit() and
// _Exit(), which a report reaches only through a definition that reports before it ends the
// process (the drop-in's): every frame below their caller is that definition's.
bool find_exit_path(exit_path& out) noexcept {
  out = exit_path{};
  if constexpr (caller_kept_registers[0] < 0) {
    return false;
  } else {
    static_assert(std::size(caller_kept_registers) <= std::size(exit_path{}.caller_registers));
    exit_walk walk;
    walk.out = &out;
    _Unwind_Backtrace(on_exit_path_frame, &walk);
    if (!walk.complete) {
      out = exit_path{};
      return false;
    }
    if (walk.immediate) {  // nothing of the program's runs below _exit: all of it
      out.frames[out.frame_count++] = {walk.frames[0].sp, walk.caller_sp};
      return true;
    }
    const void* libc = walk.frames[walk.count - 1].object;
    const auto* loader = reinterpret_cast<const void*>(::getauxval(AT_BASE));
    // A frame lies between its stack pointer and its caller's.
    for (std::size_t i = 0; i < walk.count; ++i) {
      if (walk.frames[i].object != libc && walk.frames[i].object != loader) continue;
      if (out.frame_count == exit_path::max_frames) {
        out = exit_path{};
        return false;
      }
      out.frames[out.frame_count++] = {walk.frames[i].sp, i + 1 < walk.count ? walk.frames[i + 1].sp : walk.caller_sp};
    }
    return true;
  }
}

// The kernel's signal trampoline's frame is described as a signal frame (the C library's unwind
// tables for it, or the unwinder's own knowledge of it): the unwinder then says its return address
// is the interrupted instruction itself, not a return address past a call. A walk that reaches the
// first frames of a thread ends in the C library (the main thread's __libc_start_main, then the
// executable's _start; another thread's start_thread and clone): one that ends anywhere else
// stopped at a frame without unwind tables, above which a handler may lie. The C library is the
// module that defines __libc_start_main (not _exit, which a preloaded drop-in defines too).
bool may_be_in_signal_handler() noexcept {
  signal_walk walk;
  _Unwind_Backtrace(on_frame_looking_for_a_signal, &walk);
  if (walk.signal_frame) return true;
  Dl_info info;
  const void* start = ::dlsym(RTLD_DEFAULT, "__libc_start_main");
  const void* c_library = start != nullptr && ::dladdr(start, &info) != 0 ? info.dli_fbase : nullptr;
  return c_library == nullptr || (walk.last != c_library && walk.before_last != c_library);
}

bool on_fork_in_child(void (*handler)()) noexcept { return ::pthread_atfork(nullptr, nullptr, handler) == 0; }

void write_all(int fd, const char* text, std::size_t length) noexcept {
  while (length != 0) {
    const ssize_t written = ::write(fd, text, length);
    if (written <= 0) return;
    text += written;
    length -= static_cast<std::size_t>(written);
  }
}

}  // namespace memkit::os::symbols

// ---- the drop-in's dlclose ---------------------------------------------------------------------
//
// Records what the C library's dlclose unloads, so that the stack traces taken while it was loaded
// still name its functions, files and lines (find_unloaded_object() above) instead of bare
// addresses: ld unloads its LTO plugin before its leaks are reported.
#if defined(MEMKIT_MALLOC_SHARED)
extern "C" __attribute__((visibility("default"))) int dlclose(void* handle) noexcept {
  using namespace memkit::os::symbols;
  static const auto next = reinterpret_cast<int (*)(void*)>(::dlsym(RTLD_NEXT, "dlclose"));
  if (next == nullptr) return -1;
  unloaded_object closing;
  const bool described = describe_object(handle, closing);
  const int result = next(handle);
  if (result == 0 && described) remember_if_unloaded(closing);
  return result;
}
#endif

// ---- the drop-in's dlopen ----------------------------------------------------------------------
//
// A library opened with RTLD_DEEPBIND looks its symbols up in itself and its own dependencies
// first, so its malloc and free are the C library's, not the drop-in's: PHP opens its extensions
// that way, and a block its core allocated (memkit's) freed in an extension (glibc's free) crashed
// it. The drop-in's dlopen takes the flag off, so such a library binds malloc and free where every
// other library does, and hands the call on to the C library's dlopen by a jump, not a call: the
// C library takes its caller's return address for the object that called dlopen (whose RUNPATH it
// searches, and whose namespace it loads into), which must stay the program's, not memkit's.
#if defined(MEMKIT_MALLOC_SHARED) && defined(__x86_64__)
extern "C" {
// The C library's dlopen, found at the first call (dlsym(RTLD_NEXT) from this library).
// (Both named by the assembly below only: `used` and `externally_visible` keep link-time
// optimization from dropping or renaming them.)
__attribute__((visibility("hidden"), used, externally_visible)) void* memkit_next_dlopen = nullptr;
__attribute__((visibility("hidden"), used, externally_visible)) void* memkit_find_next_dlopen() noexcept {
  void* next = ::dlsym(RTLD_NEXT, "dlopen");
  __atomic_store_n(&memkit_next_dlopen, next, __ATOMIC_RELEASE);
  return next;
}
}
static_assert(RTLD_DEEPBIND == 8, "the jump below clears bit 3 of dlopen's flags");
__asm__(R"(
  .pushsection .text
  .globl dlopen
  .type dlopen, @function
dlopen:
  endbr64
  andl $-9, %esi
  movq memkit_next_dlopen(%rip), %rax
  testq %rax, %rax
  jz 1f
  jmp *%rax
1:
  pushq %rdi
  pushq %rsi
  subq $8, %rsp
  call memkit_find_next_dlopen
  addq $8, %rsp
  popq %rsi
  popq %rdi
  testq %rax, %rax
  jz 2f
  jmp *%rax
2:
  xorl %eax, %eax
  ret
  .size dlopen, .-dlopen
  .popsection
)");
#endif
