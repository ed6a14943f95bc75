// What one source file of the engine's CPU kernels offers the others (each file's own helpers stay local to it).

#pragma once

#include <ATen/ATen.h>

namespace playground_cpu {

// The x86-64 level the register-sized kernels run at now ("avx512", "avx2" or "baseline"; see use_kernel_level).
const char* active_level_name();

}  // namespace playground_cpu
