/* Compiled without unwind tables (tests/CMakeLists.txt): a frame no unwinder can step over, as
   code built with -fno-asynchronous-unwind-tables leaves on a stack. */
int memkit_test_call_without_unwind_tables(int (*function)(void)) {
  volatile int result = function(); /* not a tail call: this frame stays on the stack */
  return result;
}
