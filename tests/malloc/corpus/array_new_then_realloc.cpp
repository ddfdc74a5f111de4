// An array from new[] grown with realloc().
#include <cstdlib>
#include <cstring>

char* volatile text;

void grow_with_realloc() {
  text = new char[16];
  std::strcpy(text, "short");
#if defined(MEMKIT_CORPUS_CLEAN)
  char* longer = new char[64];
  std::strcpy(longer, text);
  delete[] text;
  text = longer;
  delete[] text;
#else
  text = static_cast<char*>(std::realloc(text, 64));
  std::free(text);
#endif
}

int main() {
  grow_with_realloc();
  return 0;
}
