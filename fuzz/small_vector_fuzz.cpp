// libFuzzer harness for memkit::small_vector<T, N>: the shared container driver
// (container_driver.hpp) against std::vector for N = 1, 3, 8 and 17, with counted elements of
// three kinds over a tracking_allocator that fails on demand. Beyond the driver's checks: the
// capacity never drops below N, and inline storage holds no heap block.
#include <cstddef>
#include <cstdint>

#include "container_driver.hpp"
#include "memkit/small_vector.hpp"

namespace memkit::fuzzing {

template <class E, std::size_t N>
struct container_traits<memkit::small_vector<E, N>> {
  static constexpr bool has_insert_count = true;
  static constexpr bool has_erase_range = true;
  static constexpr bool has_try_resize = true;
  static std::size_t max_count(const memkit::small_vector<E, N>&) { return 4096; }
  static void extra_step(memkit::small_vector<E, N>&, input&) {}
  static void check(const memkit::small_vector<E, N>& c, memkit::tracking_allocator* tracker) {
    MEMKIT_FUZZ_CHECK(c.capacity() >= N);
    const auto live = tracker->statistics().live_blocks;
    if (c.is_inline()) MEMKIT_FUZZ_CHECK(live == 0 && c.capacity() == N);
    else MEMKIT_FUZZ_CHECK(live == 1);
  }
};

}  // namespace memkit::fuzzing

namespace {

using namespace memkit::fuzzing;

template <class E>
void fuzz_element(input& in, memkit::tracking_allocator& tracker) {
  switch (in.below(4)) {
    case 0: fuzz_container<memkit::small_vector<E, 1>, E>(in, &tracker, [&] { return memkit::small_vector<E, 1>(tracker); }); break;
    case 1: fuzz_container<memkit::small_vector<E, 3>, E>(in, &tracker, [&] { return memkit::small_vector<E, 3>(tracker); }); break;
    case 2: fuzz_container<memkit::small_vector<E, 8>, E>(in, &tracker, [&] { return memkit::small_vector<E, 8>(tracker); }); break;
    default: fuzz_container<memkit::small_vector<E, 17>, E>(in, &tracker, [&] { return memkit::small_vector<E, 17>(tracker); }); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  memkit::tracking_options options;
  options.report_leaks_at_destruction = false;
  memkit::tracking_allocator tracker(memkit::malloc_allocator::instance(), options);
  switch (in.below(3)) {
    case 0: fuzz_element<counted<true>>(in, tracker); break;
    case 1: fuzz_element<counted<false>>(in, tracker); break;
    default: fuzz_element<relocatable_element>(in, tracker); break;
  }
  return 0;
}
