/* A write one byte before a block's start (an index of -1), which lands at the end of the block
   before it: found when that one is freed, by the canary that fills the rest of its slot. */
#include <stdlib.h>
#include <string.h>

char* volatile first;
char* volatile second;
#if defined(MEMKIT_CORPUS_CLEAN)
int volatile index_of_the_write = 0;
#else
int volatile index_of_the_write = -1;
#endif

void write_before_the_start(void) {
  first = malloc(24);
  second = malloc(24);
  memset(first, 0, 24);
  memset(second, 0, 24);
  second[index_of_the_write] = 'x';
  free(first);
  free(second);
}

int main(void) {
  write_before_the_start();
  return 0;
}
