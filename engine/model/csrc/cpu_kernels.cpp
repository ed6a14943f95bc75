// CPU kernels for the native engine's decode path (float32), registered as torch operators.
//
// paged_attention: attention of a step's query tokens over K/V read in place from the paged pool,
//   block by block through each sequence's block table, with an online softmax (one pass, no
//   padded copy of the cache, no read of a slot past a query's causal limit). One work item is
//   one (sequence, KV head): all query tokens of that sequence and all query heads sharing that
//   KV head read each K/V block once while it is in L1.
// small_batch_linear: y = x W^T (+ b) for a handful of rows (decode batches), reading each weight
//   row once for all rows of x; MKL's GEMM is several times slower than its own GEMV at 2-8 rows.
//
// Work is spread over torch's intra-op threads (at::parallel_for). Hot loops are compiled once per
// x86-64 level (AVX-512, AVX2, baseline) and picked at load time, so one build runs on any x86-64.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PLAYGROUND_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PLAYGROUND_MULTIVERSION
#endif
#define PLAYGROUND_INLINE inline __attribute__((always_inline))

namespace {

typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

PLAYGROUND_INLINE vec16 load16(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

PLAYGROUND_INLINE void store16(float* p, vec16 v) { std::memcpy(p, &v, sizeof(v)); }

PLAYGROUND_INLINE vec16 splat(float x) { return vec16{} + x; }

// Sums and maxima of a vector's lanes as a tree (four dependent steps, not fifteen).
PLAYGROUND_INLINE float sum16(vec16 v) {
  const vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vec4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

PLAYGROUND_INLINE vec16 max16(vec16 a, vec16 b) { return a > b ? a : b; }

// e^x per lane (x <= 88), within about 2 ulp: e^x = 2^n e^r with |r| <= ln2 / 2, e^r by a degree-6 polynomial.
// Lanes below -87.3 give 0; NaN stays NaN.
PLAYGROUND_INLINE vec16 exp16(vec16 x) {
  const vec16 t = x * 1.44269504088896341f;
  const vec16 n = (t + 12582912.f) - 12582912.f;  // round to nearest
  const vec16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  vec16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vec16 e_r = p * r * r + r + 1.f;
  const ivec16 exponent = (__builtin_convertvector(n, ivec16) + 127) << 23;
  vec16 scale;
  std::memcpy(&scale, &exponent, sizeof(scale));
  vec16 y = e_r * scale;
  y = x < -87.3f ? vec16{} : y;
  return x != x ? x : y;
}

// Lane t of the result = sum of acc[t]'s lanes, for 16 vectors (a four-level transpose-add; the
// vectors are taken in bit-reversed order so that the sums come out in natural order).
PLAYGROUND_INLINE vec16 transpose_sums(const vec16* acc) {
  static constexpr int kBitReversed[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
  vec16 b[8], c[4], e[2];
  for (int i = 0; i < 8; ++i) {
    const vec16 x = acc[kBitReversed[2 * i]], y = acc[kBitReversed[2 * i + 1]];
    b[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    e[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
  return __builtin_shufflevector(e[0], e[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
         __builtin_shufflevector(e[0], e[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

PLAYGROUND_INLINE float max16_lanes(vec16 v) {
  const vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const vec8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vec8 m8 = a > b ? a : b;
  const vec4 c = __builtin_shufflevector(m8, m8, 0, 1, 2, 3), d = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const vec4 m4 = c > d ? c : d;
  return std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
}

PLAYGROUND_INLINE float dot(const float* a, const float* b, int64_t n) {
  vec16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16(a + i) * load16(b + i);
  float total = sum16(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

struct PagedShape {
  int64_t num_heads, groups, head_dim, block_size, num_slots, max_blocks, q_token_stride;
  float scale;
};

// One query row's running softmax state over up to 16 keys at a time. CHUNKS = head_dim / 16 when that is
// known at compile time (the row's accumulator and query then live in registers); 0 = any head_dim.
template <int CHUNKS>
struct RowState {
  static constexpr int kRegisterChunks = CHUNKS ? CHUNKS : 1;
  vec16 q[kRegisterChunks], acc[kRegisterChunks];
  const float* q_row;
  float* acc_row;  // used when CHUNKS == 0
  float running_max = kNegInf, running_sum = 0.f;
};

template <int CHUNKS>
PLAYGROUND_INLINE vec16 row_scores(const RowState<CHUNKS>& row, const float* keys, int64_t visible, int64_t dim) {
  vec16 acc[16];
  for (int t = 0; t < 16; ++t) {
    vec16 a = {};
    if (t < visible) {
      const float* key = keys + t * dim;
      if constexpr (CHUNKS > 0) {
        for (int c = 0; c < CHUNKS; ++c) a += row.q[c] * load16(key + 16 * c);
      } else {
        a[0] = dot(row.q_row, key, dim);
      }
    }
    acc[t] = a;
  }
  return transpose_sums(acc);
}

template <int CHUNKS>
PLAYGROUND_INLINE void row_update(RowState<CHUNKS>& row, vec16 scores, const float* values, int64_t visible,
                                  int64_t dim) {
  const float new_max = std::max(row.running_max, max16_lanes(scores));
  const float correction = std::exp(row.running_max - new_max);
  const vec16 p = exp16(scores - new_max);
  if constexpr (CHUNKS > 0) {
    for (int c = 0; c < CHUNKS; ++c) row.acc[c] *= correction;
    for (int64_t t = 0; t < visible; ++t) {
      const vec16 weight = splat(p[t]);
      for (int c = 0; c < CHUNKS; ++c) row.acc[c] += weight * load16(values + t * dim + 16 * c);
    }
  } else {
    for (int64_t d = 0; d < dim; ++d) row.acc_row[d] *= correction;
    for (int64_t t = 0; t < visible; ++t) {
      const float weight = p[t];
      for (int64_t d = 0; d < dim; ++d) row.acc_row[d] += weight * values[t * dim + d];
    }
  }
  row.running_sum = row.running_sum * correction + sum16(p);
  row.running_max = new_max;
}

// One query row of one sequence over its visible keys (< limit positions), 16 keys at a time, in place.
template <int CHUNKS>
PLAYGROUND_INLINE void attend_row(const PagedShape& s, const float* q_row, float* out_row, const float* k_head,
                                  const float* v_head, const int32_t* table, int64_t limit, float* work) {
  static const vec16 lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int64_t dim = CHUNKS ? 16 * CHUNKS : s.head_dim;
  RowState<CHUNKS> row;
  row.q_row = q_row;
  row.acc_row = work;
  if constexpr (CHUNKS > 0) {
    for (int c = 0; c < CHUNKS; ++c) {
      row.q[c] = load16(q_row + 16 * c) * s.scale;
      row.acc[c] = vec16{};
    }
  } else {
    std::fill(work, work + dim, 0.f);
  }
  const float score_scale = CHUNKS ? 1.f : s.scale;
  const int64_t step = std::min<int64_t>(16, s.block_size);
  for (int64_t position0 = 0; position0 < limit; position0 += step) {
    const int64_t offset = position0 % s.block_size;
    const int64_t slot0 = static_cast<int64_t>(table[position0 / s.block_size]) * s.block_size + offset;
    const int64_t visible = std::min({limit - position0, step, s.block_size - offset});
    const int64_t next = position0 + step;
    if (next < limit) {  // blocks lie anywhere in the pool: fetch the next keys and values while these compute
      const int64_t next_slot = static_cast<int64_t>(table[next / s.block_size]) * s.block_size + next % s.block_size;
      const int64_t next_count = std::min({limit - next, step, s.block_size - next % s.block_size});
      for (int64_t line = 0; line < next_count * dim; line += 16) {
        __builtin_prefetch(k_head + next_slot * dim + line, 0, 3);
        __builtin_prefetch(v_head + next_slot * dim + line, 0, 3);
      }
    }
    vec16 scores = row_scores<CHUNKS>(row, k_head + slot0 * dim, visible, dim) * score_scale;
    scores = lane_index < static_cast<float>(visible) ? scores : splat(kNegInf);
    row_update<CHUNKS>(row, scores, v_head + slot0 * dim, visible, dim);
  }
  const float inverse = 1.f / row.running_sum;
  if constexpr (CHUNKS > 0) {
    for (int c = 0; c < CHUNKS; ++c) store16(out_row + 16 * c, row.acc[c] * inverse);
  } else {
    for (int64_t d = 0; d < dim; ++d) out_row[d] = work[d] * inverse;
  }
}

// All query rows of one (sequence, KV head): query i of `count` sees positions < context_len - (count - 1 - i).
// Keys past a row's limit are never read, so unwritten or stale slots never reach the softmax.
PLAYGROUND_MULTIVERSION
void attend_one(const PagedShape& s, const float* q, float* out, const float* k_cache, const float* v_cache,
                const int32_t* table, int64_t first_token, int64_t count, int64_t context_len, int64_t kv_head,
                float* work) {
  const float* k_head = k_cache + kv_head * s.num_slots * s.head_dim;
  const float* v_head = v_cache + kv_head * s.num_slots * s.head_dim;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t limit = context_len - (count - 1 - i);
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t head = kv_head * s.groups + g;
      const float* q_row = q + (first_token + i) * s.q_token_stride + head * s.head_dim;
      float* out_row = out + ((first_token + i) * s.num_heads + head) * s.head_dim;
      switch (s.head_dim) {
        case 32: attend_row<2>(s, q_row, out_row, k_head, v_head, table, limit, work); break;
        case 64: attend_row<4>(s, q_row, out_row, k_head, v_head, table, limit, work); break;
        case 128: attend_row<8>(s, q_row, out_row, k_head, v_head, table, limit, work); break;
        default: attend_row<0>(s, q_row, out_row, k_head, v_head, table, limit, work); break;
      }
    }
  }
}

void check_cpu_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_cpu_int(const at::Tensor& t, const char* name, at::ScalarType type) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), name,
              " must be a contiguous CPU tensor of ", type);
}

// [tokens, heads, dim] float32 whose heads are contiguous (a view into a fused QKV output is fine).
void check_heads(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 3, name,
              " must be a [tokens, heads, dim] float32 CPU tensor");
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2), name, "'s heads must be contiguous");
}

// q/out [tokens, heads, dim]; k_cache/v_cache [kv_heads, slots, dim]; block_tables [seqs, max_blocks] int32;
// query_start, query_len, context_lens [seqs] int64: sequence n's queries are rows
// query_start[n] .. query_start[n] + query_len[n] - 1 of q; its last query sees context_lens[n] positions.
// Rows of `out` that belong to no sequence are left untouched.
void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& query_start, const at::Tensor& query_len,
                     const at::Tensor& context_lens, int64_t block_size, double scale, at::Tensor& out) {
  check_heads(q, "q");
  check_cpu_float(k_cache, "k_cache");
  check_cpu_float(v_cache, "v_cache");
  check_cpu_float(out, "out");
  check_cpu_int(block_tables, "block_tables", at::kInt);
  check_cpu_int(query_start, "query_start", at::kLong);
  check_cpu_int(query_len, "query_len", at::kLong);
  check_cpu_int(context_lens, "context_lens", at::kLong);
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() && out.sizes() == q.sizes(),
              "q/out must be [tokens, heads, dim] and the caches [kv_heads, slots, dim]");
  TORCH_CHECK(q.size(2) == k_cache.size(2) && q.size(1) % k_cache.size(0) == 0, "head shapes do not match");
  TORCH_CHECK(block_size > 0 && k_cache.size(1) % block_size == 0, "the cache's slots are not whole blocks");
  const int64_t num_seqs = block_tables.size(0), kv_heads = k_cache.size(0);
  TORCH_CHECK(query_start.numel() == num_seqs && query_len.numel() == num_seqs && context_lens.numel() == num_seqs,
              "one query_start, query_len and context_len per block-table row");
  const PagedShape shape{q.size(1), q.size(1) / kv_heads, q.size(2), block_size, k_cache.size(1),
                         block_tables.size(1), q.stride(0), static_cast<float>(scale)};
  const int64_t* starts = query_start.data_ptr<int64_t>();
  const int64_t* lens = query_len.data_ptr<int64_t>();
  const int64_t* contexts = context_lens.data_ptr<int64_t>();
  const int64_t num_blocks_total = k_cache.size(1) / block_size;
  for (int64_t n = 0; n < num_seqs; ++n) {
    TORCH_CHECK(lens[n] >= 0 && starts[n] >= 0 && starts[n] + lens[n] <= q.size(0), "query rows out of range");
    TORCH_CHECK(contexts[n] >= lens[n] && contexts[n] <= shape.max_blocks * block_size,
                "context length does not fit the block table");
  }
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  for (int64_t i = 0; i < block_tables.numel(); ++i) {
    TORCH_CHECK(tables[i] >= 0 && tables[i] < num_blocks_total, "block id out of range");
  }
  const float* q_data = q.data_ptr<float>();
  const float* k_data = k_cache.data_ptr<float>();
  const float* v_data = v_cache.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t items = num_seqs * kv_heads;
  const int64_t work_floats = shape.head_dim;
  // Items differ in cost (context lengths differ), so threads take them one at a time from a shared counter.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), items);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> work(work_floats);
    for (int64_t worker = begin; worker < end; ++worker) {
      for (int64_t item = next++; item < items; item = next++) {
        const int64_t n = item / kv_heads, head = item % kv_heads;
        if (lens[n] == 0) continue;
        attend_one(shape, q_data, out_data, k_data, v_data, tables + n * shape.max_blocks, starts[n], lens[n],
                   contexts[n], head, work.data());
      }
    }
  });
}

// ---- the small per-layer operations of a decoder layer, fused so that each is one pass and one call ----

// Rows of at least this many floats in total are worth spreading over threads.
constexpr int64_t kParallelGrainFloats = 1 << 15;

int64_t row_grain(int64_t row_floats) { return std::max<int64_t>(1, kParallelGrainFloats / std::max<int64_t>(1, row_floats)); }

// RMSNorm as transformers computes it in float32: out = weight * (x * 1 / sqrt(mean(x^2) + eps)).
PLAYGROUND_MULTIVERSION
void rms_norm_row(const float* x, const float* weight, float eps, float* out, int64_t n) {
  vec16 squares = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const vec16 v = load16(x + i);
    squares += v * v;
  }
  float total = sum16(squares);
  for (; i < n; ++i) total += x[i] * x[i];
  const float inverse = 1.f / std::sqrt(total / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = weight[j] * (x[j] * inverse);
}

PLAYGROUND_MULTIVERSION
void add_rows(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
}

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.stride(-1) == 1, name,
              " must be a float32 CPU tensor with contiguous rows");
  check_cpu_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must have one value per column");
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const at::Tensor x = x_in.contiguous();
  check_rows(x, weight, "x");
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  const float* x_data = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(x_data + r * n, w, static_cast<float>(eps), o + r * n, n);
  });
  return out;
}

