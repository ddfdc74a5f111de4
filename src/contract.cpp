// The contract handler behind MEMKIT_ASSERT and MEMKIT_CHECK: a misuse report through the
// diagnostics module (report.hpp), whose action for a violated contract is always to abort.
#include "memkit/detail/config.hpp"

#include "report.hpp"

namespace memkit::detail {

void contract_violation(const char* condition, const char* message, const char* file,
                        int line) noexcept {
  diagnostics::report_contract_violation(condition, message, file, line);
}

}  // namespace memkit::detail
