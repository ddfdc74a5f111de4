/* A write to a block after it was freed (found when the block leaves the quarantine or, at the
   latest, by the checks at exit). */
#include <stdlib.h>

char* volatile block;

void write_after_free(void) {
  block = malloc(32);
  free(block);
#if !defined(MEMKIT_CORPUS_CLEAN)
  block[3] = 'x';
#endif
}

int main(void) {
  write_after_free();
  return 0;
}
