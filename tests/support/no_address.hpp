// An element whose unary & is deleted: containers must take element addresses with
// std::addressof, as std::vector does.
#pragma once

#include <string>

namespace memkit::testing {

struct no_address {
  std::string text;
  explicit no_address(int i = 0) : text(std::to_string(i)) {}
  void operator&() const = delete;
};

}  // namespace memkit::testing
