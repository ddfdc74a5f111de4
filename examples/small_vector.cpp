// memkit::small_vector: the first N elements live inside the object; beyond N it spills to its
// allocator and behaves like memkit::vector.
#include <cstdio>

#include "memkit/small_vector.hpp"
#include "memkit/tracking_allocator.hpp"
#include "memkit/vector.hpp"

// Takes any small_vector<int, N> (any N) and any vector<int>: vector_base<int> is the view type.
static void divisors(int n, memkit::vector_base<int>& out) {
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
}

int main() {
  memkit::tracking_allocator tracker(memkit::malloc_allocator::instance());

  // Most numbers below 1000 have at most 16 divisors: those never touch the allocator.
  int spilled = 0;
  for (int n = 1; n < 1000; ++n) {
    memkit::small_vector<int, 16> found(tracker);
    divisors(n, found);
    spilled += found.is_inline() ? 0 : 1;
  }
  const auto stats = tracker.statistics();
  std::printf("999 numbers, %d needed the heap, %llu allocations\n", spilled,
              static_cast<unsigned long long>(stats.allocations));
  if (stats.allocations != static_cast<unsigned long long>(spilled)) return 1;

  // The same function fills a heap vector; the two compare equal element by element.
  memkit::vector<int> heap;
  memkit::small_vector<int, 4> small;
  divisors(360, heap);
  divisors(360, small);
  if (!(heap == small) || heap.size() != 24) return 2;

  // 24 bytes of overhead on 64-bit: pointer, 32-bit size and capacity, allocator pointer.
  static_assert(sizeof(void*) != 8 || sizeof(memkit::small_vector<int, 8>) == 24 + 8 * sizeof(int));

  // Shrinking brings elements back inline when they fit.
  small.resize(3);
  small.shrink_to_fit();
  return small.is_inline() ? 0 : 3;
}
