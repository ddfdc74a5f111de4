// <windows.h> as the Windows os layer includes it: without the min/max macros that break
// std::min/std::max, and without the rarely used APIs that slow every build.
#pragma once

#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
