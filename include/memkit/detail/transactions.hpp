// Transactions: objects that undo one step of an operation in their destructor unless the
// operation commits them. memkit's containers never write `try { ... } catch (...) { undo;
// throw; }`: each step that must be undone when a later one throws is one of these (abseil's
// inlined_vector does the same), so reading a growth function top to bottom is reading its happy
// path, and an early return cannot forget the undo. Internal.
#pragma once

#include <cstddef>
#include <utility>

#include "memkit/allocator.hpp"
#include "memkit/detail/contiguous_surface.hpp"

namespace memkit::detail {

// A heap block for elements and how many it holds (allocate_at_least's feedback).
template <class T>
struct element_block {
  T* pointer = nullptr;
  std::size_t capacity = 0;
};

// Owns a freshly allocated block until commit(): growth's first phase. If anything between the
// allocation and the commit throws, the destructor gives the block back.
template <class T>
class allocation_transaction {
 public:
  // Allocates room for at least `count` elements from `a`; failed() tells whether it worked.
  allocation_transaction(memkit::allocator& a, std::size_t count, std::size_t max_count) noexcept : allocator_(&a) {
    const allocation obtained = a.allocate_at_least(count * sizeof(T), alignof(T));
    const std::size_t fits = obtained.size / sizeof(T);
    block_ = {static_cast<T*>(obtained.pointer), fits < max_count ? fits : max_count};
  }
  allocation_transaction(const allocation_transaction&) = delete;
  allocation_transaction& operator=(const allocation_transaction&) = delete;
  ~allocation_transaction() {
    if (block_.pointer != nullptr) allocator_->deallocate(block_.pointer, block_.capacity * sizeof(T), alignof(T));
  }

  [[nodiscard]] bool failed() const noexcept { return block_.pointer == nullptr; }
  [[nodiscard]] T* data() const noexcept { return block_.pointer; }
  // Hands the block over; the transaction no longer frees it.
  [[nodiscard]] element_block<T> commit() noexcept { return std::exchange(block_, element_block<T>{}); }

 private:
  memkit::allocator* allocator_;
  element_block<T> block_;
};

// Owns constructed elements [first, last) until commit(): if a later step throws, the destructor
// destroys them, so an operation that built them leaves nothing behind.
template <class T>
class construction_transaction {
 public:
  construction_transaction(T* first, T* last) noexcept : first_(first), last_(last) {}
  construction_transaction(const construction_transaction&) = delete;
  construction_transaction& operator=(const construction_transaction&) = delete;
  ~construction_transaction() { destroy_range(first_, last_); }
  void commit() noexcept { last_ = first_; }

 private:
  T* first_;
  T* last_;
};

// Runs `undo` when the scope is left by an exception (more exactly: unless dismiss() was called),
// for the few steps that are neither an allocation nor a construction.
template <class Undo>
class undo_unless_dismissed {
 public:
  explicit undo_unless_dismissed(Undo undo) noexcept : undo_(std::move(undo)) {}
  undo_unless_dismissed(const undo_unless_dismissed&) = delete;
  undo_unless_dismissed& operator=(const undo_unless_dismissed&) = delete;
  ~undo_unless_dismissed() {
    if (armed_) undo_();
  }
  void dismiss() noexcept { armed_ = false; }

 private:
  Undo undo_;
  bool armed_ = true;
};

}  // namespace memkit::detail