// (rms_norm(x + residual), x + residual): a layer's residual sum and the next norm in one pass.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x_in, const at::Tensor& residual_in,
                                                const at::Tensor& weight, double eps) {
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  check_rows(x, weight, "x");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat, "residual must match x");
  at::Tensor total = at::empty_like(x), out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  const float* a = x.data_ptr<float>();
  const float* b = residual.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* t = total.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      add_rows(a + r * n, b + r * n, t + r * n, n);
      rms_norm_row(t + r * n, w, static_cast<float>(eps), o + r * n, n);
    }
  });
  return {out, total};
}

// silu(gate) * up for x = [gate | up] (the fused gate/up projection's output), silu(g) = g / (1 + e^-g).
PLAYGROUND_MULTIVERSION
void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const vec16 g = load16(gate + i);
    store16(out + i, g / (1.f + exp16(-g)) * load16(up + i));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

at::Tensor silu_mul(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) % 2 == 0,
              "x must be a [tokens, 2 * intermediate] float32 CPU tensor");
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  at::Tensor out = at::empty({rows, n}, x.options());
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(2 * n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) silu_mul_row(in + r * 2 * n, in + r * 2 * n + n, o + r * n, n);
  });
  return out;
}

// Rotary embedding in place, "rotate half" style: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin per head,
// with cos/sin [tokens, dim] (both halves of a row hold the same angles, as transformers builds them).
PLAYGROUND_MULTIVERSION
void rotate_heads(float* x, int64_t token_stride, int64_t heads, int64_t dim, const float* cos, const float* sin,
                  int64_t token) {
  const int64_t half = dim / 2;
  const float* c = cos + token * dim;
  const float* s = sin + token * dim;
  for (int64_t h = 0; h < heads; ++h) {
    float* row = x + token * token_stride + h * dim;
    for (int64_t j = 0; j < half; ++j) {
      const float first = row[j], second = row[j + half];
      row[j] = first * c[j] - second * s[j];
      row[j + half] = second * c[j + half] + first * s[j + half];
    }
  }
}

