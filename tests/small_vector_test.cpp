// Behaviour specific to memkit::small_vector<T, N>: its size, inline storage and spilling, the
// vector_base<T> view shared with vector<T>, moves and swaps between inline and heap storage and
// across different N, and shrinking back inline. The interface it shares with vector<T> is tested
// in vector_test.cpp (typed over both).
#include "memkit/small_vector.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "memkit/vector.hpp"
#include "support/counted.hpp"
#include "support/test_allocator.hpp"

namespace {

using memkit::testing::counted;
using memkit::testing::counters;
using memkit::testing::injected_exception;
using memkit::testing::test_allocator;

template <std::size_t N>
constexpr std::size_t overhead = sizeof(memkit::small_vector<int, N>) - N * sizeof(int);

// The budget: no more than Boost's 24 bytes, allocator pointer included.
static_assert(sizeof(void*) != 8 || overhead<2> <= 24);
static_assert(sizeof(void*) != 8 || overhead<4> <= 24);
static_assert(sizeof(void*) != 8 || overhead<8> <= 24);
static_assert(sizeof(void*) != 8 || overhead<12> <= 24);
static_assert(sizeof(void*) != 8 || overhead<16> <= 24);
static_assert(sizeof(void*) != 8 || overhead<32> <= 24);
static_assert(sizeof(memkit::vector<int>) == 3 * sizeof(void*));
static_assert(memkit::small_vector<int, 8>::inline_capacity == 8);
static_assert(sizeof(memkit::small_vector<int>) <= 64, "the default N fills a 64-byte object");

std::vector<int> contents(const memkit::vector_base<int>& v) { return {v.begin(), v.end()}; }
std::vector<int> iota(int first, int count) {
  std::vector<int> out(static_cast<std::size_t>(count));
  std::iota(out.begin(), out.end(), first);
  return out;
}

TEST(small_vector, holds_n_elements_without_touching_the_allocator) {
  test_allocator a;
  memkit::small_vector<int, 8> v(a);
  EXPECT_TRUE(v.is_inline());
  EXPECT_EQ(v.capacity(), 8u);
  for (int i = 0; i < 8; ++i) v.push_back(i);
  EXPECT_EQ(a.allocations(), 0);
  EXPECT_TRUE(v.is_inline());
  // The inline buffer is inside the object.
  const auto* object = reinterpret_cast<const char*>(&v);
  const auto* elements = reinterpret_cast<const char*>(v.data());
  EXPECT_GE(elements, object);
  EXPECT_LT(elements, object + sizeof v);
  v.push_back(8);
  EXPECT_FALSE(v.is_inline());
  EXPECT_EQ(a.allocations(), 1);
  EXPECT_GE(v.capacity(), 16u);
  EXPECT_EQ(contents(v), iota(0, 9));
}

TEST(small_vector, the_allocator_is_used_only_beyond_n) {
  test_allocator a;
  {
    memkit::small_vector<std::string, 2> v(a);
    v.emplace_back(30, 'a');
    v.emplace_back(30, 'b');
    EXPECT_EQ(a.allocations(), 0);
    v.emplace_back(30, 'c');
    EXPECT_EQ(a.live_blocks(), 1u);
    EXPECT_EQ(v[2], std::string(30, 'c'));
  }
  EXPECT_EQ(a.live_blocks(), 0u);
}

// One function serves vector<T> and small_vector<T, N> for every N: it is not a template.
void append_squares(memkit::vector_base<int>& out, int count) {
  for (int i = 0; i < count; ++i) out.push_back(i * i);
}
int sum(const memkit::vector_base<int>& in) { return std::accumulate(in.begin(), in.end(), 0); }

TEST(small_vector, functions_take_any_n_and_vector_through_vector_base) {
  memkit::small_vector<int, 2> two;
  memkit::small_vector<int, 16> sixteen;
  memkit::vector<int> heap;
  append_squares(two, 5);
  append_squares(sixteen, 5);
  append_squares(heap, 5);
  EXPECT_EQ(sum(two), 30);
  EXPECT_EQ(sum(sixteen), 30);
  EXPECT_EQ(sum(heap), 30);
  EXPECT_TRUE(two == sixteen);
  EXPECT_TRUE(sixteen == heap);
  EXPECT_FALSE(two.is_inline());
  EXPECT_TRUE(sixteen.is_inline());
  // Assignment through the view.
  memkit::vector_base<int>& view = two;
  view = heap;
  EXPECT_EQ(contents(two), contents(heap));
}

TEST(small_vector, move_of_inline_elements_moves_them_and_never_allocates) {
  counters::reset();
  {
    test_allocator a;
    memkit::small_vector<counted<true>, 4> v(a);
    for (int i = 0; i < 3; ++i) v.emplace_back(i);
    memkit::small_vector<counted<true>, 4> moved(std::move(v));
    EXPECT_TRUE(moved.is_inline());
    EXPECT_EQ(moved.size(), 3u);
    EXPECT_EQ(moved[2].value(), 2);
    EXPECT_TRUE(v.empty());
    EXPECT_TRUE(v.is_inline());
    EXPECT_EQ(&moved.get_allocator(), &a);
    EXPECT_EQ(a.allocations(), 0);
  }
  EXPECT_EQ(counters::live(), 0);
}

TEST(small_vector, move_of_heap_elements_hands_over_the_buffer_and_the_source_returns_inline) {
  test_allocator a;
  memkit::small_vector<int, 4> v(a);
  append_squares(v, 10);
  const int* buffer = v.data();
  memkit::small_vector<int, 4> moved(std::move(v));
  EXPECT_EQ(moved.data(), buffer);
  EXPECT_TRUE(v.is_inline());
  EXPECT_EQ(v.capacity(), 4u);  // N was remembered while the elements were on the heap
  v.push_back(1);
  EXPECT_EQ(a.live_blocks(), 1u);
}

TEST(small_vector, moves_between_different_n_and_vector) {
  test_allocator a;
  memkit::small_vector<int, 2> small(a);
  append_squares(small, 2);
  memkit::small_vector<int, 8> larger(std::move(small));  // fits inline
  EXPECT_TRUE(larger.is_inline());
  EXPECT_EQ(contents(larger), (std::vector<int>{0, 1}));
  append_squares(larger, 6);  // 8 elements, still inline
  memkit::small_vector<int, 2> smaller(std::move(larger));  // does not fit: a heap buffer from a
  EXPECT_FALSE(smaller.is_inline());
  EXPECT_EQ(smaller.size(), 8u);
  EXPECT_EQ(&smaller.get_allocator(), &a);
  memkit::vector<int> heap(std::move(smaller));
  EXPECT_EQ(heap.size(), 8u);
  EXPECT_TRUE(smaller.is_inline());
  EXPECT_EQ(smaller.capacity(), 2u);
  memkit::small_vector<int, 4> back(std::move(heap));
  EXPECT_FALSE(back.is_inline());  // a heap buffer changes hands even when it would fit inline
  EXPECT_EQ(back.size(), 8u);
  back.resize(3);
  back.shrink_to_fit();
  EXPECT_TRUE(back.is_inline());
  EXPECT_EQ(back.capacity(), 4u);
  EXPECT_EQ(contents(back), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(a.live_blocks(), 0u);
}

TEST(small_vector, move_assignment_through_the_view_restores_the_source_inline_capacity) {
  test_allocator a;
  memkit::small_vector<int, 3> source(a);
  append_squares(source, 20);
  memkit::vector<int> destination(a);
  memkit::vector_base<int>& view = destination;
  view = std::move(source);
  EXPECT_EQ(destination.size(), 20u);
  EXPECT_TRUE(source.is_inline());
  EXPECT_EQ(source.capacity(), 3u);
  append_squares(source, 3);
  EXPECT_TRUE(source.is_inline());
}

TEST(small_vector, swap_covers_every_inline_and_heap_combination) {
  test_allocator a, b;
  for (int left : {0, 1, 4, 5, 20}) {
    for (int right : {0, 3, 4, 9}) {
      memkit::small_vector<int, 4> x(a);
      memkit::small_vector<int, 4> y(b);
      for (int i = 0; i < left; ++i) x.push_back(i);
      for (int i = 0; i < right; ++i) y.push_back(100 + i);
      const long allocations = a.allocations() + b.allocations();
      swap(x, y);
      EXPECT_EQ(contents(x), iota(100, right));
      EXPECT_EQ(contents(y), iota(0, left));
      EXPECT_EQ(&x.get_allocator(), &b);
      EXPECT_EQ(&y.get_allocator(), &a);
      EXPECT_EQ(a.allocations() + b.allocations(), allocations) << "equal N never allocates";
      EXPECT_EQ(x.is_inline(), right <= 4);
      EXPECT_EQ(y.is_inline(), left <= 4);
      // Both keep growing and shrinking correctly afterwards (their N survived).
      x.clear();
      x.shrink_to_fit();
      EXPECT_EQ(x.capacity(), 4u);
      y.clear();
      y.shrink_to_fit();
      EXPECT_EQ(y.capacity(), 4u);
    }
  }
  EXPECT_EQ(a.live_blocks() + b.live_blocks(), 0u);
}

TEST(small_vector, swap_across_n_and_with_vector) {
  test_allocator a, b;
  for (int left : {0, 2, 6, 40}) {
    for (int right : {0, 1, 3, 7, 33}) {
      memkit::small_vector<int, 2> x(a);
      memkit::small_vector<int, 6> y(b);
      memkit::vector<int> z(b);
      for (int i = 0; i < left; ++i) x.push_back(i);
      for (int i = 0; i < right; ++i) y.push_back(100 + i), z.push_back(200 + i);
      memkit::vector_base<int>& xv = x;
      xv.swap(y);
      EXPECT_EQ(contents(x), iota(100, right));
      EXPECT_EQ(contents(y), iota(0, left));
      xv.swap(z);
      EXPECT_EQ(contents(x), iota(200, right));
      EXPECT_EQ(contents(z), iota(100, right));
      EXPECT_EQ(&z.get_allocator(), &b);
      swap(xv, static_cast<memkit::vector_base<int>&>(y));
      EXPECT_EQ(contents(x), iota(0, left));
      EXPECT_EQ(&x.get_allocator(), &a);
    }
  }
  EXPECT_EQ(a.live_blocks() + b.live_blocks(), 0u);
}

TEST(small_vector, swap_that_must_allocate_changes_nothing_when_allocation_fails) {
  test_allocator a, b;
  memkit::small_vector<int, 8> x(a);
  memkit::small_vector<int, 2> y(b);
  append_squares(x, 6);  // inline in x, does not fit y's inline storage
  y.push_back(7);
  a.fail_all(true);
  EXPECT_THROW(x.swap(y), std::bad_alloc);
  EXPECT_EQ(contents(x), (std::vector<int>{0, 1, 4, 9, 16, 25}));
  EXPECT_EQ(contents(y), (std::vector<int>{7}));
  EXPECT_EQ(&x.get_allocator(), &a);
  a.fail_all(false);
  x.swap(y);
  EXPECT_EQ(contents(y), (std::vector<int>{0, 1, 4, 9, 16, 25}));
  EXPECT_EQ(&y.get_allocator(), &a);
}

TEST(small_vector, move_assignment_keeps_the_destination_allocator) {
  test_allocator a, b;
  memkit::small_vector<int, 2> x(a);
  memkit::small_vector<int, 2> y(b);
  append_squares(x, 10);
  y = std::move(x);
  EXPECT_EQ(&y.get_allocator(), &b);
  EXPECT_EQ(y.size(), 10u);
  EXPECT_EQ(b.live_blocks(), 1u);  // y's elements live in memory from b
  EXPECT_EQ(a.live_blocks(), 1u);  // x's buffer was not adopted (the allocators differ); x keeps it
  EXPECT_TRUE(x.empty());
}

TEST(small_vector, spilling_with_throwing_elements_is_strong_for_every_n) {
  for (long n = 1; n < 30; ++n) {
    counters::reset();
    {
      test_allocator a;
      memkit::small_vector<counted<false>, 4> v(a);
      for (int i = 0; i < 4; ++i) v.emplace_back(i);
      counters::throw_on(n);
      try {
        v.emplace_back(4);
        EXPECT_EQ(v.size(), 5u);
      } catch (const injected_exception&) {
        EXPECT_TRUE(v.is_inline());
        EXPECT_EQ(v.size(), 4u);
        for (int i = 0; i < 4; ++i) EXPECT_EQ(v[static_cast<std::size_t>(i)].value(), i);
      }
      counters::throw_on(0);
    }
    EXPECT_EQ(counters::live(), 0);
  }
}

TEST(small_vector, shrink_to_fit_back_inline_with_a_throwing_copy_changes_nothing) {
  for (long n = 1; n < 10; ++n) {
    counters::reset();
    {
      memkit::small_vector<counted<false>, 4> v;
      for (int i = 0; i < 10; ++i) v.emplace_back(i);
      v.resize(3);
      counters::throw_on(n);
      try {
        v.shrink_to_fit();
        EXPECT_TRUE(v.is_inline());
      } catch (const injected_exception&) {
        EXPECT_FALSE(v.is_inline());
        EXPECT_EQ(v.size(), 3u);
      }
      counters::throw_on(0);
      // Whatever happened, N is still known.
      v.clear();
      v.shrink_to_fit();
      EXPECT_EQ(v.capacity(), 4u);
    }
    EXPECT_EQ(counters::live(), 0);
  }
}

TEST(small_vector, over_aligned_and_byte_elements) {
  struct alignas(32) wide {
    double values[4];
  };
  memkit::small_vector<wide, 3> w;
  for (int i = 0; i < 10; ++i) w.push_back(wide{{double(i), 0, 0, 0}});
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(&w[i]) % 32, 0u);
    EXPECT_EQ(w[i].values[0], double(i));
  }
  memkit::small_vector<char, 1> bytes;  // inline storage still has room to remember N
  for (int i = 0; i < 100; ++i) bytes.push_back(static_cast<char>(i));
  bytes.resize(1);
  bytes.shrink_to_fit();
  EXPECT_TRUE(bytes.is_inline());
  EXPECT_EQ(bytes.capacity(), 1u);
}

