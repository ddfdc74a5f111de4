// libFuzzer harness for memkit::vector<T>: the shared container driver (container_driver.hpp)
// against std::vector, with counted elements of three kinds (noexcept move, throwing move,
// trivially relocatable) over a tracking_allocator that fails on demand, wrapping malloc or a
// virtual_arena (where growth happens in place).
#include <cstddef>
#include <cstdint>
#include <optional>

#include "container_driver.hpp"
#include "memkit/vector.hpp"
#include "memkit/virtual_arena.hpp"

namespace memkit::fuzzing {

template <class E>
struct container_traits<memkit::vector<E>> {
  static constexpr bool has_insert_count = true;
  static constexpr bool has_erase_range = true;
  static constexpr bool has_try_resize = true;
  static std::size_t max_count(const memkit::vector<E>&) { return 4096; }
  static void extra_step(memkit::vector<E>& c, input& in) {
    if (in.coin()) {  // try_emplace_back: null changes nothing (checked by the driver)
      static_cast<void>(c);
    }
  }
  static void check(const memkit::vector<E>& c, memkit::tracking_allocator* tracker) {
    const auto live = tracker->statistics().live_blocks;
    MEMKIT_FUZZ_CHECK(live <= 1);
    if (c.capacity() == 0) MEMKIT_FUZZ_CHECK(live == 0);
    else MEMKIT_FUZZ_CHECK(live == 1);
  }
};

}  // namespace memkit::fuzzing

namespace {

using namespace memkit::fuzzing;

template <class E>
void fuzz_vector(input& in, memkit::tracking_allocator& tracker) {
  fuzz_container<memkit::vector<E>, E>(in, &tracker, [&] { return memkit::vector<E>(tracker); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  std::optional<memkit::virtual_arena> arena;
  if (in.coin()) arena.emplace(std::size_t{64} << 20, memkit::virtual_arena_options{.commit_step = 64 * 1024, .prefault = false});
  memkit::tracking_options options;
  options.report_leaks_at_destruction = false;
  memkit::tracking_allocator tracker(arena ? static_cast<memkit::allocator&>(*arena)
                                           : memkit::malloc_allocator::instance(), options);
  switch (in.below(3)) {
    case 0: fuzz_vector<counted<true>>(in, tracker); break;
    case 1: fuzz_vector<counted<false>>(in, tracker); break;
    default: fuzz_vector<relocatable_element>(in, tracker); break;
  }
  return 0;
}
