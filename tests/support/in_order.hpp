// A GoogleTest matcher for death tests' output that works with every regular-expression engine:
// GoogleTest on Windows has only its "simple" regular expressions (no groups, no brackets, "."
// never matches a newline), so a report that spans lines is matched as pieces that appear in order.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace memkit::testing {

class in_order_matcher : public ::testing::MatcherInterface<const std::string&> {
 public:
  explicit in_order_matcher(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  bool MatchAndExplain(const std::string& text, ::testing::MatchResultListener* listener) const override {
    std::size_t at = 0;
    for (const std::string& piece : pieces_) {
      at = text.find(piece, at);
      if (at == std::string::npos) {
        *listener << "missing (in order) \"" << piece << '"';
        return false;
      }
      at += piece.size();
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "contains, in this order:";
    for (const std::string& piece : pieces_) *os << " \"" << piece << '"';
  }

 private:
  std::vector<std::string> pieces_;
};

// Matches a text that contains every piece, each after the one before.
inline ::testing::Matcher<const std::string&> contains_in_order(std::initializer_list<std::string> pieces) {
  return ::testing::MakeMatcher(new in_order_matcher(pieces));
}

}  // namespace memkit::testing
