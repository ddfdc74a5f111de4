// Huge blocks (above 3.5 MiB, or aligned beyond 64 KiB), and blocks that reallocate() grows
// beyond general_allocator::growth_threshold: each gets a segment of its own, reserved at a 4 MiB-
// aligned address with the header first, so free() finds it by the same mask as small blocks.
// Only the block's bytes are committed (huge_committed); the rest of the reservation is address
// space only, so a growing block reserves generously (4 times its size, at least 4 GiB) at no cost in
// memory or commit charge. Growth commits further pages in place (at least doubling the committed
// part, so a block grown by small steps makes one system call per doubling); beyond the
// reservation, os::extend_mapping grows it when the address space after it is free, and otherwise
// huge_move() moves the block's page tables to a new, larger reservation with mremap: no byte is
// copied, and a failure leaves the block where it was. Shrinking decommits the tail.
//
// Every block reserves at least min_block_reservation, so a cached block can serve a larger one
// in place. Freed blocks are cached and returned to the OS after the purge delay. A new block
// reuses the cached one whose resident pages fit it best (better_reuse), and where that (or a
// fresh reservation) has fewer resident pages than the new block needs, other cached blocks give
// theirs: os::move_pages moves their page-table entries into the new block. Pages that are
// already resident are handed on instead of being faulted in again (a fault costs far more than
// moving an entry), which is what an allocator that splits and coalesces spans inside big
// segments (mimalloc, jemalloc) gets from reuse.
//
// Resident memory also flows between these blocks and the spans of smaller ones: a new span
// segment is cut from a cached block (segment_from_cached_huge), and a block short of pages takes
// the page area of an empty segment due for its purge (recycle_dirty_segment).
//
// Resident pages of a block are tracked as a prefix: pages[0].touched_bytes from the header on.
// Memory beyond it has never been written since the OS mapped it, so it reads as zero.

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "internal.hpp"
#include "report.hpp"
#include "memkit/os.hpp"

