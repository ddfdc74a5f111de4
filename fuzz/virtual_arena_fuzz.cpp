// libFuzzer harness for virtual_arena and dyn_array: the input is a program of operations
// (allocate with a size and alignment, mark, rewind, resize or free the last block, reset; and for
// dyn_array push, pop, insert, erase, resize, shrink) run against a model. Every live arena block
// is filled with its own pattern and checked after every step, so overlapping blocks, blocks
// outside the committed range, or memory handed out twice show up as a mismatch; under ASan (always
// on for fuzzers) every block handed out must be wholly unpoisoned, and touching a block after
// rewind/reset is reported by the arena's poisoning.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"
#include "memkit/dyn_array.hpp"
#include "memkit/virtual_arena.hpp"

namespace {

struct reader {
  const std::uint8_t* data;
  std::size_t size;
  bool empty() const { return size == 0; }
  std::uint32_t next(std::uint32_t bound) {
    if (size == 0 || bound == 0) return 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 3 && size > 0; ++i, ++data, --size) v = (v << 8) | *data;
    return v % bound;
  }
};

struct block {
  unsigned char* p;
  std::size_t size;
  unsigned char fill;
};

void check(bool condition) {
  if (!condition) std::abort();
}

#if MEMKIT_HAS_ASAN
extern "C" void* __asan_region_is_poisoned(void* begin, std::size_t size);
#endif

// Fills a block handed out (or grown) with its pattern, after checking that all of it is the
// caller's (no byte still poisoned).
void take(unsigned char* p, std::size_t size, unsigned char fill) {
#if MEMKIT_HAS_ASAN
  check(__asan_region_is_poisoned(p, size) == nullptr);
#endif
  memkit::fuzzing::fill(p, size, fill);
}

void verify(const std::vector<block>& blocks) {
  for (const block& b : blocks) check(memkit::fuzzing::holds(b.p, b.size, b.fill));
}

void fuzz_arena(reader& in) {
  memkit::virtual_arena arena(8u << 20, {.commit_step = 64 * 1024,
                                         .prefault_step = 16 * 1024,
                                         .retained_on_reset = in.next(2) != 0 ? std::size_t{128} * 1024 : std::size_t{0},
                                         .prefault = in.next(2) == 1});
  std::vector<block> blocks;
  std::vector<std::pair<memkit::virtual_arena::marker, std::size_t>> marks;  // marker, live blocks then
  unsigned char fill = 1;
  while (!in.empty()) {
    switch (in.next(7)) {
      case 0:
      case 1: {  // allocate
        const std::size_t size = in.next(16) == 0 ? in.next(1u << 20) : in.next(in.next(4) == 0 ? 65536 : 256);
        const std::size_t alignment = std::size_t{1} << in.next(13);
        const std::size_t used_before = arena.used();
        auto* p = static_cast<unsigned char*>(arena.allocate(size, alignment));
        if (p == nullptr) {
          check(arena.used() == used_before);
          break;
        }
        check(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
        check(arena.owns(p) && p + (size == 0 ? 1 : size) <= static_cast<unsigned char*>(arena.base()) + arena.committed());
        take(p, size, fill);
        blocks.push_back({p, size, fill});
        fill = static_cast<unsigned char>(fill == 255 ? 1 : fill + 1);
        break;
      }
      case 2:
        marks.push_back({arena.mark(), blocks.size()});
        break;
      case 3:
        if (!marks.empty()) {
          arena.rewind(marks.back().first);
          blocks.resize(marks.back().second);
          marks.pop_back();
        }
        break;
      case 4:
        // Resize the last block, unless a mark was taken after it (moving the cursor below a mark
        // would make rewinding to it a contract violation).
        if (!blocks.empty() && blocks.back().size != 0 && (marks.empty() || marks.back().second < blocks.size())) {
          block& b = blocks.back();
          const std::size_t new_size = 1 + in.next(1u << 18);
          const bool most_recent = b.p + b.size == static_cast<unsigned char*>(arena.base()) + arena.used();
          if (arena.resize(b.p, b.size, new_size)) {
            if (new_size > b.size) {
              check(most_recent);
              check(memkit::fuzzing::holds(b.p, b.size, b.fill));
              take(b.p, new_size, b.fill);
            } else {
              check(memkit::fuzzing::holds_prefix(b.p, b.size, new_size, b.fill));
              memkit::fuzzing::fill(b.p, new_size, b.fill);
            }
            b.size = new_size;
          } else {
            check(new_size > b.size);
          }
        }
        break;
      case 5:
        if (!blocks.empty() && blocks.back().size != 0 &&
            (marks.empty() || marks.back().second < blocks.size())) {
          arena.deallocate(blocks.back().p, blocks.back().size);
          blocks.pop_back();
        }
        break;
      default:
        if (in.next(8) == 0) {
          arena.reset();
          blocks.clear();
          marks.clear();
          check(arena.used() == 0);
        }
        break;
    }
    verify(blocks);
    check(arena.used() <= arena.committed() && arena.committed() <= arena.reserved());
    check(arena.high_water() >= arena.used());
  }
}

void fuzz_dyn_array(reader& in) {
  const std::size_t max_size = 1 + in.next(100'000);
  memkit::dyn_array<std::uint32_t> a(max_size, {.commit_step = 8192, .prefault_step = 4096});
  std::vector<std::uint32_t> model;
  const std::uint32_t* const data = a.data();
  std::uint32_t next_value = 0;
  while (!in.empty()) {
    const std::size_t at = model.empty() ? 0 : in.next(static_cast<std::uint32_t>(model.size() + 1));
    switch (in.next(6)) {
      case 0:
      case 1:
        if (a.try_push_back(next_value)) model.push_back(next_value);
        else check(model.size() == max_size);
        ++next_value;
        break;
      case 2:
        if (!model.empty()) {
          a.pop_back();
          model.pop_back();
        }
        break;
      case 3:
        if (model.size() < max_size) {
          a.insert(a.begin() + at, next_value);
          model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), next_value++);
        }
        break;
      case 4:
        if (at < model.size()) {
          a.erase(a.begin() + at);
          model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
      default: {
        // Mostly a step of up to a few commit steps from the current size (every element a resize
        // adds is written, and it is compared after every step); one in eight anywhere up to the
        // maximum.
        const std::size_t n =
            in.next(8) == 0 ? in.next(static_cast<std::uint32_t>(max_size + 1))
                            : std::min(max_size, model.size() > 2048 && in.next(2) == 0
                                                     ? model.size() - in.next(2049)
                                                     : model.size() + in.next(4097));
        a.resize(n, 7);
        model.resize(n, 7);
        if (in.next(4) == 0) a.shrink_to_fit();
        break;
      }
    }
    check(a.size() == model.size() && a.capacity() <= max_size && a.data() == data);
    // One memcmp, not an element-by-element loop whose every comparison the fuzzer traces (that loop
    // was a quarter of this harness's time).
    check(model.empty() || std::memcmp(a.data(), model.data(), model.size() * sizeof(std::uint32_t)) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  if (in.next(2) == 0) fuzz_arena(in);
  else fuzz_dyn_array(in);
  return 0;
}