void rotary_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  check_heads(q, "q");
  check_heads(k, "k");
  check_cpu_float(cos, "cos");
  check_cpu_float(sin, "sin");
  const int64_t tokens = q.size(0), dim = q.size(2);
  TORCH_CHECK(k.size(0) == tokens && k.size(2) == dim && dim % 2 == 0, "q and k must share tokens and an even dim");
  TORCH_CHECK(cos.numel() == tokens * dim && sin.numel() == tokens * dim, "cos/sin must be [tokens, dim]");
  float* q_data = q.data_ptr<float>();
  float* k_data = k.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  at::parallel_for(0, tokens, row_grain((q.size(1) + k.size(1)) * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rotate_heads(q_data, q.stride(0), q.size(1), dim, c, s, t);
      rotate_heads(k_data, k.stride(0), k.size(1), dim, c, s, t);
    }
  });
}

// K/V rows [tokens, kv_heads, dim] into their slots of head-major caches [kv_heads, slots, dim].
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  check_heads(k, "k");
  check_heads(v, "v");
  check_cpu_float(k_cache, "k_cache");
  check_cpu_float(v_cache, "v_cache");
  check_cpu_int(slot_mapping, "slot_mapping", at::kLong);
  const int64_t tokens = k.size(0), heads = k.size(1), dim = k.size(2), slots = k_cache.size(1);
  TORCH_CHECK(v.sizes() == k.sizes() && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.size(0) == heads && k_cache.size(2) == dim && slot_mapping.numel() == tokens,
              "k/v [tokens, kv_heads, dim] and caches [kv_heads, slots, dim] expected");
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slot[t] >= 0 && slot[t] < slots, "slot out of range");
  const float* k_data = k.data_ptr<float>();
  const float* v_data = v.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  at::parallel_for(0, tokens, row_grain(2 * heads * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(kc + (h * slots + slot[t]) * dim, k_data + t * k.stride(0) + h * dim, dim * sizeof(float));
        std::memcpy(vc + (h * slots + slot[t]) * dim, v_data + t * v.stride(0) + h * dim, dim * sizeof(float));
      }
    }
  });
}

