// The container harnesses' shared driver: random operations on a memkit container of counted
// elements (tests/support/counted.hpp) and on a std::vector<int> model, with elements that throw
// on the N-th construction and, for containers with an allocator, a tracking_allocator that fails
// the N-th request when the fuzzer says so. After every step: same contents and size as the model,
// capacity at least size, every live element counted once (no leak, no double destruction), and
// after an exception the documented guarantee: strong for growth at the end (push_back,
// emplace_back, resize, reserve, the try_ forms), basic (valid and counted, the model resynced)
// for inserts in the middle and assignments. At the end nothing is live, in the container or the
// allocator.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <vector>

#include "fuzz_support.hpp"
#include "memkit/tracking_allocator.hpp"
#include "memkit/type_traits.hpp"
#include "support/counted.hpp"

namespace memkit::fuzzing {

using memkit::testing::counted;
using memkit::testing::counters;

// counted with a noexcept move that memkit may relocate with memcpy (growth through reallocate).
struct relocatable_element : counted<true> {
  using counted<true>::counted;
};

}  // namespace memkit::fuzzing

template <>
struct memkit::is_trivially_relocatable<memkit::fuzzing::relocatable_element> : std::true_type {};

namespace memkit::fuzzing {

// Hooks a harness provides for its container type C of elements E.
template <class C>
struct container_traits;

template <class C, class E>
class container_driver {
 public:
  container_driver(C& c, memkit::tracking_allocator* tracker) : c_(c), tracker_(tracker) {}

  void run(input& in) {
    check();
    while (!in.empty()) {
      step(in);
      check();
    }
  }

 private:
  enum class guarantee { strong, basic };

  int value(input& in) { return static_cast<int>(in.below(1000)); }
  std::size_t position(input& in) { return model_.empty() ? 0 : in.below(model_.size() + 1); }
  std::size_t count(input& in) {
    const std::size_t limit = container_traits<C>::max_count(c_);
    const std::size_t n = in.below(4) == 0 ? in.below(2000) : in.below(40);
    return n > limit + 2 ? limit + 2 : n;
  }

  // Runs op; on an exception checks the guarantee (strong: the model is unchanged; basic: the
  // model takes the container's contents, which must still be valid elements).
  template <class Op>
  void attempt(guarantee g, Op&& op) {
    const std::vector<int> before = model_;
    try {
      op();
    } catch (const memkit::testing::injected_exception&) {
      after_exception(g, before);
    } catch (const std::bad_alloc&) {
      after_exception(g, before);
    } catch (const std::length_error&) {
      after_exception(guarantee::strong, before);
    }
  }
  void after_exception(guarantee g, const std::vector<int>& before) {
    model_ = before;
    if (g == guarantee::basic) {
      model_.clear();
      for (const E& e : c_) {
        // Valid elements: moved-from ones (-1) are allowed by the basic guarantee, destroyed ones
        // (-2) are not.
        MEMKIT_FUZZ_CHECK(e.value() != -2);
        model_.push_back(e.value());
      }
    }
  }

