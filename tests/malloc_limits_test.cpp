// The edge of memory: child processes under a small RLIMIT_AS allocate beyond it, through the
// drop-in malloc (LD_PRELOAD=libmemkit_malloc.so, release and debug mode) and through a private
// general_allocator. Each scenario is a run of tests/malloc/limits.cpp, which checks that every
// refusal is a null pointer with ENOMEM (a bad_alloc from operator new), never a crash, that a
// failed realloc leaves the block intact, that small requests succeed right after a refused large
// one, that threads hitting the limit keep their data, and that a long large/small churn does not
// pile up mappings (the bound is explained there).
#include <gtest/gtest.h>

#if !defined(MEMKIT_MALLOC_TESTS)

// Sanitizer builds: the drop-in is not built (the sanitizer owns malloc), and the C++ API's
// scenarios are not run either: at the limit the sanitizer's own allocator fails first and ends
// the process (ASan: "allocator is out of memory", then "internal allocator is out of memory",
// exit 1; it does not return null), so the child would test the sanitizer, not memkit.
TEST(malloc_limits, not_run_in_sanitizer_builds) {
  GTEST_SKIP() << "RLIMIT_AS and sanitizers do not mix: at the limit the sanitizer's own allocator "
                  "fails and ends the process; the drop-in is not built there either";
}

#else

#include <string>
#include <vector>

#include "support/spawn.hpp"

namespace {

using memkit::testing::outcome;
using memkit::testing::run;

const std::string program = MEMKIT_MALLOC_LIMITS;
const std::string preload = std::string("LD_PRELOAD=") + MEMKIT_MALLOC_LIBRARY;

std::string describe(const outcome& out) {
  std::string text = "exit " + std::to_string(out.exit_code);
  if (out.signal != 0) text += ", killed by signal " + std::to_string(out.signal);
  return text + "\n" + out.output;
}

void expect_pass(const outcome& out) {
  EXPECT_EQ(out.signal, 0) << describe(out);
  EXPECT_EQ(out.exit_code, 0) << describe(out);
  EXPECT_NE(out.output.find("PASS"), std::string::npos) << describe(out);
}

// The scenario through the drop-in, in release mode and in debug mode.
void through_the_drop_in(const char* scenario) {
  for (const char* debug : {"MEMKIT_DEBUG=0", "MEMKIT_DEBUG=1"}) {
    SCOPED_TRACE(debug);
    expect_pass(run({program, scenario, "malloc"}, {preload, debug}));
  }
}

void through_the_cpp_api(const char* scenario) { expect_pass(run({program, scenario, "general"}, {})); }

// A purge delay no run reaches: cached memory goes back only because the allocator gives it up
// at the limit, never because a timer ran out while the scenario ran (a slow run, such as debug
// mode in a debug build, used to pass where a fast one failed).
const std::string no_timed_purge = "MEMKIT_PURGE_DELAY_MS=600000";

TEST(malloc_limits, the_helper_refuses_to_run_on_another_malloc) {
  // Without LD_PRELOAD the scenarios would test glibc: the helper says so and fails.
  auto out = run({program, "refusals", "malloc"}, {});
  EXPECT_EQ(out.exit_code, 3) << describe(out);
}

TEST(malloc_limits, malloc_calloc_and_aligned_forms_return_null_with_enomem) {
  through_the_drop_in("refusals");
}

TEST(malloc_limits, realloc_beyond_the_limit_keeps_the_old_block) { through_the_drop_in("realloc"); }

TEST(malloc_limits, operator_new_throws_bad_alloc_and_nothrow_new_returns_null) {
  through_the_drop_in("new");
}

TEST(malloc_limits, memory_freed_after_exhaustion_serves_again) {
  through_the_drop_in("exhaust");
  for (const char* debug : {"MEMKIT_DEBUG=0", "MEMKIT_DEBUG=1"}) {
    SCOPED_TRACE(std::string(debug) + ", " + no_timed_purge);
    expect_pass(run({program, "exhaust", "malloc"}, {preload, debug, no_timed_purge}));
  }
}

TEST(malloc_limits, threads_hitting_the_limit_keep_their_data) { through_the_drop_in("threads"); }

TEST(malloc_limits, mappings_stay_bounded_over_a_long_large_small_churn) { through_the_drop_in("churn"); }

TEST(general_allocator_limits, allocate_and_allocate_zeroed_return_null_with_enomem) {
  through_the_cpp_api("refusals");
}

TEST(general_allocator_limits, reallocate_beyond_the_limit_keeps_the_old_block) {
  through_the_cpp_api("realloc");
}

TEST(general_allocator_limits, memory_freed_after_exhaustion_serves_again) {
  through_the_cpp_api("exhaust");
  SCOPED_TRACE(no_timed_purge);
  expect_pass(run({program, "exhaust", "general"}, {no_timed_purge}));
}

TEST(general_allocator_limits, threads_hitting_the_limit_keep_their_data) { through_the_cpp_api("threads"); }

TEST(general_allocator_limits, mappings_stay_bounded_over_a_long_large_small_churn) {
  through_the_cpp_api("churn");
}

}  // namespace

#endif
