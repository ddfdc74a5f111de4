/* A write one byte before the start of a 200,000-byte buffer (an index of -1): a block of a large
   class, alone in its span of slices, found when it is freed by the canary that ends the slice
   debug mode puts before it. */
#include <stdlib.h>
#include <string.h>

char* volatile buffer;
#if defined(MEMKIT_CORPUS_CLEAN)
int volatile index_of_the_write = 0;
#else
int volatile index_of_the_write = -1;
#endif

void write_before_a_large_block(void) {
  buffer = malloc(200000);
  memset(buffer, 0, 200000);
  buffer[index_of_the_write] = 'x';
  free(buffer);
}

int main(void) {
  write_before_a_large_block();
  return 0;
}
