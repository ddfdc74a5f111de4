/* The same leak a hundred times: one report for all of them. */
#include <stdlib.h>
#include <string.h>

void leak_in_a_loop(void) {
  for (int i = 0; i < 100; ++i) {
    char* volatile scratch = malloc(16);
    memset(scratch, i, 16);
#if defined(MEMKIT_CORPUS_CLEAN)
    free(scratch);
#endif
  }
}

int main(void) {
  leak_in_a_loop();
  return 0;
}