// Outputs `first`..`last` - 1 of y [ROWS, N] = x [ROWS, K] weight[N, K]^T: WIDE weight rows at a time, each
// streamed once for all ROWS rows of x (ROWS * WIDE accumulators stay in registers).
template <int ROWS, int WIDE>
PLAYGROUND_INLINE void linear_rows(const float* x, const float* weight, const float* bias, float* y, int64_t K,
                                   int64_t N, int64_t first, int64_t last) {
  int64_t n = first;
  for (; n + WIDE <= last; n += WIDE) {
    vec16 acc[WIDE][ROWS] = {};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      vec16 w[WIDE];
      for (int j = 0; j < WIDE; ++j) {
        __builtin_prefetch(weight + (n + j + WIDE) * K + k, 0, 0);
        w[j] = load16(weight + (n + j) * K + k);
      }
      for (int m = 0; m < ROWS; ++m) {
        const vec16 a = load16(x + m * K + k);
        for (int j = 0; j < WIDE; ++j) acc[j][m] += a * w[j];
      }
    }
    for (int j = 0; j < WIDE; ++j) {
      const float* w_row = weight + (n + j) * K;
      for (int m = 0; m < ROWS; ++m) {
        float total = sum16(acc[j][m]);
        for (int64_t r = k; r < K; ++r) total += x[m * K + r] * w_row[r];
        y[m * N + n + j] = bias ? total + bias[n + j] : total;
      }
    }
  }
  for (; n < last; ++n) {
    for (int m = 0; m < ROWS; ++m) {
      const float total = dot(x + m * K, weight + n * K, K);
      y[m * N + n] = bias ? total + bias[n] : total;
    }
  }
}

