/* free() of a pointer into the middle of a block. */
#include <stdlib.h>

char* volatile block;

void free_from_the_middle(void) {
#if defined(MEMKIT_CORPUS_CLEAN)
  free(block);
#else
  free(block + 8);
#endif
}

int main(void) {
  block = malloc(64);
  free_from_the_middle();
  return 0;
}
