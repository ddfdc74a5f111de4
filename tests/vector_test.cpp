// Behaviour of memkit::vector<T>, and of everything small_vector<T, N> shares with it through
// vector_base<T>: typed tests over both containers and several element types (trivial, counted
// with noexcept and throwing moves, std::string, move-only unique_ptr), exception and allocation
// failure injection at every step, growth in place, and allocator semantics of move and swap.
#include "memkit/vector.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <forward_list>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "memkit/small_vector.hpp"
#include "memkit/virtual_arena.hpp"
#include "support/counted.hpp"
#include "support/no_address.hpp"
#include "support/test_allocator.hpp"

namespace {

using memkit::testing::counted;
using memkit::testing::counters;
using memkit::testing::injected_exception;
using memkit::testing::test_allocator;

// ---- element helpers: build an element from an int and read it back -----------------------------

template <class T>
struct element;
template <>
struct element<int> {
  static int make(int v) { return v; }
  static int value(int v) { return v; }
};
template <bool NothrowMove, std::size_t Padding>
struct element<counted<NothrowMove, Padding>> {
  static counted<NothrowMove, Padding> make(int v) { return counted<NothrowMove, Padding>(v); }
  static int value(const counted<NothrowMove, Padding>& c) { return c.value(); }
};
template <>
struct element<std::string> {
  // Long enough to live on the heap, so a lost or doubled string is caught by ASan.
  static std::string make(int v) { return std::string(24, 'x') + std::to_string(v); }
  static int value(const std::string& s) { return s.size() > 24 ? std::stoi(s.substr(24)) : -1; }
};
template <>
struct element<std::unique_ptr<int>> {
  static std::unique_ptr<int> make(int v) { return std::make_unique<int>(v); }
  static int value(const std::unique_ptr<int>& p) { return p ? *p : -1; }
};

template <class Container>
std::vector<int> contents(const Container& c) {
  using T = typename Container::value_type;
  std::vector<int> out;
  for (const auto& e : c) out.push_back(element<T>::value(e));
  return out;
}

std::vector<int> iota(int first, int count) {
  std::vector<int> out(static_cast<std::size_t>(count));
  std::iota(out.begin(), out.end(), first);
  return out;
}

// ---- typed tests over container × element type ---------------------------------------------------

template <class Container>
class vector_typed : public ::testing::Test {
 protected:
  using container = Container;
  using T = typename Container::value_type;
  static constexpr bool copyable = std::is_copy_constructible_v<T>;

  void SetUp() override { counters::reset(); }
  void TearDown() override { EXPECT_EQ(counters::live(), 0) << "counted elements leaked"; }

  static T make(int v) { return element<T>::make(v); }
  container filled(int count, memkit::allocator& a) {
    container c(a);
    for (int i = 0; i < count; ++i) c.push_back(make(i));
    return c;
  }