PLAYGROUND_MULTIVERSION
void linear_block(int64_t rows, const float* x, const float* weight, const float* bias, float* y, int64_t K,
                  int64_t N, int64_t first, int64_t last) {
  switch (rows) {
    case 1: linear_rows<1, 4>(x, weight, bias, y, K, N, first, last); break;
    case 2: linear_rows<2, 4>(x, weight, bias, y, K, N, first, last); break;
    case 3: linear_rows<3, 4>(x, weight, bias, y, K, N, first, last); break;
    case 4: linear_rows<4, 4>(x, weight, bias, y, K, N, first, last); break;
    case 5: linear_rows<5, 4>(x, weight, bias, y, K, N, first, last); break;
    case 6: linear_rows<6, 3>(x, weight, bias, y, K, N, first, last); break;
    case 7: linear_rows<7, 3>(x, weight, bias, y, K, N, first, last); break;
    default: linear_rows<8, 3>(x, weight, bias, y, K, N, first, last); break;
  }
}

constexpr int64_t kMaxRowsPerPass = 8;
constexpr int64_t kOutputsPerTask = 64;

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_cpu_float(x, "x");
  check_cpu_float(weight, "weight");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x [M, K] and weight [N, K] expected");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    check_cpu_float(*bias, "bias");
    TORCH_CHECK(bias->numel() == N, "bias must have one value per output");
    bias_data = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const float* x_data = x.data_ptr<float>();
  const float* w_data = weight.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  const int64_t tasks = (N + kOutputsPerTask - 1) / kOutputsPerTask;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kOutputsPerTask, last = std::min(N, end * kOutputsPerTask);
    // Each pass streams this task's weight rows once for up to kMaxRowsPerPass rows of x.
    for (int64_t m = 0; m < M; m += kMaxRowsPerPass) {
      const int64_t rows = std::min(kMaxRowsPerPass, M - m);
      linear_block(rows, x_data + m * K, w_data, bias_data, y_data + m * N, K, N, first, last);
    }
  });
  return y;
}

