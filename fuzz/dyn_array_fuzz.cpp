// libFuzzer harness for memkit::dyn_array<T>: the shared container driver (container_driver.hpp)
// against std::vector, with counted elements of three kinds and a random max_size, so growth past
// it (std::length_error, strong) is exercised as often as growth within it. Beyond the driver's
// checks: the elements never move (data() is the start of the reservation) and capacity stays
// within max_size(). Commit failures come from the os layer and are covered by
// tests/dyn_array_test.cpp's fault injection; this harness has no allocator to fail.
#include <cstddef>
#include <cstdint>

#include "container_driver.hpp"
#include "memkit/dyn_array.hpp"

namespace memkit::fuzzing {

template <class E>
struct container_traits<memkit::dyn_array<E>> {
  static constexpr bool has_insert_count = true;
  static constexpr bool has_erase_range = true;
  static constexpr bool has_try_resize = false;
  static std::size_t max_count(const memkit::dyn_array<E>& c) { return c.max_size(); }
  static void extra_step(memkit::dyn_array<E>&, input&) {}
  static void check(const memkit::dyn_array<E>& c, memkit::tracking_allocator*) {
    MEMKIT_FUZZ_CHECK(c.capacity() <= c.max_size());
    MEMKIT_FUZZ_CHECK(static_cast<const void*>(c.data()) == c.storage().base());
    MEMKIT_FUZZ_CHECK(c.storage().used() <= c.storage().committed());
  }
};

}  // namespace memkit::fuzzing

namespace {

using namespace memkit::fuzzing;

template <class E>
void fuzz_element(input& in) {
  const std::size_t max_size = in.between(1, 3000);
  const memkit::dyn_array_options options{.commit_step = 4096 * (1 + in.below(4)),
                                          .prefault_step = 4096,
                                          .prefault = in.coin()};
  fuzz_container<memkit::dyn_array<E>, E>(in, nullptr, [&] { return memkit::dyn_array<E>(max_size, options); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  switch (in.below(3)) {
    case 0: fuzz_element<counted<true>>(in); break;
    case 1: fuzz_element<counted<false>>(in); break;
    default: fuzz_element<relocatable_element>(in); break;
  }
  return 0;
}
