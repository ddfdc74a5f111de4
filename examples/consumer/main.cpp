// Built by tools/test against an installed memkit: proves the package config works.
#include <memkit/memkit.hpp>

#include <cstdio>

int main() {
  memkit::allocator& a = memkit::default_allocator();
  void* p = a.allocate(64);
  if (p == nullptr) return 1;
  a.deallocate(p, 64);
  std::printf("memkit consumer: ok (page size %zu)\n", memkit::os::page_size());
  return 0;
}