TEST(small_vector, unique_ptr_elements_move_between_inline_and_heap) {
  memkit::small_vector<std::unique_ptr<int>, 2> v;
  for (int i = 0; i < 5; ++i) v.push_back(std::make_unique<int>(i));
  memkit::small_vector<std::unique_ptr<int>, 8> w(std::move(v));
  v.push_back(std::make_unique<int>(9));
  swap(static_cast<memkit::vector_base<std::unique_ptr<int>>&>(v), w);
  EXPECT_EQ(v.size(), 5u);
  EXPECT_EQ(*v[4], 4);
  EXPECT_EQ(*w[0], 9);
}

}  // namespace

namespace {

// A 32-byte trivially copyable element takes the wide-value path of push_back: built in place when
// there is room, else copied first and placed after growing. An argument that is an element of
// the vector itself must survive the growth that moves it.
TEST(small_vector, appending_its_own_wide_element_while_full_copies_it_before_growing) {
  using wide = std::array<std::int64_t, 4>;  // not long: 4 bytes on Windows
  static_assert(sizeof(wide) == 32);
  test_allocator allocator;
  memkit::small_vector<wide, 2> v(allocator);
  v.push_back(wide{1, 2, 3, 4});
  v.push_back(wide{5, 6, 7, 8});
  v.push_back(v[0]);  // full: grows while the argument lives in the inline buffer
  v.emplace_back(v[1]);
  for (int i = 0; i < 20; ++i) v.push_back(v[static_cast<std::size_t>(i)]);  // heap growth too
  ASSERT_EQ(v.size(), 24u);
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], (i % 2 == 0 ? wide{1, 2, 3, 4} : wide{5, 6, 7, 8})) << i;
  }
  memkit::vector<wide> heap_only(allocator);
  heap_only.push_back(wide{9, 9, 9, 9});
  heap_only.shrink_to_fit();
  heap_only.push_back(heap_only.front());
  EXPECT_EQ(heap_only.back(), (wide{9, 9, 9, 9}));
}

