/* A dlopen()ed library for the drop-in malloc's tests: it allocates in its constructor, keeps
   thread-local state, hands out blocks the caller frees, frees the caller's blocks, and frees its
   own in its destructor (at dlclose). */
#include <stdlib.h>
#include <string.h>

static char* greeting;
static __thread char* scratch;

__attribute__((constructor)) static void plugin_load(void) {
  greeting = malloc(32);
  if (greeting) strcpy(greeting, "hello from the plugin");
}

__attribute__((destructor)) static void plugin_unload(void) {
  free(greeting);
  greeting = NULL;
}

/* A copy of the greeting in a fresh malloc block; the caller frees it. */
char* plugin_copy_greeting(void) {
  if (!greeting) return NULL;
  char* copy = malloc(strlen(greeting) + 1);
  if (copy) strcpy(copy, greeting);
  return copy;
}

/* Frees a block the caller allocated. */
void plugin_free(void* p) { free(p); }

/* Grows a per-thread buffer (thread-local storage of a dlopen()ed library); returns its size. */
size_t plugin_thread_scratch(size_t size) {
  char* grown = realloc(scratch, size);
  if (!grown) return 0;
  scratch = grown;
  memset(scratch, 1, size);
  return size;
}
