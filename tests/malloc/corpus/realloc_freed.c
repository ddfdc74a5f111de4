/* realloc() of a block already freed. */
#include <stdlib.h>

void* volatile block;

void realloc_after_free(void) {
  block = malloc(32);
#if !defined(MEMKIT_CORPUS_CLEAN)
  free(block);
#endif
  block = realloc(block, 64);
  free(block);
}

int main(void) {
  realloc_after_free();
  return 0;
}