// ---- a whole small step's decoder layers in one call ----
//
// At a few tokens a step of a small model is mostly the fixed cost of calling ~15 operators per layer from
// Python: a decode step of a few sequences, a speculative verification (1 + k tokens of one sequence), a
// draft model's catch-up. This runs the same operators, in the same order, as the Python layers do with
// these kernels (so it computes the same numbers), for every layer and the final norm, in one call.
// Sequence n's tokens are rows query_start[n] .. query_start[n] + query_len[n] - 1 (see paged_attention).
// `layers` holds kLayerTensors entries per layer (see below; absent ones are None); `caches` K then V per layer.

constexpr int64_t kLayerTensors = 10;
enum LayerTensor { kInputNorm, kQkv, kQkvBias, kQNorm, kKNorm, kOut, kOutBias, kPostNorm, kGateUp, kDown };

std::optional<at::Tensor> layer_tensor(const c10::List<std::optional<at::Tensor>>& layers, int64_t layer,
                                       LayerTensor which) {
  return layers.get(layer * kLayerTensors + which);
}

at::Tensor required(const std::optional<at::Tensor>& t, const char* name) {
  TORCH_CHECK(t.has_value() && t->defined(), name, " is required");
  return *t;
}

at::Tensor decode_layers(const at::Tensor& embedded, const at::Tensor& cos, const at::Tensor& sin,
                         const c10::List<std::optional<at::Tensor>>& layers, const at::Tensor& final_norm,
                         const std::vector<at::Tensor>& caches, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& query_start, const at::Tensor& query_len,
                         const at::Tensor& context_lens, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, int64_t block_size, double eps, double scale) {
  const int64_t num_layers = static_cast<int64_t>(layers.size()) / kLayerTensors;
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == num_layers * kLayerTensors &&
              static_cast<int64_t>(caches.size()) == 2 * num_layers, "one set of tensors and caches per layer");
  const int64_t tokens = embedded.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  at::Tensor hidden = embedded.contiguous();
  at::Tensor normed;
  for (int64_t l = 0; l < num_layers; ++l) {
    auto get = [&](LayerTensor which) { return layer_tensor(layers, l, which); };
    normed = l == 0 ? rms_norm(hidden, required(get(kInputNorm), "input norm"), eps) : normed;
    const at::Tensor qkv = small_batch_linear(normed, required(get(kQkv), "qkv weight"), get(kQkvBias));
    at::Tensor q = qkv.narrow(1, 0, q_size).view({tokens, num_heads, head_dim});
    at::Tensor k = qkv.narrow(1, q_size, kv_size).view({tokens, num_kv_heads, head_dim});
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads, head_dim});
    if (get(kQNorm).has_value()) {
      q = rms_norm(q, *get(kQNorm), eps);
      k = rms_norm(k, required(get(kKNorm), "k norm"), eps);
    }
    rotary_(q, k, cos, sin);
    at::Tensor k_cache = caches[2 * l], v_cache = caches[2 * l + 1];
    store_kv(k, v, k_cache, v_cache, slot_mapping);
    at::Tensor attended = at::empty({tokens, num_heads, head_dim}, qkv.options());
    paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len, context_lens, block_size, scale,
                    attended);
    const at::Tensor out = small_batch_linear(attended.view({tokens, q_size}), required(get(kOut), "o weight"),
                                              get(kOutBias));
    auto [post_normed, residual] = add_rms_norm(out, hidden, required(get(kPostNorm), "post norm"), eps);
    const at::Tensor mlp = small_batch_linear(silu_mul(small_batch_linear(post_normed, required(get(kGateUp),
                                              "gate/up weight"), std::nullopt)), required(get(kDown), "down weight"),
                                              std::nullopt);
    if (l + 1 < num_layers) {  // the next layer's input norm takes this layer's residual sum with it
      std::tie(normed, hidden) = add_rms_norm(mlp, residual, required(layer_tensor(layers, l + 1, kInputNorm),
                                                                       "input norm"), eps);
    } else {
      hidden = residual + mlp;
    }
  }
  return rms_norm(hidden, final_norm, eps);
}

