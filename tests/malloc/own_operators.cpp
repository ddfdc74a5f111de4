// A shared library that carries its own global operator new, new[], delete and delete[] on malloc
// and free, bound inside it (-Bsymbolic-functions), as a library linked with a static libstdc++
// does (the LLVM of Rust's toolchain). Under the drop-in, its `new` calls memkit's malloc, while a
// program's `delete` of what it returns reaches memkit's operator delete.
#include <cstdlib>
#include <new>

// Both round the request up to 16 bytes, so what malloc is asked for is not what a sized delete of
// the object passes.
void* operator new(std::size_t size) {
  void* p = std::malloc((size + 15) & ~std::size_t{15});
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t size) {
  void* p = std::malloc((size + 15) & ~std::size_t{15});
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

extern "C" {
int* own_operators_make_one() { return new int(7); }
int* own_operators_make_many() { return new int[4]{1, 2, 3, 4}; }
void own_operators_release_one(int* p) { delete p; }
void own_operators_release_many(int* p) { delete[] p; }
}
