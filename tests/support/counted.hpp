// Test element types that count what containers do with them: constructions, copies, moves and
// destructions, with an optional throw on the N-th construction or copy. Used to check that
// containers construct and destroy exactly what they should and keep their exception guarantees.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <utility>

namespace memkit::testing {

// Global counters for counted<...> objects. Reset them at the start of each test with reset().
struct counters {
  static inline long constructions = 0;  // every constructor, copies and moves included
  static inline long copies = 0;
  static inline long moves = 0;
  static inline long destructions = 0;
  static inline long throw_countdown = -1;  // >0: the construction that makes it 0 throws
  static long live() noexcept { return constructions - destructions; }
  static void reset() noexcept { constructions = copies = moves = destructions = 0; throw_countdown = -1; }
  // Makes the n-th construction (or copy/move that is not noexcept) from now throw (n >= 1).
  static void throw_on(long n) noexcept { throw_countdown = n; }
};

// Thrown by counted<...> when the countdown reaches zero.
struct injected_exception : std::runtime_error {
  injected_exception() : std::runtime_error("injected exception") {}
};

// An element with a value, which counts its life in `counters`. NothrowMove selects whether its
// move constructor is noexcept (containers then move instead of copying on growth). Padding makes
// it larger when a test needs wide elements.
template <bool NothrowMove = true, std::size_t Padding = 0>
class counted {
 public:
  counted() : counted(0) {}
  counted(int value) : value_(value) { on_construct(); }  // NOLINT: implicit for brevity in tests
  counted(const counted& other) : value_(other.value_) {
    on_construct();
    ++counters::copies;
  }
  counted(counted&& other) noexcept(NothrowMove) : value_(other.value_) {
    if constexpr (!NothrowMove) on_construct();
    else ++counters::constructions;
    ++counters::moves;
    other.value_ = -1;
  }
  counted& operator=(const counted& other) {
    maybe_throw();
    value_ = other.value_;
    ++counters::copies;
    return *this;
  }
  counted& operator=(counted&& other) noexcept(NothrowMove) {
    value_ = other.value_;
    other.value_ = -1;
    ++counters::moves;
    return *this;
  }
  ~counted() {
    ++counters::destructions;
    value_ = -2;  // makes use after destruction visible
  }
  int value() const noexcept { return value_; }
  friend bool operator==(const counted& a, const counted& b) noexcept { return a.value_ == b.value_; }
  friend auto operator<=>(const counted& a, const counted& b) noexcept { return a.value_ <=> b.value_; }

 private:
  static void maybe_throw() {
    if (counters::throw_countdown > 0 && --counters::throw_countdown == 0) throw injected_exception();
  }
  void on_construct() {
    maybe_throw();
    ++counters::constructions;
  }
  int value_;
  [[maybe_unused]] unsigned char padding_[Padding == 0 ? 1 : Padding]{};
};

}  // namespace memkit::testing
