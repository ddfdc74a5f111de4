// Debug mode: a record per block (requested size, state, stack traces) kept beside each page, the
// checks made on allocation and free, and the reports. Every check costs O(1) per operation (a
// division to find the block's index, a scan of the block's own bytes for the fill).
//
// Report format: one line naming the problem, then the relevant stack traces, each introduced by
// an indented title, then abort() unless options::abort_on_error is false.
#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "internal.hpp"
#include "report.hpp"
#include "memkit/detail/stack_trace.hpp"
#include "memkit/os.hpp"
#include "../os/symbols.hpp"

namespace memkit {
using namespace gpa;

namespace {

debug_record* record_at(const page* pg, std::size_t index) noexcept {
  return reinterpret_cast<debug_record*>(pg->records + index * pg->record_size);
}

void** alloc_frames_of(const page* pg, debug_record* r) noexcept {
  (void)pg;
  return reinterpret_cast<void**>(reinterpret_cast<unsigned char*>(r) + sizeof(debug_record));
}

void** free_frames_of(const page* pg, debug_record* r) noexcept {
  return alloc_frames_of(pg, r) + pg->record_frames;
}

// 4 KiB of the freed fill, which freed blocks are compared against with memcmp: the C library
// compares with the machine's widest vectors, where a portable loop of 8-byte words took about 80
// instructions for a 144-byte slot (callgrind), the largest share of a debug allocate and free.
constexpr auto fill_pattern = [] {
  std::array<unsigned char, 4096> bytes{};
  bytes.fill(general_allocator::freed_fill_byte);
  return bytes;
}();

// True when all `n` bytes at `p` are the freed fill.
bool fill_intact(const unsigned char* p, std::size_t n) noexcept {
  for (; n > fill_pattern.size(); n -= fill_pattern.size(), p += fill_pattern.size()) {
    if (std::memcmp(p, fill_pattern.data(), fill_pattern.size()) != 0) return false;
  }
  return std::memcmp(p, fill_pattern.data(), n) == 0;
}

constexpr std::size_t report_skip = 2;  // capture_stack_trace's caller and the debug entry point

struct current_trace {
  void* frames[general_allocator::max_stack_frames];
  std::size_t count = 0;
};

// The writer of a misuse report under the options in force (where, in which format, whether it aborts).
report_writer misuse_writer(const general_allocator::options& o) noexcept {
  return report_writer(o.report_fd, o.format, diagnostics::misuse_report{o.abort_on_error});
}

}  // namespace

bool general_allocator::impl::setup_records(page* pg) noexcept {
  const options& o = self->options_;
  const std::size_t frames = o.capture_stack_traces ? o.stack_frames : 0;
  const std::size_t record_size = detail::align_up(sizeof(debug_record) + 2 * frames * sizeof(void*), 8);
  const std::size_t bytes =
      detail::align_up(pg->reserved * (record_size + sizeof(std::uint32_t)), os::page_size());  // and live_sizes()
  auto mapped = os::map(bytes);
  if (!mapped && give_back_caches()) mapped = os::map(bytes);  // at a limit, as for a segment
  if (!mapped) return false;
  pg->records = static_cast<unsigned char*>(mapped.value());
  pg->records_bytes = static_cast<std::uint32_t>(bytes);
  pg->record_size = static_cast<std::uint16_t>(record_size);
  pg->record_frames = static_cast<std::uint16_t>(frames);
  mapped_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void general_allocator::impl::release_records(page* pg) noexcept {
  if (pg->records == nullptr) return;
  (void)os::release(pg->records, pg->records_bytes);
  mapped_bytes.fetch_sub(pg->records_bytes, std::memory_order_relaxed);
  pg->records = nullptr;
  pg->records_bytes = 0;
}

namespace {

const char* family_allocator_name(std::uint8_t family) noexcept {
  switch (family) {
    case 2: return "operator new";
    case 3: return "operator new[]";
    default: return "malloc";
  }
}

const char* family_release_name(std::uint8_t family) noexcept {
  switch (family) {
    case 2: return "operator delete";
    case 3: return "operator delete[]";
    default: return "free";
  }
}

bool is_other_family(std::uint8_t had, std::uint8_t wanted) noexcept { return wanted != 0 && had != 0 && had != wanted; }

bool is_new_family(std::uint8_t family) noexcept {
  return family == static_cast<std::uint8_t>(general_allocator::allocation_family::scalar_new) ||
         family == static_cast<std::uint8_t>(general_allocator::allocation_family::array_new);
}

// The flags a block allocated through `family` records (see alignment_flags()).
std::uint8_t allocation_flags(general_allocator::allocation_family family, std::size_t new_alignment) noexcept {
  const auto f = static_cast<std::uint8_t>(family);
  return static_cast<std::uint8_t>(f | alignment_flags(is_new_family(f) ? new_alignment : 0));
}

// Whether an operator delete or delete[] of a block from operator new or new[] names another
// alignment than the new did (the std::align_val_t of each, or none; another family is a family
// mismatch instead). (deallocate()'s alignment is not compared: C code hands blocks from
// aligned_alloc to a sized release without one, and an in-place realloc keeps the block's first
// alignment, so that the C++ interface's fuzz harness, a sound user, was reported.)
bool is_other_alignment(std::uint8_t flags, std::uint8_t wanted, std::size_t alignment) noexcept {
  return is_new_family(wanted) && is_new_family(flags & family_mask) && named_alignment(flags) != alignment;
}

// The family of the global operator new (`release`: delete) whose frame is frames[0], the caller
// of malloc (free); 0 when it is none. A library that carries its own operators, bound inside it
// (libstdc++ linked statically, as in the LLVM of Rust's toolchain), calls malloc and free from
// them, and memkit sees malloc's family for a block its code allocated with new. Symbolizes one
// frame (cached per address), so it is asked only once a mismatch is found.
std::uint8_t family_of_own_operator(void* const* frames, std::size_t count, bool release) noexcept {
  detail::resolved_frame f;
  if (count == 0 || !detail::resolve_stack_frame(frames[0], f) || f.function == nullptr) return 0;
  const char* name = release ? "operator delete" : "operator new";
  const std::size_t length = std::strlen(name);
  if (std::strncmp(f.function, name, length) != 0) return 0;
  if (f.function[length] == '(') return static_cast<std::uint8_t>(general_allocator::allocation_family::scalar_new);
  if (f.function[length] == '[') return static_cast<std::uint8_t>(general_allocator::allocation_family::array_new);
  return 0;
}

// What a release of a live block has against it, before seeing through a library's own operators.
struct release_mismatch {
  std::uint8_t had;            // the block's family
  std::uint8_t wanted;         // the release function's (0: deallocate)
  std::size_t size;            // the size it passed (0: none)
  bool wrong_size;
  std::size_t had_alignment;   // named_alignment() of the block's flags
  std::size_t alignment;       // the alignment an operator delete passed (0: none)
  bool wrong_alignment;
  bool any() const noexcept { return is_other_family(had, wanted) || wrong_size || wrong_alignment; }
};

release_mismatch check_release(std::uint8_t flags, std::uint8_t wanted, std::size_t size, std::size_t requested,
                               std::size_t alignment) noexcept {
  // free() of a malloc block, delete of a new one: nothing to compare, the common case first.
  if (size == 0 && alignment == 0 && flags == wanted) return {};
  // (A size of 0 means an unsized release, so a sized one of a 0-byte block passes 1.)
  const std::size_t sized_as = requested != 0 ? requested : 1;
  return {static_cast<std::uint8_t>(flags & family_mask), wanted, size, size != 0 && size != sized_as,
          named_alignment(flags), alignment, is_other_alignment(flags, wanted, alignment)};
}

// Seen through such operators, a malloc-family block from an operator new is that new's, and a free
// called by an operator delete is that delete. So `delete` of what the library's own `new` returned
// is no mismatch, while its `delete[]` still is one. When the block came from such a new, what it
// asked malloc for need not be the size a sized delete passes (it may round up), so that size is
// not checked. (Alignments are not compared across families: malloc's side names none that an
// operator's would.)
void see_through_own_operators(release_mismatch& m, void* const* alloc_frames, std::size_t alloc_count,
                               const current_trace& now) noexcept {
  constexpr auto malloc_family = static_cast<std::uint8_t>(general_allocator::allocation_family::malloc);
  if (!is_other_family(m.had, m.wanted)) return;
  if (m.had == malloc_family) {
    if (const std::uint8_t f = family_of_own_operator(alloc_frames, alloc_count, false)) {
      m.had = f;
      m.wrong_size = false;
    }
  } else if (m.wanted == malloc_family) {
    if (const std::uint8_t f = family_of_own_operator(now.frames, now.count, true)) m.wanted = f;
  }
}

// "operator new aligned to 64 bytes", "operator delete without an alignment".
void name_with_alignment(char (&out)[64], const char* function, std::size_t alignment) noexcept {
  if (alignment == 0) {
    std::snprintf(out, sizeof out, "%s without an alignment", function);
  } else {
    std::snprintf(out, sizeof out, "%s aligned to %zu bytes", function, alignment);
  }
}

// A live block released through another family's function (free of what operator new returned,
// ...) or, through a sized operator delete, with another size than it was allocated with (a delete
// through a base class without a virtual destructor), or through deallocate(p, size) with another
// size (a container that lost track of its capacity), or with another alignment (an aligned new
// released by a plain delete, or the reverse): one report, headed by the first of these that
// applies; the caller then frees the block as asked, as memcheck does, rather than keep it and
// report it again as a leak at exit.
void report_wrong_release(const general_allocator::options& o, const void* p, std::size_t requested,
                          const release_mismatch& m, const current_trace& now, void* const* alloc_frames,
                          std::size_t alloc_count, bool captured) noexcept {
  report_writer out = misuse_writer(o);
  const bool deallocate = m.wanted == 0;
  if (is_other_family(m.had, m.wanted)) {
    out.begin("mismatched-free", p, requested,
              "mismatched free: the %zu-byte block at " MEMKIT_ADDRESS " was allocated with %s and released with %s",
              requested, diagnostics::address(p), family_allocator_name(m.had), family_release_name(m.wanted));
  } else if (m.wrong_size && deallocate) {  // the C++ interface's deallocate(p, size)
    out.begin("mismatched-deallocate-size", p, requested,
              "mismatched deallocate size: the %zu-byte block at " MEMKIT_ADDRESS " was released with deallocate "
              "of %zu bytes",
              requested, diagnostics::address(p), m.size);
  } else if (m.wrong_size && m.wanted == static_cast<std::uint8_t>(general_allocator::allocation_family::malloc)) {
    out.begin("mismatched-free-size", p, requested,  // C23's free_sized and free_aligned_sized
              "mismatched free size: the %zu-byte block at " MEMKIT_ADDRESS " was allocated with %s and released "
              "with free_sized of %zu bytes",
              requested, diagnostics::address(p), family_allocator_name(m.had), m.size);
  } else if (m.wrong_size) {
    out.begin("mismatched-delete-size", p, requested,
              "mismatched delete size: the %zu-byte block at " MEMKIT_ADDRESS " was allocated with %s and released "
              "with a sized %s of %zu bytes",
              requested, diagnostics::address(p), family_allocator_name(m.had), family_release_name(m.wanted), m.size);
  } else {
    char allocated[64];
    char released[64];
    name_with_alignment(allocated, family_allocator_name(m.had), m.had_alignment);
    name_with_alignment(released, family_release_name(m.wanted), m.alignment);
    out.begin("mismatched-delete-alignment", p, requested,
              "mismatched delete alignment: the %zu-byte block at " MEMKIT_ADDRESS " was allocated with %s and "
              "released with %s",
              requested, diagnostics::address(p), allocated, released);
  }
  if (m.wrong_size) out.number("released_size", m.size);
  if (m.wrong_alignment) {
    out.number("allocated_alignment", m.had_alignment);
    out.number("released_alignment", m.alignment);
  }
  if (!deallocate) {
    out.word("allocated_with", family_allocator_name(m.had));
    out.word("released_with", family_release_name(m.wanted));
  }
  out.stack("released at", now.frames, now.count, captured);
  out.stack("allocated at", alloc_frames, alloc_count, captured);
  out.end();
  diagnostics::finish_misuse_report(o.abort_on_error);
}

// Where the canary after a page block's `requested` bytes ends: it takes the rest of the block's
// slot (the size class was chosen to hold at least canary_bytes of it), up to max_page_canary
// bytes, so that a write further past the end, or just before the next block (an underflow of
// that one), lands on it too. No canary when canary_bytes is 0. (A huge block's canary is
// canary_bytes: its slack is page padding, next to no other block.)
constexpr std::size_t max_page_canary = 4096;
std::size_t page_canary_end(const general_allocator::options& o, std::size_t requested, std::size_t slot) noexcept {
  if (o.canary_bytes == 0) return requested;
  return std::min(slot, requested + std::max(o.canary_bytes, max_page_canary));
}

// The guard before a debug page's first block: the end of the page's first slot, or of the slice
// before a large-class block, at most max_page_canary bytes, as a canary after a block.
std::size_t page_guard_bytes(const page* pg) noexcept {
  return std::min<std::size_t>(first_block_index(pg) == 1 ? pg->block_size : slice_size, max_page_canary);
}

std::size_t huge_canary_end(const general_allocator::options& o, const segment* s) noexcept {
  return std::min(s->huge_requested + o.canary_bytes, s->huge_size);
}

// The canary after a block's `requested` bytes, up to `end`: the offset past the block's end of its
// first byte that is no longer the canary, or `end` - `requested` when none is.
std::size_t overwritten_canary(const unsigned char* block, std::size_t requested, std::size_t end) noexcept {
  constexpr std::uint64_t canary_word = 0x0101010101010101ull * general_allocator::canary_byte;
  std::size_t i = requested;
  for (std::uint64_t word; i + sizeof word <= end; i += sizeof word) {
    std::memcpy(&word, block + i, sizeof word);
    if (word != canary_word) break;
  }
  while (i < end && block[i] == general_allocator::canary_byte) ++i;
  return i - requested;
}

// The end of a report of an overwritten canary (after a block or before it): where the block was
// freed (null: live, found by the leak check), where it was allocated.
void finish_canary_report(const general_allocator::options& o, report_writer& out, const current_trace* released,
                          bool captured, void* const* alloc_frames, std::size_t alloc_count) noexcept {
  if (released != nullptr) out.stack("freed at", released->frames, released->count, captured);
  out.stack("block allocated at", alloc_frames, alloc_count, captured);
  out.end();
  diagnostics::finish_misuse_report(o.abort_on_error);
}

// ", N bytes before the next block at 0x…" for a byte at offset `at` of a block whose slot is
// `slot` bytes (0: no block follows), when it lies in the slot's last 16 bytes: the write may
// have been meant for the block there, before its start. Empty otherwise.
struct before_next_block {
  char text[96] = "";
  before_next_block(const void* p, std::size_t at, std::size_t slot) noexcept {
    if (slot == 0 || at >= slot || slot - at > 16) return;
    std::snprintf(text, sizeof text, ", %zu byte%s before the next block at " MEMKIT_ADDRESS, slot - at,
                  slot - at == 1 ? "" : "s", diagnostics::address(static_cast<const unsigned char*>(p) + slot));
  }
};

// The `slot` of before_next_block for block `index` of a page: its slot when a block of the page
// follows (one carved, live or not), else 0: after a page's last carved slot lies memory never
// carved or the end of the page, and a large-class block is alone in its span.
std::size_t slot_before_a_block(const page* pg, std::size_t index) noexcept {
  return index + 1 < pg->capacity ? pg->block_size : 0;
}

// An overwritten canary: what was written there and how the block was found (released at `now`,
// or live when the leak check looked), then where it was allocated. A byte in the last 16 of a
// page block's slot (`slot`, slot_before_a_block()) is named by its distance to the next block too.
void report_overflow(const general_allocator::options& o, const void* p, std::size_t requested, std::size_t past,
                     std::size_t slot, const current_trace* released, bool captured, void* const* alloc_frames,
                     std::size_t alloc_count) noexcept {
  const std::size_t at = requested + past;
  const unsigned char byte = static_cast<const unsigned char*>(p)[at];
  const before_next_block before_next(p, at, slot);
  report_writer out = misuse_writer(o);
  out.begin("heap-buffer-overflow", p, requested,
            "heap buffer overflow: the canary after the %zu-byte block at " MEMKIT_ADDRESS " was overwritten "
            "(byte %zu past the end is 0x%02x%s)%s",
            requested, diagnostics::address(p), past, byte, before_next.text,
            released != nullptr ? "" : ", found by the leak check while the block is live");
  out.number("offset", requested + past);
  finish_canary_report(o, out, released, captured, alloc_frames, alloc_count);
}

// A write `before` bytes before a block, found on the guard before it (a page's first block, a huge
// block): as report_overflow(), for the block the write came before.
void report_underflow(const general_allocator::options& o, const void* p, std::size_t requested, std::size_t before,
                      const current_trace* released, bool captured, void* const* alloc_frames,
                      std::size_t alloc_count) noexcept {
  const unsigned char byte = static_cast<const unsigned char*>(p)[-static_cast<std::ptrdiff_t>(before)];
  report_writer out = misuse_writer(o);
  out.begin("heap-buffer-underflow", p, requested,
            "heap buffer underflow: the canary before the %zu-byte block at " MEMKIT_ADDRESS " was overwritten "
            "(%zu byte%s before its start is 0x%02x)%s",
            requested, diagnostics::address(p), before, before == 1 ? "" : "s", byte,
            released != nullptr ? "" : ", found by the leak check while the block is live");
  out.number("bytes_before", before);
  finish_canary_report(o, out, released, captured, alloc_frames, alloc_count);
}

// The guard before a huge block: the end of the padding between its segment header and the block,
// at most max_page_canary bytes (none when canaries are off, or where the header leaves no room).
std::size_t huge_guard_bytes(const general_allocator::options& o, const segment* s) noexcept {
  if (o.canary_bytes == 0) return 0;
  return std::min(s->huge_offset - sizeof(segment), max_page_canary);
}

// The `n`-byte guard before `block`: when a byte of it is no longer the canary, reports an
// underflow of the block (released here when `freeing`, else found by the leak check) and writes
// the guard again, so that it is reported once.
void check_guard_before(const general_allocator::options& o, unsigned char* block, std::size_t n,
                        std::size_t requested, bool freeing, std::size_t frames, void* const* alloc_frames,
                        std::size_t alloc_count) noexcept {
  if (overwritten_canary(block - n, 0, n) == n) return;  // intact, read a word at a time
  // The overwritten byte nearest to the block: a write just before its start.
  std::size_t before = 1;
  while (block[-static_cast<std::ptrdiff_t>(before)] == general_allocator::canary_byte) ++before;
  const bool captured = frames != 0;
  current_trace now;
  if (freeing && captured) now.count = detail::capture_stack_trace(now.frames, frames, report_skip);
  report_underflow(o, block, requested, before, freeing ? &now : nullptr, captured, alloc_frames, alloc_count);
  std::memset(block - n, general_allocator::canary_byte, n);
}

}  // namespace

// A freed block of a debug page must still hold the fill from byte `from` on: reports a use after
// free (with the allocation and free traces) if not. True when intact (or fills are off).
bool general_allocator::impl::check_freed_fill(page* pg, void* p, std::size_t from) noexcept {
  if (!self->options_.fill_freed_memory || fill_intact(static_cast<unsigned char*>(p) + from, pg->block_size - from))
    return true;
  report_freed_fill(pg, p, from);
  return false;
}

// check_freed_fill()'s report, out of its way (the test alone is inlined where blocks are reused).
void general_allocator::impl::report_freed_fill(page* pg, void* p, std::size_t from) noexcept {
  const options& o = self->options_;
  const std::size_t bs = pg->block_size;
  auto* bytes = static_cast<unsigned char*>(p);
  const std::size_t index = block_index(pg, static_cast<std::size_t>(bytes - reinterpret_cast<unsigned char*>(pg->start)));
  debug_record* r = record_at(pg, index);
  const bool captured = pg->record_frames != 0;
  for (std::size_t i = from; i < bs; ++i) {
    if (bytes[i] == freed_fill_byte) continue;
    current_trace now;
    if (captured) now.count = detail::capture_stack_trace(now.frames, pg->record_frames, report_skip);
    report_writer out = misuse_writer(o);
    // Past the block's bytes, at the end of its slot: maybe a write before the next block.
    const before_next_block before_next(p, i, i < r->requested ? 0 : slot_before_a_block(pg, index));
    out.begin("use-after-free", p, r->requested,
              "use after free: the %u-byte block at " MEMKIT_ADDRESS " was written after it was freed "
              "(byte %zu is 0x%02x, expected 0x%02x%s)",
              static_cast<unsigned>(r->requested), diagnostics::address(p), i, bytes[i], freed_fill_byte,
              before_next.text);
    out.number("offset", i);
    out.stack("detected at", now.frames, now.count, captured);
    out.stack("allocated at", alloc_frames_of(pg, r), r->alloc_frames, captured);
    out.stack("freed at", free_frames_of(pg, r), r->free_frames, captured);
    out.end();
    diagnostics::finish_misuse_report(o.abort_on_error);
    break;
  }
}

void* general_allocator::impl::debug_allocate(std::size_t size, std::size_t alignment, allocation_family family,
                                              std::size_t new_alignment) noexcept {
  const options& o = self->options_;
  const std::size_t canary = o.canary_bytes;
  const std::size_t frames = o.capture_stack_traces ? o.stack_frames : 0;
  const std::size_t a = alignment < default_alignment ? default_alignment : alignment;
  // A request for 0 bytes keeps its size: it is reported as 0 bytes, and its canary starts at its
  // first byte, so a write there is an overflow (without canaries it still needs a byte of slot).
  const std::size_t need = size + canary != 0 ? size + canary : 1;
  if (family == allocation_family::any) family = allocation_family::malloc;
  const std::uint8_t flags = allocation_flags(family, new_alignment);
  if (alignment <= max_class_alignment && need <= large_max && detail::align_up(need, a) <= large_max) {
    heap* h = current_heap(this);
    if (h == nullptr) return nullptr;
    const std::size_t cls = class_of(detail::align_up(need, a));
    void* p = allocate_in_class(this, h, cls, true);
    if (p == nullptr) return nullptr;
    segment* s = segment_of(p);
    page* pg = page_of(s, p);
    const std::size_t bs = pg->block_size;
    const std::size_t index = block_index(pg, static_cast<std::size_t>(static_cast<char*>(p) - pg->start));
    debug_record* r = record_at(pg, index);
    // The first word held the free-list link (cleared as the block was handed out); the rest
    // must still be the fill.
    if (r->state == freed) (void)check_freed_fill(pg, p, sizeof(block));
    r->state = live;
    r->requested = static_cast<std::uint32_t>(size);
    live_sizes(pg)[index] = static_cast<std::uint32_t>(size) + 1;
    r->free_frames = 0;
    r->flags = flags;
    r->alloc_frames = static_cast<std::uint8_t>(
        pg->record_frames != 0 ? detail::capture_stack_trace(alloc_frames_of(pg, r), pg->record_frames, report_skip) : 0);
    std::memset(static_cast<unsigned char*>(p) + size, canary_byte, page_canary_end(o, size, bs) - size);
    return p;
  }
  void* p = huge_allocate(size + canary, alignment, false);
  if (p == nullptr) return nullptr;
  segment* s = segment_of(p);
  s->pages[0].debug = true;
  s->huge_requested = size;
  s->huge_flags = flags;
  s->huge_alloc_frames = static_cast<std::uint8_t>(
      frames != 0 ? detail::capture_stack_trace(s->huge_frames, frames, report_skip) : 0);
  s->pages[0].record_frames = static_cast<std::uint16_t>(frames);
  std::memset(static_cast<unsigned char*>(p) + size, canary_byte, canary);
  const std::size_t guard = huge_guard_bytes(o, s);
  std::memset(static_cast<unsigned char*>(p) - guard, canary_byte, guard);
  return p;
}

void* general_allocator::allocate_in_family(std::size_t size, std::size_t alignment, allocation_family family,
                                            std::size_t new_alignment) noexcept {
  detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
  impl* im = impl_;
  if (im == nullptr) return allocation_failure();
  if (MEMKIT_UNLIKELY(!detail::is_power_of_two(alignment))) return allocation_failure(EINVAL);
  if (MEMKIT_UNLIKELY(size > max_allocation_size)) return allocation_failure();
  if (detail::symbolizing_on_this_thread()) return im->allocate_generic(size, alignment, false);  // plain
  void* p = im->debug_allocate(size, alignment, family, new_alignment);
  return p != nullptr ? p : allocation_failure();
}

void general_allocator::free_in_family(void* p, allocation_family family, std::size_t size,
                                       std::size_t alignment) noexcept {
  if (p == nullptr) return;
  detail::set_capture_origin(MEMKIT_CALLER_ADDRESS());
  impl_->debug_free(p, family, size, alignment);
}

void general_allocator::impl::report_foreign(const void* p, const char* what) noexcept {
  const options& o = self->options_;
  current_trace now;
  if (o.capture_stack_traces) now.count = detail::capture_stack_trace(now.frames, o.stack_frames, report_skip);
  report_writer out = misuse_writer(o);
  out.begin("foreign-free", p, 0, "%s: " MEMKIT_ADDRESS, what, diagnostics::address(p));
  out.stack("freed at", now.frames, now.count, o.capture_stack_traces);
  out.end();
  diagnostics::finish_misuse_report(o.abort_on_error);
}

// A pointer past the first 4 MiB of a huge block masks to no segment header: looks it up among
// the live huge blocks (an error path, so a walk is fine). True if it was one, and reported.
bool general_allocator::impl::report_interior_of_huge(const void* p) noexcept {
  const auto* c = static_cast<const unsigned char*>(p);
  const unsigned char* start = nullptr;
  std::size_t requested = 0;
  void* frames[max_stack_frames];
  std::size_t frame_count = 0;
  bool captured = false;
  {
    lock_guard guard(lock);
    for (const segment* s = huge_live; s != nullptr; s = s->next) {
      const auto* block = reinterpret_cast<const unsigned char*>(s->pages[0].start);
      if (c <= block || c >= block + s->huge_size) continue;
      start = block;
      requested = s->huge_requested;
      frame_count = s->huge_alloc_frames;
      std::memcpy(frames, s->huge_frames, frame_count * sizeof(void*));
      captured = s->pages[0].record_frames != 0;
      break;
    }
  }
  if (start == nullptr) return false;
  const options& o = self->options_;
  current_trace now;
  if (captured) now.count = detail::capture_stack_trace(now.frames, max_stack_frames, report_skip);
  report_writer out = misuse_writer(o);
  out.begin("interior-free", p, requested,
            "free of an interior pointer " MEMKIT_ADDRESS " (%zu bytes into the %zu-byte block at " MEMKIT_ADDRESS ")",
            diagnostics::address(p), static_cast<std::size_t>(c - start), requested, diagnostics::address(start));
  out.stack("freed at", now.frames, now.count, captured);
  out.stack("block allocated at", frames, frame_count, captured);
  out.end();
  diagnostics::finish_misuse_report(o.abort_on_error);
  return true;
}

void general_allocator::impl::debug_free(void* p, allocation_family family, std::size_t size,
                                         std::size_t alignment) noexcept {
  const errno_keeper keep_errno;
  const options& o = self->options_;
  const std::uintptr_t base = (reinterpret_cast<std::uintptr_t>(p) - 1) & ~segment_mask;
  if (!segment_map_contains(base) || reinterpret_cast<segment*>(base)->instance != this) {
    if (!report_interior_of_huge(p)) report_foreign(p, "free of a pointer this allocator did not allocate");
    return;
  }
  auto* s = reinterpret_cast<segment*>(base);
  auto* c = static_cast<unsigned char*>(p);
  const auto wanted = static_cast<std::uint8_t>(family);
  if (s->kind == segment_kind::huge) {
    page& pg = s->pages[0];
    const bool captured = pg.record_frames != 0;
    current_trace now;
    auto capture_now = [&] {
      if (captured) now.count = detail::capture_stack_trace(now.frames, pg.record_frames, report_skip);
    };
    if (!s->huge_live) {
      capture_now();
      report_writer out = misuse_writer(o);
      out.begin("double-free", p, s->huge_requested, "double free of " MEMKIT_ADDRESS " (huge block of %zu bytes)",
                diagnostics::address(p), s->huge_requested);
      out.stack("freed again at", now.frames, now.count, captured);
      out.stack("allocated at", s->huge_frames, s->huge_alloc_frames, captured);
      out.stack("first freed at", s->huge_frames + max_stack_frames, s->huge_free_frames, captured);
      out.end();
      diagnostics::finish_misuse_report(o.abort_on_error);
      return;
    }
    if (c != reinterpret_cast<unsigned char*>(pg.start)) {
      capture_now();
      report_writer out = misuse_writer(o);
      out.begin("interior-free", p, s->huge_requested,
                "free of an interior pointer " MEMKIT_ADDRESS " (%zu bytes into the %zu-byte block at " MEMKIT_ADDRESS ")",
                diagnostics::address(p), static_cast<std::size_t>(c - reinterpret_cast<unsigned char*>(pg.start)),
                s->huge_requested, diagnostics::address(pg.start));
      out.stack("freed at", now.frames, now.count, captured);
      out.stack("block allocated at", s->huge_frames, s->huge_alloc_frames, captured);
      out.end();
      diagnostics::finish_misuse_report(o.abort_on_error);
      return;
    }
    if (pg.debug) {
      release_mismatch m = check_release(s->huge_flags, wanted, size, s->huge_requested, alignment);
      if (m.any()) {
        capture_now();
        see_through_own_operators(m, s->huge_frames, s->huge_alloc_frames, now);
        if (m.any()) {
          report_wrong_release(o, p, s->huge_requested, m, now, s->huge_frames, s->huge_alloc_frames, captured);
        }
      }
      const std::size_t canary_end = huge_canary_end(o, s);
      const std::size_t past = overwritten_canary(c, s->huge_requested, canary_end);
      if (s->huge_requested + past < canary_end) {
        capture_now();
        report_overflow(o, p, s->huge_requested, past, 0, &now, captured, s->huge_frames, s->huge_alloc_frames);
      }
      check_guard_before(o, c, huge_guard_bytes(o, s), s->huge_requested, true, pg.record_frames, s->huge_frames,
                         s->huge_alloc_frames);
      // Kept in the header while the block sits in the cache, for a later double-free report.
      s->huge_free_frames = static_cast<std::uint8_t>(
          captured ? detail::capture_stack_trace(s->huge_frames + max_stack_frames, pg.record_frames, report_skip) : 0);
    }
    huge_free(s);
    return;
  }
  page* pg = block_page(s, p);
  if (!pg->in_use || c < reinterpret_cast<unsigned char*>(pg->start)) {
    report_foreign(p, "free of a pointer this allocator did not allocate");
    return;
  }
  const std::size_t bs = pg->block_size;
  const std::size_t offset = static_cast<std::size_t>(c - reinterpret_cast<unsigned char*>(pg->start));
  const std::size_t index = block_index(pg, offset);
  const std::size_t within = offset - index * bs;
  if (index >= pg->capacity) {
    report_foreign(p, "free of a pointer this allocator did not allocate");
    return;
  }
  if (!pg->debug) {  // a block from before debug mode was switched on: free it normally
    if (within != 0) {
      report_foreign(p, "free of an interior pointer");
      return;
    }
    free_block(s, pg, p);
    return;
  }
  debug_record* r = record_at(pg, index);
  unsigned char* block_start = reinterpret_cast<unsigned char*>(pg->start) + index * bs;
  const bool captured = pg->record_frames != 0;
  current_trace now;
  release_mismatch m = check_release(r->flags, wanted, size, r->requested, alignment);
  const bool mismatched = m.any();
  if (within != 0 || r->state != live || mismatched) {
    if (captured) now.count = detail::capture_stack_trace(now.frames, pg->record_frames, report_skip);
  }
  // A slot never handed out is no block: a pointer into it is reported below as foreign.
  if (within != 0 && r->state != never_used) {
    report_writer out = misuse_writer(o);
    out.begin("interior-free", p, r->requested,
              "free of an interior pointer " MEMKIT_ADDRESS " (%zu bytes into the %u-byte block at " MEMKIT_ADDRESS ")",
              diagnostics::address(p), within, static_cast<unsigned>(r->requested), diagnostics::address(block_start));
    out.stack("freed at", now.frames, now.count, captured);
    out.stack("block allocated at", alloc_frames_of(pg, r), r->alloc_frames, captured);
    if (r->state == freed) out.stack("block freed at", free_frames_of(pg, r), r->free_frames, captured);
    out.end();
    diagnostics::finish_misuse_report(o.abort_on_error);
    return;
  }
  if (r->state != live) {
    report_writer out = misuse_writer(o);
    if (r->state == freed) {
      out.begin("double-free", p, r->requested, "double free of " MEMKIT_ADDRESS " (block of %u bytes)", diagnostics::address(p),
                static_cast<unsigned>(r->requested));
      out.stack("freed again at", now.frames, now.count, captured);
      out.stack("allocated at", alloc_frames_of(pg, r), r->alloc_frames, captured);
      out.stack("first freed at", free_frames_of(pg, r), r->free_frames, captured);
    } else {
      out.begin("foreign-free", p, 0, "free of a pointer this allocator did not allocate: " MEMKIT_ADDRESS,
                diagnostics::address(p));
      out.stack("freed at", now.frames, now.count, captured);
    }
    out.end();
    diagnostics::finish_misuse_report(o.abort_on_error);
    return;
  }
  if (mismatched) {
    see_through_own_operators(m, alloc_frames_of(pg, r), r->alloc_frames, now);
    if (m.any()) {
      report_wrong_release(o, p, r->requested, m, now, alloc_frames_of(pg, r), r->alloc_frames, captured);
    }
  }
  const std::size_t requested = r->requested;
  const std::size_t canary_end = page_canary_end(o, requested, bs);
  const std::size_t past = overwritten_canary(c, requested, canary_end);
  if (requested + past < canary_end) {
    if (captured) now.count = detail::capture_stack_trace(now.frames, pg->record_frames, report_skip);
    report_overflow(o, p, requested, past, slot_before_a_block(pg, index), &now, captured, alloc_frames_of(pg, r),
                    r->alloc_frames);
  }
  if (index == first_block_index(pg)) check_page_guard(pg, true);  // the page's first block: the guard before it
  r->state = freed;
  live_sizes(pg)[index] = 0;
  r->free_frames = static_cast<std::uint8_t>(
      captured ? detail::capture_stack_trace(free_frames_of(pg, r), pg->record_frames, report_skip) : 0);
  if (o.fill_freed_memory) std::memset(c, freed_fill_byte, bs);
  if (o.never_reuse_addresses) {
    // Retire the address. The owner gives the page's memory back once every block is retired.
    if (s->thread_id.load(std::memory_order_relaxed) == current_thread_id() && --pg->used == 0 &&
        pg->capacity == pg->reserved) {
      // The OS pages inside the page's area only: with MEMKIT_PAGE_SIZE above 64 KiB, rounding its
      // start down would reach the memory of the pages (or spans) before it.
      const std::size_t os_page = os::page_size();
      const std::uintptr_t begin = detail::align_up(reinterpret_cast<std::uintptr_t>(pg->start), os_page);
      const std::uintptr_t end = detail::align_down(reinterpret_cast<std::uintptr_t>(pg->area_end), os_page);
      if (begin < end) (void)os::discard(reinterpret_cast<void*>(begin), end - begin);
    }
    return;
  }
  quarantine_then_free(s, pg, p);
}

namespace {

// A power of two of entries: an index wraps with a mask, no division on the free path.
constexpr std::size_t quarantine_ring_bytes = std::size_t{512} << 10;  // 65,536 entries at most
static_assert(std::has_single_bit(quarantine_ring_bytes / sizeof(void*)));

// Caller holds the lock: takes the oldest block out of the quarantine.
void* take_oldest(general_allocator::impl& im) noexcept {
  void* oldest = im.quarantine[im.quarantine_first];
  im.quarantine_held -= page_of(segment_of(oldest), oldest)->block_size;
  im.quarantine_first = (im.quarantine_first + 1) & (im.quarantine_slots - 1);
  --im.quarantine_count;
  return oldest;
}

}  // namespace

// Puts a block freed in debug mode (already marked freed and filled) into the quarantine, and
// frees for real the oldest blocks that no longer fit. The block first joins the calling thread's
// pending batch, which enters the ring, under the instance's lock, once it holds
// heap::quarantine_batch blocks or heap::quarantine_batch_bytes: one locked instruction per batch,
// not per free, and no contention on the lock between threads that free. A pending block is as
// quarantined as one in the ring (not reusable, its fill checked when it leaves), so each thread
// holds at most a batch beyond quarantine_bytes. A thread with no heap puts its block in the ring
// at once; with the quarantine off, the block is freed at once.
void general_allocator::impl::quarantine_then_free(segment* s, page* pg, void* p) noexcept {
  heap* h = attached_heap(this);
  if (self->options_.quarantine_bytes == 0) {
    if (h != nullptr && h->quarantine_pending != 0) hand_over_quarantined(h);  // turned off meanwhile
    free_block(s, pg, p);
    return;
  }
  if (h == nullptr) {  // a thread that never allocated: a batch of one
    enter_quarantine(&p, 1, pg->block_size);
    return;
  }
  h->quarantine_blocks[h->quarantine_pending++] = p;
  h->quarantine_pending_bytes += pg->block_size;
  if (h->quarantine_pending == heap::quarantine_batch || h->quarantine_pending_bytes >= heap::quarantine_batch_bytes)
    hand_over_quarantined(h);
}

void general_allocator::impl::hand_over_quarantined(heap* h) noexcept {
  const std::size_t count = h->quarantine_pending;
  const std::size_t bytes = h->quarantine_pending_bytes;
  h->quarantine_pending = 0;
  h->quarantine_pending_bytes = 0;
  enter_quarantine(h->quarantine_blocks, count, bytes);
}

// Puts `count` blocks of `bytes` in all at the back of the ring and frees for real the oldest
// that no longer fit (all of them when the quarantine is off or its ring cannot be mapped).
void general_allocator::impl::enter_quarantine(void* const* blocks, std::size_t count, std::size_t bytes) noexcept {
  const std::size_t limit = self->options_.quarantine_bytes;
  // Evictions per call: a batch's worth and as many again, so that the ring catches up after the
  // limit shrank; the rest go with the next batches.
  constexpr std::size_t most = 2 * heap::quarantine_batch;
  void* evicted[most];
  std::size_t evicted_count = 0;
  {
    lock_guard guard(lock);
    if (quarantine == nullptr && limit != 0) {
      if (auto ring = os::map(quarantine_ring_bytes)) {
        quarantine = static_cast<void**>(ring.value());
        quarantine_slots = quarantine_ring_bytes / sizeof(void*);
      }
    }
    if (quarantine == nullptr || limit == 0) {
      std::copy(blocks, blocks + count, evicted);
      evicted_count = count;
    } else {
      for (std::size_t i = 0; i < count; ++i) {
        if (quarantine_count == quarantine_slots) evicted[evicted_count++] = take_oldest(*this);  // full
        quarantine[(quarantine_first + quarantine_count) & (quarantine_slots - 1)] = blocks[i];
        ++quarantine_count;
      }
      quarantine_held += bytes;
      while (quarantine_held > limit && evicted_count < most) evicted[evicted_count++] = take_oldest(*this);
    }
  }
  for (std::size_t i = 0; i < evicted_count; ++i) release_from_quarantine(evicted[i]);
}

// Frees for real a block leaving the quarantine, after checking that nothing wrote to it there.
void general_allocator::impl::release_from_quarantine(void* p) noexcept {
  segment* owner = segment_of(p);
  page* pg = page_of(owner, p);
  if (pg->debug) (void)check_freed_fill(pg, p, 0);
  free_block(owner, pg, p);
}

// Checks every block still in the quarantine for writes after free (the leak report at exit does,
// so a write to a block that is never reused is still found): the ring, after the calling
// thread's pending batch joins it. (Other running threads' batches, at most a batch each, are
// not read; an exited thread's joined the ring when it exited.)
void general_allocator::impl::check_quarantine() noexcept {
  if (heap* h = attached_heap(this); h != nullptr && h->quarantine_pending != 0) hand_over_quarantined(h);
  constexpr std::size_t most = 16;  // reports per call
  void* written[most];
  std::size_t found = 0;
  {
    lock_guard guard(lock);
    for (std::size_t i = 0; i < quarantine_count && found < most; ++i) {
      void* p = quarantine[(quarantine_first + i) & (quarantine_slots - 1)];
      page* pg = page_of(segment_of(p), p);
      if (self->options_.fill_freed_memory && !fill_intact(static_cast<unsigned char*>(p), pg->block_size))
        written[found++] = p;
    }
  }
  for (std::size_t i = 0; i < found; ++i) (void)check_freed_fill(page_of(segment_of(written[i]), written[i]), written[i], 0);
}

void general_allocator::impl::fill_page_guard(page* pg) noexcept {
  if (!has_page_guard(pg) || self->options_.canary_bytes == 0) return;
  const std::size_t n = page_guard_bytes(pg);
  std::memset(pg->start + first_block_index(pg) * pg->block_size - n, canary_byte, n);
}

void general_allocator::impl::check_page_guard(page* pg, bool freeing) noexcept {
  const options& o = self->options_;
  if (!has_page_guard(pg) || o.canary_bytes == 0) return;
  const std::size_t first = first_block_index(pg);
  debug_record* r = record_at(pg, first);
  check_guard_before(o, reinterpret_cast<unsigned char*>(pg->start) + first * pg->block_size, page_guard_bytes(pg),
                     r->requested, freeing, pg->record_frames, alloc_frames_of(pg, r), r->alloc_frames);
}

void general_allocator::impl::check_live_guards() noexcept {
  for (heap* h = heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      for (unsigned i = 0; i < s->page_count; ++i) {
        page* pg = &s->pages[i];
        if (pg->in_use && has_page_guard(pg) && live_sizes(pg)[first_block_index(pg)] != 0) {
          check_page_guard(pg, false);
        }
      }
    }
  }
  const options& o = self->options_;
  if (o.canary_bytes == 0) return;
  // The huge blocks whose guard is overwritten, reported once the lock is released (symbolizing a
  // report may allocate). The leak check runs this only when no other thread runs
  // (leak_scanner::checked_canaries()), so the blocks stay.
  constexpr std::size_t most = 16;  // reports per call
  segment* written[most];
  std::size_t found = 0;
  {
    lock_guard guard(lock);
    for (segment* s = huge_live; s != nullptr && found < most; s = s->next) {
      const std::size_t n = huge_guard_bytes(o, s);
      if (s->pages[0].debug && overwritten_canary(reinterpret_cast<unsigned char*>(s->pages[0].start) - n, 0, n) != n) {
        written[found++] = s;
      }
    }
  }
  for (std::size_t i = 0; i < found; ++i) {
    segment* s = written[i];
    check_guard_before(o, reinterpret_cast<unsigned char*>(s->pages[0].start), huge_guard_bytes(o, s), s->huge_requested,
                       false, s->pages[0].record_frames, s->huge_frames, s->huge_alloc_frames);
  }
}

// A live block whose canary the leak scan found overwritten (leaks.cpp): one report (then the
// canary is written again, so that the block's free does not report it a second time), or nothing
// when its canary is intact by now (a block the scan listed twice).
void general_allocator::impl::report_live_overflow(const void* p) noexcept {
  const options& o = self->options_;
  segment* s = segment_of(p);
  auto* c = static_cast<unsigned char*>(const_cast<void*>(p));
  if (s->kind == segment_kind::huge) {
    const std::size_t canary_end = huge_canary_end(o, s);
    const std::size_t past = overwritten_canary(c, s->huge_requested, canary_end);
    if (s->huge_requested + past == canary_end) return;
    report_overflow(o, c, s->huge_requested, past, 0, nullptr, s->pages[0].record_frames != 0, s->huge_frames,
                    s->huge_alloc_frames);
    std::memset(c + s->huge_requested, canary_byte, canary_end - s->huge_requested);
    return;
  }
  page* pg = page_of(s, p);
  const std::size_t bs = pg->block_size;
  const std::size_t index = block_index(pg, static_cast<std::size_t>(reinterpret_cast<char*>(c) - pg->start));
  debug_record* r = record_at(pg, index);
  const std::size_t canary_end = page_canary_end(o, r->requested, bs);
  const std::size_t past = overwritten_canary(c, r->requested, canary_end);
  if (r->requested + past == canary_end) return;
  report_overflow(o, c, r->requested, past, slot_before_a_block(pg, index), nullptr, pg->record_frames != 0,
                  alloc_frames_of(pg, r), r->alloc_frames);
  std::memset(c + r->requested, canary_byte, canary_end - r->requested);
}

// Frees every block in the quarantine now (purge(), configure() turning it off or down).
void general_allocator::impl::flush_quarantine(bool every_heap) noexcept {
  if (every_heap) {
    for (heap* h = heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
      if (h->quarantine_pending != 0) hand_over_quarantined(h);
    }
  } else if (heap* h = attached_heap(this); h != nullptr && h->quarantine_pending != 0) {
    hand_over_quarantined(h);
  }
  for (;;) {
    void* oldest = nullptr;
    {
      lock_guard guard(lock);
      if (quarantine_count == 0) return;
      oldest = take_oldest(*this);
    }
    release_from_quarantine(oldest);
  }
}

std::size_t general_allocator::impl::debug_usable_size(const void* p) const noexcept {
  segment* s = segment_of(p);
  if (s->kind == segment_kind::huge) return s->huge_requested;
  page* pg = page_of(s, p);
  const std::size_t index = block_index(pg, static_cast<std::size_t>(static_cast<const char*>(p) - pg->start));
  return record_at(pg, index)->requested;
}

bool general_allocator::impl::debug_resize(void* p, std::size_t new_size) noexcept {
  const std::size_t canary = self->options_.canary_bytes;
  segment* s = segment_of(p);
  auto* c = static_cast<unsigned char*>(p);
  if (s->kind == segment_kind::huge) {
    if (!huge_resize(s, new_size + canary)) return false;
    s->huge_requested = new_size;
    std::memset(c + new_size, canary_byte, canary);
    return true;
  }
  page* pg = page_of(s, p);
  const std::size_t bs = pg->block_size;
  if (new_size + canary > bs) return false;
  const std::size_t index = block_index(pg, static_cast<std::size_t>(static_cast<char*>(p) - pg->start));
  record_at(pg, index)->requested = static_cast<std::uint32_t>(new_size);
  live_sizes(pg)[index] = static_cast<std::uint32_t>(new_size) + 1;
  std::memset(c + new_size, canary_byte, page_canary_end(self->options_, new_size, bs) - new_size);
  return true;
}

// Debug mode: the block at `p` as the checks of realloc and malloc_usable_size see it. Fills
// `pg_out`/`r_out` for a block of a debug page, `huge_out` for a large one.
namespace {

enum class block_state { foreign, untracked, live, freed };

block_state classify_pointer(const general_allocator::impl* im, const void* p, segment** s_out, page** pg_out,
                             debug_record** r_out) noexcept {
  const std::uintptr_t base = (reinterpret_cast<std::uintptr_t>(p) - 1) & ~segment_mask;
  if (!segment_map_contains(base) || reinterpret_cast<segment*>(base)->instance != im) return block_state::foreign;
  auto* s = reinterpret_cast<segment*>(base);
  *s_out = s;
  const auto* c = static_cast<const unsigned char*>(p);
  if (s->kind == segment_kind::huge) {
    if (c != reinterpret_cast<const unsigned char*>(s->pages[0].start)) return block_state::foreign;
    if (!s->pages[0].debug) return block_state::untracked;
    return s->huge_live ? block_state::live : block_state::freed;
  }
  page* pg = block_page(s, p);
  *pg_out = pg;
  if (!pg->in_use || c < reinterpret_cast<const unsigned char*>(pg->start)) return block_state::foreign;
  const std::size_t offset = static_cast<std::size_t>(c - reinterpret_cast<const unsigned char*>(pg->start));
  const std::size_t index = block_index(pg, offset);
  if (index >= pg->capacity || offset != index * pg->block_size) return block_state::foreign;
  if (!pg->debug) return block_state::untracked;
  debug_record* r = record_at(pg, index);
  *r_out = r;
  return r->state == live ? block_state::live : r->state == freed ? block_state::freed : block_state::foreign;
}

}  // namespace

// One report for an operation (realloc, malloc_usable_size) given a pointer that is not a live
// block, or a live block of another family (realloc of what operator new or new[] returned): the
// operation's stack first, then the block's history when it had one.
static void report_bad_operation(const general_allocator::impl* im, const char* kind, const char* operation,
                                 const void* p, block_state state, segment* s, page* pg, debug_record* r) noexcept {
  const general_allocator::options& o = im->self->current_options();
  const bool captured = o.capture_stack_traces;
  current_trace now;
  if (captured) now.count = detail::capture_stack_trace(now.frames, o.stack_frames, report_skip);
  report_writer out = misuse_writer(o);
  if (state == block_state::foreign) {
    out.begin(kind, p, 0, "%s of a pointer this allocator did not allocate: " MEMKIT_ADDRESS, operation,
              diagnostics::address(p));
    out.stack("called at", now.frames, now.count, captured);
  } else {
    const std::size_t requested = r != nullptr ? r->requested : s->huge_requested;
    if (state == block_state::freed) {
      out.begin(kind, p, requested, "%s of a freed pointer " MEMKIT_ADDRESS " (block of %zu bytes)", operation,
                diagnostics::address(p), requested);
    } else {
      const std::uint8_t had = (r != nullptr ? r->flags : s->huge_flags) & family_mask;
      out.begin(kind, p, requested,
                "mismatched %s: the %zu-byte block at " MEMKIT_ADDRESS " was allocated with %s and passed to %s",
                operation, requested, diagnostics::address(p), family_allocator_name(had), operation);
      out.word("allocated_with", family_allocator_name(had));
    }
    out.stack("called at", now.frames, now.count, captured);
    if (r != nullptr) {
      const bool recorded = pg->record_frames != 0;
      out.stack("allocated at", alloc_frames_of(pg, r), r->alloc_frames, recorded);
      if (state == block_state::freed) out.stack("freed at", free_frames_of(pg, r), r->free_frames, recorded);
    } else {
      const bool recorded = s->pages[0].record_frames != 0;
      out.stack("allocated at", s->huge_frames, s->huge_alloc_frames, recorded);
      if (state == block_state::freed) {
        out.stack("freed at", s->huge_frames + general_allocator::max_stack_frames, s->huge_free_frames, recorded);
      }
    }
  }
  out.end();
  diagnostics::finish_misuse_report(o.abort_on_error);
}

std::size_t general_allocator::impl::debug_checked_usable_size(const void* p) const noexcept {
  segment* s = nullptr;
  page* pg = nullptr;
  debug_record* r = nullptr;
  const block_state state = classify_pointer(this, p, &s, &pg, &r);
  if (state == block_state::live) return debug_usable_size(p);
  if (state == block_state::untracked) {
    return s->kind == segment_kind::huge ? s->huge_size : pg->block_size;
  }
  report_bad_operation(this, state == block_state::freed ? "usable-size-of-freed" : "usable-size-of-foreign",
                       "malloc_usable_size", p, state, s, pg, r);
  return 0;
}

// realloc's check: true when `p` may be reallocated (a live block, or one from before debug mode).
bool general_allocator::impl::debug_check_reallocate(void* p) noexcept {
  segment* s = nullptr;
  page* pg = nullptr;
  debug_record* r = nullptr;
  const block_state state = classify_pointer(this, p, &s, &pg, &r);
  if (state == block_state::untracked) return true;
  if (state == block_state::live) {
    const std::uint8_t family = (r != nullptr ? r->flags : s->huge_flags) & family_mask;
    if (family != static_cast<std::uint8_t>(allocation_family::scalar_new) &&
        family != static_cast<std::uint8_t>(allocation_family::array_new)) {
      return true;
    }
    // Going on, the block is resized as asked, as after a mismatched free (debug_free).
    report_bad_operation(this, "mismatched-realloc", "realloc", p, state, s, pg, r);
    return true;
  }
  report_bad_operation(this, state == block_state::freed ? "realloc-of-freed" : "realloc-of-foreign", "realloc", p,
                       state, s, pg, r);
  return false;
}

// Outside debug mode there are no records: the live block count of each page, no traces.
static std::size_t report_live_pages(const general_allocator::impl* im, int fd) noexcept {
  std::size_t count = 0;
  std::size_t bytes = 0;
  for (heap* h = im->heaps.load(std::memory_order_acquire); h != nullptr; h = h->next_registered) {
    for (segment* s = h->segments; s != nullptr; s = s->next) {
      for (unsigned i = 0; i < s->page_count; ++i) {
        page* pg = &s->pages[i];
        if (!pg->in_use || pg->used == 0) continue;
        diagnostics::print(fd, "memkit: %u live blocks of %u bytes in the page at " MEMKIT_ADDRESS " (no debug records)\n",
                     static_cast<unsigned>(pg->used), pg->block_size, diagnostics::address(pg->start));
        count += pg->used;
        bytes += static_cast<std::size_t>(pg->used) * pg->block_size;
      }
    }
  }
  auto* mutable_im = const_cast<general_allocator::impl*>(im);
  mutable_im->lock.lock();
  for (segment* s = im->huge_live; s != nullptr; s = s->next) {
    ++count;
    bytes += s->huge_size;
    diagnostics::print(fd, "memkit: live huge block of %zu bytes at " MEMKIT_ADDRESS "\n", s->huge_size,
                       diagnostics::address(s->pages[0].start));
  }
  mutable_im->lock.unlock();
  if (count != 0) diagnostics::print(fd, "memkit: %zu live blocks, %zu bytes in total\n", count, bytes);
  return count;
}

namespace {

// options::report_cost's line (kind "leak-scan" in JSON).
void report_cost(int fd, general_allocator::report_format format, const general_allocator::leak_summary& s) noexcept {
  const std::size_t blocks = s.definitely_lost_blocks + s.indirectly_lost_blocks + s.reachable_blocks + s.suppressed_blocks;
  const std::size_t bytes = s.definitely_lost_bytes + s.indirectly_lost_bytes + s.reachable_bytes + s.suppressed_bytes;
  const auto ms = [](std::uint64_t ns) { return static_cast<unsigned long long>(ns / 1000000u); };
  const auto ms_fraction = [](std::uint64_t ns) { return static_cast<unsigned long long>(ns / 1000u % 1000u); };
  report_writer out(fd, format);
  out.begin("leak-scan", nullptr, 0,
            "leak scan: %zu live blocks, %zu bytes, %zu bytes of roots; CPU: scan %llu.%03llu ms, writing %llu.%03llu ms",
            blocks, bytes, s.root_bytes, ms(s.scan_cpu_ns), ms_fraction(s.scan_cpu_ns), ms(s.writing_cpu_ns),
            ms_fraction(s.writing_cpu_ns));
  out.number("live_blocks", blocks);
  out.number("live_bytes", bytes);
  out.number("root_bytes", s.root_bytes);
  out.number("scan_cpu_ns", static_cast<std::size_t>(s.scan_cpu_ns));
  out.number("writing_cpu_ns", static_cast<std::size_t>(s.writing_cpu_ns));
  out.end();
}

// The report proper, below the frame of report_leaks_of.
[[gnu::noinline]] std::size_t report_leaks_from(general_allocator::impl* im, int fd,
                                                general_allocator::leak_summary& summary, std::uintptr_t stack_start,
                                                const void* saved) noexcept {
  summary = general_allocator::leak_summary{};
  if (im == nullptr) return 0;
  im->check_quarantine();
  const general_allocator::options& o = im->self->current_options();
  if (!o.debug) return report_live_pages(im, fd);
  // Below exit(), the frames of the C library and the loader above this one hold only stale words
  // of the program's returned frames (such as a block main's callee lost), which memcheck, reading
  // only the words written since their frame was made, does not take as pointers: not read.
  // Walked before the report stops the other threads (the walk takes the loader's lock).
  os::symbols::exit_path exit;
  const bool below_exit = os::symbols::find_exit_path(exit);
  // The snapshot leaves out the argument registers, which hold whatever the last calls left there.
  os::register_snapshot registers;
  MEMKIT_OS_CAPTURE_REGISTERS(registers);
  gpa::calling_thread_roots caller;
  caller.registers = &registers;
  caller.register_bytes = sizeof registers;
  caller.saved = saved;
  caller.saved_bytes = saved != nullptr ? os::callee_saved_bytes : 0;
  caller.stack_low = stack_start;
  caller.exit = below_exit ? &exit : nullptr;
  const std::size_t lost = im->report_lost_blocks(fd, caller, summary);
  if (o.report_cost) report_cost(fd, o.format, summary);
  __asm__ volatile("" : : "r"(&registers) : "memory");  // keeps the frame (no tail call)
  return lost;
}

// Reached through os::call_with_callee_saved from report_leaks (below), which stored the caller's
// callee-saved registers at `saved` first: the prologues from here on may save them in their own
// frames, below the scanned stack, and reuse them before the register snapshot is taken. `result`
// is the caller's leak_summary, or null when the caller wants none.
std::size_t report_leaks_of(const void* allocator, std::uintptr_t fd, void* result, std::uintptr_t stack_start,
                            const void* saved) noexcept {
  general_allocator::leak_summary unused;
  return report_leaks_from(const_cast<general_allocator::impl*>(static_cast<const general_allocator::impl*>(allocator)),
                           static_cast<int>(fd),
                           result != nullptr ? *static_cast<general_allocator::leak_summary*>(result) : unused,
                           stack_start, saved);
}

}  // namespace

// The roots of the calling thread: the caller's stack from above this frame's return address and
// the argument home space the caller reserved for it (Windows x64), its callee-saved registers
// (stored by os::call_with_callee_saved before anything here could reuse them: both overloads only
// forward, in a tail call, and keep nothing in a frame of their own), and the registers
// report_leaks_of sees. Neither the scan's own frames (which hold block addresses while it runs)
// nor slots this call left unwritten (which still hold what the caller's returned callees left
// there, such as a block the caller just lost) are taken as roots.
[[gnu::noinline]] MEMKIT_OS_FORWARDS_CALLEE_SAVED std::size_t general_allocator::report_leaks(int fd) const noexcept {
  return os::call_with_callee_saved(&report_leaks_of, impl_, static_cast<std::uintptr_t>(fd), nullptr,
                                    MEMKIT_OS_CALLER_STACK_START());
}

[[gnu::noinline]] MEMKIT_OS_FORWARDS_CALLEE_SAVED std::size_t general_allocator::report_leaks(int fd,
                                                                                             leak_summary& summary) const noexcept {
  return os::call_with_callee_saved(&report_leaks_of, impl_, static_cast<std::uintptr_t>(fd), &summary,
                                    MEMKIT_OS_CALLER_STACK_START());
}

}  // namespace memkit
