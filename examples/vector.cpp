// memkit::vector: a std::vector whose allocator is chosen at run time, grows in place when the
// allocator can, and can fail without throwing.
#include <cstdio>
#include <memory>
#include <string>

#include "memkit/tracking_allocator.hpp"
#include "memkit/vector.hpp"
#include "memkit/virtual_arena.hpp"

// One function for every memkit vector, whatever its allocator (and for small_vector too).
static long sum(const memkit::vector_base<int>& values) {
  long total = 0;
  for (int v : values) total += v;
  return total;
}

int main() {
  // 1. On the default allocator (malloc): large growth goes through realloc, not a copy.
  memkit::vector<int> numbers;
  for (int i = 0; i < 1000; ++i) numbers.push_back(i);

  // 2. On an arena: the buffer grows where it is, it never moves.
  memkit::virtual_arena arena(std::size_t{64} << 20);
  memkit::vector<int> in_arena(arena);
  in_arena.push_back(0);
  const int* first = in_arena.data();
  for (int i = 1; i < 1000; ++i) in_arena.push_back(i);
  if (in_arena.data() != first) return 1;
  if (sum(numbers) != sum(in_arena)) return 2;

  // 3. Under a budget: failure is a return value and leaves the vector as it was.
  memkit::tracking_allocator budgeted(memkit::malloc_allocator::instance(), {.budget = 4096});
  memkit::vector<std::string> names(budgeted);
  if (!names.try_push_back("ada") || !names.try_push_back("grace")) return 3;
  if (names.try_reserve(100000)) return 4;  // 100000 strings do not fit in 4 KiB
  if (names.size() != 2 || names[1] != "grace") return 5;

  // 4. Reserve once, then append without capacity checks (asserted in debug builds).
  memkit::vector<std::unique_ptr<int>> owners;
  owners.reserve(3);
  for (int i = 0; i < 3; ++i) owners.unchecked_push_back(std::make_unique<int>(i));

  // 5. std::erase_if's counterpart, found by argument-dependent lookup.
  erase_if(numbers, [](int v) { return v % 2 == 1; });
  std::printf("%zu even numbers, %zu names, %llu request(s) refused by the budget\n", numbers.size(),
              names.size(), static_cast<unsigned long long>(budgeted.statistics().budget_refusals));
  return numbers.size() == 500 ? 0 : 6;
}
