#include "memkit/dyn_array.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <list>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "memkit/os.hpp"
#include "support/counted.hpp"
#include "support/no_address.hpp"
#if !MEMKIT_WINDOWS
#include <unistd.h>

#include "support/rlimit.hpp"
#endif

namespace os = memkit::os;
using memkit::dyn_array;
using memkit::testing::counted;
using memkit::testing::counters;
using memkit::testing::injected_exception;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class dyn_array_test : public ::testing::Test {
 protected:
  void SetUp() override { counters::reset(); }
  void TearDown() override {
    os::testing::clear_injected_failures();
    counters::reset();
  }
};

using element = counted<true>;
using throwing_move_element = counted<false>;

TEST_F(dyn_array_test, reserves_max_size_and_commits_nothing) {
  dyn_array<int> a(1'000'000'000);  // 4 GB of address space, no memory
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(a.max_size(), 1'000'000'000u);
  EXPECT_EQ(a.storage().committed(), 0u);
  EXPECT_GE(a.storage().reserved(), 4'000'000'000u);
}

TEST_F(dyn_array_test, push_back_appends_and_commits_in_steps) {
  dyn_array<int> a(10'000'000, {.commit_step = 1 * MiB});
  for (int i = 0; i < 1'000'000; ++i) a.push_back(i);
  ASSERT_EQ(a.size(), 1'000'000u);
  for (int i = 0; i < 1'000'000; ++i) ASSERT_EQ(a[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(a.front(), 0);
  EXPECT_EQ(a.back(), 999'999);
  EXPECT_EQ(a.storage().committed(), 4 * MiB);  // 4 MB of ints in 1 MiB steps
  EXPECT_EQ(a.capacity(), 4 * MiB / sizeof(int));
}

TEST_F(dyn_array_test, elements_never_move) {
  dyn_array<std::string> a(1'000'000, {.commit_step = 64 * 1024});
  a.emplace_back("first");
  std::string* first = &a.front();
  const std::string* data = a.data();
  auto it = a.begin();
  std::vector<std::string*> addresses;
  for (int i = 0; i < 200'000; ++i) addresses.push_back(&a.emplace_back(std::to_string(i)));
  EXPECT_EQ(&a.front(), first);
  EXPECT_EQ(a.data(), data);
  EXPECT_EQ(&*it, first);
  EXPECT_EQ(*first, "first");
  for (std::size_t i = 0; i < addresses.size(); i += 997) EXPECT_EQ(addresses[i], &a[i + 1]);
}

TEST_F(dyn_array_test, max_size_reached_throws_length_error_and_try_returns_false) {
  dyn_array<int> a(3);
  a.push_back(1);
  a.push_back(2);
  EXPECT_TRUE(a.try_push_back(3));
  EXPECT_FALSE(a.try_push_back(4));
  EXPECT_EQ(a.try_emplace_back(4), nullptr);
  EXPECT_THROW(a.push_back(4), std::length_error);
  EXPECT_THROW(a.emplace_back(4), std::length_error);
  EXPECT_THROW(a.reserve(4), std::length_error);
  EXPECT_THROW(a.resize(4), std::length_error);
  EXPECT_THROW(a.insert(a.begin(), 9), std::length_error);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a, (dyn_array<int>(3, {1, 2, 3})));
}

TEST_F(dyn_array_test, size_overflow_is_length_error_and_impossible_reservation_bad_alloc) {
  EXPECT_THROW(dyn_array<std::uint64_t>{std::numeric_limits<std::size_t>::max() / 4}, std::length_error);
  EXPECT_THROW(dyn_array<char>{std::numeric_limits<std::size_t>::max()}, std::length_error);
  EXPECT_THROW(dyn_array<char>{std::size_t{1} << 62}, std::bad_alloc);
  os::testing::inject_failure(os::testing::operation::reserve, 1);
  EXPECT_THROW(dyn_array<int>{16}, std::bad_alloc);
}

TEST_F(dyn_array_test, zero_max_size_and_default_constructed_arrays_hold_nothing) {
  dyn_array<int> zero(0);
  EXPECT_FALSE(zero.try_push_back(1));
  EXPECT_THROW(zero.push_back(1), std::length_error);
  dyn_array<int> empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.max_size(), 0u);
  EXPECT_EQ(empty.begin(), empty.end());
  EXPECT_FALSE(empty.try_push_back(1));
  empty.shrink_to_fit();
  empty.clear();
}

TEST_F(dyn_array_test, a_failed_commit_throws_bad_alloc_and_leaves_the_array_unchanged) {
  dyn_array<element> a(1'000'000, {.commit_step = 64 * 1024});
  while (a.size() < a.capacity() || a.empty()) a.emplace_back(static_cast<int>(a.size()));
  const std::size_t size = a.size();
  const std::size_t capacity = a.capacity();
  const long live = counters::live();
  os::testing::inject_failure(os::testing::operation::commit, 3);
  EXPECT_THROW(a.push_back(element(1)), std::bad_alloc);
  EXPECT_FALSE(a.try_push_back(element(2)));
  EXPECT_EQ(a.try_emplace_back(3), nullptr);
  EXPECT_EQ(a.size(), size);
  EXPECT_EQ(a.capacity(), capacity);
  EXPECT_EQ(counters::live(), live);
  EXPECT_EQ(a.back().value(), static_cast<int>(size) - 1);
  a.push_back(element(7));  // the system recovered
  EXPECT_EQ(a.back().value(), 7);
  os::testing::inject_failure(os::testing::operation::commit, 1);
  EXPECT_THROW(a.reserve(a.capacity() + 1), std::bad_alloc);
}

TEST_F(dyn_array_test, try_push_back_does_not_move_from_its_argument_on_failure) {
  dyn_array<std::unique_ptr<int>> a(1);
  ASSERT_TRUE(a.try_push_back(std::make_unique<int>(1)));
  auto p = std::make_unique<int>(2);
  EXPECT_FALSE(a.try_push_back(std::move(p)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 2);
}

#if !MEMKIT_WINDOWS  // RLIMIT_DATA and fork-based death tests: POSIX only
using memkit::testing::limit_data_growth;

TEST_F(dyn_array_test, appends_under_a_small_rlimit_data_fail_cleanly_in_a_child) {
  EXPECT_EXIT(
      {
        // 4 GB reserved before the limit applies; 1 MiB commit steps.
        dyn_array<int> a(1'000'000'000, {.commit_step = 1 * MiB});
        // Headroom given back before the throwing append below: less than a commit step, so the
        // commit still fails, but enough for the runtime (and ASan) to allocate the exception.
        auto headroom = os::map(768 * 1024);
        if (!headroom) _exit(6);
        if (!limit_data_growth(32 * MiB)) _exit(4);
        std::size_t appended = 0;
        while (a.try_push_back(static_cast<int>(appended))) ++appended;
        if (!os::release(headroom.value(), 768 * 1024)) _exit(7);
        // Stopped by the limit, not by max_size; everything appended is intact.
        bool clean = appended > 1'000'000 && appended <= 32 * MiB / sizeof(int) && a.size() == appended;
        for (std::size_t i = 0; clean && i < appended; i += 4099) clean = a[i] == static_cast<int>(i);
        try {
          a.push_back(0);
          clean = false;
        } catch (const std::bad_alloc&) {
        }
        _exit(clean && a.size() == appended ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}
#endif

TEST_F(dyn_array_test, push_back_with_a_throwing_constructor_leaves_the_array_unchanged) {
  dyn_array<element> a(100);
  a.emplace_back(1);
  a.emplace_back(2);
  counters::throw_on(1);
  EXPECT_THROW(a.emplace_back(3), injected_exception);
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(a.back().value(), 2);
  EXPECT_EQ(counters::live(), 2);
}

TEST_F(dyn_array_test, resize_and_range_append_roll_back_on_exception) {
  {
    dyn_array<element> a(1000);
    a.resize(10);
    counters::throw_on(5);
    EXPECT_THROW(a.resize(20), injected_exception);
    EXPECT_EQ(a.size(), 10u);
    EXPECT_EQ(counters::live(), 10);
    std::vector<element> source(30);
    counters::throw_on(7);
    EXPECT_THROW(a.insert(a.end(), source.begin(), source.end()), injected_exception);
    EXPECT_EQ(a.size(), 10u);
    EXPECT_EQ(counters::live(), 40);
  }
  EXPECT_EQ(counters::live(), 0);
}

TEST_F(dyn_array_test, copy_has_the_same_max_size_and_rolls_back_on_exception) {
  {
    dyn_array<element> a(500);
    for (int i = 0; i < 100; ++i) a.emplace_back(i);
    dyn_array<element> b(a);
    EXPECT_EQ(b.max_size(), 500u);
    EXPECT_EQ(a, b);
    EXPECT_NE(a.data(), b.data());
    counters::throw_on(50);
    EXPECT_THROW(dyn_array<element>{a}, injected_exception);
    EXPECT_EQ(counters::live(), 200);
    dyn_array<element> c(10);
    c.emplace_back(5);
    counters::throw_on(50);
    EXPECT_THROW(c = a, injected_exception);  // strong: c is untouched
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].value(), 5);
    EXPECT_EQ(c.max_size(), 10u);
    c = a;
    EXPECT_EQ(c.max_size(), 500u);
    EXPECT_EQ(c, a);
  }
  EXPECT_EQ(counters::live(), 0);
}

TEST_F(dyn_array_test, move_keeps_element_addresses_and_empties_the_source) {
  dyn_array<int> a(1000, {1, 2, 3});
  int* first = &a[0];
  dyn_array<int> b(std::move(a));
  EXPECT_EQ(&b[0], first);
  EXPECT_EQ(a.size(), 0u);       // NOLINT: the moved-from state is specified
  EXPECT_EQ(a.max_size(), 0u);   // NOLINT
  EXPECT_FALSE(a.try_push_back(1));
  dyn_array<int> c(5, {9});
  c = std::move(b);
  EXPECT_EQ(&c[0], first);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.max_size(), 1000u);
  swap(a, c);
  EXPECT_EQ(&a[0], first);
}

TEST_F(dyn_array_test, no_element_is_copied_when_the_array_grows) {
  dyn_array<throwing_move_element> a(1'000'000, {.commit_step = 4096});
  for (int i = 0; i < 100'000; ++i) a.emplace_back(i);
  EXPECT_EQ(counters::copies, 0);
  EXPECT_EQ(counters::moves, 0);
  EXPECT_EQ(counters::constructions, 100'000);
}

TEST_F(dyn_array_test, insert_erase_and_resize_match_std_vector) {
  std::mt19937 random(42);
  dyn_array<int> a(100'000);
  std::vector<int> model;
  for (int step = 0; step < 5000; ++step) {
    const auto size = model.size();
    const auto at = size == 0 ? 0 : random() % (size + 1);
    switch (random() % 9) {
      case 0:
        a.insert(a.begin() + at, step);
        model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), step);
        break;
      case 1: {
        const auto n = random() % 5;
        a.insert(a.begin() + at, n, step);
        model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), n, step);
        break;
      }
      case 2: {
        std::list<int> values{step, step + 1, step + 2};  // bidirectional, not contiguous
        a.insert(a.begin() + at, values.begin(), values.end());
        model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), values.begin(), values.end());
        break;
      }
      case 3:
        if (at < size) {
          a.erase(a.begin() + at);
          model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
      case 4: {
        const auto last = at + random() % (size - at + 1);
        a.erase(a.begin() + at, a.begin() + last);
        model.erase(model.begin() + static_cast<std::ptrdiff_t>(at), model.begin() + static_cast<std::ptrdiff_t>(last));
        break;
      }
      case 5:
        a.resize(size / 2 + random() % 20, step);
        model.resize(size / 2 + random() % 1 + (a.size() - size / 2), step);
        break;
      case 6:
        if (size > 0) {
          a.pop_back();
          model.pop_back();
        }
        break;
      case 7:
        a.emplace(a.begin() + at, step);
        model.emplace(model.begin() + static_cast<std::ptrdiff_t>(at), step);
        break;
      default:
        a.push_back(step);
        model.push_back(step);
    }
    ASSERT_EQ(a.size(), model.size());
    ASSERT_TRUE(std::equal(a.begin(), a.end(), model.begin()));
  }
}

TEST_F(dyn_array_test, insert_of_an_own_element_is_safe) {
  dyn_array<std::string> a(100, {"a", "b", "c"});
  a.insert(a.begin(), a[2]);
  a.insert(a.begin() + 1, 2, a.back());
  a.push_back(a.front());
  a.emplace(a.begin(), a[1]);
  EXPECT_EQ(a, (dyn_array<std::string>(10, {"c", "c", "c", "c", "a", "b", "c", "c"})));
}

TEST_F(dyn_array_test, shrink_to_fit_decommits_and_resident_memory_drops) {
  dyn_array<char> a(1024 * MiB);
  a.resize(256 * MiB, 'x');
  auto full = os::current_resident_bytes();
  ASSERT_TRUE(full.ok());
  char* data = a.data();
  a.resize(1 * MiB);
  a.shrink_to_fit();
  EXPECT_EQ(a.data(), data);
  EXPECT_EQ(a.capacity(), 1 * MiB);
  EXPECT_EQ(a.storage().committed(), 1 * MiB);
  auto shrunk = os::current_resident_bytes();
  ASSERT_TRUE(shrunk.ok());
  EXPECT_LE(shrunk.value() + 200 * MiB, full.value());
  EXPECT_EQ(a.back(), 'x');
  a.clear();
  a.shrink_to_fit();
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(a.storage().committed(), 0u);
  a.push_back('y');  // grows again from the same address
  EXPECT_EQ(a.data(), data);
  EXPECT_EQ(a[0], 'y');
}

TEST_F(dyn_array_test, peak_committed_memory_stays_within_one_step_of_the_payload) {
  const std::size_t step = 1 * MiB;
  dyn_array<int> a(100'000'000, {.commit_step = step});
  for (int i = 0; i < 10'000'000; ++i) a.push_back(i);
  EXPECT_LE(a.storage().committed(), a.size() * sizeof(int) + step);
}

TEST_F(dyn_array_test, reserve_commits_ahead) {
  dyn_array<int> a(1'000'000, {.commit_step = 4096});
  a.reserve(100'000);
  EXPECT_GE(a.capacity(), 100'000u);
  EXPECT_LT(a.capacity(), 100'000u + os::page_size() / sizeof(int));  // the step, rounded up to a page
  EXPECT_TRUE(a.empty());
  a.reserve(10);  // never shrinks
  EXPECT_GE(a.capacity(), 100'000u);
}

TEST_F(dyn_array_test, capacity_never_exceeds_max_size) {
  dyn_array<int> a(10);
  a.push_back(1);
  EXPECT_EQ(a.capacity(), 10u);
  for (int i = 0; i < 9; ++i) a.push_back(i);
  EXPECT_FALSE(a.try_push_back(0));
}

TEST_F(dyn_array_test, span_iterators_and_comparison) {
  dyn_array<int> a(100, {3, 1, 2});
  std::span<int> s = a;
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.data(), a.data());
  std::span<const int> cs = std::as_const(a).as_span();
  EXPECT_EQ(cs[2], 2);
  std::sort(a.begin(), a.end());
  EXPECT_EQ(a, (dyn_array<int>(3, {1, 2, 3})));
  EXPECT_LT(a, (dyn_array<int>(3, {1, 2, 4})));
  EXPECT_GT(a, (dyn_array<int>(3, {1, 2})));
  EXPECT_EQ(std::vector<int>(a.rbegin(), a.rend()), (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(std::distance(a.cbegin(), a.cend()), 3);
  static_assert(std::contiguous_iterator<dyn_array<int>::iterator>);
}

TEST_F(dyn_array_test, at_checks_bounds_and_assign_replaces) {
  dyn_array<int> a(10, 3, 7);
  EXPECT_EQ(a.at(2), 7);
  EXPECT_THROW(static_cast<void>(a.at(3)), std::out_of_range);
  EXPECT_THROW(static_cast<void>(std::as_const(a).at(3)), std::out_of_range);
  a.assign(5, 1);
  EXPECT_EQ(a, (dyn_array<int>(5, {1, 1, 1, 1, 1})));
  EXPECT_THROW(a.assign(11, 1), std::length_error);
  a = {4, 5};
  EXPECT_EQ(a.size(), 2u);
  std::istringstream in("8 9 10");
  a.assign(std::istream_iterator<int>(in), std::istream_iterator<int>());  // input iterators
  EXPECT_EQ(a, (dyn_array<int>(3, {8, 9, 10})));
}

TEST_F(dyn_array_test, move_only_elements) {
  dyn_array<std::unique_ptr<int>> a(1'000'000);
  for (int i = 0; i < 100'000; ++i) a.push_back(std::make_unique<int>(i));
  a.erase(a.begin(), a.begin() + 10);
  a.insert(a.begin(), std::make_unique<int>(-1));
  EXPECT_EQ(*a[0], -1);
  EXPECT_EQ(*a[1], 10);
  EXPECT_EQ(a.size(), 99'991u);
}

TEST_F(dyn_array_test, huge_page_option_works) {
  dyn_array<int> a(100'000'000, {.huge_pages = true});
  for (int i = 0; i < 3'000'000; ++i) a.push_back(i);
  EXPECT_EQ(a[2'999'999], 2'999'999);
  if (os::huge_page_size() != 0) {
    EXPECT_EQ(a.storage().commit_step() % os::huge_page_size(), 0u);
  }
}

TEST_F(dyn_array_test, prefault_option_makes_each_step_resident) {
  const std::size_t step = 16 * MiB;
  dyn_array<char> a(1024 * MiB, {.prefault_step = step, .prefault = true});
  auto before = os::current_resident_bytes();
  a.push_back('a');
  auto after = os::current_resident_bytes();
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_GE(after.value(), before.value() + step / 2);
}

// Contracts are checked only where assertions are on (debug and test builds; see detail/config.hpp).
#if MEMKIT_ASSERTIONS
TEST_F(dyn_array_test, contract_violations_are_reported) {
  dyn_array<int> a(10, {1});
  EXPECT_DEATH(static_cast<void>(a[1]), "index out of range");
  a.pop_back();
  EXPECT_DEATH(a.pop_back(), "empty array");
  EXPECT_DEATH(static_cast<void>(a.front()), "front");
}
#endif

TEST_F(dyn_array_test, erase_and_erase_if_remove_matching_elements) {
  dyn_array<int> a(100, {1, 2, 3, 2, 5, 2});
  EXPECT_EQ(erase(a, 2), 3u);
  EXPECT_EQ(a, (dyn_array<int>(10, {1, 3, 5})));
  EXPECT_EQ(erase_if(a, [](int x) { return x > 2; }), 2u);
  EXPECT_EQ(a, (dyn_array<int>(10, {1})));
  // The qualified forms are the same functions as for memkit::vector (the shared surface).
  dyn_array<int> b(100, {4, 2, 4});
  EXPECT_EQ(memkit::erase(b, 4), 2u);
  EXPECT_EQ(memkit::erase_if(b, [](int x) { return x == 2; }), 1u);
  EXPECT_TRUE(b.empty());
  EXPECT_TRUE((dyn_array<int>(10, {1, 2})) < (dyn_array<int>(10, {1, 3})));
}

#if MEMKIT_HAS_ASAN
TEST_F(dyn_array_test, reading_past_size_is_reported_by_asan) {
  EXPECT_DEATH(
      {
        dyn_array<int> a(1000, {1, 2, 3});
        const int* last = &a.back();
        a.pop_back();
        static_cast<void>(*static_cast<const volatile int*>(last));
      },
      "use-after-poison");
}
#endif

using memkit::testing::no_address;

TEST(dyn_array, an_overloaded_address_of_operator_is_not_used) {
  memkit::dyn_array<no_address> d(100);
  auto at = d.emplace(d.end(), 3);
  d.insert(d.end(), no_address(4));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(at->text, "3");
  EXPECT_EQ(d[1].text, "4");
}

TEST(dyn_array, deduction_from_iterators) {
  const std::vector<long> source{1, 2, 3};
  memkit::dyn_array d(100, source.begin(), source.end());
  static_assert(std::is_same_v<decltype(d), memkit::dyn_array<long>>);
  EXPECT_EQ(d.size(), 3u);
  EXPECT_EQ(d.max_size(), 100u);
}

}  // namespace
