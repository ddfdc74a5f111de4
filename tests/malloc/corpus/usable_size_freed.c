/* malloc_usable_size() of a block already freed. */
#include <malloc.h>
#include <stdlib.h>

void* volatile block;
volatile size_t size;

void ask_size_after_free(void) {
  block = malloc(32);
#if !defined(MEMKIT_CORPUS_CLEAN)
  free(block);
#endif
  size = malloc_usable_size(block);
#if defined(MEMKIT_CORPUS_CLEAN)
  free(block);
#endif
}

int main(void) {
  ask_size_after_free();
  return 0;
}
