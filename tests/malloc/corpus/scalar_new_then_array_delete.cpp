// One object from new released with delete[].
struct counter {
  long value = 0;
};

counter* volatile object;

void delete_one_as_an_array() {
  object = new counter;
#if defined(MEMKIT_CORPUS_CLEAN)
  delete object;
#else
  delete[] object;
#endif
}

int main() {
  delete_one_as_an_array();
  return 0;
}
