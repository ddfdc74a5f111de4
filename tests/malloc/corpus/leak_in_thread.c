/* Worker threads that exit holding blocks in a thread-local variable and in a local: both lost when
   the thread ends, though the stack and TLS it leaves stay mapped for the next thread. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static __thread char* per_thread_buffer;

void* work_in_a_thread(void* unused) {
  (void)unused;
  per_thread_buffer = malloc(48);
  char* volatile scratch = malloc(32);
  memset(per_thread_buffer, 1, 48);
  memset(scratch, 2, 32);
#if defined(MEMKIT_CORPUS_CLEAN)
  free(scratch);
  free(per_thread_buffer);
  per_thread_buffer = NULL;
#endif
  return NULL;
}

int main(void) {
  pthread_t workers[4];
  for (int i = 0; i < 4; ++i) {
    if (pthread_create(&workers[i], NULL, work_in_a_thread, NULL) != 0) return 1;
  }
  for (int i = 0; i < 4; ++i) pthread_join(workers[i], NULL);
  return 0;
}
