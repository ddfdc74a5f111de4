// A block from malloc() released with delete.
#include <cstdlib>

int* volatile number;

void delete_a_malloced_block() {
  number = static_cast<int*>(std::malloc(sizeof(int)));
#if defined(MEMKIT_CORPUS_CLEAN)
  std::free(number);
#else
  delete number;
#endif
}

int main() {
  delete_a_malloced_block();
  return 0;
}
