/* A write one past the end of a block the program keeps to the end, so no free checks it: found at
   exit, where the canaries of the live blocks are checked with the leak report. */
#include <stdlib.h>
#include <string.h>

char* volatile kept;
#if defined(MEMKIT_CORPUS_CLEAN)
size_t volatile written = 24;
#else
size_t volatile written = 25;
#endif

void fill_one_too_many(void) {
  kept = malloc(24);
  memset(kept, 'x', written);
}

int main(void) {
  fill_one_too_many();
  return 0;
}
