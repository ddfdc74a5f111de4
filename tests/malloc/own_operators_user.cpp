// Hands blocks across a library with its own operators (own_operators.cpp). "pairs": every new
// is released with its delete, on either side of the boundary, which debug mode must not report;
// "array-delete-of-one": delete[] of the library's scalar new, a mismatch it must report.
#include <cstdio>
#include <cstring>

extern "C" {
int* own_operators_make_one();
int* own_operators_make_many();
void own_operators_release_one(int* p);
void own_operators_release_many(int* p);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "pairs";
  if (std::strcmp(mode, "pairs") == 0) {
    int sum = 0;
    for (int i = 0; i < 3; ++i) {
      int* one = own_operators_make_one();  // the library's new, the program's (memkit's) delete
      sum += *one;
      delete one;
      int* many = own_operators_make_many();
      sum += many[3];
      delete[] many;
      own_operators_release_one(new int(1));  // memkit's new, the library's delete
      own_operators_release_many(new int[8]());
    }
    std::printf("sum %d\n", sum);
    return 0;
  }
  if (std::strcmp(mode, "array-delete-of-one") == 0) {
    delete[] own_operators_make_one();
    return 0;
  }
  return 2;
}
