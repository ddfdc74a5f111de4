// libFuzzer harness for tracking_allocator: random allocations, sized frees, resizes and
// reallocations through a tracker over malloc, while the budget changes and the N-th request or
// every request is set to fail. A model predicts each outcome (an injected failure first, then the
// budget, as documented) and after every step the counters must equal the model's: live blocks and
// bytes, peak, allocations, deallocations, budget refusals, injected failures; live_blocks()
// lists exactly the model's blocks, whose contents survive every move.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "memkit/tracking_allocator.hpp"

namespace {

using memkit::fuzzing::block_model;
using memkit::fuzzing::input;

struct expected_counts {
  std::uint64_t allocations = 0, deallocations = 0, reallocations = 0, resize_attempts = 0;
  std::uint64_t budget_refusals = 0, injected = 0, live_bytes = 0, peak = 0;
};

struct harness {
  memkit::tracking_allocator& t;
  block_model model;
  expected_counts e;
  std::size_t budget = SIZE_MAX;
  std::uint64_t countdown = 0;  // 0: disarmed
  bool fail_all = false;

  // What the tracker decides for a request that adds `added` live bytes: true when it proceeds.
  bool admits(std::size_t added) {
    if (fail_all || (countdown > 0 && --countdown == 0)) {
      ++e.injected;
      return false;
    }
    if (added > budget || e.live_bytes > budget - added) {
      ++e.budget_refusals;
      return false;
    }
    return true;
  }
  void grew_live(std::size_t from, std::size_t to) {
    e.live_bytes = e.live_bytes - from + to;
    if (e.live_bytes > e.peak) e.peak = e.live_bytes;
  }

  void step(input& in) {
    memkit::allocator& a = t;
    switch (in.below(10)) {
      case 0:
      case 1:
      case 2: {  // allocate / allocate_at_least
        const std::size_t size = in.size(1u << 20);
        const std::size_t charged = size == 0 ? 1 : size;
        const std::size_t alignment = in.alignment(12);
        const bool at_least = in.coin();
        const bool admitted = admits(charged);
        void* p = nullptr;
        std::size_t usable = charged;
        if (at_least) {
          const memkit::allocation block = a.allocate_at_least(size, alignment);
          p = block.pointer;
          usable = block.size;
        } else {
          p = a.allocate(size, alignment);
        }
        MEMKIT_FUZZ_CHECK((p != nullptr) == admitted);
        if (p == nullptr) return;
        MEMKIT_FUZZ_CHECK(usable >= charged);
        ++e.allocations;
        grew_live(0, charged);
        model.add(p, charged, alignment, usable);
        return;
      }
      case 3:
      case 4: {  // sized deallocate
        if (model.empty()) return;
        void* p = model.nth(in.below(model.count()));
        const auto b = model.at(p);
        model.remove(p);
        a.deallocate(p, b.size, b.alignment);
        ++e.deallocations;
        grew_live(b.size, 0);
        return;
      }
      case 5: {  // resize: never an allocation request, but the budget applies
        if (model.empty()) return;
        void* p = model.nth(in.below(model.count()));
        const auto b = model.at(p);
        const std::size_t new_size = in.coin() ? in.between(1, b.size) : b.size + in.below(8192);
        ++e.resize_attempts;
        const bool over_budget = new_size > b.size && (new_size - b.size > budget || e.live_bytes > budget - (new_size - b.size));
        model.check_contents(p);
        const bool resized = a.resize(p, b.size, new_size, b.alignment);
        if (over_budget) {
          MEMKIT_FUZZ_CHECK(!resized);
          ++e.budget_refusals;
        }
        if (!resized) return;
        grew_live(b.size, new_size);
        model.resize(p, new_size, new_size);
        return;
      }
      case 6: {  // reallocate: a request when it grows
        if (model.empty()) return;
        void* p = model.nth(in.below(model.count()));
        const auto b = model.at(p);
        const std::size_t new_size = in.between(1, 1u << 18);
        const std::size_t used = in.below((b.size < new_size ? b.size : new_size) + 1);
        const bool admitted = new_size <= b.size || admits(new_size - b.size);
        model.check_contents(p);
        void* q = a.reallocate(p, b.size, used, new_size, b.alignment);
        MEMKIT_FUZZ_CHECK((q != nullptr) == admitted);
        if (q == nullptr) {
          model.check_contents(p);
          return;
        }
        ++e.reallocations;
        grew_live(b.size, new_size);
        if (q == p) {
          const std::size_t kept = b.size < new_size ? b.size : new_size;
          MEMKIT_FUZZ_CHECK(memkit::fuzzing::holds_prefix(static_cast<unsigned char*>(q), b.size, kept, b.id));
          model.resize(q, new_size, new_size);
        } else {
          model.moved(p, q, used, new_size, b.alignment, new_size);
        }
        return;
      }
      case 7: {  // a new budget, possibly below what is live
        budget = in.coin() ? SIZE_MAX : in.below(4u << 20);
        t.set_budget(budget);
        MEMKIT_FUZZ_CHECK(t.budget() == budget);
        return;
      }
      case 8: {  // fail the N-th request from now, or every one, or stop failing
        switch (in.below(3)) {
          case 0:
            countdown = in.below(6);
            t.fail_nth_allocation(countdown);
            break;
          case 1:
            fail_all = true;
            t.fail_all_allocations(true);
            break;
          default:
            fail_all = false;
            t.fail_all_allocations(false);
            break;
        }
        return;
      }
      default: {  // live_blocks() lists exactly the model's blocks
        const auto live = t.live_blocks();
        MEMKIT_FUZZ_CHECK(live.size() == model.count());
        for (const auto& block : live) {
          const auto& b = model.at(block.pointer);
          MEMKIT_FUZZ_CHECK(block.size == b.size && block.alignment == b.alignment);
          model.check_contents(block.pointer);
        }
        return;
      }
    }
  }

  void check() const {
    const memkit::tracking_statistics s = t.statistics();
    MEMKIT_FUZZ_CHECK(s.live_blocks == model.count());
    MEMKIT_FUZZ_CHECK(s.live_bytes == e.live_bytes);
    MEMKIT_FUZZ_CHECK(s.peak_bytes == e.peak);
    MEMKIT_FUZZ_CHECK(s.allocations == e.allocations);
    MEMKIT_FUZZ_CHECK(s.deallocations == e.deallocations);
    MEMKIT_FUZZ_CHECK(s.reallocations == e.reallocations);
    MEMKIT_FUZZ_CHECK(s.resize_attempts == e.resize_attempts);
    MEMKIT_FUZZ_CHECK(s.budget_refusals == e.budget_refusals);
    MEMKIT_FUZZ_CHECK(s.injected_failures == e.injected);
    MEMKIT_FUZZ_CHECK(s.failed_allocations == 0);
    MEMKIT_FUZZ_CHECK(s.errors == 0);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  memkit::tracking_options options;
  options.report_leaks_at_destruction = false;
  options.capture_stack_traces = false;
  options.budget = in.coin() ? SIZE_MAX : in.below(8u << 20);
  memkit::tracking_allocator t(memkit::malloc_allocator::instance(), options);
  harness h{t, {}, {}, options.budget};
  while (!in.empty()) {
    h.step(in);
    h.check();
  }
  while (!h.model.empty()) {
    void* p = h.model.nth(0);
    const auto b = h.model.at(p);
    h.model.remove(p);
    static_cast<memkit::allocator&>(t).deallocate(p, b.size, b.alignment);
    ++h.e.deallocations;
    h.grew_live(b.size, 0);
  }
  h.check();
  return 0;
}
