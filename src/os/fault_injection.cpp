#include "fault_injection.hpp"

#include <atomic>
#include <climits>

namespace memkit::os {
namespace {

struct injection {
  std::atomic<unsigned> calls_to_skip{0};  // calls that still succeed before failures start
  std::atomic<unsigned> failures_left{0};  // UINT_MAX: until cleared
  std::atomic<int> error{0};
};

constexpr auto operation_count = static_cast<unsigned>(testing::operation::count);
injection injections[operation_count];
std::atomic<unsigned> armed{0};  // number of operations with failures pending

void arm(testing::operation op, unsigned skip, unsigned failures, int error) noexcept {
  auto& slot = injections[static_cast<unsigned>(op)];
  const bool was_armed = slot.failures_left.load() != 0;
  slot.error.store(error == 0 ? -1 : error);
  slot.calls_to_skip.store(skip);
  slot.failures_left.store(failures);
  if (failures != 0 && !was_armed) armed.fetch_add(1);
  if (failures == 0 && was_armed) armed.fetch_sub(1);
}

}  // namespace

namespace detail {

int injected_failure(testing::operation op) noexcept {
  if (armed.load(std::memory_order_relaxed) == 0) return 0;
  auto& slot = injections[static_cast<unsigned>(op)];
  unsigned left = slot.failures_left.load();
  if (left == 0) return 0;
  unsigned skip = slot.calls_to_skip.load();
  while (skip != 0) {
    if (slot.calls_to_skip.compare_exchange_weak(skip, skip - 1)) return 0;
  }
  while (left != 0) {
    if (left == UINT_MAX) return slot.error.load();
    if (slot.failures_left.compare_exchange_weak(left, left - 1)) {
      if (left == 1) armed.fetch_sub(1);
      return slot.error.load();
    }
  }
  return 0;
}

}  // namespace detail

namespace testing {

void inject_failure(operation op, unsigned count, int error) noexcept { arm(op, 0, count, error); }

void fail_after(operation op, unsigned after, int error) noexcept { arm(op, after, UINT_MAX, error); }

void clear_injected_failures() noexcept {
  for (unsigned i = 0; i < operation_count; ++i) arm(static_cast<operation>(i), 0, 0, 0);
}

}  // namespace testing
}  // namespace memkit::os
