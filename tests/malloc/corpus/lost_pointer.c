/* A block whose only pointer is overwritten: definitely lost. */
#include <stdlib.h>
#include <string.h>

char* volatile latest;

void lose_a_pointer(void) {
  latest = malloc(40);
  strcpy(latest, "the only pointer to me is overwritten");
#if !defined(MEMKIT_CORPUS_CLEAN)
  latest = NULL;
#endif
}

int main(void) {
  lose_a_pointer();
#if defined(MEMKIT_CORPUS_CLEAN)
  free(latest);
#endif
  return 0;
}
