/* Two blocks that point to each other, and nothing else to them: one definitely lost, the other
   indirectly lost. */
#include <stdlib.h>

struct node {
  struct node* next;
  int value;
};

struct node* volatile root;

void make_a_cycle(void) {
  struct node* a = malloc(sizeof *a);
  struct node* b = malloc(sizeof *b);
  a->next = b;
  b->next = a;
  root = a;
#if !defined(MEMKIT_CORPUS_CLEAN)
  root = NULL;
#endif
}

int main(void) {
  make_a_cycle();
#if defined(MEMKIT_CORPUS_CLEAN)
  free(root->next);
  free(root);
#endif
  return 0;
}