namespace memkit {

namespace gpa::testing {
void (*before_taking_dirty_segment)() noexcept = nullptr;
void (*before_moving_last_piece)() noexcept = nullptr;
void (*after_moving_pieces_back)(void*, std::size_t) noexcept = nullptr;
}  // namespace gpa::testing

using namespace gpa;

namespace {

constexpr std::size_t max_cached_huge = 16;

// A huge block reserves at least this much address space (from its header on; only its bytes are
// committed), mimalloc's segment size: a cached block then serves any later block up to about
// this size in place, also after span segments were cut from its front
// (segment_from_cached_huge), instead of a fresh reservation that fills up by moving pages in.
// With it, the best-fit choice (better_reuse) and the cache bound of huge_free, the `large`
// workload (64 KiB-8 MiB) at 4 times the quick scale made 38 mremap and 72 munmap calls instead of
// 323 and 234; 16 MiB left 86 and 115, 64 MiB did as 32 (docs/general_allocator.md). Not under an
// address-space limit (roomy).
constexpr std::size_t min_block_reservation = std::size_t{32} << 20;

// Fewer missing bytes than this are faulted in rather than moved from other blocks. A move is a
// system call, splits the mappings, and costs each moved page a page-table fill at its first touch
// (4.2 us on a paravirtualized guest, against 12 us for a fault); and the pages a cached block
// gives are pages its own reuse in place would have found resident. With 64 KiB (and whole areas
// of empty segments for any shortfall) the `large` workload moved 23k pages per run to save 7.6k
// faults and ran at about half mimalloc's speed on such a guest; with 1 MiB, 0.8x; with 2 MiB,
// about mimalloc's (docs/general_allocator.md).
constexpr std::size_t min_recycled = std::size_t{2} << 20;

// The page area of a segment (all of it but the header): what an empty segment gives a huge
// block, whole.
constexpr std::size_t segment_area = segment_size - segment_header_bytes;

// A cached huge block becomes a segment for spans only when at least this much of it is resident:
// below that, a fresh segment costs as much.
constexpr std::size_t min_adopted = std::size_t{1} << 20;

// Cleared at the first os::move_pages that the system cannot do (no mremap: Windows, macOS).
std::atomic<bool> recycling_supported{true};

// A growing block reserves this many times the bytes it needs, and at least
// growth_min_reservation (rounded up to 4 MiB), so that it can grow a long way in place before it
// has to move. Address space costs nearly nothing: reserving, committing a little of and releasing
// 4 GiB took 0.25-0.28 ms against 0.16-0.18 ms for 4 MiB on the reference machine (page-table
// levels, not pages), and a mapping is a mapping whatever its size. See docs/general_allocator.md.
constexpr std::size_t growth_room = 4;
constexpr std::size_t growth_min_reservation = std::size_t{4} << 30;

// Beyond this much address space mapped by the allocator, a growing block reserves only what it
// needs (then four times): a 47-bit user space holds 128 TiB.
constexpr std::size_t growth_reservation_bound = std::size_t{16} << 40;

// A shrinking block gives back (decommits) its committed tail when it is at least this long.
constexpr std::size_t min_decommit = std::size_t{64} << 10;

// Bytes (from the header on) a growing block of `total` bytes reserves.
std::size_t growth_reservation(const general_allocator::impl& im, std::size_t total) noexcept {
  const std::size_t exact = detail::align_up(total, segment_size);
  if (total > general_allocator::max_allocation_size) return exact;
  const std::size_t room = total * growth_room;
  const std::size_t roomy = detail::align_up(room > growth_min_reservation ? room : growth_min_reservation, segment_size);
  const std::size_t mapped = im.mapped_bytes.load(std::memory_order_relaxed);
  if (mapped + roomy <= growth_reservation_bound) return roomy;
  const std::size_t four_times = detail::align_up(room, segment_size);
  return mapped + four_times <= growth_reservation_bound ? four_times : exact;
}

// The end of the committed part when a block needs `total` bytes and has `committed`: at least
// double, so that growth by small steps costs one system call per doubling; never beyond the
// reservation.
std::size_t commit_target(std::size_t total, std::size_t committed, std::size_t reserved) noexcept {
  const std::size_t doubled = 2 * committed;
  const std::size_t target = doubled > total ? doubled : total;
  return target < reserved ? target : reserved;
}

std::size_t header_bytes_for(std::size_t alignment) noexcept {
  const std::size_t page_bytes = os::page_size();
  const std::size_t header = detail::align_up(sizeof(segment), page_bytes);
  if (alignment > segment_size) return segment_size;
  return detail::align_up(header, alignment > page_bytes ? alignment : page_bytes);
}

// The reservation of a new block that needs `wanted` bytes: at least min_block_reservation, unless
// the process's address space is limited (RLIMIT_AS): there, room that live blocks do not use is
// address space the program cannot have (live blocks do not give it back at the limit, as cached
// ones do), and how much of the limit is left is not known without reading the process's maps.
std::size_t roomy(std::size_t wanted) noexcept {
  if (wanted >= min_block_reservation || os::address_space_limit() != SIZE_MAX) return wanted;
  return min_block_reservation;
}

// Resident bytes of a huge segment (the weight of a cached block against the retained limit).
std::size_t touched_of(const segment* s) noexcept { return s->pages[0].touched_bytes; }

// Whether a cached block with `resident` bytes resident (from its header on) serves a block of
// `total` bytes better than one with `other`: one that covers it beats one that does not; of two
// that cover it, the one with fewer to spare (the larger stays for a larger block); of two that do
// not, the one with more (fewer pages to fault or move in).
bool better_reuse(std::size_t resident, std::size_t other, std::size_t total) noexcept {
  if (resident >= total) return other < total || resident < other;
  return other < total && resident > other;
}

// What holds for a huge block between steps (checked in debug and test builds): its resident
// prefix lies in its read-write part, which lies in its reservation, and the mapping boundaries
// recorded in its split list are increasing and inside the read-write part. A resident prefix or
// commit that claims pages that were never made read-write hands out pages that fault on a write.
void check_block(const segment* s) noexcept {
  MEMKIT_ASSERT(s->pages[0].touched_bytes <= s->huge_committed, "a huge block's resident pages are committed");
  MEMKIT_ASSERT(s->huge_committed <= s->reserved_bytes, "a huge block's commit lies in its reservation");
  MEMKIT_ASSERT(s->huge_split_count <= max_huge_splits, "a huge block's split list fits");
  for (std::uint32_t i = 0; i < s->huge_split_count; ++i) {
    MEMKIT_ASSERT(s->huge_splits[i] != 0 && s->huge_splits[i] <= s->huge_committed &&
                      (i == 0 || s->huge_splits[i - 1] < s->huge_splits[i]),
                  "a huge block's splits increase inside its committed part");
  }
}

// Drops the splits at or beyond `end`.
void trim_splits(segment* s, std::size_t end) noexcept {
  while (s->huge_split_count != 0 && s->huge_splits[s->huge_split_count - 1] >= end) --s->huge_split_count;
}

// The block's splits: a copy that survives the header being rewritten or moved.
struct split_list {
  std::uint32_t count = 0;
  std::size_t at[max_huge_splits];

