#include "memkit/detail/config.hpp"

#include <cstdio>
#include <cstdlib>

namespace memkit::detail {

void contract_violation(const char* condition, const char* message, const char* file,
                        int line) noexcept {
  // fprintf to an unbuffered stream allocates nothing with glibc, so this is safe to call from
  // inside an allocator.
  std::fprintf(stderr, "memkit: contract violated: %s (%s) at %s:%d\n", message, condition, file,
               line);
  std::abort();
}

}  // namespace memkit::detail
