/* Preloaded next to the drop-in by the test real_programs.catches_misuse: frees a block twice when
 * debug mode is on (and only then: without debug mode a double free is undefined behaviour), so
 * that tests/real_programs/run must report the misuse even though the program itself is correct
 * and, with MEMKIT_ABORT=0, exits as it would have. */
#include <stdlib.h>

__attribute__((constructor)) static void free_twice(void) {
  if (getenv("MEMKIT_DEBUG") == NULL) return;
  void* volatile block = malloc(16);
  free(block);
  free(block);
}
