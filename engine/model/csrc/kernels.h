// What one source file of the engine's CPU kernels offers the others (each file's own helpers stay local to it).

#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace playground_cpu {

// The x86-64 level the register-sized kernels run at now ("avx512", "avx2" or "baseline"; see use_kernel_level).
const char* active_level_name();

// y = x W^T (+ b) for a weight packed by pack_int8 / pack_int4 (quantized_linear.cpp), `scales` its scales; the
// packed tensor's dtype says which format it is (int8: 8-bit, uint8: two 4-bit weights a byte).
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                         const std::optional<at::Tensor>& bias);

}  // namespace playground_cpu
