// An object of a derived class deleted through a pointer to its base, whose destructor is not
// virtual: the sized operator delete is told the base's size, not the object's.
struct shape {
  int sides = 0;
#if defined(MEMKIT_CORPUS_CLEAN)
  virtual ~shape() = default;
#endif
};

struct polygon : shape {
  double corners[4] = {};
};

shape* volatile object;

void delete_through_the_base() {
  object = new polygon;
  delete object;
}

int main() {
  delete_through_the_base();
  return 0;
}
