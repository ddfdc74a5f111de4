/* One byte written past the end of a block. */
#include <stdlib.h>

char* volatile block;

void write_past_the_end(void) {
  block = malloc(10);
#if defined(MEMKIT_CORPUS_CLEAN)
  block[9] = 'x';
#else
  block[10] = 'x';
#endif
}

int main(void) {
  write_past_the_end();
  free(block);
  return 0;
}
