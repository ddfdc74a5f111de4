// memkit umbrella header: every public component. Include single headers to compile less.
#pragma once

#include "memkit/allocator.hpp"
#include "memkit/block_heap.hpp"
#include "memkit/dyn_array.hpp"
#include "memkit/general_allocator.hpp"
#include "memkit/os.hpp"
#include "memkit/small_vector.hpp"
#include "memkit/tracking_allocator.hpp"
#include "memkit/type_traits.hpp"
#include "memkit/vector.hpp"
#include "memkit/virtual_arena.hpp"
