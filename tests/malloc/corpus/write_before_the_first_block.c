/* A write one byte before a block's start (an index of -1), where the block is the first of its
   page, with no block before it: found when it is freed, by the canary that ends the page's guard
   (a first slot debug mode never hands out). A size few programs ask for early makes it the first
   block of its page. */
#include <stdlib.h>
#include <string.h>

char* volatile buffer;
#if defined(MEMKIT_CORPUS_CLEAN)
int volatile index_of_the_write = 0;
#else
int volatile index_of_the_write = -1;
#endif

void write_before_the_first_block(void) {
  buffer = malloc(5000);
  memset(buffer, 0, 5000);
  buffer[index_of_the_write] = 'x';
  free(buffer);
}

int main(void) {
  write_before_the_first_block();
  return 0;
}
