// Built by tools/test against an installed memkit: proves the package config, the installed
// headers and the library work from another project.
#include <memkit/memkit.hpp>

#include <cstdio>

int main() {
  memkit::dyn_array<int> numbers(1'000'000);
  for (int i = 0; i < 1000; ++i) numbers.push_back(i);

  memkit::virtual_arena arena(std::size_t{1} << 30);
  memkit::vector<int> squares(arena);
  for (int n : numbers) squares.push_back(n * n);

  memkit::general_allocator& gpa = memkit::general_allocator::global();
  void* block = gpa.allocate(100, 16);
  if (block == nullptr || squares[999] != 999 * 999) return 1;
  gpa.free(block);
  std::printf("memkit consumer: ok (page size %zu)\n", memkit::os::page_size());
  return 0;
}