  explicit split_list(const segment* s = nullptr) noexcept {
    if (s == nullptr) return;
    count = s->huge_split_count;
    std::memcpy(at, s->huge_splits, count * sizeof(std::size_t));
  }
  void add(std::size_t offset) noexcept {
    if (count == 0 || at[count - 1] < offset) at[count++] = offset;
  }
  void store(segment* s) const noexcept {
    s->huge_split_count = count;
    std::memcpy(s->huge_splits, at, count * sizeof(std::size_t));
  }
};

// Caller holds `lock`. Puts a freed (or shrunk donor) block on the cache list.
void cache_push(general_allocator::impl& im, segment* s) noexcept {
  check_block(s);
  s->next = im.huge_cached;
  im.huge_cached = s;
  im.huge_cached_count.fetch_add(1, std::memory_order_relaxed);
  im.huge_cached_bytes += touched_of(s);
  im.retained_bytes.fetch_add(touched_of(s), std::memory_order_relaxed);
}

// Caller holds `lock`. Unlinks the cached block `*link` points at.
segment* cache_take(general_allocator::impl& im, segment** link) noexcept {
  segment* s = *link;
  *link = s->next;
  im.huge_cached_count.fetch_sub(1, std::memory_order_relaxed);
  im.huge_cached_bytes -= touched_of(s);
  im.retained_bytes.fetch_sub(touched_of(s), std::memory_order_relaxed);
  s->next = nullptr;
  return s;
}

// Empty segments waiting for their purge (release_segment's dirty list) hold resident pages too:
// the page area of the oldest one, the next to be discarded, moves whole into [at, at +
// segment_area) and its header is unmapped (a segment is cheap to map again). Its resident bytes
// now count for the target, segment_area of them. Returns `none` when the list is empty:
// dirty_count, which the caller read without the lock, is only a hint, and another thread may have
// taken the last segment since (nothing moved then, so [at, at + segment_area) must not count as
// resident, nor, beyond the block's commit, as read-write). Returns `failed` if the move failed (a
// segment made of a huge block with pages moved in spans several mappings, which Linux moves at
// once only from 6.17 on): the destination may then be unmapped, and the segment is unmapped too,
// so that it cannot fail again.
enum class recycled { moved, none, failed };
recycled recycle_dirty_segment(general_allocator::impl& im, char* at) noexcept {
  if (testing::before_taking_dirty_segment != nullptr) testing::before_taking_dirty_segment();
  segment* d;
  {
    lock_guard guard(im.lock);
    d = im.empty_segments.dirty_last;
    if (d == nullptr) return recycled::none;
    im.empty_segments.dirty_last = d->prev;
    if (im.empty_segments.dirty_last != nullptr) im.empty_segments.dirty_last->next = nullptr;
    else im.empty_segments.dirty_first = nullptr;
  }
  char* area = reinterpret_cast<char*>(d) + segment_header_bytes;
  claims::drop(d, segment_size, "recycle_dirty_segment");
  const os::status moved = os::move_pages(area, segment_area, at);
  if (!moved && os::is_unsupported(moved.error())) recycling_supported.store(false, std::memory_order_relaxed);
  const std::size_t dirty = d->dirty_bytes;
  im.empty_segments.dirty_count.fetch_sub(1, std::memory_order_relaxed);
  im.retained_bytes.fetch_sub(dirty, std::memory_order_relaxed);
  im.resident_bytes.fetch_sub(dirty + segment_header_touched(), std::memory_order_relaxed);
  im.mapped_bytes.fetch_sub(segment_size, std::memory_order_relaxed);
  segment_map_set(d, false);
  if (!moved) {
    (void)os::release(d, segment_size);
    return recycled::failed;
  }
  claims::check_mapped(at, segment_area, "recycle_dirty_segment (its pages moved in)");
  im.resident_bytes.fetch_add(segment_area, std::memory_order_relaxed);
  (void)os::release(d, segment_header_bytes);
  return recycled::moved;
}

// Moves resident pages of empty segments and of the cached blocks on the `donors` list into the
// block being built at `base` (reservation `reserved`, resident prefix `touched`, mapping splits
// `splits`) until its first `total` bytes are resident. A donor that gives all its pages is
// released; one that gives part keeps its lower pages (its header among them) and goes back to
// the cache, as does a donor not needed. Returns false if a move failed: the target may then have
// lost pages (the system unmaps the destination before moving) and must be released; `touched`
// then counts every byte moved into it, for the resident accounting.
bool recycle_pages(general_allocator::impl& im, char* base, std::size_t reserved,
                          std::size_t& touched, split_list& splits, std::size_t total,
                          segment* donors) noexcept {
  const std::size_t keep = detail::align_up(sizeof(segment), os::page_size());
  bool ok = true;
  // First the page areas of empty segments waiting for their purge, whole, and only while the
  // block still lacks a whole area: every page moved is then one it writes now instead of
  // faulting it in. (Taking an area for any shortfall of 64 KiB or more, the surplus kept resident
  // in the block, moved pages that a span segment would have reused in place: on a paravirtualized
  // guest the `large` workload then ran 1.4 times as long.) An area the reservation has no room
  // for stays where it is, for a span segment or a later block: a part of it moved would unmap the
  // rest, pages a later block faults in again. They come before the donors because a donor can
  // give part of its pages and keep the rest.
  while (touched + segment_area <= total && reserved - touched >= segment_area && splits.count + 2 <= max_huge_splits &&
         im.empty_segments.dirty_count.load(std::memory_order_relaxed) != 0) {
    const recycled r = recycle_dirty_segment(im, base + touched);
    if (r == recycled::none) break;
    if (r == recycled::failed) {
      ok = false;
      break;
    }
    if (touched != 0) splits.add(touched);
    touched += segment_area;
    if (touched < reserved) splits.add(touched);
  }
  segment* back = nullptr;  // donors returning to the cache
  while (ok && donors != nullptr) {
    segment* d = donors;
    donors = d->next;
    const std::size_t need = total > touched ? total - touched : 0;
    const std::size_t held = touched_of(d);
    const std::size_t given = need >= held ? held : held - need >= keep ? need : held - keep;
    const std::size_t donor_reserved = d->reserved_bytes;
    const split_list from(d);  // read now: the header may move
    // Splits the target gains: where the moved range begins and ends, and the donor's own.
    std::size_t extra = 2;
    for (std::uint32_t i = 0; i < from.count; ++i) extra += from.at[i] > held - given && from.at[i] < held;
    if (given == 0 || splits.count + extra > max_huge_splits) {
      d->next = back;
      back = d;
      continue;
    }
    const std::size_t start = held - given;  // the donor keeps [0, start)
    // Its claim shrinks before any page leaves, so that no other thread can be handed the address
    // space while the donor still claims it; a failure below claims the pages that stayed again.
    claims::change(d, donor_reserved, start, "recycle_pages (a donor gives pages)");
    // Highest piece first, so that the donor's header moves last (if at all) and the donor stays
    // whole below the piece that failed.
    std::size_t end = held;
    std::size_t intact = start;  // the donor still holds [0, intact)
    std::uint32_t i = from.count;
    while (end > start) {
      while (i != 0 && from.at[i - 1] >= end) --i;
      const std::size_t begin = i != 0 && from.at[i - 1] > start ? from.at[i - 1] : start;
      char* source = reinterpret_cast<char*>(d) + begin;
      if (begin == 0) segment_map_set(d, false);  // its header leaves
      if (auto moved = os::move_pages(source, end - begin, base + touched + (begin - start)); !moved) {
        if (os::is_unsupported(moved.error())) recycling_supported.store(false, std::memory_order_relaxed);
        if (begin == 0) segment_map_set(d, true);
        ok = false;
        intact = end;
        break;
      }
      end = begin;
    }
    // The donor shrinks to [0, intact): [intact, held) was moved, the unused rest is unmapped now.
    if (held < donor_reserved) (void)os::release(reinterpret_cast<char*>(d) + held, donor_reserved - held);
    im.mapped_bytes.fetch_sub(donor_reserved - intact, std::memory_order_relaxed);
    // A donor that gave everything no longer exists; its resident bytes now count for the target.
    if (intact != start) claims::change(d, start, intact, "recycle_pages (the pages a failed move left in a donor)");
    if (intact != 0) {
      d->reserved_bytes = intact;
      d->huge_committed = intact;
      d->pages[0].touched_bytes = intact;
      trim_splits(d, intact);
      d->next = back;
      back = d;
    }
    if (!ok) {
      touched += held - intact;  // moved before the failure: released with the target
      break;
    }
    if (touched != 0) splits.add(touched);
    for (std::uint32_t k = 0; k < from.count; ++k)
      if (from.at[k] > start && from.at[k] < held) splits.add(touched + (from.at[k] - start));
    touched += given;
    if (touched < reserved) splits.add(touched);
  }
  if (ok) claims::check_mapped(base, reserved, "recycle_pages (pages moved in)");
  while (segment* d = donors) {  // left after a failure
    donors = d->next;
    d->next = back;
    back = d;
  }
  if (back != nullptr) {
    lock_guard guard(im.lock);
    while (segment* d = back) {
      back = d->next;
      cache_push(im, d);
    }
  }
  return ok;
}

// Reserves a new huge segment of at least `wanted` bytes (at least `total` when that much address
// space cannot be had) and commits its first `total` bytes. Returns null on failure; sets
// `reserved`.
segment* reserve_huge(general_allocator::impl& im, std::size_t wanted, std::size_t total,
                             std::size_t alignment, std::size_t& reserved) noexcept {
  char* base;
  if (alignment <= segment_size) {
    reserved = detail::align_up(wanted > total ? wanted : total, segment_size);
    auto r = os::reserve_aligned(reserved, segment_size);
    if (!r && reserved > detail::align_up(total, segment_size)) {
      reserved = detail::align_up(total, segment_size);
      r = os::reserve_aligned(reserved, segment_size);
    }
    if (!r) return nullptr;
    base = static_cast<char*>(r.value());
  } else {
    // The block must sit at an `alignment` boundary with the header 4 MiB before it.
    reserved = total;
    auto r = os::reserve_aligned(reserved + alignment, alignment);
    if (!r) return nullptr;
    char* raw = static_cast<char*>(r.value());
    base = raw + alignment - segment_size;
    (void)os::release(raw, static_cast<std::size_t>(base - raw));
    (void)os::release(base + reserved, segment_size);
  }
  if (!os::commit(base, total)) {
    (void)os::release(base, reserved);
    return nullptr;
  }
  auto* s = reinterpret_cast<segment*>(base);
  claims::claim(s, reserved, "reserve_huge");
  im.mapped_bytes.fetch_add(reserved, std::memory_order_relaxed);
  segment_map_set(s, true);
  return s;
}

// Unmaps a huge segment no block lives in; `touched` is what it counted as resident.
void release_huge(general_allocator::impl& im, segment* s, std::size_t reserved,
                         std::size_t touched) noexcept {
  im.mapped_bytes.fetch_sub(reserved, std::memory_order_relaxed);
  im.resident_bytes.fetch_sub(touched, std::memory_order_relaxed);
  segment_map_set(s, false);
  claims::drop(s, reserved, "release_huge");
  (void)os::release(s, reserved);
}

// With `populate` (a C realloc, whose caller asked for the bytes it grows to), faults in, in one
// call, the pages a grown block gets beyond its resident prefix, but no more of them than it
// already had: a buffer that grows geometrically (by 2x or less, as programs grow what they fill)
// gets all its new pages at once, while a jump far beyond the old size, more likely room that is
// never written, populates only its first part. See docs/general_allocator.md (Growing blocks)
// for the measurements. A failure only means that the pages fault in later, one by one, as they
// would have.
void populate_tail(segment* s, std::size_t total, bool populate) noexcept {
  const std::size_t from = s->pages[0].touched_bytes;
  if (!populate || total <= from) return;
  const std::size_t end = total - from > from ? from + from : total;
  const std::size_t page_bytes = os::page_size();
  const std::size_t begin = from & ~(page_bytes - 1);
  (void)os::prefault(reinterpret_cast<char*>(s) + begin, detail::align_up(end, page_bytes) - begin);
}

// The live list of blocks with mappings of their own; the caller holds im.lock.
void live_push(general_allocator::impl& im, segment* s) noexcept {
  s->prev = nullptr;
  s->next = im.huge_live;
  if (im.huge_live != nullptr) im.huge_live->prev = s;
  im.huge_live = s;
}

void live_remove(general_allocator::impl& im, segment* s) noexcept {
  if (s->prev != nullptr) s->prev->next = s->next;
  else im.huge_live = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
}

}  // namespace

void* general_allocator::impl::huge_allocate(std::size_t size, std::size_t alignment, bool zeroed,
                                             std::size_t reserve_hint) noexcept {
  const std::size_t page_bytes = os::page_size();
  const std::size_t offset = header_bytes_for(alignment);
  const std::size_t total = detail::align_up(offset + size, page_bytes);
  // Room to grow in place (reallocate passes a hint when it had to move a growing block).
  const std::size_t wanted = detail::align_up(offset + (reserve_hint > size ? reserve_hint : size), page_bytes);
  segment* s = nullptr;
  segment* donors = nullptr;
  if (alignment <= segment_size && huge_cached_count.load(std::memory_order_relaxed) != 0) {
    lock_guard guard(lock);
    // Among the cached blocks whose reservation fits (at most max_cached_huge of them), the one
    // whose resident pages cover the block with the fewest to spare, else the one with the most
    // resident pages: reservations are mostly min_block_reservation, so what tells blocks apart
    // is the pages they would otherwise fault in or move in. A growing block takes only one with
    // its room to grow (the others still give it their pages).
    const std::size_t fits = reserve_hint > size ? wanted : total;
    segment** best = nullptr;
    for (segment** link = &huge_cached; *link != nullptr; link = &(*link)->next) {
      const segment* c = *link;
      if (c->reserved_bytes < fits) continue;
      if (best == nullptr || better_reuse(touched_of(c), touched_of(*best), total)) best = link;
    }
    if (best != nullptr) s = cache_take(*this, best);
    // Donors for the pages the block lacks.
    std::size_t have = s != nullptr ? touched_of(s) : 0;
    if (recycling_supported.load(std::memory_order_relaxed)) {
      segment** tail = &donors;
      for (segment** link = &huge_cached; *link != nullptr && have + min_recycled < total;) {
        segment* d = cache_take(*this, link);
        have += touched_of(d);
        *tail = d;
        tail = &d->next;
      }
    }
  }
  std::size_t reserved;
  std::size_t touched;
  std::size_t committed;
  split_list splits(s);
  if (s != nullptr) {
    reserved = s->reserved_bytes;
    touched = touched_of(s);
    committed = s->huge_committed;
    if (committed < total) {
      // The cached block was committed only as far as its last use.
      const std::size_t target = commit_target(total, committed, reserved);
      if (!os::commit(reinterpret_cast<char*>(s) + committed, target - committed)) {
        {
          lock_guard guard(lock);
          cache_push(*this, s);
          while (segment* d = donors) {
            donors = d->next;
            cache_push(*this, d);
          }
        }
        return nullptr;
      }
      committed = s->huge_committed = target;
    }
  } else {
    s = reserve_huge(*this, roomy(wanted), total, alignment, reserved);
    touched = 0;
    committed = total;
    if (s == nullptr) {
      if (donors != nullptr) {
        lock_guard guard(lock);
        while (segment* d = donors) {
          donors = d->next;
          cache_push(*this, d);
        }
      }
      // Freed memory kept for reuse (cached blocks, empty pages and segments) holds address space
      // and commit charge: under a limit, give it back and, if that unmapped anything, try once
      // more before refusing.
      const std::size_t mapped_before = mapped_bytes.load(std::memory_order_relaxed);
      self->purge();
      if (mapped_bytes.load(std::memory_order_relaxed) < mapped_before) {
        s = reserve_huge(*this, roomy(wanted), total, alignment, reserved);
      }
      if (s == nullptr) return nullptr;
    }
  }
  if ((donors != nullptr || (alignment <= segment_size && touched + segment_area <= total &&
                              empty_segments.dirty_count.load(std::memory_order_relaxed) != 0 &&
                              recycling_supported.load(std::memory_order_relaxed))) &&
      !recycle_pages(*this, reinterpret_cast<char*>(s), reserved, touched, splits, total, donors)) {
    release_huge(*this, s, reserved, touched);
    touched = 0;
    splits = split_list();
    s = reserve_huge(*this, roomy(wanted), total, alignment, reserved);
    committed = total;
    if (s == nullptr) return nullptr;
  }
  if (committed < touched) committed = touched;  // pages moved in beyond the commit are read-write
  new (s) segment();
  s->huge_committed = committed;
  splits.store(s);
  s->instance = this;
  s->kind = segment_kind::huge;
  s->page_shift = 63;
  s->page_count = 1;
  s->reserved_bytes = reserved;
  s->huge_offset = offset;
  s->huge_size = total - offset;
  s->huge_requested = size;
  s->huge_live = true;
  page& pg = s->pages[0];
  pg.start = reinterpret_cast<char*>(s) + offset;
  pg.area_end = pg.start + s->huge_size;
  pg.in_use = true;
  pg.reserved = 1;
  pg.capacity = 1;
  pg.used = 1;
  // Resident estimate: what was touched before (a reused block) or will be (the new block). The
  // resident bytes moved in from donors were counted already, as theirs.
  pg.touched_bytes = touched > total ? touched : total;
  resident_bytes.fetch_add(pg.touched_bytes - touched, std::memory_order_relaxed);
  {
    lock_guard guard(lock);
    live_push(*this, s);
  }
  huge_allocations.fetch_add(1, std::memory_order_relaxed);
  huge_live_bytes.fetch_add(s->huge_size, std::memory_order_relaxed);
  note_in_use(static_cast<std::ptrdiff_t>(total));
  // Only the pages written before can hold anything but zero.
  check_block(s);
  if (zeroed && touched > offset) std::memset(pg.start, 0, touched - offset < size ? touched - offset : size);
  return pg.start;
}

void general_allocator::impl::huge_free(segment* s) noexcept {
  const errno_keeper keep_errno;
  const std::size_t size = s->huge_size;
  // Read before the block is published to the cache: from then on another thread may reuse or
  // unmap it.
  const std::size_t accounted = s->huge_offset + size;
  const std::uint64_t now = now_ms();
  const bool cache = self->options_.purge_delay_ms != 0;
  bool cached_it = false;
  {
    lock_guard guard(lock);
    live_remove(*this, s);
    s->huge_live = false;
    // The cache holds up to retained_limit of resident pages, but no block of more than half of
    // it: one that large would serve much smaller blocks with its surplus resident.
    const std::size_t limit = self->options_.retained_limit;
    if (cache && huge_cached_count.load(std::memory_order_relaxed) < max_cached_huge &&
        touched_of(s) <= limit / 2 && huge_cached_bytes + touched_of(s) <= limit) {
      s->cached_since_ms = now;
      cache_push(*this, s);
      cached_it = true;
    }
  }
  huge_frees.fetch_add(1, std::memory_order_relaxed);
  huge_live_bytes.fetch_sub(size, std::memory_order_relaxed);
  note_in_use(-static_cast<std::ptrdiff_t>(accounted));
  if (!cached_it) release_huge(*this, s, s->reserved_bytes, touched_of(s));
  // Older cached blocks may be due.
  purge_caches(now, false);
}

bool general_allocator::impl::huge_resize(segment* s, std::size_t new_size, bool populate) noexcept {
  if (new_size > max_allocation_size) return false;
  const std::size_t total = detail::align_up(s->huge_offset + new_size, os::page_size());
  char* base = reinterpret_cast<char*>(s);
  std::size_t reserved = s->reserved_bytes;
  std::size_t committed = s->huge_committed;
  if (total > reserved) {
    // The mapping that ends the reservation grows when the address space after it is free: the
    // reserved-only tail, or the last piece when all of it is committed (its growth is then
    // committed too).
    const std::size_t last = committed < reserved ? committed
                             : s->huge_split_count != 0 ? s->huge_splits[s->huge_split_count - 1] : 0;
    std::size_t grown = growth_reservation(*this, total);
    if (grown < total) grown = detail::align_up(total, segment_size);
    if (!os::extend_mapping(base + last, reserved - last, grown - last)) return false;
    claims::change(base, reserved, grown, "huge_resize (the mapping extended)");
    mapped_bytes.fetch_add(grown - reserved, std::memory_order_relaxed);
    if (committed == reserved) s->huge_committed = committed = grown;
    s->reserved_bytes = reserved = grown;
  }
  if (total > committed) {
    const std::size_t target = commit_target(total, committed, reserved);
    if (!os::commit(base + committed, target - committed)) return false;
    s->huge_committed = committed = target;
  }
  if (total > s->pages[0].touched_bytes) {
    if (!recycle_into(s, total)) return false;
    populate_tail(s, total, populate);
  } else if (total < s->huge_offset + s->huge_size) {
    // Shrinking gives the pages and the commit charge of the tail back; the address space stays
    // reserved for later growth.
    if (committed - total >= min_decommit && os::decommit(base + total, committed - total)) {
      s->huge_committed = committed = total;
      trim_splits(s, total);
    }
    if (s->pages[0].touched_bytes > committed) {
      resident_bytes.fetch_sub(s->pages[0].touched_bytes - committed, std::memory_order_relaxed);
      s->pages[0].touched_bytes = committed;
    }
  }
  const std::size_t old_size = s->huge_size;
  s->huge_size = total - s->huge_offset;
  s->huge_requested = new_size;
  s->pages[0].area_end = s->pages[0].start + s->huge_size;
  if (s->huge_size > old_size) {
    huge_live_bytes.fetch_add(s->huge_size - old_size, std::memory_order_relaxed);
    note_in_use(static_cast<std::ptrdiff_t>(s->huge_size - old_size));
    if (total > s->pages[0].touched_bytes) {
      resident_bytes.fetch_add(total - s->pages[0].touched_bytes, std::memory_order_relaxed);
      s->pages[0].touched_bytes = total;
    }
  } else {
    huge_live_bytes.fetch_sub(old_size - s->huge_size, std::memory_order_relaxed);
    note_in_use(-static_cast<std::ptrdiff_t>(old_size - s->huge_size));
  }
  check_block(s);
  return true;
}

// A growing block's new pages: resident pages of cached blocks move in (one mremap per piece)
// where they would otherwise be faulted in one by one. Nothing the block holds is at risk: the
// pages moved land beyond its resident prefix, past every byte it had. False when a failed move
// left the block without the pages it needs (it still has every page it had).
bool general_allocator::impl::recycle_into(segment* s, std::size_t total) noexcept {
  const std::size_t touched_before = s->pages[0].touched_bytes;
  const std::size_t committed_before = s->huge_committed;
  if (total - touched_before < min_recycled || !recycling_supported.load(std::memory_order_relaxed) ||
      (huge_cached_count.load(std::memory_order_relaxed) == 0 && empty_segments.dirty_count.load(std::memory_order_relaxed) == 0)) {
    return true;
  }
  segment* donors = nullptr;
  {
    lock_guard guard(lock);
    std::size_t have = 0;
    segment** tail = &donors;
    for (segment** link = &huge_cached; *link != nullptr && touched_before + have + min_recycled < total;) {
      if (touched_of(*link) == 0) {
        link = &(*link)->next;
        continue;
      }
      segment* d = cache_take(*this, link);
      have += touched_of(d);
      *tail = d;
      tail = &d->next;
    }
  }
  if (donors == nullptr && empty_segments.dirty_count.load(std::memory_order_relaxed) == 0) return true;
  char* base = reinterpret_cast<char*>(s);
  split_list splits(s);
  std::size_t touched = touched_before;
  const bool ok = recycle_pages(*this, base, s->reserved_bytes, touched, splits, total, donors);
  splits.store(s);
  // The moved pages are resident and counted already (as the donors'); the block's resident
  // prefix now ends after them.
  s->pages[0].touched_bytes = touched;
  if (s->huge_committed < touched) s->huge_committed = touched;
  if (!ok) {
    // A failed move may have unmapped its destination, and that need not lie after the pages
    // that did move (a donor's pieces move highest first), so the resident prefix cannot simply
    // end after them. Map everything from touched_before on afresh and commit what was committed
    // before: the caller's bytes lie below touched_before, and the pages that moved in are
    // dropped. If even that fails, the block ends where its pages do.
    const std::size_t reserved = s->reserved_bytes;
    resident_bytes.fetch_sub(touched - touched_before, std::memory_order_relaxed);
    s->pages[0].touched_bytes = touched_before;
    trim_splits(s, touched_before + 1);
    s->huge_committed = touched_before;
    if (touched_before < reserved && os::decommit(base + touched_before, reserved - touched_before)) {
      split_list splits_now(s);
      if (touched_before != 0 && splits_now.count < max_huge_splits) splits_now.add(touched_before);
      splits_now.store(s);  // the fresh mapping begins at touched_before
      if (os::commit(base + touched_before, committed_before - touched_before)) s->huge_committed = committed_before;
    }
    claims::check_mapped(base, reserved, "recycle_into (mapped again after a failed move)");
  }
  return s->huge_committed >= total;
}

// A segment for spans made of the first 4 MiB of the cached block with the most resident pages,
// so that memory a freed huge block left resident serves blocks of 64 KiB-3.5 MiB instead of
// waiting for a huge block or its purge while spans fault in fresh pages (mimalloc gets this from
// putting both in one segment). The rest of the block stays cached as a block of its own when it
// holds resident pages (its header is written at the next 4 MiB boundary) and is unmapped
// otherwise. `resident` is set to the bytes from the header on that are resident; the segment
// counts them no more (acquire_segment counts what it adopts). Null when no cached block holds
// enough resident pages to be worth it, or committing the segment failed.
segment* general_allocator::impl::segment_from_cached_huge(std::size_t& resident) noexcept {
  resident = 0;
  if (huge_cached_count.load(std::memory_order_relaxed) == 0) return nullptr;
  const std::size_t keep = detail::align_up(sizeof(segment), os::page_size());
  segment* c = nullptr;
  {
    lock_guard guard(lock);
    segment** best = nullptr;
    for (segment** link = &huge_cached; *link != nullptr; link = &(*link)->next) {
      const segment* d = *link;
      if (d->reserved_bytes < segment_size || touched_of(d) < min_adopted) continue;
      if (best == nullptr || touched_of(d) > touched_of(*best)) best = link;
    }
    if (best == nullptr) return nullptr;
    c = cache_take(*this, best);
  }
  char* base = reinterpret_cast<char*>(c);
  const std::size_t reserved = c->reserved_bytes;
  const std::size_t touched = touched_of(c);
  const std::size_t committed = c->huge_committed;
  const split_list splits(c);
  if (committed < segment_size && !os::commit(base + committed, segment_size - committed)) {
    lock_guard guard(lock);
    cache_push(*this, c);
    return nullptr;
  }
  if (reserved > segment_size) {
    if (touched >= segment_size + keep) {
      // The rest keeps its resident pages, cached as a block of its own.
      auto* rest = new (base + segment_size) segment();
      rest->instance = this;
      rest->kind = segment_kind::huge;
      rest->page_shift = 63;
      rest->page_count = 1;
      rest->reserved_bytes = reserved - segment_size;
      rest->huge_committed = committed - segment_size;
      rest->pages[0].touched_bytes = touched - segment_size;
      rest->cached_since_ms = c->cached_since_ms;
      split_list moved;
      for (std::uint32_t i = 0; i < splits.count; ++i)
        if (splits.at[i] > segment_size) moved.add(splits.at[i] - segment_size);
      moved.store(rest);
      claims::change(base, reserved, segment_size, "segment_from_cached_huge (the span segment)");
      claims::claim(rest, reserved - segment_size, "segment_from_cached_huge (the rest)");
      segment_map_set(rest, true);
      resident_bytes.fetch_sub(segment_size, std::memory_order_relaxed);
      resident = segment_size;
      lock_guard guard(lock);
      cache_push(*this, rest);
      return c;
    }
    claims::change(base, reserved, segment_size, "segment_from_cached_huge (the rest unmapped)");
    (void)os::release(base + segment_size, reserved - segment_size);
    mapped_bytes.fetch_sub(reserved - segment_size, std::memory_order_relaxed);
  }
  resident = touched < segment_size ? touched : segment_size;
  resident_bytes.fetch_sub(touched, std::memory_order_relaxed);
  return c;
}

void* general_allocator::impl::huge_move(segment* s, std::size_t new_size, bool populate) noexcept {
  // A block aligned beyond 4 MiB sits 4 MiB into an unaligned reservation: it is copied instead.
  if (new_size > max_allocation_size || s->huge_offset >= segment_size ||
      !recycling_supported.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  const std::size_t total = detail::align_up(s->huge_offset + new_size, os::page_size());
  const std::size_t old_reserved = s->reserved_bytes;
  const std::size_t old_committed = s->huge_committed;
  std::size_t reserved = growth_reservation(*this, total);
  auto r = os::reserve_aligned(reserved, segment_size);
  if (!r && reserved > detail::align_up(total, segment_size)) {
    reserved = detail::align_up(total, segment_size);
    r = os::reserve_aligned(reserved, segment_size);
  }
  if (!r) return nullptr;
  char* from = reinterpret_cast<char*>(s);
  char* to = static_cast<char*>(r.value());
  claims::claim(to, reserved, "huge_move (the new reservation)");
  claims::drop(from, old_reserved, "huge_move (the old range)");  // claimed again if the move fails
  split_list splits(s);  // the header moves with the block
  // A split at the end of the committed part (pages moved in up to there) bounds no piece: without
  // it the last piece is never empty, which the system refuses to move and grow (EINVAL).
  while (splits.count != 0 && splits.at[splits.count - 1] >= old_committed) --splits.count;
  {
    lock_guard guard(lock);  // off the live list while its header is nowhere
    live_remove(*this, s);
  }
  segment_map_set(s, false);
  // Each piece lies in one mapping and moves by one mremap; the last one grows to `total` on the
  // way (its new pages are committed and read as zero). Without splits, that is the only call.
  std::uint32_t moved = 0;  // pieces moved so far
  bool ok = true;
  for (std::size_t begin = 0;; ++moved) {
    const bool last = moved == splits.count;
    const std::size_t end = last ? old_committed : splits.at[moved];
    if (last && testing::before_moving_last_piece != nullptr) testing::before_moving_last_piece();
    const os::status st = last ? os::move_and_grow_pages(from + begin, end - begin, to + begin, total - begin)
                               : os::move_pages(from + begin, end - begin, to + begin);
    if (!st) {
      if (os::is_unsupported(st.error())) recycling_supported.store(false, std::memory_order_relaxed);
      ok = false;
      break;
    }
    if (last) break;
    begin = end;
  }
  if (!ok) {
    // Put back the pieces that moved: into the holes they left, so this cannot run short of address
    // space; only the kernel failing to allocate its own bookkeeping could stop it.
    for (std::uint32_t k = 0; k < moved; ++k) {
      const std::size_t begin = k == 0 ? 0 : splits.at[k - 1];
      if (!os::move_pages(to + begin, splits.at[k] - begin, from + begin)) {
        static const char message[] = "memkit: a huge block could not be moved back after a failed move\n";
        diagnostics::put(os::error_stream, message, sizeof message - 1);
        std::abort();
      }
    }
    // Each piece put back left its range of the new reservation unmapped, and the system may have
    // handed that address space to another thread since: only the rest is still this block's to
    // release. Unmapping all of it took pages from under whatever was mapped there meanwhile.
    const std::size_t vacated = moved == 0 ? 0 : splits.at[moved - 1];
    if (testing::after_moving_pieces_back != nullptr) testing::after_moving_pieces_back(to, vacated);
    claims::drop(to, reserved, "huge_move (failed)");
    (void)os::release(to + vacated, reserved - vacated);
    claims::claim(from, old_reserved, "huge_move (pieces put back after a failed move)");
    segment_map_set(s, true);
    lock_guard guard(lock);
    live_push(*this, s);
    return nullptr;
  }
  if (old_reserved > old_committed) (void)os::release(from + old_committed, old_reserved - old_committed);
  claims::check_mapped(to, reserved, "huge_move (moved)");
  auto* t = reinterpret_cast<segment*>(to);
  mapped_bytes.fetch_add(reserved, std::memory_order_relaxed);
  mapped_bytes.fetch_sub(old_reserved, std::memory_order_relaxed);
  t->reserved_bytes = reserved;
  t->huge_committed = total;
  populate_tail(t, total, populate);
  const std::size_t old_size = t->huge_size;
  t->huge_size = total - t->huge_offset;
  t->huge_requested = new_size;
  t->pages[0].start = to + t->huge_offset;
  t->pages[0].area_end = t->pages[0].start + t->huge_size;
  huge_live_bytes.fetch_add(t->huge_size - old_size, std::memory_order_relaxed);
  note_in_use(static_cast<std::ptrdiff_t>(t->huge_size - old_size));
  if (total > t->pages[0].touched_bytes) {
    resident_bytes.fetch_add(total - t->pages[0].touched_bytes, std::memory_order_relaxed);
    t->pages[0].touched_bytes = total;
  }
  check_block(t);
  segment_map_set(t, true);
  {
    lock_guard guard(lock);
    live_push(*this, t);
  }
  return t->pages[0].start;
}

void* general_allocator::impl::grow_block(void* p, std::size_t copy_bytes, std::size_t new_size,
                                          std::size_t alignment, bool populate) noexcept {
  if (new_size > max_allocation_size) return allocation_failure();
  segment* s = segment_of(p);
  if (s->kind == segment_kind::huge) {
    if (huge_resize(s, new_size, populate)) return p;
    if (void* moved = huge_move(s, new_size, populate)) return moved;
  }
  // A block of a size class (or one that could not move): copied, once, into a block with room.
  const std::size_t offset = header_bytes_for(alignment);
  const std::size_t total = detail::align_up(offset + new_size, os::page_size());
  void* fresh = huge_allocate(new_size, alignment, false, growth_reservation(*this, total) - offset);
  if (fresh == nullptr) return allocation_failure();
  std::memcpy(fresh, p, copy_bytes < new_size ? copy_bytes : new_size);
  self->free(p);
  return fresh;
}

}  // namespace memkit
