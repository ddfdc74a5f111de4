/* Misuses the heap as argv[1] says, for the drop-in malloc's debug-mode tests (run with
   LD_PRELOAD=libmemkit_malloc.so MEMKIT_DEBUG=1). Pointers go through volatile variables so the
   compiler neither warns about nor removes the misuse. Exits 0 when the misuse went unnoticed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void* volatile slot;

static void* launder(void* p) {
  slot = p;
  return slot;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const char* what = argv[1];
  if (strcmp(what, "ok") == 0) {
    for (int i = 0; i < 1000; ++i) {
      char* p = malloc((size_t)i + 1);
      if (!p) return 3;
      memset(p, 1, (size_t)i + 1);
      free(launder(p));
    }
    return 0;
  }
  if (strcmp(what, "double-free") == 0) {
    char* p = launder(malloc(24));
    p[0] = 1;
    free(p);
    free(launder(p));
    return 0;
  }
  if (strcmp(what, "foreign-free") == 0) {
    static char not_from_malloc[256];
    free(launder(not_from_malloc + 64));
    return 0;
  }
  if (strcmp(what, "interior-free") == 0) {
    char* p = launder(malloc(64));
    free(launder(p + 16));
    return 0;
  }
  if (strcmp(what, "overflow") == 0) {
    char* p = launder(malloc(24));
    memset(launder(p), 'x', 24 + 4); /* 4 bytes past the end */
    free(p);
    return 0;
  }
  if (strcmp(what, "use-after-free") == 0) {
    char* p = launder(malloc(48));
    free(p);
    ((char*)launder(p))[8] = 'x';
    /* The block is found overwritten when it is handed out again. */
    for (int i = 0; i < 100000; ++i) launder(malloc(48));
    return 0;
  }
  if (strcmp(what, "close-stderr") == 0) { /* as GNU tools do at exit */
    free(launder(malloc(100)));
    close(2);
    return 0;
  }
  if (strcmp(what, "leak") == 0) {
    launder(malloc(1234));
    return 0;
  }
  return 2;
}
