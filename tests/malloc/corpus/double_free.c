/* A block freed twice. */
#include <stdlib.h>

void* volatile block;

void free_twice(void) {
  free(block);
#if !defined(MEMKIT_CORPUS_CLEAN)
  free(block);
#endif
}

int main(void) {
  block = malloc(24);
  free_twice();
  return 0;
}
