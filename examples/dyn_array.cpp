// dyn_array in a few lines: an array that reserves room for its maximum length up front and never
// moves its elements, so pointers into it stay valid while it grows. Returns 0 on success.
#include <memkit/dyn_array.hpp>

#include <cstdio>
#include <numeric>
#include <span>
#include <string>

namespace {

// Anything that takes a span takes a dyn_array.
long long sum(std::span<const int> values) { return std::accumulate(values.begin(), values.end(), 0LL); }

}  // namespace

int main() {
  // Room for a billion ints (4 GB of address space); physical memory is used only as it fills.
  memkit::dyn_array<int> numbers(1'000'000'000);
  numbers.push_back(1);
  const int* first = &numbers.front();
  for (int i = 2; i <= 1'000'000; ++i) numbers.push_back(i);
  if (&numbers.front() != first) return 1;  // never moved, unlike std::vector
  if (sum(numbers) != 500'000'500'000LL) return 2;
  std::printf("%zu ints, capacity (committed) %zu, max_size %zu\n", numbers.size(), numbers.capacity(), numbers.max_size());

  // Stable addresses make "intern and keep a pointer" safe.
  memkit::dyn_array<std::string> names(1'000'000);
  const std::string* alice = &names.emplace_back("alice");
  for (int i = 0; i < 100'000; ++i) names.emplace_back("user" + std::to_string(i));
  if (*alice != "alice") return 3;

  // Running out of max_size: try_push_back says false, push_back throws std::length_error.
  memkit::dyn_array<int> bounded(2, {1, 2});
  if (bounded.try_push_back(3)) return 4;
  try {
    bounded.push_back(3);
    return 5;
  } catch (const std::length_error&) {
  }

  // Shrinking gives the memory back to the system; the elements stay where they are.
  numbers.resize(10);
  numbers.shrink_to_fit();
  if (&numbers.front() != first || numbers.back() != 10) return 6;
  std::printf("after shrink_to_fit: capacity %zu\n", numbers.capacity());
  std::puts("dyn_array example: ok");
  return 0;
}
