// An array from new[] released with delete (not delete[]).
int* volatile numbers;

void delete_an_array_as_one() {
  numbers = new int[10];
#if defined(MEMKIT_CORPUS_CLEAN)
  delete[] numbers;
#else
  delete numbers;
#endif
}

int main() {
  delete_an_array_as_one();
  return 0;
}
