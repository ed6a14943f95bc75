// What one source file of the engine's CPU kernels offers the others (each file's own helpers stay local to it).

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace playground_cpu {

// The x86-64 level the register-sized kernels run at now ("avx512", "avx2" or "baseline"; see use_kernel_level).
const char* active_level_name();

// y = x W^T (+ b) for a weight packed by pack_int8 / pack_int4 (quantized_linear.cpp), `scales` its scales; the
// packed tensor's dtype says which format it is (int8: 8-bit, uint8: two 4-bit weights a byte).
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                         const std::optional<at::Tensor>& bias);

// Attention over an int8 KV pool (int8_kv.cpp): the integer sums of one chunk of at most kChunkKeys keys. `rows[t]`
// is key or value t's pool row (head_dim int8 values, then their scale): a chunk may span blocks, so its rows need
// not be adjacent. `dim` is a multiple of 32 up to kMaxInt8HeadDim; `scratch` holds kChunkKeys * dim int16.
constexpr int64_t kChunkKeys = 32;
constexpr int64_t kMaxInt8HeadDim = 256;
struct Int8KVOps {
  // raw[r * kChunkKeys + t] = sum over d of queries[r * dim + d] * key_t[d], for query rows r and keys t < count.
  void (*scores)(const int8_t* const* keys, int64_t count, const int16_t* queries, int64_t rows, int64_t dim,
                 int16_t* scratch, int32_t* raw);
  // sums[r * dim + d] = sum over t < count of weights[r * kChunkKeys + t] * value_t[d], for query rows r; a row's
  // weights past `count` are 0 up to the next even index (keys are taken in pairs).
  void (*values)(const int8_t* const* values, int64_t count, const int16_t* weights, int64_t rows, int64_t dim,
                 int16_t* scratch, int32_t* sums);
  const char* name;  // "vnni", "avx2" or "plain"
};

// The integer attention path for kernel level `level` (active_level_name's names; the same choice packed_linear
// makes for it).
const Int8KVOps& int8_kv_ops(const char* level);

}  // namespace playground_cpu
