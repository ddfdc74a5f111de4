/* Misuses the heap as argv[1] says, for the drop-in malloc's debug-mode tests (run with
   LD_PRELOAD=libmemkit_malloc.so MEMKIT_DEBUG=1). Pointers go through volatile variables so the
   compiler neither warns about nor removes the misuse. Exits 0 when the misuse went unnoticed.
   Also: "ok" (correct use, from a constructor before main too), "plugin PATH" (dlopen a library
   whose threads use TLS and the heap), "threads" (many short-lived threads). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void* volatile slot;

static void* launder(void* p) {
  slot = p;
  return slot;
}

/* Before main: every allocation function, from a constructor. */
__attribute__((constructor)) static void allocate_before_main(void) {
  void* a = malloc(10);
  void* b = calloc(3, 7);
  void* c = realloc(malloc(5), 500);
  void* d = NULL;
  if (posix_memalign(&d, 64, 100) != 0 || !a || !b || !c) abort();
  free(a);
  free(b);
  free(c);
  free(d);
}

typedef size_t (*scratch_fn)(size_t);
static scratch_fn plugin_scratch;

static void* use_plugin(void* unused) {
  (void)unused;
  for (size_t size = 16; size <= 65536; size *= 4)
    if (plugin_scratch(size) != size) return (void*)1;
  return NULL;
}

static void* short_lived(void* arg) {
  void* blocks[64];
  for (int i = 0; i < 64; ++i) blocks[i] = malloc((size_t)(16 + i * 8 + (intptr_t)arg % 7));
  for (int i = 0; i < 64; i += 2) free(blocks[i]);
  return blocks[1]; /* the joiner frees the rest: blocks outlive their thread */
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* what = argv[1];
  if (strcmp(what, "plugin") == 0 && argc == 3) {
    for (int round = 0; round < 3; ++round) {
      void* library = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
      if (!library) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
      }
      char* (*copy)(void) = (char* (*)(void))dlsym(library, "plugin_copy_greeting");
      plugin_scratch = (scratch_fn)dlsym(library, "plugin_thread_scratch");
      if (!copy || !plugin_scratch) return 4;
      char* text = copy();
      if (!text || strcmp(text, "hello from the plugin") != 0) return 5;
      free(text);
      pthread_t threads[4];
      for (int t = 0; t < 4; ++t) pthread_create(&threads[t], NULL, use_plugin, NULL);
      for (int t = 0; t < 4; ++t) {
        void* failed = NULL;
        pthread_join(threads[t], &failed);
        if (failed) return 6;
      }
      if (dlclose(library) != 0) return 7;
    }
    return 0;
  }
  if (strcmp(what, "threads") == 0) {
    for (int i = 0; i < 200; ++i) {
      pthread_t thread;
      void* left = NULL;
      if (pthread_create(&thread, NULL, short_lived, (void*)(intptr_t)i) != 0) return 3;
      pthread_join(thread, &left);
      free(left);
    }
    return 0;
  }
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
    slot = NULL; /* the only pointer to the block is gone: lost */
    return 0;
  }
  return 2;
}