// The spill of a full small_vector of trivially copyable elements (a new block, the inline
// elements copied over, N remembered) and the growth of its heap buffer (reallocate) share one
// out-of-line path for int and for 32-byte elements: a failure at either step changes nothing,
// throws from push_back and is false from try_push_back; after success every element is kept and
// shrink_to_fit finds N again.
template <class T>
void check_growth_of_a_full_trivially_copyable_small_vector() {
  auto make = [](int i) {
    if constexpr (std::is_same_v<T, int>) return i;
    else return T{i, i + 1, i + 2, i + 3};
  };
  auto first = [](const T& e) {
    if constexpr (std::is_same_v<T, int>) return e;
    else return static_cast<int>(e[0]);
  };
  auto expect_elements = [&](const memkit::small_vector<T, 4>& v, int count) {
    ASSERT_EQ(v.size(), static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) EXPECT_EQ(v[static_cast<std::size_t>(i)], make(i)) << i;
  };
  test_allocator allocator;
  memkit::small_vector<T, 4> v(allocator);
  for (int i = 0; i < 4; ++i) v.push_back(make(i));
  const T* inline_data = v.data();

  allocator.fail_all(true);  // the spill fails
  EXPECT_THROW(v.push_back(make(4)), std::bad_alloc);
  EXPECT_FALSE(v.try_push_back(make(4)));
  EXPECT_EQ(v.try_emplace_back(make(4)), nullptr);
  EXPECT_EQ(v.data(), inline_data);
  EXPECT_EQ(v.capacity(), 4u);
  expect_elements(v, 4);

  allocator.fail_all(false);
  v.push_back(make(4));  // spills
  EXPECT_NE(v.data(), inline_data);
  EXPECT_EQ(allocator.live_blocks(), 1u);
  while (v.size() < v.capacity()) v.push_back(make(static_cast<int>(v.size())));
  const auto heap_capacity = v.capacity();
  const int count = static_cast<int>(v.size());

  allocator.fail_all(true);  // the heap buffer cannot grow
  allocator.allow_resize(false);
  EXPECT_THROW(v.push_back(make(count)), std::bad_alloc);
  EXPECT_FALSE(v.try_push_back(make(count)));
  EXPECT_EQ(v.capacity(), heap_capacity);
  expect_elements(v, count);

  allocator.fail_all(false);
  v.push_back(make(count));  // reallocates
  EXPECT_GT(v.capacity(), heap_capacity);
  expect_elements(v, count + 1);
  EXPECT_GE(allocator.reallocations(), 1);
  EXPECT_EQ(first(v.back()), count);

  v.resize(3);
  v.shrink_to_fit();  // back inline: N was remembered through both growths
  EXPECT_EQ(v.data(), inline_data);
  EXPECT_EQ(v.capacity(), 4u);
  EXPECT_EQ(allocator.live_blocks(), 0u);
  expect_elements(v, 3);
}

TEST(small_vector, failed_and_successful_growth_of_full_int_elements) {
  check_growth_of_a_full_trivially_copyable_small_vector<int>();
}

TEST(small_vector, failed_and_successful_growth_of_full_32_byte_elements) {
  check_growth_of_a_full_trivially_copyable_small_vector<std::array<long, 4>>();
}

}  // namespace