  void step(input& in) {
    switch (in.below(20)) {
      case 0:
      case 1: {  // push_back / emplace_back (strong on growth)
        const int v = value(in);
        attempt(guarantee::strong, [&] {
          if (in.coin()) c_.push_back(E(v));
          else MEMKIT_FUZZ_CHECK(c_.emplace_back(v).value() == v);
          model_.push_back(v);
        });
        return;
      }
      case 2: {  // try_push_back: false changes nothing
        const int v = value(in);
        attempt(guarantee::strong, [&] {
          if (c_.try_push_back(E(v))) model_.push_back(v);
        });
        return;
      }
      case 3: {  // insert / emplace one element anywhere (basic)
        const std::size_t at = position(in);
        const int v = value(in);
        attempt(guarantee::basic, [&] {
          auto it = in.coin() ? c_.insert(c_.begin() + static_cast<std::ptrdiff_t>(at), E(v))
                              : c_.emplace(c_.begin() + static_cast<std::ptrdiff_t>(at), v);
          MEMKIT_FUZZ_CHECK(it == c_.begin() + static_cast<std::ptrdiff_t>(at) && it->value() == v);
          model_.insert(model_.begin() + static_cast<std::ptrdiff_t>(at), v);
        });
        return;
      }
      case 4: {  // insert count copies (basic)
        if constexpr (container_traits<C>::has_insert_count) {
          const std::size_t at = position(in);
          const std::size_t n = count(in);
          const int v = value(in);
          attempt(guarantee::basic, [&] {
            c_.insert(c_.begin() + static_cast<std::ptrdiff_t>(at), n, E(v));
            model_.insert(model_.begin() + static_cast<std::ptrdiff_t>(at), n, v);
          });
        }
        return;
      }
      case 5: {  // erase one or a range
        if (model_.empty()) return;
        const std::size_t first = in.below(model_.size());
        const std::size_t last = in.coin() ? first + 1 : first + in.below(model_.size() - first + 1);
        attempt(guarantee::basic, [&] {
          if (last == first + 1 && in.coin()) {
            c_.erase(c_.begin() + static_cast<std::ptrdiff_t>(first));
          } else {
            if constexpr (container_traits<C>::has_erase_range)
              c_.erase(c_.begin() + static_cast<std::ptrdiff_t>(first), c_.begin() + static_cast<std::ptrdiff_t>(last));
            else
              for (std::size_t i = first; i < last; ++i) c_.erase(c_.begin() + static_cast<std::ptrdiff_t>(first));
          }
          model_.erase(model_.begin() + static_cast<std::ptrdiff_t>(first), model_.begin() + static_cast<std::ptrdiff_t>(last));
        });
        return;
      }
      case 6:
        if (!model_.empty()) {
          c_.pop_back();
          model_.pop_back();
        }
        return;
      case 7:
      case 8: {  // resize, with or without a value (strong on growth)
        const std::size_t n = count(in);
        const bool with_value = in.coin();
        const int v = value(in);
        attempt(guarantee::strong, [&] {
          if (with_value) {
            c_.resize(n, E(v));
            model_.resize(n, v);
          } else {
            c_.resize(n);
            model_.resize(n, 0);
          }
        });
        return;
      }
      case 9: {  // try_resize / try_reserve (false changes nothing)
        if constexpr (container_traits<C>::has_try_resize) {
          const std::size_t n = count(in);
          attempt(guarantee::strong, [&] {
            if (in.coin()) {
              if (c_.try_resize(n)) model_.resize(n, 0);
            } else {
              const std::size_t capacity = c_.capacity();
              if (c_.try_reserve(n)) MEMKIT_FUZZ_CHECK(c_.capacity() >= n);
              else MEMKIT_FUZZ_CHECK(c_.capacity() >= capacity);
            }
          });
        }
        return;
      }
      case 10: {  // reserve (strong)
        const std::size_t n = count(in);
        attempt(guarantee::strong, [&] {
          c_.reserve(n);
          MEMKIT_FUZZ_CHECK(c_.capacity() >= n);
        });
        return;
      }
      case 11:
        attempt(guarantee::strong, [&] { c_.shrink_to_fit(); });
        return;
      case 12:
        if (in.below(4) == 0) {
          c_.clear();
          model_.clear();
        }
        return;
      case 13: {  // assign count copies (basic)
        const std::size_t n = count(in);
        const int v = value(in);
        attempt(guarantee::basic, [&] {
          c_.assign(n, E(v));
          model_.assign(n, v);
        });
        return;
      }
      case 14: {  // copy, then move back (a round trip through a second container); moving
                  // inline elements one by one gives the basic guarantee, as std::vector's
        attempt(guarantee::basic, [&] {
          C copy(c_);
          MEMKIT_FUZZ_CHECK(copy.size() == model_.size());
          MEMKIT_FUZZ_CHECK(std::equal(copy.begin(), copy.end(), model_.begin(), model_.end(),
                                       [](const E& e, int v) { return e.value() == v; }));
          c_ = std::move(copy);
        });
        return;
      }
      case 15:
      case 16: {  // the element constructor throws on the N-th construction from now
        counters::throw_on(in.coin() ? static_cast<long>(in.between(1, 40)) : -1);
        return;
      }
      case 17:
      case 18: {  // the allocator fails the N-th request, every request, or none
        if (tracker_ == nullptr) return;
        switch (in.below(3)) {
          case 0: tracker_->fail_nth_allocation(in.between(1, 4)); break;
          case 1: tracker_->fail_all_allocations(true); break;
          default:
            tracker_->fail_all_allocations(false);
            tracker_->fail_nth_allocation(0);
            break;
        }
        return;
      }
      default:
        container_traits<C>::extra_step(c_, in);
        return;
    }
  }

  void check() const {
    MEMKIT_FUZZ_CHECK(c_.size() == model_.size());
    MEMKIT_FUZZ_CHECK(c_.capacity() >= c_.size());
    MEMKIT_FUZZ_CHECK(c_.empty() == model_.empty());
    MEMKIT_FUZZ_CHECK(std::equal(c_.begin(), c_.end(), model_.begin(), model_.end(),
                                 [](const E& e, int v) { return e.value() == v; }));
    // Every element alive is in the container, exactly once.
    MEMKIT_FUZZ_CHECK(counters::live() == static_cast<long>(c_.size()));
    container_traits<C>::check(c_, tracker_);
  }

  C& c_;
  memkit::tracking_allocator* tracker_;
  std::vector<int> model_;
};

// Runs a whole input on a container made by make(tracker) and checks that nothing stays live.
template <class C, class E, class Make>
void fuzz_container(input& in, memkit::tracking_allocator* tracker, Make&& make) {
  counters::reset();
  {
    C c = make();
    container_driver<C, E>(c, tracker).run(in);
    counters::throw_on(-1);
    if (tracker != nullptr) {
      tracker->fail_all_allocations(false);
      tracker->fail_nth_allocation(0);
    }
  }
  MEMKIT_FUZZ_CHECK(counters::live() == 0);
  if (tracker != nullptr) MEMKIT_FUZZ_CHECK(tracker->statistics().live_blocks == 0);
}

}  // namespace memkit::fuzzing