// ---- a draft model's greedy proposals: several small steps, each fed its own argmax, in one call ----
//
// Sequence n first computes its chunk: `chunk_lens[n]` tokens of `chunk_tokens` (sequence after sequence) at
// `chunk_positions` (the tokens the draft has not seen yet, its newest token last), and takes the argmax of the
// first `vocab_size` logits at the chunk's last token as its first proposal; then each proposal is the input of
// a one-token decode step that gives the next, until sequence n has `steps[n]` proposals. A row whose logits are
// not all finite proposes nothing more. Returns [sequences, max steps] int64 token ids, -1 past each row's last
// proposal. The same kernels in the same order as the Python loop (embedding lookup, RoPE rows, decode_layers,
// the LM head as small_batch_linear on the scored rows, argmax), so the same numbers; every position written
// must have a KV slot in `block_tables`.

at::Tensor greedy_proposals(const at::Tensor& chunk_tokens, const at::Tensor& chunk_positions,
                            const at::Tensor& chunk_lens, const at::Tensor& steps, const at::Tensor& block_tables,
                            const at::Tensor& embedding, const at::Tensor& lm_head, int64_t vocab_size,
                            const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                            const c10::List<std::optional<at::Tensor>>& layers, const at::Tensor& final_norm,
                            const std::vector<at::Tensor>& caches, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t block_size, double eps, double scale) {
  check_cpu_int(chunk_tokens, "chunk_tokens", at::kLong);
  check_cpu_int(chunk_positions, "chunk_positions", at::kLong);
  check_cpu_int(chunk_lens, "chunk_lens", at::kLong);
  check_cpu_int(steps, "steps", at::kLong);
  check_cpu_int(block_tables, "block_tables", at::kInt);
  check_cpu_float(embedding, "embedding");
  check_cpu_float(lm_head, "lm_head");
  const int64_t rows = chunk_lens.numel();
  TORCH_CHECK(steps.numel() == rows && block_tables.size(0) == rows,
              "one chunk length, step count and block table per sequence");
  TORCH_CHECK(chunk_positions.numel() == chunk_tokens.numel() &&
              (rows == 0 || (chunk_lens.min().item<int64_t>() >= 1 && chunk_lens.sum().item<int64_t>() ==
                             chunk_tokens.numel())), "every sequence needs a chunk of at least one token");
  TORCH_CHECK(rows == 0 || steps.min().item<int64_t>() >= 1, "every sequence proposes at least one token");
  TORCH_CHECK(vocab_size > 0 && vocab_size <= lm_head.size(0), "vocab_size must be within the LM head's rows");
  if (rows == 0) return at::empty({0, 0}, chunk_tokens.options());
  const at::Tensor query_start = at::cumsum(chunk_lens, 0) - chunk_lens;
  const at::Tensor last_rows = query_start + chunk_lens - 1;
  at::Tensor positions = chunk_positions.index_select(0, last_rows);
  const int64_t max_steps = steps.max().item<int64_t>();
  TORCH_CHECK((positions + steps).max().item<int64_t>() <= block_tables.size(1) * block_size,
              "a position to write has no KV slot in its block table");
  const at::Tensor row_of_token = at::repeat_interleave(at::arange(rows, chunk_lens.options()), chunk_lens);
  auto run = [&](const at::Tensor& ids, const at::Tensor& position, const at::Tensor& tables,
                 const at::Tensor& token_tables, const at::Tensor& starts, const at::Tensor& lens,
                 const at::Tensor& scored) {
    const at::Tensor slots = token_tables.gather(1, at::floor_divide(position, block_size).unsqueeze(1)).squeeze(1)
                                 .to(at::kLong) * block_size + position.remainder(block_size);
    const at::Tensor embedded = embedding.index_select(0, ids);
    const at::Tensor hidden = decode_layers(
        embedded, rope_cos.index_select(0, position).to(embedded.scalar_type()),
        rope_sin.index_select(0, position).to(embedded.scalar_type()), layers, final_norm, caches, slots, tables,
        starts, lens, position.index_select(0, scored) + 1, num_heads, num_kv_heads, head_dim, block_size, eps, scale);
    return small_batch_linear(hidden.index_select(0, scored), lm_head, std::nullopt).narrow(1, 0, vocab_size);
  };
  at::Tensor proposals = at::full({rows, max_steps}, -1, chunk_tokens.options());
  at::Tensor tokens = at::empty({rows}, chunk_tokens.options()), remaining = steps.clone();
  for (int64_t step = 0; step < max_steps; ++step) {
    const at::Tensor live = step == 0 ? at::arange(rows, steps.options()) : (remaining > step).nonzero().squeeze(1);
    const int64_t count = live.numel();
    if (count == 0) break;
    at::Tensor logits;
    if (step == 0) {
      logits = run(chunk_tokens, chunk_positions, block_tables, block_tables.index_select(0, row_of_token),
                   query_start, chunk_lens, last_rows);
    } else {
      const at::Tensor tables = block_tables.index_select(0, live);
      const at::Tensor position = positions.index_select(0, live) + 1;
      const at::Tensor each = at::arange(count, position.options());
      logits = run(tokens.index_select(0, live), position, tables, tables, each, at::ones_like(position), each);
      positions.index_put_({live}, position);
    }
    const at::Tensor finite = at::isfinite(logits).all(1);
    const at::Tensor chosen = logits.argmax(1);
    proposals.select(1, step).index_put_({live}, at::where(finite, chosen, at::full_like(chosen, -1)));
    remaining.index_put_({live}, at::where(finite, remaining.index_select(0, live), at::full_like(chosen, step + 1)));
    tokens.index_put_({live}, chosen);
  }
  return proposals;
}

}  // namespace

