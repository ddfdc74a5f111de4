/* A program that defines malloc, calloc, realloc and free itself (a bump allocator over a static
   buffer that never frees), as one linked with its own allocator does. The loader finds these
   before a preloaded library's, so none of its allocations reach memkit's drop-in. */
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static alignas(16) unsigned char arena[1 << 20];
static size_t used;

void* malloc(size_t size) {
  size = (size + 15) & ~(size_t)15;
  if (size > sizeof arena - used) return NULL;
  void* p = arena + used;
  used += size;
  return p;
}

void free(void* p) { (void)p; }

void* calloc(size_t count, size_t size) {
  if (size != 0 && count > (size_t)-1 / size) return NULL;
  return malloc(count * size); /* the arena starts zeroed and is never reused */
}

void* realloc(void* p, size_t size) {
  void* moved = malloc(size);
  /* Blocks are never freed, so everything after p up to the end of the used part is readable. */
  if (moved != NULL && p != NULL) {
    size_t available = (size_t)((unsigned char*)moved - (unsigned char*)p);
    memcpy(moved, p, available < size ? available : size);
  }
  return moved;
}

int main(void) {
  char* lost = malloc(40); /* a leak memkit cannot see */
  strcpy(lost, "own malloc");
  lost = NULL;
  printf("%s\n", "own malloc done");
  return 0;
}