  test_allocator allocator_;
};

using container_types = ::testing::Types<
    memkit::vector<int>, memkit::vector<counted<true>>, memkit::vector<counted<false>>,
    memkit::vector<std::string>, memkit::vector<std::unique_ptr<int>>, memkit::small_vector<int, 4>,
    memkit::small_vector<counted<true>, 4>, memkit::small_vector<counted<false>, 4>,
    memkit::small_vector<std::string, 4>, memkit::small_vector<std::unique_ptr<int>, 4>>;
TYPED_TEST_SUITE(vector_typed, container_types);

TYPED_TEST(vector_typed, push_back_keeps_every_element_in_order_through_growth) {
  auto c = this->filled(1000, this->allocator_);
  EXPECT_EQ(c.size(), 1000u);
  EXPECT_GE(c.capacity(), 1000u);
  EXPECT_EQ(contents(c), iota(0, 1000));
  EXPECT_EQ(&c.get_allocator(), &this->allocator_);
}

TYPED_TEST(vector_typed, emplace_back_returns_the_new_element) {
  typename TestFixture::container c(this->allocator_);
  for (int i = 0; i < 20; ++i) {
    auto& e = c.emplace_back(TestFixture::make(i));
    EXPECT_EQ(&e, &c.back());
    EXPECT_EQ(element<typename TestFixture::T>::value(e), i);
  }
}

TYPED_TEST(vector_typed, element_access_and_iterators) {
  auto c = this->filled(10, this->allocator_);
  using T = typename TestFixture::T;
  EXPECT_EQ(element<T>::value(c.front()), 0);
  EXPECT_EQ(element<T>::value(c.back()), 9);
  EXPECT_EQ(element<T>::value(c[3]), 3);
  EXPECT_EQ(element<T>::value(c.at(4)), 4);
  EXPECT_THROW((void)c.at(10), std::out_of_range);
  EXPECT_EQ(c.data(), &c[0]);
  EXPECT_EQ(c.end() - c.begin(), 10);
  EXPECT_EQ(c.cend() - c.cbegin(), 10);
  std::vector<int> reversed;
  for (auto it = c.rbegin(); it != c.rend(); ++it) reversed.push_back(element<T>::value(*it));
  EXPECT_EQ(reversed, (std::vector<int>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  const auto& constant = c;
  EXPECT_EQ(element<T>::value(*constant.rbegin()), 9);
  EXPECT_EQ(std::distance(constant.crbegin(), constant.crend()), 10);
}

TYPED_TEST(vector_typed, insert_and_emplace_at_every_position) {
  for (int position = 0; position <= 6; ++position) {
    auto c = this->filled(6, this->allocator_);
    auto it = c.emplace(c.begin() + position, TestFixture::make(100));
    EXPECT_EQ(it - c.begin(), position);
    std::vector<int> expected = iota(0, 6);
    expected.insert(expected.begin() + position, 100);
    EXPECT_EQ(contents(c), expected);
    auto moved_in = TestFixture::make(200);
    c.insert(c.begin() + position, std::move(moved_in));
    expected.insert(expected.begin() + position, 200);
    EXPECT_EQ(contents(c), expected);
  }
}

TYPED_TEST(vector_typed, insert_counts_ranges_and_lists) {
  if constexpr (TestFixture::copyable) {
    using T = typename TestFixture::T;
    for (int position = 0; position <= 5; ++position) {
      for (int count : {0, 1, 2, 7}) {
        auto c = this->filled(5, this->allocator_);
        c.reserve(20);  // both the in-place and the growing branch run across the loop
        if (count == 7) c.shrink_to_fit();
        auto it = c.insert(c.begin() + position, static_cast<std::size_t>(count), TestFixture::make(9));
        EXPECT_EQ(it - c.begin(), position);
        std::vector<int> expected = iota(0, 5);
        expected.insert(expected.begin() + position, static_cast<std::size_t>(count), 9);
        EXPECT_EQ(contents(c), expected);

        std::vector<T> source;
        for (int i = 0; i < count; ++i) source.push_back(TestFixture::make(50 + i));
        c.insert(c.begin() + position, source.begin(), source.end());
        auto range = iota(50, count);
        expected.insert(expected.begin() + position, range.begin(), range.end());
        EXPECT_EQ(contents(c), expected);
      }
    }
    auto c = this->filled(3, this->allocator_);
    c.insert(c.begin() + 1, {TestFixture::make(7), TestFixture::make(8)});
    EXPECT_EQ(contents(c), (std::vector<int>{0, 7, 8, 1, 2}));
    // A single-pass range.
    std::istringstream input("40 41 42");
    memkit::vector<int> numbers(this->allocator_);
    numbers.push_back(1);
    numbers.insert(numbers.begin(), std::istream_iterator<int>(input), std::istream_iterator<int>());
    EXPECT_EQ(contents(numbers), (std::vector<int>{40, 41, 42, 1}));
  }
}

TYPED_TEST(vector_typed, erase_single_and_ranges) {
  auto c = this->filled(10, this->allocator_);
  auto it = c.erase(c.begin() + 2);
  EXPECT_EQ(it - c.begin(), 2);
  EXPECT_EQ(contents(c), (std::vector<int>{0, 1, 3, 4, 5, 6, 7, 8, 9}));
  it = c.erase(c.begin() + 1, c.begin() + 4);
  EXPECT_EQ(it - c.begin(), 1);
  EXPECT_EQ(contents(c), (std::vector<int>{0, 5, 6, 7, 8, 9}));
  it = c.erase(c.begin() + 2, c.begin() + 2);
  EXPECT_EQ(c.size(), 6u);
  it = c.erase(c.end() - 1);
  EXPECT_EQ(it, c.end());
  c.pop_back();
  EXPECT_EQ(contents(c), (std::vector<int>{0, 5, 6, 7}));
  c.clear();
  EXPECT_TRUE(c.empty());
  EXPECT_GE(c.capacity(), 4u);
}

TYPED_TEST(vector_typed, resize_grows_with_value_initialized_elements_and_shrinks) {
  typename TestFixture::container c(this->allocator_);
  c.resize(5);
  EXPECT_EQ(c.size(), 5u);
  if constexpr (std::is_same_v<typename TestFixture::T, int>) {
    EXPECT_EQ(contents(c), std::vector<int>(5, 0));
  }
  c.resize(2);
  EXPECT_EQ(c.size(), 2u);
  if constexpr (TestFixture::copyable) {
    c.resize(6, TestFixture::make(3));
    EXPECT_EQ(contents(c).back(), 3);
    EXPECT_EQ(c.size(), 6u);
    EXPECT_TRUE(c.try_resize(40, TestFixture::make(4)));
    EXPECT_EQ(contents(c).back(), 4);
  }
  EXPECT_TRUE(c.try_resize(50));
  EXPECT_EQ(c.size(), 50u);
  EXPECT_TRUE(c.try_resize(1));
  EXPECT_EQ(c.size(), 1u);
}

TYPED_TEST(vector_typed, assign_every_form) {
  if constexpr (TestFixture::copyable) {
    auto c = this->filled(5, this->allocator_);
    c.assign(3, TestFixture::make(7));
    EXPECT_EQ(contents(c), (std::vector<int>{7, 7, 7}));
    c.assign(40, TestFixture::make(8));
    EXPECT_EQ(contents(c), std::vector<int>(40, 8));
    std::vector<typename TestFixture::T> source{TestFixture::make(1), TestFixture::make(2)};
    c.assign(source.begin(), source.end());
    EXPECT_EQ(contents(c), (std::vector<int>{1, 2}));
    c.assign({TestFixture::make(4), TestFixture::make(5), TestFixture::make(6)});
    EXPECT_EQ(contents(c), (std::vector<int>{4, 5, 6}));
    c = {TestFixture::make(9)};
    EXPECT_EQ(contents(c), (std::vector<int>{9}));
    // assign from one of its own elements
    c.assign(10, c[0]);
    EXPECT_EQ(contents(c), std::vector<int>(10, 9));
    c.assign(3, c[2]);
    EXPECT_EQ(contents(c), std::vector<int>(3, 9));
  }
}

TYPED_TEST(vector_typed, copies_use_the_source_allocator_unless_told_otherwise) {
  if constexpr (TestFixture::copyable) {
    auto c = this->filled(9, this->allocator_);
    typename TestFixture::container copy(c);
    EXPECT_EQ(contents(copy), contents(c));
    EXPECT_EQ(&copy.get_allocator(), &this->allocator_);
    test_allocator other;
    typename TestFixture::container elsewhere(c, other);
    EXPECT_EQ(contents(elsewhere), contents(c));
    EXPECT_EQ(&elsewhere.get_allocator(), &other);
    // Copy assignment keeps the destination's allocator.
    elsewhere.push_back(TestFixture::make(77));
    elsewhere = c;
    EXPECT_EQ(contents(elsewhere), contents(c));
    EXPECT_EQ(&elsewhere.get_allocator(), &other);
    EXPECT_TRUE(elsewhere == c);
    auto& alias = elsewhere;
    elsewhere = alias;  // self-assignment
    EXPECT_EQ(contents(elsewhere), contents(c));
  }
}

TYPED_TEST(vector_typed, move_construction_takes_the_elements_and_the_allocator) {
  auto c = this->filled(9, this->allocator_);
  typename TestFixture::container moved(std::move(c));
  EXPECT_EQ(contents(moved), iota(0, 9));
  EXPECT_EQ(&moved.get_allocator(), &this->allocator_);
  EXPECT_TRUE(c.empty());  // NOLINT: moved-from is specified to be empty
  c.push_back(TestFixture::make(1));  // and usable
  EXPECT_EQ(contents(c), (std::vector<int>{1}));
}

TYPED_TEST(vector_typed, move_with_unequal_allocators_moves_elements_into_the_destination_memory) {
  test_allocator other;
  for (int count : {0, 3, 9}) {
    auto c = this->filled(count, this->allocator_);
    typename TestFixture::container destination(other);
    destination.push_back(TestFixture::make(-5));
    const long before = other.allocations();
    destination = std::move(c);
    EXPECT_EQ(contents(destination), iota(0, count));
    EXPECT_EQ(&destination.get_allocator(), &other);
    EXPECT_TRUE(c.empty());
    // Any heap buffer destination holds came from `other`.
    if (!destination.is_inline() && destination.capacity() > 0) {
      EXPECT_GE(other.live_blocks(), 1u);
    }
    (void)before;

    auto d = this->filled(count, this->allocator_);
    typename TestFixture::container constructed(std::move(d), other);
    EXPECT_EQ(contents(constructed), iota(0, count));
    EXPECT_EQ(&constructed.get_allocator(), &other);
  }
}

TYPED_TEST(vector_typed, move_with_equal_allocators_hands_over_the_heap_buffer) {
  auto c = this->filled(40, this->allocator_);
  const auto* buffer = c.data();
  typename TestFixture::container destination(this->allocator_);
  destination = std::move(c);
  EXPECT_EQ(destination.data(), buffer);
  EXPECT_EQ(contents(destination), iota(0, 40));
  typename TestFixture::container constructed(std::move(destination), this->allocator_);
  EXPECT_EQ(constructed.data(), buffer);
}

TYPED_TEST(vector_typed, swap_exchanges_contents_and_allocators) {
  test_allocator other;
  for (int left : {0, 2, 4, 30}) {
    for (int right : {0, 3, 4, 17}) {
      auto a = this->filled(left, this->allocator_);
      typename TestFixture::container b(other);
      for (int i = 0; i < right; ++i) b.push_back(TestFixture::make(100 + i));
      swap(a, b);
      EXPECT_EQ(contents(a), iota(100, right));
      EXPECT_EQ(contents(b), iota(0, left));
      EXPECT_EQ(&a.get_allocator(), &other);
      EXPECT_EQ(&b.get_allocator(), &this->allocator_);
      a.swap(b);
      EXPECT_EQ(contents(a), iota(0, left));
      EXPECT_EQ(contents(b), iota(100, right));
      // Both still grow with their own allocator afterwards.
      a.push_back(TestFixture::make(1));
      b.push_back(TestFixture::make(2));
    }
  }
}

TYPED_TEST(vector_typed, comparisons) {
  if constexpr (std::is_same_v<typename TestFixture::T, int> || std::is_same_v<typename TestFixture::T, std::string>) {
    auto a = this->filled(3, this->allocator_);
    auto b = this->filled(3, this->allocator_);
    EXPECT_TRUE(a == b);
    EXPECT_FALSE(a != b);
    b.push_back(TestFixture::make(0));
    EXPECT_TRUE(a < b);
    EXPECT_TRUE(b > a);
    EXPECT_TRUE((a <=> b) < 0);
    a[0] = TestFixture::make(5);
    EXPECT_TRUE(a > b);
    EXPECT_TRUE(a >= b);
    EXPECT_TRUE(b <= a);
  }
}

TYPED_TEST(vector_typed, std_erase_and_erase_if) {
  auto c = this->filled(10, this->allocator_);
  using T = typename TestFixture::T;
  EXPECT_EQ(erase_if(c, [](const T& e) { return element<T>::value(e) % 2 == 0; }), 5u);
  EXPECT_EQ(contents(c), (std::vector<int>{1, 3, 5, 7, 9}));
  if constexpr (std::is_same_v<T, int>) {
    EXPECT_EQ(erase(c, 5), 1u);
    EXPECT_EQ(contents(c), (std::vector<int>{1, 3, 7, 9}));
  }
}

TYPED_TEST(vector_typed, reserve_and_shrink_to_fit) {
  typename TestFixture::container c(this->allocator_);
  c.reserve(100);
  EXPECT_GE(c.capacity(), 100u);
  for (int i = 0; i < 10; ++i) c.push_back(TestFixture::make(i));
  c.shrink_to_fit();
  EXPECT_GE(c.capacity(), 10u);
  EXPECT_LT(c.capacity(), 100u);
  EXPECT_EQ(contents(c), iota(0, 10));
  c.clear();
  c.shrink_to_fit();
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(this->allocator_.live_blocks(), 0u);  // nothing held on the heap any more
  EXPECT_THROW(c.reserve(c.max_size() + 1), std::length_error);
  EXPECT_FALSE(c.try_reserve(c.max_size() + 1));
}

TYPED_TEST(vector_typed, try_operations_report_allocation_failure_and_change_nothing) {
  auto c = this->filled(4, this->allocator_);
  c.shrink_to_fit();
  const auto before = contents(c);
  const auto capacity = c.capacity();
  const auto* data = c.data();
  this->allocator_.fail_all(true);
  this->allocator_.allow_resize(false);
  EXPECT_FALSE(c.try_reserve(capacity + 100));
  auto value = TestFixture::make(42);
  EXPECT_FALSE(c.try_push_back(std::move(value)));
  EXPECT_EQ(element<typename TestFixture::T>::value(value), 42);  // not consumed
  EXPECT_EQ(c.try_emplace_back(TestFixture::make(43)), nullptr);
  EXPECT_FALSE(c.try_resize(capacity + 100));
  EXPECT_EQ(contents(c), before);
  EXPECT_EQ(c.capacity(), capacity);
  EXPECT_EQ(c.data(), data);
  EXPECT_THROW(c.push_back(TestFixture::make(1)), std::bad_alloc);
  EXPECT_THROW(c.reserve(capacity + 1), std::bad_alloc);
  EXPECT_EQ(contents(c), before);
  this->allocator_.fail_all(false);
  EXPECT_TRUE(c.try_push_back(TestFixture::make(42)));
  EXPECT_NE(c.try_emplace_back(TestFixture::make(43)), nullptr);
  EXPECT_EQ(contents(c).back(), 43);
}

TYPED_TEST(vector_typed, every_failed_allocation_during_a_workload_leaves_a_valid_vector) {
  // Fail the n-th allocation for every n the workload performs, with and without in-place growth.
  for (bool resize : {true, false}) {
    for (long n = 1; n < 40; ++n) {
      test_allocator a;
      a.allow_resize(resize);
      typename TestFixture::container c(a);
      a.fail_on(n);
      std::vector<int> expected;
      bool failed = false;
      try {
        for (int i = 0; i < 50; ++i) {
          c.push_back(TestFixture::make(i));
          expected.push_back(i);
        }
        c.insert(c.begin() + 10, TestFixture::make(-1));
        expected.insert(expected.begin() + 10, -1);
        c.resize(200);
        expected.resize(200, element<typename TestFixture::T>::value(typename TestFixture::T{}));
      } catch (const std::bad_alloc&) {
        failed = true;
      }
      // Strong guarantee: whatever operation failed left exactly the previous contents.
      EXPECT_EQ(contents(c), expected) << "n=" << n << " failed=" << failed;
    }
  }
}

// ---- exception safety with counted elements throwing at the N-th construction -------------------

template <class Container>
void check_strong_on_every_throw(const char* what, auto&& operation) {
  using T = typename Container::value_type;
  bool completed = false;
  for (long n = 1; !completed && n < 200; ++n) {
    counters::reset();
    {
      test_allocator a;
      Container c(a);
      // Full to capacity, so the next insertion must grow.
      for (int i = 0; i < 6 || c.size() < c.capacity(); ++i) c.push_back(element<T>::make(i));
      const auto before = contents(c);
      counters::throw_on(n);
      try {
        operation(c);
        completed = true;
      } catch (const injected_exception&) {
        EXPECT_EQ(contents(c), before) << what << ": n=" << n;
      }
      counters::throw_on(0);
    }
    EXPECT_EQ(counters::live(), 0) << what << ": n=" << n;
  }
  EXPECT_TRUE(completed) << what;
}

template <class Container>
void check_basic_on_every_throw(const char* what, auto&& operation) {
  using T = typename Container::value_type;
  bool completed = false;
  for (long n = 1; !completed && n < 200; ++n) {
    counters::reset();
    {
      test_allocator a;
      Container c(a);
      for (int i = 0; i < 6; ++i) c.push_back(element<T>::make(i));
      counters::throw_on(n);
      try {
        operation(c);
        completed = true;
      } catch (const injected_exception&) {
        EXPECT_LE(c.size(), c.capacity()) << what;
        for (const auto& e : c) EXPECT_GE(element<T>::value(e), -1) << what;  // no destroyed elements
      }
      counters::throw_on(0);
    }
    EXPECT_EQ(counters::live(), 0) << what << ": n=" << n;
  }
  EXPECT_TRUE(completed) << what;
}

template <class Container>
void exception_safety_suite() {
  using T = typename Container::value_type;
  check_strong_on_every_throw<Container>("push_back growth", [](Container& c) {
    c.shrink_to_fit();
    c.push_back(T(100));
  });
  check_strong_on_every_throw<Container>("emplace_back growth", [](Container& c) {
    c.shrink_to_fit();
    c.emplace_back(100);
  });
  check_strong_on_every_throw<Container>("push_back of an own element", [](Container& c) {
    c.shrink_to_fit();
    c.push_back(c[0]);
  });
  check_strong_on_every_throw<Container>("reserve", [](Container& c) { c.reserve(64); });
  check_strong_on_every_throw<Container>("resize up", [](Container& c) {
    c.shrink_to_fit();
    c.resize(30);
  });
  check_strong_on_every_throw<Container>("resize up with value", [](Container& c) { c.resize(30, T(7)); });
  check_strong_on_every_throw<Container>("insert growing", [](Container& c) {
    c.shrink_to_fit();
    c.insert(c.begin() + 2, 5, T(9));
  });
  check_strong_on_every_throw<Container>("emplace growing", [](Container& c) {
    c.shrink_to_fit();
    c.emplace(c.begin() + 1, 9);
  });
  check_strong_on_every_throw<Container>("assign growing", [](Container& c) {
    std::vector<T> source(20, T(3));
    c.assign(source.begin(), source.end());
  });
  check_strong_on_every_throw<Container>("copy", [](Container& c) {
    Container copy(c);
    EXPECT_EQ(contents(copy), contents(c));
  });
  check_strong_on_every_throw<Container>("shrink_to_fit", [](Container& c) {
    c.reserve(40);
    c.shrink_to_fit();
  });
  check_basic_on_every_throw<Container>("insert in place", [](Container& c) {
    c.reserve(40);
    c.insert(c.begin() + 2, 5, T(9));
  });
  check_basic_on_every_throw<Container>("assign in place", [](Container& c) {
    std::vector<T> source(4, T(3));
    c.assign(source.begin(), source.end());
  });
  check_basic_on_every_throw<Container>("erase", [](Container& c) { c.erase(c.begin()); });
  check_basic_on_every_throw<Container>("swap", [](Container& c) {
    test_allocator other;
    Container d(other);
    d.push_back(T(50));
    c.swap(d);
    c.swap(d);
  });
}

TEST(vector_exceptions, counted_with_throwing_moves_in_vector) {
  exception_safety_suite<memkit::vector<counted<false>>>();
}
TEST(vector_exceptions, counted_with_nothrow_moves_in_vector) {
  exception_safety_suite<memkit::vector<counted<true>>>();
}
TEST(vector_exceptions, counted_with_throwing_moves_in_small_vector) {
  exception_safety_suite<memkit::small_vector<counted<false>, 4>>();
  exception_safety_suite<memkit::small_vector<counted<false>, 16>>();
}
TEST(vector_exceptions, counted_with_nothrow_moves_in_small_vector) {
  exception_safety_suite<memkit::small_vector<counted<true>, 4>>();
}

// ---- growth strategy ------------------------------------------------------------------------------

TEST(vector_growth, grows_in_place_when_the_allocator_can) {
  auto arena = memkit::virtual_arena(std::size_t{1} << 30);
  memkit::vector<int> v(arena);
  v.push_back(0);
  const int* first = v.data();
  for (int i = 1; i < 1'000'000; ++i) v.push_back(i);
  EXPECT_EQ(v.data(), first);  // the last allocation of an arena grows where it is
  EXPECT_EQ(v[999'999], 999'999);
}

TEST(vector_growth, uses_reallocate_for_trivially_relocatable_types_only) {
  static_assert(memkit::is_trivially_relocatable_v<std::unique_ptr<int>>);
  static_assert(memkit::is_trivially_relocatable_v<memkit::vector<std::string>>);
  static_assert(!memkit::is_trivially_relocatable_v<memkit::small_vector<int, 4>>);
  static_assert(!memkit::is_trivially_relocatable_v<counted<true>>);
  {
    test_allocator a;
    a.allow_resize(false);
    memkit::vector<std::unique_ptr<int>> v(a);
    for (int i = 0; i < 100; ++i) v.push_back(std::make_unique<int>(i));
    EXPECT_GT(a.reallocations(), 0);
    EXPECT_EQ(contents(v), iota(0, 100));
  }
  counters::reset();
  {
    test_allocator a;
    a.allow_resize(false);
    memkit::vector<counted<true>> v(a);
    for (int i = 0; i < 100; ++i) v.push_back(i);
    EXPECT_EQ(a.reallocations(), 0);
    EXPECT_GT(counters::moves, 0);
  }
  EXPECT_EQ(counters::live(), 0);
}

TEST(vector_growth, uses_the_size_the_allocator_reports) {
  test_allocator a;
  a.report_extra(64);
  memkit::vector<int> v(a);
  v.reserve(10);
  EXPECT_EQ(v.capacity(), 10u + 64 / sizeof(int));
  for (int i = 0; i < 200; ++i) v.push_back(i);  // deallocation sizes are checked by test_allocator
  EXPECT_EQ(contents(v), iota(0, 200));
}

TEST(vector_growth, counts_reserved_by_a_resize_in_place) {
  test_allocator a;
  memkit::vector<char> v(a);
  for (int i = 0; i < 5000; ++i) v.push_back(static_cast<char>(i));
  EXPECT_EQ(v.size(), 5000u);
  static_assert(memkit::vector<char>::max_size() > std::size_t{1} << 32, "byte vectors have 64-bit counts");
  static_assert(memkit::vector<int>::max_size() == 0xFFFF'FFFFu, "int vectors have 32-bit counts");
}

TEST(vector_growth, push_back_of_an_own_element_survives_every_growth_path) {
  for (bool resize : {true, false}) {
    test_allocator a;
    a.allow_resize(resize);
    memkit::vector<std::string> strings(a);
    strings.push_back(element<std::string>::make(7));
    for (int i = 0; i < 100; ++i) strings.push_back(strings[0]);
    for (const auto& s : strings) EXPECT_EQ(element<std::string>::value(s), 7);
    memkit::vector<std::unique_ptr<int>> pointers(a);
    memkit::vector<int> ints(a);
    ints.push_back(3);
    for (int i = 0; i < 100; ++i) ints.push_back(ints.back());
    for (int i = 0; i < 100; ++i) ints.insert(ints.begin(), ints.back());
    ints.resize(1000, ints[0]);
    for (int x : ints) EXPECT_EQ(x, 3);
  }
}

// push_back of a trivially copyable value takes the growth path that hands the grown buffer and
// counts back to the caller, which stores through them: after every growth (first allocation,
// in place, by reallocate, spill out of inline storage, with and without the allocator's extra
// room) the container's data, size and capacity must be those of the grown buffer.
template <class Container>
void check_push_back_through_every_growth(test_allocator& a) {
  using T = typename Container::value_type;
  Container c(a);
  for (int i = 0; i < 300; ++i) {
    const std::size_t capacity_before = c.capacity();
    T value{};
    value[0] = i;
    T& added = c.emplace_back(value);
    ASSERT_EQ(c.size(), static_cast<std::size_t>(i) + 1);
    ASSERT_EQ(&added, c.data() + i);
    ASSERT_GE(c.capacity(), c.size());
    if (capacity_before > static_cast<std::size_t>(i)) {
      ASSERT_EQ(c.capacity(), capacity_before);
    }
  }
  for (int i = 0; i < 300; ++i) ASSERT_EQ(c[static_cast<std::size_t>(i)][0], i) << "i=" << i;
  c.push_back(c[7]);  // an own element, copied before the buffer can move
  EXPECT_EQ(c.back()[0], 7);
}

TEST(vector_growth, push_back_of_small_values_keeps_data_size_and_capacity_through_every_growth) {
  using narrow = std::array<int, 2>;             // fits a register
  using wide = std::array<std::int64_t, 4>;      // does not
  for (bool resize : {true, false}) {
    for (std::size_t extra : {std::size_t{0}, std::size_t{12}}) {
      test_allocator a;
      a.allow_resize(resize);
      a.report_extra(extra);
      check_push_back_through_every_growth<memkit::vector<narrow>>(a);
      check_push_back_through_every_growth<memkit::vector<wide>>(a);
      check_push_back_through_every_growth<memkit::small_vector<narrow, 3>>(a);
      check_push_back_through_every_growth<memkit::small_vector<wide, 3>>(a);
      EXPECT_EQ(a.live_blocks(), 0u);
    }
  }
}

TEST(vector_growth, emplace_back_value_initializes_and_builds_from_arguments) {
  memkit::vector<int> ints;
  ints.emplace_back();
  EXPECT_EQ(ints[0], 0);
  struct point {
    long x, y, z;
    point() = default;
    point(long a, long b, long c) : x(a), y(b), z(c) {}
  };
  memkit::small_vector<point, 2> points;
  for (long i = 0; i < 10; ++i) points.emplace_back(i, i + 1, i + 2);
  EXPECT_EQ(points[9].z, 11);
  memkit::vector<std::array<int, 3>> arrays;
  arrays.emplace_back();
  arrays.push_back({1, 2, 3});
  arrays.push_back(arrays[1]);  // an own element, through the copy-first path
  EXPECT_EQ(arrays[2][2], 3);
  EXPECT_EQ(arrays[0][0], 0);
}

// ---- unchecked operations and contracts ----------------------------------------------------------

TEST(vector_unchecked, unchecked_push_back_fills_reserved_capacity) {
  memkit::vector<int> v;
  v.reserve(100);
  const auto capacity = v.capacity();
  for (int i = 0; i < 99; ++i) v.unchecked_push_back(i);
  v.unchecked_emplace_back(5);
  EXPECT_EQ(v.capacity(), capacity);
  EXPECT_EQ(v.size(), 100u);
  EXPECT_EQ(v.back(), 5);
}

#if MEMKIT_ASSERTIONS
TEST(vector_death, contract_violations_abort_with_a_message) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  memkit::vector<int> v;
  EXPECT_DEATH((void)v[0], "index out of range");
  EXPECT_DEATH(v.pop_back(), "pop_back");
  EXPECT_DEATH(v.unchecked_push_back(1), "unchecked_emplace_back without reserved capacity");
  EXPECT_DEATH((void)v.front(), "front");
  v.push_back(1);
  EXPECT_DEATH(v.erase(v.begin() + 1), "erase position");
}
#endif

// ---- default allocator and construction forms -----------------------------------------------------

TEST(vector_construction, every_constructor_has_an_allocator_extended_form) {
  test_allocator a;
  std::vector<int> source{1, 2, 3};
  memkit::vector<int> by_default;
  EXPECT_EQ(&by_default.get_allocator(), &memkit::default_allocator());
  memkit::vector<int> empty(a);
  memkit::vector<int> counted_elements(4, a);
  memkit::vector<int> filled(3, 9, a);
  memkit::vector<int> ranged(source.begin(), source.end(), a);
  memkit::vector<int> listed({1, 2}, a);
  memkit::vector<int> copied(ranged, a);
  memkit::vector<int> moved(memkit::vector<int>{5, 6}, a);
  memkit::small_vector<int, 2> small{7, 8, 9};
  memkit::vector<int> from_small(small, a);
  memkit::vector<int> from_small_moved(std::move(small), a);
  for (memkit::vector_base<int>* v : std::initializer_list<memkit::vector_base<int>*>{
           &empty, &counted_elements, &filled, &ranged, &listed, &copied, &moved, &from_small, &from_small_moved})
    EXPECT_EQ(&v->get_allocator(), &a);
  EXPECT_EQ(contents(counted_elements), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(contents(filled), (std::vector<int>{9, 9, 9}));
  EXPECT_EQ(contents(ranged), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(contents(listed), (std::vector<int>{1, 2}));
  EXPECT_EQ(contents(copied), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(contents(moved), (std::vector<int>{5, 6}));
  EXPECT_EQ(contents(from_small), (std::vector<int>{7, 8, 9}));
  EXPECT_EQ(contents(from_small_moved), (std::vector<int>{7, 8, 9}));
  std::forward_list<int> forward{4, 5};
  memkit::vector deduced(forward.begin(), forward.end());
  static_assert(std::is_same_v<decltype(deduced), memkit::vector<int>>);
  EXPECT_EQ(contents(deduced), (std::vector<int>{4, 5}));
}

TEST(vector_construction, replacing_the_default_allocator_affects_new_vectors_only) {
  test_allocator a;
  memkit::vector<int> before{1, 2, 3};
  memkit::allocator& previous = memkit::set_default_allocator(a);
  {
    memkit::vector<int> after{1, 2, 3};
    EXPECT_EQ(&after.get_allocator(), &a);
    EXPECT_EQ(a.live_blocks(), 1u);
    before.push_back(4);
  }
  memkit::set_default_allocator(previous);
  EXPECT_EQ(&before.get_allocator(), &previous);
}

TEST(vector_construction, swap_of_vectors_never_allocates) {
  static_assert(noexcept(std::declval<memkit::vector<counted<false>>&>().swap(
      std::declval<memkit::vector<counted<false>>&>())));
  test_allocator a, b;
  memkit::vector<int> x({1, 2, 3}, a);
  memkit::vector<int> y({4}, b);
  const long allocations = a.allocations() + b.allocations();
  swap(x, y);
  EXPECT_EQ(a.allocations() + b.allocations(), allocations);
  EXPECT_EQ(&x.get_allocator(), &b);
  EXPECT_EQ(contents(x), (std::vector<int>{4}));
}

}  // namespace

// assign(count, value) within capacity constructs the new tail, then copy-assigns the elements
// already there; a copy assignment that threw used to leave the tail constructed but outside
// size(), so its elements were never destroyed (found by fuzz/vector_fuzz.cpp).
TEST(vector_assign, a_throwing_copy_assignment_within_capacity_leaks_no_element) {
  for (long n = 1; n <= 8; ++n) {
    counters::reset();
    {
      memkit::vector<counted<true>> v;
      v.reserve(16);
      v.push_back(counted<true>(1));
      v.push_back(counted<true>(2));
      const counted<true> value(7);
      counters::throw_on(n);
      try {
        v.assign(6, value);
        for (const auto& e : v) EXPECT_EQ(e.value(), 7);
      } catch (const injected_exception&) {
      }
      counters::throw_on(-1);
      EXPECT_EQ(counters::live(), static_cast<long>(v.size()) + 1) << "throw on construction/copy " << n;
    }
    EXPECT_EQ(counters::live(), 0) << "throw on construction/copy " << n;
  }
}

namespace {

// The std::vector surface is shared code (detail/contiguous_surface.hpp): the qualified forms
// memkit::erase / memkit::erase_if work for every memkit container, and comparisons work across
// small_vector of different N and vector through vector_base.
TEST(vector_surface, qualified_erase_and_erase_if_work_for_vector_and_small_vector) {
  memkit::vector<int> v{1, 2, 3, 2, 5};
  memkit::small_vector<int, 2> s{4, 2, 6, 2};
  EXPECT_EQ(memkit::erase(v, 2), 2u);
  EXPECT_EQ(memkit::erase_if(s, [](int x) { return x % 4 == 2; }), 3u);
  EXPECT_EQ(v, (memkit::vector<int>{1, 3, 5}));
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0], 4);
  EXPECT_EQ(memkit::erase(v, 42), 0u);
  EXPECT_EQ(v.size(), 3u);
}

TEST(vector_surface, comparisons_across_n_and_vector_through_vector_base) {
  memkit::small_vector<int, 2> a{1, 2, 3};  // on the heap
  memkit::small_vector<int, 8> b{1, 2, 3};  // inline
  memkit::vector<int> c{1, 2, 4};
  const memkit::vector_base<int>& va = a;
  const memkit::vector_base<int>& vb = b;
  const memkit::vector_base<int>& vc = c;
  EXPECT_TRUE(va == vb);
  EXPECT_FALSE(vb == vc);
  EXPECT_TRUE(vb < vc);
  EXPECT_EQ(va <=> vc, std::strong_ordering::less);
  EXPECT_TRUE(vc > va);
}

TEST(vector_surface, at_and_accessors_come_from_the_shared_surface) {
  memkit::small_vector<int, 4> s{7, 8, 9};
  EXPECT_EQ(s.at(2), 9);
  EXPECT_THROW((void)s.at(3), std::out_of_range);
  EXPECT_EQ(s.front(), 7);
  EXPECT_EQ(s.back(), 9);
  EXPECT_EQ(*s.rbegin(), 9);
  EXPECT_EQ(s.end() - s.begin(), 3);
  EXPECT_FALSE(s.empty());
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.begin(), s.end());
}

// Layout the packed counts and small_vector's inline storage rely on (also static_asserts in the
// headers; here so a platform where they do not hold shows up as a failing test, not only as a
// build error in a user's code).
TEST(vector_surface, layout_is_three_words_and_inline_storage_follows) {
  if constexpr (sizeof(void*) == 8) {
    EXPECT_EQ(sizeof(memkit::vector<int>), 24u);
    EXPECT_EQ(sizeof(memkit::small_vector<int, 16>), 24u + 16u * sizeof(int));
    EXPECT_EQ(sizeof(memkit::vector<char>), 32u);  // 64-bit counts for byte elements
  }
  memkit::small_vector<int, 4> s{1, 2};
  EXPECT_TRUE(s.is_inline());
  EXPECT_EQ(static_cast<const void*>(s.data()),
            static_cast<const void*>(reinterpret_cast<const char*>(&s) + 3 * sizeof(void*)));
}

// ---- element types std::vector accepts ------------------------------------------------------------

// An element with a const member: copy-constructible, not assignable. std::vector's constructors
// only construct, so they take it; so must memkit's.
struct record {
  const int id;
  std::string name;
};

template <class Container>
void constructors_only_construct() {
  const std::vector<record> source{{1, "a"}, {2, "b"}, {3, "c"}};
  Container from_list{{1, "a"}, {2, "b"}, {3, "c"}};
  Container from_range(source.begin(), source.end());
  Container copies(5, record{7, "x"});
  Container copy(from_list);
  ASSERT_EQ(from_list.size(), 3u);
  EXPECT_EQ(from_list[2].id, 3);
  EXPECT_EQ(from_range[1].name, "b");
  EXPECT_EQ(copies.size(), 5u);
  EXPECT_EQ(copies[4].id, 7);
  EXPECT_EQ(copy[0].name, "a");
  from_list.push_back(record{4, "d"});
  EXPECT_EQ(from_list.back().id, 4);
}

TEST(vector_elements, constructors_need_no_assignment) {
  constructors_only_construct<memkit::vector<record>>();
  constructors_only_construct<memkit::small_vector<record, 2>>();
  constructors_only_construct<memkit::small_vector<record, 8>>();
  memkit::vector<std::pair<const std::string, int>> map_like{{"one", 1}, {"two", 2}};
  auto copied = map_like;
  EXPECT_EQ(copied[1].first, "two");
}

// A constructor from input iterators that throws part-way leaves nothing behind: no element
// alive, no block held (std::istream_iterator-like input, one pass, growing as it goes).
TEST(vector_elements, a_throwing_input_iterator_constructor_leaks_nothing) {
  using T = counted<true, 0>;
  std::vector<int> values(40);
  std::iota(values.begin(), values.end(), 0);
  std::stringstream text;
  for (int v : values) text << v << ' ';
  for (long n = 1; n < 45; ++n) {
    counters::reset();
    test_allocator a;
    std::stringstream in(text.str());
    auto first = std::istream_iterator<int>(in), last = std::istream_iterator<int>();
    struct as_counted {
      std::istream_iterator<int> it;
      using iterator_category = std::input_iterator_tag;
      using value_type = T;
      using difference_type = std::ptrdiff_t;
      T operator*() const { return T(*it); }
      as_counted& operator++() {
        ++it;
        return *this;
      }
      void operator++(int) { ++it; }
      bool operator==(const as_counted& other) const { return it == other.it; }
    };
    counters::throw_on(n);
    try {
      memkit::vector<T> v(as_counted{first}, as_counted{last}, a);
      memkit::small_vector<T, 4> s(as_counted{first}, as_counted{last}, a);
    } catch (const injected_exception&) {
    }
    counters::throw_on(0);
    EXPECT_EQ(counters::live(), 0) << "n=" << n;
    EXPECT_EQ(a.live_blocks(), 0u) << "n=" << n;
  }
}

// A move-only element that is trivially copyable as far as the language goes (its copy is
// deleted, its move is the default): appended by moving, as std::vector does.
struct token {
  int id;
  explicit token(int i) : id(i) {}
  token(token&&) = default;
  token& operator=(token&&) = default;
  token(const token&) = delete;
  token& operator=(const token&) = delete;
};

TEST(vector_elements, move_only_trivially_copyable_elements_are_appended_by_moving) {
  memkit::vector<token> v;
  memkit::small_vector<token, 2> s;
  for (int i = 0; i < 100; ++i) {
    v.push_back(token(i));
    s.emplace_back(i);
  }
  v.insert(v.begin(), token(-1));
  EXPECT_EQ(v.front().id, -1);
  EXPECT_EQ(v.back().id, 99);
  EXPECT_EQ(s[50].id, 50);
  EXPECT_TRUE(v.try_emplace_back(100));
}

using memkit::testing::no_address;

TEST(vector_elements, an_overloaded_address_of_operator_is_not_used) {
  memkit::vector<no_address> v(3);
  v.resize(10, no_address(1));
  EXPECT_TRUE(v.try_resize(12, no_address(2)));
  EXPECT_EQ(v[9].text, "1");
  EXPECT_EQ(v[11].text, "2");
  memkit::small_vector<no_address, 2> s;
  s.resize(5, no_address(3));
  EXPECT_EQ(s[4].text, "3");
}

// Types whose moves are deleted cannot be moved with memcpy either: GCC and Clang call them
// trivially copyable, and growth relied on that.
TEST(vector_elements, types_that_cannot_move_are_not_relocatable) {
  struct pinned {
    pinned* self = this;
    pinned() = default;
    pinned(const pinned&) = delete;
    pinned& operator=(const pinned&) = delete;
  };
  static_assert(!memkit::is_trivially_relocatable_v<pinned>);
  static_assert(!memkit::is_trivially_relocatable_v<std::atomic<int>>);
  static_assert(!memkit::is_trivially_relocatable_v<std::mutex>);
  static_assert(memkit::is_trivially_relocatable_v<int>);
  static_assert(memkit::is_trivially_relocatable_v<std::pair<int, double>>);
  static_assert(memkit::is_trivially_relocatable_v<std::unique_ptr<int>>);
  memkit::vector<pinned> v(4);  // constructing in place is fine; growing would not compile
  EXPECT_EQ(v[3].self, &v[3]);
}

TEST(vector_elements, deduction_from_iterators) {
  const std::vector<double> source{1.5, 2.5};
  memkit::vector v(source.begin(), source.end());
  memkit::small_vector s(source.begin(), source.end());
  static_assert(std::is_same_v<decltype(v), memkit::vector<double>>);
  static_assert(std::is_same_v<decltype(s), memkit::small_vector<double>>);
  EXPECT_EQ(s[1], 2.5);
}

// The default inline capacity fills a 64-byte object, whatever the element's size.
TEST(vector_elements, the_default_small_vector_is_64_bytes) {
  if constexpr (sizeof(void*) == 8) {
    EXPECT_EQ(sizeof(memkit::small_vector<char>), 64u);
    EXPECT_EQ(sizeof(memkit::small_vector<short>), 64u);
    EXPECT_EQ(sizeof(memkit::small_vector<int>), 64u);
    EXPECT_EQ(sizeof(memkit::small_vector<double>), 64u);
  }
  EXPECT_EQ(memkit::small_vector<char>().capacity(), sizeof(void*) == 8 ? 32u : 64u - sizeof(memkit::vector<char>));
}

}  // namespace
