// An object from new released with free().
#include <cstdlib>

struct point {
  int x = 1;
  int y = 2;
};

point* volatile object;

void release_with_free() {
  object = new point;
#if defined(MEMKIT_CORPUS_CLEAN)
  delete object;
#else
  std::free(object);
#endif
}

int main() {
  release_with_free();
  return 0;
}
