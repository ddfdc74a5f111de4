// memkit umbrella header: every public component. Include single headers to compile less.
#pragma once

#include "memkit/allocator.hpp"
#include "memkit/os.hpp"
