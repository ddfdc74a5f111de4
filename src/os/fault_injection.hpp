// Internal: the fault-injection switchboard behind memkit::os::testing, shared by every platform's
// os file. Each os function asks injected_failure() before its system call.
#pragma once

#include "memkit/os.hpp"

namespace memkit::os::detail {

// Returns the error number to fail this call of `op` with, or 0 to go ahead. One relaxed atomic
// load when nothing is armed.
int injected_failure(testing::operation op) noexcept;

}  // namespace memkit::os::detail