TORCH_LIBRARY(playground_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor query_start, "
        "Tensor query_len, Tensor context_lens, int block_size, float scale, Tensor(a!) out) -> ()");
  m.def("small_batch_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor x) -> Tensor");
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
  m.def("store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  m.def("decode_layers(Tensor embedded, Tensor cos, Tensor sin, Tensor?[] layers, Tensor final_norm, "
        "Tensor(a!)[] caches, Tensor slot_mapping, Tensor block_tables, Tensor query_start, Tensor query_len, "
        "Tensor context_lens, int num_heads, "
        "int num_kv_heads, int head_dim, int block_size, float eps, float scale) -> Tensor");
  m.def("greedy_proposals(Tensor chunk_tokens, Tensor chunk_positions, Tensor chunk_lens, Tensor steps, "
        "Tensor block_tables, Tensor embedding, Tensor lm_head, int vocab_size, Tensor rope_cos, Tensor rope_sin, "
        "Tensor?[] layers, Tensor final_norm, Tensor(a!)[] caches, int num_heads, int num_kv_heads, int head_dim, int block_size, "
        "float eps, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(playground_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("small_batch_linear", &small_batch_linear);
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rotary_", &rotary_);
  m.impl("store_kv", &store_kv);
  m.impl("decode_layers", &decode_layers);
  m.impl("greedy_proposals", &greedy_proposals);
}
