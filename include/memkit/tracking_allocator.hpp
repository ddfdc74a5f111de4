// memkit::tracking_allocator — wraps any memkit allocator and watches everything that passes
// through it: counts, live and peak bytes, a size histogram, a memory budget, checks that every
// deallocation matches its allocation, a leak report (with stack traces, optionally) when it is
// destroyed, and "fail the N-th allocation" so error paths can be tested.
//
// Pick it to measure what a subsystem allocates (give its containers a tracking_allocator over
// the allocator they would use anyway), to enforce a budget on it (requests beyond the budget
// fail with null, which memkit containers turn into std::bad_alloc or a false from try_*), to find
// leaks and mismatched frees in tests, or to test your own out-of-memory handling with
// fail_nth_allocation(). There is no std counterpart; std::pmr has no statistics or checks.
//
// Every operation takes a mutex, so one tracking_allocator may be shared by threads (statistics
// are then exact). The bookkeeping costs a hash-table update per call (and a stack walk per
// allocation when traces are on); keep it out of production hot paths.
//
//   memkit::tracking_allocator tracker(memkit::malloc_allocator::instance(), {.budget = 1 << 20});
//   memkit::vector<int> v(tracker);
//   v.resize(1000);
//   std::puts(tracker.report().c_str());        // counts, live/peak bytes, histogram
//   if (!v.try_resize(1 << 20)) { /* over budget: v unchanged */ }
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memkit/allocator.hpp"

namespace memkit {

// A snapshot of a tracking_allocator's counters.
struct tracking_statistics {
  // Number of power-of-two buckets in size_histogram.
  static constexpr std::size_t histogram_buckets = 64;

  std::uint64_t allocations = 0;             // successful allocate / allocate_at_least calls
  std::uint64_t deallocations = 0;           // deallocations of known blocks
  std::uint64_t reallocations = 0;           // successful reallocate calls
  std::uint64_t reallocations_in_place = 0;  // ... of which kept the block where it was
  std::uint64_t resize_attempts = 0;         // resize calls
  std::uint64_t resizes_in_place = 0;        // ... of which succeeded
  std::uint64_t failed_allocations = 0;      // requests the wrapped allocator could not serve
  std::uint64_t budget_refusals = 0;         // requests refused because of the budget
  std::uint64_t injected_failures = 0;       // requests failed by fail_nth_allocation
  std::uint64_t errors = 0;                  // mismatched or unknown deallocations/resizes
  std::uint64_t live_blocks = 0;             // blocks allocated and not yet given back
  std::uint64_t live_bytes = 0;              // their requested sizes, summed
  std::uint64_t peak_bytes = 0;              // highest live_bytes so far
  std::uint64_t total_bytes = 0;             // sum of every requested size (growth counted once)
  // size_histogram[k]: allocations (and reallocations to a new size) of [2^k, 2^(k+1)) bytes.
  std::array<std::uint64_t, histogram_buckets> size_histogram{};

  // A multi-line, human-readable summary of these numbers.
  std::string to_string() const;
};

// How a tracking_allocator behaves.
struct tracking_options {
  // Requests that would raise live bytes above this fail with null (and count as refusals).
  std::size_t budget = std::numeric_limits<std::size_t>::max();
  // Records each allocation's stack trace, printed with leaks and mismatched frees.
  bool capture_stack_traces = false;
  // Frames recorded per allocation when capture_stack_traces is on (at most 32).
  std::size_t stack_depth = 16;
  // true: a deallocation that does not match an allocation prints a diagnostic and aborts, because
  // continuing would corrupt the wrapped allocator. false: it is counted in errors and described
  // by last_error() (for tests of the checks themselves); a pointer the tracker does not know is
  // not passed on, and a known block given back with the wrong size or alignment is given back
  // with those it was allocated with (a later deallocate of it is then an unknown pointer).
  bool abort_on_error = true;
  // Prints live blocks (leaks) when the tracking_allocator is destroyed.
  bool report_leaks_at_destruction = true;
  // Where diagnostics and the leak report go (a file descriptor).
  int report_fd = 2;
  // A name shown in diagnostics, to tell several trackers apart.
  const char* name = "tracking_allocator";
};

class tracking_allocator final : public allocator {
 public:
  // Wraps `upstream`, which must outlive this allocator.
  explicit tracking_allocator(allocator& upstream = default_allocator(), tracking_options options = {});
  tracking_allocator(const tracking_allocator&) = delete;
  tracking_allocator& operator=(const tracking_allocator&) = delete;
  // Reports leaks (when enabled). Leaked blocks are not freed: something may still use them.
  ~tracking_allocator() override;

  // A consistent snapshot of the counters.
  [[nodiscard]] tracking_statistics statistics() const;
  // statistics().to_string(), headed by the tracker's name.
  [[nodiscard]] std::string report() const;
  // Clears the counters (not the live blocks, which stay tracked; peak restarts at live bytes).
  void reset_statistics();

  // Sets the budget (see tracking_options::budget); lowering it below live bytes makes every
  // growth fail until enough is given back.
  void set_budget(std::size_t bytes);
  // The current budget.
  [[nodiscard]] std::size_t budget() const;

  // Makes the n-th allocation request from now fail (n >= 1; 0 disarms). Allocation requests are
  // allocate, allocate_at_least, and reallocate calls that need more memory; resize is not one.
  void fail_nth_allocation(std::uint64_t n);
  // Fails every allocation request from now on (true) or stops doing so (false).
  void fail_all_allocations(bool on);

  // A live block, as reported by live_blocks().
  struct block_info {
    void* pointer = nullptr;
    std::size_t size = 0;         // requested size
    std::size_t usable_size = 0;  // size reported to the caller (>= size)
    std::size_t alignment = 0;
    std::uint64_t sequence = 0;   // 1 for the first allocation, 2 for the next...
  };
  // The blocks currently allocated, oldest first.
  [[nodiscard]] std::vector<block_info> live_blocks() const;
  // Writes the live blocks (with stack traces when recorded) to `fd`; returns their number.
  std::size_t print_leaks(int fd) const;
  // A description of the most recent mismatch (empty when there was none).
  [[nodiscard]] std::string last_error() const;

  // The allocator this one forwards to.
  [[nodiscard]] allocator& upstream() const noexcept { return *upstream_; }

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override;
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override;
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override;
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                 std::size_t alignment) noexcept override;
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                      std::size_t alignment) noexcept override;

 private:
  struct record {
    std::size_t size;
    std::size_t usable_size;
    std::size_t alignment;
    std::uint64_t sequence;
    std::unique_ptr<void*[]> frames;  // null unless stack traces are captured
    std::size_t frame_count;
  };

  // Decides, under the lock, whether a request for `added` more live bytes may proceed.
  bool admit(std::size_t added) noexcept;
  // Records a new block; throws std::bad_alloc when the bookkeeping itself runs out of memory.
  void note_allocation(void* p, std::size_t size, std::size_t usable_size, std::size_t alignment);
  void note_size(std::size_t size) noexcept;
  // Looks up p, checking size and alignment; null (and an error) when p is unknown.
  record* find_checked(void* p, std::size_t size, std::size_t alignment, const char* operation) noexcept;
  void error(const char* message, const record* block) noexcept;
  void capture(record& r) const noexcept;
  std::size_t print_leaks_locked(int fd) const;

  allocator* upstream_;
  tracking_options options_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, record> blocks_;
  tracking_statistics stats_;
  std::uint64_t sequence_ = 0;
  std::uint64_t fail_countdown_ = 0;
  bool fail_all_ = false;
  std::string last_error_;
};

}  // namespace memkit
