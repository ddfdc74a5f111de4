// A buffer from the aligned operator new released by the plain operator delete: the aligned new
// must meet the aligned delete of the same alignment (an allocator may keep aligned blocks apart,
// and the plain delete would then hand one to the wrong place).
#include <new>

void* volatile buffer;

void release_without_the_alignment() {
  buffer = ::operator new(256, std::align_val_t{64});
#if defined(MEMKIT_CORPUS_CLEAN)
  ::operator delete(buffer, std::align_val_t{64});
#else
  ::operator delete(buffer);
#endif
}

int main() {
  release_without_the_alignment();
  return 0;
}
