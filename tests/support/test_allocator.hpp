// A checking allocator for tests: every block it hands out is recorded, every deallocate is
// checked against its allocate (pointer, size, alignment), and it can be told to fail the N-th
// allocation or to refuse in-place growth. It reports mismatches through GoogleTest failures, and
// leaks when it is destroyed.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <map>
#include <mutex>

#include "memkit/allocator.hpp"

namespace memkit::testing {

class test_allocator final : public memkit::allocator {
 public:
  explicit test_allocator(memkit::allocator& upstream = memkit::malloc_allocator::instance())
      : upstream_(upstream) {}
  test_allocator(const test_allocator&) = delete;
  test_allocator& operator=(const test_allocator&) = delete;
  ~test_allocator() override {
    EXPECT_TRUE(blocks_.empty()) << blocks_.size() << " block(s) leaked";
  }

  // Makes the n-th allocation from now fail (n >= 1); 0 clears. Reallocations that need a new
  // block count as allocations.
  void fail_on(long n) { fail_countdown_ = n; }
  // Makes every allocation from now fail (true) or succeed (false).
  void fail_all(bool on) { fail_all_ = on; }
  // Lets resize() succeed (true, the default: through the upstream) or always refuse (false).
  void allow_resize(bool on) { allow_resize_ = on; }
  // Makes allocate_at_least() report `bytes` more than requested (the block really has them), so
  // containers' use of size feedback is exercised; deallocate then accepts any size between the
  // requested and the reported one, as the allocator contract says.
  void report_extra(std::size_t bytes) { extra_ = bytes; }

  std::size_t live_blocks() const { return blocks_.size(); }
  std::size_t live_bytes() const {
    std::size_t total = 0;
    for (auto& [p, b] : blocks_) total += b.size;
    return total;
  }
  long allocations() const { return allocations_; }
  long deallocations() const { return deallocations_; }
  long failed_allocations() const { return failed_; }
  long successful_resizes() const { return resizes_; }
  long reallocations() const { return reallocations_; }

 protected:
  void* do_allocate(std::size_t size, std::size_t alignment) noexcept override {
    std::lock_guard lock(mutex_);
    if (should_fail()) return nullptr;
    void* p = upstream_.allocate(size, alignment);
    if (p == nullptr) return nullptr;
    ++allocations_;
    blocks_[p] = {size, size, alignment};
    return p;
  }
  allocation do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept override {
    std::lock_guard lock(mutex_);
    if (should_fail()) return {};
    const std::size_t reported = size + extra_;
    void* p = upstream_.allocate(reported, alignment);
    if (p == nullptr) return {};
    ++allocations_;
    blocks_[p] = {size, reported, alignment};
    return {p, reported};
  }
  void* do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes, std::size_t new_size,
                      std::size_t alignment) noexcept override {
    {
      std::lock_guard lock(mutex_);
      ++reallocations_;
    }
    return allocator::do_reallocate(p, old_size, used_bytes, new_size, alignment);
  }
  void do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept override {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) {
      ADD_FAILURE() << "deallocate of a pointer this allocator does not own: " << p;
      return;
    }
    EXPECT_TRUE(size >= it->second.size && size <= it->second.reported)
        << "deallocate size " << size << " outside [" << it->second.size << ", "
        << it->second.reported << "]";
    EXPECT_EQ(it->second.alignment, alignment) << "deallocate alignment does not match allocate";
    upstream_.deallocate(p, it->second.reported, it->second.alignment);
    blocks_.erase(it);
    ++deallocations_;
  }
  bool do_resize(void* p, std::size_t old_size, std::size_t new_size,
                 std::size_t alignment) noexcept override {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) {
      ADD_FAILURE() << "resize of a pointer this allocator does not own: " << p;
      return false;
    }
    EXPECT_TRUE(old_size >= it->second.size && old_size <= it->second.reported)
        << "resize old_size does not match the block";
    if (!allow_resize_ || !upstream_.resize(p, it->second.reported, new_size, alignment)) return false;
    it->second.size = new_size;
    it->second.reported = new_size;
    ++resizes_;
    return true;
  }

 private:
  struct block {
    std::size_t size;      // requested
    std::size_t reported;  // usable size reported to the caller (>= size)
    std::size_t alignment;
  };
  bool should_fail() noexcept {
    if (fail_all_ || (fail_countdown_ > 0 && --fail_countdown_ == 0)) {
      ++failed_;
      return true;
    }
    return false;
  }

  memkit::allocator& upstream_;
  std::mutex mutex_;
  std::map<void*, block> blocks_;
  long fail_countdown_ = 0;
  bool fail_all_ = false;
  bool allow_resize_ = true;
  long allocations_ = 0;
  long deallocations_ = 0;
  long failed_ = 0;
  long resizes_ = 0;
  long reallocations_ = 0;
  std::size_t extra_ = 0;
};

}  // namespace memkit::testing
