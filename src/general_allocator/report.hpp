// The general allocator's name for the diagnostics module's report writer (src/report.hpp), where
// debug mode's reports and every other text memkit writes are formatted.
#pragma once

#include "../report.hpp"

namespace memkit::gpa {
using diagnostics::report_writer;
}  // namespace memkit::gpa
