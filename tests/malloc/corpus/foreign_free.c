/* free() of an address malloc never returned. */
#include <stdlib.h>

void* volatile target;

void free_a_stack_address(void) {
  int on_stack = 0;
  target = &on_stack;
#if defined(MEMKIT_CORPUS_CLEAN)
  target = malloc(8);
#endif
  free(target);
}

int main(void) {
  free_a_stack_address();
  return 0;
}
